"""Quadruped: a 12-actuator quadruped (Go1-like sizes) tracks a commanded base velocity (vx, vy, yaw rate).

Made for PPO on thousands of parallel envs (MJX): primitive geoms only, the four foot spheres are the only
geoms that collide (each against the floor plane, MJX's sphere/plane pair), 4 solver iterations and a 4 ms
timestep. Legs are hip abduction (about x), hip (about y) and knee (about y); position actuators (PD, kp 35)
hold offsets from a standing pose, as on Go1/legged_gym, so a zero action stands.

Observations come from an IMU site on the trunk (framequat, velocimeter, gyro: what a real robot's state
estimator gives) plus joint positions and velocities; the command is part of the state. The trunk's height is
not observed (a real robot does not measure it either); termination reads it from qpos.

The scripted expert is a trot: diagonal leg pairs share a phase clock, stance feet sweep back at the commanded
velocity (plus velocity feedback), swing feet arc to the mirrored landing spot, all feet shift with the velocity
error (Raibert) and the trunk is levelled from the measured gravity direction; foot targets go through analytic
leg IK.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from robotrl.core.spec import ArraySpec
from robotrl.envs.randomization import Randomization
from robotrl.envs.rollouts import EpisodeStats
from robotrl.envs.task import (
    Expert,
    Frame,
    ResetState,
    Task,
    TaskConfig,
    TeleopNoise,
    state_layout,
    state_spec,
)

# --- geometry (metres, kg) ---------------------------------------------------------------------------
TRUNK_HALF = (0.19, 0.095, 0.055)
TRUNK_MASS = 5.5
HIP_MASS, THIGH_MASS, CALF_MASS, FOOT_MASS = 0.6, 0.9, 0.2, 0.05
THIGH_LEN = CALF_LEN = 0.21
FOOT_RADIUS = 0.02
HIP_OFFSET = 0.08  # abduction axis to the thigh's plane, outwards
LEGS = ("FL", "FR", "RL", "RR")
#: abduction joint origins in the trunk frame and the signed lateral offset (+ left, - right) per leg
HIPS = np.array([[0.19, 0.05, 0.0], [0.19, -0.05, 0.0], [-0.19, 0.05, 0.0], [-0.19, -0.05, 0.0]])
SIDE = np.array([1.0, -1.0, 1.0, -1.0])

#: standing pose per leg (abduction, hip, knee); the knee bends backwards (negative)
STAND_LEG = np.array([0.0, 0.8, -1.5])
DEFAULT_QPOS = np.tile(STAND_LEG, 4)
JOINT_RANGE = np.array([[-0.8, 0.8], [-1.0, 2.6], [-2.7, -0.8]])
TORQUE_LIMIT = np.array([23.7, 23.7, 35.5])  # N m, Go1-class motors (the knee is geared higher)
#: the same per joint of the four legs, in actuator order
JOINT_LOW, JOINT_HIGH = np.tile(JOINT_RANGE[:, 0], 4), np.tile(JOINT_RANGE[:, 1], 4)
TORQUE_LIMITS = np.tile(TORQUE_LIMIT, 4)
KP = 35.0
JOINT_DAMPING = 0.8
ARMATURE = 0.01  # reflected rotor inertia; also keeps the light calf stable at a 4 ms step

BASE_NQ = 7  # free joint: position, quaternion (w, x, y, z)
BASE_NV = 6  # free joint: world linear velocity, body angular velocity
NJ = 12

#: layout of the "state" observation: name -> (start, stop); the expert reads it by name
STATE_LAYOUT, STATE_DIM = state_layout(
    ("base_lin_vel", 3),
    ("base_ang_vel", 3),
    ("gravity", 3),
    ("joint_pos", NJ),
    ("joint_vel", NJ),
    ("command", 3),
)


def leg_fk(xp: Any, q: Any) -> Any:
    """Foot-centre positions (n, 4, 3) in the trunk frame for joint angles q (n, 12)."""
    q = q.reshape(q.shape[0], 4, 3)
    a, t, k = q[..., 0], q[..., 1], q[..., 2]
    x = -THIGH_LEN * xp.sin(t) - CALF_LEN * xp.sin(t + k)
    z = -THIGH_LEN * xp.cos(t) - CALF_LEN * xp.cos(t + k)
    d = xp.asarray(SIDE * HIP_OFFSET)
    y_rot = d * xp.cos(a) - z * xp.sin(a)
    z_rot = d * xp.sin(a) + z * xp.cos(a)
    return xp.stack([x, y_rot, z_rot], axis=-1) + xp.asarray(HIPS)


def leg_ik(xp: Any, feet: Any) -> Any:
    """Joint angles (n, 12) that put the feet at `feet` (n, 4, 3), trunk frame; unreachable targets are clamped."""
    p = feet - xp.asarray(HIPS)
    d = xp.asarray(SIDE * HIP_OFFSET)
    px, py, pz = p[..., 0], p[..., 1], p[..., 2]
    r = xp.sqrt(xp.maximum(py * py + pz * pz - d * d, 1e-6))
    a = xp.arctan2(pz, py) - xp.arctan2(-r, d)
    a = xp.arctan2(xp.sin(a), xp.cos(a))
    reach = xp.minimum(px * px + r * r, (THIGH_LEN + CALF_LEN - 1e-4) ** 2)
    cos_k = (reach - THIGH_LEN**2 - CALF_LEN**2) / (2 * THIGH_LEN * CALF_LEN)
    k = -xp.arccos(xp.clip(cos_k, -1.0, 1.0))
    t = xp.arctan2(-px, r) - xp.arctan2(CALF_LEN * xp.sin(k), THIGH_LEN + CALF_LEN * xp.cos(k))
    return xp.stack([a, t, k], axis=-1).reshape(feet.shape[0], NJ)


def projected_gravity(xp: Any, quat: Any) -> Any:
    """Unit gravity direction in the trunk frame (n, 3) from (w, x, y, z): (0, 0, -1) when level."""
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    return -xp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], axis=-1)


STAND_FEET = leg_fk(np, DEFAULT_QPOS[None])[0]
#: trunk-centre height when standing at the default pose on flat ground (feet touching)
STAND_HEIGHT = float(-STAND_FEET[:, 2].mean() + FOOT_RADIUS)


@dataclass
class QuadrupedConfig(TaskConfig):
    action_mode: str = "joint_pos"
    episode_steps: int = 500  # 10 s at 50 Hz
    action_scale: float = 0.5  # rad of joint offset from the standing pose at |action| = 1
    vx_range: tuple[float, float] = (-0.6, 1.0)  # m/s, trunk frame
    vy_range: tuple[float, float] = (-0.4, 0.4)  # m/s
    yaw_rate_range: tuple[float, float] = (-1.0, 1.0)  # rad/s
    init_joint_noise: float = 0.1  # rad, uniform around the standing pose
    init_base_vel_noise: float = 0.1  # m/s and rad/s, uniform
    tracking_sigma: float = 0.25  # (m/s)^2 and (rad/s)^2 in the exp(-err^2 / sigma) tracking terms
    success_lin_err: float = 0.25  # m/s: a step tracks when the planar velocity error is below this ...
    success_yaw_err: float = 0.5  # rad/s: ... and the yaw-rate error below this, while upright
    min_height: float = 0.15  # m: the trunk centre below this is a fall
    max_tilt: float = 1.0  # rad between the trunk's up axis and the world's up: beyond is a fall


class Quadruped(Task):
    name = "Quadruped"
    demo_noise = 0.05  # see the expert docstring for success against noise
    config_cls = QuadrupedConfig
    action_modes = ("joint_pos",)
    control_hz = 50.0
    reset_dims = 1 + NJ + 6 + 3  # yaw, joint noise, base velocity noise, command
    goal_dim = 3  # the command (vx, vy, yaw rate)
    twist_goal = True
    config: QuadrupedConfig

    def mjcf(self) -> str:
        legs = "".join(self._leg_xml(i) for i in range(4))
        actuators = "".join(
            f'<position name="{leg}_{j}" joint="{leg}_{j}" kp="{KP}" '
            f'ctrlrange="{JOINT_RANGE[k, 0]} {JOINT_RANGE[k, 1]}" '
            f'forcerange="{-TORQUE_LIMIT[k]} {TORQUE_LIMIT[k]}"/>'
            for leg in LEGS
            for k, j in enumerate(("abduct", "hip", "knee"))
        )
        hx, hy, hz = TRUNK_HALF
        return f"""
<mujoco model="quadruped">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.004" integrator="implicitfast" iterations="4" ls_iterations="6">
    <flag eulerdamp="disable"/>
  </option>
  <visual><global offwidth="640" offheight="480"/></visual>
  <default>
    <geom contype="0" conaffinity="0" rgba="0.55 0.55 0.6 1"/>
    <joint damping="{JOINT_DAMPING}" armature="{ARMATURE}"/>
  </default>
  <asset>
    <texture name="grid" type="2d" builtin="checker" rgb1=".25 .3 .35" rgb2=".3 .35 .4" width="256" height="256"/>
    <material name="grid" texture="grid" texrepeat="40 40"/>
  </asset>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1" diffuse="0.8 0.8 0.8"/>
    <geom name="floor" type="plane" size="20 20 0.1" material="grid" contype="0" conaffinity="1" friction="0.8"/>
    <body name="trunk" pos="0 0 {STAND_HEIGHT:.4f}">
      <freejoint name="root"/>
      <camera name="track" mode="trackcom" pos="0 -1.4 0.5" xyaxes="1 0 0 0 0.35 1"/>
      <geom name="trunk" type="box" size="{hx} {hy} {hz}" mass="{TRUNK_MASS}" rgba="0.3 0.3 0.35 1"/>
      <site name="imu" pos="0 0 0"/>
      {legs}
    </body>
  </worldbody>
  <actuator>{actuators}</actuator>
  <sensor>
    <framequat name="imu_quat" objtype="site" objname="imu"/>
    <velocimeter name="imu_vel" site="imu"/>
    <gyro name="imu_gyro" site="imu"/>
  </sensor>
</mujoco>"""

    @staticmethod
    def _leg_xml(i: int) -> str:
        leg, (x, y, z), s = LEGS[i], HIPS[i], SIDE[i]
        lo = JOINT_RANGE
        return f"""
      <body name="{leg}_hip" pos="{x} {y} {z}">
        <joint name="{leg}_abduct" axis="1 0 0" range="{lo[0, 0]} {lo[0, 1]}"/>
        <geom type="cylinder" size="0.045 0.025" euler="1.5708 0 0" pos="0 {s * 0.04} 0" mass="{HIP_MASS}"/>
        <body name="{leg}_thigh" pos="0 {s * HIP_OFFSET} 0">
          <joint name="{leg}_hip" axis="0 1 0" range="{lo[1, 0]} {lo[1, 1]}"/>
          <geom type="capsule" fromto="0 0 0 0 0 {-THIGH_LEN}" size="0.022" mass="{THIGH_MASS}"/>
          <body name="{leg}_calf" pos="0 0 {-THIGH_LEN}">
            <joint name="{leg}_knee" axis="0 1 0" range="{lo[2, 0]} {lo[2, 1]}"/>
            <geom type="capsule" fromto="0 0 0 0 0 {-CALF_LEN + FOOT_RADIUS}" size="0.013" mass="{CALF_MASS}"/>
            <geom name="{leg}_foot" type="sphere" pos="0 0 {-CALF_LEN}" size="{FOOT_RADIUS}" mass="{FOOT_MASS}"
                  contype="1" conaffinity="0" condim="3" friction="0.8" rgba="0.15 0.15 0.15 1"/>
          </body>
        </body>
      </body>"""

    # --- pure functions ------------------------------------------------------------------------------
    def reset(self, xp: Any, u: Any) -> ResetState:
        cfg, n = self.config, u.shape[0]
        yaw = np.pi * (2.0 * u[:, 0] - 1.0)
        joints = xp.asarray(DEFAULT_QPOS) + cfg.init_joint_noise * (2.0 * u[:, 1:13] - 1.0)
        # start just above the ground: the lowest foot of the perturbed pose 5 mm clear of the floor
        feet_z = leg_fk(xp, joints)[..., 2]
        height = -xp.min(feet_z, axis=1) + FOOT_RADIUS + 0.005
        zero = xp.zeros(n)
        base = xp.stack([zero, zero, height, xp.cos(0.5 * yaw), zero, zero, xp.sin(0.5 * yaw)], axis=-1)
        qpos = xp.concatenate([base, joints], axis=-1)
        base_vel = cfg.init_base_vel_noise * (2.0 * u[:, 13:19] - 1.0)
        qvel = xp.concatenate([base_vel, xp.zeros((n, NJ))], axis=-1)
        lo = xp.asarray([cfg.vx_range[0], cfg.vy_range[0], cfg.yaw_rate_range[0]])
        hi = xp.asarray([cfg.vx_range[1], cfg.vy_range[1], cfg.yaw_rate_range[1]])
        goal = lo + u[:, 19:22] * (hi - lo)
        return ResetState(qpos=qpos, qvel=qvel, goal=goal)

    def control(self, xp: Any, frame: Frame, action: Any) -> Any:
        target = xp.asarray(DEFAULT_QPOS) + self.config.action_scale * action
        return xp.clip(target, xp.asarray(JOINT_LOW), xp.asarray(JOINT_HIGH))

    def observe(self, xp: Any, frame: Frame) -> dict[str, Any]:
        state = xp.concatenate(
            [
                self.sensor(frame, "imu_vel"),
                self.sensor(frame, "imu_gyro"),
                projected_gravity(xp, self.sensor(frame, "imu_quat")),
                frame.qpos[:, BASE_NQ:] - xp.asarray(DEFAULT_QPOS),
                frame.qvel[:, BASE_NV:],
                frame.goal,
            ],
            axis=-1,
        )
        return {"state": state.astype(xp.float32)}

    def tracking_errors(self, xp: Any, frame: Frame) -> tuple[Any, Any]:
        """Squared planar-velocity and yaw-rate errors (n,), trunk frame, against the command."""
        vel, gyro = self.sensor(frame, "imu_vel"), self.sensor(frame, "imu_gyro")
        lin = xp.sum((vel[:, :2] - frame.goal[:, :2]) ** 2, axis=-1)
        yaw = (gyro[:, 2] - frame.goal[:, 2]) ** 2
        return lin, yaw

    def upright(self, xp: Any, frame: Frame) -> Any:
        """(n,) bool: trunk high enough and not tilted past `max_tilt` (from the exact qpos, not the IMU)."""
        quat = frame.qpos[:, 3:7]
        up_z = 1.0 - 2.0 * (quat[:, 1] ** 2 + quat[:, 2] ** 2)
        return (frame.qpos[:, 2] > self.config.min_height) & (up_z > np.cos(self.config.max_tilt))

    def reward(self, xp: Any, frame: Frame, action: Any) -> tuple[Any, Any]:
        """legged_gym-style: exp tracking terms (1.0 planar, 0.5 yaw) minus small smoothness penalties.

        Penalties (bouncing, rocking, joint speed, torque) cost ~0.15 per step for the expert's trot (mostly
        roll/pitch rate), against up to 1.5 for tracking: tracking dominates, but flailing pays.
        """
        cfg = self.config
        lin_err, yaw_err = self.tracking_errors(xp, frame)
        vel, gyro = self.sensor(frame, "imu_vel"), self.sensor(frame, "imu_gyro")
        # motor torque the PD applies for this action at the reached pose (the frame has no actuator forces)
        limit = xp.asarray(TORQUE_LIMITS)
        torque = xp.clip(KP * (self.control(xp, frame, action) - frame.qpos[:, BASE_NQ:]), -limit, limit)
        dense = (
            1.0 * xp.exp(-lin_err / cfg.tracking_sigma)
            + 0.5 * xp.exp(-yaw_err / cfg.tracking_sigma)
            - 0.5 * vel[:, 2] ** 2
            - 0.05 * xp.sum(gyro[:, :2] ** 2, axis=-1)
            - 1e-4 * xp.sum(frame.qvel[:, BASE_NV:] ** 2, axis=-1)
            - 2e-4 * xp.sum(torque**2, axis=-1)
        )
        success = (lin_err < cfg.success_lin_err**2) & (yaw_err < cfg.success_yaw_err**2) & self.upright(xp, frame)
        return dense, success

    def terminated(self, xp: Any, frame: Frame) -> Any:
        # a fall; only the feet collide, so a fallen trunk would sink through the floor: end it first
        return ~self.upright(xp, frame)

    # --- specs ---------------------------------------------------------------------------------------
    def default_randomization(self) -> Randomization:
        """Legged sim-to-real ranges: wide foot friction, payload-like mass changes, one step of latency; no images."""
        return Randomization(
            friction=(0.4, 1.25),
            mass=(0.85, 1.2),
            damping=(0.8, 1.2),
            actuator_gain=(0.9, 1.1),
            latency_steps=(0, 1),
            obs_noise=0.01,
        )

    def action_spec(self) -> ArraySpec:
        return ArraySpec((NJ,), "float32", -1.0, 1.0)

    def state_obs_specs(self) -> dict[str, ArraySpec]:
        return {"state": state_spec(STATE_LAYOUT)}

    def measures(self, stats: EpisodeStats) -> dict[str, float]:
        """The fall rate and the share of steps that track the command (after a fall: none), over the episodes."""
        assert stats.success_steps is not None and stats.terminated is not None
        return {
            "fall_rate": float(np.mean(stats.terminated)),
            "tracking": float(np.sum(stats.success_steps) / (len(stats.success_steps) * self.config.episode_steps)),
        }

    def expert(self, noise: float = 0.0, seed: int | None = None) -> Expert:
        return TrotExpert(self, noise, seed)


@dataclass(frozen=True)
class TrotParams:
    period: float = 0.4  # s per gait cycle; half of it in stance
    swing_height: float = 0.09  # m of foot lift at mid-swing (high: clears the feet under joint noise)
    velocity_gain: float = 0.5  # extra sweep speed per m/s of velocity error
    raibert_gain: float = 0.3  # s: foot shift per m/s of velocity error
    max_stride: float = 0.14  # m: half-stride clamp (keeps the IK in reach)
    level_gain: float = 1.0  # extra leg extension per metre of hip height lost to tilt
    widen: float = 0.02  # m: feet outwards of the standing pose (a wider base resists roll)
    x_offset: float = -0.04  # m: feet forward of the centre of mass; centred feet drift backwards
    swing_travel: float = 0.7  # fraction of the swing over which the foot travels forward
    height: float = float(-STAND_FEET[:, 2].mean())  # m: trunk centre above the foot centres


class TrotExpert(Expert):
    """A trot with a phase clock per env and analytic leg IK (joint_pos actions).

    Diagonal pairs (FL+RR, FR+RL) alternate half a period apart. A stance foot moves backwards under the hip
    at the commanded hip velocity plus feedback on the measured velocity error (position-controlled legs set
    the trunk's speed by their sweep); a swing foot arcs forward to the mirrored spot. All feet also shift
    along the velocity error (Raibert), which moves the support towards the side the trunk drifts to. Foot
    targets are at a fixed depth in the trunk frame, extended on the low side by the measured tilt, so a
    tilted trunk is levelled. Tuned on flat ground at noise 0 (its falls and tracking: bench/RESULTS.md, "Scripted
    experts").
    """

    task: Quadruped

    def __init__(
        self, task: Quadruped, noise: float = 0.0, seed: int | None = None, params: TrotParams | None = None
    ) -> None:
        super().__init__(task, noise, seed)
        self.params = params if params is not None else TrotParams()
        self.teleop = TeleopNoise(noise, NJ, self.rng)
        self.dt = 1.0 / task.control_hz
        self.phase = np.zeros(0)
        # the diagonal support line of a trot must pass under the centre of mass, which the backward-hanging
        # thighs put ~3 cm behind the trunk centre: the feet are placed relative to it
        data = mujoco.MjData(task.model)
        data.qpos[2:7] = [STAND_HEIGHT, 1.0, 0.0, 0.0, 0.0]
        data.qpos[BASE_NQ:] = DEFAULT_QPOS
        mujoco.mj_forward(task.model, data)
        self.com = data.subtree_com[1] - data.qpos[:3]

    def reset(self, num_envs: int) -> None:
        self.phase = np.zeros(num_envs)
        self.teleop.reset(num_envs)

    def reset_env(self, index: int) -> None:
        self.phase[index] = 0.0
        self.teleop.reset_env(index)

    def _part(self, state: np.ndarray, key: str) -> np.ndarray:
        a, b = STATE_LAYOUT[key]
        return state[:, a:b]

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        state = np.asarray(obs["state"], dtype=np.float64)
        n, p = state.shape[0], self.params
        if self.phase.shape[0] != n:
            self.reset(n)
        cmd = self._part(state, "command")
        vel = self._part(state, "base_lin_vel")
        grav = self._part(state, "gravity")

        # stance feet are position-controlled, so the trunk moves as fast as they sweep: the sweep is the command
        # plus feedback on the measured velocity error (the same stride sets the swing's landing spot, so the
        # foot path is continuous at touchdown: a jump there would shove the trunk)
        v_eff = cmd[:, :2] + np.clip(p.velocity_gain * (cmd[:, :2] - vel[:, :2]), -0.3, 0.3)
        hip_v = v_eff[:, None, :] + cmd[:, 2, None, None] * np.stack([-HIPS[:, 1], HIPS[:, 0]], -1)[None]
        half_stride = np.clip(0.25 * p.period * hip_v, -p.max_stride, p.max_stride)
        # Raibert: all feet (swing landing and stance alike, so touchdown is continuous) shift along the velocity
        # error, which moves the support under the trunk towards the side it drifts to
        shift = np.clip(p.raibert_gain * (vel[:, :2] - cmd[:, :2]), -0.06, 0.06)[:, None, :]

        phase = (self.phase[:, None] + np.array([0.0, 0.5, 0.5, 0.0])[None]) % 1.0  # FL, FR, RL, RR
        stance = phase < 0.5
        s = np.where(stance, phase / 0.5, (phase - 0.5) / 0.5)  # progress within stance or swing
        # the swing foot finishes its forward travel early: a PD-lagging foot still moving forward when it lands
        # would push the trunk backwards
        blend = 0.5 - 0.5 * np.cos(np.pi * np.clip(s / p.swing_travel, 0.0, 1.0))
        xy_stance = half_stride * (1.0 - 2.0 * s)[..., None]
        xy_swing = -half_stride + 2.0 * half_stride * blend[..., None]
        xy = np.where(stance[..., None], xy_stance, xy_swing) + shift
        lift = np.where(stance, 0.0, p.swing_height * np.sin(np.pi * s))

        nominal = STAND_FEET.copy()
        nominal[:, 0] = HIPS[:, 0] + self.com[0] + p.x_offset
        nominal[:, 1] += self.com[1] + SIDE * p.widen
        feet = np.empty((n, 4, 3))
        feet[..., :2] = nominal[None, :, :2] + xy
        # trunk-frame foot depth levels the trunk on flat ground; the tilt term levels it faster: a leg on the
        # low side (where gravity points, g_x x + g_y y > 0) reaches further down
        g = grav / np.maximum(np.linalg.norm(grav, axis=-1, keepdims=True), 1e-9)
        tilt = g[:, None, 0] * HIPS[None, :, 0] + g[:, None, 1] * HIPS[None, :, 1]
        feet[..., 2] = -p.height + lift - p.level_gain * tilt
        q = leg_ik(np, feet)

        action = (q - DEFAULT_QPOS) / self.task.config.action_scale
        self.phase = (self.phase + self.dt / p.period) % 1.0
        return np.clip(self.teleop(np.clip(action, -1.0, 1.0)), -1.0, 1.0).astype(np.float32)


def tracking_stats(policy: str = "expert", noise: float = 0.0, episodes: int = 100, seed: int = 0) -> dict[str, float]:
    """`tracking` of the scripted expert at `noise`, or of the zero action (`policy="zero"`)."""
    if policy == "expert":
        from robotrl.envs import make_task

        expert = make_task("Quadruped").expert(noise=noise, seed=seed)
        return tracking(expert.act, episodes, seed, expert.reset)
    return tracking(lambda obs: np.zeros((episodes, NJ), np.float32), episodes, seed)


def tracking(
    act: Callable[[dict[str, Any]], Any], episodes: int = 100, seed: int = 0, reset: Callable[[int], None] | None = None
) -> dict[str, float]:
    """One seeded episode per env (random commands) driven by `act` (`reset(num_envs)` first, where given): fall
    rate, fraction of steps tracking, mean return (`Quadruped.measures`).

    `run_episodes` counts an episode a success if any step succeeds, which says little for locomotion; here
    every step counts (steps after a fall count as not tracking).
    """
    from robotrl.envs import make
    from robotrl.envs.rollouts import run_episodes

    env = make("Quadruped", num_envs=episodes, seed=seed)
    if reset is not None:
        reset(episodes)
    stats = run_episodes(env, act, episodes, seed=seed)
    env.close()
    measures = env.task.measures(stats)
    assert measures is not None
    return {**measures, "return": stats.mean_return}


if __name__ == "__main__":
    import json
    import sys

    levels = [float(a) for a in sys.argv[1:]] or [0.0, 0.1, 0.3]
    print(json.dumps({"policy": "zero", **tracking_stats("zero")}))
    for level in levels:
        print(json.dumps({"policy": "expert", "noise": level, **tracking_stats("expert", level)}))
