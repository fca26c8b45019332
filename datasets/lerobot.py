"""LeRobot dataset format v3.0: export a robotrl episode store to it, and import one (ours or anyone's) back.

LeRobot's format is how robot datasets are shared on the Hugging Face hub, and what LeRobot's policies train
on; this module lets a robotrl store leave for that world and come back without loss. Layout written::

    meta/info.json                 codebase_version "v3.0", fps, features, totals, path templates,
                                   plus "robotrl_spec" (the task Spec, so import restores it exactly)
    meta/stats.json                per feature: min / max / mean / std / count / q01 q10 q50 q90 q99
    meta/tasks.parquet             task string -> task_index (pandas layout: the string is the index)
    meta/episodes/chunk-000/file-000.parquet
                                   one row per episode: episode_index, tasks, length, data/ and videos/<key>/
                                   chunk and file indices, dataset_from/to_index, from/to_timestamp,
                                   stats/<feature>/<stat>, plus "robotrl/meta" (the episode's metadata, JSON)
    data/chunk-XXX/file-YYY.parquet
                                   one row per frame, episodes back to back
    videos/observation.images.<cam>/chunk-XXX/file-YYY.mp4
                                   one camera's frames, episodes back to back; an episode starts at its
                                   from_timestamp, frame i at from_timestamp + i / fps

Key mapping (robotrl -> LeRobot): ``state`` -> ``observation.state``; ``image_<cam>`` (any HxWx3 uint8 key;
without the prefix the whole key is the camera name) -> ``observation.images.<cam>``; any other numeric
observation ``<key>`` -> ``observation.<key>``; ``action`` -> ``action``; ``reward`` -> ``next.reward``;
``terminated`` / ``truncated`` -> ``next.terminated`` / ``next.truncated`` and their or, ``next.done``;
``success`` -> ``next.success``; ``intervention`` -> ``complementary_info.is_intervention`` (LeRobot's
HIL-SERL name); the wall clock ``timestamp`` -> ``complementary_info.wall_time`` (LeRobot's own ``timestamp``
is the time since the episode started, frame_index / fps). The task of an episode is its instruction, or the
spec's task name when it has none.

Video: the default codec, ``libx264rgb`` at qp 0 (H.264, lossless, RGB without a YUV conversion), makes the
round trip exact; it decodes everywhere FFmpeg does (PyAV, torchcodec), though not in a browser. LeRobot's
own choice, ``libsvtav1`` (yuv420p, crf 30), or ``libx264`` (yuv420p, crf 23) are several times smaller and
lossy: the tests bound the mean absolute pixel error on 64x64 renders at 6/255 (bench/RESULTS.md, "Measurements
behind the code's design"), with a large error on a few pixels at sharp color edges (chroma is stored at half
resolution). States, actions and every other column are exact whatever the codec. A keyframe every 2 frames, as
LeRobot, keeps random access (training) cheap.

Importing a foreign LeRobot dataset (no ``robotrl_spec``): the Spec is built from the features: task = the
info's ``repo_id`` or else the directory name; observations by the inverse of the mapping above (plus
``observation.image`` -> ``image``, dots in the rest -> ``_``), each with the feature's shape and dtype;
an ``instruction`` string observation (every LeRobot frame has a task); action bounds = stats.json min/max
of ``action`` (or, without stats, the data's); ``control_hz`` = fps; ``action_mode`` "unknown". Missing
``next.*`` columns become zeros, except that the last frame of an episode without ``next.done`` is marked
truncated; ``timestamp`` holds LeRobot's episode time; episode metadata gets ``source`` "imported".
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from robotrl.core.files import made_aside, read_json_object
from robotrl.core.spec import STRING, ArraySpec, Spec, SpecMismatchError
from robotrl.datasets.store import EpisodeStore, user_meta

CODEBASE_VERSION = "v3.0"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
CHUNKS_SIZE = 1000  # files per chunk directory, as LeRobot
DATA_FILES_SIZE_IN_MB = 100
VIDEO_FILES_SIZE_IN_MB = 200
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
#: at most this many frames of an episode enter its image statistics (LeRobot samples too)
IMAGE_STATS_FRAMES = 100

#: per-frame bookkeeping columns every LeRobot dataset has
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
#: robotrl per-step key -> LeRobot feature (all shape [1]); next.done is derived on export
STEP_FEATURES = {
    "reward": "next.reward",
    "terminated": "next.terminated",
    "truncated": "next.truncated",
    "success": "next.success",
    "intervention": "complementary_info.is_intervention",
    "timestamp": "complementary_info.wall_time",
}
INFO_REQUIRED = ("codebase_version", "fps", "features", "total_episodes", "total_frames", "data_path")
EPISODE_COLUMNS = (
    "episode_index",
    "length",
    "data/chunk_index",
    "data/file_index",
    "dataset_from_index",
    "dataset_to_index",
)
META_COLUMN = "robotrl/meta"


class LeRobotFormatError(ValueError):
    """A directory that is not a LeRobot v3.0 dataset, or one whose files disagree; names file, field, both values."""


# ---------------------------------------------------------------------------------------------------
# key mapping and features
# ---------------------------------------------------------------------------------------------------
def feature_name(key: str, spec: ArraySpec) -> str:
    """The LeRobot feature that holds robotrl observation `key` (or ``action``)."""
    if key == "action":
        return "action"
    if spec.is_image:
        return "observation.images." + (key[len("image_") :] if key.startswith("image_") else key)
    return f"observation.{key}"


def key_for_feature(name: str) -> str | None:
    """The robotrl observation key for a foreign LeRobot feature (None: not an observation or action)."""
    if name == "action":
        return "action"
    if name.startswith("observation.images."):
        return "image_" + name[len("observation.images.") :].replace(".", "_")
    if name.startswith("observation."):
        return name[len("observation.") :].replace(".", "_")
    return None


def _element_names(key: str, a: ArraySpec) -> list[str] | None:
    """Per-element names of a flat vector (LeRobot's ``names``), from the spec's fields when it has them."""
    if len(a.shape) != 1:
        return None
    if a.fields:
        return [n if k == 1 else f"{n}_{i}" for n, k in a.fields for i in range(k)]
    return [f"{key}_{i}" for i in range(a.shape[0])]


def _vector_feature(dtype: str, shape: tuple[int, ...], names: list[str] | None = None) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape) or [1], "names": names}


def _features_for(spec: Spec, video: bool) -> dict[str, dict[str, Any]]:
    """info.json ``features`` for a store of `spec` (video features get their ``info`` after encoding)."""
    out: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for key, a in [*spec.observations.items(), ("action", spec.action)]:
        if a.dtype == STRING:
            continue  # the instruction is the frame's task
        name = feature_name(key, a)
        if "/" in key or name in owner:
            raise SpecMismatchError(
                f"spec.observations.{key}: expected a key that maps to its own LeRobot feature "
                f"name without '/', got {name!r}" + (f" (also {owner[name]!r}'s)" if name in owner else "")
            )
        owner[name] = key
        if a.is_image:
            out[name] = {
                "dtype": "video" if video else "image",
                "shape": list(a.shape),
                "names": ["height", "width", "channels"],
            }
        else:
            out[name] = _vector_feature(a.dtype, a.shape, _element_names(key, a))
    out["next.reward"] = _vector_feature("float32", ())
    out["next.done"] = _vector_feature("bool", ())
    for key in ("terminated", "truncated", "success", "intervention"):
        out[STEP_FEATURES[key]] = _vector_feature("bool", ())
    out[STEP_FEATURES["timestamp"]] = _vector_feature("float64", ())
    out.update({k: dict(v) for k, v in DEFAULT_FEATURES.items()})
    return out


def _arrow_type(ft: Mapping[str, Any]) -> pa.DataType:
    """Arrow type of a parquet column, as Hugging Face datasets writes it (Sequence(length=n) = fixed-size list)."""
    if ft["dtype"] == "image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    t = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
    shape = list(ft["shape"])
    if shape == [1]:
        return t
    for n in reversed(shape):
        t = pa.list_(t, int(n))
    return t


def _hf_feature(ft: Mapping[str, Any]) -> dict[str, Any]:
    """The Hugging Face `datasets` description of a column, so the parquet files describe themselves."""
    if ft["dtype"] == "image":
        return {"_type": "Image"}
    value = {"dtype": ft["dtype"], "_type": "Value"}
    shape = list(ft["shape"])
    if shape == [1]:
        return value
    if len(shape) == 1:
        return {"feature": value, "length": shape[0], "_type": "Sequence"}
    return {"shape": shape, "dtype": ft["dtype"], "_type": f"Array{len(shape)}D"}


def _column(x: np.ndarray, ft: Mapping[str, Any]) -> pa.Array:
    """One episode's values of a feature as an arrow column of the feature's type."""
    typ = _arrow_type(ft)
    shape = list(ft["shape"])
    arr: pa.Array = pa.array(np.ascontiguousarray(x).reshape(-1).astype(np.dtype(ft["dtype"]), copy=False))
    if shape == [1]:
        return arr
    for n in reversed(shape):
        arr = pa.FixedSizeListArray.from_arrays(arr, int(n))
    return arr.cast(typ)


def _to_numpy(col: pa.ChunkedArray | pa.Array, shape: tuple[int, ...], where: str) -> np.ndarray:
    """An arrow column of (nested) lists or scalars as one array of shape (rows, *shape)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    rows = len(arr)
    while pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type) or pa.types.is_large_list(arr.type):
        arr = arr.flatten()
    flat = arr.to_numpy(zero_copy_only=False)
    size = int(np.prod(shape, dtype=np.int64))
    if flat.size != rows * size:
        raise LeRobotFormatError(
            f"{where}: expected {rows} rows of shape {list(shape)} ({rows * size} values), got {flat.size} values"
        )
    return flat.reshape(rows, *shape)


# ---------------------------------------------------------------------------------------------------
# statistics, in LeRobot's layout: per feature min/max/mean/std/count and quantiles
# ---------------------------------------------------------------------------------------------------
def _feature_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics over axis 0 of one episode's values (rows, *shape)."""
    x = x.astype(np.float64).reshape(len(x), -1) if x.ndim == 1 else x.astype(np.float64)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([len(x)])}
    for q, v in zip(QUANTILES, np.quantile(x, QUANTILES, axis=0)):
        out[f"q{round(q * 100):02d}"] = v
    return out


def _image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of uint8 HxWx3 frames in [0, 1], shape (3, 1, 1), over at most
    IMAGE_STATS_FRAMES evenly spaced frames downsampled to about 150 pixels a side, as LeRobot does."""
    idx = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), IMAGE_STATS_FRAMES)).round().astype(int))
    step = max(1, max(frames.shape[1:3]) // 150)
    px = frames[idx, ::step, ::step].reshape(-1, frames.shape[-1]).astype(np.float64) / 255.0
    out = {"min": px.min(0), "max": px.max(0), "mean": px.mean(0), "std": px.std(0)}
    for q, v in zip(QUANTILES, np.quantile(px, QUANTILES, axis=0)):
        out[f"q{round(q * 100):02d}"] = v
    out = {k: v.reshape(-1, 1, 1) for k, v in out.items()}
    out["count"] = np.array([len(idx)])
    return out


def _aggregate_stats(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset statistics from episode statistics: exact min/max/mean/std; quantiles count-weighted (LeRobot's rule)."""
    counts = np.stack([s["count"] for s in per_episode]).astype(np.float64)
    total = counts.sum(0)
    means = np.stack([s["mean"] for s in per_episode])
    w = counts.reshape(-1, *[1] * (means.ndim - 1))
    mean = (means * w).sum(0) / total
    var = ((np.stack([s["std"] for s in per_episode]) ** 2 + (means - mean) ** 2) * w).sum(0) / total
    out = {
        "min": np.min([s["min"] for s in per_episode], 0),
        "max": np.max([s["max"] for s in per_episode], 0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": total.astype(np.int64),
    }
    for k in per_episode[0]:
        if k.startswith("q"):
            out[k] = (np.stack([s[k] for s in per_episode]) * w).sum(0) / total
    return out


# ---------------------------------------------------------------------------------------------------
# writers that roll over to the next file, as LeRobot does past a size limit
# ---------------------------------------------------------------------------------------------------
def _next_file(chunk: int, file: int) -> tuple[int, int]:
    return (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)


class _ParquetFiles:
    """Frame rows into data/chunk-XXX/file-YYY.parquet, one row group per episode, a new file past `limit_mb`."""

    def __init__(self, root: Path, schema: pa.Schema, limit_mb: float) -> None:
        self.root, self.schema, self.limit = root, schema, limit_mb * 1024 * 1024
        self.chunk, self.file, self.bytes = 0, 0, 0
        self.writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> tuple[int, int]:
        if self.writer is not None and self.bytes >= self.limit:
            self.close()
            self.chunk, self.file = _next_file(self.chunk, self.file)
        if self.writer is None:
            path = self.root / DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer, self.bytes = pq.ParquetWriter(path, self.schema, compression="snappy"), 0
        self.writer.write_table(table)
        self.bytes += table.nbytes
        return self.chunk, self.file

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _codec_options(vcodec: str, crf: int | None) -> tuple[dict[str, str], str]:
    """Encoder options and pixel format: lossless (qp 0, RGB) for libx264rgb unless `crf` is given,
    LeRobot's settings (crf 30, yuv420p, preset 12) for libsvtav1; a keyframe every 2 frames for fast seeks."""
    if vcodec == "libx264rgb":
        return {"g": "2", **({"crf": str(crf)} if crf is not None else {"qp": "0"})}, "rgb24"
    if vcodec in ("libx264", "h264"):
        return {"g": "2", "crf": str(23 if crf is None else crf)}, "yuv420p"
    if vcodec == "libsvtav1":
        return {"g": "2", "crf": str(30 if crf is None else crf), "preset": "12"}, "yuv420p"
    raise ValueError(f"vcodec: expected one of 'libx264rgb' (lossless), 'libx264', 'libsvtav1', got {vcodec!r}")


class _VideoFiles:
    """One camera's frames into videos/<key>/chunk-XXX/file-YYY.mp4, episodes back to back, a new file past
    `limit_mb`."""

    def __init__(self, root: Path, key: str, fps: int, vcodec: str, crf: int | None, limit_mb: float) -> None:
        self.root, self.key, self.fps, self.vcodec = root, key, fps, vcodec
        self.options, self.pix_fmt = _codec_options(vcodec, crf)
        self.limit = limit_mb * 1024 * 1024
        self.chunk, self.file, self.frames, self.bytes = 0, 0, 0, 0
        self.container: Any = None
        self.stream: Any = None

    @property
    def path(self) -> Path:
        return self.root / VIDEO_PATH.format(video_key=self.key, chunk_index=self.chunk, file_index=self.file)

    def write(self, frames: np.ndarray) -> dict[str, Any]:
        """Append one episode; returns its videos/<key>/ columns of the episodes table."""
        # bytes handed to the muxer so far (the file itself lags behind by the muxer's buffer; an encoder with
        # lookahead, such as SVT-AV1, holds back some frames too, so the limit is approximate, as in LeRobot)
        if self.container is not None and self.bytes >= self.limit:
            self.close()
            self.chunk, self.file = _next_file(self.chunk, self.file)
        if self.container is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.container = av.open(str(self.path), "w", options={"movflags": "faststart"})
            self.stream = self.container.add_stream(self.vcodec, rate=self.fps, options=self.options)
            self.stream.pix_fmt, self.stream.height, self.stream.width = self.pix_fmt, *frames.shape[1:3]
            self.frames, self.bytes = 0, 0
        start = self.frames
        for img in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            frame.pts, frame.time_base = self.frames, Fraction(1, self.fps)
            for packet in self.stream.encode(frame):
                self.bytes += packet.size
                self.container.mux(packet)
            self.frames += 1
        p = f"videos/{self.key}/"
        return {
            p + "chunk_index": self.chunk,
            p + "file_index": self.file,
            p + "from_timestamp": start / self.fps,
            p + "to_timestamp": self.frames / self.fps,
        }

    def close(self) -> None:
        if self.container is not None:
            for packet in self.stream.encode():
                self.container.mux(packet)
            self.container.close()
            self.container = None


def video_info(path: Path) -> dict[str, Any]:
    """The ``info`` block LeRobot keeps in a video feature, read from the first file's stream."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        pix = s.codec_context.pix_fmt or s.pix_fmt
        if pix is None or s.base_rate is None:
            raise ValueError(f"{path}: its video stream has no pixel format or frame rate")
        return {
            "video.height": s.height,
            "video.width": s.width,
            "video.codec": s.codec.canonical_name,
            "video.pix_fmt": pix,
            "video.is_depth_map": False,
            "video.fps": int(s.base_rate),
            "video.channels": 1 if "gray" in pix else 4 if pix.startswith(("rgba", "bgra", "yuva", "gbrap")) else 3,
            "has_audio": len(c.streams.audio) > 0,
        }


# ---------------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------------
def export_lerobot(
    store_or_path: EpisodeStore | str | Path,
    out_dir: str | Path,
    fps: int | None = None,
    video: bool = True,
    repo_id: str | None = None,
    vcodec: str = "libx264rgb",
    crf: int | None = None,
    data_files_size_in_mb: float = DATA_FILES_SIZE_IN_MB,
    video_files_size_in_mb: float = VIDEO_FILES_SIZE_IN_MB,
    progress: bool = True,
) -> Path:
    """Write every committed episode of a store as a LeRobot v3.0 dataset at `out_dir`; returns `out_dir`.

    `fps` defaults to the spec's control rate (LeRobot needs an integer). With `video`, cameras become mp4
    files (codec `vcodec`, lossless by default; `crf` trades exactness for size); without, PNG images inside
    the parquet rows (dtype "image"). `repo_id` names the dataset in info.json and its card. The dataset is
    written beside `out_dir` and renamed into place last, so a failure never leaves a half-written dataset
    under the final name.
    """
    store = store_or_path if isinstance(store_or_path, EpisodeStore) else EpisodeStore.open(store_or_path)
    out = Path(out_dir)
    rate = store.spec.control_hz if fps is None else fps
    if float(rate) <= 0 or not float(rate).is_integer():
        raise ValueError(
            f"fps: LeRobot v3.0 needs a positive integer frame rate, got {rate!r}"
            + (" (the spec's control_hz); pass fps=" if fps is None else "")
        )
    if store.num_episodes == 0:
        raise ValueError(f"{store.path}: the store has no committed episodes; nothing to export")
    _, pix_fmt = _codec_options(vcodec, crf)  # a bad codec fails before any file is written
    odd = [k for k, a in store.spec.observations.items() if a.is_image and (a.shape[0] % 2 or a.shape[1] % 2)]
    if video and pix_fmt == "yuv420p" and odd:
        raise ValueError(
            f"vcodec: {vcodec!r} encodes yuv420p, which needs an even height and width; "
            f"{odd[0]!r} is {store.spec.observations[odd[0]].shape}; use vcodec='libx264rgb' or video=False"
        )

    with made_aside(out, "a LeRobot dataset") as tmp:
        tmp.mkdir(parents=True)
        info = _write_dataset(
            store, tmp, int(rate), video, vcodec, crf, data_files_size_in_mb, video_files_size_in_mb, progress
        )
        info["repo_id"] = repo_id or f"robotrl/{store.spec.task}"
        info["robotrl_spec"] = store.spec.to_dict()
        (tmp / INFO_PATH).write_text(json.dumps(info, indent=4, ensure_ascii=False))
        _write_card(tmp, info)
    return out


def _write_dataset(
    store: EpisodeStore,
    root: Path,
    fps: int,
    video: bool,
    vcodec: str,
    crf: int | None,
    data_mb: float,
    video_mb: float,
    progress: bool,
) -> dict[str, Any]:
    """Frames, videos, episodes, tasks and stats under `root`; returns info.json's LeRobot fields."""
    spec = store.spec
    features = _features_for(spec, video)
    obs_keys = {k: a for k, a in spec.observations.items() if a.dtype != STRING}
    source = {feature_name(k, a): k for k, a in obs_keys.items()}  # LeRobot feature -> robotrl key
    source.update({"action": "action", **{v: k for k, v in STEP_FEATURES.items()}})
    columns = [name for name, ft in features.items() if ft["dtype"] != "video"]
    schema = pa.schema(
        [(n, _arrow_type(features[n])) for n in columns],
        metadata={"huggingface": json.dumps({"info": {"features": {n: _hf_feature(features[n]) for n in columns}}})},
    )
    data_files = _ParquetFiles(root, schema, data_mb)
    videos = {
        name: _VideoFiles(root, name, fps, vcodec, crf, video_mb)
        for name, ft in features.items()
        if ft["dtype"] == "video"
    }
    tasks: dict[str, int] = {}
    episodes: list[dict[str, Any]] = []
    stats: dict[str, list[dict[str, np.ndarray]]] = {name: [] for name in features}
    frame = 0
    try:
        for i in tqdm(
            range(store.num_episodes),
            desc=f"export {spec.task} to LeRobot",
            unit="ep",
            disable=not progress,
            leave=False,
        ):
            ep = store.episode(i)
            n = len(ep)
            task = ep.meta.get("instruction") or spec.task
            values = {name: ep.data[key] for name, key in source.items() if name in features}
            values.update(
                {
                    "next.done": ep.data["terminated"] | ep.data["truncated"],
                    "timestamp": (np.arange(n) / fps).astype(np.float32),
                    "frame_index": np.arange(n, dtype=np.int64),
                    "episode_index": np.full(n, i, np.int64),
                    "index": np.arange(frame, frame + n, dtype=np.int64),
                    "task_index": np.full(n, tasks.setdefault(task, len(tasks)), np.int64),
                }
            )
            table = pa.Table.from_arrays(
                [
                    _png_column(values[c]) if features[c]["dtype"] == "image" else _column(values[c], features[c])
                    for c in columns
                ],
                schema=schema,
            )
            chunk, file = data_files.write(table)
            row: dict[str, Any] = {
                "episode_index": i,
                "tasks": [task],
                "length": n,
                "data/chunk_index": chunk,
                "data/file_index": file,
                "dataset_from_index": frame,
                "dataset_to_index": frame + n,
            }
            for name, writer in videos.items():
                row.update(writer.write(values[name]))
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            for name, ft in features.items():
                st = _image_stats(values[name]) if ft["dtype"] in ("image", "video") else _feature_stats(values[name])
                stats[name].append(st)
                row.update({f"stats/{name}/{k}": v.tolist() for k, v in st.items()})
            meta = user_meta(ep.meta)
            row[META_COLUMN] = json.dumps(meta, default=str)
            episodes.append(row)
            frame += n
    finally:
        data_files.close()
        for writer in videos.values():
            writer.close()

    for name in videos:
        features[name]["info"] = video_info(root / VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0))
    path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(episodes), path)
    _write_tasks(root / TASKS_PATH, tasks)
    agg = {name: {k: v.tolist() for k, v in _aggregate_stats(s).items()} for name, s in stats.items()}
    (root / STATS_PATH).write_text(json.dumps(agg, indent=4))
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": spec.metadata.get("robot_type"),
        "total_episodes": len(episodes),
        "total_frames": frame,
        "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": data_mb,
        "video_files_size_in_mb": video_mb,
        "fps": fps,
        "splits": {"train": f"0:{len(episodes)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if videos else None,
        "features": features,
    }


def _png_column(frames: np.ndarray) -> pa.Array:
    """Frames as LeRobot "image" cells: structs of PNG bytes and a (null) path, as `datasets.Image` embeds them."""
    from PIL import Image

    data = []
    for img in frames:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        data.append(buf.getvalue())
    return pa.StructArray.from_arrays(
        [pa.array(data, pa.binary()), pa.nulls(len(data), pa.string())], names=["bytes", "path"]
    )


def _write_tasks(path: Path, tasks: Mapping[str, int]) -> None:
    """meta/tasks.parquet exactly as LeRobot writes it with pandas: the task string is the (unnamed) index."""
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    schema = pa.schema(
        [("task_index", pa.int64()), ("__index_level_0__", pa.string())], metadata={"pandas": json.dumps(pandas_meta)}
    )
    pq.write_table(
        pa.table({"task_index": list(tasks.values()), "__index_level_0__": list(tasks)}, schema=schema), path
    )


def _write_card(root: Path, info: Mapping[str, Any]) -> None:
    """A minimal dataset card (README.md) so the hub lists the dataset as LeRobot and finds its parquet files."""
    shown = {k: v for k, v in info.items() if k != "robotrl_spec"}
    root.joinpath("README.md").write_text(
        "---\nlicense: other\ntags:\n- LeRobot\n- robotrl\ntask_categories:\n- robotics\nconfigs:\n"
        "- config_name: default\n  data_files: data/*/*.parquet\n---\n\n"
        f"# {info['repo_id']}\n\nExported from a robotrl episode store (task `{info['robotrl_spec']['task']}`).\n\n"
        f"[meta/info.json](meta/info.json):\n```json\n{json.dumps(shown, indent=4)}\n```\n"
    )


# ---------------------------------------------------------------------------------------------------
# reading a v3.0 dataset
# ---------------------------------------------------------------------------------------------------
def read_info(root: str | Path) -> dict[str, Any]:
    """meta/info.json, checked: a v3.x dataset with every field this module relies on."""
    root = Path(root)
    path = root / INFO_PATH
    if not root.is_dir():
        raise LeRobotFormatError(f"{root}: expected a LeRobot v3.0 dataset directory, got no such directory")
    if not path.is_file():
        hint = (
            " (it looks like a robotrl zarr store; open it with EpisodeStore.open)"
            if (root / "zarr.json").exists()
            else ""
        )
        raise LeRobotFormatError(
            f"{path}: expected the LeRobot v3.0 metadata file meta/info.json, got no such file{hint}"
        )
    info = read_json_object(path, LeRobotFormatError)
    version = info.get("codebase_version")
    if not isinstance(version, str) or not version.startswith("v3."):
        hint = " (convert older datasets with lerobot's convert_dataset_v21_to_v30)" if isinstance(version, str) else ""
        raise LeRobotFormatError(
            f"{path}: field 'codebase_version': expected {CODEBASE_VERSION!r}, got {version!r}{hint}"
        )
    missing = [k for k in INFO_REQUIRED if k not in info]
    if missing:
        raise LeRobotFormatError(f"{path}: missing field(s) {missing}; expected all of {list(INFO_REQUIRED)}")
    if not isinstance(info["fps"], (int, float)) or info["fps"] <= 0:
        raise LeRobotFormatError(f"{path}: field 'fps': expected a positive number, got {info['fps']!r}")
    feats = info["features"]
    if not isinstance(feats, dict) or "action" not in feats:
        raise LeRobotFormatError(
            f"{path}: field 'features': expected an object with an 'action' feature, "
            f"got {sorted(feats) if isinstance(feats, dict) else feats!r}"
        )
    for name, ft in feats.items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise LeRobotFormatError(
                f"{path}: field 'features.{name}': expected an object with 'dtype' and 'shape', got {ft!r}"
            )
    if any(ft["dtype"] == "video" for ft in feats.values()) and not info.get("video_path"):
        raise LeRobotFormatError(
            f"{path}: field 'video_path': expected a path template (there are video "
            f"features), got {info.get('video_path')!r}"
        )
    return info


def read_tasks(root: Path) -> dict[int, str]:
    """task_index -> task string, from either the pandas layout (string index) or a plain ``task`` column."""
    path = root / TASKS_PATH
    if not path.is_file():
        raise LeRobotFormatError(f"{path}: expected the task table meta/tasks.parquet, got no such file")
    table = pq.read_table(path)
    index_cols = []
    meta = table.schema.metadata or {}
    if b"pandas" in meta:
        index_cols = [c for c in json.loads(meta[b"pandas"]).get("index_columns", []) if isinstance(c, str)]
    name = next((c for c in ["task", *index_cols, "__index_level_0__"] if c in table.column_names), None)
    if name is None or "task_index" not in table.column_names:
        raise LeRobotFormatError(
            f"{path}: expected columns 'task_index' and the task string ('task' or the "
            f"pandas index), got {table.column_names}"
        )
    return dict(zip(table["task_index"].to_pylist(), table[name].to_pylist()))


def read_episodes(root: Path) -> list[dict[str, Any]]:
    """Rows of meta/episodes/*/*.parquet (stats columns left out), sorted by episode_index, checked for the
    columns import needs."""
    files = sorted((root / EPISODES_DIR).glob("*/*.parquet"))
    if not files:
        raise LeRobotFormatError(
            f"{root / EPISODES_DIR}: expected episode metadata files chunk-XXX/file-YYY.parquet, got none"
        )
    rows: list[dict[str, Any]] = []
    for f in files:
        table = pq.read_table(f)
        missing = [c for c in EPISODE_COLUMNS if c not in table.column_names]
        if missing:
            raise LeRobotFormatError(f"{f}: missing column(s) {missing}; expected all of {list(EPISODE_COLUMNS)}")
        keep = [c for c in table.column_names if not c.startswith("stats/")]
        rows += table.select(keep).to_pylist()
    return sorted(rows, key=lambda r: r["episode_index"])


class _DataReader:
    """Frame rows of one episode at a time, from the data file its episode row names (one file in memory)."""

    def __init__(self, root: Path, info: Mapping[str, Any]) -> None:
        self.root, self.template = root, info["data_path"]
        self.loaded: tuple[int, int] | None = None

    def episode(self, ep: Mapping[str, Any]) -> tuple[pa.Table, Path]:
        key = (int(ep["data/chunk_index"]), int(ep["data/file_index"]))
        path = self.root / self.template.format(chunk_index=key[0], file_index=key[1])
        if key != self.loaded:
            if not path.is_file():
                raise LeRobotFormatError(
                    f"{path}: expected the data file of episode {ep['episode_index']}, got no such file"
                )
            self.table = pq.read_table(path)
            for col in ("episode_index", "frame_index"):
                if col not in self.table.column_names:
                    raise LeRobotFormatError(f"{path}: missing column {col!r}; got {self.table.column_names}")
            self.episode_index = self.table["episode_index"].to_numpy()
            self.loaded = key
        rows = np.flatnonzero(self.episode_index == ep["episode_index"])
        table = self.table.take(pa.array(rows))
        order = np.argsort(table["frame_index"].to_numpy(), kind="stable")
        return table.take(pa.array(order)), path


class _VideoReader:
    """Decodes one camera's files in order and hands out each episode's frames, checked against its timestamps."""

    def __init__(self, root: Path, info: Mapping[str, Any], key: str) -> None:
        self.root, self.template, self.key, self.fps = root, info["video_path"], key, float(info["fps"])
        self.file: tuple[int, int] | None = None
        self.frames: Iterator[av.VideoFrame] = iter(())
        self.container: Any = None
        self.pending: av.VideoFrame | None = None

    def episode(self, ep: Mapping[str, Any], length: int, shape: tuple[int, ...]) -> np.ndarray:
        p = f"videos/{self.key}/"
        if p + "chunk_index" not in ep:
            raise LeRobotFormatError(
                f"meta/episodes: episode {ep['episode_index']} has no column {p + 'chunk_index'!r} "
                f"for video feature {self.key!r}"
            )
        key = (int(ep[p + "chunk_index"]), int(ep[p + "file_index"]))
        path = self.root / self.template.format(video_key=self.key, chunk_index=key[0], file_index=key[1])
        if key != self.file:
            self.close()
            if not path.is_file():
                raise LeRobotFormatError(
                    f"{path}: expected the video of episode {ep['episode_index']}, got no such file"
                )
            self.container = av.open(str(path))
            self.frames = self.container.decode(self.container.streams.video[0])
            self.file, self.pending = key, None
        start, half = float(ep[p + "from_timestamp"]), 0.5 / self.fps
        out = np.empty((length, *shape), np.uint8)
        n = 0
        while n < length:
            frame, self.pending = (self.pending if self.pending is not None else next(self.frames, None)), None
            if frame is None:
                break
            t = float(frame.time)
            if t < start - half:
                continue  # a frame of an earlier episode this one does not use
            if t >= start + (length - 0.5) / self.fps:
                self.pending = frame
                break
            if abs(t - (start + n / self.fps)) > half:
                raise LeRobotFormatError(
                    f"{path}: episode {ep['episode_index']} frame {n}: expected timestamp "
                    f"{start + n / self.fps:.4f} s, got {t:.4f} s"
                )
            img = frame.to_ndarray(format="rgb24")
            if img.shape != tuple(shape):
                raise LeRobotFormatError(
                    f"{path}: expected frames of shape {list(shape)} (info.json features."
                    f"{self.key}), got {list(img.shape)}"
                )
            out[n] = img
            n += 1
        if n != length:
            raise LeRobotFormatError(
                f"{path}: episode {ep['episode_index']}: expected {length} frames from "
                f"{start:.4f} s (its length), got {n}"
            )
        return out

    def close(self) -> None:
        if self.container is not None:
            self.container.close()
            self.container = None


# ---------------------------------------------------------------------------------------------------
# import
# ---------------------------------------------------------------------------------------------------
def _feature_shape(name: str, ft: Mapping[str, Any]) -> tuple[int, ...]:
    """A feature's shape as robotrl keeps it: images height x width x channels (LeRobot may list them c, h, w)."""
    shape = tuple(int(s) for s in ft["shape"])
    names = ft.get("names") or []
    if ft["dtype"] in ("image", "video") and len(shape) == 3 and list(names)[:1] in (["channels"], ["channel"]):
        shape = (shape[1], shape[2], shape[0])
    return shape


def _foreign_keys(feats: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """robotrl key -> LeRobot feature for the observations and action of a foreign dataset, and the features
    that have no robotrl place (kept out, named in the spec's metadata)."""
    keys: dict[str, str] = {}
    skipped = []
    known = {*DEFAULT_FEATURES, *STEP_FEATURES.values(), "next.done"}
    for name, ft in feats.items():
        key = key_for_feature(name)
        if key is None or ft["dtype"] == "string":
            if name not in known:
                skipped.append(name)
            continue
        if key in keys:
            raise LeRobotFormatError(
                f"{INFO_PATH}: features {keys[key]!r} and {name!r} both map to robotrl key {key!r}"
            )
        keys[key] = name
    return keys, skipped


def _names_as_fields(ft: Mapping[str, Any], shape: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    names = ft.get("names")
    if isinstance(names, list) and len(shape) == 1 and len(names) == shape[0] and ft["dtype"] not in ("image", "video"):
        return tuple((str(n), 1) for n in names)
    return ()


def spec_from_info(root: Path, info: Mapping[str, Any]) -> Spec:
    """A Spec for a foreign LeRobot dataset, built from its features (rules in the module docstring)."""
    feats = info["features"]
    keys, skipped = _foreign_keys(feats)
    observations: dict[str, ArraySpec] = {}
    for key, name in keys.items():
        ft = feats[name]
        shape = _feature_shape(name, ft)
        if key == "action":
            continue
        if ft["dtype"] in ("image", "video"):
            observations[key] = ArraySpec(shape, "uint8", 0, 255)
        else:
            observations[key] = ArraySpec(shape, ft["dtype"], fields=_names_as_fields(ft, shape))
    observations["instruction"] = ArraySpec((), STRING)
    ft = feats["action"]
    shape = _feature_shape("action", ft)
    low, high = _action_bounds(root, info, shape)
    return Spec(
        task=str(info.get("repo_id") or root.resolve().name),
        observations=observations,
        action=ArraySpec(shape, ft["dtype"], low, high, fields=_names_as_fields(ft, shape)),
        action_mode="unknown",
        control_hz=float(info["fps"]),
        metadata={
            "lerobot": {
                "repo_id": info.get("repo_id"),
                "robot_type": info.get("robot_type"),
                "codebase_version": info["codebase_version"],
                "skipped_features": skipped,
            }
        },
    )


def _action_bounds(root: Path, info: Mapping[str, Any], shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Action min/max from meta/stats.json, or from the data files when there are no stats."""
    path = root / STATS_PATH
    if path.is_file():
        st = json.loads(path.read_text()).get("action", {})
        if "min" in st and "max" in st:
            return np.asarray(st["min"], np.float64).reshape(shape), np.asarray(st["max"], np.float64).reshape(shape)
    lo, hi = np.full(shape, np.inf), np.full(shape, -np.inf)
    for f in sorted((root / "data").glob("*/*.parquet")):
        x = _to_numpy(pq.read_table(f, columns=["action"])["action"], shape, f"{f}: column 'action'")
        lo, hi = np.minimum(lo, x.min(0)), np.maximum(hi, x.max(0))
    return lo, hi


def import_lerobot(
    in_dir: str | Path,
    out_store_path: str | Path,
    spec: Spec | None = None,
    progress: bool = True,
) -> EpisodeStore:
    """Read a LeRobot v3.x dataset into a new robotrl episode store at `out_store_path` (returned open for appending).

    The Spec is the one saved by `export_lerobot` when present (a given `spec` must then equal it), else
    `spec`, else one built from the features (see the module docstring). Every frame, episode boundary and
    episode's metadata is kept; a file or field that disagrees with the others is a `LeRobotFormatError`,
    and the half-written store is removed.
    """
    root = Path(in_dir)
    info = read_info(root)
    feats = info["features"]
    saved = info.get("robotrl_spec")
    if saved is not None:
        try:
            file_spec = Spec.from_dict(saved)
        except (KeyError, TypeError, ValueError) as e:
            raise LeRobotFormatError(
                f"{root / INFO_PATH}: field 'robotrl_spec' is not a valid robotrl Spec: {e}"
            ) from e
        if spec is not None:
            spec.check(file_spec, this="given spec", that=f"{root / INFO_PATH} robotrl_spec")
        spec = file_spec
    elif spec is None:
        spec = spec_from_info(root, info)
    # robotrl key -> LeRobot feature, each checked against info.json
    foreign = _foreign_keys(feats)[0]
    mapping: dict[str, str] = {}
    for key, a in [*spec.observations.items(), ("action", spec.action)]:
        if a.dtype == STRING:
            continue
        name = feature_name(key, a) if saved is not None else foreign.get(key, feature_name(key, a))
        if name not in feats:
            raise SpecMismatchError(
                f"{root / INFO_PATH}: features: expected {name!r} for spec key {key!r}, got only {sorted(feats)}"
            )
        shape = _feature_shape(name, feats[name])
        if int(np.prod(shape)) != a.size or (a.is_image and shape != a.shape):
            raise SpecMismatchError(
                f"{root / INFO_PATH}: features.{name}.shape: spec key {key!r} has "
                f"{list(a.shape)}, the dataset has {list(shape)}"
            )
        mapping[key] = name
    tasks = read_tasks(root)
    episodes = read_episodes(root)
    data = _DataReader(root, info)
    videos = {name: _VideoReader(root, info, name) for name in mapping.values() if feats[name]["dtype"] == "video"}
    store = EpisodeStore.create(out_store_path, spec)
    try:
        for ep in tqdm(episodes, desc=f"import {root.name}", unit="ep", disable=not progress, leave=False):
            store.append_episode(*_episode(ep, data, videos, mapping, spec, tasks, info, root))
    except BaseException:
        store.close()
        shutil.rmtree(store.path, ignore_errors=True)  # we created it: a whole store or none
        raise
    finally:
        for r in videos.values():
            r.close()
    return store


def _episode(
    ep: Mapping[str, Any],
    data: _DataReader,
    videos: Mapping[str, _VideoReader],
    mapping: Mapping[str, str],
    spec: Spec,
    tasks: Mapping[int, str],
    info: Mapping[str, Any],
    root: Path,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One episode's per-step arrays and metadata, read from its rows and videos and checked against its row."""
    i, n = int(ep["episode_index"]), int(ep["length"])
    table, path = data.episode(ep)
    where = f"{path}: episode {i}"
    if table.num_rows != n or int(ep["dataset_to_index"]) - int(ep["dataset_from_index"]) != n:
        raise LeRobotFormatError(
            f"{where}: expected {n} frame rows (meta/episodes length; dataset_from/to_index "
            f"{ep['dataset_from_index']}..{ep['dataset_to_index']}), got {table.num_rows}"
        )
    if not np.array_equal(table["frame_index"].to_numpy(), np.arange(n)):
        raise LeRobotFormatError(
            f"{where}: column 'frame_index': expected 0..{n - 1}, got "
            f"{table['frame_index'].to_numpy()[:10].tolist()}..."
        )
    arrays_spec = {k: a for k, a in spec.observations.items() if a.dtype != STRING}
    arrays_spec["action"] = spec.action
    out: dict[str, np.ndarray] = {}
    for key, name in mapping.items():
        a, ft = arrays_spec[key], info["features"][name]
        if ft["dtype"] == "video":
            out[key] = videos[name].episode(ep, n, a.shape)
        elif name not in table.column_names:
            raise LeRobotFormatError(f"{path}: missing column {name!r} (features.{name}); got {table.column_names}")
        elif ft["dtype"] == "image":
            out[key] = _decode_pngs(table[name], a.shape, f"{where}: column {name!r}")
        else:
            out[key] = _to_numpy(table[name], a.shape, f"{where}: column {name!r}").astype(a.dtype)

    def column(name: str, dtype: str) -> np.ndarray | None:
        return (
            _to_numpy(table[name], (), f"{where}: column {name!r}").astype(dtype)
            if name in table.column_names
            else None
        )

    done = column("next.done", "bool")
    term, trunc = column(STEP_FEATURES["terminated"], "bool"), column(STEP_FEATURES["truncated"], "bool")
    if trunc is None:
        trunc = np.zeros(n, bool)
        if done is None:
            trunc[-1] = True  # the episode ended; the dataset does not say that the task did
    if term is None:
        term = done & ~trunc if done is not None else np.zeros(n, bool)
    out["terminated"], out["truncated"] = term, trunc
    zeros = {"reward": np.zeros(n, np.float32), "success": np.zeros(n, bool), "intervention": np.zeros(n, bool)}
    for key, default in zeros.items():
        got = column(STEP_FEATURES[key], default.dtype.name)
        out[key] = default if got is None else got
    wall, episode_time = column(STEP_FEATURES["timestamp"], "float64"), column("timestamp", "float64")
    out["timestamp"] = (
        wall if wall is not None else episode_time if episode_time is not None else np.arange(n) / float(info["fps"])
    )

    if ep.get(META_COLUMN):
        meta = json.loads(ep[META_COLUMN])
    else:
        ids = table["task_index"].to_numpy() if "task_index" in table.column_names else np.zeros(0, int)
        names = [tasks.get(int(t)) for t in dict.fromkeys(ids.tolist())] or list(ep.get("tasks") or [])
        meta = {
            "instruction": names[0] if names else None,
            "success": bool(out["success"].any()),
            "source": "imported",
            "robot": info.get("robot_type") or "unknown",
            "control_hz": float(info["fps"]),
            "lerobot_episode_index": i,
            "origin": {"dataset": str(root), "episode": i},
        }
        if len(names) > 1:
            meta["tasks"] = names
    return out, meta


def _decode_pngs(col: pa.ChunkedArray, shape: tuple[int, ...], where: str) -> np.ndarray:
    """LeRobot "image" cells (structs with PNG/JPEG bytes) as uint8 frames."""
    from PIL import Image

    out = np.empty((len(col), *shape), np.uint8)
    for j, cell in enumerate(col.to_pylist()):
        img = np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))
        if img.shape != tuple(shape):
            raise LeRobotFormatError(
                f"{where}: row {j}: expected an image of shape {list(shape)}, got {list(img.shape)}"
            )
        out[j] = img
    return out


__all__ = [
    "CODEBASE_VERSION",
    "LeRobotFormatError",
    "export_lerobot",
    "feature_name",
    "import_lerobot",
    "key_for_feature",
    "read_episodes",
    "read_info",
    "read_tasks",
    "spec_from_info",
]
