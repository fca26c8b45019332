"""Reach: the arm brings its end effector to a random target in front of it. The arm is the task suite's 7-DoF
arm, or any robot given by `robot` (a URDF/MJCF description: robotrl/envs/robots), whose joints then size the
observation and the `joint_pos` action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from robotrl.core.spec import ArraySpec
from robotrl.envs.task import Expert, Frame, ResetState, TeleopNoise, state_layout, state_spec
from robotrl.envs.tasks import arm


def reach_layout(dof: int) -> tuple[dict[str, tuple[int, int]], int]:
    """Layout of the "state" observation of an arm of `dof` joints (their positions and velocities first, as on
    every arm task)."""
    return state_layout(("joint_pos", dof), ("joint_vel", dof), ("tool_pos", 3), ("target", 3), ("target_rel", 3))


#: the task suite's arm's layout
STATE_LAYOUT, STATE_DIM = reach_layout(7)

TOOL_OFFSET = 0.10  # a 10 cm stylus below the flange
TARGET_LOW = np.array([0.30, -0.30, 0.15])
TARGET_HIGH = np.array([0.65, 0.30, 0.60])


@dataclass
class ReachConfig(arm.ArmConfig):
    episode_steps: int = 60
    success_radius: float = 0.04  # metres between the tool tip and the target
    max_ee_step: float = 0.05  # metres per control step at |action| = 1 (ee_delta mode)
    init_joint_noise: float = 0.15  # rad, uniform around the home pose
    images: bool = False  # render the front camera as the observation image_front (pixel policies)


class Reach(arm.ArmTask):
    name = "Reach"
    tool_offset = TOOL_OFFSET
    teleop_axes = ("x", "y", "z")
    config_cls = ReachConfig
    reset_dims = 7 + 3
    goal_dim = 3
    config: ReachConfig

    def __init__(self, config: ReachConfig | None = None) -> None:
        super().__init__(config)
        self.cameras = ("front",) if self.config.images else ()
        self.layout = reach_layout(self.arm.dof)[0]

    def tool_xml(self) -> str:
        return (
            f'<geom type="capsule" fromto="0 0 0 0 0 {TOOL_OFFSET}" size="0.012" rgba="0.2 0.2 0.2 1" '
            'contype="0" conaffinity="0"/>'
        )

    def mjcf(self) -> str:
        target = (
            f'<body name="target" mocap="true" pos="0.5 0 0.4"><geom type="sphere" size="{self.config.success_radius}" '
            'rgba="0.1 0.9 0.2 0.4" contype="0" conaffinity="0"/></body>'
        )
        return arm.table_scene_xml(
            "reach",
            option='timestep="0.002" iterations="4" ls_iterations="8"',
            camera='<camera name="front" pos="1.6 0 0.9" xyaxes="0 1 0 -0.45 0 0.9"/>',
            bodies=target if self.config.robot else arm.arm_xml(self.tool_xml(), TOOL_OFFSET) + target,
            actuators="" if self.config.robot else arm.arm_actuators_xml(),
            flags='contact="disable"',
        )

    # --- pure functions ------------------------------------------------------------------------------
    def reset(self, xp: Any, u: Any) -> ResetState:
        n, dof = u.shape[0], self.arm.dof
        noise = self.config.init_joint_noise
        qpos = xp.asarray(self.home) + noise * (2.0 * u[:, :dof] - 1.0)
        goal = xp.asarray(TARGET_LOW) + u[:, 7:10] * xp.asarray(TARGET_HIGH - TARGET_LOW)
        return ResetState(qpos=qpos, qvel=xp.zeros((n, dof)), goal=goal)

    def mocap(self, xp: Any, goal: Any) -> tuple[Any, Any]:
        quat = xp.zeros((goal.shape[0], 1, 4)) + xp.asarray([1.0, 0.0, 0.0, 0.0])
        return goal[:, None, :], quat

    def goal_from_pose(self, position: np.ndarray, orientation: np.ndarray) -> np.ndarray:
        """The target point: the pose's position (the tool's orientation is the task's own)."""
        return np.asarray(position, dtype=np.float64).copy()

    def control(self, xp: Any, frame: Frame, action: Any) -> Any:
        q = frame.qpos[:, self.arm_q]
        if self.config.action_mode == "joint_pos":
            return self.arm.from_unit(xp, action)
        fk = self.arm.forward(xp, q)
        target = fk[0] + self.config.max_ee_step * action[:, :3]
        return self.arm.ik(xp, q, target, xp.asarray(arm.DOWN), self.home, fk=fk)

    def observe(self, xp: Any, frame: Frame) -> dict[str, Any]:
        ee = self.sensor(frame, "ee_pos")
        arm_q, arm_v = frame.qpos[:, self.arm_q], frame.qvel[:, self.arm_v]
        state = xp.concatenate([arm_q, arm_v, ee, frame.goal, frame.goal - ee], axis=-1)
        return {"state": state.astype(xp.float32)}

    def reward(self, xp: Any, frame: Frame, action: Any) -> tuple[Any, Any]:
        dist = xp.linalg.norm(self.sensor(frame, "ee_pos") - frame.goal, axis=-1)
        return 1.0 - xp.tanh(5.0 * dist), dist < self.config.success_radius

    # --- specs ---------------------------------------------------------------------------------------
    def action_spec(self) -> ArraySpec:
        dim = self.arm.dof if self.config.action_mode == "joint_pos" else 3
        return ArraySpec((dim,), "float32", -1.0, 1.0)

    def state_obs_specs(self) -> dict[str, ArraySpec]:
        return {"state": state_spec(self.layout)}

    def expert(self, noise: float = 0.0, seed: int | None = None) -> Expert:
        return ReachExpert(self, noise, seed)


class ReachExpert(Expert):
    """Moves the tool tip straight at the target, slowing down near it (ee_delta actions)."""

    task: Reach

    def __init__(self, task: Reach, noise: float = 0.0, seed: int | None = None) -> None:
        if task.config.action_mode != "ee_delta":
            raise ValueError(f"ReachExpert acts in ee_delta mode, the task is in {task.config.action_mode!r}")
        super().__init__(task, noise, seed)
        self.teleop = TeleopNoise(noise, 3, self.rng)

    def reset(self, num_envs: int) -> None:
        self.teleop.reset(num_envs)

    def reset_env(self, index: int) -> None:
        self.teleop.reset_env(index)

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        a, b = self.task.layout["target_rel"]
        delta = np.asarray(obs["state"])[:, a:b]
        action = np.clip(delta / self.task.config.max_ee_step, -1.0, 1.0)
        return np.clip(self.teleop(action), -1.0, 1.0).astype(np.float32)
