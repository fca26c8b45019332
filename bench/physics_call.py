"""The CPU backend's physics call against the ceiling's, physics only, JSON lines: what one `Batch.step` per control
step costs over one `Batch.rollout` of all the steps (issue 45: the part of the gap to the ceiling that no step code
can close).

For each task, number of envs and thread count, the controls of `--steps` random-action steps (recorded from the
backend, auto-resets included) replayed open-loop from the same start state by the same `mujoco.batch.Batch`, both
outputting the sensors as the backend binds them; microseconds per control step, the best of `--repeats`:
  rollout_us          one `Batch.rollout` over every substep, the controls given up front: no call between steps
  step_us_gap{G}      one `Batch.step(nstep=n_substeps)` per control step, its controls written between calls, the
                      calling thread busy for G us after each (as the backend's step code keeps it): the backend's
                      physics call, the gap itself left out
  ratio_gap{G}        step_us_gap{G} / rollout_us: what calling once per control step costs (with threads: a wake-up
                      and a lockstep of the envs per call; after a gap, caches and a pool gone to sleep)
The backend's step pays the ratio at its gap in full: the goal's 0.7 of the ceiling at 8 envs leaves the step's own
code 1 / 0.7 - ratio of the ceiling's time.

    .venv/bin/python bench/physics_call.py --tasks PushT Quadruped --num-envs 8 32
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import tyro

C = TypeVar("C", bound="Cases")


@dataclass
class Cases:
    """The cases a physics bench measures: every task, number of envs and thread count (those above this machine's
    cores left out)."""

    tasks: tuple[str, ...] = ("PushT", "Quadruped", "Reach", "PickPlace")
    num_envs: tuple[int, ...] = (8, 32)
    threads: tuple[int, ...] = (1, 2)


@dataclass
class PhysicsCallConfig(Cases):
    steps: int = 300
    """control steps replayed"""
    gaps_us: tuple[int, ...] = (0, 100)
    """microseconds the calling thread spends busy between two `Batch.step` calls (the backend runs the step's code
    there), left out of step_us"""
    repeats: int = 5
    seed: int = 0


def replayed(task: str, n: int, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(start qpos, start qvel, controls (steps, n, nu), substeps) of `steps` random-action steps of the CPU
    backend."""
    from robotrl.envs import make
    from robotrl.envs.benchmark import random_actions, recorded_controls

    env = make(task, num_envs=n, seed=seed, render_images=False)
    env.reset(seed=seed)
    qpos, qvel = env.frame().qpos.copy(), env.frame().qvel.copy()
    controls = recorded_controls(env, random_actions(env.action_space, steps, seed))
    nsub = env.task.n_substeps
    env.close()
    return qpos, qvel, controls, nsub


def measure(task: str, n: int, threads: int, config: PhysicsCallConfig) -> dict[str, Any]:
    from mujoco.batch import Batch

    from robotrl.envs import make

    qpos, qvel, controls, nsub = replayed(task, n, config.steps, config.seed)
    model = make(task, num_envs=1, seed=config.seed, render_images=False).task.model
    batch = Batch(model, n, nthread=threads)
    batch.bind("sensordata")  # as the backend: an output copied after every call
    ctrl = batch.bind("ctrl")
    batch.qpos[:], batch.qvel[:] = qpos, qvel
    start = batch.state.copy()
    held = np.ascontiguousarray(np.repeat(controls.transpose(1, 0, 2), nsub, axis=1))  # (n, steps * nsub, nu)

    def stepped(gap: float) -> float:
        batch.state[:] = start
        seconds = 0.0
        for u in controls:
            ctrl[:] = u
            begin = time.perf_counter()
            batch.step(nstep=nsub)
            seconds += time.perf_counter() - begin
            busy(gap)
        return seconds

    def rolled() -> float:
        batch.state[:] = start
        begin = time.perf_counter()
        batch.rollout(len(controls) * nsub, control=held, record=("sensordata",))
        return time.perf_counter() - begin

    runs: dict[str, Callable[[], float]] = {f"gap{g}": functools.partial(stepped, 1e-6 * g) for g in config.gaps_us}
    best = best_of({**runs, "rollout": rolled}, config.repeats)
    per_step = 1e6 / len(controls)
    return record(
        "physics_call",
        task,
        n,
        threads=threads,
        substeps=nsub,
        rollout_us=round(best["rollout"] * per_step, 1),
        **{f"step_us_{name}": round(best[name] * per_step, 1) for name in runs},
        **{f"ratio_{name}": round(best[name] / best["rollout"], 3) for name in runs},
    )


def best_of(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """The least seconds of each run over `repeats` rounds, the runs taken in turn within a round, so that a drift of
    the machine moves every one."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], run())
    return best


def busy(seconds: float) -> None:
    """Keep the calling thread busy (not asleep) for `seconds`, as the step's code keeps it between physics calls."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def record(bench: str, task: str, n: int, **fields: Any) -> dict[str, Any]:
    return {"bench": bench, "task": task, "num_envs": n, **fields}


def each_case(config: C, measure: Callable[[str, int, int, C], dict[str, Any]]) -> None:
    """Print `measure(task, n, threads, config)` as a JSON line for each of `config`'s cases."""
    for task in config.tasks:
        for n in config.num_envs:
            for threads in config.threads:
                if threads <= (os.cpu_count() or 1):
                    print(json.dumps(measure(task, n, threads, config)), flush=True)


def main(config: PhysicsCallConfig) -> None:
    each_case(config, measure)


if __name__ == "__main__":
    main(tyro.cli(PhysicsCallConfig))
