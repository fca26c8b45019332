"""Domain randomization, drawn per env at every reset, the same way on both backends.

Physical parameters are scaled from the nominal model by one factor per env and parameter group, drawn
uniformly in the configured range. The functions are written against `xp` so the CPU backend (per-env
MjModel copies) and MJX (a batched model under vmap) share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: uniform draws per env consumed by `sample_model_fields` and `sample_latency`
RANDOMIZATION_DIMS = 5


@dataclass
class Randomization:
    """Ranges of the per-env randomization. Scale ranges multiply the nominal model value; (1, 1) is off."""

    friction: tuple[float, float] = (1.0, 1.0)
    mass: tuple[float, float] = (1.0, 1.0)
    damping: tuple[float, float] = (1.0, 1.0)
    actuator_gain: tuple[float, float] = (1.0, 1.0)
    latency_steps: tuple[int, int] = (0, 0)  # control steps between a command and its execution
    obs_noise: float = 0.0  # std of Gaussian noise added to every float observation
    camera_pos: float = 0.0  # metres: camera position jitter (rendered images)
    light: float = 0.0  # relative jitter of the light intensity (rendered images)

    def __post_init__(self) -> None:
        for name in ("friction", "mass", "damping", "actuator_gain"):
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi:
                raise ValueError(f"Randomization.{name}: expected 0 < low <= high, got ({lo}, {hi})")
        lo, hi = self.latency_steps
        if not 0 <= lo <= hi:
            raise ValueError(f"Randomization.latency_steps: expected 0 <= low <= high, got ({lo}, {hi})")
        for name in ("obs_noise", "camera_pos", "light"):
            if getattr(self, name) < 0:
                raise ValueError(f"Randomization.{name}: expected >= 0, got {getattr(self, name)}")

    @property
    def changes_model(self) -> bool:
        return any(getattr(self, k) != (1.0, 1.0) for k in ("friction", "mass", "damping", "actuator_gain"))

    @property
    def max_latency(self) -> int:
        return int(self.latency_steps[1])

    @classmethod
    def sim2real(cls) -> Randomization:
        """A moderate default for sim-to-real training."""
        return cls(
            friction=(0.7, 1.3),
            mass=(0.8, 1.2),
            damping=(0.8, 1.2),
            actuator_gain=(0.85, 1.15),
            latency_steps=(0, 2),
            obs_noise=0.005,
            camera_pos=0.02,
            light=0.3,
        )


MODEL_FIELDS = ("geom_friction", "body_mass", "body_inertia", "dof_damping", "actuator_gainprm", "actuator_biasprm")


def nominal_fields(model: Any) -> dict[str, np.ndarray]:
    return {k: np.array(getattr(model, k)) for k in MODEL_FIELDS}


def _scale(xp: Any, u: Any, rng: tuple[float, float]) -> Any:
    return rng[0] + u * (rng[1] - rng[0])


def sample_model_fields(xp: Any, cfg: Randomization, nominal: dict[str, Any], u: Any) -> dict[str, Any]:
    """Per-env model fields (n, ...) from uniform draws u (n, RANDOMIZATION_DIMS)."""
    f, m, d, g = (
        _scale(xp, u[:, i], r) for i, r in enumerate((cfg.friction, cfg.mass, cfg.damping, cfg.actuator_gain))
    )
    friction = (
        xp.asarray(nominal["geom_friction"])[None] * xp.stack([f, xp.ones_like(f), xp.ones_like(f)], -1)[:, None, :]
    )
    gain = xp.asarray(nominal["actuator_gainprm"])[None]
    bias = xp.asarray(nominal["actuator_biasprm"])[None]
    # a position actuator is kp*(ctrl - q): gain and the two bias terms (-kp, -kv) scale together
    gmask = np.zeros(gain.shape[-1])
    gmask[0] = 1.0
    bmask = np.zeros(bias.shape[-1])
    bmask[1:3] = 1.0
    gs = 1.0 + (g[:, None, None] - 1.0) * xp.asarray(gmask)
    bs = 1.0 + (g[:, None, None] - 1.0) * xp.asarray(bmask)
    return {
        "geom_friction": friction,
        "body_mass": xp.asarray(nominal["body_mass"])[None] * m[:, None],
        "body_inertia": xp.asarray(nominal["body_inertia"])[None] * m[:, None, None],
        "dof_damping": xp.asarray(nominal["dof_damping"])[None] * d[:, None],
        "actuator_gainprm": gain * gs,
        "actuator_biasprm": bias * bs,
    }


def sample_latency(xp: Any, cfg: Randomization, u: Any) -> Any:
    """Integer action delay per env from a uniform draw u (n,)."""
    lo, hi = cfg.latency_steps
    return xp.minimum(xp.floor(lo + u * (hi - lo + 1)), hi).astype(xp.int32)


def delay_actions(xp: Any, history: Any, action: Any, latency: Any) -> tuple[Any, Any]:
    """Push `action` into the per-env history (n, L+1, a) and return the one `latency` steps old."""
    history = xp.concatenate([action[:, None, :], history[:, :-1, :]], axis=1)
    applied = xp.take_along_axis(history, latency[:, None, None].astype(xp.int32), axis=1)[:, 0, :]
    return applied, history
