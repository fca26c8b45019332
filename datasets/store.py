"""The episode store: robot data on disk as a zarr v3 group that a crash cannot corrupt.

Layout (``<name>.zarr/``)::

    zarr.json           root attributes: {"robotrl": {"format", "version"}, "spec": <the task Spec>}
    data/<key>          one array per key, all episodes back to back along axis 0, chunked in time,
                        zstd-compressed and CRC32C-checksummed (a flipped or truncated chunk fails to decode)
    meta/zarr.json      the commit record: {"episode_ends", "episodes" (per-episode metadata), "stats",
                        "checksum" (SHA-256 of the other three, so an edited or damaged record is refused)}

Per-step keys are the spec's numeric observations plus ``action``, ``reward``, ``terminated``,
``truncated``, ``success``, ``intervention`` (a human acted at this step) and ``timestamp`` (wall clock).
A string observation such as the language instruction is constant within an episode and lives in the
episode's metadata.

Crash safety rests on two facts. zarr's `LocalStore` replaces every file atomically (write to a temporary
name, then rename), so each file is always a whole old or a whole new version. And the writer appends an
episode's rows first and commits it last, by rewriting the one file ``meta/zarr.json``: readers trust only
rows below the last committed episode end. A writer killed at any point therefore leaves a store whose
finalized episodes are intact; the next writer trims the uncommitted tail. One writer at a time holds an
``flock`` (released by the kernel when the process dies); any number of readers may open the store while it
appends and see new episodes after `refresh()`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from robotrl.core.files import made_aside, try_flock
from robotrl.core.spec import STRING, ArraySpec, Spec, SpecMismatchError

if TYPE_CHECKING:
    from zarr.core.array_spec import ArrayConfigParams

FORMAT = "robotrl-episodes"
VERSION = 1
SOURCES = ("teleop", "scripted", "policy", "intervention", "imported")

#: per-step keys every store has besides the observations: name -> (dtype, shape)
STEP_KEYS: dict[str, tuple[str, tuple[int, ...]]] = {
    "reward": ("float32", ()),
    "terminated": ("bool", ()),
    "truncated": ("bool", ()),
    "success": ("bool", ()),
    "intervention": ("bool", ()),
    "timestamp": ("float64", ()),
}
RESERVED = ("action", *STEP_KEYS)
#: per-episode metadata the store itself writes (the episode's place in the arrays)
RECORD_KEYS = ("index", "start", "end", "length")
#: every chunk is written, even an all-zero one, so that a missing chunk file is always damage, never "empty"
ARRAY_CONFIG: ArrayConfigParams = {"write_empty_chunks": True}
CHUNK_BYTES = 256 * 1024  # small enough that a random image window decodes little, large enough to compress


class StoreError(RuntimeError):
    """A store that cannot be opened or written as asked; the message says what and where."""


class CorruptChunkError(StoreError):
    """A chunk that is missing or fails its checksum; names the array, the chunk and the episodes it holds."""


def chunk_rows(shape: tuple[int, ...], dtype: str) -> int:
    """Rows per chunk: a power of two near CHUNK_BYTES per chunk, between 1 and 4096 rows."""
    row = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return int(min(4096, max(1, 2 ** math.floor(math.log2(max(1, CHUNK_BYTES // row))))))


def step_arrays(spec: Spec) -> dict[str, ArraySpec]:
    """Every per-step array of a store for `spec`: numeric observations, the action, then STEP_KEYS."""
    clash = [k for k in spec.observations if k in RESERVED]
    if clash:
        raise SpecMismatchError(
            f"spec.observations: key(s) {clash} collide with the store's step keys {list(RESERVED)}"
        )
    out = {k: v for k, v in spec.observations.items() if v.dtype != STRING}
    out["action"] = spec.action
    out.update({k: ArraySpec(shape, dtype) for k, (dtype, shape) in STEP_KEYS.items()})
    return out


def user_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """An episode's metadata without the keys the store owns: what to carry when copying it elsewhere."""
    return {k: v for k, v in meta.items() if k not in RECORD_KEYS}


def string_keys(spec: Spec) -> list[str]:
    return [k for k, v in spec.observations.items() if v.dtype == STRING]


def meta_checksum(commit: Mapping[str, Any]) -> str:
    """SHA-256 of a commit record's episode ends, episode records and statistics, in canonical JSON."""
    body = {k: commit[k] for k in ("episode_ends", "episodes", "stats")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sealed(commit: dict[str, Any]) -> dict[str, Any]:
    """The commit record with its checksum, as it is written."""
    return {**commit, "checksum": meta_checksum(commit)}


def stats_problems(stats: Mapping[str, Any], steps: int) -> list[str]:
    """What is wrong with a commit record's statistics: non-finite sums or bounds, a minimum above its maximum,
    or a count that is not the committed steps."""
    problems = []
    for key, st in stats.items():
        if st.get("count") != steps:
            problems.append(f"stats.{key}.count: expected {steps} (the committed steps), got {st.get('count')}")
        for field in ("sum", "sumsq", "min", "max"):
            if not np.all(np.isfinite(np.asarray(st.get(field, [np.nan]), np.float64))):
                problems.append(f"stats.{key}.{field}: expected finite values, got {st.get(field)}")
        if np.any(np.asarray(st.get("min", 0), np.float64) > np.asarray(st.get("max", 0), np.float64)):
            problems.append(f"stats.{key}: expected min <= max, got min {st.get('min')} and max {st.get('max')}")
    return problems


# ---------------------------------------------------------------------------------------------------
# normalization statistics, kept incrementally so a commit never rereads the data
# ---------------------------------------------------------------------------------------------------
def _stat_keys(arrays: Mapping[str, ArraySpec]) -> list[str]:
    return [k for k, a in arrays.items() if not a.is_image and np.dtype(a.dtype).kind in "fiu"]


def update_stats(stats: dict[str, Any], data: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Running count / sum / sum of squares / min / max per element of each key in `data`."""
    out = dict(stats)
    for key, x in data.items():
        x = np.asarray(x, np.float64).reshape(len(x), -1)
        if len(x) == 0:
            continue
        old = out.get(key)
        s, ss, lo, hi = x.sum(0), (x * x).sum(0), x.min(0), x.max(0)
        if old is not None:
            s, ss = s + np.asarray(old["sum"]), ss + np.asarray(old["sumsq"])
            lo, hi = np.minimum(lo, old["min"]), np.maximum(hi, old["max"])
        out[key] = {
            "count": len(x) + (old["count"] if old else 0),
            "sum": s.tolist(),
            "sumsq": ss.tolist(),
            "min": lo.tolist(),
            "max": hi.tolist(),
        }
    return out


def summarize_stats(
    stats: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, dict[str, np.ndarray]]:
    """mean / std / min / max per key, each in the key's own shape (what a normalizer needs)."""
    out = {}
    for key, st in stats.items():
        n = max(1, st["count"])
        mean = np.asarray(st["sum"]) / n
        var = np.maximum(np.asarray(st["sumsq"]) / n - mean**2, 0.0)
        shape = shapes.get(key, (len(mean),))
        out[key] = {
            "mean": mean.reshape(shape),
            "std": np.sqrt(var).reshape(shape),
            "min": np.asarray(st["min"]).reshape(shape),
            "max": np.asarray(st["max"]).reshape(shape),
            "count": np.asarray(st["count"]),
        }
    return out


# ---------------------------------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------------------------------
@dataclass
class Episode:
    """One finalized episode: its per-step arrays and its metadata."""

    index: int
    data: dict[str, np.ndarray]
    meta: dict[str, Any]

    def __len__(self) -> int:
        return int(self.meta["length"])


class EpisodeStore:
    """A zarr episode store opened for reading (`open`) or appending (`create`, `open(mode="a")`)."""

    def __init__(self, path: str | Path, mode: str = "r") -> None:
        if mode not in ("r", "a"):
            raise ValueError(f"mode: expected 'r' or 'a', got {mode!r}")
        self.path = Path(path)
        self.mode = mode
        if not (self.path / "zarr.json").exists():
            raise StoreError(
                f"{self.path}: not a robotrl episode store (no zarr.json); create one with EpisodeStore.create"
            )
        try:
            self._root = zarr.open_group(
                zarr.storage.LocalStore(self.path, read_only=mode == "r"), mode="r" if mode == "r" else "r+"
            )
        except ValueError as e:  # a damaged zarr.json: JSON that does not parse, or not a group's
            raise StoreError(f"{self.path}/zarr.json: expected a zarr group's JSON, got an error: {e}") from e
        head = self._root.attrs.get("robotrl")
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise StoreError(f"{self.path}: root attribute 'robotrl.format': expected {FORMAT!r}, got {head!r}")
        if int(head.get("version", -1)) > VERSION:
            raise StoreError(
                f"{self.path}: format version {head.get('version')} is newer than this robotrl ({VERSION})"
            )
        try:
            self.spec = Spec.from_dict(cast(dict[str, Any], self._root.attrs["spec"]))
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{self.path}: root attribute 'spec' is missing or invalid: {e}") from e
        self.arrays_spec = step_arrays(self.spec)
        self._lock_fd: int | None = None
        if mode == "a":
            self._lock()
        self.refresh()
        if mode == "a":
            self._trim_uncommitted()

    # --- creation ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, spec: Spec, exist_ok: bool = False) -> EpisodeStore:
        """A new, empty store for `spec`, opened for appending. With `exist_ok`, an existing store whose spec
        matches is opened instead (a mismatch is a `SpecMismatchError`)."""
        path = Path(path)
        if (path / "zarr.json").exists():
            if not exist_ok:
                raise StoreError(f"{path}: a store already exists; open it with EpisodeStore.open(path, mode='a')")
            store = cls(path, mode="a")
            try:
                store.check_spec(spec, that="requested spec")
            except SpecMismatchError:
                store.close()
                raise
            return store
        with made_aside(path, "a store") as aside:  # refuses a non-empty `path`; a kill leaves no half-made store there
            cls._build(aside, spec)
        return cls(path, mode="a")

    @staticmethod
    def _build(path: Path, spec: Spec) -> None:
        arrays = step_arrays(spec)
        root = zarr.open_group(zarr.storage.LocalStore(path), mode="w")
        data = root.create_group("data")
        for key, a in arrays.items():
            data.create_array(
                key,
                shape=(0, *a.shape),
                chunks=(chunk_rows(a.shape, a.dtype), *a.shape),
                dtype=a.dtype,
                compressors=[ZstdCodec(level=3), Crc32cCodec()],
                fill_value=0,
                config=ARRAY_CONFIG,
            )
        root.create_group("meta").attrs.put(sealed({"episode_ends": [], "episodes": [], "stats": {}}))
        root.attrs.put({"robotrl": {"format": FORMAT, "version": VERSION}, "spec": spec.to_dict()})

    @classmethod
    def open(cls, path: str | Path, mode: str = "r") -> EpisodeStore:
        return cls(path, mode)

    # --- reading -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the commit record (and array shapes): episodes finalized since opening become visible."""
        try:
            meta = zarr.open_group(self._root.store, path="meta", mode="r").attrs.asdict()
        except ValueError as e:
            raise StoreError(f"{self.path}/meta/zarr.json: expected the commit record's JSON, got an error: {e}") from e
        sealed_as, now = str(meta.get("checksum")), meta_checksum(meta)
        if "checksum" in meta and sealed_as != now:
            raise StoreError(
                f"{self.path}/meta/zarr.json: checksum: expected {sealed_as[:12]}... (as committed), got "
                f"{now[:12]}... (the commit record was edited or damaged)"
            )
        self.episode_ends = np.asarray(meta["episode_ends"], dtype=np.int64)
        self.episodes: list[dict[str, Any]] = list(cast(list[dict[str, Any]], meta["episodes"]))
        self._stats: dict[str, Any] = dict(cast(dict[str, Any], meta.get("stats", {})))
        if len(self.episodes) != len(self.episode_ends):
            raise StoreError(
                f"{self.path}: meta has {len(self.episode_ends)} episode ends but {len(self.episodes)} episode records"
            )
        self._arrays = {k: self._open_array(k) for k in self.arrays_spec}

    def _open_array(self, key: str) -> zarr.Array:
        try:
            arr = zarr.open_array(self._root.store, path=f"data/{key}", mode="r" if self.mode == "r" else "r+")
        except FileNotFoundError as e:
            raise StoreError(f"{self.path}/data/{key}: array missing (the spec has key {key!r})") from e
        except ValueError as e:
            raise StoreError(f"{self.path}/data/{key}/zarr.json: expected an array's JSON, got an error: {e}") from e
        return arr.with_config(ARRAY_CONFIG)

    @property
    def num_episodes(self) -> int:
        return len(self.episode_ends)

    @property
    def num_steps(self) -> int:
        return int(self.episode_ends[-1]) if len(self.episode_ends) else 0

    @property
    def episode_starts(self) -> np.ndarray:
        return np.concatenate([[0], self.episode_ends[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return self.num_episodes

    def array(self, key: str) -> zarr.Array:
        if key not in self.arrays_spec:
            raise KeyError(f"{self.path}: no per-step key {key!r}; expected one of {list(self.arrays_spec)}")
        return self._arrays[key]

    def check_spec(self, spec: Spec, that: str = "policy/task spec") -> None:
        """Raise `SpecMismatchError` naming the first field where this store's spec differs from `spec`."""
        self.spec.check(spec, this=f"store {self.path.name}", that=that)

    def episode(self, index: int, keys: list[str] | None = None) -> Episode:
        n = self.num_episodes
        if not -n <= index < n:
            raise IndexError(f"episode: expected an index in [0, {n}), got {index}")
        index %= n
        start, end = int(self.episode_starts[index]), int(self.episode_ends[index])
        data = {k: self._read(k, start, end) for k in (keys or list(self.arrays_spec))}
        return Episode(index, data, dict(self.episodes[index]))

    def __iter__(self) -> Iterator[Episode]:
        for i in range(self.num_episodes):
            yield self.episode(i)

    def load(self, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Every committed row of `keys` (default: all) in memory."""
        return {k: self._read(k, 0, self.num_steps) for k in (keys or list(self.arrays_spec))}

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        try:
            return np.asarray(self.array(key)[start:stop])
        except ValueError as e:  # a checksum or decompression failure: say which episodes are hit
            bad = [p for p in corrupt_chunks(self, keys=[key]) if p.rows[0] < stop and p.rows[1] > start]
            raise CorruptChunkError("; ".join(p.message for p in bad) or f"{self.path}/data/{key}: {e}") from e

    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        """Per-key normalization statistics over every committed step (mean, std, min, max); statistics that
        cannot be (not finite, min above max, another count) are refused rather than trained on."""
        if problems := stats_problems(self._stats, self.num_steps):
            raise StoreError(f"{self.path}/meta/zarr.json: " + "; ".join(problems))
        return summarize_stats(self._stats, {k: a.shape for k, a in self.arrays_spec.items()})

    def summary(self) -> dict[str, Any]:
        lengths = np.diff(np.concatenate([[0], self.episode_ends])) if self.num_episodes else np.zeros(0)
        sources: dict[str, int] = {}
        for e in self.episodes:
            sources[e.get("source", "?")] = sources.get(e.get("source", "?"), 0) + 1
        succ = [bool(e.get("success")) for e in self.episodes]
        return {
            "path": str(self.path),
            "task": self.spec.task,
            "episodes": self.num_episodes,
            "steps": self.num_steps,
            "length": {
                "min": int(lengths.min()) if len(lengths) else 0,
                "mean": float(lengths.mean()) if len(lengths) else 0.0,
                "max": int(lengths.max()) if len(lengths) else 0,
            },
            "success_rate": float(np.mean(succ)) if succ else 0.0,
            "sources": sources,
            "instructions": sorted({e["instruction"] for e in self.episodes if e.get("instruction")}),
            "keys": {
                k: {"shape": list(a.shape), "dtype": a.dtype, "chunk_rows": int(self.array(k).chunks[0])}
                for k, a in self.arrays_spec.items()
            },
            "control_hz": self.spec.control_hz,
        }

    # --- writing -----------------------------------------------------------------------------------
    def _lock(self) -> None:
        fd = try_flock(self.path / ".writer.lock")
        if fd is None:
            raise StoreError(f"{self.path}: another process is writing to this store (lock .writer.lock is held)")
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_writer(self) -> None:
        if self._lock_fd is None:
            raise StoreError(f"{self.path}: opened read-only; open with mode='a' to append")

    def _trim_uncommitted(self) -> None:
        """Drop rows a killed writer appended but never committed, and its temporary files."""
        n = self.num_steps
        for key in self.arrays_spec:
            arr = self._arrays[key]
            if arr.shape[0] != n:
                arr.resize((n, *arr.shape[1:]))
        for tmp in self.path.rglob("*.partial"):
            tmp.unlink(missing_ok=True)

    def append_episode(self, data: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> int:
        """Append one complete episode (every per-step key, equal lengths) and commit it atomically."""
        self._require_writer()
        missing = [k for k in self.arrays_spec if k not in data]
        if missing:
            raise StoreError(f"append_episode: missing per-step key(s) {missing}")
        length = len(data["action"])
        if length == 0:
            raise StoreError("append_episode: an episode needs at least one step, got 0")
        arrays = {}
        for key, a in self.arrays_spec.items():
            x = np.asarray(data[key])
            if x.shape != (length, *a.shape):
                raise SpecMismatchError(f"append_episode: '{key}': expected shape {(length, *a.shape)}, got {x.shape}")
            arrays[key] = x.astype(a.dtype, copy=False)
        clash = sorted(set(meta) & set(RECORD_KEYS))
        if clash:
            raise StoreError(f"append_episode: metadata key(s) {clash} are set by the store; expected other names")
        start = self.num_steps
        end = start + length
        record = {**dict(meta), "index": self.num_episodes, "start": start, "end": end, "length": length}
        stats = update_stats(self._stats, {k: arrays[k] for k in _stat_keys(self.arrays_spec)})
        commit: dict[str, Any] = {
            "episode_ends": [*self.episode_ends.tolist(), end],
            "episodes": [*self.episodes, record],
            "stats": stats,
        }
        try:
            for key, x in arrays.items():  # rows first; invisible until the commit below
                arr = self._arrays[key]
                arr.resize((end, *arr.shape[1:]))
                arr[start:end] = x
            zarr.open_group(self._root.store, path="meta", mode="r+").attrs.put(sealed(commit))  # one atomic file
        except OSError as e:  # a full disk: the rows past the last commit are trimmed by the next writer
            raise StoreError(
                f"{self.path}: {e.strerror or e} while appending episode {self.num_episodes}; "
                f"its {self.num_episodes} committed episodes are kept"
            ) from e
        self.episode_ends = np.asarray(commit["episode_ends"], dtype=np.int64)
        self.episodes, self._stats = commit["episodes"], stats
        return record["index"]

    def truncate(self, num_episodes: int) -> None:
        """Keep the first `num_episodes` episodes and drop the rest: a resumed run (off-policy replay) drops what
        it recorded after its last checkpoint, and records it again. The commit goes first, so a kill in between
        leaves rows past the commit, which the next append-mode open trims."""
        self._require_writer()
        if not 0 <= num_episodes <= self.num_episodes:
            raise ValueError(f"truncate: expected 0..{self.num_episodes} episodes to keep, got {num_episodes}")
        if num_episodes == self.num_episodes:
            return
        end = int(self.episode_ends[num_episodes - 1]) if num_episodes else 0
        stats: dict[str, Any] = {}
        for start in range(0, end, 1 << 16):  # the running statistics cannot be subtracted from: recount
            stop = min(end, start + (1 << 16))
            stats = update_stats(stats, {k: self._read(k, start, stop) for k in _stat_keys(self.arrays_spec)})
        commit = {
            "episode_ends": self.episode_ends[:num_episodes].tolist(),
            "episodes": self.episodes[:num_episodes],
            "stats": stats,
        }
        zarr.open_group(self._root.store, path="meta", mode="r+").attrs.put(sealed(commit))
        self.refresh()
        self._trim_uncommitted()

    def writer(self, source: str = "scripted", robot: str = "sim", **meta: Any) -> EpisodeWriter:
        self._require_writer()
        return EpisodeWriter(self, source=source, robot=robot, **meta)


# ---------------------------------------------------------------------------------------------------
# step-by-step recording
# ---------------------------------------------------------------------------------------------------
class EpisodeWriter:
    """Buffers one episode step by step; `finalize` commits it, `discard` drops it. Nothing is on disk before
    `finalize`, so a crash loses at most the episode in progress."""

    def __init__(self, store: EpisodeStore, source: str = "scripted", robot: str = "sim", **meta: Any) -> None:
        if source not in SOURCES:
            raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
        self.store, self.source, self.robot, self.meta = store, source, robot, dict(meta)
        self._reset()

    def _reset(self) -> None:
        self._steps: dict[str, list[Any]] = {k: [] for k in self.store.arrays_spec}
        self._instruction: str | None = None
        self._t_start: float | None = None

    def __len__(self) -> int:
        return len(self._steps["action"])

    def unfinished(self) -> dict[str, np.ndarray]:
        """The steps added since the last finalize, one array per per-step key (a run's train state keeps them)."""
        return {
            k: np.stack([np.asarray(v) for v in vals]) if vals else np.zeros((0, *a.shape), a.dtype)
            for (k, vals), a in zip(self._steps.items(), self.store.arrays_spec.values())
        }

    def add(
        self,
        obs: Mapping[str, Any],
        action: Any,
        reward: float = 0.0,
        terminated: bool = False,
        truncated: bool = False,
        success: bool = False,
        intervention: bool = False,
        timestamp: float | None = None,
    ) -> None:
        """Record one control step: the observation the action was chosen from, the action and its outcome."""
        t = len(self)
        spec = self.store.spec
        where = f"episode step {t}"
        for key, a in spec.observations.items():
            if key not in obs:
                raise SpecMismatchError(
                    f"{where}: observation {key!r} missing; expected keys {list(spec.observations)}"
                )
            if a.dtype == STRING:
                text = str(np.asarray(obs[key]).reshape(-1)[0]) if np.ndim(obs[key]) else str(obs[key])
                if self._instruction is None:
                    self._instruction = text
                elif text != self._instruction:
                    raise StoreError(f"{where}: {key!r} changed within an episode ({self._instruction!r} -> {text!r})")
                continue
            x = np.asarray(obs[key])
            a.validate(x, f"{where}: observation {key!r}", batched=False)
            if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
                raise ValueError(f"{where}: observation {key!r} has NaN/inf values")
            self._steps[key].append(x)
        act = np.asarray(action)
        spec.action.validate(act, f"{where}: action", batched=False)
        if not np.all(np.isfinite(act)):
            raise ValueError(f"{where}: action has NaN/inf values: {act}")
        now = time.time() if timestamp is None else float(timestamp)
        if self._t_start is None:
            self._t_start = now
        self._steps["action"].append(act)
        for key, value in (
            ("reward", reward),
            ("terminated", terminated),
            ("truncated", truncated),
            ("success", success),
            ("intervention", intervention),
            ("timestamp", now),
        ):
            self._steps[key].append(value)
        if not np.isfinite(float(reward)):
            raise ValueError(f"{where}: reward is {reward}")

    def finalize(self, success: bool | None = None, **meta: Any) -> int:
        """Commit the episode; returns its index. `success` defaults to whether any step succeeded."""
        if len(self) == 0:
            raise StoreError("finalize: the episode has no steps; call discard() to drop it")
        data = {k: np.stack([np.asarray(v) for v in vals]) for k, vals in self._steps.items()}
        record = {
            "instruction": self._instruction,
            "success": bool(data["success"].any() if success is None else success),
            "source": self.source,
            "robot": self.robot,
            "control_hz": self.store.spec.control_hz,
            "t_start": float(self._t_start or 0.0),
            "t_end": float(data["timestamp"][-1]),
            "interventions": int(data["intervention"].sum()),
            **self.meta,
            **meta,
        }
        index = self.store.append_episode(data, record)
        self._reset()
        return index

    def discard(self) -> None:
        self._reset()


class VectorRecorder:
    """Records every env of a vector env (same-step auto-reset) into a store, one episode per env episode."""

    def __init__(
        self,
        store: EpisodeStore,
        num_envs: int,
        source: str = "scripted",
        robot: str = "sim",
        limit: int | None = None,
        **meta: Any,
    ) -> None:
        """`limit`: commit at most that many episodes; envs whose episodes end after it is reached (several
        can end on one step) have theirs discarded, so a store gets exactly the episodes asked for."""
        self.writers = [store.writer(source=source, robot=robot, **meta) for _ in range(num_envs)]
        self.finalized: list[int] = []
        self.limit = limit

    def add(
        self,
        obs: Mapping[str, Any],
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: Mapping[str, Any],
        intervention: np.ndarray | None = None,
    ) -> list[int]:
        """Add one batched step (`obs` is what `action` was chosen from); returns envs whose episode ended."""
        success = np.asarray(info.get("success", np.zeros(len(self.writers), bool)))
        now = time.time()
        ended = []
        for i, w in enumerate(self.writers):
            w.add(
                {k: v[i] for k, v in obs.items()},
                action[i],
                float(reward[i]),
                bool(terminated[i]),
                bool(truncated[i]),
                bool(success[i]),
                bool(intervention[i]) if intervention is not None else False,
                now,
            )
            if terminated[i] or truncated[i]:
                if self.limit is not None and len(self.finalized) >= self.limit:
                    w.discard()
                else:
                    self.finalized.append(w.finalize())
                ended.append(i)
        return ended

    def discard(self) -> None:
        """Drop every unfinished episode (the run stops mid-episode)."""
        for w in self.writers:
            w.discard()


# ---------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------
@dataclass
class Problem:
    key: str
    chunk: int
    rows: tuple[int, int]
    episodes: list[int]
    reason: str
    message: str


def corrupt_chunks(store: EpisodeStore, keys: list[str] | None = None) -> list[Problem]:
    """Every committed chunk that is missing, truncated or fails its checksum, with the episodes it holds."""
    problems = []
    n = store.num_steps
    ends = store.episode_ends
    for key in keys or list(store.arrays_spec):
        arr = store.array(key)
        rows = int(arr.chunks[0])
        chunk_dir = store.path / "data" / key / "c"
        for c in range(-(-n // rows)):
            lo, hi = c * rows, min((c + 1) * rows, n)
            file = chunk_dir / str(c) / Path(*(["0"] * (arr.ndim - 1))) if arr.ndim > 1 else chunk_dir / str(c)
            reason = None
            if not file.exists():
                reason = "missing chunk file"
            else:
                try:
                    arr[lo:hi]
                except Exception as e:  # noqa: BLE001 -- zarr raises ValueError, codecs may raise others
                    reason = f"{type(e).__name__}: {e}"
            if reason is None:
                continue
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(ends, hi - 1, side="right"))
            eps = list(range(first, min(last, len(ends) - 1) + 1))
            problems.append(
                Problem(
                    key,
                    c,
                    (lo, hi),
                    eps,
                    reason,
                    f"{store.path}/data/{key} chunk {c} (rows {lo}-{hi - 1}, episode(s) {eps}): {reason}",
                )
            )
    return problems


def validate(store: EpisodeStore, spec: Spec | None = None) -> list[str]:
    """Everything wrong with a store, as messages (empty: the store is sound). Checks the spec against `spec`,
    the commit record's consistency, every array's shape and every committed chunk's checksum."""
    errors: list[str] = []
    if spec is not None:
        try:
            store.check_spec(spec)
        except SpecMismatchError as e:
            errors.append(str(e))
    ends = store.episode_ends
    if len(ends) and (np.any(np.diff(ends) <= 0) or ends[0] <= 0):
        errors.append(f"{store.path}: meta.episode_ends is not strictly increasing: {ends.tolist()[:10]}...")
    for i, rec in enumerate(store.episodes):
        if rec.get("index") != i or rec.get("end") != int(ends[i]):
            errors.append(
                f"{store.path}: meta.episodes[{i}] has index {rec.get('index')} / end {rec.get('end')}, "
                f"expected {i} / {int(ends[i])}"
            )
            break
    for key, a in store.arrays_spec.items():
        try:
            arr = store.array(key)
        except KeyError:
            errors.append(f"{store.path}/data/{key}: array missing")
            continue
        if (
            arr.shape[0] < store.num_steps
            or tuple(arr.shape[1:]) != a.shape
            or np.dtype(arr.dtype) != np.dtype(a.dtype)
        ):
            errors.append(
                f"{store.path}/data/{key}: expected shape (>= {store.num_steps}, {', '.join(map(str, a.shape))}) "
                f"{a.dtype}, got {arr.shape} {arr.dtype}"
            )
    errors += [f"{store.path}/meta/zarr.json: {p}" for p in stats_problems(store._stats, store.num_steps)]
    if not errors:
        errors += [p.message for p in corrupt_chunks(store)]
    return errors
