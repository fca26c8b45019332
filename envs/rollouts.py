"""Running a batched policy in a vector env for a fixed number of episodes (evaluation, expert checks, demos)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class EpisodeStats:
    """Per-episode outcomes, in the order episodes finished."""

    success: np.ndarray  # bool: success reached at any step of the episode
    returns: np.ndarray
    lengths: np.ndarray

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.success)) if len(self.success) else float("nan")

    def success_ci95(self) -> tuple[float, float]:
        """Wilson score interval, honest at 0% and 100% where the normal approximation is not."""
        n = len(self.success)
        if n == 0:
            return (float("nan"), float("nan"))
        p, z = self.success_rate, 1.96
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(0.0, centre - half), min(1.0, centre + half))


def run_episodes(
    env: Any,
    policy: Callable[[dict[str, Any]], np.ndarray],
    episodes: int,
    seed: int | None = 0,
    on_episode_start: Callable[[int], None] | None = None,
) -> EpisodeStats:
    """Step `env` (auto-resetting) with `policy` until `episodes` episodes have finished.

    Only episodes that started in the first `ceil(episodes / num_envs)` waves are counted, so the result
    does not favour short episodes. `on_episode_start(i)` is called when env i starts a new episode
    (experts keep per-episode state).
    """
    if episodes <= 0:
        raise ValueError(f"episodes: expected a positive integer, got {episodes}")
    n = env.num_envs
    waves = math.ceil(episodes / n)
    started = np.ones(n, dtype=np.int64)
    obs, _ = env.reset(seed=seed)
    ever = np.zeros(n, dtype=bool)
    ret = np.zeros(n)
    length = np.zeros(n, dtype=np.int64)
    success, returns, lengths = [], [], []
    if on_episode_start is not None:
        for i in range(n):
            on_episode_start(i)
    while len(success) < episodes and (started <= waves).any():
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        ever |= np.asarray(info["success"], dtype=bool)
        ret += np.asarray(reward, dtype=np.float64)
        length += 1
        for i in np.nonzero(np.asarray(terminated) | np.asarray(truncated))[0]:
            if started[i] <= waves and len(success) < episodes:
                success.append(bool(ever[i]))
                returns.append(float(ret[i]))
                lengths.append(int(length[i]))
            started[i] += 1
            ever[i], ret[i], length[i] = False, 0.0, 0
            if on_episode_start is not None:
                on_episode_start(i)
    return EpisodeStats(np.array(success, dtype=bool), np.array(returns), np.array(lengths))


def evaluate_expert(env: Any, noise: float = 0.0, episodes: int = 200, seed: int = 0) -> EpisodeStats:
    """Success of the task's scripted expert over `episodes` seeded episodes."""
    expert = env.task.expert(noise=noise, seed=seed)
    expert.reset(env.num_envs)
    return run_episodes(env, expert.act, episodes, seed=seed, on_episode_start=expert.reset_env)
