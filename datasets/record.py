"""Batch recording of a policy or scripted expert across a vector env into an episode store.

This is the fast path for demonstrations (many envs stepped together); the interactive, one-operator path
with keep/discard is `robotrl.datasets.collect`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
    """Step `env` with `act` until `episodes` more episodes are committed to `store` (of envs that end on the
    same step, the first ones in env order); returns their indices. Episodes still running then, or ending past
    the count, are discarded, so every stored episode is whole."""
    recorder = VectorRecorder(store, env.num_envs, source=source, limit=episodes, **meta)
    obs, _ = env.reset(seed=seed)
    # closed (and cleared) on an error too, so the error's line is not appended to the bar's
    with tqdm(total=episodes, desc=f"record {store.spec.task}", unit="ep", disable=not progress, leave=False) as bar:
        while len(recorder.finalized) < episodes:
            action = np.asarray(act(obs), dtype=np.float32)
            next_obs, reward, terminated, truncated, info = env.step(action)
            for i in recorder.add(obs, action, reward, terminated, truncated, info):
                if on_episode_end is not None:
                    on_episode_end(i)
            bar.update(len(recorder.finalized) - bar.n)
            obs = next_obs
    recorder.discard()
    return recorder.finalized


class Demonstrator(Protocol):
    """What `--demonstrator module:callable` returns: a batched policy over the vector env's observations, with
    optional per-episode state (`reset(num_envs)` before the first step, `reset_env(i)` when env i starts anew)."""

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray: ...


def load_demonstrator(path: str) -> Demonstrator:
    """`module:callable[?key=value&...]` called with its keyword arguments; the result has `act(obs)`."""
    from robotrl.envs.outside import parse, resolve

    ref = parse(path)
    made = resolve(ref.target, "demonstrator")(**ref.kwargs)
    if not callable(getattr(made, "act", None)):
        raise ValueError(
            f"demonstrator: expected {ref.target} to return an object with act(obs), got {type(made).__name__}"
        )
    return made


def record_expert(
    out: str | Path,
    task: str,
    episodes: int,
    num_envs: int = 8,
    noise: float | None = None,
    seed: int = 0,
    progress: bool = True,
    demonstrator: str | None = None,
    **task_options: Any,
) -> EpisodeStore:
    """Demonstrations of `task`'s scripted expert (at the task's `demo_noise` unless `noise` is given), or of a
    `demonstrator` (`module:callable`, the way an outside env gets one), appended to the store at `out` (created
    if absent). Returns the store, open for appending."""
    from robotrl.envs import is_task, make

    if demonstrator is None and not is_task(task):
        raise ValueError(f"demonstrator: {task} has no scripted expert; give one as --demonstrator module:callable")
    if demonstrator is not None and noise is not None:
        raise ValueError(f"noise: applies to a task's scripted expert, not to the demonstrator {demonstrator}")
    env = make(task, num_envs=num_envs, seed=seed, **task_options)
    meta: dict[str, Any]
    if demonstrator is not None:
        expert: Any = load_demonstrator(demonstrator)
        meta = {"demonstrator": demonstrator}
    else:
        noise = env.task.demo_noise if noise is None else noise
        expert = env.task.expert(noise=noise, seed=seed)
        meta = {"noise": noise}
    getattr(expert, "reset", lambda n: None)(num_envs)
    store = EpisodeStore.create(out, env.task_spec, exist_ok=True)
    record_policy(
        env,
        expert.act,
        store,
        episodes,
        source="scripted",
        on_episode_end=getattr(expert, "reset_env", None),
        seed=seed,
        progress=progress,
        **meta,
    )
    env.close()
    return store


@dataclass
class DataRecord:
    """Record demonstrations of a task's scripted expert (a noisy stand-in for a teleoperator) into a store."""

    task: str = DEFAULT_TASK
    """task name, or an outside env (gym:<id>, <module>:<callable>) recorded with a --demonstrator"""
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
    demonstrator: str | None = None
    """module:callable[?key=value&...] returning an object with act(obs) -> actions over the batch (and optional
    reset(num_envs), reset_env(i)): a scripted controller or a trained policy; default: the task's scripted expert"""

    def __post_init__(self) -> None:
        for field in ("episodes", "num_envs", "episode_steps", "image_size"):
            if (value := getattr(self, field)) is not None and value < 1:
                raise ValueError(f"DataRecord.{field}: expected >= 1, got {value}")
        if self.noise is not None and not self.noise >= 0:  # NaN too
            raise ValueError(f"DataRecord.noise: expected >= 0, got {self.noise}")


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
        demonstrator=config.demonstrator,
        **options,
    )
    print(json.dumps({k: v for k, v in store.summary().items() if k != "keys"}))
    return store
