"""MeanFlow over action chunks (Geng et al. 2025, the one-step policy class of OFQL): learn the *average*
velocity over an interval instead of the instantaneous one, so that one network call jumps from noise to a
chunk. Trained from the dataset alone, no teacher.

Time convention -- the paper's, the reverse of `FlowPolicy`'s: t = 0 is the data, t = 1 is the noise,

    z_t = (1 - t) x + t e,   e ~ N(0, I),   v = dz/dt = e - x
    u(z_t, r, t) = 1/(t - r) * integral_r^t v(z_s, s) ds,   so that   z_r = z_t - (t - r) u(z_t, r, t)

Differentiating (t - r) u = integral_r^t v ds in t gives the MeanFlow identity u = v - (t - r) du/dt with the
total derivative du/dt = v . d_z u + d_t u, one forward-mode JVP with tangent (v, 0, 1). The network regresses
onto u_tgt = v - (t - r) du/dt with u_tgt's gradient stopped. Sampling: z_0 = z_1 - u(z_1, 0, 1) (one step),
or `steps` equal jumps from t = 1 down to t = 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.func import jvp

from robotrl.core.spec import Spec
from robotrl.policies.base import register
from robotrl.policies.generative import GenerativeConfig, GenerativePolicy
from robotrl.policies.nets import ObsEncoder, TemporalUnet, time_embedding


@dataclass
class MeanFlowConfig(GenerativeConfig):
    steps: int = 1
    """sampling jumps from noise to chunk (1: one network call; changeable after training)"""
    flow_ratio: float = 0.75
    """fraction of training samples with r = t (plain flow matching); the paper's best is 0.75"""
    time_mean: float = -0.4
    """logit-normal time sampling: mean of the normal (the paper's ImageNet setting)"""
    time_std: float = 1.0
    adaptive_p: float = 0.5
    """adaptive loss weight 1 / (err + 1e-3)^p per sample; 0 is plain MSE, 0.5 is close to a pseudo-Huber
    loss (robust to the large JVP targets of early training), the paper's best on images is 1.0"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backbone != "unet":
            raise ValueError(
                f"MeanFlowConfig.backbone: expected 'unet' (MeanFlow's two-time network is a U-Net), "
                f"got {self.backbone!r}"
            )
        if self.steps < 1:
            raise ValueError(f"MeanFlowConfig.steps: expected >= 1, got {self.steps}")
        if not 0.0 <= self.flow_ratio <= 1.0:
            raise ValueError(f"MeanFlowConfig.flow_ratio: expected a fraction in [0, 1], got {self.flow_ratio}")
        if self.time_std <= 0:
            raise ValueError(f"MeanFlowConfig.time_std: expected > 0, got {self.time_std}")
        if self.adaptive_p < 0:
            raise ValueError(f"MeanFlowConfig.adaptive_p: expected >= 0, got {self.adaptive_p}")


class MeanFlowUnet(nn.Module):
    """The temporal U-Net with two times: t goes through the U-Net's own time embedding, the interval t - r
    through a second embedding concatenated to the observation features (the paper conditions on (t, t - r))."""

    def __init__(
        self,
        action_dim: int,
        cond_dim: int,
        channels: Sequence[int],
        time_dim: int = 64,
        kernel: int = 5,
        time_scale: float = 100.0,
    ) -> None:
        super().__init__()
        self.interval = time_embedding(time_dim, time_scale, 4 * time_dim)
        self.unet = TemporalUnet(
            action_dim, cond_dim + time_dim, channels, time_dim=time_dim, kernel=kernel, time_scale=time_scale
        )

    def forward(self, z: torch.Tensor, r: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """u(z, r, t | obs) for z (B, H, A), times r <= t (B,), observation features (B, D)."""
        return self.unet(z, t, torch.cat([cond, self.interval(t - r)], dim=-1))


@register
class MeanFlowPolicy(GenerativePolicy):
    """One-step generation by an average-velocity field u(z, r, t) (see the module docstring for the convention)."""

    name = "meanflow"
    config_cls = MeanFlowConfig
    time_scale = 100.0  # t in [0, 1], as FlowPolicy
    config: MeanFlowConfig
    encoder: ObsEncoder

    def __init__(
        self, spec: Spec, config: MeanFlowConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__(spec, config, stats)
        cfg = self.config
        self.net = MeanFlowUnet(
            self.action_dim, self.encoder.out_dim, cfg.channels, kernel=cfg.kernel, time_scale=self.time_scale
        )

    def sample_times(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(r, t) with 0 <= r <= t <= 1: two logit-normal draws sorted, then r = t for `flow_ratio` of them."""
        cfg = self.config
        s = torch.sigmoid(cfg.time_mean + cfg.time_std * torch.randn(2, batch, device=device))
        t, r = s.max(0).values, s.min(0).values
        same = torch.rand(batch, device=device) < cfg.flow_ratio
        return torch.where(same, t, r), t

    def average_velocity(
        self, z: torch.Tensor, r: torch.Tensor, t: torch.Tensor, v: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """u(z, r, t) and its total derivative du/dt along the flow (tangent (v, 0, 1)), by one JVP."""
        tangents = (v, torch.zeros_like(r), torch.ones_like(t))
        # torch's stubs type jvp's result for has_aux=True too (a 3-tuple); without it, (output, its JVP)
        return cast(
            "tuple[torch.Tensor, torch.Tensor]", jvp(lambda z_, r_, t_: self.net(z_, r_, t_, cond), (z, r, t), tangents)
        )

    def loss(self, obs: dict[str, torch.Tensor], action: torch.Tensor, action_is_pad: torch.Tensor) -> torch.Tensor:
        x, mask = self.pad_chunk(action, action_is_pad)
        e = torch.randn_like(x)
        r, t = self.sample_times(x.shape[0], x.device)
        z = (1 - t)[:, None, None] * x + t[:, None, None] * e
        v = e - x
        u, dudt = self.average_velocity(z, r, t, v, self.encoder(obs))
        target = (v - (t - r)[:, None, None] * dudt).detach()
        err = (((u - target) ** 2).mean(-1) * mask).sum(1) / mask.sum(1).clamp(min=1)  # per sample
        weight = (err.detach() + 1e-3) ** -self.config.adaptive_p
        return (weight * err).mean()

    def sample_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """z_0 from z_1 = noise (B, noise_rows, A) in `steps` jumps z_r = z_t - (t - r) u(z_t, r, t); deterministic
        (what export traces)."""
        cond = self.encoder(obs)
        z = self.initial_noise(obs, noise)
        times = torch.linspace(1.0, 0.0, self.config.steps + 1, device=z.device)
        for t, r in itertools.pairwise(times):
            z = z - (t - r) * self.net(z, r.expand(z.shape[0]), t.expand(z.shape[0]), cond)
        return self.refine(obs, z[:, : self.config.action_horizon], noise)

    def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = next(iter(obs.values())).shape[0]
        return self.sample_from_noise(obs, self.noise(batch, next(self.parameters()).device))
