"""What a policy trained on a robotrl task needs on a robot: its actions turned into the arm's joint targets by
the task's own controller (the same `Task.control` the simulator applies, so a policy acts on the robot as it
acted in training), and the future-state roll that asynchronous inference aligns chunks with.

The task is rebuilt from the exported policy's spec (name, action mode, task options); the robot must have the
task's arm (same number of joints, in the task's order -- names may differ, e.g. fr3_joint1 for joint1). A policy
of an outside env acts natively: its action is the command, its robot file one command per action dimension.

A robot file that names the task's objects (`topics.objects`: a `geometry_msgs/PoseStamped` topic per object, as
a perception or motion-capture system publishes them) has no task-state topic either: the state observation is the
task's own `observe` of a state rebuilt from the joint states, the objects' poses (`hardware/objects.py`) and the
goal (a `PoseStamped` on `topics.goal`, or the instruction that names it), its sensors computed by MuJoCo.

A floating-base robot (a legged one, its robot file's `base`) has no task-state topic: its observation is the
task's own `observe` of a state rebuilt from its joint states, IMU, odometry and velocity command
(`hardware/floating_base.py`), as in training.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from robotrl.core.spec import Spec, SpecMismatchError
from robotrl.hardware.floating_base import BaseReading, BaseSensors, base_joint
from robotrl.hardware.objects import check_named, task_objects
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
        joints = [model.joint(name).id for name in self.task.joint_names()]
        self.qadr = np.array([model.jnt_qposadr[j] for j in joints], dtype=np.int64)
        self.dadr = np.array([model.jnt_dofadr[j] for j in joints], dtype=np.int64)
        floating = base_joint(model) is not None
        if floating != (robot.base is not None):
            raise SpecMismatchError(
                f"robot {robot.name}: the {spec.task} policy's robot {'has' if floating else 'has no'} floating base; "
                f"expected a robot file {'with' if floating else 'without'} a base section, got one "
                f"{'without' if floating else 'with'}"
            )
        self.base = BaseSensors(model, f"robot {robot.name}: {spec.task}") if floating else None
        if floating and not self.task.twist_goal and self.goal_dim:
            raise SpecMismatchError(
                f"robot {robot.name}: {spec.task}'s goal is not a velocity command; a floating-base robot takes its "
                "goal on cmd_vel only"
            )
        state = spec.observations.get("state")
        self.fields = state.field_slices() if state is not None else {}
        self.objects = task_objects(self.task)
        self.goal_source = "pose" if self.task.goal_is_pose else "instruction" if self.task.has_instructions else "none"
        self._scratch = mujoco.MjData(model)

    def check_objects(self) -> None:
        """That the robot file names a PoseStamped topic for each of the task's objects, and that the task's goal
        can be given without a state vector (a pose, an instruction, or none); a SpecMismatchError saying which."""
        try:
            check_named(self.objects, self.robot.topics.objects or {}, self.robot.name, self.spec.task)
        except ValueError as e:
            raise SpecMismatchError(str(e)) from None
        if self.goal_dim and self.goal_source == "none":
            raise SpecMismatchError(
                f"robot {self.robot.name}: topics.objects: {self.spec.task}'s goal is neither a pose nor named by an "
                "instruction, so its state cannot be rebuilt from poses; expected no topics.objects (the task-state "
                "vector topic)"
            )

    def goal_of(self, pose: tuple[np.ndarray, np.ndarray] | None, instruction: str) -> np.ndarray | None:
        """The task's goal from a goal pose or an instruction (as the task's goal source says); None while the one
        it needs has not come (ValueError: an instruction that names no goal)."""
        if self.goal_source == "pose":
            return None if pose is None else self.task.goal_from_pose(*pose)
        if self.goal_source == "instruction":
            return self.task.goal_from_instruction(instruction) if instruction else None
        return np.zeros(self.goal_dim)

    def object_observation(
        self, q: np.ndarray, dq: np.ndarray, objects: dict[str, tuple[np.ndarray, np.ndarray]], goal: np.ndarray
    ) -> dict[str, np.ndarray]:
        """An arm's observation (no env axis): the task's `observe` of the state its joint states, the objects'
        joint positions and velocities (`objects`: name -> (qpos entries, qvel entries)) and the goal stand for,
        with the sensors MuJoCo computes of that state."""
        d = self._scratch
        d.qpos[:], d.qvel[:] = self.task.model.qpos0, 0.0
        d.qpos[self.qadr], d.qvel[self.dadr] = q, dq
        for name, (qpos, qvel) in objects.items():
            o = self.objects.joints[name]
            d.qpos[o.qadr], d.qvel[o.dadr] = qpos, qvel
        mujoco.mj_forward(self.task.model, d)
        goal = np.asarray(goal, dtype=np.float64).reshape(1, self.goal_dim)
        frame = self._frame(d.qpos[None].copy(), d.qvel[None].copy(), d.sensordata[None].copy(), goal)
        return {k: np.asarray(v)[0] for k, v in self.task.observe(np, frame).items()}

    def joint_targets(self, q: np.ndarray, action: np.ndarray) -> np.ndarray:
        """The arm's joint targets for task `action` (A,) from measured joint positions `q` (dof,); an outside
        env's action itself (its robot's commands are its actions)."""
        if self.native:
            return np.asarray(action, dtype=np.float64).reshape(-1)
        qpos = np.zeros((1, self.nq))
        qpos[0, self.qadr] = q
        frame = self._frame(qpos, np.zeros((1, self.nv)), np.zeros((1, self.nsens)), np.zeros((1, self.goal_dim)))
        return np.asarray(self.task.control(np, frame, np.asarray(action, dtype=np.float64)[None]))[0]

    def base_observation(
        self, q: np.ndarray, dq: np.ndarray, reading: BaseReading, command: np.ndarray
    ) -> dict[str, np.ndarray]:
        """A floating-base robot's observation (no env axis): the task's `observe` of the state its joint states,
        IMU and odometry (`reading`) and velocity command (the goal) stand for."""
        assert self.base is not None
        qpos, qvel = np.zeros(self.nq), np.zeros(self.nv)
        qpos[self.qadr], qvel[self.dadr] = q, dq
        sensordata = self.base.write(reading, qpos, qvel)
        goal = np.asarray(command, dtype=np.float64).reshape(1, -1)[:, : self.goal_dim]
        frame = self._frame(qpos[None], qvel[None], sensordata[None], goal)
        return {k: np.asarray(v)[0] for k, v in self.task.observe(np, frame).items()}

    def delta_dims(self) -> np.ndarray | None:
        """(A,) bool: the action's elements that are per-step displacements (an ee_delta action's motion, by the
        task's `teleop_axes`; not its gripper), which resampling in time divides among robot steps; None for an
        outside env, whose actions' meaning robotrl does not know."""
        if self.native:
            return None
        size = self.spec.action.size
        if self.spec.action_mode != "ee_delta":
            return np.zeros(size, dtype=bool)  # positions
        axes = getattr(self.task, "teleop_axes", None) or ()
        return np.array([i < len(axes) and axes[i] != "gripper" for i in range(size)], dtype=bool)

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
