"""`robotrl robot init`: a robot file (`hardware/robot.py`) written from a robot's description, so that a new arm
goes from its URDF to the deploy node and the sim robot without a hand-copied joint list.

    robotrl robot init --model example-robot-data:ur5 --out ur5.yaml
    robotrl robot init --model example-robot-data:go2 --legged --out go2.yaml   # a floating base: every joint
    robotrl robot init --task gym:Pendulum-v1 --out pendulum.yaml      # an outside env: its actions are the commands

The file names the description (`model:`), from which the joints and their position limits are read whenever the
file is loaded; it writes out what the description cannot say: velocity limits (a URDF's `<limit velocity>`, else a
placeholder), acceleration limits and the command interface, each marked for the user to check against the robot's
datasheet and driver.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from robotrl.core.spec import Spec
from robotrl.envs.robots import JointsDescription, RobotDescription, RobotDescriptionError, load_joints, load_robot
from robotrl.envs.robots.description import resolve

#: rad/s^2 per joint where nothing says better: gentle for an arm, to be replaced by the datasheet's
DEFAULT_ACCELERATION = 5.0
#: rad/s per joint where the description has no velocity limit (an MJCF)
DEFAULT_VELOCITY = 1.0


@dataclass
class RobotInit:
    """Write a robot file for a robot's description (its joints and limits read from it)."""

    model: str = ""
    """a URDF or MJCF path, example-robot-data:<name> (ur3, ur5, ur10, so100, so101, panda; legged: go1, go2) or
    task:<arm task>"""
    task: str | None = None
    """instead of a model: an outside env (gym:<id> or module:callable), whose robot commands its actions"""
    out: Path = Path("robot.yaml")
    """the robot file to write"""
    ee: str | None = None
    """the end-effector body or site (default: the description's own)"""
    legged: bool = False
    """a robot on a floating base (a legged one): every joint of the description, no end effector, and a `base`
    section (fall limits, damping) to check against the robot"""
    objects: str = ""
    """a robotrl task (an arm's) whose objects this cell's perception or motion capture tracks: the file names a
    geometry_msgs/PoseStamped topic per object (/mocap/<object>/pose) and the goal's (/goal_pose), from which the
    task state is rebuilt, instead of a task-state vector topic"""
    name: str | None = None
    """the robot's name (default: the file's stem)"""
    overwrite: bool = False
    """replace an existing file"""


def urdf_velocities(path: Path) -> dict[str, float]:
    """Joint name -> `<limit velocity>` of a URDF (joints without one left out)."""
    found: dict[str, float] = {}
    for joint in ET.parse(path).getroot().iter("joint"):
        limit = joint.find("limit")
        if limit is not None and joint.get("name") and limit.get("velocity"):
            found[str(joint.get("name"))] = float(str(limit.get("velocity")))
    return found


def velocities(source: str, joint_names: tuple[str, ...]) -> tuple[list[float], str]:
    """Per joint, the URDF's `<limit velocity>` (else the placeholder), and where they came from."""
    path, _, _ = resolve(source)
    urdf = urdf_velocities(path) if path is not None and path.suffix.lower() == ".urdf" else {}
    origin = "the URDF's <limit velocity>" if urdf else f"a placeholder of {DEFAULT_VELOCITY} rad/s"
    return [urdf.get(j, DEFAULT_VELOCITY) for j in joint_names], origin


def legged_robot_file(robot: JointsDescription, name: str) -> str:
    """The robot file's text for a legged robot: every joint of its description, a base section to check."""
    velocity, source = velocities(robot.source, robot.joint_names)
    data = {
        "name": name,
        "description": f"{robot.source}, on a floating base",
        "model": robot.source,
        "limits": {"velocity": velocity},
        "base": {"max_tilt": 1.0, "min_height": 0.15, "damping": 1.0, "cmd_vel_timeout": 0.5},
        "command_type": "float64_multi_array",
        "control_hz": 50.0,
        "max_obs_age": 0.04,
    }
    header = (
        f"# Robot file for {robot.source} on a floating base (robotrl robot init --legged). Joints, in this\n"
        f"# order, and their position limits are read from the description: {', '.join(robot.joint_names)}.\n"
        f"# Check against the robot's datasheet and driver: velocity limits ({source}; a measured joint\n"
        "# speed past one switches the motors to damping), the base section (the tilt in rad and the base height in m\n"
        "# at which it has fallen, the motors' damping gain in N m s/rad), command_type, control_hz and the topics of\n"
        "# the bridge that offers its joint states, IMU and odometry and takes joint position targets.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def object_topics(task: str) -> dict[str, str]:
    """A PoseStamped topic per object of a robotrl task, where a motion-capture driver (vrpn_mocap) publishes."""
    from robotrl.envs import make_task
    from robotrl.hardware.objects import task_objects

    return {name: f"/mocap/{name}/pose" for name in task_objects(make_task(task)).names}


def robot_file(robot: RobotDescription, name: str, objects: str = "") -> str:
    """The robot file's text for `robot`: its description and what the description does not hold; with a task's
    `objects`, their pose topics."""
    velocity, source = velocities(robot.source, robot.joint_names)
    data = {
        "name": name,
        "description": f"{robot.source}, end effector {robot.ee}",
        "model": robot.source,
        "ee": robot.ee,
        "limits": {"velocity": velocity, "acceleration": [DEFAULT_ACCELERATION] * len(velocity)},
        "command_type": "joint_trajectory",
        "time_from_start": 0.05,  # one control period: the chunk's points on the control grid
        "control_hz": 20.0,
        "max_obs_age": 0.1,
    }
    if objects:
        data["topics"] = {"objects": object_topics(objects), "goal": "/goal_pose"}
    header = (
        f"# Robot file for {robot.source} (robotrl robot init). Joints, in this order, and their position limits are\n"
        f"# read from the description: {', '.join(robot.joint_names)}.\n"
        f"# Check against the robot's datasheet and driver: velocity limits ({source}), acceleration limits\n"
        f"# (a placeholder of {DEFAULT_ACCELERATION} rad/s^2), command_type and topics, and add a workspace box for\n"
        "# the end effector (workspace: {lower: [x, y, z], upper: [x, y, z], tool_offset: m}).\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def env_robot_file(spec: Spec, name: str) -> str:
    """The robot file's text for an outside env: one command per action dimension, limited to the action space's
    bounds, at the env's control rate; rate limits that let a command cross its whole range in one period."""
    low, high = spec.action.low_array(), spec.action.high_array()
    if len(spec.action.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(
            f"RobotInit.task: {spec.task}: expected a flat action space with finite bounds (what a robot may be sent), "
            f"got shape {spec.action.shape}, low {low.tolist()}, high {high.tolist()}"
        )
    hz = spec.control_hz or 20.0
    span = (high - low).astype(float)
    data = {
        "name": name,
        "description": f"the actions of {spec.task}",
        "joint_names": [f"action_{i}" for i in range(len(span))],
        "limits": {
            "lower": low.astype(float).tolist(),
            "upper": high.astype(float).tolist(),
            "velocity": (2.0 * span * hz).tolist(),
            "acceleration": (4.0 * span * hz * hz).tolist(),
        },
        "command_type": "float64_multi_array",
        "control_hz": float(hz),
        "max_obs_age": 2.0 / hz,
    }
    rate = f"{spec.control_hz:g} Hz, the env's render_fps" if spec.control_hz else "20 Hz: the env names no rate"
    header = (
        f"# Robot file for the outside env {spec.task} (robotrl robot init --task). Its commands are the env's\n"
        f"# actions, limited to the action space's bounds; the rate limits let a command cross its range in one\n"
        f"# period ({rate}): tighten them to what the real actuators take.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def run_init(config: RobotInit) -> None:
    from robotrl.hardware.robot import RobotConfig

    if bool(config.model) == bool(config.task):
        raise ValueError(
            f"RobotInit: expected a --model (a robot's description) or a --task (an outside env), got model "
            f"{config.model!r} and task {config.task!r}"
        )
    if config.objects and (config.task or config.legged):
        raise ValueError(
            f"RobotInit.objects: the objects of an arm's task go with an arm's --model, got them with "
            f"{'--task ' + config.task if config.task else '--legged'}"
        )
    out = config.out
    if out.exists() and not config.overwrite:
        raise FileExistsError(f"RobotInit.out: {out} exists; pass --overwrite to replace it")
    blocked = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise NotADirectoryError(f"RobotInit.out: {blocked} is a file, not a folder to write {out.name} in")
    if config.task:
        from robotrl.envs import is_outside, spec_of

        if not is_outside(config.task):
            raise ValueError(
                f"RobotInit.task: expected an outside env (gym:<id> or module:callable), got {config.task!r}; a "
                f"robotrl task's arm is --model task:{config.task}"
            )
        spec = spec_of(config.task)
        text, what = env_robot_file(spec, config.name or out.stem), f"{spec.action.size} actions of {spec.task}"
    elif config.legged:
        try:
            legs = load_joints(config.model)
        except RobotDescriptionError as e:
            raise RobotDescriptionError(f"RobotInit.model: {e}") from None
        text = legged_robot_file(legs, config.name or out.stem)
        what = f"{len(legs.joint_names)} joints of {legs.source} on a floating base"
    else:
        try:
            robot = load_robot(config.model, config.ee)
        except RobotDescriptionError as e:
            raise RobotDescriptionError(f"RobotInit.model: {e}") from None
        text = robot_file(robot, config.name or out.stem, config.objects)
        what = f"{len(robot.joint_names)} joints of {robot.source}, end effector {robot.ee}"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.yaml")
    try:
        tmp.write_text(text)
        RobotConfig.load(tmp)  # the file it writes is one the nodes read
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"robot file {out}: {what}")
