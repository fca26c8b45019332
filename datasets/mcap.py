"""MCAP (ROS 2) export and import: the episode store as a recording every ROS 2 tool reads, and back.

`export_mcap` writes one standard MCAP file (profile ``ros2``, ``ros2msg`` schemas, ``cdr`` messages, zstd
chunks, full index), so Foxglove opens it and ``ros2 bag play`` replays it (Iron and later take the file
directly; on Humble put it in a folder and run ``ros2 bag reindex <folder> -s mcap`` for a metadata.yaml).
Per step, all at the step's time (log_time = publish_time = header.stamp):

=========================  ===============================  ==============================================
topic (`TopicMap` field)   type                             content
=========================  ===============================  ==============================================
/joint_states              sensor_msgs/msg/JointState       `JointLayout`: joint_pos / joint_vel (+ gripper)
/camera/<cam>/image_raw    sensor_msgs/msg/Image (rgb8)     each ``image_<cam>`` observation
/command                   std_msgs/msg/Float64MultiArray   the raw action
/robotrl/<key>             std_msgs/msg/Float64MultiArray   each other numeric observation (the full
                                                            ``state`` vector), dim labels = its fields
/robotrl/step              std_msgs/msg/Float64MultiArray   reward, terminated, truncated, success,
                                                            intervention
/robotrl/episode           std_msgs/msg/String              JSON episode metadata, once at each episode start
/instruction               std_msgs/msg/String              the instruction, once at each episode start
=========================  ===============================  ==============================================

The file also holds an MCAP metadata record ``robotrl`` with the task spec. Sim data is recorded faster than
real time and parallel envs share wall-clock stamps, so `export_mcap` lays steps on the control-rate grid
unless the recorded stamps already form a real-time, non-overlapping timeline (``clock="auto"``).

`import_mcap` reads such a recording, or any ROS 2 MCAP with those topics (remapped by a `TopicMap`), and
resamples it to the control rate by zero-order hold. This module never imports rclpy: ROS message types,
CDR and message definitions come from `rosbags`, the file format from `mcap`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from mcap.exceptions import McapError as _McapFormatError
from mcap.reader import make_reader
from mcap.writer import CompressionType, Writer
from numpy.typing import ArrayLike
from rosbags.typesys import Stores, get_typestore

from robotrl.core.spec import ArraySpec, Spec, SpecMismatchError
from robotrl.datasets.store import SOURCES, EpisodeStore, step_arrays, string_keys, user_meta

FORMAT = "robotrl-mcap"
VERSION = 1
JOINT_STATE = "sensor_msgs/msg/JointState"
IMAGE = "sensor_msgs/msg/Image"
FLOAT_ARRAY = "std_msgs/msg/Float64MultiArray"
STRING_MSG = "std_msgs/msg/String"
#: per-step outcome fields carried on `TopicMap.step`, in order
STEP_FIELDS = ("reward", "terminated", "truncated", "success", "intervention")
Clock = Literal["auto", "recorded", "control"]


class McapError(ValueError):
    """A recording that cannot be exported or imported as asked; the message names the file, topic or field."""


@cache
def _typestore() -> Any:
    return get_typestore(Stores.ROS2_HUMBLE)  # these message types are identical in every ROS 2 distro


@dataclass(frozen=True)
class TopicMap:
    """Topic names of a recording; remap them to read a robot's own topics (e.g. ``command="/arm/cmd"``)."""

    joint_states: str = "/joint_states"
    command: str = "/command"
    camera: str = "/camera/{cam}/image_raw"
    """``{cam}``: the image key without its ``image_`` prefix"""
    observation: str = "/robotrl/{key}"
    """numeric non-image observations, e.g. the full ``state`` vector on /robotrl/state"""
    step: str = "/robotrl/step"
    episode: str = "/robotrl/episode"
    instruction: str = "/instruction"

    def image(self, key: str) -> str:
        return self.camera.format(cam=key.removeprefix("image_"))

    def obs(self, key: str) -> str:
        return self.observation.format(key=key)


# ---------------------------------------------------------------------------------------------------
# joints: a flat observation's named fields <-> sensor_msgs/JointState
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JointLayout:
    """Where the robot's joints sit in a flat observation with named fields, in both directions.

    ``joint_pos`` gives the positions of the first ``len(joint_pos)`` of ``spec.joint_names``, ``joint_vel``
    their velocities. The remaining names (finger joints) come from a ``gripper`` field: a single value is the
    total opening, split evenly over the fingers (PickPlace: gripper = finger_l + finger_r, so each finger is
    gripper / 2, and import sums them back); one value per remaining joint is copied. Remaining joints with no
    gripper field are left out of the message. A finger's velocity is unknown and published as NaN.
    """

    key: str
    names: tuple[str, ...]  # the joints published, arm first
    pos: slice
    vel: slice | None
    gripper: slice | None
    n_fingers: int

    @classmethod
    def of(cls, spec: Spec, key: str = "state") -> JointLayout | None:
        """The layout of observation `key`, or None when it has no ``joint_pos`` field."""
        obs = spec.observations.get(key)
        slices = obs.field_slices() if obs is not None else {}
        if "joint_pos" not in slices:
            return None
        pos = slices["joint_pos"]
        n_arm = pos.stop - pos.start
        if len(spec.joint_names) < n_arm:
            raise SpecMismatchError(
                f"spec.joint_names: expected at least {n_arm} names for field '{key}.joint_pos', "
                f"got {len(spec.joint_names)}: {list(spec.joint_names)}"
            )
        vel = slices.get("joint_vel")
        if vel is not None and vel.stop - vel.start > n_arm:
            raise SpecMismatchError(
                f"field '{key}.joint_vel': expected at most {n_arm} entries (one per joint_pos), "
                f"got {vel.stop - vel.start}"
            )
        extra = spec.joint_names[n_arm:]
        grip = slices.get("gripper")
        if grip is not None and extra and (grip.stop - grip.start) in (1, len(extra)):
            return cls(key, tuple(spec.joint_names), pos, vel, grip, len(extra))
        return cls(key, tuple(spec.joint_names[:n_arm]), pos, vel, None, 0)

    @property
    def provides(self) -> tuple[str, ...]:
        return ("joint_pos",) + (("joint_vel",) if self.vel else ()) + (("gripper",) if self.gripper else ())

    def to_joints(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions and velocities (NaN where unknown; empty without joint_vel) of every named joint."""
        pos = np.asarray(x[self.pos], np.float64)
        if self.gripper is not None:
            g = np.asarray(x[self.gripper], np.float64)
            pos = np.concatenate([pos, np.broadcast_to(g / self.n_fingers, (self.n_fingers,)) if g.size == 1 else g])
        if self.vel is None:
            return pos, np.zeros(0)
        vel = np.full(len(self.names), np.nan)
        vel[: self.vel.stop - self.vel.start] = x[self.vel]
        return pos, vel

    def from_joints(
        self, names: list[str], position: np.ndarray, velocity: np.ndarray, size: int, where: str
    ) -> np.ndarray:
        """The flat observation from one JointState message (joints matched by name, in any order)."""
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.names if n not in index]
        if missing or len(position) != len(names):
            raise McapError(
                f"{where}: joint names: expected to contain {list(self.names)}, got {list(names)} "
                f"with {len(position)} positions (missing {missing})"
            )
        order = np.array([index[n] for n in self.names])
        out = np.zeros(size, np.float64)
        n_arm = self.pos.stop - self.pos.start
        out[self.pos] = position[order[:n_arm]]
        if self.vel is not None:
            if len(velocity) != len(names):
                raise McapError(
                    f"{where}: field '{self.key}.joint_vel': expected {len(names)} velocities, got {len(velocity)}"
                )
            out[self.vel] = velocity[order[: self.vel.stop - self.vel.start]]
        if self.gripper is not None:
            fingers = position[order[n_arm:]]
            out[self.gripper] = fingers.sum() if self.gripper.stop - self.gripper.start == 1 else fingers
        return out


# ---------------------------------------------------------------------------------------------------
# ROS 2 messages (rosbags dataclasses, serialized to CDR)
# ---------------------------------------------------------------------------------------------------
def _header(t_ns: int, frame_id: str = "") -> Any:
    types = _typestore().types
    stamp = types["builtin_interfaces/msg/Time"](sec=int(t_ns // 1_000_000_000), nanosec=int(t_ns % 1_000_000_000))
    return types["std_msgs/msg/Header"](stamp=stamp, frame_id=frame_id)


def _layout(fields: Iterable[tuple[str, int]]) -> Any:
    """A MultiArrayLayout whose dims name consecutive fields of a flat vector (label, size, stride = size)."""
    types = _typestore().types
    dims = [types["std_msgs/msg/MultiArrayDimension"](label=n, size=k, stride=k) for n, k in fields]
    return types["std_msgs/msg/MultiArrayLayout"](dim=dims, data_offset=0)


def _fields(a: ArraySpec, name: str) -> tuple[tuple[str, int], ...]:
    return a.fields or ((name, a.size),)


class _McapWriter:
    """An MCAP writer for ROS 2 topics: one schema per type, one channel per topic, CDR messages."""

    def __init__(self, f: Any, types: dict[str, str], spec: Spec, clock: str) -> None:
        self.w = Writer(f, compression=CompressionType.ZSTD)
        self.w.start(profile="ros2", library=f"robotrl {FORMAT} v{VERSION}")
        schemas = {
            t: self.w.register_schema(t, "ros2msg", _typestore().generate_msgdef(t, ros_version=2)[0].encode())
            for t in sorted(set(types.values()))
        }
        self.channels = {topic: self.w.register_channel(topic, "cdr", schemas[t]) for topic, t in types.items()}
        self.types, self.seq = types, dict.fromkeys(types, 0)
        self.w.add_metadata(
            "robotrl", {"format": FORMAT, "version": str(VERSION), "clock": clock, "spec": spec.to_json(None)}
        )

    def write(self, topic: str, t_ns: int, msg: Any) -> None:
        data = _typestore().serialize_cdr(msg, self.types[topic])
        self.w.add_message(
            self.channels[topic], log_time=t_ns, data=bytes(data), publish_time=t_ns, sequence=self.seq[topic]
        )
        self.seq[topic] += 1

    def finish(self) -> None:
        self.w.finish()


# ---------------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------------
def _timelines(stamps: list[np.ndarray], hz: float, clock: Clock) -> tuple[str, list[np.ndarray]]:
    """Message times (ns) per episode and the clock used. ``recorded`` keeps the steps' wall-clock stamps and
    needs them real-time (median step within 0.5-2x the control period), increasing and non-overlapping;
    ``control`` puts step k of an episode at its first stamp + k / control_hz, shifted later where needed so
    episodes never overlap; ``auto`` is ``recorded`` when that is valid, else ``control``."""
    if clock not in ("auto", "recorded", "control"):
        raise ValueError(f"clock: expected 'auto', 'recorded' or 'control', got {clock!r}")
    period = 1e9 / hz
    problem = None
    for i, s in enumerate(stamps):
        d = np.diff(s)
        if np.any(d <= 0):
            problem = f"episode #{i} of the export: timestamps do not increase at step {int(np.argmax(d <= 0)) + 1}"
        elif len(d) and not 0.5 <= np.median(d) * hz <= 2.0:
            problem = (
                f"episode #{i} of the export: median step {np.median(d) * 1e3:.3g} ms, expected about "
                f"{1e3 / hz:.3g} ms at control_hz={hz} (simulated faster than real time?)"
            )
        elif i and s[0] <= stamps[i - 1][-1]:
            problem = (
                f"episode #{i} of the export starts at {s[0]:.6f} s, "
                f"before episode #{i - 1} ends ({stamps[i - 1][-1]:.6f} s)"
            )
        if problem:
            break
    if clock == "recorded" and problem:
        raise McapError(f"clock='recorded': {problem}; use clock='control' to lay steps on the control-rate grid")
    if clock == "recorded" or (clock == "auto" and problem is None):
        return "recorded", [np.round(s * 1e9).astype(np.int64) for s in stamps]
    out: list[np.ndarray] = []
    for s in stamps:
        start = round(s[0] * 1e9)
        if out:
            start = max(start, int(out[-1][-1]) + round(period))
        out.append(start + np.round(np.arange(len(s)) * period).astype(np.int64))
    return "control", out


def export_mcap(
    store_or_path: EpisodeStore | str | Path,
    out_path: str | Path,
    episodes: Iterable[int] | None = None,
    topics: TopicMap = TopicMap(),
    clock: Clock = "auto",
) -> Path:
    """Write `episodes` (default: all) of a store to one ROS 2 MCAP file at `out_path`; returns its path.

    The file appears whole or not at all (written beside, then renamed). `import_mcap` reads it back exactly
    (state, action, images, step outcomes, episode boundaries and metadata)."""
    store = store_or_path if isinstance(store_or_path, EpisodeStore) else EpisodeStore.open(store_or_path)
    spec = store.spec
    indices = list(range(store.num_episodes) if episodes is None else episodes)
    if not indices:
        raise McapError(f"export_mcap: no episodes to export from {store.path} ({store.num_episodes} in the store)")
    arrays = step_arrays(spec)
    images = [k for k in spec.observations if k in arrays and arrays[k].is_image]
    vectors = [k for k in spec.observations if k in arrays and not arrays[k].is_image]
    joints = JointLayout.of(spec)
    types = {
        topics.episode: STRING_MSG,
        topics.instruction: STRING_MSG,
        topics.command: FLOAT_ARRAY,
        topics.step: FLOAT_ARRAY,
        **{topics.obs(k): FLOAT_ARRAY for k in vectors},
        **{topics.image(k): IMAGE for k in images},
    }
    if joints is not None:
        types[topics.joint_states] = JOINT_STATE
    if len(types) != 4 + len(vectors) + len(images) + (joints is not None):
        raise McapError(f"topics: expected a distinct topic per stream, got a collision in {topics}")
    clock_used, times = _timelines(
        [store.episode(i, keys=["timestamp"]).data["timestamp"] for i in indices], spec.control_hz, clock
    )

    msg = _typestore().types
    layouts = {topics.obs(k): _layout(_fields(arrays[k], k)) for k in vectors}
    layouts[topics.command] = _layout(_fields(spec.action, "action"))
    layouts[topics.step] = _layout((f, 1) for f in STEP_FIELDS)
    out = Path(out_path)
    if out.exists():
        raise FileExistsError(f"{out}: exists; refusing to write an MCAP recording over it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")

    def array(topic: str, x: ArrayLike) -> Any:
        return msg[FLOAT_ARRAY](layout=layouts[topic], data=np.asarray(x, np.float64).ravel())

    try:
        with open(tmp, "wb") as f:
            w = _McapWriter(f, types, spec, clock_used)
            for i, t_ns in zip(indices, times):
                ep = store.episode(i)
                meta = user_meta(ep.meta)
                marker = {
                    "format": FORMAT,
                    "episode": ep.index,
                    "length": len(ep),
                    "control_hz": spec.control_hz,
                    "clock": clock_used,
                    "meta": meta,
                }
                w.write(topics.episode, int(t_ns[0]), msg[STRING_MSG](data=json.dumps(marker)))
                if meta.get("instruction"):
                    w.write(topics.instruction, int(t_ns[0]), msg[STRING_MSG](data=str(meta["instruction"])))
                d = ep.data
                for k, t in enumerate(int(t) for t in t_ns):
                    if joints is not None:
                        pos, vel = joints.to_joints(d[joints.key][k])
                        w.write(
                            topics.joint_states,
                            t,
                            msg[JOINT_STATE](
                                header=_header(t),
                                name=list(joints.names),
                                position=pos,
                                velocity=vel,
                                effort=np.zeros(0),
                            ),
                        )
                    for key in images:
                        img = np.ascontiguousarray(d[key][k])
                        h, wd = img.shape[:2]
                        w.write(
                            topics.image(key),
                            t,
                            msg[IMAGE](
                                header=_header(t, f"{key.removeprefix('image_')}_camera"),
                                height=h,
                                width=wd,
                                encoding="rgb8",
                                is_bigendian=0,
                                step=3 * wd,
                                data=img.reshape(-1),
                            ),
                        )
                    for key in vectors:
                        w.write(topics.obs(key), t, array(topics.obs(key), d[key][k]))
                    w.write(topics.command, t, array(topics.command, d["action"][k]))
                    w.write(topics.step, t, array(topics.step, [d[f][k] for f in STEP_FIELDS]))
            w.finish()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# ---------------------------------------------------------------------------------------------------
# import
# ---------------------------------------------------------------------------------------------------
def _mcap_files(in_path: str | Path) -> list[Path]:
    """The MCAP file, or a rosbag2 folder's .mcap files (read in name order as one recording)."""
    path = Path(in_path)
    if not path.exists():
        raise FileNotFoundError(f"import_mcap: {path} does not exist")
    files = sorted(path.glob("*.mcap")) if path.is_dir() else [path]
    if not files:
        raise McapError(f"{path}: expected an MCAP file or a rosbag2 folder with .mcap files, got a folder without any")
    return files


def _open_reader(path: Path, f: Any) -> Any:
    try:
        return make_reader(f)
    except (_McapFormatError, ValueError, EOFError) as e:
        f.seek(0)
        raise McapError(
            f"{path}: expected an MCAP file (starting with magic b'\\x89MCAP0\\r\\n'), got {f.read(8)!r} ({e})"
        ) from None


def embedded_spec(in_path: str | Path) -> Spec | None:
    """The task spec `export_mcap` saved in the recording's ``robotrl`` metadata record, or None (a foreign bag)."""
    for path in _mcap_files(in_path):
        with open(path, "rb") as f:
            for record in _open_reader(path, f).iter_metadata():
                if record.name == "robotrl" and "spec" in record.metadata:
                    return Spec.from_json(record.metadata["spec"])
    return None


def _channels(files: list[Path]) -> dict[str, tuple[str, str, str]]:
    """topic -> (schema name, schema encoding, message encoding) over every file, from the summaries."""
    out: dict[str, tuple[str, str, str]] = {}
    for path in files:
        with open(path, "rb") as f:
            reader = _open_reader(path, f)
            try:
                summary = reader.get_summary()
                if summary is not None:
                    pairs = [(c, summary.schemas.get(c.schema_id)) for c in summary.channels.values()]
                else:  # no summary section: scan the file once
                    pairs = list({c.id: (c, s) for s, c, _ in reader.iter_messages(log_time_order=False)}.values())
            except _McapFormatError as e:
                raise McapError(f"{path}: damaged MCAP file: {e}") from None
            for c, s in pairs:
                out[c.topic] = (s.name if s else "", s.encoding if s else "", c.message_encoding)
    return out


@dataclass
class _Source:
    """One topic feeding one per-step key: `decode` turns a raw CDR message into the key's row."""

    key: str
    topic: str
    msgtype: str
    decode: Callable[[bytes, str], Any]


@dataclass
class _Plan:
    """Which topic feeds which store key, checked against the spec and the file's channels before reading."""

    sources: list[_Source]
    step: _Source | None
    markers: bool
    instruction_topic: str

    @property
    def required(self) -> list[str]:
        return [s.topic for s in self.sources]


def _float_array_decoder(key: str, fields: tuple[tuple[str, int], ...], size: int) -> Callable[[bytes, str], Any]:
    """Decode a Float64MultiArray row, checking its size and (when it names fields) its dim labels."""
    expected = [list(f) for f in fields]

    def decode(raw: bytes, where: str) -> np.ndarray:
        m = _typestore().deserialize_cdr(raw, FLOAT_ARRAY)
        got = [[d.label, int(d.size)] for d in m.layout.dim]
        if got and got != expected and not (len(got) == 1 and got[0][1] == size):
            raise McapError(f"{where}: '{key}' fields (layout dim labels): expected {expected}, got {got}")
        if len(m.data) != size:
            raise McapError(f"{where}: '{key}': expected {size} values, got {len(m.data)}")
        return np.asarray(m.data, np.float64)

    return decode


def _plan(spec: Spec, topics: TopicMap, channels: dict[str, tuple[str, str, str]], where: str) -> _Plan:
    arrays = step_arrays(spec)
    sources: list[_Source] = []
    for key, a in spec.observations.items():
        if key not in arrays:
            continue
        if a.is_image:
            h, w = a.shape[:2]

            def decode_image(raw: bytes, at: str, key: str = key, h: int = h, w: int = w) -> np.ndarray:
                m = _typestore().deserialize_cdr(raw, IMAGE)
                if (m.height, m.width) != (h, w) or m.encoding not in ("rgb8", "bgr8"):
                    raise McapError(
                        f"{at}: '{key}': expected a {h}x{w} rgb8 image, got {m.height}x{m.width} {m.encoding}"
                    )
                img = np.asarray(m.data, np.uint8).reshape(h, m.step)[:, : 3 * w].reshape(h, w, 3)
                return img[..., ::-1] if m.encoding == "bgr8" else img

            sources.append(_Source(key, topics.image(key), IMAGE, decode_image))
            continue
        topic = topics.obs(key)
        if topic in channels:
            sources.append(_Source(key, topic, FLOAT_ARRAY, _float_array_decoder(key, _fields(a, key), a.size)))
            continue
        joints = JointLayout.of(spec, key)
        lacking = [n for n, _ in a.fields if joints is None or n not in joints.provides] if a.fields else [key]
        if lacking:
            have = f"it provides {list(joints.provides)}" if joints else "the state has no 'joint_pos' field"
            raise McapError(
                f"{where}: observation '{key}': topic {topic} is absent, and {topics.joint_states} cannot "
                f"supply field(s) {lacking} ({have}); topics in the file: {sorted(channels)}"
            )
        if topics.joint_states not in channels:
            raise McapError(
                f"{where}: observation '{key}': expected topic {topic} ({FLOAT_ARRAY}) or "
                f"{topics.joint_states} ({JOINT_STATE}), got neither; topics in the file: {sorted(channels)}"
            )

        assert joints is not None  # `lacking` is empty: the joint states supply every field

        def decode_joints(raw: bytes, at: str, joints: JointLayout = joints, size: int = a.size) -> np.ndarray:
            m = _typestore().deserialize_cdr(raw, JOINT_STATE)
            return joints.from_joints(list(m.name), np.asarray(m.position), np.asarray(m.velocity), size, at)

        sources.append(_Source(key, topics.joint_states, JOINT_STATE, decode_joints))
    sources.append(
        _Source(
            "action",
            topics.command,
            FLOAT_ARRAY,
            _float_array_decoder("action", _fields(spec.action, "action"), spec.action.size),
        )
    )
    step = _Source(
        "step",
        topics.step,
        FLOAT_ARRAY,
        _float_array_decoder("step", tuple((f, 1) for f in STEP_FIELDS), len(STEP_FIELDS)),
    )
    optional = {topics.step: FLOAT_ARRAY, topics.episode: STRING_MSG, topics.instruction: STRING_MSG}
    for topic, msgtype in [(s.topic, s.msgtype) for s in sources] + list(optional.items()):
        if topic not in channels:
            if topic in optional:
                continue
            raise McapError(
                f"{where}: topic {topic}: expected {msgtype} messages (for the spec's "
                f"{[s.key for s in sources if s.topic == topic]}), got no such topic; "
                f"topics in the file: {sorted(channels)}"
            )
        name, schema_enc, msg_enc = channels[topic]
        if (name, schema_enc, msg_enc) != (msgtype, "ros2msg", "cdr"):
            raise McapError(
                f"{where}: topic {topic}: expected {msgtype} (ros2msg schema, cdr), "
                f"got {name or '<no schema>'} ({schema_enc or '-'} schema, {msg_enc})"
            )
    if string_keys(spec) and topics.instruction not in channels and topics.episode not in channels:
        raise McapError(
            f"{where}: topic {topics.instruction}: expected std_msgs/msg/String for the spec's string "
            f"observation {string_keys(spec)}, got no such topic (and no {topics.episode} metadata)"
        )
    return _Plan(sources, step if topics.step in channels else None, topics.episode in channels, topics.instruction)


@dataclass
class _Segment:
    """The raw messages of one episode: topic -> (log times in ns, CDR payloads), and its marker's JSON."""

    marker: dict[str, Any] | None
    messages: dict[str, tuple[list[int], list[bytes]]] = field(default_factory=dict)

    def add(self, topic: str, t: int, data: bytes) -> None:
        times, raws = self.messages.setdefault(topic, ([], []))
        times.append(t)
        raws.append(data)


def _segments(
    files: list[Path], plan: _Plan, topics: TopicMap, max_gap_s: float, instructions: list[tuple[int, str]]
) -> Iterator[_Segment]:
    """Episodes in log-time order: split at each episode marker when the recording has them, else wherever no
    required topic has a message for more than `max_gap_s`. Instruction messages go to `instructions`."""
    wanted = set(plan.required) | ({plan.step.topic} if plan.step else set())
    seg, last = _Segment(None), None
    for path in files:
        with open(path, "rb") as f:
            reader = _open_reader(path, f)
            try:
                for _, channel, m in reader.iter_messages(topics=[*wanted, topics.episode, topics.instruction]):
                    topic, t = channel.topic, int(m.log_time)
                    if topic == topics.instruction:
                        instructions.append((t, _typestore().deserialize_cdr(m.data, STRING_MSG).data))
                    elif topic == topics.episode:
                        text = _typestore().deserialize_cdr(m.data, STRING_MSG).data
                        try:
                            marker = json.loads(text)
                        except json.JSONDecodeError:
                            marker = {"meta": {"note": text}}
                        if seg.messages:
                            yield seg
                        seg = _Segment(marker if isinstance(marker, dict) else {"meta": {"note": text}})
                    else:
                        if not plan.markers and last is not None and t - last > max_gap_s * 1e9 and seg.messages:
                            yield seg
                            seg = _Segment(None)
                        last = t
                        seg.add(topic, t, bytes(m.data))
            except _McapFormatError as e:
                raise McapError(f"{path}: damaged MCAP file: {e}") from None
    if seg.messages:
        yield seg


def _episode(
    seg: _Segment,
    number: int,
    spec: Spec,
    plan: _Plan,
    hz: float | None,
    instructions: list[tuple[int, str]],
    source_name: str,
) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """One episode resampled by zero-order hold: at each tick, the latest message at or before it per topic.
    Ticks run from the first time every required topic has a message to the last time all still have one;
    a robotrl export read at its own rate ticks at its step messages instead (exact, even with jittered
    stamps). None when no tick has every topic."""
    where = f"{source_name} episode #{number}"
    missing = [t for t in plan.required if t not in seg.messages]
    if missing:
        warnings.warn(f"{where}: skipped, no message on {missing}", stacklevel=3)
        return None
    times = {t: np.asarray(ts, np.int64) for t, (ts, _) in seg.messages.items()}
    for t, ts in times.items():
        if np.any(np.diff(ts) < 0):
            raise McapError(f"{where}: topic {t}: log times go backwards")
    start = max(int(times[t][0]) for t in plan.required)
    end = min(int(times[t][-1]) for t in plan.required)
    own_rate = (seg.marker or {}).get("control_hz")
    if hz is None and plan.step is not None and plan.step.topic in times and own_rate == spec.control_hz:
        ticks = times[plan.step.topic][(times[plan.step.topic] >= start) & (times[plan.step.topic] <= end)]
    else:
        period = 1e9 / (hz or spec.control_hz)
        n = math.floor((end - start) / period + 1e-9) + 1 if end >= start else 0
        ticks = start + np.round(np.arange(n) * period).astype(np.int64)
    if len(ticks) == 0:
        warnings.warn(f"{where}: skipped, no control tick has a message on every required topic", stacklevel=3)
        return None

    def held(source: _Source) -> np.ndarray:
        ts, raws = times[source.topic], seg.messages[source.topic][1]
        idx = np.searchsorted(ts, ticks, side="right") - 1
        rows = {
            int(i): source.decode(raws[i], f"{where}: topic {source.topic} at t={ts[i] / 1e9:.9f} s")
            for i in np.unique(idx)
        }
        return np.stack([rows[int(i)] for i in idx])

    arrays = step_arrays(spec)
    data = {s.key: held(s).astype(arrays[s.key].dtype) for s in plan.sources}
    n = len(ticks)
    if plan.step is not None and plan.step.topic in times:
        steps = held(plan.step)
        last = plan.step.decode(seg.messages[plan.step.topic][1][-1], f"{where}: topic {plan.step.topic}")
        for j, f in enumerate(STEP_FIELDS):
            data[f] = steps[:, j]
    else:  # a plain ROS recording: no rewards, and it ends because the recording does
        last = np.array([0.0, 0.0, 1.0, 0.0, 0.0])
        data.update(reward=np.zeros(n), success=np.zeros(n), intervention=np.zeros(n))
    for j, f in ((1, "terminated"), (2, "truncated")):  # the episode ends exactly once, at its last tick
        data[f] = np.zeros(n, bool)
        data[f][-1] = bool(last[j])
    data["timestamp"] = ticks / 1e9
    data = {k: np.asarray(v).astype(arrays[k].dtype) for k, v in data.items()}

    marker_meta = dict((seg.marker or {}).get("meta") or {})
    # the latest instruction at or before the first tick, else the first one during the episode, else the marker's
    before = [text for t, text in instructions if t <= ticks[0]]
    within = [text for t, text in instructions if ticks[0] < t <= ticks[-1]]
    instruction = before[-1] if before else within[0] if within else marker_meta.get("instruction")
    if string_keys(spec) and not instruction:
        raise McapError(
            f"{where}: topic {plan.instruction_topic}: expected an instruction at or before t={ticks[0] / 1e9:.9f} s "
            f"for the spec's string observation {string_keys(spec)}, got none"
        )
    meta = user_meta(marker_meta)
    meta.update(
        instruction=instruction or None,
        control_hz=float(hz or spec.control_hz),
        success=bool(meta.get("success", bool(data["success"].any()))),
        interventions=int(data["intervention"].sum()),
        imported_from=source_name,
    )
    if meta.get("source") not in SOURCES:
        meta["source"] = "imported"
    meta.setdefault("t_start", float(data["timestamp"][0]))
    meta.setdefault("t_end", float(data["timestamp"][-1]))
    return data, meta


def import_mcap(
    in_path: str | Path,
    out_store_path: str | Path,
    spec: Spec,
    topics: TopicMap = TopicMap(),
    control_hz: float | None = None,
    max_gap_s: float = 2.0,
) -> EpisodeStore:
    """Import a ROS 2 MCAP recording (a file, or a rosbag2 folder of .mcap files) into the store at
    `out_store_path` (created, or appended to when its spec matches `spec`); returns the store, open for appending.

    Each step is resampled by zero-order hold at `control_hz` (default: the spec's rate). ``state`` (any numeric
    observation) comes from /robotrl/<key> when present, else from /joint_states when every field of it is a
    joint field (see `JointLayout`). Episodes split at /robotrl/episode markers when the file has them, else at
    any pause over `max_gap_s` seconds with no message on a required topic (one episode per continuous
    recording). A new store that fails to import is removed, so nothing half-imported is left behind."""
    files = _mcap_files(in_path)
    source_name = Path(in_path).name
    plan = _plan(spec, topics, _channels(files), str(in_path))
    if control_hz is not None and not control_hz > 0:
        raise ValueError(f"control_hz: expected a positive rate, got {control_hz}")
    out = Path(out_store_path)
    created = not (out / "zarr.json").exists()
    store: EpisodeStore | None = None
    try:
        instructions: list[tuple[int, str]] = []
        number = 0
        for seg in _segments(files, plan, topics, max_gap_s, instructions):
            episode = _episode(seg, number, spec, plan, control_hz, instructions, source_name)
            number += 1
            if episode is None:
                continue
            if store is None:
                store = EpisodeStore.create(out, spec, exist_ok=True)
            store.append_episode(*episode)
        if store is None:
            raise McapError(
                f"{in_path}: expected at least one episode with messages on every required topic "
                f"{plan.required}, got none"
            )
    except BaseException:
        if store is not None:
            store.close()
        if created and store is not None:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return store
