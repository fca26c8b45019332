"""CPU and MJX backends agree: from the same state, with the same actions, every task's trajectories match.

The CPU env's exact state (`get_state`: FULLPHYSICS, sensordata, goal, steps) is copied into the MJX env,
then both take the same STEPS control steps (the task's scripted expert where it has one, seeded uniform
actions otherwise). JAX runs in float64 here (`jax.enable_x64`), so what is left is the difference between
MJX's and MuJoCo C's algorithms (solver iterations, warm start, collision routines), not float32 rounding.
"""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from robotrl.envs import list_tasks, make_task
from robotrl.envs.cpu import CpuVectorEnv
from robotrl.envs.tasks import TASKS

NUM_ENVS = 3
STEPS = 20
#: max abs error over all steps and envs, per task: (qpos, qvel, float observations, reward)
TOLERANCE = {
    # measured 4e-15, 2e-14, 0 (float32 obs), 3e-15 (jax 0.10 here); 1.6e-8 qpos with jax 0.11: no contacts
    "Reach": (1e-6, 1e-5, 1e-5, 1e-6),
    "PushT": (1e-4, 1e-3, 1e-3, 1e-5),  # measured 3.8e-6, 2.5e-5, 2.5e-5, 5.9e-7
    "PickPlace": (5e-3, 0.5, 1e-2, 2e-3),  # measured 1.1e-3, 7.0e-2, 1.5e-3, 1.8e-4: box-finger contacts
    # measured 9.1e-3, 0.27, 0.27 (joint velocities in the obs), 2.7e-2: four feet making and breaking
    # contact amplify the small solver differences (MJX and C run the same Newton solver, not bit for bit)
    "Quadruped": (2e-2, 1.0, 1.0, 5e-2),
}
DEFAULT_TOLERANCE = (1e-3, 1e-2, 1e-2, 1e-3)


def _landed(name: str) -> bool:
    try:
        importlib.import_module(TASKS[name].split(":")[0])
    except ModuleNotFoundError:
        return False
    return True


def trajectories(name: str, steps: int = STEPS) -> dict[str, float]:
    """Max abs CPU-vs-MJX errors of qpos, qvel, float observations and reward over `steps` control steps."""
    from robotrl.envs.mjx import MjxVectorEnv

    task = make_task(name)
    cpu = CpuVectorEnv(task, NUM_ENVS, seed=0, autoreset=False, render_images=False)
    obs, _ = cpu.reset(seed=0)
    try:
        expert = task.expert(seed=0)
        expert.reset(NUM_ENVS)
    except (NotImplementedError, ValueError):
        expert = None
    rng = np.random.default_rng(0)
    err = {"qpos": 0.0, "qvel": 0.0, "obs": 0.0, "reward": 0.0}
    with jax.enable_x64(True):
        mjx_env = MjxVectorEnv(task, NUM_ENVS, seed=0, autoreset=False)
        mjx_env.set_state(cpu.get_state())
        nq, nv = task.model.nq, task.model.nv
        for _ in range(steps):
            shape = (NUM_ENVS, *cpu.task_spec.action.shape)
            action = expert.act(obs) if expert is not None else rng.uniform(-1, 1, shape).astype(np.float32)
            obs, r_cpu, *_ = cpu.step(action)
            obs_mjx, r_mjx, *_ = mjx_env.step(action)
            s_cpu, s_mjx = cpu.get_state()["physics"], mjx_env.get_state()["physics"]
            err["qpos"] = max(err["qpos"], float(np.abs(s_cpu[:, 1:1 + nq] - s_mjx[:, 1:1 + nq]).max()))
            err["qvel"] = max(err["qvel"], float(np.abs(s_cpu[:, 1 + nq:1 + nq + nv] - s_mjx[:, 1 + nq:1 + nq + nv]).max()))
            for key, value in obs_mjx.items():
                if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    err["obs"] = max(err["obs"], float(np.abs(obs[key] - value).max()))
            err["reward"] = max(err["reward"], float(np.abs(np.asarray(r_cpu) - np.asarray(r_mjx)).max()))
    cpu.close()
    return err


@pytest.mark.parametrize("name", list_tasks())
def test_cpu_and_mjx_trajectories_agree(name: str) -> None:
    if not _landed(name):
        pytest.skip(f"task {name} has not landed yet")
    err = trajectories(name)
    tol = dict(zip(("qpos", "qvel", "obs", "reward"), TOLERANCE.get(name, DEFAULT_TOLERANCE)))
    for key, value in err.items():
        assert value < tol[key], f"{name}: max |CPU - MJX| of {key} over {STEPS} steps is {value:.3g} (tolerance {tol[key]:.0e})"


if __name__ == "__main__":  # prints the measured errors, to set the tolerances above
    import sys

    for task_name in sys.argv[1:] or list_tasks():
        if _landed(task_name):
            print(task_name, trajectories(task_name), flush=True)
