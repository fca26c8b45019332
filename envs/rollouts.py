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
    """Per-episode outcomes. From `run_episodes`, episode k is env `k % num_envs` of wave `k // num_envs`: the same
    start for any policy evaluated on the same seed and env count."""

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


def wave_seed(seed: int, wave: int) -> int:
    """The seed wave `wave` of an evaluation from `seed` resets its envs with: `seed` itself for the first wave,
    then one drawn from (seed, wave), so no two waves or evaluations share a start by neighbouring integers (a
    non-negative int32, which every backend's reset takes)."""
    return seed if wave == 0 else int(np.random.SeedSequence([seed, wave]).generate_state(1)[0] & 0x7FFF_FFFF)


def run_episodes(
    env: Any,
    policy: Callable[[dict[str, Any]], np.ndarray],
    episodes: int,
    seed: int | None = 0,
    on_episode_start: Callable[[int], None] | None = None,
) -> EpisodeStats:
    """Step `env` with `policy` for `episodes` episodes, in waves of `env.num_envs`.

    Each wave resets every env from the wave's seed (`wave_seed`) and steps until each counted env's episode has
    ended; an env whose episode ended waits out the wave, its steps ignored. Episode k is env `k % num_envs` of
    wave `k // num_envs` and starts from the same state whatever the policy does, so two policies run on the same
    seed and env count meet the same episodes, index for index, and their outcomes pair (an auto-reset stream
    would shift every later start after one early termination). The last wave counts its first envs, not the
    first to finish, so the result does not favour short episodes. `on_episode_start(i)` is called when env i
    starts a wave's episode (experts keep per-episode state). Tasks with instructions also get each episode's
    instruction and, where the task defines it, whether a wrong object was placed at any step.
    """
    if episodes <= 0:
        raise ValueError(f"episodes: expected a positive integer, got {episodes}")
    n = env.num_envs
    judge = getattr(getattr(env, "task", None), "wrong_object", None)  # outside (adapted) envs have no Task
    has_wrong, has_text = False, False
    columns: dict[str, list[Any]] = {k: [] for k in ("success", "returns", "lengths", "good", "ended", "wrong", "text")}
    for wave in range(math.ceil(episodes / n)):
        obs, _ = env.reset(seed=None if seed is None else wave_seed(seed, wave))
        count = min(n, episodes - wave * n)
        text = np.asarray(obs["instruction"], dtype=object).copy() if "instruction" in obs else None
        live = np.ones(n, dtype=bool)
        ever, ended, wrong = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        good, length, ret = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n)
        if on_episode_start is not None:
            for env_index in range(n):
                on_episode_start(env_index)
        while live[:count].any():
            obs, reward, terminated, truncated, info = env.step(policy(obs))
            succeeded = np.asarray(info["success"], dtype=bool) & live
            ever |= succeeded
            good += succeeded
            done = (np.asarray(terminated) | np.asarray(truncated)) & live
            placed = judge(obs) if judge is not None else None
            if judge is not None and placed is not None:
                has_wrong = True
                if done.any():  # an env that just ended was judged on its last observation, not on its new episode's
                    placed = np.where(done, judge(info["final_obs"]), placed)
                wrong |= np.asarray(placed, dtype=bool) & live
            ret += np.where(live, np.asarray(reward, dtype=np.float64), 0.0)
            length += live
            ended |= np.asarray(terminated, dtype=bool) & done
            live &= ~done
        for key, values in zip(
            ("success", "returns", "lengths", "good", "ended", "wrong"), (ever, ret, length, good, ended, wrong)
        ):
            columns[key].extend(values[:count].tolist())
        if text is not None:
            has_text = True
            columns["text"].extend(str(t) for t in text[:count])
    return EpisodeStats(
        np.array(columns["success"], dtype=bool),
        np.array(columns["returns"], dtype=np.float64),
        np.array(columns["lengths"], dtype=np.int64),
        np.array(columns["text"], dtype=object) if has_text else None,
        np.array(columns["wrong"], dtype=bool) if has_wrong else None,
        reports_success=bool(getattr(env, "reports_success", True)),
        success_steps=np.array(columns["good"], dtype=np.int64),
        terminated=np.array(columns["ended"], dtype=bool),
    )


def evaluate_expert(env: Any, noise: float = 0.0, episodes: int = 200, seed: int = 0) -> EpisodeStats:
    """Success of the task's scripted expert over `episodes` seeded episodes."""
    expert = env.task.expert(noise=noise, seed=seed)
    expert.reset(env.num_envs)
    return run_episodes(env, expert.act, episodes, seed=seed, on_episode_start=expert.reset_env)
