"""Running a batched policy in a vector env for a fixed number of episodes (evaluation, expert checks, demos)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def wilson_ci95(successes: np.ndarray) -> tuple[float, float]:
    """Wilson score interval of a success rate, honest at 0% and 100% where the normal approximation is not."""
    n = len(successes)
    if n == 0:
        return (float("nan"), float("nan"))
    p, z = float(np.mean(successes)), 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class EpisodeStats:
    """Per-episode outcomes, in the order episodes finished."""

    success: np.ndarray  # bool: success reached at any step of the episode
    returns: np.ndarray
    lengths: np.ndarray
    instruction: np.ndarray | None = None
    """the episode's instruction (tasks with one)"""
    wrong_object: np.ndarray | None = None
    """bool: another object than the instructed one got where the instruction wanted it (`Task.wrong_object`)"""
    reports_success: bool = True
    """False for an outside env that reports no success (`success` is then all False): judge it by `returns`"""
    success_steps: np.ndarray | None = None
    """steps that succeeded, per episode: what a task whose success is a per-step state (a legged robot tracking
    its velocity command) is judged by (`Task.measures`)"""
    terminated: np.ndarray | None = None
    """bool: the episode ended by the task's termination (a fall), not its time limit"""

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.success)) if len(self.success) and self.reports_success else float("nan")

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if len(self.returns) else float("nan")

    @property
    def score(self) -> float:
        """What a run keeps its best weights by: the success rate, or the mean return where there is none."""
        return self.success_rate if self.reports_success else self.mean_return

    @property
    def by(self) -> str:
        """The name of `score`: "success_rate" or "mean_return"."""
        return "success_rate" if self.reports_success else "mean_return"

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """The success rate (where reported) and the mean return, as metrics rows name them."""
        out = {f"{prefix}/success_rate": self.success_rate} if self.reports_success else {}
        return {**out, f"{prefix}/mean_return": self.mean_return}

    def success_ci95(self) -> tuple[float, float]:
        return wilson_ci95(self.success) if self.reports_success else (float("nan"), float("nan"))

    def by_instruction(self) -> dict[str, dict[str, Any]]:
        """Per instruction: episodes, success rate with its Wilson interval, and the wrong-object rate."""
        if self.instruction is None:
            return {}
        out = {}
        for text in sorted(set(self.instruction.tolist())):
            sel = self.instruction == text
            row: dict[str, Any] = {
                "episodes": int(sel.sum()),
                "success_rate": float(self.success[sel].mean()),
                "ci95": list(wilson_ci95(self.success[sel])),
            }
            if self.wrong_object is not None:
                row["wrong_object_rate"] = float(self.wrong_object[sel].mean())
            out[text] = row
        return out


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
    (experts keep per-episode state). Tasks with instructions also get each episode's instruction and,
    where the task defines it, whether a wrong object was placed at any step.
    """
    if episodes <= 0:
        raise ValueError(f"episodes: expected a positive integer, got {episodes}")
    n = env.num_envs
    waves = math.ceil(episodes / n)
    started = np.ones(n, dtype=np.int64)
    obs, _ = env.reset(seed=seed)
    text = np.asarray(obs["instruction"], dtype=object).copy() if "instruction" in obs else None
    judge = getattr(getattr(env, "task", None), "wrong_object", None)  # outside (adapted) envs have no Task
    ever = np.zeros(n, dtype=bool)
    good = np.zeros(n, dtype=np.int64)
    wrong, has_wrong = np.zeros(n, dtype=bool), False
    ret = np.zeros(n)
    length = np.zeros(n, dtype=np.int64)
    success: list[bool] = []
    returns: list[float] = []
    lengths: list[int] = []
    good_steps: list[int] = []
    ended: list[bool] = []
    instructions: list[Any] = []
    wrongs: list[bool] = []
    if on_episode_start is not None:
        for env_index in range(n):
            on_episode_start(env_index)
    while len(success) < episodes and (started <= waves).any():
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        ever |= np.asarray(info["success"], dtype=bool)
        good += np.asarray(info["success"], dtype=bool)
        done = np.asarray(terminated) | np.asarray(truncated)
        placed = judge(obs) if judge is not None else None
        if judge is not None and placed is not None:
            has_wrong = True
            if done.any():  # an env that just ended was judged on its last observation, not on its new episode's
                placed = np.where(done, judge(info["final_obs"]), placed)
            wrong |= np.asarray(placed, dtype=bool)
        ret += np.asarray(reward, dtype=np.float64)
        length += 1
        for i in np.nonzero(done)[0]:
            if started[i] <= waves and len(success) < episodes:
                success.append(bool(ever[i]))
                returns.append(float(ret[i]))
                lengths.append(int(length[i]))
                good_steps.append(int(good[i]))
                ended.append(bool(np.asarray(terminated)[i]))
                wrongs.append(bool(wrong[i]))
                if text is not None:
                    instructions.append(str(text[i]))
            started[i] += 1
            ever[i], wrong[i], ret[i], length[i], good[i] = False, False, 0.0, 0, 0
            if text is not None:
                text[i] = obs["instruction"][i]
            if on_episode_start is not None:
                on_episode_start(int(i))
    return EpisodeStats(
        np.array(success, dtype=bool),
        np.array(returns),
        np.array(lengths),
        np.array(instructions, dtype=object) if text is not None else None,
        np.array(wrongs, dtype=bool) if has_wrong else None,
        reports_success=bool(getattr(env, "reports_success", True)),
        success_steps=np.array(good_steps, dtype=np.int64),
        terminated=np.array(ended, dtype=bool),
    )


def evaluate_expert(env: Any, noise: float = 0.0, episodes: int = 200, seed: int = 0) -> EpisodeStats:
    """Success of the task's scripted expert over `episodes` seeded episodes."""
    expert = env.task.expert(noise=noise, seed=seed)
    expert.reset(env.num_envs)
    return run_episodes(env, expert.act, episodes, seed=seed, on_episode_start=expert.reset_env)
