"""What both backends share: the gymnasium `VectorEnv` surface, input checks, spaces and output types."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from robotrl.core.spec import STRING, ArraySpec, Spec
from robotrl.envs.randomization import Randomization
from robotrl.envs.task import Task

INSTRUCTION_CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.'-"


def space_for(spec: ArraySpec) -> gym.Space:
    if spec.dtype == STRING:
        return gym.spaces.Text(max_length=256, charset=INSTRUCTION_CHARSET)
    if spec.dtype == "uint8":
        return gym.spaces.Box(0, 255, spec.shape, np.uint8)
    return gym.spaces.Box(
        spec.low_array().astype(np.float32), spec.high_array().astype(np.float32), spec.shape, np.dtype(spec.dtype)
    )


def observation_space(spec: Spec) -> gym.spaces.Dict:
    return gym.spaces.Dict({k: space_for(v) for k, v in spec.observations.items()})


def check_num_envs(num_envs: int) -> int:
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs <= 0:
        raise ValueError(f"num_envs: expected a positive integer, got {num_envs!r}")
    return int(num_envs)


def action_array(actions: Any, spec: ArraySpec, num_envs: int) -> np.ndarray:
    """A batch of actions as float64 numpy, of the right shape and a numeric dtype (not yet checked finite or clipped:
    `check_actions` does both)."""
    if hasattr(actions, "detach"):  # a torch tensor
        actions = actions.detach().cpu().numpy()
    arr = np.asarray(actions)
    expected = (num_envs, *spec.shape)
    if arr.shape != expected:
        raise ValueError(f"actions: expected shape {expected} (num_envs, action_dim), got {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"actions: expected a float dtype ({spec.dtype}), got {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def nonfinite_actions(arr: np.ndarray) -> ValueError:
    """The error for a batch of actions with a NaN or inf, naming its envs."""
    bad = np.unique(np.nonzero(~np.isfinite(arr))[0]).tolist()
    return ValueError(f"actions: expected finite values, got NaN/inf in env(s) {bad}")


def check_actions(actions: Any, spec: ArraySpec, num_envs: int) -> np.ndarray:
    """Validate a batch of actions and clip it to the bounds; a wrong shape, dtype or a NaN is an error."""
    arr = action_array(actions, spec, num_envs)
    if not np.isfinite(arr).all():
        raise nonfinite_actions(arr)
    return np.clip(arr, spec.low_array(), spec.high_array())


def check_output(output: str, allowed: tuple[str, ...] = ("numpy", "torch")) -> str:
    if output not in allowed:
        choices = f"{', '.join(map(repr, allowed[:-1]))} or {allowed[-1]!r}" if len(allowed) > 1 else repr(allowed[0])
        raise ValueError(f"output: expected {choices}, got {output!r}")
    return output


def convert_obs(obs: dict[str, Any], output: str) -> dict[str, Any]:
    """Numeric observations as torch tensors (zero-copy) for output="torch"; strings stay numpy object arrays."""
    if output == "numpy":
        return obs
    import torch

    return {k: torch.as_tensor(v) if isinstance(v, np.ndarray) and v.dtype != object else v for k, v in obs.items()}


def step_output(
    output: str, obs: dict[str, Any], reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, info: dict
) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
    """A numpy step result in the requested output type."""
    if output == "torch":
        import torch

        return (
            convert_obs(obs, output),
            torch.as_tensor(reward),
            torch.as_tensor(terminated),
            torch.as_tensor(truncated),
            info,
        )
    return obs, reward, terminated, truncated, info


class RobotVectorEnv(gym.vector.VectorEnv):
    """A batch of one task's envs; episodes auto-reset in the same step (`info['final_obs']` keeps the last obs).

    Subclasses (the backends) implement `_reset_envs` and `_step_envs` on numpy or JAX arrays.
    """

    # a mutable class attribute, as gymnasium.Env declares it
    metadata: dict[str, Any] = {  # noqa: RUF012
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": ["rgb_array"],
    }
    #: array types this backend can hand out
    outputs: tuple[str, ...] = ("numpy", "torch")

    def __init__(
        self,
        task: Task,
        num_envs: int,
        randomization: Randomization | None = None,
        seed: int | None = None,
        output: str = "numpy",
        autoreset: bool = True,
        images: bool = True,
        reward_type: str = "dense",
    ) -> None:
        self.num_envs = check_num_envs(num_envs)
        if reward_type not in ("dense", "sparse"):
            raise ValueError(f"reward_type: expected 'dense' or 'sparse', got {reward_type!r}")
        self.reward_type = reward_type
        check_output(output, self.outputs)
        self.task = task
        spec = task.spec()
        if not images:  # a backend that renders nothing must not promise image keys
            spec = dataclasses.replace(
                spec, observations={k: v for k, v in spec.observations.items() if not v.is_image}
            )
        self.task_spec: Spec = spec
        self.randomization = randomization if randomization is not None else Randomization()
        self.output = output
        self.autoreset = autoreset
        self.single_observation_space = observation_space(self.task_spec)
        self.single_action_space = space_for(self.task_spec.action)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.render_mode = "rgb_array"
        self._seed = seed
