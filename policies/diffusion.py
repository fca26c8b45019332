"""Diffusion over action chunks (DDPM training, DDPM or DDIM sampling), as diffusion policy does it: the U-Net
predicts the noise added at a random step of a squared-cosine schedule."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from robotrl.core.spec import Spec
from robotrl.policies.base import register
from robotrl.policies.generative import GenerativeConfig, GenerativePolicy


@dataclass
class DiffusionConfig(GenerativeConfig):
    train_steps: int = 100
    """diffusion steps of the noise schedule"""
    sampler: str = "ddim"
    """'ddpm' (all train_steps, stochastic) or 'ddim' (deterministic, `steps` of them)"""
    steps: int = 10
    """DDIM steps at inference"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sampler not in ("ddpm", "ddim"):
            raise ValueError(f"DiffusionConfig.sampler: expected 'ddpm' or 'ddim', got {self.sampler!r}")
        if not 1 <= self.steps <= self.train_steps:
            raise ValueError(f"DiffusionConfig.steps: expected 1..train_steps ({self.train_steps}), got {self.steps}")


def cosine_alphas_cumprod(steps: int, s: float = 0.008) -> torch.Tensor:
    """alpha-bar of the squared-cosine schedule (Nichol & Dhariwal), betas capped at 0.999."""
    t = torch.linspace(0, steps, steps + 1, dtype=torch.float64) / steps
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    betas = torch.clamp(1 - f[1:] / f[:-1], max=0.999)
    return torch.cumprod(1 - betas, 0).float()


@register
class DiffusionPolicy(GenerativePolicy):
    name = "diffusion"
    config_cls = DiffusionConfig
    student = "consistency"
    config: DiffusionConfig
    alpha_bar: torch.Tensor
    #: max |torch - exported| (env units) an export must reach. Looser than the flow policies' 1e-4: DDIM's first
    #: step divides by sqrt(alpha-bar) ~ 5e-4 at the noisiest point, so float32 rounding differences between
    #: backends (~1e-7) come out up to ~2000x larger where the clean-chunk estimate is not clamped (1.2e-4 seen)
    export_tolerance = 1e-3

    def __init__(
        self, spec: Spec, config: DiffusionConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__(spec, config, stats)
        self.register_buffer("alpha_bar", cosine_alphas_cumprod(self.config.train_steps), persistent=False)

    def loss(self, obs: dict[str, torch.Tensor], action: torch.Tensor, action_is_pad: torch.Tensor) -> torch.Tensor:
        x0, mask = self.pad_chunk(action, action_is_pad)
        k = torch.randint(0, self.config.train_steps, (x0.shape[0],), device=x0.device)
        ab = self.alpha_bar[k][:, None, None]
        eps = torch.randn_like(x0)
        xk = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        return self.masked_mse(self.net(xk, k.float(), self.encoder(obs)), eps, mask)

    def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        cond = self.encoder(obs)
        eps = self.noise(cond.shape[0], cond.device)
        x = self.initial_noise(obs, eps)
        n = self.config.train_steps
        if self.config.sampler == "ddpm":
            ks = list(range(n - 1, -1, -1))
        else:
            ks = torch.linspace(n - 1, 0, self.config.steps).round().long().tolist()
        for i, k in enumerate(ks):
            ab = self.alpha_bar[k]
            ab_prev = self.alpha_bar[ks[i + 1]] if i + 1 < len(ks) else torch.tensor(1.0)
            eps = self.net(x, torch.full((x.shape[0],), float(k), device=x.device), cond)
            x0 = ((x - (1 - ab).sqrt() * eps) / ab.sqrt()).clamp(-1.5, 1.5)
            if self.config.sampler == "ddim":  # deterministic (eta = 0)
                x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
            else:
                beta = 1 - ab / ab_prev
                mean = (ab_prev.sqrt() * beta / (1 - ab)) * x0 + ((1 - beta).sqrt() * (1 - ab_prev) / (1 - ab)) * x
                var = beta * (1 - ab_prev) / (1 - ab)
                x = mean + (var.sqrt() * torch.randn_like(x) if k > 0 else 0.0)
        return self.refine(obs, x[:, : self.config.action_horizon], eps)
