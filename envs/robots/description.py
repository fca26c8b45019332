"""Robots from their description files: a URDF or an MJCF of the user's own, one that the `example-robot-data`
package ships (`example-robot-data:ur5`, `...:so101`, `...:panda`, or a path inside the package), or the arm of a
robotrl task's scene (`task:PushT`). MuJoCo compiles it; joint names, limits and the end-effector frame are read
from the compiled model, and the end effector becomes a site named `ee` that kinematics and workspace checks use.

    robot = load_robot("example-robot-data:ur5")      # ee: the UR's tool0 frame
    robot.joint_names, robot.limits                   # the chain from the base to `ee`
    robot.ee_position(q)                              # MuJoCo's own mj_kinematics
    legs = load_joints("example-robot-data:go2")      # a legged robot: every joint, no end effector

URDF files are read as ROS tools read them: `package://<name>/...` mesh paths resolve against
`example-robot-data`'s robots folder and the folders above the file; visual-only meshes (COLLADA, which MuJoCo cannot
read) are dropped, and fixed links are kept as bodies so that frames such as `tool0` stay addressable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import mujoco
import numpy as np

from robotrl.envs.robots.kinematics import Chain, joint_range

PACKAGE = "example-robot-data"
#: short names of robots in example-robot-data: (file inside its robots folder, end-effector body)
EXAMPLE_ROBOTS: dict[str, tuple[str, str | None]] = {
    "panda": ("panda_description/urdf/panda.urdf", "panda_hand"),
    "ur3": ("ur_description/urdf/ur3_robot.urdf", "tool0"),
    "ur5": ("ur_description/urdf/ur5_robot.urdf", "tool0"),
    "ur10": ("ur_description/urdf/ur10_robot.urdf", "tool0"),
    "so100": ("so_arm_description/urdf/so100.urdf", "Fixed_Jaw"),
    "so101": ("so_arm_description/urdf/so101.urdf", "gripper_frame_link"),
    "go1": ("go1_description/urdf/go1.urdf", None),  # legged: `load_joints`
    "go2": ("go2_description/urdf/go2.urdf", None),
}
EE_SITE = "ee"


class RobotDescriptionError(ValueError):
    """A description that cannot be loaded as it is; the message names the source and what was wrong."""


def example_robot_data() -> Path:
    """The robots folder of the installed `example-robot-data` package (a data-only wheel: no Python module)."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RobotDescriptionError(f"{PACKAGE} is not installed: pip install {PACKAGE} (or robotrl[robots])") from None
    return Path(str(dist.locate_file(f"cmeel.prefix/share/{PACKAGE}/robots")))


def resolve(source: str | Path) -> tuple[Path | None, str | None, str]:
    """(file, default end effector, the source's canonical name) for `source`; file None for `task:<Name>`."""
    text = str(source)
    if text.startswith("task:"):
        return None, EE_SITE, text
    if text.startswith(f"{PACKAGE}:"):
        name = text.split(":", 1)[1]
        rel, ee = EXAMPLE_ROBOTS.get(name, (name, None))
        path = example_robot_data() / rel
        if not path.is_file():
            raise RobotDescriptionError(
                f"robot {text!r}: expected one of {sorted(EXAMPLE_ROBOTS)} or a file under {example_robot_data()}"
            )
        return path, ee, text
    path = Path(text).expanduser()
    if path.suffix.lower() not in (".urdf", ".xml", ".mjcf"):
        raise RobotDescriptionError(
            f"robot {text!r}: expected a .urdf or .xml (MJCF) file, {PACKAGE}:<name> with a name of "
            f"{sorted(EXAMPLE_ROBOTS)}, or task:<arm task>"
        )
    if not path.is_file():
        raise RobotDescriptionError(f"robot {text!r}: no such file")
    return path.resolve(), None, str(path.resolve())


def _urdf_text(path: Path) -> str:
    """The URDF with `package://` paths made absolute, visual-only meshes dropped and fixed links kept."""
    text = path.read_text()
    roots = [example_robot_data().parent.parent] if "package://" in text else []
    roots += list(path.parents)

    def absolute(match: re.Match[str]) -> str:
        package, rest = match.group(1), match.group(2)
        for root in roots:
            for candidate in (root / package / rest, root / rest):
                if candidate.is_file():
                    return str(candidate)
        raise RobotDescriptionError(f"{path}: mesh package://{package}/{rest} not found under {roots[0]}")

    text = re.sub(r"<visual\b.*?</visual>", "", text, flags=re.S)
    text = re.sub(r"<gazebo\b.*?</gazebo>", "", text, flags=re.S)
    text = re.sub(r"package://([^/\"]+)/([^\"]+)", absolute, text)
    compiler = '<mujoco><compiler fusestatic="false" discardvisual="false" strippath="false"/></mujoco>'
    return re.sub(r"(<robot\b[^>]*>)", rf"\1{compiler}", text, count=1)


def load_spec(source: str | Path) -> tuple[mujoco.MjSpec, str | None, str]:
    """The description as an editable MjSpec, its default end effector and its canonical source name."""
    path, ee, name = resolve(source)
    if path is None:
        from robotrl.envs import make_task

        try:
            task = make_task(name.split(":", 1)[1])
        except (KeyError, ValueError) as e:
            raise RobotDescriptionError(f"robot {name!r}: {e}") from None
        return mujoco.MjSpec.from_string(task.mjcf()), ee, name
    try:
        if path.suffix.lower() == ".urdf":
            return mujoco.MjSpec.from_string(_urdf_text(path)), ee, name
        return mujoco.MjSpec.from_file(str(path)), ee, name
    except ValueError as e:  # MuJoCo's compiler error: one line naming the file
        raise RobotDescriptionError(f"{name}: MuJoCo cannot read it: {str(e).splitlines()[0]}") from None


@dataclass(frozen=True)
class RobotDescription:
    """A compiled robot: its model (with the `ee` site), the chain from its base to `ee` and that chain's joints."""

    source: str
    model: mujoco.MjModel
    ee: str

    @cached_property
    def chain(self) -> Chain:
        return Chain(self.model, EE_SITE)

    @property
    def joint_names(self) -> tuple[str, ...]:
        return self.chain.joint_names

    @property
    def limits(self) -> np.ndarray:
        """(dof, 2) lower and upper joint positions of the chain."""
        return self.chain.limits

    def joint_range(self, name: str) -> tuple[float, float]:
        """Any hinge or slide joint of the model (a gripper's fingers too), by name."""
        jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0 or int(self.model.jnt_type[jid]) not in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
            raise RobotDescriptionError(f"{self.source}: no hinge or slide joint named {name!r}")
        return joint_range(self.model, jid)

    @cached_property
    def _data(self) -> mujoco.MjData:
        return mujoco.MjData(self.model)

    def ee_pose(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The `ee` site's position (3,) and rotation (3, 3) at the chain's joint positions `q` (dof,), by MuJoCo's
        own `mj_kinematics` (one configuration: what a robot's safety filter checks every period)."""
        data = self._data
        data.qpos[self.chain.qpos_adr] = q
        mujoco.mj_kinematics(self.model, data)
        sid = self.model.site(EE_SITE).id
        return data.site_xpos[sid].copy(), data.site_xmat[sid].reshape(3, 3).copy()

    def ee_position(self, q: np.ndarray) -> np.ndarray:
        return self.ee_pose(q)[0]


def _compile(spec: mujoco.MjSpec, name: str) -> mujoco.MjModel:
    try:
        return spec.compile()
    except ValueError as e:
        raise RobotDescriptionError(f"{name}: MuJoCo cannot compile it: {str(e).splitlines()[0]}") from None


def robot_spec(source: str | Path, ee: str | None = None, tool_offset: float = 0.0) -> tuple[mujoco.MjSpec, str, str]:
    """The description as an editable MjSpec with an `ee` site on the body (or at the site) named `ee` (default:
    the source's known end effector, or an existing `ee` site), `tool_offset` metres along that frame's z; the
    end-effector frame's name and the source's canonical name."""
    spec, default, name = load_spec(source)
    frame = ee or default
    if frame is None:
        raise RobotDescriptionError(f"robot {name!r}: ee: expected the end effector's body or site name, got none")
    site, body = spec.site(frame), spec.body(frame)
    if site is None and body is None:
        raise RobotDescriptionError(f"robot {name!r}: ee: no body or site named {frame!r}")
    if site is not None:  # at that site, moved along its z: its pose as compiled (any orientation form)
        compiled = _compile(spec, name).site(frame)
        rot = np.zeros(9)
        mujoco.mju_quat2Mat(rot, compiled.quat)
        pos = compiled.pos + rot.reshape(3, 3) @ np.array([0.0, 0.0, tool_offset])
        if frame == EE_SITE:
            site.pos, site.quat, site.alt.type = pos, compiled.quat, mujoco.mjtOrientation.mjORIENTATION_QUAT
        else:
            site.parent.add_site(name=EE_SITE, pos=pos, quat=compiled.quat)
    else:
        body.add_site(name=EE_SITE, pos=[0.0, 0.0, tool_offset])
    return spec, frame, name


def compile_robot(spec: mujoco.MjSpec, frame: str, name: str) -> RobotDescription:
    """The description `robot_spec` made, compiled (the spec stays editable); one line if no joint moves `ee`."""
    robot = RobotDescription(name, _compile(spec, name), frame)
    if not robot.chain.dof:
        raise RobotDescriptionError(f"robot {name!r}: ee: no joint moves {frame!r}")
    return robot


@dataclass(frozen=True)
class JointsDescription:
    """A compiled robot without an end effector (a legged robot): its hinge and slide joints, in model order."""

    source: str
    model: mujoco.MjModel

    @property
    def joint_names(self) -> tuple[str, ...]:
        kinds = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
        return tuple(self.model.joint(j).name for j in range(self.model.njnt) if int(self.model.jnt_type[j]) in kinds)

    def joint_range(self, name: str) -> tuple[float, float]:
        if name not in self.joint_names:
            raise RobotDescriptionError(f"{self.source}: no hinge or slide joint named {name!r}")
        return joint_range(self.model, self.model.joint(name).id)


def load_joints(source: str | Path) -> JointsDescription:
    """Compile a robot description as it is, for its joints and their limits (no end effector: a legged robot)."""
    spec, _, name = load_spec(source)
    description = JointsDescription(name, _compile(spec, name))
    if not description.joint_names:
        raise RobotDescriptionError(f"robot {name!r}: no hinge or slide joint")
    return description


def load_robot(source: str | Path, ee: str | None = None, tool_offset: float = 0.0) -> RobotDescription:
    """Compile a robot description with its `ee` site (`robot_spec`)."""
    return compile_robot(*robot_spec(source, ee, tool_offset))
