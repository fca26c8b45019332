"""The CPU backend's per-step code (robotrl/envs/step.py: the task's functions with the step's bookkeeping), numpy
against the same functions compiled by JAX's jit and by the backend's own compiler (robotrl/envs/compiled.py: the
jaxpr lowered to loops for numba), JSON lines: what a compiler of the code as written once gives the CPU backend
(issue 45), part by part.

For each task and number of envs, from a state the CPU backend reached after a few random steps, microseconds per
call (median of `--rounds` rounds):
  before_np / before_jit        `before_physics` (action checks, clipping, `task.control`: the arm tasks' IK): numpy,
                                and jitted with numpy in and out
  after_np / after_jit          `after_physics` (`task.observe_and_reward`, `task.terminated`, blow-ups, time limit)
  dispatch_jit                  a jitted function of the same inputs that only slices one: JAX's own cost a call
  before_ratio, after_ratio     jit / numpy (< 1: the compiled code is faster)
  before_numba, after_numba     the backend's compiled kernels (`CompiledStep.before`, `.after`), numpy in and out
  numba_ratio                   (before_numba + after_numba) / (before_np + after_np)
  numba_build_s                 seconds to trace, lower and compile both kernels into an empty cache (first num_envs
                                only: a kernel serves every number of envs; later ones load it)
The jitted functions run in float64 (results equal to numpy's to float rounding, checked), with synchronous CPU
dispatch; `--xla-old-runtime` also sets XLA's pre-thunk CPU runtime (`--xla_cpu_use_thunk_runtime=false`).

    .venv/bin/python bench/task_jit.py --tasks PushT Reach Quadruped --num-envs 8 32
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tyro


@dataclass
class TaskJitConfig:
    tasks: tuple[str, ...] = ("PushT", "Reach", "Quadruped")
    num_envs: tuple[int, ...] = (8, 32)
    calls: int = 2000
    """timed calls per round"""
    rounds: int = 3
    xla_old_runtime: bool = False
    seed: int = 0


def per_call_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Median over `rounds` of the mean microseconds a call of `fn` takes (after a warm-up)."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append(1e6 * (time.perf_counter() - start) / calls)
    return float(np.median(times))


def measure(task_name: str, n: int, config: TaskJitConfig) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from robotrl.envs import make
    from robotrl.envs.compiled import CompiledStep, StepArrays, differences
    from robotrl.envs.step import NumpyStep, after_rows, before_rows

    env = make(task_name, num_envs=n, seed=config.seed, render_images=False, compile_task=False)
    env.reset(seed=config.seed)
    rng = np.random.default_rng(config.seed)
    space = env.action_space
    for _ in range(10):
        env.step(rng.uniform(space.low, space.high).astype(space.dtype))
    task, frame = env.task, env.frame()
    arrays = tuple(np.ascontiguousarray(x) for x in frame)
    action = rng.uniform(space.low, space.high).astype(np.float64)
    rows, warning = env._live().state.copy(), env._live().warning.copy()
    steps = env.get_state()["steps"]
    env.close()
    numpy = NumpyStep(task, "dense")
    blowups = numpy.before(frame, action, warning).blowups

    before_jit = jax.jit(lambda *args: before_rows(jnp, task, numpy.bounds, *args))
    after_jit = jax.jit(lambda *args: after_rows(jnp, task, "dense", *args))
    dispatch_jit = jax.jit(lambda q, v, s, g, a: q[:, :1])
    to_numpy = lambda tree: jax.tree.map(np.asarray, tree)  # noqa: E731  # what the backend would hand on
    before_args, after_args = (*arrays, action, warning), (*arrays, action, rows, warning, blowups, steps)
    expected = (numpy.before(frame, action, warning), numpy.after(frame, action, rows, warning, blowups, steps))
    for want_tree, jitted, args in zip(expected, (before_jit, after_jit), (before_args, after_args), strict=True):
        for got, want in zip(jax.tree.leaves(to_numpy(jitted(*args))), jax.tree.leaves(want_tree), strict=True):
            np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), atol=1e-5)

    with tempfile.TemporaryDirectory() as cache:  # an empty kernel cache: the first build compiles
        os.environ["ROBOTRL_CACHE_DIR"] = cache
        start = time.perf_counter()
        kernels = CompiledStep(task, "dense", StepArrays(frame, action, rows, warning))
        build_s = time.perf_counter() - start
    assert differences(kernels, numpy, StepArrays(frame, action, rows, warning)) == []

    c, r = config.calls, config.rounds
    out = {
        "before_np": per_call_us(lambda: numpy.before(frame, action, warning), c, r),
        "before_jit": per_call_us(lambda: to_numpy(before_jit(*before_args)), c, r),
        "after_np": per_call_us(lambda: numpy.after(frame, action, rows, warning, blowups, steps), c, r),
        "after_jit": per_call_us(lambda: to_numpy(after_jit(*after_args)), c, r),
        "dispatch_jit": per_call_us(lambda: np.asarray(dispatch_jit(*arrays, action)), c, r),
        "before_numba": per_call_us(lambda: kernels.before(frame, action, warning), c, r),
        "after_numba": per_call_us(lambda: kernels.after(frame, action, rows, warning, blowups, steps), c, r),
    }
    return {
        "bench": "task_jit",
        "task": task_name,
        "num_envs": n,
        **{k: round(v, 1) for k, v in out.items()},
        "before_ratio": round(out["before_jit"] / out["before_np"], 2),
        "after_ratio": round(out["after_jit"] / out["after_np"], 2),
        "numba_ratio": round((out["before_numba"] + out["after_numba"]) / (out["before_np"] + out["after_np"]), 3),
        "numba_build_s": round(build_s, 1),
        "jax": jax.__version__,
        "xla_old_runtime": config.xla_old_runtime,
    }


def main(config: TaskJitConfig) -> None:
    if config.xla_old_runtime:  # read by XLA when JAX starts its CPU client: set before the first import
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_thunk_runtime=false").strip()
    import jax

    jax.config.update("jax_enable_x64", True)  # the CPU backend's float64, for equal results
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # a call returns its result: no future to wait on
    for task in config.tasks:
        for n in config.num_envs:
            print(json.dumps(measure(task, n, config)), flush=True)


if __name__ == "__main__":
    main(tyro.cli(TaskJitConfig))
