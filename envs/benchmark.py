"""`robotrl envs bench`: env throughput, the CPU backend against gymnasium's AsyncVectorEnv and against raw
`mujoco.rollout`. Part of the package (an installed wheel runs it); bench/envs.py calls it from a checkout.

Prints one JSON line per (task, num_envs):
  cpu_steps_per_s      `robotrl.envs.make(task, num_envs=N)` stepping random actions (env steps/s, all envs)
  async_steps_per_s    `gymnasium.vector.AsyncVectorEnv` over N single-env `RobotEnv`s (one process each)
  ceiling_steps_per_s  the same model, N, threads and physics substeps per env step in ONE `mujoco.rollout`
                       call per chunk of steps: the physics alone, no Python in the loop
  vs_async             cpu / async (goal >= 3)
  fraction_of_ceiling  the median over `--rounds` chunks of the ceiling's seconds over the backend's for the same
                       steps, timed in turn (goals: >= 0.85 at 32 envs, >= 0.7 at 8)
  fraction_range       the lowest and highest chunk's: how far the machine moved the measurement
  ms_per_step          where one control step of the CPU backend goes (`CpuVectorEnv.step_seconds`), ms per call,
                       with the step's code on the calling thread (`fuse_step=False`, the twin's steps): physics (the
                       batch's step call), task (the step's code on both sides of it: the task's control,
                       observation, reward and termination with the action checks, blow-ups and time limit,
                       robotrl/envs/step.py), rendering, and bookkeeping (the rest: actions in, observations out,
                       auto-resets)
  ms_per_step_fused    the same of the backend as timed: its step's code runs inside the physics call, on the pool
                       (robotrl/envs/fused.py), so "physics" holds both
  fraction_without_task  the fraction with the step's code taken out, in the proportions of `ms_per_step`
                       (fraction x step / (physics + bookkeeping)): what the backend would reach if that code cost
                       nothing, so a goal above it cannot be met by making that code faster

The step's code is the backend's default, compiled (robotrl/envs/compiled.py): ROBOTRL_COMPILE_TASK=0 measures it as
numpy instead.

With `--images`, one more line per (task with cameras, num_envs):
  frames_per_s         camera images/s the CPU backend draws while stepping with image observations
  ceiling_frames_per_s one `mujoco.Renderer` per core, each in its own process, drawing the same scenes (same
                       states, cameras, size, shadows off) with no stepping: per GL backend (EGL, OSMesa)
  fraction_of_ceiling  frames / the best backend's ceiling (goal >= 0.8)
  steps_per_s_images   env steps/s with images, beside `steps_per_s_no_images` (the same env without them)

    robotrl envs bench --tasks Reach --num-envs 2 8 32
    .venv/bin/python bench/envs.py --tasks all            # every task, from a checkout
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.spaces import Box

from robotrl.envs.tasks import DEFAULT_TASK


@dataclass
class BenchConfig:
    """Benchmark the CPU backend against AsyncVectorEnv and the raw mujoco.rollout ceiling (JSON lines)."""

    tasks: tuple[str, ...] = (DEFAULT_TASK,)
    """tasks to run ('all': every registered task)"""
    num_envs: tuple[int, ...] = (2, 8, 32)
    seconds: float = 1.0
    """timed seconds per measurement (after a short warm-up)"""
    rounds: int = 8
    """chunks the timed steps are cut into: the CPU backend and its ceiling timed in turn over each chunk's steps"""
    skip_async: bool = False
    """skip AsyncVectorEnv (it starts one process per env)"""
    images: bool = False
    """also measure image observations of the tasks with cameras: frames/s against one renderer per core"""
    render_workers: int | None = None
    """render worker processes of the image measurement (None: the backend's default; 0: this process only)"""
    profile: bool = False
    """cProfile the CPU backend's step at the largest num_envs and print the top functions"""
    seed: int = 0


def timed(step: Callable[[], Any], seconds: float, warmup: int = 3) -> tuple[int, float]:
    """Call `step` until `seconds` have passed; return (calls, elapsed)."""
    for _ in range(warmup):
        step()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step()
        calls += 1
    return calls, elapsed


def random_actions(space: Any, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(space.low, space.high, (count, *space.shape)).astype(space.dtype)


def timed_steps(env: Any, config: BenchConfig) -> tuple[int, float, dict[str, float]]:
    """Step a CPU-backend env with random actions for `config.seconds` after a short warm-up: (control steps,
    seconds, ms per control step by part of the step)."""
    env.reset(seed=config.seed)
    actions = random_actions(env.action_space, 64, config.seed)
    i = iter(range(1 << 62))
    for _ in range(3):
        env.step(actions[next(i) % 64])
    parts: dict[str, float] = {}
    env.step_seconds = parts
    calls, elapsed = timed(lambda: env.step(actions[next(i) % 64]), config.seconds, warmup=0)
    return calls, elapsed, {k: round(1e3 * v / calls, 4) for k, v in sorted(parts.items())}


def bench_async(task: str, n: int, config: BenchConfig) -> float:
    import gymnasium as gym

    from robotrl.envs.gym_env import RobotEnv

    # forkserver: the workers fork from a clean server, never from this (possibly JAX-threaded) process
    env = gym.vector.AsyncVectorEnv(
        [lambda: RobotEnv(task, render_images=False) for _ in range(n)], context="forkserver"
    )
    try:
        env.reset(seed=config.seed)
        actions = random_actions(env.action_space, 64, config.seed)
        i = iter(range(1 << 62))
        calls, elapsed = timed(lambda: env.step(actions[next(i) % 64]), config.seconds)
    finally:
        env.close()
    return n * calls / elapsed


def recorded_controls(env: Any, actions: np.ndarray) -> np.ndarray:
    """Step a CPU-backend env through `actions` (steps, n, *action); the controls (steps, n, nu) each step ran, as its
    step computes them (the actions clipped to their bounds, then the task's control)."""
    bounds = env.single_action_space
    assert isinstance(bounds, Box)  # a task's actions are a Box
    controls = []
    for a in actions:
        clipped = np.clip(a, bounds.low, bounds.high).astype(np.float64)
        controls.append(np.asarray(env.task.control(np, env.frame(), clipped)))
        env.step(a)
    return np.stack(controls)


@dataclass
class Paired:
    """The CPU backend against its ceiling, chunk by chunk (`bench_paired`)."""

    cpu_steps_per_s: float  # env steps/s over all chunks
    ceiling_steps_per_s: float
    fractions: list[float]  # each chunk's ceiling seconds over the backend's
    split: dict[str, float]  # ms per control step by part of the step, the twin's (its step's code unfused)
    stepped_split: dict[str, float]  # the same of the backend as timed (fused: its code inside the physics call)


def bench_paired(task: str, n: int, config: BenchConfig) -> Paired:
    """The CPU backend stepping random actions, and its ceiling, timed in alternating chunks of the same steps.

    A twin env (same seed and actions, so the same trajectory, auto-resets included) first records each chunk's start
    state and the controls of its steps. Then, `config.rounds` times: the backend steps one chunk, and one
    `mujoco.rollout` call replays that chunk's controls from its start state with the same substeps and per-substep
    outputs, on the calling thread and on a pool of all cores (the faster is the ceiling, whichever the backend
    picked). Each chunk's fraction compares the two over the same steps moments apart, so that a machine whose speed
    drifts moves both sides of it."""
    import mujoco
    import mujoco.rollout

    from robotrl.envs import make

    env = make(task, num_envs=n, seed=config.seed, render_images=False)
    # the twin runs the step's code on this thread around the physics call: the cost split, part by part
    twin = make(task, num_envs=n, seed=config.seed, render_images=False, fuse_step=False)
    actions = random_actions(env.action_space, 64, config.seed)
    warmup = 8
    for e in (env, twin):
        e.reset(seed=config.seed)
    start = time.perf_counter()
    for i in range(warmup):  # both, so that they stay on one trajectory; the backend's warm-up times a step
        env.step(actions[i % 64])
        twin.step(actions[i % 64])
    per_step = (time.perf_counter() - start) / warmup / 2
    rounds = max(config.rounds, 1)
    chunk = max(8, int(config.seconds / rounds / per_step))
    model, nsub = env.task.model, env.task.n_substeps
    starts, controls = [], []
    twin_parts: dict[str, float] = {}
    twin.step_seconds = twin_parts
    for r in range(rounds):
        starts.append(twin.get_state()["physics"])
        ctrl = recorded_controls(twin, actions[np.arange(warmup + r * chunk, warmup + (r + 1) * chunk) % 64])
        controls.append(np.repeat(ctrl.transpose(1, 0, 2), nsub, axis=1))  # (n, chunk * nsub, nu), held nsub substeps
    twin.close()
    nstep = chunk * nsub
    # outputs allocated and paged in before timing, as the backend's are
    out_state = np.ones((n, nstep, mujoco.mj_stateSize(model, int(mujoco.mjtState.mjSTATE_FULLPHYSICS))))
    out_sens = np.ones((n, nstep, model.nsensordata))
    pools = {t: mujoco.rollout.Rollout(nthread=t if t > 1 else 0) for t in sorted({1, min(os.cpu_count() or 1, n)})}
    datas = {t: [mujoco.MjData(model) for _ in range(t)] for t in pools}
    parts: dict[str, float] = {}
    env.step_seconds = parts
    cpu_seconds, ceiling_seconds, fractions = 0.0, 0.0, []
    try:
        for r in range(rounds):
            start = time.perf_counter()
            for i in range(warmup + r * chunk, warmup + (r + 1) * chunk):
                env.step(actions[i % 64])
            stepped = time.perf_counter() - start
            best = float("inf")
            for t, pool in pools.items():
                start = time.perf_counter()
                pool.rollout(
                    [model] * n,
                    datas[t],
                    starts[r],
                    controls[r],
                    skip_checks=True,
                    nstep=nstep,
                    control_spec=int(mujoco.mjtState.mjSTATE_CTRL),
                    state=out_state,
                    sensordata=out_sens,
                )
                best = min(best, time.perf_counter() - start)
            cpu_seconds, ceiling_seconds = cpu_seconds + stepped, ceiling_seconds + best
            fractions.append(best / stepped)
    finally:
        env.close()
        for pool in pools.values():
            pool.close()
    steps = rounds * chunk
    split = {k: round(1e3 * v / steps, 4) for k, v in sorted(twin_parts.items())}
    stepped_split = {k: round(1e3 * v / steps, 4) for k, v in sorted(parts.items())}
    return Paired(n * steps / cpu_seconds, n * steps / ceiling_seconds, fractions, split, stepped_split)


def bench_images(task: str, n: int, config: BenchConfig, steps_no_images: float) -> dict[str, Any] | None:
    """Frames/s of the CPU backend's image observations against one `mujoco.Renderer` per core (None: no cameras)."""
    import subprocess
    import sys
    import tempfile

    from robotrl.envs import make
    from robotrl.envs.render import gl_backend
    from robotrl.envs.render_pool import model_bytes, pack

    env = make(task, num_envs=n, seed=config.seed, render_workers=config.render_workers)
    cameras = env.task.cameras
    if not cameras:
        env.close()
        return None
    calls, elapsed, split = timed_steps(env, config)
    frames_per_s = n * len(cameras) / (1e-3 * split["render"])
    states, size, workers = env.get_state()["physics"], env.task.config.image_size, env.render_workers
    env.close()
    cores = os.cpu_count() or 1
    ceilings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scene = os.path.join(tmp, "scene.bin")
        with open(scene, "wb") as f:
            f.write(pack(model=model_bytes(env.task.model), states=states, cameras=np.array(cameras), size=size))
        for backend in ("egl", "osmesa"):
            start = time.time() + 5.0  # every process draws over the same window
            code = f"from robotrl.envs.benchmark import draw_loop; draw_loop({scene!r}, {start}, {config.seconds})"
            gl = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
            command = [sys.executable, "-c", code]
            procs = [
                subprocess.Popen(command, env=gl, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                for _ in range(cores)
            ]
            rates = [p.communicate()[0] for p in procs]
            if all(p.returncode == 0 for p in procs):
                ceilings[backend] = round(sum(float(r) for r in rates), 1)
    best = max(ceilings.values()) if ceilings else float("nan")
    return {
        "bench": "envs_images",
        "task": task,
        "num_envs": n,
        "gl": gl_backend(),
        "render_workers": workers,
        "frames_per_s": round(frames_per_s, 1),
        "ceiling_frames_per_s": ceilings,
        "fraction_of_ceiling": round(frames_per_s / best, 3),
        "steps_per_s_images": round(n * calls / elapsed, 1),
        "steps_per_s_no_images": round(steps_no_images, 1),
        "ms_per_step": split,
    }


def draw_loop(scene: str, start: float, seconds: float) -> None:
    """One `mujoco.Renderer` drawing a saved scene's states and cameras over [start, start + seconds]; prints its
    frames/s (a process of `bench_images`' ceiling)."""
    import mujoco

    from robotrl.envs.render import pose_for_drawing
    from robotrl.envs.render_pool import model_from_bytes, unpack

    with open(scene, "rb") as f:
        saved = unpack(f.read())
    model, states, size = model_from_bytes(saved["model"]), saved["states"], int(saved["size"])
    cameras = [str(c) for c in saved["cameras"]]
    renderer = mujoco.Renderer(model, size, size)
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False  # as the backend draws observations
    option = mujoco.MjvOption()
    option.sitegroup[:] = 0
    data = mujoco.MjData(model)

    def draw(i: int) -> None:
        pose_for_drawing(model, data, states[i % len(states)])
        for cam in cameras:
            renderer.update_scene(data, cam, scene_option=option)
            renderer.render()

    draw(0)
    time.sleep(max(0.0, start - time.time()))
    frames, begin = 0, time.perf_counter()
    while time.perf_counter() - begin < seconds:
        draw(frames)
        frames += 1
    print(len(cameras) * frames / (time.perf_counter() - begin))
    renderer.close()


def profile_cpu(task: str, n: int, config: BenchConfig, top: int = 15) -> str:
    from robotrl.envs import make

    env = make(task, num_envs=n, seed=config.seed, render_images=False)
    env.reset(seed=config.seed)
    actions = random_actions(env.action_space, 64, config.seed)
    profiler = cProfile.Profile()
    profiler.enable()
    timed(lambda: env.step(actions[0]), config.seconds)
    profiler.disable()
    env.close()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(config: BenchConfig) -> list[dict[str, Any]]:
    """Run the benchmark, print and return the JSON records."""
    from robotrl.envs import list_tasks

    tasks = list_tasks() if config.tasks == ("all",) else list(config.tasks)
    records = []
    for task in tasks:
        for n in config.num_envs:
            paired = bench_paired(task, n, config)
            cpu, ceiling, split = paired.cpu_steps_per_s, paired.ceiling_steps_per_s, paired.split
            fraction = float(np.median(paired.fractions))
            rec: dict[str, Any] = {
                "bench": "envs",
                "task": task,
                "num_envs": n,
                "cpu_steps_per_s": round(cpu, 1),
                "ceiling_steps_per_s": round(ceiling, 1),
                "fraction_of_ceiling": round(fraction, 3),
                "fraction_range": [round(min(paired.fractions), 3), round(max(paired.fractions), 3)],
                "fraction_without_task": round(
                    fraction * sum(split.values()) / (split["physics"] + split["bookkeeping"]), 3
                ),
                "ms_per_step": split,
                "ms_per_step_fused": paired.stepped_split,
            }
            if not config.skip_async:
                asynchronous = bench_async(task, n, config)
                rec.update(async_steps_per_s=round(asynchronous, 1), vs_async=round(cpu / asynchronous, 2))
            print(json.dumps(rec), flush=True)
            records.append(rec)
            images = bench_images(task, n, config, cpu) if config.images else None
            if images is not None:
                print(json.dumps(images), flush=True)
                records.append(images)
        if config.profile:
            print(profile_cpu(task, max(config.num_envs), config), flush=True)
    return records
