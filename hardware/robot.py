"""A robot's configuration: its joints and their limits, the end-effector workspace, the topics its ROS 2 driver
offers and how it takes commands. One YAML file per robot in `hardware/robots/`; every hardware node (deploy,
sim robot, teleop) and the safety filter read the same file, so a launch file only names the robot.

    robot = RobotConfig.load("sim_panda")            # a bundled name, or a path to a YAML file

The file is checked as it is read: an unknown or missing key, a list of the wrong length, or a limit that
does not make sense (lower above upper, a non-positive velocity) is a `RobotConfigError` naming the file, the
field, what was expected and what was found. Torch-free and rclpy-free (the nodes import rclpy, not this).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from robotrl.envs.robots import (
    JointsDescription,
    RobotDescription,
    RobotDescriptionError,
    load_joints,
    load_robot,
)

#: the bundled robot files
ROBOTS_DIR = Path(__file__).with_name("robots")
#: how commands reach the driver: `trajectory_msgs/JointTrajectory` (a ros2_controllers
#: JointTrajectoryController) or `std_msgs/Float64MultiArray` (a ForwardCommandController of positions)
COMMAND_TYPES = ("joint_trajectory", "float64_multi_array")


class RobotConfigError(ValueError):
    """A robot file that cannot be used as it is; the message names the file and the field."""


@dataclass(frozen=True)
class JointLimits:
    """Per-joint limits, in the order of `RobotConfig.joint_names` (radians, seconds)."""

    lower: tuple[float, ...]
    upper: tuple[float, ...]
    velocity: tuple[float, ...]
    """max |q'| rad/s"""
    acceleration: tuple[float, ...]
    """max |q''| rad/s^2 (a floating base's: inf unless given; its joint targets are PD set-points, bounded by
    position and by the measured joint speed)"""
    estop_deceleration: tuple[float, ...] | None = None
    """rad/s^2 the e-stop brakes the commanded motion at (>= the acceleration limit): the safety filter publishes
    that ramp to rest, then nothing; None: the e-stop publishes nothing at once (the driver's own stop)"""


@dataclass(frozen=True)
class Workspace:
    """An axis-aligned box the end effector (tool point) must stay in, metres in the arm's base frame."""

    lower: tuple[float, float, float]
    upper: tuple[float, float, float]
    tool_offset: float = 0.0
    """flange to tool point along the flange's z (metres)"""


@dataclass(frozen=True)
class Topics:
    joint_states: str = "/joint_states"
    command: str = "/robotrl/joint_command"
    command_stamped: str = "/robotrl/joint_command_stamped"
    """sensor_msgs/JointState beside every command: its positions (and velocities), stamped with the joint state it
    was computed from -- for a monitor, a recorder or a latency bench to pair each command with its observation"""
    images: dict[str, str] = field(default_factory=dict)
    """observation key -> sensor_msgs/Image topic"""
    task_state: str = "/robotrl/task_state"
    """std_msgs/Float64MultiArray: the task's state observation as one vector (the sim robot's), where `objects`
    names no object poses"""
    objects: dict[str, str] | None = None
    """object (the task model's body name) -> geometry_msgs/PoseStamped topic of its pose in the world (the arm's
    base) frame, as perception or motion capture publishes it; given (`{}` for a task without objects: Reach), the
    task state is rebuilt from these poses and the goal instead of read from `task_state` (`hardware/objects.py`)"""
    goal: str = "/goal_pose"
    """geometry_msgs/PoseStamped: the goal of a task whose goal is a pose (PushT's target, Reach's point), with
    `objects`; RViz's goal tool publishes here"""
    instruction: str = "/robotrl/instruction"
    estop: str = "/robotrl/estop"
    diagnostics: str = "/diagnostics"
    imu: str = "/imu/data"
    """a floating-base robot's sensor_msgs/Imu (orientation, angular velocity in the base frame)"""
    odometry: str = "/odom"
    """a floating-base robot's nav_msgs/Odometry: base position, and velocity in the base frame (child_frame_id),
    from its state estimator"""
    cmd_vel: str = "/cmd_vel"
    """geometry_msgs/Twist: the base velocity command (linear x, y; angular z) an operator or a planner sends"""
    damping: str = "/robotrl/damping"
    """std_msgs/Bool to a floating-base robot's driver: True switches its motors to damping (no position gain,
    `base.damping` of velocity gain), the legged robot's safe stop; False back to position control"""


@dataclass(frozen=True)
class FloatingBase:
    """A robot on a floating base (a legged robot): what its safety needs besides the joint limits."""

    max_tilt: float
    """rad between the base's up axis and the world's up: beyond it the robot has fallen (damping)"""
    min_height: float
    """m: the base below this (its odometry's z) has fallen (damping)"""
    damping: float
    """N m s / rad: the motors' velocity gain in damping mode (the fall's and the e-stop's safe stop)"""
    cmd_vel_timeout: float = 0.5
    """s: a velocity command older than this is taken as zero (stand), as a twist watchdog does"""


@dataclass(frozen=True)
class RobotConfig:
    name: str
    joint_names: tuple[str, ...]
    limits: JointLimits
    workspace: Workspace | None = None
    model: str = ""
    """the robot's description (robotrl/envs/robots): a URDF or MJCF path (relative to this file), an
    `example-robot-data:<name>` robot, or `task:<arm task>`; joint names and position limits not given here are
    read from it, and the workspace is checked with its forward kinematics ('' = none: no workspace check)"""
    ee: str = ""
    """the model's end-effector body or site ('' = the description's own, e.g. tool0 of a UR)"""
    model_joints: tuple[str, ...] = ()
    """the model's names of `joint_names`, in their order, where the driver names them otherwise (e.g. fr3_joint1
    for panda_joint1); () = the same names"""
    command_type: str = "joint_trajectory"
    time_from_start: float = 0.1
    """joint_trajectory: when the command's first point is due (seconds; one control period puts the points on the
    control grid); the rest of the chunk being executed follows, a point every control period"""
    control_hz: float = 20.0
    """rate of the command timer"""
    resample_chunks: bool = False
    """a robotrl task's policy trained at another control rate runs here with its chunks resampled in time to this
    rate (`hardware/execution.py`: positions interpolated, per-step displacements divided among the steps) instead
    of being refused"""
    max_obs_age: float = 0.1
    """observations older than this (seconds) are stale: the node holds position"""
    topics: Topics = field(default_factory=Topics)
    description: str = ""
    base: FloatingBase | None = None
    """a floating base (legged robots): its IMU, odometry and velocity command are inputs, a fall or an e-stop
    switches it to damping; None: a fixed base (an arm)"""

    @property
    def dof(self) -> int:
        return len(self.joint_names)

    def load_model(self) -> RobotDescription:
        """The compiled description (`model`), its `ee` site at the workspace's tool point (compiled once)."""
        if not self.model:
            raise RobotConfigError(f"robot {self.name}: model: none given, so no description to load")
        offset = self.workspace.tool_offset if self.workspace is not None else 0.0
        return _load(self.model, self.ee or None, offset)

    def arm_indices(self) -> np.ndarray:
        """Where each joint of the description's arm (its chain to `ee`, in chain order) is in `joint_names`."""
        in_model = model_names(self.joint_names, self.model_joints)
        return np.array([in_model.index(j) for j in self.load_model().joint_names], dtype=np.int64)

    def lower(self) -> np.ndarray:
        return np.asarray(self.limits.lower, dtype=np.float64)

    def upper(self) -> np.ndarray:
        return np.asarray(self.limits.upper, dtype=np.float64)

    # --- reading -----------------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | Path) -> RobotConfig:
        """A bundled robot by name (`hardware/robots/<name>.yaml`) or any robot file by path."""
        path = Path(name_or_path)
        if path.suffix not in (".yaml", ".yml"):
            path = ROBOTS_DIR / f"{name_or_path}.yaml"
            if not path.exists():
                have = sorted(p.stem for p in ROBOTS_DIR.glob("*.yaml"))
                raise RobotConfigError(
                    f"robot {name_or_path!r}: expected a bundled robot {have} or a path to a .yaml file"
                )
        if not path.exists():
            raise RobotConfigError(f"{path}: no such robot file")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise RobotConfigError(f"{path}: not valid YAML ({e})") from e
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str = "robot") -> RobotConfig:
        d = _mapping(data, where)
        if "kinematics" in d:
            raise RobotConfigError(
                f"{where}: kinematics: not a field; the workspace check reads the robot's description: give model: "
                "(e.g. task:PushT, example-robot-data:ur5 or a URDF path)"
            )
        _known(d, {f.name for f in dataclasses.fields(cls)}, where)
        for key in ("name", "limits"):
            if key not in d:
                raise RobotConfigError(f"{where}: missing field {key!r}")
        model, ee = _model_source(d.get("model", ""), where), str(d.get("ee", ""))
        legged = d.get("base") is not None  # a floating base: every joint of the model, no end effector
        description = (_joints(model, where) if legged else _description(model, ee, d, where)) if model else None
        if "joint_names" not in d and description is None:
            raise RobotConfigError(f"{where}: missing field 'joint_names' (or a model to read them from)")
        names = d["joint_names"] if "joint_names" in d else list(description.joint_names)  # type: ignore[union-attr]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise RobotConfigError(f"{where}: joint_names: expected a non-empty list of names, got {names!r}")
        if len(set(names)) != len(names):
            raise RobotConfigError(f"{where}: joint_names: expected distinct names, got {names}")
        n = len(names)
        lim = _mapping(d["limits"], f"{where}: limits")
        _known(lim, {f.name for f in dataclasses.fields(JointLimits)}, f"{where}: limits")
        model_joints = d.get("model_joints", [])
        if model_joints and (not isinstance(model_joints, list) or len(model_joints) > n):
            raise RobotConfigError(f"{where}: model_joints: expected a list of at most {n} names, got {model_joints!r}")
        in_model = model_names(names, model_joints)
        if description is not None:
            for k, side in (("lower", 0), ("upper", 1)):
                if k not in lim:
                    lim = {**lim, k: [_model_range(description, j, where)[side] for j in in_model]}
        if d.get("base") is not None and "acceleration" not in lim:  # a floating base's targets are PD set-points
            lim = {**lim, "acceleration": [math.inf] * n}
        vec = {
            k: _floats(lim.get(k), n, f"{where}: limits.{k}", finite=k != "acceleration" or d.get("base") is None)
            for k in ("lower", "upper", "velocity", "acceleration")
        }
        bad = [i for i in range(n) if not vec["lower"][i] < vec["upper"][i]]
        if bad:
            raise RobotConfigError(
                f"{where}: limits: expected lower < upper for every joint, got lower "
                f"{vec['lower'][bad[0]]} >= upper {vec['upper'][bad[0]]} for {names[bad[0]]!r}"
            )
        for k in ("velocity", "acceleration"):
            if min(vec[k]) <= 0:
                raise RobotConfigError(f"{where}: limits.{k}: expected positive values, got {list(vec[k])}")
        if lim.get("estop_deceleration") is not None:
            stop = _floats(lim["estop_deceleration"], n, f"{where}: limits.estop_deceleration")
            if any(s < a for s, a in zip(stop, vec["acceleration"])):
                raise RobotConfigError(
                    f"{where}: limits.estop_deceleration: expected at least the acceleration limits "
                    f"{list(vec['acceleration'])} (only the e-stop stops harder), got {list(stop)}"
                )
            vec["estop_deceleration"] = stop
        workspace = None
        if d.get("workspace") is not None:
            w = _mapping(d["workspace"], f"{where}: workspace")
            _known(w, {f.name for f in dataclasses.fields(Workspace)}, f"{where}: workspace")
            lo, hi = (
                _floats(w.get("lower"), 3, f"{where}: workspace.lower"),
                _floats(w.get("upper"), 3, f"{where}: workspace.upper"),
            )
            if not all(a < b for a, b in zip(lo, hi)):
                raise RobotConfigError(f"{where}: workspace: expected lower < upper on every axis, got {lo} and {hi}")
            workspace = Workspace(lo, hi, _number(w.get("tool_offset", 0.0), f"{where}: workspace.tool_offset"))  # type: ignore[arg-type]
        if workspace is not None and description is None:
            raise RobotConfigError(f"{where}: workspace: needs a model (the robot's description) to be checked")
        if workspace is not None and legged:
            raise RobotConfigError(f"{where}: workspace: a floating base has no end-effector box; expected none")
        if description is not None:
            missing = [j for j in description.joint_names if j not in in_model]
            if missing:
                raise RobotConfigError(
                    f"{where}: joint_names: expected every joint of the model's {'robot' if legged else 'arm'} "
                    f"{list(description.joint_names)} "
                    f"(named by model_joints where the driver names them otherwise), missing {missing}"
                )
        command_type = d.get("command_type", "joint_trajectory")
        if command_type not in COMMAND_TYPES:
            raise RobotConfigError(f"{where}: command_type: expected one of {COMMAND_TYPES}, got {command_type!r}")
        positive = {
            k: _number(d.get(k, getattr(cls, k)), f"{where}: {k}")
            for k in ("time_from_start", "control_hz", "max_obs_age")
        }
        for k, v in positive.items():
            if v <= 0:
                raise RobotConfigError(f"{where}: {k}: expected a positive number, got {v}")
        base = None
        if d.get("base") is not None:
            b = _mapping(d["base"], f"{where}: base")
            _known(b, {f.name for f in dataclasses.fields(FloatingBase)}, f"{where}: base")
            missing_base = [k for k in ("max_tilt", "min_height", "damping") if k not in b]
            if missing_base:
                raise RobotConfigError(f"{where}: base: missing field(s) {missing_base}")
            values = {k: _number(v, f"{where}: base.{k}") for k, v in b.items()}
            if not (
                0 < values["max_tilt"] < math.pi and values["damping"] > 0 and values.get("cmd_vel_timeout", 1) > 0
            ):
                raise RobotConfigError(
                    f"{where}: base: expected 0 < max_tilt < pi, damping > 0, cmd_vel_timeout > 0, got {values}"
                )
            base = FloatingBase(**values)
        t = _mapping(d.get("topics", {}), f"{where}: topics")
        _known(t, {f.name for f in dataclasses.fields(Topics)}, f"{where}: topics")
        maps = ("images", "objects")  # name -> topic
        topic_values: dict[str, Any] = {k: _topic(v, f"{where}: topics.{k}") for k, v in t.items() if k not in maps}
        for m in maps:
            if m in t:
                named = _mapping(t[m], f"{where}: topics.{m}")
                topic_values[m] = {str(k): _topic(v, f"{where}: topics.{m}.{k}") for k, v in named.items()}
        topics = Topics(**topic_values)
        return cls(
            name=str(d["name"]),
            joint_names=tuple(names),
            limits=JointLimits(**vec),
            workspace=workspace,
            model=model,
            ee=ee,
            model_joints=tuple(model_joints),
            command_type=command_type,
            resample_chunks=_flag(d.get("resample_chunks", False), f"{where}: resample_chunks"),
            topics=topics,
            description=str(d.get("description", "")),
            base=base,
            **positive,
        )


def model_names(joint_names: Sequence[str], model_joints: Sequence[str]) -> list[str]:
    """The description's names of a robot file's joints: `model_joints` for the first ones, their own after."""
    return [*model_joints, *joint_names[len(model_joints) :]]


#: descriptions compiled once per process (a robot file is read by every node and the safety filter)
_load = functools.lru_cache(maxsize=16)(load_robot)


def _model_source(x: Any, where: str) -> str:
    """The description source with a relative file path made relative to the robot file's folder."""
    if not isinstance(x, str):
        raise RobotConfigError(f"{where}: model: expected a description (a path or name), got {x!r}")
    if x and ":" not in x and not Path(x).is_absolute() and Path(where).suffix in (".yaml", ".yml"):
        return str(Path(where).parent / x)
    return x


def _description(model: str, ee: str, d: dict[str, Any], where: str) -> RobotDescription:
    offset = d.get("workspace", {}).get("tool_offset", 0.0) if isinstance(d.get("workspace"), dict) else 0.0
    try:
        return _load(model, ee or None, _number(offset, f"{where}: workspace.tool_offset"))
    except RobotDescriptionError as e:
        raise RobotConfigError(f"{where}: model: {e}") from None


def _joints(model: str, where: str) -> JointsDescription:
    try:
        return _load_joints(model)
    except RobotDescriptionError as e:
        raise RobotConfigError(f"{where}: model: {e}") from None


_load_joints = functools.lru_cache(maxsize=16)(load_joints)


def _model_range(description: RobotDescription | JointsDescription, joint: str, where: str) -> tuple[float, float]:
    try:
        return description.joint_range(joint)
    except RobotDescriptionError as e:
        raise RobotConfigError(f"{where}: joint_names: {e}") from None


def _mapping(x: Any, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise RobotConfigError(f"{where}: expected a mapping, got {type(x).__name__} {x!r}")
    return x


def _known(d: dict[str, Any], names: set[str], where: str) -> None:
    unknown = sorted(set(d) - names)
    if unknown:
        raise RobotConfigError(f"{where}: unknown field(s) {unknown}; expected some of {sorted(names)}")


def _flag(x: Any, where: str) -> bool:
    if not isinstance(x, bool):
        raise RobotConfigError(f"{where}: expected true or false, got {x!r}")
    return x


def _number(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise RobotConfigError(f"{where}: expected a finite number, got {x!r}")
    return float(x)


def _floats(x: Any, n: int, where: str, finite: bool = True) -> tuple[float, ...]:
    if not isinstance(x, list) or len(x) != n:
        raise RobotConfigError(f"{where}: expected a list of {n} numbers (one per joint/axis), got {x!r}")
    return tuple(_number(v, f"{where}[{i}]") if finite or v != math.inf else v for i, v in enumerate(x))


def _topic(x: Any, where: str) -> str:
    if not isinstance(x, str) or not x.startswith("/") or " " in x:
        raise RobotConfigError(f"{where}: expected an absolute topic name like '/joint_states', got {x!r}")
    return x
