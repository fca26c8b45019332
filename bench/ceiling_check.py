"""The ceiling's replay checked against the steps the backend really ran, JSON lines (issue 45's estimator).

bench/envs.py times the backend against one `mujoco.rollout` of the same chunk of steps (robotrl/envs/benchmark.py,
`bench_paired`): N rolls, one per env, each the whole chunk from the chunk's start state. Two things differ from what
the backend ran: an env the backend auto-resets within the chunk runs on in the rollout past its episode's end (a
fallen quadruped keeps falling), and N long rolls on a pool balance their threads only at the chunk's end, where the
backend balances at every control step. Here one chunk is recorded step by step (every env's state, solver warm start,
controls, and the steps after which it reset) and replayed three ways, each by one `mujoco.rollout.Rollout` per call,
milliseconds for the chunk, the best of `--repeats` with the three taken in turn:
  continued_ms  the bench's ceiling: N rolls over the whole chunk from its start state
  exact_ms      the backend's own steps: each env's chunk cut at its resets and every `--piece` control steps, each
                piece from its recorded state and warm start; the pieces of one length in one call (a handful)
  steps_ms      every control step of every env a roll of its own, from its recorded state, in one call
exact_ratio = exact_ms / continued_ms (above 1: the ceiling's replay is cheaper physics than the backend's, and the
fraction reads low); steps_ratio = steps_ms / continued_ms (below 1 with threads: the same work balanced finer).

    .venv/bin/python bench/ceiling_check.py --tasks PushT Quadruped --num-envs 8 32
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import tyro
from physics_call import Cases, best_of, each_case, record


@dataclass
class CeilingCheckConfig(Cases):
    steps: int = 400
    """control steps in the chunk"""
    piece: int = 16
    """the longest piece of the exact replay, in control steps (a power of two)"""
    repeats: int = 5
    seed: int = 0


class Chunk(NamedTuple):
    """One chunk of the backend's steps, step by step."""

    states: np.ndarray  # (steps, n, nstate) FULLPHYSICS state before each step
    warmstarts: np.ndarray  # (steps, n, nv) the solver's warm start before each step
    controls: np.ndarray  # (steps, n, nu)
    reset: np.ndarray  # (steps, n) bool: the env's episode ended at this step (the next starts afresh)
    substeps: int


def recorded_chunk(task: str, n: int, steps: int, seed: int) -> tuple[Any, Chunk]:
    """The task's model and `steps` random-action steps of the CPU backend, recorded after eight warm-up steps."""
    from robotrl.envs import make
    from robotrl.envs.benchmark import random_actions, recorded_controls

    env = make(task, num_envs=n, seed=seed, render_images=False)
    env.reset(seed=seed)
    actions = random_actions(env.action_space, steps + 8, seed)
    recorded_controls(env, actions[:8])
    states, warmstarts, controls, reset = [], [], [], []
    state = env.get_state()
    for a in actions[8:]:
        states.append(state["physics"])
        warmstarts.append(state["warmstart"])
        controls.append(recorded_controls(env, a[None])[0])
        state = env.get_state()  # the next step's start: its step counter is 0 where this step ended an episode
        reset.append(state["steps"] == 0)
    model, nsub = env.task.model, env.task.n_substeps
    env.close()
    return model, Chunk(*(np.stack(x) for x in (states, warmstarts, controls, reset)), substeps=nsub)


def pieces(reset: np.ndarray, longest: int) -> dict[int, list[tuple[int, int]]]:
    """(env, first step) of every piece, by length: each env's steps cut after its resets and every `longest` steps,
    the rest of a cut split into powers of two."""
    steps, n = reset.shape
    out: dict[int, list[tuple[int, int]]] = {}
    for env in range(n):
        cuts = sorted({0, steps, *range(0, steps, longest), *(int(s) + 1 for s in np.nonzero(reset[:, env])[0])})
        for first, end in itertools.pairwise(cuts):
            while first < end:
                length = 1 << ((end - first).bit_length() - 1)
                out.setdefault(length, []).append((env, first))
                first += length
    return out


class Call(NamedTuple):
    """One rollout call of a replay: the rolls' start states, warm starts and held controls, and its outputs."""

    states: np.ndarray  # (rolls, nstate)
    warmstarts: np.ndarray  # (rolls, nv)
    controls: np.ndarray  # (rolls, substeps of the roll, nu)
    outputs: dict[str, np.ndarray]  # "state" (rolls, substeps, nstate), "sensordata" (rolls, substeps, nsensordata)


def replay_calls(model: Any, chunk: Chunk, groups: dict[int, list[tuple[int, int]]]) -> list[Call]:
    """One call per piece length of `groups` (`pieces`), inputs and outputs made and paged in (as the backend's are
    before it steps), so that a timed replay times the rollouts alone."""
    calls = []
    for length, where in groups.items():
        env, first = np.array(where).T
        held = np.stack([chunk.controls[first + j, env] for j in range(length)], 1).repeat(chunk.substeps, axis=1)
        outputs = {
            "state": np.ones((len(env), held.shape[1], chunk.states.shape[-1])),
            "sensordata": np.ones((len(env), held.shape[1], model.nsensordata)),
        }
        calls.append(Call(chunk.states[first, env], chunk.warmstarts[first, env], held, outputs))
    return calls


def replay(pool: Any, datas: list[Any], model: Any, calls: list[Call]) -> float:
    """Seconds to run `calls` on a `mujoco.rollout.Rollout` pool, one MjData per thread in `datas`."""
    import mujoco

    start = time.perf_counter()
    for call in calls:
        pool.rollout(
            [model] * len(call.states),
            datas,
            call.states,
            call.controls,
            skip_checks=True,
            nstep=call.controls.shape[1],
            control_spec=int(mujoco.mjtState.mjSTATE_CTRL),
            initial_warmstart=call.warmstarts,
            **call.outputs,
        )
    return time.perf_counter() - start


def measure(task: str, n: int, threads: int, config: CeilingCheckConfig) -> dict[str, Any]:
    import mujoco
    import mujoco.rollout

    model, chunk = recorded_chunk(task, n, config.steps, config.seed)
    pool = mujoco.rollout.Rollout(nthread=threads if threads > 1 else 0)
    datas = [mujoco.MjData(model) for _ in range(threads)]
    groups = {
        "continued": {len(chunk.reset): [(env, 0) for env in range(n)]},
        "exact": pieces(chunk.reset, config.piece),
        "steps": pieces(chunk.reset, 1),
    }
    calls = {name: replay_calls(model, chunk, group) for name, group in groups.items()}
    try:
        best = best_of(
            {name: functools.partial(replay, pool, datas, model, c) for name, c in calls.items()}, config.repeats
        )
    finally:
        pool.close()
    return record(
        "ceiling_check",
        task,
        n,
        threads=threads,
        steps=config.steps,
        resets=int(chunk.reset.sum()),
        **{f"{name}_ms": round(1e3 * seconds, 2) for name, seconds in best.items()},
        exact_ratio=round(best["exact"] / best["continued"], 3),
        steps_ratio=round(best["steps"] / best["continued"], 3),
    )


def main(config: CeilingCheckConfig) -> None:
    if config.piece < 1 or config.piece & (config.piece - 1):
        raise SystemExit(f"--piece: expected a power of two, got {config.piece}")
    each_case(config, measure)


if __name__ == "__main__":
    main(tyro.cli(CeilingCheckConfig))
