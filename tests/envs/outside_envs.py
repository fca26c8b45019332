"""Outside gymnasium envs of the kind users bring (imported by name: `outside_envs:make_point`), for
tests/envs/test_outside.py and the CLI tests that run on them."""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
import numpy as np


class PointGoal(gym.Env):
    """A point on a plane that must reach a goal; it reports `is_success` (as gymnasium-robotics envs do)."""

    metadata = {"render_fps": 10}  # noqa: RUF012

    def __init__(self, radius: float = 0.05) -> None:
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.radius = radius

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos, self.goal = self.np_random.uniform(-0.8, 0.8, (2, 2))
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.pos = np.clip(self.pos + 0.1 * np.asarray(action), -1, 1)
        dist = float(np.linalg.norm(self.goal - self.pos))
        return self._obs(), -dist, False, False, {"is_success": dist < self.radius}

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.goal]).astype(np.float32)


def make_point(radius: float = 0.05, steps: int = 30) -> gym.Env:
    return gym.wrappers.TimeLimit(PointGoal(radius), steps)


class Demonstrator:
    """A scripted demonstrator over the batch: straight to the goal."""

    def __init__(self, gain: float = 5.0) -> None:
        self.gain, self.episodes = gain, 0

    def reset(self, num_envs: int) -> None:
        self.episodes = 0

    def reset_env(self, i: int) -> None:
        self.episodes += 1

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        s = obs["state"]
        return np.clip(self.gain * (s[:, 2:] - s[:, :2]), -1, 1)


class Unbounded(PointGoal):
    """The point pushed by an unbounded action (a Box without bounds): nothing a robot could be limited to."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


def make_unbounded() -> gym.Env:
    return gym.wrappers.TimeLimit(Unbounded(), 10)


class OwnSeed(PointGoal):
    """An env with a `seed` keyword of its own (its goal layout), which the adapter must pass through."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.layout = seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed)
        return obs, {**info, "layout": self.layout}


def make_own_seed(seed: int = 0) -> gym.Env:
    return gym.wrappers.TimeLimit(OwnSeed(seed), 10)


class GlobalRandom(PointGoal):
    """Ignores reset(seed=...): draws its start from NumPy's and Python's global generators."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        self.pos = np.random.uniform(-0.8, 0.8, 2)
        self.goal = np.array([random.uniform(-0.8, 0.8), random.uniform(-0.8, 0.8)])
        return self._obs(), {}


def make_global_random() -> gym.Env:
    return gym.wrappers.TimeLimit(GlobalRandom(), 10)


class Unseeded(PointGoal):
    """Draws its start from fresh OS entropy: nothing makes it repeat."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        self.pos, self.goal = np.random.default_rng().uniform(-0.8, 0.8, (2, 2))
        return self._obs(), {}


def make_unseeded() -> gym.Env:
    return gym.wrappers.TimeLimit(Unseeded(), 10)


def not_an_env() -> int:
    return 3
