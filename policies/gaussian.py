"""The tanh-squashed Gaussian actor of SAC-style actor-critic methods (SAC, RLPD, WSRL).

Actions are tanh(u) with u ~ N(mean(s), std(s)), scaled to the spec's bounds; the log-likelihood carries the
change-of-variables term of the squashing, computed in the numerically stable softplus form.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from robotrl.policies.nets import mlp


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
