"""Env-steps/s of the MJX backend against the threaded CPU backend, measured in the same run.

An env step is the full control step of `step_fn`: control, `n_substeps` physics steps, observation, reward,
termination and same-step auto-reset. The MJX number is a jitted `lax.scan` over `--steps` steps with random
actions drawn on the device, timed after a warm-up run (compile) with `block_until_ready`. The baseline is
`CpuVectorEnv.step` at `--cpu-envs` envs (all cores) with the same kind of actions.

    python bench/mjx.py --num-envs 8192 --tasks Reach Quadruped

Prints one JSON line per task (and one per task that is not available yet, with "status": "pending").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from robotrl.envs import make_task
from robotrl.envs.cpu import CpuVectorEnv
from robotrl.envs.mjx import MjxVectorEnv


def bench_mjx(task_name: str, num_envs: int, steps: int, repeats: int) -> dict[str, Any]:
    env = MjxVectorEnv(make_task(task_name), num_envs, seed=0)
    shape = (num_envs, *env.task_spec.action.shape)

    def rollout(state: Any, key: jax.Array) -> tuple[Any, jax.Array]:
        def body(carry: tuple[Any, jax.Array], _: None) -> tuple[tuple[Any, jax.Array], jax.Array]:
            s, k = carry
            k, sub = jax.random.split(k)
            s, _, _reward, terminated, truncated, _ = env.step_fn(
                s, jax.random.uniform(sub, shape, env.dtype, -1.0, 1.0)
            )
            return (s, k), (terminated | truncated).sum()

        (state, _), dones = jax.lax.scan(body, (state, key), None, length=steps)
        return state, dones.sum()

    run = jax.jit(rollout)
    t0 = time.perf_counter()
    state = jax.jit(env.init)(jax.random.PRNGKey(0))
    state, done = run(state, jax.random.PRNGKey(1))
    jax.block_until_ready((state, done))
    compile_s = time.perf_counter() - t0
    print(f"{task_name}: compiled + first run in {compile_s:.1f}s", file=sys.stderr, flush=True)
    times, episodes = [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        state, done = run(state, jax.random.PRNGKey(2 + r))
        jax.block_until_ready((state, done))
        times.append(time.perf_counter() - t0)
        episodes += int(done)
    best = min(times)
    return {
        "steps_per_s": num_envs * steps / best,
        "median_steps_per_s": num_envs * steps / float(np.median(times)),
        "physics_steps_per_s": num_envs * steps * env.task.n_substeps / best,
        "n_substeps": env.task.n_substeps,
        "compile_s": round(compile_s, 2),
        "episodes_ended": episodes,
    }


def bench_cpu(task_name: str, num_envs: int, steps: int) -> float:
    env = CpuVectorEnv(make_task(task_name), num_envs, seed=0, render_images=False)
    rng = np.random.default_rng(0)
    shape = (num_envs, *env.task_spec.action.shape)
    env.reset(seed=0)
    for _ in range(3):
        env.step(rng.uniform(-1, 1, shape).astype(np.float32))
    actions = rng.uniform(-1, 1, (steps, *shape)).astype(np.float32)
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    dt = time.perf_counter() - t0
    env.close()
    return num_envs * steps / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-envs", type=int, default=8192)
    p.add_argument("--tasks", nargs="+", default=["Quadruped", "Reach"])
    p.add_argument("--steps", type=int, default=100, help="control steps per timed scan")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpu-envs", type=int, default=64, help="baseline: CPU backend at this many envs")
    p.add_argument("--cpu-steps", type=int, default=50)
    args = p.parse_args()
    device = jax.devices()[0]
    for name in args.tasks:
        row: dict[str, Any] = {
            "bench": "env_steps_per_s",
            "task": name,
            "backend": "mjx",
            "num_envs": args.num_envs,
            "device": f"{device.platform}:{device.device_kind}",
            "dtype": str(jnp.zeros(0).dtype),
        }
        try:
            make_task(name)
        except (ImportError, AttributeError) as exc:  # a task module that has not landed yet
            print(json.dumps({**row, "status": "pending", "error": repr(exc)}), flush=True)
            continue
        row.update(bench_mjx(name, args.num_envs, args.steps, args.repeats))
        cpu = bench_cpu(name, args.cpu_envs, args.cpu_steps)
        row.update(
            {
                "baseline": "cpu_threads",
                "baseline_num_envs": args.cpu_envs,
                "baseline_threads": os.cpu_count(),
                "baseline_steps_per_s": cpu,
                "ratio": row["steps_per_s"] / cpu,
            }
        )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
