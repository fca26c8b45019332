"""import-linter's contracts (pyproject.toml, [tool.importlinter]) checked on robotrl as it is installed.

    .venv/bin/python scripts/lint_imports.py          # any lint-imports options pass through (e.g. --verbose)

import-linter finds a package by its directory, and in this checkout robotrl/ holds only the learning stack:
envs/, policies/, datasets/ and hardware/ join the package through pyproject's package-dir (as a wheel lays them
out). Plain `lint-imports` in the repository root therefore sees no robotrl.hardware and stops there. This lays the
installed layout out as links in a temporary directory (robotrl/'s own entries, and each mapped folder at its
place in the package) and runs the venv's `lint-imports` in it, so every contract sees every module.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """robotrl and each package pyproject maps into it -> its folder."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in setuptools["package-dir"].items()}


def lay_out(dest: Path, root: Path = ROOT) -> Path:
    """The installed layout of robotrl under `dest`, as links; returns dest."""
    dirs = package_dirs(root)
    package = dest / "robotrl"
    package.mkdir(parents=True)
    for entry in dirs["robotrl"].iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in dirs.items():
        if name != "robotrl":
            (dest / name.replace(".", "/")).symlink_to(folder)
    return dest


def main(args: list[str]) -> int:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    with tempfile.TemporaryDirectory(prefix="robotrl-layout-") as tmp:
        view = lay_out(Path(tmp))
        return subprocess.run(
            [str(lint_imports), str(ROOT / "pyproject.toml"), "--no-cache", *args], cwd=view
        ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
