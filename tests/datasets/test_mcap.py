"""MCAP (ROS 2) export/import: exact round trips, a file an independent ROS 2 reader decodes, zero-order-hold
resampling of a foreign recording, and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from mcap_ros2.writer import Writer as Ros2Writer
from rosbags.typesys import Stores, get_typestore

from robotrl.core.spec import ArraySpec, Spec
from robotrl.datasets.mcap import McapError, TopicMap, export_mcap, import_mcap
from robotrl.datasets.record import record_expert
from robotrl.datasets.store import EpisodeStore, user_meta

ARM = tuple(f"joint{i}" for i in range(1, 8))
ROS_TYPES = get_typestore(Stores.ROS2_HUMBLE)


@pytest.fixture(scope="module")
def pusht(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    return record_expert(
        tmp_path_factory.mktemp("p") / "pusht.zarr", "PushT", 3, num_envs=2, episode_steps=20, progress=False
    )


@pytest.fixture(scope="module")
def pickplace(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    return record_expert(
        tmp_path_factory.mktemp("pp") / "pickplace.zarr", "PickPlace", 2, num_envs=2, episode_steps=20, progress=False
    )


def assert_same_episodes(a: EpisodeStore, b: EpisodeStore, timestamps: bool = False) -> None:
    assert b.num_episodes == a.num_episodes
    for i in range(a.num_episodes):
        ea, eb = a.episode(i), b.episode(i)
        for key in ea.data:
            if key == "timestamp" and not timestamps:
                continue
            np.testing.assert_array_equal(eb.data[key], ea.data[key], err_msg=f"episode {i} key {key}")
        for key in ("instruction", "success", "source", "noise"):
            assert eb.meta.get(key) == ea.meta.get(key), (i, key)


# ---------------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pusht", "pickplace"])
def test_round_trip_is_exact(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    store = request.getfixturevalue(name)
    path = export_mcap(store, tmp_path / "rec.mcap")
    back = import_mcap(path, tmp_path / "back.zarr", store.spec)
    assert_same_episodes(store, back)
    assert back.spec == store.spec
    assert [len(e) for e in back] == [len(e) for e in store]
    # sim steps run faster than real time: steps were laid on the control-rate grid
    for e in back:
        np.testing.assert_allclose(np.diff(e.data["timestamp"]), 1 / store.spec.control_hz, atol=1e-6)
        assert e.data["terminated"][-1] or e.data["truncated"][-1]


def test_subset_of_episodes_and_rosbag2_folder(pusht: EpisodeStore, tmp_path: Path) -> None:
    bag = tmp_path / "bag"
    export_mcap(pusht.path, bag / "bag_0.mcap", episodes=[2, 0])
    back = import_mcap(bag, tmp_path / "back.zarr", pusht.spec)  # a rosbag2 folder is read as its .mcap files
    assert back.num_episodes == 2
    for j, i in enumerate([2, 0]):
        np.testing.assert_array_equal(back.episode(j).data["state"], pusht.episode(i).data["state"])
        np.testing.assert_array_equal(back.episode(j).data["action"], pusht.episode(i).data["action"])
    # a recording already there is never overwritten
    before = (bag / "bag_0.mcap").read_bytes()
    with pytest.raises(FileExistsError, match="bag_0.mcap: exists; refusing to write an MCAP recording over it"):
        export_mcap(pusht.path, bag / "bag_0.mcap", episodes=[1])
    assert (bag / "bag_0.mcap").read_bytes() == before


def test_recorded_clock_keeps_jittered_stamps_and_round_trips_exactly(pusht: EpisodeStore, tmp_path: Path) -> None:
    """Real-time data (a teleop session) keeps its wall-clock stamps; read back at its own rate it is exact."""
    rng = np.random.default_rng(0)
    real = EpisodeStore.create(tmp_path / "real.zarr", pusht.spec)
    t0 = 1.7e9
    for i in range(2):
        data = pusht.episode(i).data
        n = len(data["action"])
        data["timestamp"] = t0 + np.arange(n) / 20.0 + rng.uniform(-0.01, 0.01, n)
        real.append_episode(data, {**user_meta(pusht.episode(i).meta), "source": "teleop"})
        t0 += 10.0
    path = export_mcap(real, tmp_path / "real.mcap")
    with open(path, "rb") as f:
        reader = make_reader(f)
        meta = next(iter(reader.iter_metadata())).metadata
        assert meta["clock"] == "recorded" and Spec.from_json(meta["spec"]) == real.spec
        times = [m.log_time for _, _, m in reader.iter_messages(topics=["/command"])]
    stamps = np.concatenate([real.episode(i).data["timestamp"] for i in range(2)])
    np.testing.assert_array_equal(times, np.round(stamps * 1e9).astype(np.int64))
    back = import_mcap(path, tmp_path / "back.zarr", real.spec)
    assert_same_episodes(real, back)
    np.testing.assert_allclose(back.load(["timestamp"])["timestamp"], stamps, rtol=0, atol=1e-6)
    with pytest.raises(McapError, match=r"clock='recorded'.*median step .* ms, expected about 50 ms"):
        export_mcap(pusht, tmp_path / "sim.mcap", clock="recorded")  # sim data: faster than real time


# ---------------------------------------------------------------------------------------------------
# the file itself, read by an independent reader (mcap + mcap_ros2's own CDR decoder)
# ---------------------------------------------------------------------------------------------------
def test_independent_reader_sees_standard_ros2_topics(pickplace: EpisodeStore, tmp_path: Path) -> None:
    path = export_mcap(pickplace, tmp_path / "pp.mcap")
    steps = pickplace.num_steps
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        assert reader.get_header().profile == "ros2"
        summary = reader.get_summary()
        found = {
            c.topic: (
                summary.schemas[c.schema_id].name,
                summary.schemas[c.schema_id].encoding,
                c.message_encoding,
                summary.statistics.channel_message_counts[c.id],
            )
            for c in summary.channels.values()
        }
        assert found == {
            "/joint_states": ("sensor_msgs/msg/JointState", "ros2msg", "cdr", steps),
            "/camera/front/image_raw": ("sensor_msgs/msg/Image", "ros2msg", "cdr", steps),
            "/camera/wrist/image_raw": ("sensor_msgs/msg/Image", "ros2msg", "cdr", steps),
            "/command": ("std_msgs/msg/Float64MultiArray", "ros2msg", "cdr", steps),
            "/robotrl/state": ("std_msgs/msg/Float64MultiArray", "ros2msg", "cdr", steps),
            "/robotrl/step": ("std_msgs/msg/Float64MultiArray", "ros2msg", "cdr", steps),
            "/robotrl/episode": ("std_msgs/msg/String", "ros2msg", "cdr", pickplace.num_episodes),
            "/instruction": ("std_msgs/msg/String", "ros2msg", "cdr", pickplace.num_episodes),
        }
        firsts: dict[str, tuple[int, object]] = {}
        for _, channel, message, decoded in reader.iter_decoded_messages():
            firsts.setdefault(channel.topic, (message.log_time, decoded))
    ep = pickplace.episode(0)
    sl = pickplace.spec.observations["state"].field_slices()
    state = ep.data["state"][0]
    t0, js = firsts["/joint_states"]
    assert all(t == t0 for t, _ in firsts.values())  # one step, one time
    assert js.header.stamp.sec * 10**9 + js.header.stamp.nanosec == t0
    assert list(js.name) == list(pickplace.spec.joint_names)
    np.testing.assert_allclose(js.position[:7], state[sl["joint_pos"]], rtol=1e-7)
    np.testing.assert_allclose(js.position[7:], [state[sl["gripper"]][0] / 2] * 2, rtol=1e-6)  # opening split
    np.testing.assert_allclose(js.velocity[:7], state[sl["joint_vel"]], rtol=1e-7)
    assert np.isnan(js.velocity[7:]).all()
    img = firsts["/camera/front/image_raw"][1]
    assert (img.encoding, img.height, img.width, img.step) == ("rgb8", 64, 64, 192)
    assert bytes(img.data) == ep.data["image_front"][0].tobytes()
    st = firsts["/robotrl/state"][1]
    assert [(d.label, d.size) for d in st.layout.dim] == list(pickplace.spec.observations["state"].fields)
    np.testing.assert_array_equal(np.float32(st.data), state)
    np.testing.assert_array_equal(np.float32(firsts["/command"][1].data), ep.data["action"][0])
    assert firsts["/instruction"][1].data == ep.meta["instruction"]
    marker = json.loads(firsts["/robotrl/episode"][1].data)
    assert marker["length"] == len(ep) and marker["meta"]["instruction"] == ep.meta["instruction"]


# ---------------------------------------------------------------------------------------------------
# a foreign recording: joint states at 100 Hz with jitter, commands at 50 Hz, imported at 20 Hz
# ---------------------------------------------------------------------------------------------------
FINGERS = ("finger_l", "finger_r")


def joint_spec(hz: float = 20.0) -> Spec:
    state = ArraySpec((15,), "float32", fields=(("joint_pos", 7), ("joint_vel", 7), ("gripper", 1)))
    return Spec(
        "ArmJoints",
        {"state": state},
        ArraySpec((8,), "float32", low=-1.0, high=1.0),
        "joint_pos",
        hz,
        joint_names=ARM + FINGERS,
    )


def write_recording(
    path: Path,
    segments: list[tuple[float, float]],
    names: tuple[str, ...] = ARM + FINGERS,
    command: bool = True,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Joint states at ~100 Hz and commands at ~50 Hz (jittered) over each (start, stop) second range; the
    joints are listed in reverse order, as a driver may. Returns the times (ns) and values that were written."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {"js_t": [], "js_pos": [], "js_vel": [], "cmd_t": [], "cmd": []}
    with open(path, "wb") as f:
        w = Ros2Writer(f)
        js = w.register_msgdef(
            "sensor_msgs/msg/JointState", ROS_TYPES.generate_msgdef("sensor_msgs/msg/JointState", 2)[0]
        )
        fa = w.register_msgdef(
            "std_msgs/msg/Float64MultiArray", ROS_TYPES.generate_msgdef("std_msgs/msg/Float64MultiArray", 2)[0]
        )
        events = []
        for a, b in segments:
            events += [(int((t + rng.uniform(-0.003, 0.003)) * 1e9), "js") for t in np.arange(a, b, 0.01)]
            if command:
                events += [(int((t + 0.004 + rng.uniform(-0.002, 0.002)) * 1e9), "cmd") for t in np.arange(a, b, 0.02)]
        for t, kind in sorted(events):
            if kind == "js":
                pos, vel = rng.normal(size=9), rng.normal(size=9)
                out["js_t"].append(t), out["js_pos"].append(pos), out["js_vel"].append(vel)
                stamp = {"sec": t // 10**9, "nanosec": t % 10**9}
                w.write_message(
                    "/joint_states",
                    js,
                    {
                        "header": {"stamp": stamp, "frame_id": ""},
                        "name": list(names)[::-1],
                        "position": pos[::-1].tolist(),
                        "velocity": vel[::-1].tolist(),
                        "effort": [],
                    },
                    log_time=t,
                )
            else:
                cmd = rng.uniform(-1, 1, 8)
                out["cmd_t"].append(t), out["cmd"].append(cmd)
                w.write_message(
                    "/command", fa, {"layout": {"dim": [], "data_offset": 0}, "data": cmd.tolist()}, log_time=t
                )
        w.finish()
    return {k: np.asarray(v) for k, v in out.items()}


def zoh(times: np.ndarray, values: np.ndarray, ticks: np.ndarray) -> np.ndarray:
    """Reference zero-order hold, one tick at a time."""
    return np.stack([values[max(i for i, t in enumerate(times) if t <= tick)] for tick in ticks])


@pytest.mark.parametrize("hz", [None, 10.0])
def test_resampling_by_zero_order_hold(tmp_path: Path, hz: float | None) -> None:
    rec = write_recording(tmp_path / "rec.mcap", [(100.0, 102.0)])
    store = import_mcap(tmp_path / "rec.mcap", tmp_path / "out.zarr", joint_spec(), control_hz=hz)
    period_ns = 1e9 / (hz or 20.0)
    start = max(rec["js_t"][0], rec["cmd_t"][0])  # no tick before both topics have a message
    end = min(rec["js_t"][-1], rec["cmd_t"][-1])
    n = int((end - start) // period_ns) + 1
    assert n == (40 if hz is None else 20) or n == (39 if hz is None else 19)
    ticks = start + np.round(np.arange(n) * period_ns).astype(np.int64)
    assert store.num_episodes == 1
    ep = store.episode(0)
    assert len(ep) == n
    np.testing.assert_allclose(ep.data["timestamp"], ticks / 1e9, rtol=0, atol=1e-6)
    pos, vel = zoh(rec["js_t"], rec["js_pos"], ticks), zoh(rec["js_t"], rec["js_vel"], ticks)
    expected_state = np.concatenate([pos[:, :7], vel[:, :7], pos[:, 7:].sum(1, keepdims=True)], 1)
    np.testing.assert_array_equal(ep.data["state"], expected_state.astype(np.float32))
    np.testing.assert_array_equal(ep.data["action"], zoh(rec["cmd_t"], rec["cmd"], ticks).astype(np.float32))
    assert ep.data["truncated"].tolist() == [False] * (n - 1) + [True]  # the recording simply ends
    assert not ep.data["terminated"].any() and not ep.data["reward"].any()
    assert ep.meta["source"] == "imported" and ep.meta["control_hz"] == (hz or 20.0)


def test_a_pause_splits_episodes_when_there_are_no_markers(tmp_path: Path) -> None:
    write_recording(tmp_path / "rec.mcap", [(100.0, 101.0), (110.0, 111.5)])
    store = import_mcap(tmp_path / "rec.mcap", tmp_path / "out.zarr", joint_spec(), max_gap_s=2.0)
    assert store.num_episodes == 2
    assert [len(e) for e in store] in ([20, 30], [19, 30], [20, 29], [19, 29])
    assert store.episode(1).data["timestamp"][0] > 109.9


# ---------------------------------------------------------------------------------------------------
# bad input: clear errors naming the topic or field, what was expected and what was found
# ---------------------------------------------------------------------------------------------------
def test_not_an_mcap_file(tmp_path: Path) -> None:
    bad = tmp_path / "notes.mcap"
    bad.write_text("hello, not a recording")
    with pytest.raises(McapError, match=r"notes\.mcap: expected an MCAP file .*got b'hello, n'"):
        import_mcap(bad, tmp_path / "out.zarr", joint_spec())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        import_mcap(tmp_path / "missing.mcap", tmp_path / "out.zarr", joint_spec())
    assert not (tmp_path / "out.zarr").exists()


def test_missing_topic(tmp_path: Path) -> None:
    write_recording(tmp_path / "rec.mcap", [(100.0, 100.5)], command=False)
    with pytest.raises(
        McapError,
        match=r"topic /command: expected std_msgs/msg/Float64MultiArray .*\['action'\].*"
        r"got no such topic; topics in the file: \['/joint_states'\]",
    ):
        import_mcap(tmp_path / "rec.mcap", tmp_path / "out.zarr", joint_spec())
    # remapped topics are looked up under their new names
    with pytest.raises(
        McapError,
        match=r"observation 'state': expected topic /robotrl/state .* or /arm/joints "
        r"\(sensor_msgs/msg/JointState\), got neither",
    ):
        import_mcap(
            tmp_path / "rec.mcap", tmp_path / "out.zarr", joint_spec(), topics=TopicMap(joint_states="/arm/joints")
        )
    assert not (tmp_path / "out.zarr").exists()


def test_wrong_joint_names(tmp_path: Path) -> None:
    names = tuple(f"j{i}" for i in range(9))
    write_recording(tmp_path / "rec.mcap", [(100.0, 100.5)], names=names)
    with pytest.raises(
        McapError,
        match=r"topic /joint_states at t=.*joint names: expected to contain "
        r"\['joint1', .*'finger_r'\], got \['j8', .*'j0'\].*missing",
    ):
        import_mcap(tmp_path / "rec.mcap", tmp_path / "out.zarr", joint_spec())
    assert not (tmp_path / "out.zarr").exists()  # a failed import leaves no half-written store


def test_state_fields_joint_states_cannot_supply(pickplace: EpisodeStore, tmp_path: Path) -> None:
    path = export_mcap(pickplace, tmp_path / "pp.mcap", topics=TopicMap(observation="/debug/{key}"))
    with pytest.raises(
        McapError,
        match=r"observation 'state': topic /robotrl/state is absent, and /joint_states "
        r"cannot supply field\(s\) \['tool_pos', .*\] \(it provides "
        r"\['joint_pos', 'joint_vel', 'gripper'\]\)",
    ):
        import_mcap(path, tmp_path / "out.zarr", pickplace.spec)
    back = import_mcap(path, tmp_path / "out.zarr", pickplace.spec, topics=TopicMap(observation="/debug/{key}"))
    assert_same_episodes(pickplace, back)


def test_layout_and_type_mismatches(pusht: EpisodeStore, tmp_path: Path) -> None:
    path = export_mcap(pusht, tmp_path / "pusht.mcap", episodes=[0])
    d = pusht.spec.to_dict()
    d["observations"]["state"]["fields"][2] = ["ee_pos", 3]
    with pytest.raises(
        McapError,
        match=r"topic /robotrl/state at t=.*'state' fields \(layout dim labels\): "
        r"expected \[.*\['ee_pos', 3\].*\], got \[.*\['tool_pos', 3\].*\]",
    ):
        import_mcap(path, tmp_path / "a.zarr", Spec.from_dict(d))
    with pytest.raises(
        McapError,
        match=r"topic /robotrl/episode: expected std_msgs/msg/Float64MultiArray "
        r"\(ros2msg schema, cdr\), got std_msgs/msg/String",
    ):
        import_mcap(path, tmp_path / "b.zarr", pusht.spec, topics=TopicMap(command="/robotrl/episode"))
    d = pusht.spec.to_dict()
    d["action"]["shape"] = [3]
    with pytest.raises(
        McapError,
        match=r"topic /command at t=.*'action' fields \(layout dim labels\): "
        r"expected \[\['action', 3\]\], got \[\['action', 2\]\]",
    ):
        import_mcap(path, tmp_path / "c.zarr", Spec.from_dict(d))
