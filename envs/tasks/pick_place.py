"""PickPlace: the arm with a parallel gripper puts the cube a language instruction names into a bin.

Three coloured cubes lie on the table in randomly chosen slots (with jitter and yaw); one of them is the
target ("put the red cube in the bin"). The grasp is a real friction grasp: two box fingers on slide joints
squeeze the cube under position control, nothing is welded. Only box/plane geoms are used and only the
contacts that matter (cubes against fingers, table, bin walls and each other) are enabled, so MJX runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from robotrl.core.spec import ArraySpec
from robotrl.envs.task import (
    Expert,
    Frame,
    ResetState,
    TeleopNoise,
    split_state,
    state_layout,
    state_spec,
)
from robotrl.envs.tasks import arm

COLORS: tuple[str, ...] = ("red", "green", "blue")
RGBA = ("0.85 0.15 0.15 1", "0.15 0.7 0.2 1", "0.15 0.3 0.9 1")
NUM_CUBES = len(COLORS)
CUBE_HALF = 0.02  # 4 cm cubes
TOOL_OFFSET = 0.08  # flange to the grasp point between the fingers
FINGER_OPEN = 0.04  # metres per finger (the opening is twice that)
FINGER_CLOSED = -0.01  # a target past contact, so a closed gripper squeezes with kp * 1 cm extra
# Table slots (x, y) for the cubes: three of four are used, so neighbours keep >= 13 cm between centres.
SLOTS = np.array([[0.40, -0.22], [0.58, -0.22], [0.40, -0.04], [0.58, -0.04]])
SLOT_JITTER = 0.025
BIN_POS = np.array([0.50, 0.25])
BIN_HALF = 0.07  # inner half width
BIN_WALL_HEIGHT = 0.06
ARM_NQ = 7  # the task suite's arm; a loaded robot has its own (`PickPlace.arm.dof`)
# stiffer than MuJoCo's default contact (which lets a squeezing finger sink ~4 mm into the cube);
# the time constant stays >= 2 timesteps so the contact remains stable
STIFF_CONTACT = 'solref="0.005 1" solimp="0.95 0.99 0.001"'


def pick_place_layout(dof: int) -> tuple[dict[str, tuple[int, int]], int]:
    """Layout of the "state" observation of an arm with `dof` joints: name -> (start, stop); the expert reads it
    by name."""
    return state_layout(
        ("joint_pos", dof),
        ("joint_vel", dof),
        ("gripper", 1),
        ("tool_pos", 3),
        ("tool_yaw", 2),
        ("cube_pos", 3 * NUM_CUBES),
        ("cube_quat", 4 * NUM_CUBES),
        ("target", NUM_CUBES),
        ("target_rel", 3),
        ("bin_rel", 3),
    )


#: the task suite's arm's layout
STATE_LAYOUT, STATE_DIM = pick_place_layout(ARM_NQ)


@dataclass
class PickPlaceConfig(arm.ArmConfig):
    episode_steps: int = 150
    max_ee_step: float = 0.03  # metres per control step at |action| = 1 (ee_delta)
    max_yaw_step: float = 0.25  # rad per control step at |action| = 1
    init_joint_noise: float = 0.1  # rad, uniform around the home pose
    max_cube_yaw: float = np.pi / 4  # cube yaw drawn uniformly in +-this


class PickPlace(arm.ArmTask):
    name = "PickPlace"
    teleop_axes = ("x", "y", "z", "yaw", "gripper")
    demo_noise = 0.5  # see the expert docstring for success against noise
    config_cls = PickPlaceConfig
    cameras = ("front", "wrist")
    # slot permutation (4), xy jitter (3 x 2), cube yaw (3), target cube (1), arm joint noise (up to 7 joints)
    reset_dims = 4 + 2 * NUM_CUBES + NUM_CUBES + 1 + ARM_NQ
    goal_dim = NUM_CUBES  # one-hot target cube
    tool_offset = TOOL_OFFSET
    config: PickPlaceConfig

    def __init__(self, config: PickPlaceConfig | None = None) -> None:
        super().__init__(config)
        if self.arm.dof > ARM_NQ:
            raise ValueError(f"PickPlace.robot: expected an arm of at most {ARM_NQ} joints, got {self.arm.dof}")
        self.layout = pick_place_layout(self.arm.dof)[0]
        joint = self.model.joint
        #: the fingers' and the first cube's joints in qpos / qvel (the task arm's joints come first, then its
        #: fingers, then the cubes; a loaded robot, attached to the finished scene, after the cubes)
        self.finger_q = [int(self.model.jnt_qposadr[joint(f"finger_{s}").id]) for s in "lr"]
        self.cube_q = int(self.model.jnt_qposadr[joint(f"cube_{COLORS[0]}").id])
        self.cube_v = int(self.model.jnt_dofadr[joint(f"cube_{COLORS[0]}").id])
        #: the actuators' order in `ctrl` as positions in control()'s [arm targets, left, right finger]
        wanted = [f"act_{name}" for name in self.arm.joint_names] + ["act_finger_l", "act_finger_r"]
        names = [self.model.actuator(i).name for i in range(self.model.nu)]
        if sorted(names) != sorted(wanted):
            raise ValueError(f"PickPlace: expected the actuators {wanted}, got {names}")
        self.ctrl_order = np.array([wanted.index(name) for name in names])

    def tool_xml(self) -> str:
        # contype/conaffinity: cubes 1/3, table and bin 1/1, fingers 2/0 -> fingers touch only cubes,
        # the fingers never touch each other, and the arm links (contype 0) touch nothing.
        finger = (
            '<body name="finger_{s}" gravcomp="1">'
            '<joint name="finger_{s}" type="slide" axis="0 {a} 0" range="0 {open}" damping="3" armature="0.01"/>'
            '<geom type="box" size="0.01 0.006 0.035" pos="0 {y} 0.06" rgba="0.25 0.25 0.28 1" '
            'contype="2" conaffinity="0" friction="1.5 0.01 0.001" mass="0.03" {CONTACT}/></body>'
        )
        return (
            '<geom type="box" size="0.015 0.06 0.012" pos="0 0 0.012" rgba="0.3 0.3 0.32 1" '
            'contype="0" conaffinity="0"/>'
            '<camera name="wrist" pos="-0.06 0 0.0" quat="0 0.9659 0 -0.2588" fovy="75"/>'
            + finger.format(s="l", a=1, y=0.006, open=FINGER_OPEN, CONTACT=STIFF_CONTACT)
            + finger.format(s="r", a=-1, y=-0.006, open=FINGER_OPEN, CONTACT=STIFF_CONTACT)
        )

    def mjcf(self) -> str:
        cubes = "\n".join(
            f'<body name="cube_{c}" pos="{SLOTS[i, 0]} {SLOTS[i, 1]} {CUBE_HALF}"><freejoint name="cube_{c}"/>'
            f'<geom name="cube_{c}" type="box" size="{CUBE_HALF} {CUBE_HALF} {CUBE_HALF}" rgba="{RGBA[i]}" '
            f'contype="1" conaffinity="3" mass="0.06" friction="1 0.01 0.001" {STIFF_CONTACT}/></body>'
            for i, c in enumerate(COLORS)
        )
        bx, by, h, t = BIN_POS[0], BIN_POS[1], BIN_WALL_HEIGHT / 2, 0.005
        w = BIN_HALF + t
        walls = "\n".join(
            f'<geom name="bin_{k}" type="box" size="{sx} {sy} {h}" pos="{px} {py} {h}" rgba="0.55 0.4 0.25 1" '
            'contype="1" conaffinity="1"/>'
            for k, (sx, sy, px, py) in enumerate(
                ((t, w, bx + w, by), (t, w, bx - w, by), (w, t, bx, by + w), (w, t, bx, by - w))
            )
        )
        fingers = "".join(
            f'<position name="act_finger_{side}" joint="finger_{side}" kp="300" '
            f'ctrlrange="{FINGER_CLOSED} {FINGER_OPEN}" forcerange="-30 30"/>'
            for side in "lr"
        )
        return arm.table_scene_xml(
            "pick_place",
            option='timestep="0.002" iterations="8" ls_iterations="8"',
            camera='<camera name="front" pos="1.25 0 0.8" xyaxes="0 1 0 -0.707 0 0.707" fovy="48"/>',
            bodies=f"{'' if self.robot else arm.arm_xml(self.tool_xml(), TOOL_OFFSET)}\n{cubes}\n{walls}",
            actuators=("" if self.robot else arm.arm_actuators_xml()) + fingers,  # a robot's: at compile()
            table_contacts=True,
        )

    # --- pure functions ------------------------------------------------------------------------------
    def reset(self, xp: Any, u: Any) -> ResetState:
        n = u.shape[0]
        slot = xp.argsort(u[:, :4], axis=-1)[:, :NUM_CUBES]  # a random permutation, its first three slots
        xy = xp.asarray(SLOTS)[slot] + SLOT_JITTER * (2.0 * u[:, 4:10].reshape(n, NUM_CUBES, 2) - 1.0)
        yaw = self.config.max_cube_yaw * (2.0 * u[:, 10:13] - 1.0)
        quat = arm.yaw_quat(xp, yaw)
        z = xp.full((n, NUM_CUBES, 1), CUBE_HALF)
        cubes = xp.concatenate([xy, z, quat], -1).reshape(n, 7 * NUM_CUBES)
        dof = self.arm.dof
        q_arm = xp.asarray(self.home) + self.config.init_joint_noise * (2.0 * u[:, 14 : 14 + dof] - 1.0)
        fingers = xp.full((n, 2), FINGER_OPEN)
        target = xp.minimum(xp.floor(u[:, 13] * NUM_CUBES), NUM_CUBES - 1)
        goal = (target[:, None] == xp.arange(NUM_CUBES)[None, :]).astype(u.dtype)
        # the task arm and its fingers come first in qpos; a loaded robot (with the fingers) after the cubes
        parts = [q_arm, fingers, cubes] if self.cube_q > 0 else [cubes, q_arm, fingers]
        qpos = xp.concatenate(parts, -1)
        return ResetState(qpos=qpos, qvel=xp.zeros((n, self.model.nv)), goal=goal)

    def control(self, xp: Any, frame: Frame, action: Any) -> Any:
        q = frame.qpos[:, self.arm_q]
        if self.config.action_mode == "joint_pos":
            q_target = self.arm.from_unit(xp, action)
        else:
            fk = self.arm.forward(xp, q)
            target = fk[0] + self.config.max_ee_step * action[:, :3]
            yaw = arm.tool_yaw(xp, fk[1]) + self.config.max_yaw_step * action[:, 3]
            q_target = self.arm.ik(xp, q, target, arm.down_rotation(xp, yaw), self.home, fk=fk)
        # gripper command -1 (open) .. +1 (closed, squeezing): continuous, so a teleop trigger maps directly
        finger = FINGER_OPEN + 0.5 * (action[:, -1:] + 1.0) * (FINGER_CLOSED - FINGER_OPEN)
        return xp.concatenate([q_target, finger, finger], -1)[:, self.ctrl_order]

    def _cubes(self, xp: Any, frame: Frame) -> tuple[Any, Any]:
        """Cube positions (n, 3, 3) and quaternions (n, 3, 4) from the free joints."""
        n = frame.qpos.shape[0]
        c = frame.qpos[:, self.cube_q : self.cube_q + 7 * NUM_CUBES].reshape(n, NUM_CUBES, 7)
        return c[:, :, :3], c[:, :, 3:]

    def _target_pos(self, xp: Any, frame: Frame) -> Any:
        pos, _ = self._cubes(xp, frame)
        return xp.einsum("nc,ncd->nd", frame.goal, pos)

    def observe(self, xp: Any, frame: Frame) -> dict[str, Any]:
        n = frame.qpos.shape[0]
        q = frame.qpos[:, self.arm_q]
        ee = self.sensor(frame, "ee_pos")
        yaw = arm.tool_yaw(xp, self.arm.forward(xp, q)[1])
        pos, quat = self._cubes(xp, frame)
        target = self._target_pos(xp, frame)
        bin_xyz = xp.asarray(np.array([BIN_POS[0], BIN_POS[1], CUBE_HALF]))
        state = xp.concatenate(
            [
                q,
                frame.qvel[:, self.arm_v],
                self._opening(frame)[:, None],
                ee,
                xp.stack([xp.sin(yaw), xp.cos(yaw)], -1),
                pos.reshape(n, -1),
                quat.reshape(n, -1),
                frame.goal,
                target - ee,
                bin_xyz - target,
            ],
            axis=-1,
        )
        return {"state": state.astype(xp.float32)}

    def _opening(self, frame: Frame) -> Any:
        """The gripper's opening (metres): both fingers' slide positions."""
        return frame.qpos[:, self.finger_q[0]] + frame.qpos[:, self.finger_q[1]]

    def in_bin(self, xp: Any, pos: Any) -> Any:
        """Whether cube centres `pos` (..., 3) lie inside the bin (clear of the walls, below their top)."""
        d = xp.abs(pos[..., :2] - xp.asarray(BIN_POS))
        return (
            (d[..., 0] < BIN_HALF - 0.5 * CUBE_HALF)
            & (d[..., 1] < BIN_HALF - 0.5 * CUBE_HALF)
            & (pos[..., 2] < BIN_WALL_HEIGHT)
        )

    def reward(self, xp: Any, frame: Frame, action: Any) -> tuple[Any, Any]:
        ee = self.sensor(frame, "ee_pos")
        cube = self._target_pos(xp, frame)
        n = frame.qpos.shape[0]
        vel = frame.qvel[:, self.cube_v : self.cube_v + 6 * NUM_CUBES].reshape(n, NUM_CUBES, 6)
        speed = xp.linalg.norm(xp.einsum("nc,ncd->nd", frame.goal, vel[:, :, :3]), axis=-1)
        opening = self._opening(frame)
        near = xp.linalg.norm(cube - ee, axis=-1)
        reach = 1.0 - xp.tanh(10.0 * near)
        grasped = ((near < 0.02) & (opening > 2 * CUBE_HALF - 0.01) & (opening < 2 * CUBE_HALF + 0.005)).astype(
            ee.dtype
        )
        lift = xp.clip((cube[:, 2] - CUBE_HALF) / 0.08, 0.0, 1.0) * grasped
        in_bin = self.in_bin(xp, cube)
        d_bin = xp.linalg.norm(cube[:, :2] - xp.asarray(BIN_POS), axis=-1)
        over_bin = (1.0 - xp.tanh(5.0 * d_bin)) * xp.maximum(lift, in_bin.astype(ee.dtype))
        success = in_bin & (speed < 0.05) & (near > 0.03)  # resting, and let go of
        staged = 0.2 * (reach + grasped + lift + over_bin)
        return xp.where(success, 1.0, staged), success

    def terminated(self, xp: Any, frame: Frame) -> Any:
        """A cube fell off the table (or the sim blew up and flung it away)."""
        pos, _ = self._cubes(xp, frame)
        off = (pos[..., 2] < -0.05) | (xp.abs(pos[..., 0] - 0.5) > 0.6) | (xp.abs(pos[..., 1]) > 0.7)
        return off.any(axis=-1)

    # --- host-side -----------------------------------------------------------------------------------
    def instruction(self, goal: np.ndarray) -> list[str]:
        return [f"put the {COLORS[int(i)]} cube in the bin" for i in np.argmax(np.asarray(goal), axis=-1)]

    def goal_from_instruction(self, text: str) -> np.ndarray:
        named = [i for i, c in enumerate(COLORS) if f" {c} " in f" {text.lower()} "]
        if len(named) != 1:
            raise ValueError(
                f"instruction: expected one cube colour of {list(COLORS)} (e.g. "
                f"{self.instruction(np.eye(1, NUM_CUBES))[0]!r}), got {text!r}"
            )
        return np.eye(NUM_CUBES)[named[0]]

    def wrong_object(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """A cube that is not the named one lies in the bin."""
        get = split_state(np.asarray(obs["state"]), self.layout)
        n = len(get["target"])
        inside = np.asarray(self.in_bin(np, get["cube_pos"].reshape(n, NUM_CUBES, 3)))
        return np.asarray((inside & (np.asarray(get["target"]) < 0.5)).any(axis=-1))

    def action_spec(self) -> ArraySpec:
        dim = self.arm.dof + 1 if self.config.action_mode == "joint_pos" else 5
        return ArraySpec((dim,), "float32", -1.0, 1.0)

    def state_obs_specs(self) -> dict[str, ArraySpec]:
        return {"state": state_spec(self.layout)}

    def expert(self, noise: float = 0.0, seed: int | None = None) -> Expert:
        return PickPlaceExpert(self, noise, seed)


# expert phases
APPROACH, DESCEND, CLOSE, LIFT, CARRY, RELEASE = range(6)
HOVER = 0.10  # metres above the cube centre before descending
CARRY_Z = 0.16  # height of the grasp point while carrying
ALIGN_TOL = 0.022  # xy error (m) above the cube to start descending (xy is corrected on the way down)
GRASP_TOL = 0.02  # xy error (m) at which closing still centres the cube between the 8 cm fingers
YAW_TOL = 0.35  # rad; closing squares a slightly turned cube up against the fingers
DRIFT_GAIN = 0.7  # fraction of the estimated drift the expert cancels
GAIN = 1.4  # proportional gain per control step (< 2 keeps the discrete loop stable)


def _quat_yaw(quat: np.ndarray) -> np.ndarray:
    w, x, y, z = (quat[..., i] for i in range(4))
    return np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


class PickPlaceExpert(Expert):
    """State machine: above the cube -> descend -> close -> lift -> over the bin -> open, retrying a lost grasp.

    Teleop noise perturbs the motion (x, y, z, yaw) only: a human holds the gripper button steadily even when
    the hand drifts. The machine is closed-loop on the observed cube, and with noise it also cancels the drift
    it saw in the last step (as a person corrects a hand that pulls), so noise delays it rather than breaks it.
    """

    task: PickPlace

    def __init__(self, task: PickPlace, noise: float = 0.0, seed: int | None = None) -> None:
        if task.config.action_mode != "ee_delta":
            raise ValueError(f"PickPlaceExpert acts in ee_delta mode, the task is in {task.config.action_mode!r}")
        super().__init__(task, noise, seed)
        self.teleop = TeleopNoise(noise, 4, self.rng)
        self.phase = np.zeros(0, dtype=np.int64)
        self.timer = np.zeros(0, dtype=np.int64)
        # what a human feels at the device: last command, last tool pose, estimated drift (disturbance observer)
        self.last_cmd = np.zeros((0, 4))
        self.last_pose = np.full((0, 4), np.nan)
        self.drift = np.zeros((0, 4))

    def reset(self, num_envs: int) -> None:
        self.teleop.reset(num_envs)
        self.phase = np.full(num_envs, APPROACH, dtype=np.int64)
        self.timer = np.zeros(num_envs, dtype=np.int64)
        self.last_cmd = np.zeros((num_envs, 4))
        self.last_pose = np.full((num_envs, 4), np.nan)
        self.drift = np.zeros((num_envs, 4))

    def reset_env(self, index: int) -> None:
        self.teleop.reset_env(index)
        self.phase[index] = APPROACH
        self.timer[index] = 0
        self.last_cmd[index] = 0.0
        self.last_pose[index] = np.nan
        self.drift[index] = 0.0

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        s = np.asarray(obs["state"], dtype=np.float64)
        n = s.shape[0]
        if self.phase.shape[0] != n:
            self.reset(n)
        get = split_state(s, self.task.layout)
        ee = get["tool_pos"]
        yaw = np.arctan2(get["tool_yaw"][:, 0], get["tool_yaw"][:, 1])
        opening = get["gripper"][:, 0]
        idx = np.argmax(get["target"], axis=-1)
        rows = np.arange(n)
        cube = get["cube_pos"].reshape(n, NUM_CUBES, 3)[rows, idx]
        cube_yaw = _quat_yaw(get["cube_quat"].reshape(n, NUM_CUBES, 4)[rows, idx])
        # any of the cube's four face normals will do: take the one nearest the current tool yaw
        yaw_goal = yaw + (np.mod(cube_yaw - yaw + np.pi / 4, np.pi / 2) - np.pi / 4)
        bin_xyz = np.array([BIN_POS[0], BIN_POS[1], CARRY_Z])

        xy_err = np.linalg.norm(cube[:, :2] - ee[:, :2], axis=-1)
        held = (np.linalg.norm(cube - ee, axis=-1) < 0.03) & (opening > 2 * CUBE_HALF - 0.01)
        ph, t = self.phase, self.timer
        t += 1
        # transitions (one per step, decided on this observation)
        new = ph.copy()
        new[
            (ph == APPROACH)
            & (xy_err < ALIGN_TOL)
            & (np.abs(ee[:, 2] - cube[:, 2] - HOVER) < 0.04)
            & (np.abs(yaw_goal - yaw) < YAW_TOL)
        ] = DESCEND
        new[(ph == DESCEND) & (xy_err > ALIGN_TOL + 0.01)] = APPROACH
        new[(ph == DESCEND) & (xy_err <= GRASP_TOL) & (np.abs(ee[:, 2] - cube[:, 2]) < 0.01)] = CLOSE
        new[(ph == CLOSE) & (t >= 6)] = LIFT
        new[(ph == LIFT) & ~held & (t >= 3)] = APPROACH
        new[(ph == LIFT) & held & (ee[:, 2] > CARRY_Z - 0.03)] = CARRY
        new[(ph == CARRY) & ~held] = APPROACH
        new[(ph == CARRY) & (np.linalg.norm(ee[:, :2] - bin_xyz[:2], axis=-1) < 0.03)] = RELEASE
        in_bin = np.asarray(self.task.in_bin(np, cube))
        new[(ph == RELEASE) & (t >= 8) & ~in_bin] = APPROACH
        t[new != ph] = 0
        self.phase = ph = new

        goal = np.where(ph[:, None] == APPROACH, cube + [0.0, 0.0, HOVER], cube)
        goal = np.where((ph == LIFT)[:, None], np.c_[ee[:, :2], np.full(n, CARRY_Z)], goal)
        goal = np.where((ph == CARRY)[:, None], bin_xyz, goal)
        goal = np.where((ph == RELEASE)[:, None], np.c_[ee[:, :2], np.full(n, CARRY_Z)], goal)
        # approach the hover point high first, so the open fingers do not sweep through the other cubes
        low = (ph == APPROACH) & (xy_err > 0.03)
        goal[low, 2] = np.maximum(goal[low, 2], CARRY_Z)
        move = np.clip(GAIN * (goal - ee) / self.task.config.max_ee_step, -1.0, 1.0)
        turn = np.clip(GAIN * (yaw_goal - yaw) / self.task.config.max_yaw_step, -1.0, 1.0)
        turn[ph >= CLOSE] = 0.0
        cmd = np.c_[move, turn]
        if self.noise > 0.0:
            # compensate the drift seen in the last step (what moved minus what was asked), as a human
            # correcting a hand that pulls to one side; it is zero without noise, so the clean expert is exact
            pose = np.c_[ee, yaw]
            scale = np.array([self.task.config.max_ee_step] * 3 + [self.task.config.max_yaw_step])
            delta = pose - self.last_pose
            delta[:, 3] = np.mod(delta[:, 3] + np.pi, 2 * np.pi) - np.pi  # yaw wraps at +-pi
            seen = delta / scale - self.last_cmd
            ok = np.isfinite(seen).all(axis=1)
            self.drift[ok] = 0.5 * self.drift[ok] + 0.5 * np.clip(seen[ok], -1.5, 1.5)
            cmd = np.clip(cmd - DRIFT_GAIN * self.drift, -1.0, 1.0)
            self.last_pose = pose
        grip = np.where((ph == CLOSE) | (ph == LIFT) | (ph == CARRY), 1.0, -1.0)
        motion = np.clip(self.teleop(cmd), -1.0, 1.0)
        self.last_cmd = cmd
        return np.c_[motion, grip].astype(np.float32)
