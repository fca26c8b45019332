"""CPU and MJX backends agree: from the same state, with the same actions, every task's trajectories match.

The CPU env's exact state (`get_state`: FULLPHYSICS, sensordata, goal, steps) is copied into the MJX env,
then both take the same STEPS control steps (the task's scripted expert where it has one, seeded uniform
actions otherwise). JAX runs in float64 here (`jax.enable_x64`), so what is left is the difference between
MJX's and MuJoCo C's algorithms (solver iterations, warm start, collision routines), not float32 rounding.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from robotrl.envs import list_tasks, make_task
from robotrl.envs.cpu import CpuVectorEnv
from robotrl.envs.tasks import push_t

NUM_ENVS = 3
STEPS = 20
#: per-step bound on max |CPU - MJX| after t + 1 control steps: ROUNDOFF (t + 1) + CONTACT[task] (t + 1) / STEPS,
#: for (qpos, qvel, float observations, reward). Float64 rounding accumulates step by step; where contacts make and
#: break, one solver can resolve a contact a step before the other, and the jump that leaves is what CONTACT bounds:
#: it grows with the steps in which such an event can have happened. Measured per step (bench/RESULTS.md, "CPU ↔
#: MJX parity"): Reach and PushT agree to ~1e-14 over all 20 steps; PickPlace's finger-cube contact at step 10 jumps
#: qpos to 1.1e-3 and qvel to 7.0e-2; Quadruped's feet at step 12 jump qpos to 9.1e-3 (step 14) and the joint
#: velocities to 0.27 (in the observation too), reward to 2.7e-2. CONTACT is twice the largest measured
#: error x STEPS / (t + 1) over the steps; ROUNDOFF leaves room for JAX versions that round differently.
ROUNDOFF = 2e-9
CONTACT = {
    "Reach": (0.0, 0.0, 0.0, 0.0),  # no contacts in the model
    "PushT": (2e-5, 2e-4, 2e-4, 2e-6),  # the pusher's contacts with the block, none in these 20 expert steps
    "PickPlace": (4.5e-3, 0.3, 6e-3, 6e-4),
    "Quadruped": (2.6e-2, 0.9, 0.9, 7.5e-2),
}
#: the arm tasks with example-robot-data's UR5 (robotrl/envs/robots): its links are visual only, so MJX runs its
#: meshes without colliding them. Reach and PushT agree to ~1e-13 over the 20 steps; PickPlace's grasp at step 12
#: jumps qpos to 5.7e-4, the observation to 2.4e-3, qvel to 5.5e-2 (with the undamped servos before: 1.5e-2, 1.5e-2
#: and 1.1; bench/RESULTS.md, "Robots from description files"): box-box contacts that MJX and MuJoCo resolve apart,
#: bounded as above (the bounds set from the larger errors).
UR5 = "robot=example-robot-data:ur5&robot_base=[0.2,0,0]"
CONTACT |= {
    f"Reach?{UR5}": CONTACT["Reach"],
    f"PushT?{UR5}": CONTACT["PushT"],
    f"PickPlace?{UR5}": (5e-2, 3.0, 5e-2, 7e-3),
}
CASES = [
    *list_tasks(),
    pytest.param(f"Reach?{UR5}", id="Reach-ur5"),
    pytest.param(f"PushT?{UR5}", id="PushT-ur5", marks=pytest.mark.slow),
    pytest.param(f"PickPlace?{UR5}", id="PickPlace-ur5", marks=pytest.mark.slow),
]
#: PushT from a pose with the pusher pressed onto the block (`push_t_in_contact`), zero actions: the backends agree
#: to ~1e-13 over the 20 steps in contact (`python tests/envs/test_parity.py PushT:contact`), so rounding bounds it
PUSH_CONTACT = "PushT:contact"
CONTACT[PUSH_CONTACT] = (0.0, 0.0, 0.0, 0.0)
DEFAULT_CONTACT = (1e-2, 0.5, 0.5, 1e-2)
QUANTITIES = ("qpos", "qvel", "obs", "reward")


def bound(name: str, key: str, t: np.ndarray) -> np.ndarray:
    """The bound on the error after control step t (0-based) of case `name` (a task, or PUSH_CONTACT)."""
    contact = dict(zip(QUANTITIES, CONTACT.get(name, DEFAULT_CONTACT)))[key]
    return ROUNDOFF * (t + 1) + contact * (t + 1) / STEPS


def trajectories(
    name: str, steps: int = STEPS, pose: np.ndarray | None = None
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per control step, the max abs CPU-vs-MJX errors (over envs and elements) of qpos, qvel, float observations and
    reward: arrays of `steps`; and the MJX envs' qpos after each step (steps, envs, nq). With `pose`, every env
    starts at rest in that qpos and both backends take zero actions (the tool holds where it is)."""
    from robotrl.envs.mjx import MjxVectorEnv

    task = make_task(name)
    nq, nv = task.model.nq, task.model.nv
    cpu = CpuVectorEnv(task, NUM_ENVS, seed=0, autoreset=False, render_images=False)
    obs, _ = cpu.reset(seed=0)
    expert: Any = None
    if pose is not None:
        state = cpu.get_state()
        state["physics"][:, 1 : 1 + nq], state["physics"][:, 1 + nq : 1 + nq + nv] = pose, 0.0
        cpu.set_state(state)
    else:
        try:
            expert = task.expert(seed=0)
            expert.reset(NUM_ENVS)
        except (NotImplementedError, ValueError):
            pass
    rng = np.random.default_rng(0)
    err = {key: np.zeros(steps) for key in ("qpos", "qvel", "obs", "reward")}
    qpos = np.zeros((steps, NUM_ENVS, nq))
    with jax.enable_x64(True):
        mjx_env = MjxVectorEnv(task, NUM_ENVS, seed=0, autoreset=False)
        mjx_env.set_state(cpu.get_state())
        shape = (NUM_ENVS, *cpu.task_spec.action.shape)
        for t in range(steps):
            if pose is not None:
                action = np.zeros(shape, np.float32)
            else:
                action = expert.act(obs) if expert is not None else rng.uniform(-1, 1, shape).astype(np.float32)
            obs, r_cpu, *_ = cpu.step(action)
            obs_mjx, r_mjx, *_ = mjx_env.step(action)
            s_cpu, s_mjx = cpu.get_state()["physics"], mjx_env.get_state()["physics"]
            qpos[t] = s_mjx[:, 1 : 1 + nq]
            err["qpos"][t] = np.abs(s_cpu[:, 1 : 1 + nq] - s_mjx[:, 1 : 1 + nq]).max()
            err["qvel"][t] = np.abs(s_cpu[:, 1 + nq : 1 + nq + nv] - s_mjx[:, 1 + nq : 1 + nq + nv]).max()
            err["obs"][t] = max(
                (
                    float(np.abs(obs[key] - value).max())
                    for key, value in obs_mjx.items()
                    if isinstance(value, np.ndarray) and value.dtype.kind == "f"
                ),
                default=0.0,
            )
            err["reward"][t] = np.abs(np.asarray(r_cpu) - np.asarray(r_mjx)).max()
    cpu.close()
    return err, qpos


def check_bounds(name: str, err: dict[str, np.ndarray]) -> None:
    t = np.arange(STEPS)
    for key, values in err.items():
        limit = bound(name, key, t)
        over = np.flatnonzero(values > limit)
        assert not len(over), (
            f"{name}: |CPU - MJX| of {key} at step {over[0] + 1} is {values[over[0]]:.3g}, over its "
            f"bound {limit[over[0]]:.3g}; per step: {np.array2string(values, precision=2)}"
        )


@pytest.mark.parametrize("name", CASES)
def test_cpu_and_mjx_trajectories_agree(name: str) -> None:
    check_bounds(name, trajectories(name)[0])


def push_t_in_contact() -> np.ndarray:
    """PushT's arm at its start with the block's stem end pressed 2 mm onto the pusher's tip."""
    bottom = push_t.BOXES[1, 1] - push_t.BOXES[1, 3]
    tip = push_t.TIP_START
    return np.r_[push_t.START_QPOS, tip[0], tip[1] - bottom + push_t.TIP_RADIUS - 0.002, 0.0]


def test_pusher_contact_agrees_and_pushes_the_block() -> None:
    """PushT from a pose in contact (the expert's 20 steps above make none), on the programs compiled for the
    trajectory test above: the backends agree within PUSH_CONTACT, and the contact pushes the block off the tip
    along +y, centred in the first step (no sideways slide, hardly a turn), more than a centimetre in 20."""
    start = push_t_in_contact()
    err, qpos = trajectories("PushT", pose=start)
    check_bounds(PUSH_CONTACT, err)
    first, moved = qpos[0] - start, qpos[-1] - start
    assert np.all(first[:, 8] > 1e-3) and np.all(moved[:, 8] > 1e-2), (first[:, 8], moved[:, 8])
    assert np.all(np.abs(first[:, 7]) < 1e-3) and np.all(np.abs(first[:, 9]) < 2e-2), first[:, 7:]


if __name__ == "__main__":  # prints the measured errors, to set the tolerances above
    import sys

    for task_name in sys.argv[1:] or list_tasks():
        contact = task_name == PUSH_CONTACT
        errors = trajectories("PushT" if contact else task_name, pose=push_t_in_contact() if contact else None)[0]
        print(task_name, {k: [float(f"{x:.2g}") for x in v] for k, v in errors.items()}, flush=True)
