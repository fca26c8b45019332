"""ROS 2 message <-> numpy conversions: round trips, reordering, every malformed case, and a fuzz test that
nothing but `MalformedMessage` ever comes out of a reader, whatever arrives on the wire."""

import array
import math

import numpy as np
import pytest
from builtin_interfaces.msg import Duration, Time
from hypothesis import given, settings, strategies as st
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from robotrl.hardware.messages import (
    MalformedMessage,
    array_to_image,
    arrays_to_joint_state,
    float_array_to_msg,
    image_to_array,
    joint_state_to_arrays,
    joint_trajectory,
    msg_to_float_array,
    seconds_to_stamp,
    stamp_to_seconds,
    trajectory_points,
    trajectory_to_positions,
)

JOINTS = [f"joint{i}" for i in range(1, 8)]
RNG = np.random.default_rng(0)


def _image(encoding, height, width, step, data):
    return Image(height=height, width=width, encoding=encoding, step=step, data=array.array("B", bytes(data)))


# ----------------------------------------------------------------------------------------------- time stamps


@pytest.mark.parametrize("seconds", [0.0, 1.5, 1.999999999, 0.000000001, 1_700_000_000.123456, 2**31 - 1.0, -0.25])
def test_seconds_stamp_round_trip(seconds):
    stamp = seconds_to_stamp(seconds)
    assert isinstance(stamp, Time)
    assert 0 <= stamp.nanosec < 1_000_000_000
    assert stamp_to_seconds(stamp) == seconds


def test_seconds_to_stamp_splits_and_rounds():
    assert (seconds_to_stamp(1.999999999).sec, seconds_to_stamp(1.999999999).nanosec) == (1, 999_999_999)
    up = seconds_to_stamp(1.9999999999)  # rounds to the next second, never nanosec == 1e9
    assert (up.sec, up.nanosec) == (2, 0)
    neg = seconds_to_stamp(-0.25)
    assert (neg.sec, neg.nanosec) == (-1, 750_000_000)


@settings(max_examples=200, deadline=None)
@given(sec=st.integers(0, 1_000_000), nanosec=st.integers(0, 999_999_999))
def test_stamp_seconds_round_trip_exact_to_the_nanosecond(sec, nanosec):
    back = seconds_to_stamp(stamp_to_seconds(Time(sec=sec, nanosec=nanosec)))
    assert (back.sec, back.nanosec) == (sec, nanosec)


@settings(max_examples=200, deadline=None)
@given(seconds=st.floats(0, 2**31 - 1, allow_nan=False))
def test_float_seconds_survive_a_stamp(seconds):
    back = stamp_to_seconds(seconds_to_stamp(seconds))
    assert abs(back - seconds) <= 1e-9
    if seconds >= 2**23:  # a float cannot hold nanoseconds there: the trip is exact
        assert back == seconds


def test_large_stamp_and_duration():
    assert stamp_to_seconds(Time(sec=1_700_000_000, nanosec=500_000_000)) == 1_700_000_000.5
    assert stamp_to_seconds(Duration(sec=3, nanosec=250_000_000)) == 3.25


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, 2.0**31, -(2.0**31) - 1])
def test_seconds_to_stamp_rejects_unrepresentable(seconds):
    with pytest.raises(ValueError, match="seconds"):
        seconds_to_stamp(seconds)


def test_stamp_with_nanosec_out_of_range_is_malformed():
    with pytest.raises(MalformedMessage, match=r"Time\.nanosec: expected a value in \[0, 1e9\)"):
        stamp_to_seconds(Time(sec=1, nanosec=1_000_000_000))


# ----------------------------------------------------------------------------------------------- JointState


def test_joint_state_round_trip():
    pos, vel, eff = RNG.normal(size=(3, 7))
    msg = arrays_to_joint_state(JOINTS, pos, vel, eff, stamp=12.5)
    assert list(msg.name) == JOINTS and list(msg.effort) == pytest.approx(eff)
    assert stamp_to_seconds(msg.header.stamp) == 12.5
    got_pos, got_vel = joint_state_to_arrays(msg, JOINTS)
    assert got_pos.dtype == np.float64 and got_pos.shape == (7,)
    np.testing.assert_array_equal(got_pos, pos)
    np.testing.assert_array_equal(got_vel, vel)


def test_joint_state_without_velocity_gives_none():
    msg = arrays_to_joint_state(JOINTS, np.zeros(7), stamp=Time(sec=3, nanosec=4))
    assert msg.header.stamp == Time(sec=3, nanosec=4)
    pos, vel = joint_state_to_arrays(msg, JOINTS)
    assert vel is None and pos.shape == (7,)


def test_joint_state_reorders_and_ignores_extra_joints():
    names = ["finger_left", "joint3", "joint1", "finger_right", "joint2"]
    msg = JointState(name=names, position=[9.0, 3.0, 1.0, 9.0, 2.0], velocity=[-9.0, -3.0, -1.0, -9.0, -2.0])
    pos, vel = joint_state_to_arrays(msg, ["joint1", "joint2", "joint3"])
    np.testing.assert_array_equal(pos, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(vel, [-1.0, -2.0, -3.0])


def test_joint_state_non_finite_extra_joint_is_ignored():
    msg = JointState(name=["joint1", "finger"], position=[1.0, math.nan])
    pos, _ = joint_state_to_arrays(msg, ["joint1"])
    np.testing.assert_array_equal(pos, [1.0])


@pytest.mark.parametrize(
    "msg, match",
    [
        (JointState(name=["a", "b"], position=[0.0] * 2), r"JointState\.name: expected the 7 joints.*got \['a', 'b'\]"),
        (JointState(name=JOINTS[:6], position=[0.0] * 6), r"JointState\.name: .*missing \['joint7'\]"),
        (JointState(name=JOINTS + ["joint1"], position=[0.0] * 8), r"JointState\.name: expected distinct .*joint1"),
        (JointState(name=JOINTS, position=[0.0] * 6), r"JointState\.position: expected 7 values .*got 6"),
        (JointState(name=JOINTS, position=[0.0] * 7, velocity=[0.0] * 3), r"JointState\.velocity: expected 0 or 7"),
        (JointState(name=JOINTS, position=[0.0] * 6 + [math.nan]), r"JointState\.position: expected finite .*joint7"),
        (JointState(name=JOINTS, position=[math.inf] + [0.0] * 6), r"JointState\.position: expected finite .*joint1"),
        (JointState(name=JOINTS, position=[0.0] * 7, velocity=[math.nan] * 7), r"JointState\.velocity: .*finite"),
        (String(data="hi"), r"JointState\.<type>: expected a sensor_msgs/msg/JointState, got String"),
    ],
)
def test_malformed_joint_state(msg, match):
    with pytest.raises(MalformedMessage, match=match):
        joint_state_to_arrays(msg, JOINTS)


def test_joint_state_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="joint_names: expected distinct"):
        joint_state_to_arrays(JointState(), ["a", "a"])
    with pytest.raises(ValueError, match=r"position: expected shape \(7,\)"):
        arrays_to_joint_state(JOINTS, np.zeros(6))


# ----------------------------------------------------------------------------------------------- Image


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
def test_image_round_trip(encoding):
    img = RNG.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    msg = array_to_image(img, encoding, stamp=2.0, frame_id="wrist_camera")
    assert (msg.height, msg.width, msg.encoding, msg.header.frame_id) == (6, 5, encoding, "wrist_camera")
    assert msg.step == 5 * len(encoding.rstrip("8")) and len(msg.data) == msg.step * 6
    out = image_to_array(msg, expected_shape=(6, 5, 3))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, img)


def test_image_from_a_non_contiguous_array():
    img = RNG.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)[:, ::2]
    np.testing.assert_array_equal(image_to_array(array_to_image(img)), img)


def test_mono8_round_trip_of_a_gray_image():
    gray = RNG.integers(0, 256, size=(4, 3, 1), dtype=np.uint8).repeat(3, axis=2)
    msg = array_to_image(gray, "mono8")
    assert msg.step == 3 and bytes(msg.data) == gray[..., 0].tobytes()
    np.testing.assert_array_equal(image_to_array(msg), gray)


def test_encoding_values():
    # one pixel (10, 20, 30) RGB, in each encoding's byte order
    pixel = {"rgb8": [10, 20, 30], "bgr8": [30, 20, 10], "rgba8": [10, 20, 30, 99], "bgra8": [30, 20, 10, 99]}
    for encoding, data in pixel.items():
        out = image_to_array(_image(encoding, 1, 1, len(data), data))
        assert out.tolist() == [[[10, 20, 30]]], encoding
    assert image_to_array(_image("mono8", 1, 2, 2, [7, 200])).tolist() == [[[7, 7, 7], [200, 200, 200]]]
    rgba = array_to_image(np.array([[[10, 20, 30]]], dtype=np.uint8), "bgra8")
    assert list(rgba.data) == [30, 20, 10, 255]


@pytest.mark.parametrize("encoding, channels", [("rgb8", 3), ("bgr8", 3), ("bgra8", 4), ("mono8", 1)])
def test_image_row_padding_is_skipped(encoding, channels):
    height, width, pad = 3, 4, 5
    rows = RNG.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    padded = np.concatenate([rows.reshape(height, -1), np.full((height, pad), 0xEE, np.uint8)], axis=1)
    out = image_to_array(_image(encoding, height, width, width * channels + pad, padded.tobytes()))
    order = {"rgb8": [0, 1, 2], "bgr8": [2, 1, 0], "bgra8": [2, 1, 0], "mono8": [0, 0, 0]}[encoding]
    np.testing.assert_array_equal(out, rows[..., order])
    assert out.flags.c_contiguous and out.shape == (height, width, 3)


def test_image_result_owns_its_memory():
    msg = _image("rgb8", 1, 1, 3, [1, 2, 3])
    out = image_to_array(msg)
    out[0, 0, 0] = 100
    assert msg.data[0] == 1


@pytest.mark.parametrize(
    "msg, expected_shape, match",
    [
        (_image("yuv422", 1, 1, 2, [0, 0]), None, r"Image\.encoding: expected one of .*'rgb8'.*got 'yuv422'"),
        (_image("rgb8", 2, 2, 6, [0] * 11), None, r"Image\.data: expected step \* height = 6 \* 2 = 12 bytes, got 11"),
        (_image("rgb8", 2, 2, 6, [0] * 13), None, r"Image\.data: expected .*12 bytes, got 13"),
        (_image("rgb8", 2, 2, 5, [0] * 10), None, r"Image\.step: expected >= width \* channels = 2 \* 3 = 6, got 5"),
        (_image("rgba8", 1, 2, 6, [0] * 6), None, r"Image\.step: expected >= .* = 8, got 6"),
        (_image("rgb8", 0, 2, 6, []), None, r"Image\.height/width: expected a non-empty image, got 0x2"),
        (_image("rgb8", 2, 0, 0, []), None, r"Image\.height/width: expected a non-empty image, got 2x0"),
        (_image("rgb8", 2, 2, 6, [0] * 12), (224, 224, 3), r"Image\.height/width: expected 224x224x3 .*got 2x2x3"),
        (String(data="x"), None, r"Image\.<type>: expected a sensor_msgs/msg/Image, got String"),
    ],
)
def test_malformed_image(msg, expected_shape, match):
    with pytest.raises(MalformedMessage, match=match):
        image_to_array(msg, expected_shape=expected_shape)


def test_array_to_image_rejects_bad_arrays():
    with pytest.raises(ValueError, match=r"image: expected a non-empty uint8 \(H, W, 3\)"):
        array_to_image(np.zeros((2, 2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"image: expected"):
        array_to_image(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match="encoding: expected one of"):
        array_to_image(np.zeros((2, 2, 3), dtype=np.uint8), "16UC1")


# ----------------------------------------------------------------------------------------------- Float64MultiArray


def test_float_array_round_trip():
    values = RNG.normal(size=7)
    msg = float_array_to_msg(values, ["joints"])
    assert [(d.label, d.size, d.stride) for d in msg.layout.dim] == [("joints", 7, 7)]
    out = msg_to_float_array(msg, expected_size=7)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, values)


def test_float_array_2d_round_trip():
    values = np.arange(6.0).reshape(2, 3)
    msg = float_array_to_msg(values, ["rows", "cols"])
    assert [(d.size, d.stride) for d in msg.layout.dim] == [(2, 6), (3, 3)]
    np.testing.assert_array_equal(msg_to_float_array(msg, expected_size=6), values)


def test_float_array_without_layout_and_with_offset():
    msg = Float64MultiArray(data=[99.0, 1.0, 2.0, 3.0])
    msg.layout.data_offset = 1
    np.testing.assert_array_equal(msg_to_float_array(msg, expected_size=3), [1.0, 2.0, 3.0])


def test_float_array_with_padded_layout():
    # a 2x2 matrix stored in rows of 3 (one pad value per row), after one value of offset
    msg = Float64MultiArray(data=[99.0, 1.0, 2.0, -1.0, 3.0, 4.0])
    msg.layout.data_offset = 1
    msg.layout.dim = [MultiArrayDimension(size=2, stride=6), MultiArrayDimension(size=2, stride=3)]
    out = msg_to_float_array(msg, expected_size=4)
    np.testing.assert_array_equal(out, [[1.0, 2.0], [3.0, 4.0]])
    assert out.flags.writeable and out.flags.c_contiguous


def _with_offset(msg, offset):
    msg.layout.data_offset = offset
    return msg


@pytest.mark.parametrize(
    "msg, expected_size, match",
    [
        (Float64MultiArray(data=[1.0, 2.0]), 3, r"Float64MultiArray\.data: expected 3 values, got 2"),
        (Float64MultiArray(data=[1.0, math.nan]), None, r"Float64MultiArray\.data: expected finite values"),
        (Float64MultiArray(data=[math.inf]), 1, r"Float64MultiArray\.data: expected finite"),
        (_with_offset(Float64MultiArray(data=[1.0]), 2), None, r"layout\.data_offset: expected <= len\(data\) = 1"),
        (_with_offset(float_array_to_msg(np.zeros(3)), 1), None, r"Float64MultiArray\.data: expected at least"),
        (String(data="x"), None, r"Float64MultiArray\.<type>: expected a std_msgs/msg/Float64MultiArray"),
    ],
)
def test_malformed_float_array(msg, expected_size, match):
    with pytest.raises(MalformedMessage, match=match):
        msg_to_float_array(msg, expected_size=expected_size)


def test_float_array_inconsistent_stride_is_malformed():
    msg = Float64MultiArray(data=[0.0] * 6)
    msg.layout.dim = [MultiArrayDimension(size=2, stride=6), MultiArrayDimension(size=3, stride=2)]
    with pytest.raises(MalformedMessage, match=r"layout\.dim\[1\]\.stride: expected >= size \* inner stride = 3"):
        msg_to_float_array(msg)


# ----------------------------------------------------------------------------------------------- JointTrajectory


def test_joint_trajectory_round_trip():
    positions = RNG.normal(size=7)
    msg = joint_trajectory(JOINTS, positions, 1.999999999, stamp=5.0)
    assert list(msg.joint_names) == JOINTS and len(msg.points) == 1
    assert msg.points[0].time_from_start == Duration(sec=1, nanosec=999_999_999)
    assert stamp_to_seconds(msg.header.stamp) == 5.0
    np.testing.assert_array_equal(trajectory_to_positions(msg, JOINTS), positions)


def test_trajectory_duration_split():
    assert joint_trajectory(["a"], [0.0], 0.1).points[0].time_from_start == Duration(sec=0, nanosec=100_000_000)
    assert joint_trajectory(["a"], [0.0], 2.5).points[0].time_from_start == Duration(sec=2, nanosec=500_000_000)
    with pytest.raises(ValueError, match="time_from_start"):
        joint_trajectory(["a"], [0.0], -1.0)
    with pytest.raises(ValueError, match=r"positions: expected shape \(2,\)"):
        joint_trajectory(["a", "b"], [0.0], 1.0)


def test_trajectory_reorders_and_takes_the_last_point():
    msg = JointTrajectory(
        joint_names=["b", "a"],
        points=[
            JointTrajectoryPoint(positions=[0.0, 0.0], time_from_start=Duration(nanosec=50_000_000)),
            JointTrajectoryPoint(positions=[2.0, 1.0], time_from_start=Duration(nanosec=100_000_000)),
        ],
    )
    np.testing.assert_array_equal(trajectory_to_positions(msg, ["a", "b"]), [1.0, 2.0])


def test_a_multi_point_trajectory_round_trips_on_its_grid_and_its_times_must_increase():
    q = np.array([[0.0, 1.0], [0.1, 1.1], [0.2, 1.2]])
    msg = joint_trajectory(["a", "b"], q, 0.05, velocities=np.ones((3, 2)), period=0.05)
    points = trajectory_points(msg, ["b", "a"])
    assert [round(at, 9) for at, _ in points] == [0.05, 0.1, 0.15]
    np.testing.assert_array_equal(np.stack([x for _, x in points]), q[:, ::-1])
    assert list(msg.points[2].velocities) == [1.0, 1.0]
    msg.points[2].time_from_start = msg.points[1].time_from_start
    with pytest.raises(MalformedMessage, match=r"JointTrajectory\.points\[2\]\.time_from_start: expected > 0\.1 s"):
        trajectory_points(msg, ["a", "b"])
    with pytest.raises(ValueError, match=r"period: expected seconds > 0 between 3 points"):
        joint_trajectory(["a", "b"], q, 0.05)


def _trajectory(names, *points):
    return JointTrajectory(joint_names=names, points=[JointTrajectoryPoint(positions=p) for p in points])


@pytest.mark.parametrize(
    "msg, match",
    [
        (_trajectory(["a", "c"], [0.0, 0.0]), r"JointTrajectory\.joint_names: expected the 2 joints .*missing \['b'\]"),
        (_trajectory(["a", "b", "c"], [0.0] * 3), r"JointTrajectory\.joint_names: .*unexpected \['c'\]"),
        (_trajectory(["a", "a"], [0.0] * 2), r"JointTrajectory\.joint_names: expected distinct"),
        (_trajectory(["a", "b"]), r"JointTrajectory\.points: expected at least one point, got none"),
        (_trajectory(["a", "b"], [0.0, 0.0], [0.0]), r"JointTrajectory\.points\[1\]\.positions: expected 2 values"),
        (_trajectory(["a", "b"], [0.0, math.nan]), r"JointTrajectory\.points\[0\]\.positions: expected finite .*'b'"),
        (String(data="x"), r"JointTrajectory\.<type>: expected a trajectory_msgs/msg/JointTrajectory"),
    ],
)
def test_malformed_trajectory(msg, match):
    with pytest.raises(MalformedMessage, match=match):
        trajectory_to_positions(msg, ["a", "b"])


# ----------------------------------------------------------------------------------------------- fuzz

_NAMES = st.sampled_from(["joint1", "joint2", "joint3", "finger", "", "x"])
_FLOATS = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def _wire_joint_states(draw):
    """Random names (duplicates, missing and extra joints), values with NaN/inf, lengths mostly consistent."""
    names = draw(st.lists(_NAMES, max_size=6, unique=draw(st.sampled_from([True, True, True, False]))))
    n_pos = draw(st.sampled_from([len(names)] * 3 + [draw(st.integers(0, 7))]))
    n_vel = draw(st.sampled_from([0, len(names), len(names), len(names), draw(st.integers(0, 7))]))
    finite = st.floats(-10, 10)
    values = st.one_of(finite, finite, finite, finite, finite, _FLOATS)
    position = draw(st.lists(values, min_size=n_pos, max_size=n_pos))
    velocity = draw(st.lists(values, min_size=n_vel, max_size=n_vel))
    # the joints asked for: mostly some of those published, sometimes any names
    published = sorted(set(names))
    ours = st.lists(st.sampled_from(published), max_size=3, unique=True) if published else st.just([])
    wanted = draw(st.one_of(ours, ours, st.lists(_NAMES, max_size=3, unique=True)))
    return JointState(name=names, position=position, velocity=velocity), wanted


@settings(max_examples=200, deadline=None)
@given(case=_wire_joint_states())
def test_fuzz_joint_state(case):
    msg, wanted = case
    try:
        pos, vel = joint_state_to_arrays(msg, wanted)
    except MalformedMessage:
        return
    assert pos.shape == (len(wanted),) and pos.dtype == np.float64 and np.all(np.isfinite(pos))
    if vel is not None:
        assert vel.shape == (len(wanted),) and vel.dtype == np.float64 and np.all(np.isfinite(vel))


@st.composite
def _wire_images(draw):
    """About half valid images (so the success path is exercised too), the rest with one or more fields wrong."""
    encoding = draw(st.sampled_from(["rgb8", "bgr8", "rgba8", "bgra8", "mono8"]))
    height, width = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    channels = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}[encoding]
    step = width * channels + draw(st.integers(0, 3))
    size = height * step
    for field in draw(st.sets(st.sampled_from(["encoding", "height", "width", "step", "size"]), max_size=3)):
        if draw(st.booleans()):  # leave it valid: no broken field in about half the cases
            continue
        if field == "encoding":
            encoding = draw(st.sampled_from(["yuv422", "RGB8", "", "16UC1", "rgb16"]))
        elif field == "height":
            height = draw(st.sampled_from([0, 7, 2**32 - 1]))
        elif field == "width":
            width = draw(st.sampled_from([0, 7, 2**32 - 1]))
        elif field == "step":
            step = draw(st.one_of(st.integers(0, 30), st.just(2**32 - 1)))
        else:
            size = draw(st.integers(0, 200))
    size = size if size <= 400 else draw(st.integers(0, 200))
    data = draw(st.binary(min_size=size, max_size=size))
    return _image(encoding, height, width, step, data)


@settings(max_examples=200, deadline=None)
@given(msg=_wire_images(), expected=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 6), st.just(3))))
def test_fuzz_image(msg, expected):
    try:
        out = image_to_array(msg, expected_shape=expected)
    except MalformedMessage:
        return
    assert out.shape == (msg.height, msg.width, 3) and out.dtype == np.uint8
    if expected is not None:
        assert out.shape == expected


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(_FLOATS, max_size=12),
    offset=st.integers(0, 14),
    dims=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 14)), max_size=3),
    expected=st.one_of(st.none(), st.integers(0, 12)),
)
def test_fuzz_float_array(data, offset, dims, expected):
    msg = Float64MultiArray(data=data)
    msg.layout.data_offset = offset
    msg.layout.dim = [MultiArrayDimension(size=size, stride=stride) for size, stride in dims]
    try:
        out = msg_to_float_array(msg, expected_size=expected)
    except MalformedMessage:
        return
    assert out.dtype == np.float64 and np.all(np.isfinite(out))
    if dims:
        assert out.shape == tuple(size for size, _ in dims)
    if expected is not None:
        assert out.size == expected
