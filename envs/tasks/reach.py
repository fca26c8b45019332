"""Reach: the 7-DoF arm brings its end effector to a random target in front of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from robotrl.core.spec import ArraySpec
from robotrl.envs.task import Expert, Frame, ResetState, Task, TaskConfig, TeleopNoise, state_layout, state_spec
from robotrl.envs.tasks import arm

#: layout of the "state" observation (joint positions and velocities first, as on every arm task)
STATE_LAYOUT, STATE_DIM = state_layout(
    ("joint_pos", 7),
    ("joint_vel", 7),
    ("tool_pos", 3),
    ("target", 3),
    ("target_rel", 3),
)

TOOL_OFFSET = 0.10  # a 10 cm stylus below the flange
TARGET_LOW = np.array([0.30, -0.30, 0.15])
TARGET_HIGH = np.array([0.65, 0.30, 0.60])


@dataclass
class ReachConfig(TaskConfig):
    episode_steps: int = 60
    success_radius: float = 0.04  # metres between the tool tip and the target
    max_ee_step: float = 0.05  # metres per control step at |action| = 1 (ee_delta mode)
    init_joint_noise: float = 0.15  # rad, uniform around the home pose
    images: bool = False  # render the front camera as the observation image_front (pixel policies)


class Reach(Task):
    name = "Reach"
    teleop_axes = ("x", "y", "z")
    config_cls = ReachConfig
    reset_dims = 7 + 3
    goal_dim = 3
    config: ReachConfig

    def __init__(self, config: ReachConfig | None = None) -> None:
        super().__init__(config)
        self.cameras = ("front",) if self.config.images else ()

    def mjcf(self) -> str:
        stylus = (
            '<geom type="capsule" fromto="0 0 0 0 0 0.1" size="0.012" rgba="0.2 0.2 0.2 1" '
            'contype="0" conaffinity="0"/>'
        )
        target = (
            f'<body name="target" mocap="true" pos="0.5 0 0.4"><geom type="sphere" size="{self.config.success_radius}" '
            'rgba="0.1 0.9 0.2 0.4" contype="0" conaffinity="0"/></body>'
        )
        return arm.table_scene_xml(
            "reach",
            option='timestep="0.002" iterations="4" ls_iterations="8"',
            camera='<camera name="front" pos="1.6 0 0.9" xyaxes="0 1 0 -0.45 0 0.9"/>',
            bodies=arm.arm_xml(stylus, TOOL_OFFSET) + target,
            actuators=arm.arm_actuators_xml(),
            flags='contact="disable"',
        )

    # --- pure functions ------------------------------------------------------------------------------
    def reset(self, xp: Any, u: Any) -> ResetState:
        n = u.shape[0]
        noise = self.config.init_joint_noise
        qpos = xp.asarray(arm.HOME_QPOS) + noise * (2.0 * u[:, :7] - 1.0)
        goal = xp.asarray(TARGET_LOW) + u[:, 7:10] * xp.asarray(TARGET_HIGH - TARGET_LOW)
        return ResetState(qpos=qpos, qvel=xp.zeros((n, 7)), goal=goal)

    def mocap(self, xp: Any, goal: Any) -> tuple[Any, Any]:
        quat = xp.zeros((goal.shape[0], 1, 4)) + xp.asarray([1.0, 0.0, 0.0, 0.0])
        return goal[:, None, :], quat

    def control(self, xp: Any, frame: Frame, action: Any) -> Any:
        q = frame.qpos[:, :7]
        if self.config.action_mode == "joint_pos":
            return arm.joint_targets_from_action(xp, action)
        fk = arm.forward_kinematics(xp, q, TOOL_OFFSET)
        target = fk[0] + self.config.max_ee_step * action[:, :3]
        return arm.ik_joint_targets(xp, q, target, xp.zeros(q.shape[0]), TOOL_OFFSET, fk=fk)

    def observe(self, xp: Any, frame: Frame) -> dict[str, Any]:
        ee = self.sensor(frame, "ee_pos")
        state = xp.concatenate([frame.qpos[:, :7], frame.qvel[:, :7], ee, frame.goal, frame.goal - ee], axis=-1)
        return {"state": state.astype(xp.float32)}

    def reward(self, xp: Any, frame: Frame, action: Any) -> tuple[Any, Any]:
        dist = xp.linalg.norm(self.sensor(frame, "ee_pos") - frame.goal, axis=-1)
        return 1.0 - xp.tanh(5.0 * dist), dist < self.config.success_radius

    # --- specs ---------------------------------------------------------------------------------------
    def action_spec(self) -> ArraySpec:
        dim = 7 if self.config.action_mode == "joint_pos" else 3
        return ArraySpec((dim,), "float32", -1.0, 1.0)

    def state_obs_specs(self) -> dict[str, ArraySpec]:
        return {"state": state_spec(STATE_LAYOUT)}

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
        delta = np.asarray(obs["state"])[:, 20:23]
        action = np.clip(delta / self.task.config.max_ee_step, -1.0, 1.0)
        return np.clip(self.teleop(action), -1.0, 1.0).astype(np.float32)
