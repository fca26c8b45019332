"""README.md is the user's guide: at most 15 KB, it starts with the two set-up commands, links only to files of
the repository, and its how-tos run.

Each subsection of "## How-tos" runs as one test, its fenced blocks in order, in a fresh directory that links the
repository's `launch/` and `hardware/` (a block names `launch/params/deploy.yaml` as a user at the root of a
checkout would). The blocks follow three conventions:

- a block whose first line is `# file: NAME` is written to NAME instead of run (a module a later block imports,
  a robot file);
- ```python blocks run as scripts with this interpreter, from that directory (so those modules import);
  ```bash blocks run under `bash -euo pipefail` with this interpreter's bin directory first on PATH (`robotrl`,
  `robotrl-deploy`, `python`);
- a bash block that starts background processes stops them itself (`trap 'kill $(jobs -p)' EXIT`); the test
  also ends the block's whole process group when it is over.

Other fences (a plain ``` block) are shown, not run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_BYTES = 15 * 1024
SETUP = ("bash scripts/setup.sh && .venv/bin/robotrl run", "bash scripts/setup.sh && .venv/bin/pytest")
#: seconds one how-to may take (all its blocks): a guard, far above their minute each on a loaded 2-core machine; the
#: GPU how-to's MJX program compiles for minutes on a CPU where the suite's JAX cache does not hold it yet
HOWTO_TIMEOUT = 600
RUNNABLE = ("python", "bash")

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def text() -> str:
    return README.read_text()


def blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(markdown)]


def sections(markdown: str, level: int) -> dict[str, str]:
    """Heading text -> its body, for the headings of `level` (2: `## `), up to the next heading of that level or
    above; fenced blocks are skipped when looking for headings."""
    out: dict[str, str] = {}
    title, lines, fenced = None, [], False
    for line in markdown.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"^(#+) (.*)$", line) if not fenced else None
        if heading and len(heading.group(1)) <= level:
            if title is not None:
                out[title] = "".join(lines)
            title, lines = (heading.group(2).strip() if len(heading.group(1)) == level else None), []
        elif title is not None:
            lines.append(line)
    if title is not None:
        out[title] = "".join(lines)
    return out


def howtos() -> dict[str, str]:
    return sections(sections(text(), 2)["How-tos"], 3)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_at_most_15_kb() -> None:
    size = len(README.read_bytes())
    assert size <= MAX_BYTES, f"README.md is {size} bytes; the limit is {MAX_BYTES}"


def test_readme_starts_with_the_two_set_up_commands() -> None:
    markdown = text()
    first = FENCE.search(markdown)
    assert first is not None and "\n## " not in markdown[: first.start()], "the README opens with a code block"
    commands = [line.split("#")[0].strip() for line in first.group(2).splitlines() if line.strip()]
    assert tuple(commands) == SETUP


def test_every_link_is_a_file_of_the_repository() -> None:
    markdown = FENCE.sub("", text())
    markdown = re.sub(r"`[^`\n]*`", "", markdown)
    links = LINK.findall(markdown)
    assert links, "the README links bench/RESULTS.md"
    bad = []
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = (README.parent / path).resolve() if path else README
        if not target.is_relative_to(ROOT) or not target.exists():
            bad.append(f"{link}: no such file in the repository")
        elif anchor and target.suffix == ".md":
            headings = {slug(line.lstrip("#")) for line in target.read_text().splitlines() if line.startswith("#")}
            if anchor not in headings:
                bad.append(f"{link}: no heading #{anchor} in {path or 'README.md'}")
    assert not bad, "dead links in README.md:\n" + "\n".join(bad)


def test_results_table_is_at_most_15_lines_and_links_bench_results() -> None:
    results = sections(text(), 2)["Results"]
    table = [line for line in results.splitlines() if line.startswith("|")]
    assert 3 <= len(table) <= 15
    assert "(bench/RESULTS.md" in results


def test_the_howtos_are_the_guides_the_readme_promises() -> None:
    assert list(howtos()) == [
        "Bring your own environment",
        "Bring your own robot",
        "Add a task",
        "Add a policy",
        "Deploy to a robot",
        "Scale out on Ray",
        "Use a GPU",
    ]
    for title, body in howtos().items():
        assert any(lang in RUNNABLE for lang, _ in blocks(body)), f"{title}: no block that runs"


def run_block(language: str, body: str, cwd: Path, env: dict[str, str], index: int, timeout: float) -> None:
    script = cwd / f"block{index}.{'py' if language == 'python' else 'sh'}"
    script.write_text(body)
    log = cwd / f"block{index}.log"
    args = [sys.executable, script.name] if language == "python" else ["bash", "-euo", "pipefail", script.name]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # the block, if it still runs, and whatever it left behind in its process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    output = f"{body}\n--- output ---\n{log.read_text()[-4000:]}"
    assert proc.returncode == 0, (
        f"block {index} ({language}) "
        + (f"ran past {timeout:.0f} s" if timed_out else f"exited {proc.returncode}")
        + f":\n{output}"
    )


@pytest.mark.timeout(HOWTO_TIMEOUT + 60)
@pytest.mark.parametrize("title", list(howtos()))
def test_howto_runs(title: str, tmp_path: Path) -> None:
    import time

    import jax

    for name in ("launch", "hardware"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        # a DDS domain apart from this worker's other ROS tests (tests/conftest.py gives each worker a block)
        "ROS_DOMAIN_ID": str(int(os.environ.get("ROS_DOMAIN_ID", "0")) + 5),
    }
    # the suite's JAX compilation cache (tests/conftest.py): the GPU how-to's MJX PPO (Reach, 8 envs, 16 steps) is
    # the program tests/test_ppo_mjx.py compiles, so the two compile it once between them
    env.update(
        JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
    )
    end = time.monotonic() + HOWTO_TIMEOUT
    ran = 0
    for index, (language, body) in enumerate(blocks(howtos()[title])):
        first = body.splitlines()[0] if body.strip() else ""
        marker = re.match(r"^#\s*file:\s*(\S+)\s*$", first)
        if marker:
            (tmp_path / marker.group(1)).write_text(body)
        elif language in RUNNABLE:
            run_block(language, body, tmp_path, env, index, max(end - time.monotonic(), 1.0))
            ran += 1
    assert ran, f"{title}: no block ran"
