"""The tanh-squashed Gaussian actor of SAC-style actor-critic methods (SAC, RLPD, WSRL).

Actions are tanh(u) with u ~ N(mean(s), std(s)), scaled to the spec's bounds; the log-likelihood carries the
change-of-variables term of the squashing, computed in the numerically stable softplus form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from robotrl.policies.nets import mlp


class TanhGaussianActor(nn.Module):
    """obs features (B, D) -> actions in [low, high] (B, A), with log-probabilities for the entropy term."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256), low: float | torch.Tensor = -1.0,
                 high: float | torch.Tensor = 1.0, log_std_range: tuple[float, float] = (-5.0, 2.0),
                 layer_norm: bool = True) -> None:
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
