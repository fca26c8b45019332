"""File helpers shared by training code and the torch-free runtime."""

from __future__ import annotations

import hashlib
import json
import re
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
