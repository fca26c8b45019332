"""Batch recording of a policy or scripted expert across a vector env into an episode store.

This is the fast path for demonstrations (many envs stepped together); the interactive, one-operator path
with keep/discard is `robotrl.datasets.collect`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from robotrl.datasets.store import EpisodeStore, VectorRecorder
from robotrl.envs.tasks import DEFAULT_TASK


def record_policy(
    env: Any,
    act: Callable[[dict[str, np.ndarray]], np.ndarray],
    store: EpisodeStore,
    episodes: int,
    source: str = "scripted",
    on_episode_end: Callable[[int], None] | None = None,
    seed: int | None = None,
    progress: bool = True,
    **meta: Any,
) -> list[int]:
    """Step `env` with `act` until at least `episodes` more episodes are committed to `store` (envs that end
    on the same step all count); returns their indices. Episodes still running then are discarded, so every
    stored episode is whole."""
    recorder = VectorRecorder(store, env.num_envs, source=source, **meta)
    obs, _ = env.reset(seed=seed)
    bar = tqdm(total=episodes, desc=f"record {store.spec.task}", unit="ep", disable=not progress, leave=False)
    while len(recorder.finalized) < episodes:
        action = np.asarray(act(obs), dtype=np.float32)
        next_obs, reward, terminated, truncated, info = env.step(action)
        for i in recorder.add(obs, action, reward, terminated, truncated, info):
            bar.update(1)
            if on_episode_end is not None:
                on_episode_end(i)
        obs = next_obs
    bar.close()
    recorder.discard()
    return recorder.finalized


def record_expert(
    out: str | Path,
    task: str,
    episodes: int,
    num_envs: int = 8,
    noise: float | None = None,
    seed: int = 0,
    progress: bool = True,
    **task_options: Any,
) -> EpisodeStore:
    """Demonstrations of `task`'s scripted expert (at the task's `demo_noise` unless `noise` is given),
    appended to the store at `out` (created if absent). Returns the store, open for appending."""
    from robotrl.envs import make

    env = make(task, num_envs=num_envs, seed=seed, **task_options)
    noise = env.task.demo_noise if noise is None else noise
    expert = env.task.expert(noise=noise, seed=seed)
    expert.reset(num_envs)
    store = EpisodeStore.create(out, env.task_spec, exist_ok=True)
    record_policy(
        env,
        expert.act,
        store,
        episodes,
        source="scripted",
        on_episode_end=expert.reset_env,
        seed=seed,
        progress=progress,
        noise=noise,
    )
    env.close()
    return store


@dataclass
class DataRecord:
    """Record demonstrations of a task's scripted expert (a noisy stand-in for a teleoperator) into a store."""

    task: str = DEFAULT_TASK
    out: Path = Path("data/pusht.zarr")
    """store to create, or to append to when its spec matches"""
    episodes: int = 100
    num_envs: int = 8
    noise: float | None = None
    """expert noise (default: the task's demo_noise, the level that stands in for a human)"""
    seed: int = 0
    episode_steps: int | None = None
    """override the task's episode length"""
    images: bool | None = None
    """PushT: also record the overhead camera (image_top)"""
    image_size: int | None = None
    """camera image size in pixels (square)"""
    randomization: str | None = None
    """'task': every episode in the task's sim-to-real domain randomization (dynamics, latency, camera, light),
    for policies meant to cross the sim-to-real gap; default: nominal"""


def run_record(config: DataRecord) -> EpisodeStore:
    options = {
        k: v
        for k in ("episode_steps", "images", "image_size", "randomization")
        if (v := getattr(config, k)) is not None
    }
    store = record_expert(
        config.out,
        config.task,
        config.episodes,
        num_envs=config.num_envs,
        noise=config.noise,
        seed=config.seed,
        **options,
    )
    print(json.dumps({k: v for k, v in store.summary().items() if k != "keys"}))
    return store
