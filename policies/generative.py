"""What diffusion, flow and the one-step students share: an observation encoder conditioning a temporal U-Net
that maps a noisy action chunk (and a noise level or time) to a chunk-shaped prediction, and two optional learned
heads that online RL trains while the U-Net stays frozen: a prior over the noise the sampler starts from, and a
correction of the chunk it ends with."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from robotrl.core.spec import Spec
from robotrl.policies.base import Policy, PolicyConfig
from robotrl.policies.nets import ChunkMLP, ObsEncoder, TemporalUnet, last_linear, mlp, padded_horizon

#: the chunk networks a generative policy can have (GenerativeConfig.backbone)
BACKBONES = ("unet", "mlp")


@dataclass
class GenerativeConfig(PolicyConfig):
    backbone: str = "unet"
    """the chunk network: 'unet' (the diffusion-policy 1D U-Net, `channels`) or 'mlp' (a residual MLP over the
    flattened chunk, `mlp_width` x `mlp_depth`: far less work per call for short chunks from state)"""
    channels: tuple[int, ...] = (64, 128, 256)
    """U-Net widths per level (diffusion policy's default is (256, 512, 1024); this trains on a CPU)"""
    mlp_width: int = 256
    """backbone 'mlp': the residual blocks' width"""
    mlp_depth: int = 3
    """backbone 'mlp': the number of residual blocks"""
    image_dim: int = 64
    """features per camera and frame"""
    kernel: int = 5
    noise_prior: tuple[int, ...] = ()
    """hidden widths of a learned Gaussian over the sampler's initial noise given the observation (empty: the
    standard normal). Online RL in the noise space (`robotrl train online --method latent`) adds and trains it"""
    noise_prior_bound: float = 1.5
    """the prior's mean stays in [-bound, bound] per element: near where the sampler was trained to start"""
    action_residual: tuple[int, ...] = ()
    """hidden widths of a learned correction added to the sampled chunk given the observation (empty: none).
    Online RL of a residual (`robotrl train online --method residual`) adds and trains it"""
    action_residual_bound: float = 0.3
    """the correction's mean stays in [-bound, bound] per element (normalized action units: the data spans [-1, 1])"""
    action_residual_std: float = 0.1
    """the correction's initial std per element (then learned, at most 1): the residual is a Gaussian, as RL
    trained it, so its noise is part of the policy (on PushT its mean alone did worse than the BC policy)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.backbone not in BACKBONES:
            raise ValueError(f"{name}.backbone: expected one of {list(BACKBONES)}, got {self.backbone!r}")
        for field in ("mlp_width", "mlp_depth"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        self.noise_prior, self.action_residual = tuple(self.noise_prior), tuple(self.action_residual)
        for field in ("noise_prior", "action_residual"):
            if any(w < 1 for w in getattr(self, field)):
                raise ValueError(f"{name}.{field}: expected widths >= 1, got {getattr(self, field)}")
        for field in ("noise_prior_bound", "action_residual_bound", "action_residual_std"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{name}.{field}: expected > 0, got {getattr(self, field)}")


class ChunkGaussian(nn.Module):
    """N(mean(features), diag(std^2)) over a chunk-shaped tensor: the mean an MLP of the observation features,
    bounded to [-bound, bound] per element and zero at first (its last layer starts at zero), the std a learned
    per-element parameter in [e^-7, 1] starting at `std`."""

    def __init__(
        self, feature_dim: int, shape: tuple[int, int], hidden: tuple[int, ...], bound: float, std: float
    ) -> None:
        super().__init__()
        self.shape, self.bound = shape, bound
        self.net = mlp([feature_dim, *hidden, shape[0] * shape[1]], act=nn.Tanh)
        with torch.no_grad():
            last_linear(self.net).weight.zero_()
            last_linear(self.net).bias.zero_()
        self.log_std = nn.Parameter(torch.full(shape, math.log(std)))

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std), each (B, *shape)."""
        mean = self.bound * torch.tanh(self.net(features)).reshape(-1, *self.shape)
        return mean, self.log_std.clamp(min=-7.0, max=0.0).exp().expand_as(mean)


class NoisePrior(ChunkGaussian):
    """The sampler's initial noise given the observation: DSRL's latent action space (Wagenmaker et al. 2025). A
    generative policy maps the noise to a chunk through its frozen sampler, so choosing the noise steers the policy
    without moving the network that imitates the demonstrations. It starts as the standard normal (std 1), i.e. as
    the policy without a prior; the std only shrinks from there."""

    def __init__(self, feature_dim: int, shape: tuple[int, int], hidden: tuple[int, ...], bound: float) -> None:
        super().__init__(feature_dim, shape, hidden, bound, 1.0)


class ActionResidual(ChunkGaussian):
    """A correction added to the sampled chunk given the observation (normalized action units): ResiP's residual
    policy (Ankile et al. 2024) at the chunk level. The sampler, frozen, proposes the motion; the residual, trained
    by RL, adds the precision imitation leaves out (most of PushT's BC failures end within a few points of the
    success coverage). Its noise is RL's exploration and stays in the policy, which is deployed as it was
    trained."""


class GenerativePolicy(Policy):
    """A policy whose action chunk is generated by integrating or denoising with a conditional U-Net."""

    config_cls: ClassVar[type[PolicyConfig]] = GenerativeConfig
    #: multiplies the time / noise-level input of the U-Net's sinusoidal embedding
    time_scale: float = 1.0
    #: a GenerativeConfig subclass, or the VLA's config (VLAPolicy reuses FlowPolicy's sampling); the subclasses whose
    #: config class is fixed say which
    config: Any
    #: the observation encoder (cond) and the chunk network; subclasses put their own there (MeanFlowUnet, the VLA's)
    encoder: nn.Module
    net: nn.Module

    def __init__(
        self, spec: Spec, config: GenerativeConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__(spec, config, stats)
        cfg = self.config
        vector_dims = {k: spec.observations[k].size for k in self.vector_keys}
        image_sizes = {k: spec.observations[k].shape[0] for k in self.image_keys}
        self.encoder = encoder = ObsEncoder(vector_dims, image_sizes, cfg.obs_horizon, cfg.image_dim)
        if cfg.backbone == "mlp":
            self.horizon = cfg.action_horizon
            self.net = ChunkMLP(
                self.action_dim, self.horizon, encoder.out_dim, cfg.mlp_width, cfg.mlp_depth, time_scale=self.time_scale
            )
        else:
            self.horizon = padded_horizon(cfg.action_horizon, len(cfg.channels))
            self.net = TemporalUnet(
                self.action_dim, encoder.out_dim, cfg.channels, kernel=cfg.kernel, time_scale=self.time_scale
            )
        #: the learned initial-noise distribution (`GenerativeConfig.noise_prior`), or None for the standard normal
        self.prior: NoisePrior | None = None
        #: the learned chunk correction (`GenerativeConfig.action_residual`), or None
        self.residual: ActionResidual | None = None
        if cfg.noise_prior:
            self.add_noise_prior(cfg.noise_prior, cfg.noise_prior_bound)
        if cfg.action_residual:
            self.add_action_residual(cfg.action_residual, cfg.action_residual_bound, cfg.action_residual_std)

    def feature_dim(self, field: str) -> int:
        """The size of `vector_features`, refused (naming the config `field`) for a policy without vectors."""
        if not self.vector_keys:
            raise ValueError(
                f"{self.name}.{field}: it reads vector observations; this policy has only {list(self.obs_keys)}"
            )
        return sum(self.config.obs_horizon * self.spec.observations[k].size for k in self.vector_keys)

    def add_noise_prior(self, hidden: tuple[int, ...], bound: float) -> NoisePrior:
        """Build the initial-noise prior (standard normal at first) and record it in the config, so that the
        checkpoint rebuilds it."""
        dim = self.feature_dim("noise_prior")
        self.config.noise_prior, self.config.noise_prior_bound = tuple(hidden), bound
        self.prior = NoisePrior(dim, (self.horizon, self.action_dim), tuple(hidden), bound)
        return self.prior

    def add_action_residual(self, hidden: tuple[int, ...], bound: float, std: float) -> ActionResidual:
        """Build the chunk correction (zero mean at first) and record it in the config, so that the checkpoint
        rebuilds it."""
        dim = self.feature_dim("action_residual")
        cfg = self.config
        cfg.action_residual, cfg.action_residual_bound, cfg.action_residual_std = tuple(hidden), bound, std
        self.residual = ActionResidual(dim, (self.horizon, self.action_dim), tuple(hidden), bound, std)
        return self.residual

    @property
    def noise_rows(self) -> int:
        """Rows of standard normal noise one chunk draws (`noise`): the sampler's initial noise (horizon), then
        the residual's (another horizon) if the policy has one."""
        return self.horizon * (2 if self.residual is not None else 1)

    def noise(self, batch: int, device: torch.device) -> torch.Tensor:
        """Everything random about one chunk, (B, noise_rows, A): exports take it as their noise input."""
        return torch.randn(batch, self.noise_rows, self.action_dim, device=device)

    def vector_features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The input of the prior and the residual (and of online RL's value network): the normalized vector
        observations, window flattened."""
        return torch.cat([obs[k].flatten(1) for k in self.vector_keys], dim=-1)

    def initial_noise(self, obs: dict[str, torch.Tensor], eps: torch.Tensor) -> torch.Tensor:
        """Where the sampler starts, from standard normal `eps` (B, >= horizon, A), its first horizon rows: those
        themselves, or mean + std * them under the learned prior. Exports feed `eps` and compute this inside the
        graph."""
        eps = eps[:, : self.horizon]
        if self.prior is None:
            return eps
        mean, std = self.prior(self.vector_features(obs))
        return mean + std * eps

    def refine(self, obs: dict[str, torch.Tensor], chunk: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """The sampler's normalized chunk (B, h <= horizon, A), plus the correction drawn with the rows of `eps`
        after the first horizon (`noise`), if the policy has a residual."""
        if self.residual is None:
            return chunk
        mean, std = self.residual(self.vector_features(obs))
        h = chunk.shape[1]
        return chunk + mean[:, :h] + std[:, :h] * eps[:, self.horizon : self.horizon + h]

    def pad_chunk(self, action: torch.Tensor, action_is_pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Extend a (B, H, A) chunk to the U-Net's horizon by repeating its last action (masked out of the loss)."""
        extra = self.horizon - action.shape[1]
        if extra == 0:
            return action, ~action_is_pad
        action = torch.cat([action, action[:, -1:].expand(-1, extra, -1)], dim=1)
        mask = torch.cat([~action_is_pad, torch.zeros_like(action_is_pad[:, :1]).expand(-1, extra)], dim=1)
        return action, mask

    @staticmethod
    def masked_mse(
        pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean squared error over the chunk's real steps; `weight` (B,) weighs each sample (advantage-weighted
        regression), the mean then taken over the weights."""
        err = ((pred - target) ** 2).mean(-1)
        if weight is not None:
            w = mask * weight[:, None]
            return (err * w).sum() / w.sum().clamp(min=1e-8)
        return (err * mask).sum() / mask.sum().clamp(min=1)
