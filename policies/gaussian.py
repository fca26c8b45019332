"""The tanh-squashed Gaussian actor of SAC-style actor-critic methods (SAC, RLPD, WSRL), their critics, and the
registered `gaussian` policy every actor-critic learner saves its actor as.

Actions are tanh(u) with u ~ N(mean(s), std(s)), scaled to the spec's bounds; the log-likelihood carries the
change-of-variables term of the squashing, computed in the numerically stable softplus form.

`GaussianPolicy` is the deployed form: the actor's deterministic action with the observation handling it was
trained with, saved as safetensors + manifest like every policy, so `policy eval`, `policy export`, the runtime and
the ROS 2 deploy node read an SAC or PPO run's `policy/` as they read a BC run's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robotrl.core.spec import Spec
from robotrl.policies.base import Policy, PolicyConfig, register
from robotrl.policies.nets import ImageEncoder, mlp


class TanhGaussianActor(nn.Module):
    """obs features (B, D) -> actions in [low, high] (B, A), with log-probabilities for the entropy term."""

    scale: torch.Tensor
    center: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: Sequence[int] = (256, 256),
        low: float | torch.Tensor = -1.0,
        high: float | torch.Tensor = 1.0,
        log_std_range: tuple[float, float] = (-5.0, 2.0),
        layer_norm: bool = True,
    ) -> None:
        super().__init__()
        self.trunk = mlp([obs_dim, *hidden], act=nn.ReLU, layer_norm=layer_norm, final_act=True)
        self.mean = nn.Linear(hidden[-1], action_dim)
        self.log_std = nn.Linear(hidden[-1], action_dim)
        self.log_std_range = log_std_range
        low_t = torch.as_tensor(low, dtype=torch.float32).expand(action_dim)
        high_t = torch.as_tensor(high, dtype=torch.float32).expand(action_dim)
        self.register_buffer("scale", (high_t - low_t) / 2)
        self.register_buffer("center", (high_t + low_t) / 2)

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the pre-squash Gaussian."""
        h = self.trunk(obs)
        lo, hi = self.log_std_range
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(self.log_std(h)) + 1)  # smooth clamp into [lo, hi]
        return self.mean(h), log_std.exp()

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log_prob) with the reparameterization trick; deterministic: the squashed mean."""
        mean, std = self.distribution(obs)
        u = mean if deterministic else mean + std * torch.randn_like(mean)
        log_prob = self.log_prob_pre_squash(u, mean, std)
        return self.center + self.scale * torch.tanh(u), log_prob

    def log_prob_pre_squash(self, u: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        gaussian = (-0.5 * ((u - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log |d tanh(u) / du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)); plus the affine scale
        squash = (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1) + self.scale.log().sum()
        return gaussian - squash

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi(action | obs) of given actions (e.g. demonstrations, for BC regularization)."""
        mean, std = self.distribution(obs)
        y = ((action - self.center) / self.scale).clamp(-1 + eps, 1 - eps)
        return self.log_prob_pre_squash(torch.atanh(y), mean, std)


class EnsembleLinear(nn.Module):
    """E independent linear layers applied as one batched matmul: (E, B, in) -> (E, B, out)."""

    def __init__(self, members: int, fan_in: int, fan_out: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(fan_in)  # nn.Linear's default initialization, per member
        self.weight = nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class CriticEnsemble(nn.Module):
    """E Q-functions Q_e(s, a) with LayerNorm after every hidden layer (RLPD: LayerNorm keeps Q bounded when
    extrapolating to actions off the data). `outputs` > 1 gives each member a categorical head (HL-Gauss)."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        members: int = 2,
        hidden: Sequence[int] = (256, 256),
        outputs: int = 1,
        layer_norm: bool = True,
    ) -> None:
        super().__init__()
        self.members = members
        layers: list[nn.Module] = []
        sizes = [obs_dim + action_dim, *hidden]
        for a, b in itertools.pairwise(sizes):
            layers.append(EnsembleLinear(members, a, b))
            if layer_norm:
                layers.append(nn.LayerNorm(b))
            layers.append(nn.ReLU())
        layers.append(EnsembleLinear(members, sizes[-1], outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(B, D), (B, A) -> (E, B, outputs)."""
        x = torch.cat([obs, action], dim=-1)
        return self.net(x.unsqueeze(0).expand(self.members, *x.shape))


class HLGauss(nn.Module):
    """Histogram loss with Gaussian targets (Imani & White 2018; Farebrother et al. 2024): Q as the mean of a
    categorical distribution over fixed bins, trained by cross-entropy against a Gaussian around the TD target,
    which scales to large value ranges and high update-to-data ratios better than MSE."""

    edges: torch.Tensor
    centers: torch.Tensor

    def __init__(self, v_min: float, v_max: float, bins: int = 101, sigma_ratio: float = 0.75) -> None:
        super().__init__()
        if not v_max > v_min or bins < 2:
            raise ValueError(f"HLGauss: expected v_max > v_min and bins >= 2, got [{v_min}, {v_max}] with {bins} bins")
        edges = torch.linspace(v_min, v_max, bins + 1)
        self.register_buffer("edges", edges)
        self.register_buffer("centers", (edges[:-1] + edges[1:]) / 2)
        self.sigma = sigma_ratio * (v_max - v_min) / bins

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        return (torch.softmax(logits, dim=-1) * self.centers).sum(-1)

    def target_probs(self, target: torch.Tensor) -> torch.Tensor:
        t = target.clamp(float(self.edges[0]), float(self.edges[-1])).unsqueeze(-1)
        cdf = torch.special.erf((self.edges - t) / (math.sqrt(2) * self.sigma))
        mass = cdf[..., 1:] - cdf[..., :-1]
        return mass / mass.sum(-1, keepdim=True).clamp_min(1e-12)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of logits (..., bins) against the HL-Gauss histogram of target (...)."""
        return -(self.target_probs(target) * torch.log_softmax(logits, dim=-1)).sum(-1)


# ---------------------------------------------------------------------------------------------------
# the actor as a registered policy: what an actor-critic run saves, evaluates, exports and deploys
# ---------------------------------------------------------------------------------------------------
@dataclass
class GaussianConfig(PolicyConfig):
    """The Gaussian actor of an actor-critic learner, deployed by its deterministic action (the mean): the
    tanh-squashed actor of SAC, RLPD, WSRL, IQL and Cal-QL, or PPO's linear mean over observations standardized by
    the running statistics it learned. It acts on the current observation: one frame in, one action out."""

    obs_horizon: int = 1
    action_horizon: int = 1
    hidden: tuple[int, ...] = (256, 256)
    squash: bool = True
    """tanh-squashed into the action bounds (the SAC family); False: the mean itself, clipped to them (PPO)"""
    activation: Literal["relu", "tanh"] = "relu"
    layer_norm: bool = True
    """LayerNorm after each hidden layer (the SAC family's actor; PPO's has none)"""
    obs_norm: bool = False
    """observations standardized by the running mean and variance the learner kept (PPO), clipped at obs_clip"""
    obs_clip: float = 10.0
    encoder_dim: int = 64
    """features per camera of the image encoder (observations with cameras: pixel SAC / RLPD)"""
    encoder_widths: tuple[int, ...] = (32, 64, 128)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hidden, self.encoder_widths = tuple(self.hidden), tuple(self.encoder_widths)
        for name in ("obs_horizon", "action_horizon"):
            if getattr(self, name) != 1:
                raise ValueError(
                    f"GaussianConfig.{name}: expected 1 (the actor acts on the current observation), "
                    f"got {getattr(self, name)}"
                )
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"GaussianConfig.hidden: expected widths >= 1, got {self.hidden}")


@register
class GaussianPolicy(Policy):
    """An actor-critic learner's actor with the observation handling it was trained with (numeric keys flattened
    in order, cameras through their encoders, PPO's running standardization), so `policy eval`, `policy export`,
    the runtime and the ROS 2 deploy node take it like any other policy. Not trained by `train bc`: the learners
    build it from their agents (`robotrl.rl.sac.actor_policy`, `robotrl.rl.ppo.actor_policy`)."""

    name = "gaussian"
    config_cls = GaussianConfig
    learns_from_data = False
    config: GaussianConfig

    obs_mean: torch.Tensor
    obs_var: torch.Tensor

    def __init__(
        self, spec: Spec, config: PolicyConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__(spec, config, stats)
        cfg = self.config
        obs_dim = sum(int(np.prod(spec.observations[k].shape)) for k in self.vector_keys)
        self.encoder = nn.ModuleDict(
            {
                k: ImageEncoder(spec.observations[k].shape[0], cfg.encoder_dim, cfg.encoder_widths, crop=1.0)
                for k in self.image_keys
            }
        )
        features = obs_dim + cfg.encoder_dim * len(self.encoder)
        act = {"relu": nn.ReLU, "tanh": nn.Tanh}[cfg.activation]
        low, high = (
            torch.as_tensor(b, dtype=torch.float32) for b in (spec.action.low_array(), spec.action.high_array())
        )
        self.actor: nn.Module
        if cfg.squash:
            self.actor = TanhGaussianActor(features, self.action_dim, cfg.hidden, low, high, layer_norm=cfg.layer_norm)
        else:
            self.actor = mlp([features, *cfg.hidden, self.action_dim], act=act, layer_norm=cfg.layer_norm)
        if cfg.obs_norm:  # float64, as the learner keeps them: the standardization is the same to the last bit
            self.register_buffer("obs_mean", torch.zeros(obs_dim, dtype=torch.float64))
            self.register_buffer("obs_var", torch.ones(obs_dim, dtype=torch.float64))

    def features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The current frame's numeric observations flattened in order (standardized with `obs_norm`), then each
        camera's encoder features: what the actor was trained on."""
        batch = next(iter(obs.values())).shape[0]
        vec = [obs[k][:, -1].reshape(batch, -1) for k in self.vector_keys]
        x = torch.cat(vec, dim=-1) if vec else torch.zeros(batch, 0, device=self.device)
        if self.config.obs_norm:
            x = ((x - self.obs_mean.float()) / (self.obs_var.float() + 1e-8).sqrt()).clamp(
                -self.config.obs_clip, self.config.obs_clip
            )
        return torch.cat([x, *(encoder(obs[k][:, -1]) for k, encoder in self.encoder.items())], dim=-1)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The deterministic action (B, 1, A): the squashed mean, or the mean."""
        h = self.features(obs)
        if isinstance(self.actor, TanhGaussianActor):
            mean, _ = self.actor.distribution(h)
            action = self.actor.center + self.actor.scale * torch.tanh(mean)
        else:
            action = self.actor(h)
        return action[:, None]

    def sample_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """The exported graph's noise input, which a deterministic actor does not read (kept as an input, so the
        runtime feeds every policy alike)."""
        return self.sample(obs) + 0.0 * noise[:, :1]


def actor_policy(
    spec: Spec, config: GaussianConfig, parts: Mapping[str, nn.Module | Mapping[str, torch.Tensor] | torch.Tensor]
) -> GaussianPolicy:
    """A `GaussianPolicy` holding a learner's trained parts (modules, their state dicts, or tensors): `actor`, and
    where the config has them the cameras' `encoder` and PPO's `obs_mean` / `obs_var`. Loaded strictly: parts that
    do not match the config are an error here, not a policy that acts differently from the one trained. Built
    aside from torch's random stream (its initial weights are replaced): a learner that saves its policy mid-run
    draws the same numbers after as a run resumed from that point."""
    with torch.random.fork_rng(devices=[]):
        policy = GaussianPolicy(spec, config)
    given: dict[str, torch.Tensor] = {}
    for name, part in parts.items():
        if isinstance(part, nn.Module):
            part = part.state_dict()
        if isinstance(part, Mapping):
            given.update({f"{name}.{k}": v for k, v in part.items()})
        else:
            given[name] = part
    state = policy.state_dict()
    unknown = sorted(given.keys() - state.keys())
    missing = sorted(k for k in state.keys() - given.keys() if not k.startswith("normalizer."))  # identity
    if unknown or missing:
        raise ValueError(f"actor_policy: the learner's parts do not fit {config}: unknown {unknown}, missing {missing}")
    policy.load_state_dict({**state, **given})
    return policy
