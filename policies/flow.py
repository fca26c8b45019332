"""Flow matching over action chunks (rectified flow): learn the velocity that carries Gaussian noise to the
demonstrated chunk along straight lines, then integrate it with Euler or Heun steps chosen at inference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from robotrl.policies.base import PolicyConfig, register
from robotrl.policies.generative import GenerativeConfig, GenerativePolicy


@dataclass
class FlowConfig(GenerativeConfig):
    steps: int = 10
    """integration steps at inference (changeable after training: `policy.config.steps = k`)"""
    solver: str = "euler"
    """'euler' or 'heun' (second order, two network calls per step)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.solver not in ("euler", "heun"):
            raise ValueError(f"FlowConfig.solver: expected 'euler' or 'heun', got {self.solver!r}")
        if self.steps < 1:
            raise ValueError(f"FlowConfig.steps: expected >= 1, got {self.steps}")


@register
class FlowPolicy(GenerativePolicy):
    """x_t = (1 - t) x0 + t x1 with x0 ~ N(0, I) and x1 the action chunk; the U-Net predicts x1 - x0."""

    name = "flow"
    #: declared as the base's: VLAPolicy, a FlowPolicy, has its own config class
    config_cls: ClassVar[type[PolicyConfig]] = FlowConfig
    student: ClassVar[str | None] = "consistency"
    time_scale = 100.0  # t in [0, 1]: spread it over the embedding's frequencies

    def loss(
        self,
        obs: dict[str, torch.Tensor],
        action: torch.Tensor,
        action_is_pad: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flow matching on normalized chunks; `weight` (B,) weighs the samples (offline RL's AWR extraction)."""
        x1, mask = self.pad_chunk(action, action_is_pad)
        x0 = torch.randn_like(x1)
        t = torch.rand(x1.shape[0], device=x1.device)
        xt = (1 - t)[:, None, None] * x0 + t[:, None, None] * x1
        return self.masked_mse(self.net(xt, t, self.encoder(obs)), x1 - x0, mask, weight)

    def velocity(self, x: torch.Tensor, t: float | torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(t, device=x.device, dtype=x.dtype).expand(x.shape[0])
        return self.net(x, t, cond)

    def integrate(self, x: torch.Tensor, cond: torch.Tensor, steps: int, solver: str = "euler") -> torch.Tensor:
        dt = 1.0 / steps
        for i in range(steps):
            t = i * dt
            v = self.velocity(x, t, cond)
            if solver == "heun":
                x_euler = x + dt * v
                v = 0.5 * (v + self.velocity(x_euler, t + dt, cond))
            x = x + dt * v
        return x

    def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        cond = self.encoder(obs)
        eps = self.noise(cond.shape[0], cond.device)
        x = self.integrate(self.initial_noise(obs, eps), cond, self.config.steps, self.config.solver)
        return self.refine(obs, x[:, : self.config.action_horizon], eps)
