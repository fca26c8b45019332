"""File helpers shared by training code and the torch-free runtime."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


def default_run_dir(*parts: str) -> Path:
    """runs/<parts joined by '-'>-<time>, each part reduced to characters safe in one path component (an outside
    env's name, `gym:robotrl/Reach-v0?x=1`, holds ':', '/' and '?')."""
    safe = (re.sub(r"[^A-Za-z0-9._-]+", "_", p).strip("_") for p in parts)
    return Path("runs") / "-".join([*safe, time.strftime("%Y%m%d-%H%M%S")])


#: the lock file a running job holds in its run directory
RUN_LOCK = ".run.lock"
_held: dict[Path, int] = {}  # run directories this process holds: their lock files' descriptors


class RunDirBusy(FileExistsError):
    """Another process is running in the run directory."""


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir`'s lock for this process (again for the same process: a no-op), so that a second process
    cannot train into the same directory and leave it mixed; released by `release_run_dir` or the process's end.
    Another process holding it is `RunDirBusy`, naming the directory."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = try_flock(run_dir / RUN_LOCK)
    if fd is None:
        raise RunDirBusy(
            f"run_dir: expected a directory no other process is running in, got {run_dir} (its {RUN_LOCK} is held)"
        )
    _held[run_dir] = fd


def try_flock(file: Path) -> int | None:
    """An exclusive `flock` on `file` (created if missing), without waiting: its descriptor, which holds the lock
    until closed or the process ends, or None where another holds it."""
    fd = os.open(file, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def clear_run_dir(run_dir: Path) -> None:
    """Delete everything in `run_dir` but its lock (`--overwrite`: the caller holds the lock)."""
    for item in Path(run_dir).iterdir():
        if item.name == RUN_LOCK:
            continue
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()


def claim_run_dir(run_dir: Path, clear: bool) -> None:
    """Lock `run_dir` for this process, then (`clear`: an --overwrite of a run it holds) empty it: cleared only
    under the lock, so no other process is running there meanwhile."""
    lock_run_dir(run_dir)
    if clear:
        clear_run_dir(run_dir)


def release_run_dir(run_dir: Path) -> None:
    """Let go of `run_dir`'s lock if this process holds it."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def sha256(path: Path) -> str:
    """Hex digest of a file, read in 1 MiB blocks (weights files are large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(
    path: Path, error: type[Exception], what: str, required: Sequence[str], hints: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`path`/manifest.json parsed, with the `required` top-level fields; anything else is `error` naming the
    file (a directory that is not `what`, invalid JSON, a missing field with its hint, if any)."""
    file = path / MANIFEST
    if not file.exists():
        raise error(f"{path}: not {what} (no {MANIFEST})")
    manifest = read_json_object(file, error)
    for key in required:
        if key not in manifest:
            raise error(f"{file}: field {key!r} missing{(hints or {}).get(key, '')}")
    return manifest


def read_json_object(file: Path, error: type[Exception]) -> dict[str, Any]:
    """A JSON file that must hold an object; a parse error or another JSON type is `error` naming the file."""
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise error(f"{file}: expected JSON, got a parse error: {e}") from e
    if not isinstance(data, dict):
        raise error(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data
