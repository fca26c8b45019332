"""The task adapter the deploy node executes chunks through: the future-state roll that asynchronous inference aligns
chunks with moves exactly the fields the action drives, by exactly what the task's controller is told to do."""

from __future__ import annotations

import mujoco
import numpy as np

from robotrl.envs import make_task
from robotrl.envs.tasks import arm
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.task_io import TaskIO


def history(task, frames: int = 2, seed: int = 0) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    dim = task.spec().observations["state"].shape[0]
    return {"state": np.random.default_rng(seed).uniform(-1, 1, (frames, dim)).astype(np.float32)}


def test_ee_delta_roll_moves_the_newest_tool_position_by_the_planned_steps() -> None:
    task = make_task("Reach")
    io = TaskIO(task.spec(), RobotConfig.load("sim_panda"))
    before = history(task)
    kept = {k: v.copy() for k, v in before.items()}
    planned = np.array([[1.0, 0.0, -0.5], [0.25, -1.0, 0.5], [0.5, 0.5, 0.0]])
    after = io.roll_forward(before, planned)["state"]
    tool = task.spec().observations["state"].field_slices()["tool_pos"]
    moved = kept["state"][-1].copy()
    moved[tool] += task.config.max_ee_step * planned.sum(0)
    np.testing.assert_array_equal(after[-1], moved.astype(np.float32))  # the tool, and nothing else of the frame
    np.testing.assert_array_equal(after[:-1], kept["state"][:-1])  # older frames as observed
    np.testing.assert_array_equal(before["state"], kept["state"])  # the caller's history untouched


def test_the_roll_is_where_the_controller_sends_the_tool() -> None:
    """One step of the roll against the task's own controller from the same joint positions: what the action adds to
    the joint targets the controller commands (over its targets for a zero action, which also turn the tool to point
    down) moves the tool as far as the roll says, up to the one-step IK's linearization (a fraction of the step)."""
    task = make_task("Reach")
    io = TaskIO(task.spec(), RobotConfig.load("sim_panda"))
    data = mujoco.MjData(task.model)

    def tool(q: np.ndarray) -> np.ndarray:
        data.qpos[:7] = q
        mujoco.mj_forward(task.model, data)
        return data.site("ee").xpos.copy()

    rng = np.random.default_rng(0)
    tool_slice = task.spec().observations["state"].field_slices()["tool_pos"]
    for _ in range(5):
        q = arm.HOME_QPOS + 0.1 * rng.standard_normal(7)
        action = rng.uniform(-1, 1, 3)
        state = np.zeros((1, task.spec().observations["state"].shape[0]), np.float32)
        state[0, tool_slice] = tool(q)
        rolled = io.roll_forward({"state": state}, action[None])["state"][0, tool_slice]
        moved = tool(io.joint_targets(q, action)) - tool(io.joint_targets(q, np.zeros(3)))
        error = np.linalg.norm(moved - (rolled - tool(q)))
        assert error < 0.2 * task.config.max_ee_step * np.linalg.norm(action), error


def test_joint_pos_roll_sets_the_joints_to_the_last_planned_targets() -> None:
    task = make_task("Reach", action_mode="joint_pos")
    io = TaskIO(task.spec(), RobotConfig.load("sim_panda"))
    before = history(task)
    planned = np.random.default_rng(1).uniform(-1, 1, (3, 7))
    after = io.roll_forward(before, planned)["state"]
    joints = task.spec().observations["state"].field_slices()["joint_pos"]
    expected = before["state"][-1].copy()
    expected[joints] = task.arm.from_unit(np, planned[-1:])[0]
    np.testing.assert_array_equal(after[-1], expected)
    np.testing.assert_array_equal(after[:-1], before["state"][:-1])
