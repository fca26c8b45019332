"""A 7-DoF arm with Franka Panda kinematics and joint limits, its MJCF, and an IK controller.

The forward kinematics and the damped-least-squares IK are written once against an array namespace `xp`
(numpy or jax.numpy), so the end-effector controller is the same code on the CPU and the MJX backend and
needs no MuJoCo call: the parity between the backends then only depends on the physics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# (name, body pos in parent, rotation about parent x in rad, joint range) — Panda link frames as in
# Franka's documented kinematics: each child frame is Trans(pos) * RotX(alpha), then the joint turns about z.
PANDA_LINKS: tuple[tuple[str, tuple[float, float, float], float, tuple[float, float]], ...] = (
    ("joint1", (0.0, 0.0, 0.333), 0.0, (-2.8973, 2.8973)),
    ("joint2", (0.0, 0.0, 0.0), -np.pi / 2, (-1.7628, 1.7628)),
    ("joint3", (0.0, -0.316, 0.0), np.pi / 2, (-2.8973, 2.8973)),
    ("joint4", (0.0825, 0.0, 0.0), np.pi / 2, (-3.0718, -0.0698)),
    ("joint5", (-0.0825, 0.384, 0.0), -np.pi / 2, (-2.8973, 2.8973)),
    ("joint6", (0.0, 0.0, 0.0), np.pi / 2, (-0.0175, 3.7525)),
    ("joint7", (0.088, 0.0, 0.0), np.pi / 2, (-2.8973, 2.8973)),
)
FLANGE_Z = 0.107
JOINT_NAMES = tuple(link[0] for link in PANDA_LINKS)
JOINT_LIMITS = np.array([link[3] for link in PANDA_LINKS])
HOME_QPOS = np.array([0.0, 0.2, 0.0, -2.2, 0.0, 2.4, np.pi / 4])
# Position-actuator stiffness per joint (N·m/rad) and joint damping: stiff enough to track a 20 Hz IK target.
# Links are gravity-compensated (`gravcomp`), as a torque-controlled arm's driver does, so targets carry no sag.
KP = (2000.0, 2000.0, 1500.0, 1500.0, 800.0, 800.0, 400.0)
DAMPING = (60.0, 60.0, 45.0, 45.0, 20.0, 20.0, 10.0)
LINK_RADIUS = (0.06, 0.06, 0.06, 0.055, 0.05, 0.045, 0.04)
LINK_MASS = (3.0, 3.0, 2.5, 2.5, 2.0, 1.5, 0.8)


def _quat_x(alpha: float) -> str:
    return f"{np.cos(alpha / 2):.9f} {np.sin(alpha / 2):.9f} 0 0"


def arm_xml(tool_xml: str, tool_offset: float, contacts: bool = False, rgba: str = "0.93 0.93 0.93 1") -> str:
    """MJCF `<body>` tree of the arm; `tool_xml` goes inside the flange body, whose `ee` site sits `tool_offset`
    below it.

    `contacts=False` makes the links visual only (cheaper, and MJX-friendly for tasks where only the tool touches).
    """
    con = "" if contacts else ' contype="0" conaffinity="0"'
    parts: list[str] = [
        '<body name="link0" pos="0 0 0">',
        f'<geom type="cylinder" size="0.07 0.05" pos="0 0 0.05" rgba="{rgba}"{con}/>',
    ]
    for i, (name, pos, alpha, (lo, hi)) in enumerate(PANDA_LINKS):
        r, mass = LINK_RADIUS[i], LINK_MASS[i]
        parts.append(
            f'<body name="link{i + 1}" pos="{pos[0]} {pos[1]} {pos[2]}" quat="{_quat_x(alpha)}" gravcomp="1">'
            f'<inertial pos="0 0 0" mass="{mass}" diaginertia="{0.02 * mass} {0.02 * mass} {0.01 * mass}"/>'
            f'<joint name="{name}" axis="0 0 1" range="{lo} {hi}" damping="{DAMPING[i]}" armature="0.1"/>'
            f'<geom type="capsule" size="{r}" fromto="0 0 -0.05 0 0 0.05" rgba="{rgba}"{con}/>'
        )
        # a visual segment towards the next link origin, so the rendered arm looks connected
        if i + 1 < len(PANDA_LINKS):
            nxt = PANDA_LINKS[i + 1][1]
            if np.linalg.norm(nxt) > 1e-6:
                parts.append(
                    f'<geom type="capsule" size="{r * 0.9}" fromto="0 0 0 {nxt[0]} {nxt[1]} {nxt[2]}" '
                    f'rgba="{rgba}"{con}/>'
                )
    parts.append(f'<body name="flange" pos="0 0 {FLANGE_Z}" gravcomp="1">')
    parts.append(f'<site name="ee" pos="0 0 {tool_offset}" size="0.01" rgba="1 0 0 0.5"/>')
    parts.append(tool_xml)
    parts.append("</body>")
    parts.append("</body>" * len(PANDA_LINKS))
    parts.append("</body>")
    return "\n".join(parts)


def arm_actuators_xml() -> str:
    """Joint-position actuators; their ctrl is the joint target that both action modes produce."""
    rows = []
    for i, (name, _, _, (lo, hi)) in enumerate(PANDA_LINKS):
        rows.append(f'<position name="act_{name}" joint="{name}" kp="{KP[i]}" ctrlrange="{lo} {hi}"/>')
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------------------
# Kinematics in any array namespace (numpy / jax.numpy), batched over a leading dimension.


def _cross(xp: Any, a: Any, b: Any) -> Any:
    """Cross product over the last axis (cheaper than np.cross for small batched arrays)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return xp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def forward_kinematics(xp: Any, q: Any, tool_offset: float) -> tuple[Any, Any, Any]:
    """Pose of the `ee` site and its geometric Jacobian for joint angles `q` (n, 7).

    Returns (pos (n, 3), rot (n, 3, 3), jac (n, 6, 7)) in the arm's base frame. The frame is carried as
    three column vectors so each link costs a few elementwise operations (this runs every control step).
    """
    n = q.shape[0]
    x = xp.zeros((n, 3)) + xp.asarray([1.0, 0.0, 0.0])
    y = xp.zeros((n, 3)) + xp.asarray([0.0, 1.0, 0.0])
    z = xp.zeros((n, 3)) + xp.asarray([0.0, 0.0, 1.0])
    pos = xp.zeros((n, 3))
    cq, sq = xp.cos(q)[:, :, None], xp.sin(q)[:, :, None]
    axes, origins = [], []
    for i, (_, p, alpha, _) in enumerate(PANDA_LINKS):
        pos = pos + p[0] * x + p[1] * y + p[2] * z
        if alpha != 0.0:
            ca, sa = float(np.cos(alpha)), float(np.sin(alpha))
            y, z = ca * y + sa * z, -sa * y + ca * z
        axes.append(z)
        origins.append(pos)
        x, y = cq[:, i] * x + sq[:, i] * y, -sq[:, i] * x + cq[:, i] * y
    ee = pos + (FLANGE_Z + tool_offset) * z
    zs, os_ = xp.stack(axes, axis=1), xp.stack(origins, axis=1)  # (n, 7, 3)
    jac_pos = _cross(xp, zs, ee[:, None, :] - os_)
    jac = xp.concatenate([xp.swapaxes(jac_pos, 1, 2), xp.swapaxes(zs, 1, 2)], axis=1)
    return ee, xp.stack([x, y, z], axis=-1), jac


def ee_position(q: Any, tool_offset: float) -> tuple[float, float, float]:
    """Position of the `ee` site for one configuration `q` (7,), the recurrence of `forward_kinematics` in plain
    floats: a robot's safety filter checks it every control period, where a batched numpy call for one
    configuration costs far more in array overhead than this loop (bench/RESULTS.md, "Measurements behind the
    code's design")."""
    x: tuple[float, ...] = (1.0, 0.0, 0.0)
    y: tuple[float, ...] = (0.0, 1.0, 0.0)
    z: tuple[float, ...] = (0.0, 0.0, 1.0)
    pos: tuple[float, ...] = (0.0, 0.0, 0.0)
    for i, (_, p, alpha, _) in enumerate(PANDA_LINKS):
        pos = tuple(pos[k] + p[0] * x[k] + p[1] * y[k] + p[2] * z[k] for k in range(3))
        if alpha != 0.0:
            ca, sa = math.cos(alpha), math.sin(alpha)
            y, z = tuple(ca * y[k] + sa * z[k] for k in range(3)), tuple(-sa * y[k] + ca * z[k] for k in range(3))
        c, s = math.cos(float(q[i])), math.sin(float(q[i]))
        x, y = tuple(c * x[k] + s * y[k] for k in range(3)), tuple(-s * x[k] + c * y[k] for k in range(3))
    d = FLANGE_Z + tool_offset
    return pos[0] + d * z[0], pos[1] + d * z[1], pos[2] + d * z[2]


def down_rotation(xp: Any, yaw: Any) -> Any:
    """Tool pointing straight down (tool z = -world z), turned by `yaw` about the world z axis."""
    c, s = xp.cos(yaw), xp.sin(yaw)
    z, o = xp.zeros_like(yaw), xp.ones_like(yaw)
    return xp.stack([xp.stack([c, s, z], -1), xp.stack([s, -c, z], -1), xp.stack([z, z, -o], -1)], -2)


def tool_yaw(xp: Any, rot: Any) -> Any:
    return xp.arctan2(rot[:, 1, 0], rot[:, 0, 0])


@dataclass(frozen=True)
class IKConfig:
    """Damped-least-squares differential IK, applied once per control step."""

    damping: float = 0.05
    nullspace_gain: float = 0.2
    max_joint_step: float = 0.25  # rad per control step; bounds what one command can ask of the arm


def ik_joint_targets(
    xp: Any,
    q: Any,
    target_pos: Any,
    target_yaw: Any,
    tool_offset: float,
    cfg: IKConfig = IKConfig(),
    fk: tuple[Any, Any, Any] | None = None,
) -> Any:
    """Joint targets that move the `ee` site towards (target_pos, pointing down at target_yaw).

    `fk` is `forward_kinematics(xp, q, tool_offset)` if the caller already has it.
    """
    pos, rot, jac = fk if fk is not None else forward_kinematics(xp, q, tool_offset)
    rot_d = down_rotation(xp, target_yaw)
    err_rot = 0.5 * _cross(xp, xp.swapaxes(rot, 1, 2), xp.swapaxes(rot_d, 1, 2)).sum(axis=1)
    err = xp.concatenate([target_pos - pos, err_rot], axis=-1)
    jac_t = xp.swapaxes(jac, 1, 2)
    jt_inv = jac_t @ xp.linalg.inv(jac @ jac_t + (cfg.damping**2) * xp.eye(6))  # J^T (J J^T + λ²I)^-1, (n, 7, 6)
    dq = (jt_inv @ err[:, :, None])[:, :, 0]
    home = (xp.asarray(HOME_QPOS) - q)[:, :, None]
    dq = dq + cfg.nullspace_gain * (home - jt_inv @ (jac @ home))[:, :, 0]
    dq = xp.clip(dq, -cfg.max_joint_step, cfg.max_joint_step)
    return xp.clip(q + dq, xp.asarray(JOINT_LIMITS[:, 0]), xp.asarray(JOINT_LIMITS[:, 1]))


def joint_targets_from_action(xp: Any, action: Any) -> Any:
    """`joint_pos` mode: an action in [-1, 1]^7 spans each joint's full range."""
    lo, hi = xp.asarray(JOINT_LIMITS[:, 0]), xp.asarray(JOINT_LIMITS[:, 1])
    return lo + 0.5 * (action[:, : len(PANDA_LINKS)] + 1.0) * (hi - lo)


def yaw_quat(xp: Any, yaw: Any) -> Any:
    """Quaternions (w, x, y, z) of rotations by `yaw` about the world z axis (any leading shape)."""
    zero = xp.zeros_like(yaw)
    return xp.stack([xp.cos(0.5 * yaw), zero, zero, xp.sin(0.5 * yaw)], -1)


EE_SENSOR = '<framepos name="ee_pos" objtype="site" objname="ee"/>'


def table_scene_xml(
    name: str, option: str, camera: str, bodies: str, actuators: str, table_contacts: bool = False, flags: str = ""
) -> str:
    """The MJCF every arm task shares: options, a textured table plane, a light, a camera, the `ee_pos` sensor.

    `option` holds the <option> attributes (timestep, solver iterations), `bodies` the arm and the task's objects.
    """
    con = 'contype="1" conaffinity="1"' if table_contacts else 'contype="0" conaffinity="0"'
    return f"""
<mujoco model="{name}">
  <compiler angle="radian" autolimits="true"/>
  <option {option} integrator="implicitfast">
    <flag eulerdamp="disable" {flags}/>
  </option>
  <visual><global offwidth="640" offheight="480"/></visual>
  <asset>
    <texture name="grid" type="2d" builtin="checker" rgb1=".55 .5 .45" rgb2=".5 .45 .4" width="256" height="256"/>
    <material name="table" texture="grid" texrepeat="6 6"/>
  </asset>
  <worldbody>
    <light pos="0.5 0 2.0" dir="0 0 -1" diffuse="0.7 0.7 0.7"/>
    <geom name="table" type="plane" size="1.2 1.2 0.05" material="table" {con}/>
    {camera}
    {bodies}
  </worldbody>
  <actuator>{actuators}</actuator>
  <sensor>{EE_SENSOR}</sensor>
</mujoco>"""
