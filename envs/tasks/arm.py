"""The task suite's default arm: a 7-DoF arm with the Franka Panda's link frames and joint limits, as an MJCF
body tree, and the scene every arm task shares. Its kinematics are not written here: `ArmTask.arm` reads them from
the compiled scene (robotrl/envs/robots/kinematics.py), as it would for any other arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import mujoco
import numpy as np

from robotrl.envs.robots.kinematics import Chain, IKConfig
from robotrl.envs.task import Task, TaskConfig

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


@dataclass
class ArmConfig(TaskConfig):
    """Options of a task whose arm can be another robot's."""

    robot: str = ""
    """the arm: '' (the task suite's own) or a robot description (`example-robot-data:ur5`, a URDF/MJCF path)"""
    robot_base: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """where a loaded robot's base stands (metres): near enough that the task's workspace is in its reach"""


class ArmTask(Task):
    """A task of an arm: `self.arm` is the chain from the base to the scene's `ee` site (joints, limits, forward
    kinematics, Jacobian, IK), read from the task's compiled model, not written for one arm.

    The arm is the task suite's own unless the config's `robot` (Reach, PushT, PickPlace) names a description
    (robotrl/envs/robots: a URDF or MJCF file, `example-robot-data:ur5`): then the task's scene, built without its
    arm (`mjcf()` reads `config.robot`), gets that robot attached at `config.robot_base` with MuJoCo's
    model-editing API, its links gravity-compensated, a position actuator on each joint of its chain, the task's
    tool (`tool_xml`) on its end effector, and a start pose solved by the chain's IK: the tool pointing down at
    `ready_point`.

    A loaded robot's joints are servoed as a position-controlled arm's driver tracks its targets: stiff
    (`ROBOT_KP`) and critically damped, each joint's damping set from its inertia at the start pose, as passive
    joint damping (integrated implicitly, alike on the CPU and on MJX). The description's effort limits are not
    applied: they would clamp the drive of a step target while the damping still resists, and the arm would lag
    its targets by far more than a driver's tracking error."""

    #: flange (the robot's end-effector frame) to the tool point, along the frame's z
    tool_offset: ClassVar[float] = 0.1
    #: where a loaded robot starts, the tool pointing down (metres, world frame)
    ready_point: ClassVar[tuple[float, float, float]] = (0.45, 0.0, 0.35)

    def __init__(self, config: TaskConfig | None = None) -> None:
        super().__init__(config)
        self.arm = Chain(self.model, "ee")
        adr, dofs = [int(a) for a in self.arm.qpos_adr], [int(self.model.jnt_dofadr[j]) for j in self.arm.joint_ids]
        for where in (adr, dofs):
            if where != list(range(where[0], where[0] + len(where))):
                raise ValueError(f"{self.name}: expected the arm's joints in one run of qpos and qvel, got {where}")
        #: the arm's joints in qpos and qvel (first for the task suite's arm, after the task's objects for a
        #: loaded robot, which is attached to the finished scene)
        self.arm_q, self.arm_v = slice(adr[0], adr[0] + len(adr)), slice(dofs[0], dofs[0] + len(dofs))
        self.home = self._solve_home() if self.robot else HOME_QPOS
        if self.robot:
            self._damp_servos()

    @property
    def robot(self) -> str:
        return str(getattr(self.config, "robot", ""))

    def tool_xml(self) -> str:
        """Geoms of the task's tool, in the end-effector frame (its tool point `tool_offset` along z)."""
        return ""

    def compile(self) -> mujoco.MjModel:
        if not self.robot:
            return super().compile()
        from robotrl.envs.robots.description import EE_SITE, compile_robot, robot_spec

        robot, frame, name = robot_spec(self.robot, tool_offset=self.tool_offset)
        chain = compile_robot(robot, frame, name).chain  # the source, its ee and its chain checked in one line
        scene = mujoco.MjSpec.from_string(self.mjcf())
        for body in robot.bodies:
            body.gravcomp = 1.0  # as a torque-controlled arm's driver compensates gravity
        for geom in robot.geoms:  # only the task's tool touches (as the task arm's links): no mesh collisions
            geom.contype, geom.conaffinity = 0, 0
        for joint_name, (lo, hi) in zip(chain.joint_names, chain.limits):
            joint = robot.joint(joint_name)
            joint.armature = 0.1  # its damping is set from the compiled model (`_damp_servos`)
            joint.range, joint.limited = [lo, hi], mujoco.mjtLimited.mjLIMITED_TRUE
            joint.actfrclimited = mujoco.mjtLimited.mjLIMITED_FALSE
        ee = robot.site(EE_SITE)  # `tool_offset` along the end effector's z, as the task arm's `ee`
        ee.size, ee.rgba = [0.01, 0.01, 0.01], [1, 0, 0, 0.5]
        tool = self.tool_xml()
        if tool:  # in the end-effector frame: `tool_offset` back along the site's z
            rot = np.zeros(9)
            mujoco.mju_quat2Mat(rot, np.asarray(ee.quat, dtype=np.float64))
            origin = np.asarray(ee.pos) - rot.reshape(3, 3) @ np.array([0.0, 0.0, self.tool_offset])
            xml = f"<mujoco><worldbody><body name='tool'>{tool}</body></worldbody></mujoco>"
            frame = ee.parent.add_frame(pos=origin, quat=ee.quat)
            frame.attach_body(mujoco.MjSpec.from_string(xml).body("tool"), "tool/", "")
        base = [float(x) for x in getattr(self.config, "robot_base", (0.0, 0.0, 0.0))]
        scene.worldbody.add_frame(pos=base).attach_body(robot.worldbody.first_body(), ROBOT_PREFIX, "")
        for element in [*scene.joints, *scene.sites, *scene.geoms, *scene.cameras]:  # their own names, as written
            for prefix in (ROBOT_PREFIX + "tool/", ROBOT_PREFIX):
                if element.name.startswith(prefix):
                    element.name = element.name.removeprefix(prefix)
                    break
        for joint_name, (lo, hi) in zip(chain.joint_names, chain.limits):
            act = scene.add_actuator(name=f"act_{joint_name}", target=joint_name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
            act.set_to_position(kp=ROBOT_KP)
            act.ctrlrange, act.ctrllimited = [lo, hi], mujoco.mjtLimited.mjLIMITED_TRUE
        return scene.compile()

    def _damp_servos(self) -> None:
        """Each joint of the loaded robot critically damped about its servo: damping 2 sqrt(kp I), with I the
        joint's own inertia (armature included) at the start pose, the diagonal of the joint-space mass matrix."""
        data = mujoco.MjData(self.model)
        data.qpos[self.arm_q] = self.home
        mujoco.mj_forward(self.model, data)
        mass = np.zeros((self.model.nv, self.model.nv))
        mujoco.mj_fullM(self.model, data, mass)
        self.model.dof_damping[self.arm_v] = 2.0 * np.sqrt(ROBOT_KP * np.diag(mass)[self.arm_v])

    def _solve_home(self) -> np.ndarray:
        """The robot's start: from the middle of its joint ranges (nudged off the straight-arm singularity), the
        chain's IK to the tool pointing down at `ready_point`."""
        lo, hi = self.arm.limits.T
        q = (0.5 * (lo + hi) + 0.3)[None, :]
        target = np.array([self.ready_point])
        for _ in range(400):
            q = self.arm.ik(np, q, target, DOWN, q[0], IKConfig(damping=0.02, nullspace_gain=0.0))
        error = float(np.linalg.norm(self.arm.forward(np, q)[0][0] - target[0]))
        if error > 0.01:
            raise ValueError(
                f"{self.name}: robot {self.robot!r}: its tool cannot reach the task's ready point {self.ready_point} "
                f"pointing down ({error:.3f} m away)"
            )
        return q[0]


#: names of a loaded robot's elements in a task scene start with it (its joints keep their own names)
ROBOT_PREFIX = "robot/"
#: position-actuator stiffness of a loaded robot's joints (N m/rad; its links are gravity-compensated): with
#: critical damping, a joint settles on a step target within about one control period
ROBOT_KP = 10000.0


def chain(tool_offset: float) -> Chain:
    """The arm alone with its `ee` site `tool_offset` below the flange: its chain, for solving poses offline (a
    task's start configuration) without building a task."""
    body = arm_xml("", tool_offset)
    xml = f'<mujoco><compiler angle="radian" autolimits="true"/><worldbody>{body}</worldbody></mujoco>'
    return Chain(mujoco.MjModel.from_xml_string(xml), "ee")


def down_rotation(xp: Any, yaw: Any) -> Any:
    """Tool pointing straight down (tool z = -world z), turned by `yaw` about the world z axis."""
    c, s = xp.cos(yaw), xp.sin(yaw)
    z, o = xp.zeros_like(yaw), xp.ones_like(yaw)
    return xp.stack([c, s, z, s, -c, z, z, z, -o], -1).reshape(*yaw.shape, 3, 3)


#: the tool pointing straight down, unturned: one rotation for every env (a target that needs no per-env yaw)
DOWN = down_rotation(np, np.zeros(()))


def tool_yaw(xp: Any, rot: Any) -> Any:
    return xp.arctan2(rot[:, 1, 0], rot[:, 0, 0])


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
