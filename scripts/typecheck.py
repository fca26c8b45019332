"""mypy (pyproject.toml, [tool.mypy]) on robotrl as it is installed.

    .venv/bin/python scripts/typecheck.py             # any mypy options pass through (e.g. --no-incremental)

Like scripts/lint_imports.py: envs/, policies/, datasets/, hardware/ and launch/ join robotrl through pyproject's
package-dir, and the editable install's import hook is invisible to a static checker, so mypy checks the installed
layout laid out as links (lint_imports.lay_out) in a temporary directory. Its messages name the files in this
checkout (envs/cpu.py, not <tmp>/robotrl/envs/cpu.py); the cache stays in .mypy_cache/ here between runs.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_imports import ROOT, lay_out, package_dirs


def checkout_paths(text: str, view: Path) -> str:
    """mypy's output with each path in the laid-out view replaced by that file's path in the checkout."""
    # the longest package first: robotrl/envs/ before robotrl/
    for name, folder in sorted(package_dirs().items(), key=lambda item: -len(item[0])):
        text = text.replace(f"{view / name.replace('.', '/')}/", f"{folder.relative_to(ROOT)}/")
        text = text.replace(f"{name.replace('.', '/')}/", f"{folder.relative_to(ROOT)}/")
    return text


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="robotrl-typecheck-") as tmp:
        view = lay_out(Path(tmp))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--config-file",
                str(ROOT / "pyproject.toml"),
                "--cache-dir",
                str(ROOT / ".mypy_cache"),
                "-p",
                "robotrl",
                *args,
            ],
            cwd=view,
            capture_output=True,
            text=True,
        )
        sys.stdout.write(checkout_paths(out.stdout, view))
        sys.stderr.write(checkout_paths(out.stderr, view))
        return out.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
