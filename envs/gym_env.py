"""A single robotrl task as a plain `gymnasium.Env`.

Tools of the wider ecosystem (Stable-Baselines3, gymnasium's wrappers and env checker, AsyncVectorEnv) expect
one unbatched env. This wraps the CPU backend with `num_envs=1` and no auto-reset, so the physics, rewards and
spec are exactly those of `make(task)`; only the batch dimension is removed.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from robotrl.envs.randomization import Randomization
from robotrl.envs.task import Task


class RobotEnv(gym.Env):
    """One episode at a time of a robotrl task; `info` carries `success` (bool) and `diverged` (bool).

    `options` are task options (`action_mode`, `episode_steps`, ...) and CPU-backend options (`reward_type`,
    `render_images`); the env truncates itself at the task's `episode_steps`, so no `TimeLimit` is needed.
    """

    # a mutable class attribute, as gymnasium.Env declares it
    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 20}  # noqa: RUF012

    def __init__(
        self,
        task: str | Task = "Reach",
        render_mode: str | None = None,
        randomization: Randomization | None = None,
        camera: str | None = None,
        width: int = 640,
        height: int = 480,
        **options: Any,
    ) -> None:
        from robotrl.envs import make

        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode: expected one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        for key in ("num_envs", "autoreset", "output"):
            if key in options:
                raise ValueError(
                    f"{key}: RobotEnv is one unbatched numpy env; use robotrl.envs.make for {key}={options[key]!r}"
                )
        self._vec = make(task, num_envs=1, randomization=randomization, autoreset=False, num_threads=1, **options)
        self.task = self._vec.task
        self.task_spec = self._vec.task_spec
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self.render_mode = render_mode
        self.camera, self.size = camera, (int(height), int(width))
        self.metadata = {**self.metadata, "render_fps": self.task.control_hz}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)  # keeps gymnasium's `np_random` contract (seeded by the same seed)
        obs, _ = self._vec.reset(seed=seed)
        return self._unbatch(obs), {}

    def step(self, action: Any) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        arr = np.asarray(action)
        if arr.shape != self.action_space.shape:
            raise ValueError(f"action: expected shape {self.action_space.shape}, got {arr.shape}")
        obs, reward, terminated, truncated, info = self._vec.step(arr[None])
        out_info = {"success": bool(info["success"][0]), "diverged": bool(info["diverged"][0])}
        return self._unbatch(obs), float(reward[0]), bool(terminated[0]), bool(truncated[0]), out_info

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn("RobotEnv.render: render_mode is None; pass render_mode='rgb_array' to gym.make")
            return None
        return self._vec.render_env(0, self.camera, self.size)

    def close(self) -> None:
        self._vec.close()
        super().close()

    @staticmethod
    def _unbatch(obs: dict[str, Any]) -> dict[str, Any]:
        return {k: str(v[0]) if k == "instruction" else np.array(v[0]) for k, v in obs.items()}
