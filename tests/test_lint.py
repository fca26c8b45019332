"""Lint, format and types, run by the suite (so by CI): `ruff check`, `ruff format --check` (pyproject.toml's
[tool.ruff]) over the code's folders, and mypy (pyproject.toml's [tool.mypy]) on robotrl as installed
(scripts/typecheck.py). Each runs the venv's tool as a subprocess and fails with its output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: the package's folders (pyproject's package-dir), the benches, the scripts and the tests
PATHS = ("robotrl", "envs", "policies", "datasets", "hardware", "launch", "bench", "scripts", "tests")


def run(*cmd: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_check() -> None:
    out = run(BIN / "ruff", "check", "--no-cache", "--output-format", "concise", *PATHS)
    assert out.returncode == 0, f"ruff check:\n{out.stdout}{out.stderr}"


def test_ruff_format() -> None:
    out = run(BIN / "ruff", "format", "--no-cache", "--check", *PATHS)
    assert out.returncode == 0, f"ruff format --check (run `.venv/bin/ruff format` to fix):\n{out.stdout}{out.stderr}"


def test_mypy() -> None:
    out = run(sys.executable, ROOT / "scripts" / "typecheck.py", timeout=900)
    assert out.returncode == 0, f"mypy (scripts/typecheck.py):\n{out.stdout}{out.stderr}"
