"""What a policy trained on a robotrl task needs on a robot: its actions turned into the arm's joint targets by
the task's own controller (the same `Task.control` the simulator applies, so a policy acts on the robot as it
acted in training), and the future-state roll that asynchronous inference aligns chunks with.

The task is rebuilt from the exported policy's spec (name, action mode, task options); the robot must have the
task's arm (same number of joints, in the task's order -- names may differ, e.g. fr3_joint1 for joint1). A policy
of an outside env acts natively: its action is the command, its robot file one command per action dimension.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robotrl.core.spec import Spec, SpecMismatchError
from robotrl.hardware.robot import RobotConfig


class TaskIO:
    def __init__(self, spec: Spec, robot: RobotConfig) -> None:
        from robotrl.envs import is_outside, make_task
        from robotrl.envs.task import Frame

        self.spec, self.robot, self._frame = spec, robot, Frame
        self.native = is_outside(spec.task)
        if self.native:  # an outside env: the robot's commands are its actions (hardware/sim_env.py)
            from robotrl.hardware.sim_env import check_native_robot

            check_native_robot(spec, robot)
            self.task: Any = None
            self.fields = {}
            return
        options: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in spec.metadata.get("task_options", {}).items()
        }
        self.task = make_task(spec.task, **{**options, "action_mode": spec.action_mode})
        model = self.task.model
        if model.nu != robot.dof:
            raise SpecMismatchError(
                f"robot {robot.name}: the {spec.task} policy drives {model.nu} actuators "
                f"{list(self.task.joint_names())}, the robot has {robot.dof} joints "
                f"{list(robot.joint_names)}"
            )
        self.nq, self.nv, self.nsens = model.nq, model.nv, model.nsensordata
        self.goal_dim = getattr(self.task, "goal_dim", 0)
        state = spec.observations.get("state")
        self.fields = state.field_slices() if state is not None else {}

    def joint_targets(self, q: np.ndarray, action: np.ndarray) -> np.ndarray:
        """The arm's joint targets for task `action` (A,) from measured joint positions `q` (dof,); an outside
        env's action itself (its robot's commands are its actions)."""
        if self.native:
            return np.asarray(action, dtype=np.float64).reshape(-1)
        qpos = np.zeros((1, self.nq))
        qpos[0, : self.robot.dof] = q
        frame = self._frame(qpos, np.zeros((1, self.nv)), np.zeros((1, self.nsens)), np.zeros((1, self.goal_dim)))
        return np.asarray(self.task.control(np, frame, np.asarray(action, dtype=np.float64)[None]))[0]

    def roll_forward(self, history: dict[str, np.ndarray], planned: np.ndarray) -> dict[str, np.ndarray]:
        """The observation history as it will be after the `planned` actions (d, A): the newest frame's tool or
        joint positions moved as the controller will move them (the arm follows its targets; objects are left
        where they are -- the policy's next chunk reacts to them when it is observed again)."""
        if "state" not in history or self.native:  # an outside env's state has no model to roll
            return history
        state = history["state"].copy()
        last = state[-1]
        mode = self.spec.action_mode
        if mode == "ee_delta" and "tool_pos" in self.fields:
            step = float(getattr(self.task.config, "max_ee_step", 0.0))
            sl = self.fields["tool_pos"]
            dims = min(planned.shape[1], 3)
            last[sl.start : sl.start + dims] += step * planned[:, :dims].sum(0)
        elif mode == "joint_pos" and "joint_pos" in self.fields and hasattr(self.task, "arm"):
            sl = self.fields["joint_pos"]
            last[sl] = self.task.arm.from_unit(np, planned[-1:].astype(np.float64))[0][: sl.stop - sl.start]
        state[-1] = last
        return {**history, "state": state}

    def describe(self) -> dict[str, Any]:
        return {"task": self.spec.task, "action_mode": self.spec.action_mode, "joints": list(self.robot.joint_names)}
