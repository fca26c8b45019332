"""Conversions between ROS 2 messages and numpy arrays, shared by the robot-side nodes (deploy, sim robot,
teleop recorder) so that every node reads and writes joints, images and commands the same way.

A message from the wire is untrusted: joints may come in any order, with extras (gripper fingers), and a
driver may publish garbage. Every reader here either returns an array of the promised shape and dtype with
finite values, or raises `MalformedMessage` naming the message type, the field, what was expected and what
was found. Plain numpy only (no cv_bridge, no OpenCV); this module imports ROS message classes, so it lives
in `robotrl.hardware`.

    position, velocity = joint_state_to_arrays(msg, robot.joint_names)
    rgb = image_to_array(image_msg, expected_shape=(224, 224, 3))
"""

from __future__ import annotations

import array
import math
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Point, PoseStamped, Quaternion, Twist, Vector3
from nav_msgs.msg import Odometry
from sensor_msgs.msg import Image, Imu, JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from robotrl.hardware.floating_base import BaseReading

__all__ = [
    "IMAGE_ENCODINGS",
    "MalformedMessage",
    "array_to_image",
    "arrays_to_joint_state",
    "float_array_to_msg",
    "image_to_array",
    "imu_msg",
    "imu_to_arrays",
    "joint_state_to_arrays",
    "joint_trajectory",
    "msg_to_float_array",
    "odometry_msg",
    "odometry_to_arrays",
    "pose_stamped",
    "pose_to_arrays",
    "seconds_to_stamp",
    "stamp_to_seconds",
    "trajectory_points",
    "trajectory_to_positions",
    "twist_msg",
    "twist_to_command",
]

_NS_PER_S = 1_000_000_000
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

#: the 8-bit encodings `image_to_array` reads: channels in the message, and which of them are R, G, B
IMAGE_ENCODINGS: dict[str, tuple[int, tuple[int, int, int]]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, (0, 0, 0)),
}


class MalformedMessage(ValueError):
    """A message from the wire that cannot be used; the text names the type, the field, expected and found."""

    def __init__(self, msg_type: str, field: str, expected: str, got: str) -> None:
        super().__init__(f"{msg_type}.{field}: expected {expected}, got {got}")
        self.msg_type = msg_type
        self.field = field


Stamp: TypeAlias = Time | float | None


# ----------------------------------------------------------------------------------------------- time stamps


def _split_seconds(seconds: float, what: str) -> tuple[int, int]:
    """(sec, nanosec) with 0 <= nanosec < 1e9, rounded to the nearest nanosecond (floor keeps negatives right)."""
    if not math.isfinite(seconds):
        raise ValueError(f"{what}: expected a finite number of seconds, got {seconds!r}")
    sec = math.floor(seconds)
    nanosec = round((seconds - sec) * _NS_PER_S)
    if nanosec >= _NS_PER_S:  # 1.9999999999 rounds up into the next second
        sec, nanosec = sec + 1, nanosec - _NS_PER_S
    if not _INT32_MIN <= sec <= _INT32_MAX:
        raise ValueError(f"{what}: expected seconds that fit an int32 sec field, got {seconds!r}")
    return sec, nanosec


def seconds_to_stamp(seconds: float) -> Time:
    """A `builtin_interfaces/Time` that converts back to the same float (to 1 ns, or exactly where a float
    cannot hold nanoseconds), so that stamps survive a trip through a dataset stored in float seconds."""
    sec, nanosec = _split_seconds(float(seconds), "seconds_to_stamp")
    return Time(sec=sec, nanosec=nanosec)


def stamp_to_seconds(t: Time | Duration) -> float:
    """Float seconds of a `Time` or `Duration`, the unit datasets and control loops use."""
    nanosec = int(t.nanosec)
    if not 0 <= nanosec < _NS_PER_S:
        raise MalformedMessage(type(t).__name__, "nanosec", "a value in [0, 1e9)", str(nanosec))
    return int(t.sec) + nanosec / _NS_PER_S


def _to_stamp(stamp: Stamp) -> Time:
    if stamp is None:
        return Time()
    if isinstance(stamp, Time):
        return stamp
    return seconds_to_stamp(stamp)


# ----------------------------------------------------------------------------------------------- helpers


def _float_field(values: object, msg_type: str, field: str) -> np.ndarray:
    """A float64 view of a `sequence<double>` field (array.array on the wire: no copy)."""
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as e:
        raise MalformedMessage(msg_type, field, "a sequence of floats", f"{type(values).__name__} ({e})") from None
    if out.ndim != 1:
        raise MalformedMessage(msg_type, field, "a flat sequence of floats", f"shape {out.shape}")
    return out


def _check_finite(values: np.ndarray, msg_type: str, field: str, names: Sequence[str] | None = None) -> None:
    if not np.all(np.isfinite(values)):
        bad = np.flatnonzero(~np.isfinite(values))
        where = [names[int(i)] for i in bad] if names is not None else bad.tolist()
        raise MalformedMessage(msg_type, field, "finite values", f"{values[bad].tolist()} at {where}")


def _check_joint_names(joint_names: Sequence[str]) -> list[str]:
    names = list(joint_names)
    if len(set(names)) != len(names):
        raise ValueError(f"joint_names: expected distinct names, got {names}")
    return names


def _joint_index(
    msg_names: Sequence[str], joint_names: list[str], msg_type: str, field: str, allow_extra: bool
) -> np.ndarray:
    """Where each of `joint_names` sits in the message's name list, so values can be gathered in our order."""
    got = list(msg_names)
    position = {name: i for i, name in enumerate(got)}
    if len(position) != len(got):
        dup = sorted({n for n in got if got.count(n) > 1})
        raise MalformedMessage(msg_type, field, "distinct joint names", f"{got} (duplicated: {dup})")
    missing = [n for n in joint_names if n not in position]
    wanted = set(joint_names)
    extra = [] if allow_extra else [n for n in got if n not in wanted]
    if missing or extra:
        detail = (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else "")
        scope = "(any order)" if not allow_extra else "(any order, extras ignored)"
        raise MalformedMessage(
            msg_type, field, f"the {len(joint_names)} joints {joint_names} {scope}", f"{got}{detail}"
        )
    return np.fromiter((position[n] for n in joint_names), dtype=np.intp, count=len(joint_names))


def _double_array(values: np.ndarray) -> array.array:
    """array.array('d') for a sequence<double> field: the setter accepts it without a per-element Python check."""
    out = array.array("d")
    out.frombytes(memoryview(np.ascontiguousarray(values, dtype=np.float64)).cast("B"))  # type: ignore[arg-type]  # see array_to_image
    return out


def _vector(values: object, n: int, what: str) -> np.ndarray:
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (n,):
        raise ValueError(f"{what}: expected shape ({n},), got {out.shape}")
    return out


# ----------------------------------------------------------------------------------------------- JointState


def joint_state_to_arrays(msg: JointState, joint_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """Positions and velocities in the order of `joint_names`, whatever order and extras the driver publishes.

    Drivers list joints in their own order and add joints the policy does not see (gripper fingers); the
    policy's spec fixes the order. Velocity is optional on the wire (empty -> None). Non-finite values of the
    joints we use are malformed: a NaN reaching the policy or the safety filter is worse than a dropped message.
    """
    names = _check_joint_names(joint_names)
    if not isinstance(msg, JointState):
        raise MalformedMessage("JointState", "<type>", "a sensor_msgs/msg/JointState", type(msg).__name__)
    index = _joint_index(msg.name, names, "JointState", "name", allow_extra=True)
    n_msg = len(msg.name)
    position = _float_field(msg.position, "JointState", "position")
    if position.shape[0] != n_msg:
        raise MalformedMessage("JointState", "position", f"{n_msg} values (one per name)", f"{position.shape[0]}")
    position = position[index]
    _check_finite(position, "JointState", "position", names)
    velocity = _float_field(msg.velocity, "JointState", "velocity")
    if velocity.shape[0] == 0:
        return position, None
    if velocity.shape[0] != n_msg:
        raise MalformedMessage("JointState", "velocity", f"0 or {n_msg} values (one per name)", f"{velocity.shape[0]}")
    velocity = velocity[index]
    _check_finite(velocity, "JointState", "velocity", names)
    return position, velocity


def arrays_to_joint_state(
    joint_names: Sequence[str],
    position: np.ndarray,
    velocity: np.ndarray | None = None,
    effort: np.ndarray | None = None,
    stamp: Stamp = None,
) -> JointState:
    """The JointState the sim robot and the teleop recorder publish, in the robot's joint order."""
    names = _check_joint_names(joint_names)
    n = len(names)
    msg = JointState(name=names, position=_double_array(_vector(position, n, "position")))
    if velocity is not None:
        msg.velocity = _double_array(_vector(velocity, n, "velocity"))
    if effort is not None:
        msg.effort = _double_array(_vector(effort, n, "effort"))
    msg.header.stamp = _to_stamp(stamp)
    return msg


# ----------------------------------------------------------------------------------------------- Image


def _image_bytes(data: object) -> np.ndarray:
    """The message's bytes as a flat uint8 view; no copy for the array.array that rclpy delivers."""
    try:
        if isinstance(data, (bytes, bytearray, memoryview, array.array)):
            return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        if isinstance(data, (list, tuple)):  # a list of ints (field checks turned off)
            return np.frombuffer(bytes(data), dtype=np.uint8)
        raise TypeError("not a byte sequence")
    except (TypeError, ValueError) as e:
        raise MalformedMessage("Image", "data", "bytes", f"{type(data).__name__} ({e})") from None


def image_to_array(msg: Image, expected_shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """A C-contiguous uint8 (H, W, 3) RGB array, the layout the policy's vision encoder takes.

    Row padding (`step` > width * channels) is skipped through strides, channels are reordered through a
    view, and the only copy is the result itself, which owns its memory and no longer depends on the message.
    """
    if not isinstance(msg, Image):
        raise MalformedMessage("Image", "<type>", "a sensor_msgs/msg/Image", type(msg).__name__)
    encoding = msg.encoding
    if encoding not in IMAGE_ENCODINGS:
        raise MalformedMessage("Image", "encoding", f"one of {sorted(IMAGE_ENCODINGS)}", repr(encoding))
    channels, rgb = IMAGE_ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise MalformedMessage("Image", "height/width", "a non-empty image", f"{height}x{width}")
    if expected_shape is not None and (height, width, 3) != tuple(expected_shape):
        expected = "x".join(str(n) for n in expected_shape)
        raise MalformedMessage("Image", "height/width", f"{expected} (HxWxC)", f"{height}x{width}x3")
    row = width * channels
    if step < row:
        raise MalformedMessage("Image", "step", f">= width * channels = {width} * {channels} = {row}", str(step))
    data = _image_bytes(msg.data)
    if data.shape[0] != step * height:
        raise MalformedMessage(
            "Image", "data", f"step * height = {step} * {height} = {step * height} bytes", f"{data.shape[0]} bytes"
        )
    pixels = data.reshape(height, step)[:, :row].reshape(height, width, channels)  # views, no copy
    if channels == 1:
        return np.repeat(pixels, 3, axis=2)
    view = pixels[..., :3] if rgb == (0, 1, 2) else pixels[..., 2::-1]
    return np.array(view, order="C")  # the one copy (even when the view is already contiguous)


def array_to_image(image: np.ndarray, encoding: str = "rgb8", stamp: Stamp = None, frame_id: str = "") -> Image:
    """The Image a simulated camera publishes from an RGB render (alpha 255; mono8 as BT.601 luma)."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(f"image: expected a non-empty uint8 (H, W, 3) RGB array, got {image.dtype} {image.shape}")
    if encoding not in IMAGE_ENCODINGS:
        raise ValueError(f"encoding: expected one of {sorted(IMAGE_ENCODINGS)}, got {encoding!r}")
    channels, rgb = IMAGE_ENCODINGS[encoding]
    height, width = image.shape[:2]
    if channels == 1:
        luma = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        pixels = np.clip(np.rint(luma), 0, 255).astype(np.uint8)
    elif encoding == "rgb8":
        pixels = image  # already in wire order: copied once, straight into the message
    else:
        pixels = np.empty((height, width, channels), dtype=np.uint8)
        pixels[..., list(rgb)] = image
        if channels == 4:
            pixels[..., 3] = 255
    data = array.array("B")
    # one copy into the message (numpy's stubs give ndarray __buffer__ only on Python >= 3.12)
    data.frombytes(memoryview(np.ascontiguousarray(pixels)).cast("B"))  # type: ignore[arg-type]
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=0, step=width * channels, data=data)
    msg.header.stamp = _to_stamp(stamp)
    msg.header.frame_id = frame_id
    return msg


# ----------------------------------------------------------------------------------------------- Float64MultiArray


def float_array_to_msg(values: np.ndarray, labels: Sequence[str] = ()) -> Float64MultiArray:
    """A dense Float64MultiArray (one layout dimension per axis, labelled by `labels`), the command of a
    ros2_controllers ForwardCommandController and a generic vector topic."""
    values = np.asarray(values, dtype=np.float64)
    labels = list(labels)
    if values.ndim == 0:
        raise ValueError("values: expected an array with at least one axis, got a scalar")
    if labels and len(labels) != values.ndim:
        raise ValueError(f"labels: expected one label per axis ({values.ndim}), got {labels}")
    labels = labels or [""] * values.ndim
    strides = np.cumprod(values.shape[::-1])[::-1]  # ROS stride: elements in this axis' slab
    msg = Float64MultiArray(data=_double_array(values.ravel()))
    msg.layout.dim = [
        MultiArrayDimension(label=label, size=int(size), stride=int(stride))
        for label, size, stride in zip(labels, values.shape, strides)
    ]
    msg.layout.data_offset = 0
    return msg


def msg_to_float_array(msg: Float64MultiArray, expected_size: int | None = None) -> np.ndarray:
    """The values of a Float64MultiArray, shaped by its layout (flat when it has none), as a new float64 array.

    The layout is honoured as ROS defines it: data starts at `data_offset`, and `dim[i + 1].stride` is the
    step between consecutive indices of axis i, so padded layouts read correctly.
    """
    if not isinstance(msg, Float64MultiArray):
        raise MalformedMessage("Float64MultiArray", "<type>", "a std_msgs/msg/Float64MultiArray", type(msg).__name__)
    data = _float_field(msg.data, "Float64MultiArray", "data")
    offset = int(msg.layout.data_offset)
    if offset > data.shape[0]:
        raise MalformedMessage(
            "Float64MultiArray", "layout.data_offset", f"<= len(data) = {data.shape[0]}", str(offset)
        )
    dims = list(msg.layout.dim)
    if not dims:
        values = data[offset:]
    else:
        shape = tuple(int(d.size) for d in dims)
        steps = [int(d.stride) for d in dims[1:]] + [1]
        for i, d in enumerate(dims):
            need = shape[i] * steps[i]
            if int(d.stride) < need and shape[i] > 0:
                raise MalformedMessage(
                    "Float64MultiArray", f"layout.dim[{i}].stride", f">= size * inner stride = {need}", str(d.stride)
                )
        size = math.prod(shape)
        extent = 0 if size == 0 else 1 + sum((n - 1) * s for n, s in zip(shape, steps))
        if data.shape[0] - offset < extent:
            raise MalformedMessage(
                "Float64MultiArray",
                "data",
                f"at least data_offset + {extent} = {offset + extent} values for sizes {list(shape)}",
                f"{data.shape[0]}",
            )
        window = data[offset : offset + extent] if size else data[:0]
        values = np.lib.stride_tricks.as_strided(
            window, shape=shape, strides=[s * data.itemsize for s in steps], writeable=False
        )
    if expected_size is not None and values.size != expected_size:
        raise MalformedMessage("Float64MultiArray", "data", f"{expected_size} values", f"{values.size}")
    out = np.array(values, dtype=np.float64, order="C")  # the one copy: the result owns its memory
    _check_finite(out.reshape(-1), "Float64MultiArray", "data")
    return out


# ----------------------------------------------------------------------------------------------- JointTrajectory


def joint_trajectory(
    joint_names: Sequence[str],
    positions: np.ndarray,
    time_from_start: float,
    stamp: Stamp = None,
    velocities: np.ndarray | None = None,
    period: float = 0.0,
) -> JointTrajectory:
    """The command of a ros2_controllers JointTrajectoryController: reach `positions` (n,) -- or each row of
    (k, n), one point every `period` seconds -- the first `time_from_start` seconds after `stamp` (a zero stamp
    means "now" to the controller), with `velocities` of the same shape where given."""
    names = _check_joint_names(joint_names)
    if not math.isfinite(time_from_start) or time_from_start < 0:
        raise ValueError(f"time_from_start: expected a finite number of seconds >= 0, got {time_from_start!r}")
    rows = np.atleast_2d(np.asarray(positions, dtype=np.float64))
    if rows.shape[0] > 1 and not (math.isfinite(period) and period > 0):
        raise ValueError(f"period: expected seconds > 0 between {rows.shape[0]} points, got {period!r}")
    speeds = None if velocities is None else np.atleast_2d(np.asarray(velocities, dtype=np.float64))
    if speeds is not None and speeds.shape != rows.shape:
        raise ValueError(f"velocities: expected the positions' shape {rows.shape}, got {speeds.shape}")
    points = []
    for k, row in enumerate(rows):
        sec, nanosec = _split_seconds(float(time_from_start + k * period), "time_from_start")
        point = JointTrajectoryPoint(
            positions=_double_array(_vector(row, len(names), "positions")),
            time_from_start=Duration(sec=sec, nanosec=nanosec),
        )
        if speeds is not None:
            point.velocities = _double_array(_vector(speeds[k], len(names), "velocities"))
        points.append(point)
    msg = JointTrajectory(joint_names=names, points=points)
    msg.header.stamp = _to_stamp(stamp)
    return msg


def trajectory_points(msg: JointTrajectory, joint_names: Sequence[str]) -> list[tuple[float, np.ndarray]]:
    """Every point as (time_from_start in seconds, positions in the order of `joint_names`); the times strictly
    increasing, as a JointTrajectoryController requires.

    Unlike a JointState, a command must name exactly the robot's joints: a command for a joint the robot
    lacks is a configuration error, not something to drop silently.
    """
    names = _check_joint_names(joint_names)
    if not isinstance(msg, JointTrajectory):
        raise MalformedMessage("JointTrajectory", "<type>", "a trajectory_msgs/msg/JointTrajectory", type(msg).__name__)
    index = _joint_index(msg.joint_names, names, "JointTrajectory", "joint_names", allow_extra=False)
    if not msg.points:
        raise MalformedMessage("JointTrajectory", "points", "at least one point", "none")
    out: list[tuple[float, np.ndarray]] = []
    for k, point in enumerate(msg.points):
        field = f"points[{k}].positions"
        positions = _float_field(point.positions, "JointTrajectory", field)
        if positions.shape[0] != len(names):
            expected = f"{len(names)} values (one per joint)"
            raise MalformedMessage("JointTrajectory", field, expected, str(positions.shape[0]))
        positions = positions[index]
        _check_finite(positions, "JointTrajectory", field, names)
        at = stamp_to_seconds(point.time_from_start)
        if out and at <= out[-1][0]:
            raise MalformedMessage(
                "JointTrajectory", f"points[{k}].time_from_start", f"> {out[-1][0]} s (increasing)", f"{at} s"
            )
        out.append((at, positions))
    return out


def trajectory_to_positions(msg: JointTrajectory, joint_names: Sequence[str]) -> np.ndarray:
    """The last point's positions (where the command ends) in the order of `joint_names`."""
    return trajectory_points(msg, joint_names)[-1][1]


# ----------------------------------------------------------------------------------------------- floating base


def _xyz(v: Vector3 | Point, msg_type: str, field: str) -> np.ndarray:
    out = np.array([v.x, v.y, v.z], dtype=np.float64)
    _check_finite(out, msg_type, field)
    return out


def _quat_wxyz(q: Quaternion, msg_type: str, field: str) -> np.ndarray:
    """A ROS quaternion (x, y, z, w) as a unit (w, x, y, z); one that is not of unit norm is malformed (an IMU
    that does not estimate its orientation sends all zeros, or -1 in its covariance)."""
    out = np.array([q.w, q.x, q.y, q.z], dtype=np.float64)
    _check_finite(out, msg_type, field)
    norm = float(np.linalg.norm(out))
    if abs(norm - 1.0) > 1e-3:
        raise MalformedMessage(msg_type, field, "a unit quaternion", f"norm {norm:.6g} ({out.tolist()}, w first)")
    return out


def _vector3(values: np.ndarray) -> Vector3:
    x, y, z = (float(v) for v in np.asarray(values, dtype=np.float64).reshape(3))
    return Vector3(x=x, y=y, z=z)


def _quaternion(wxyz: np.ndarray) -> Quaternion:
    w, x, y, z = (float(v) for v in np.asarray(wxyz, dtype=np.float64).reshape(4))
    return Quaternion(x=x, y=y, z=z, w=w)


def imu_msg(reading: BaseReading, stamp: Stamp = None, frame_id: str = "imu") -> Imu:
    """The Imu a floating base's driver publishes: orientation, angular velocity, linear acceleration."""
    msg = Imu(
        orientation=_quaternion(reading.orientation),
        angular_velocity=_vector3(reading.angular_velocity),
        linear_acceleration=_vector3(reading.linear_acceleration),
    )
    msg.header.stamp, msg.header.frame_id = _to_stamp(stamp), frame_id
    return msg


def imu_to_arrays(msg: Imu) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(orientation (w, x, y, z), angular velocity, linear acceleration) of an Imu, checked."""
    if not isinstance(msg, Imu):
        raise MalformedMessage("Imu", "<type>", "a sensor_msgs/msg/Imu", type(msg).__name__)
    return (
        _quat_wxyz(msg.orientation, "Imu", "orientation"),
        _xyz(msg.angular_velocity, "Imu", "angular_velocity"),
        _xyz(msg.linear_acceleration, "Imu", "linear_acceleration"),
    )


def odometry_msg(reading: BaseReading, stamp: Stamp = None, frame_id: str = "odom", child: str = "base") -> Odometry:
    """The Odometry a floating base's state estimator publishes: pose in `frame_id`, twist in the base frame."""
    msg = Odometry(child_frame_id=child)
    msg.header.stamp, msg.header.frame_id = _to_stamp(stamp), frame_id
    x, y, z = (float(v) for v in reading.position)
    msg.pose.pose.position = Point(x=x, y=y, z=z)
    msg.pose.pose.orientation = _quaternion(reading.orientation)
    msg.twist.twist.linear = _vector3(reading.linear_velocity)
    msg.twist.twist.angular = _vector3(reading.angular_velocity)
    return msg


def odometry_to_arrays(msg: Odometry) -> tuple[np.ndarray, np.ndarray]:
    """(base position, base linear velocity in the base frame) of an Odometry, checked."""
    if not isinstance(msg, Odometry):
        raise MalformedMessage("Odometry", "<type>", "a nav_msgs/msg/Odometry", type(msg).__name__)
    return (
        _xyz(msg.pose.pose.position, "Odometry", "pose.pose.position"),
        _xyz(msg.twist.twist.linear, "Odometry", "twist.twist.linear"),
    )


def twist_msg(command: np.ndarray) -> Twist:
    """A base velocity command (vx, vy, yaw rate) as the Twist of /cmd_vel."""
    vx, vy, wz = (float(v) for v in np.asarray(command, dtype=np.float64).reshape(3))
    return Twist(linear=Vector3(x=vx, y=vy, z=0.0), angular=Vector3(x=0.0, y=0.0, z=wz))


def twist_to_command(msg: Twist) -> np.ndarray:
    """(vx, vy, yaw rate) of a /cmd_vel Twist, checked (a planar base ignores linear.z, angular.x and .y)."""
    if not isinstance(msg, Twist):
        raise MalformedMessage("Twist", "<type>", "a geometry_msgs/msg/Twist", type(msg).__name__)
    out = np.array([msg.linear.x, msg.linear.y, msg.angular.z], dtype=np.float64)
    _check_finite(out, "Twist", "linear.x, linear.y, angular.z")
    return out


# ----------------------------------------------------------------------------------------------- object poses


def pose_stamped(
    position: np.ndarray, orientation: np.ndarray, stamp: Stamp = None, frame_id: str = "world"
) -> PoseStamped:
    """An object's pose (position, unit quaternion w first) as perception or motion capture publishes it."""
    msg = PoseStamped()
    msg.header.stamp, msg.header.frame_id = _to_stamp(stamp), frame_id
    x, y, z = (float(v) for v in np.asarray(position, dtype=np.float64).reshape(3))
    msg.pose.position = Point(x=x, y=y, z=z)
    msg.pose.orientation = _quaternion(orientation)
    return msg


def pose_to_arrays(msg: PoseStamped) -> tuple[np.ndarray, np.ndarray]:
    """(position, unit quaternion w first) of a PoseStamped, checked."""
    if not isinstance(msg, PoseStamped):
        raise MalformedMessage("PoseStamped", "<type>", "a geometry_msgs/msg/PoseStamped", type(msg).__name__)
    return (
        _xyz(msg.pose.position, "PoseStamped", "pose.position"),
        _quat_wxyz(msg.pose.orientation, "PoseStamped", "pose.orientation"),
    )
