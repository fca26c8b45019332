"""File helpers shared by training code and the torch-free runtime."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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


def write_atomically(path: Path, data: bytes | str) -> None:
    """`path` holds `data` whole or keeps what it held: written beside it (`<name>.partial`), then renamed over
    it. An OS error (a full disk, no permission) removes the partial file and names `path`, where a failed
    `write` names no file at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e


@contextmanager
def made_aside(path: Path, what: str = "an output", replace: bool = False) -> Iterator[Path]:
    """A new output directory made whole or not at all: the block builds it at the hidden sibling it is given
    (`.<name>.partial-<pid>`), which is renamed to `path` when the block ends (removed if it raises). A kill
    leaves `path` as it was; the next `made_aside` of it removes what a dead process left aside. `path` must be
    missing or empty, unless `replace` (the caller has decided it may go): then it is swapped out only once the
    new one is whole. An OS error inside the block names `path`, not the hidden sibling."""
    path = Path(path)
    if not replace and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path}: exists and is not an empty directory; refusing to write {what} over it")
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*-*"):
        if stale.name.rsplit("-", 1)[0] in (f".{path.name}.partial", f".{path.name}.old") and not pid_alive(
            stale.name.rsplit("-", 1)[-1]
        ):
            shutil.rmtree(stale, ignore_errors=True)
    aside = path.with_name(f".{path.name}.partial-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    try:
        yield aside
    except BaseException as e:
        shutil.rmtree(aside, ignore_errors=True)
        if isinstance(e, OSError) and e.filename and str(e.filename).startswith(str(aside)):
            raise OSError(e.errno, e.strerror, str(e.filename).replace(str(aside), str(path), 1)) from e
        raise
    if replace and path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.rename(path, old)
        os.rename(aside, path)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        os.rename(aside, path)  # onto a missing or empty directory: atomic


def pid_alive(pid: str) -> bool:
    """Whether the process `pid` (a string from a file name) is running."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
