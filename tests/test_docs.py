"""Docstrings and `--help` say what a thing does and why; measured results and dates live in bench/RESULTS.md.

Every docstring of the package (module, class, function, and the string after a class attribute, which tyro prints
as that option's `--help`) and the help of every `robotrl` command are checked for what a measurement looks like: a
percentage, a date, a timing, a speed-up, a machine's name, the words "measured" and "session". A number that is a
stated parameter (an interval's level, a bound of a rate) is on a short allow-list below; any other figure belongs
in bench/RESULTS.md, and the docstring names its section.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the folders pyproject's package-dir maps into the `robotrl` package
PACKAGE_DIRS = ("robotrl", "envs", "policies", "datasets", "hardware")

FORBIDDEN = {
    "a percentage": re.compile(r"\d+(?:\.\d+)?\s?%"),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "the word 'measured'": re.compile(r"\bmeasured\b", re.IGNORECASE),
    "the word 'session'": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "a machine's name": re.compile(r"\bdev-2c\b|\b[hH][12]00\b"),
    "a duration": re.compile(
        r"~\s?\d[\d,.]*\s?(?:ms|s|min|minutes|h|hours?)\b|\b\d+ min \d+ s\b|"
        r"\b\d[\d,.]* ?(?:s|min|minutes) (?:here|on (?:this|the|one|two))\b"
    ),
    "a speed-up": re.compile(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x (?:faster|slower|as fast)\b"),
}

# Stated parameters that look like measurements: a FORBIDDEN hit inside a match of one of these is spared.
ALLOWED = (
    # the level of a confidence interval, a promise of the statistics, not a result
    re.compile(r"\b9[059]% (?:CI|interval|confidence|Wilson)", re.IGNORECASE),
    re.compile(r"\b9[059]%-"),  # "a 95%-interval", "95%-confidence"
    # the bounds of a rate (a gate that wants 100%, an interval honest at 0% and 100%)
    re.compile(r"(?<![\d.])(?:0|100)%"),
    # sensor readings: "the measured joint positions" is what the robot reports, not a benchmark result
    re.compile(r"\bmeasured\s+(?:joint|positions?|velocity|velocities|gravity|tilt|state)\b", re.IGNORECASE),
    re.compile(r"\bwhen\s+they\s+were\s+measured\b"),
    # a teleoperation recording session and a desktop (X) session are what the user runs, not a work session
    re.compile(r"\b(?:collect|recording|desktop|X desktop|teleop(?:eration)?) session\b", re.IGNORECASE),
    re.compile(r"\bthe session(?:'s)? (?:then|state|summary)\b|\bthe session's\b|\brun the session\b", re.IGNORECASE),
)


def offences(text: str) -> list[str]:
    """What in `text` reads as a measured result or a date: one 'kind: match' per hit not on the allow-list."""
    spared = [m.span() for pattern in ALLOWED for m in pattern.finditer(text)]
    found = []
    for kind, pattern in FORBIDDEN.items():
        for m in pattern.finditer(text):
            if not any(a <= m.start() and m.end() <= b for a, b in spared):
                found.append(f"{kind}: {m.group(0)!r}")
    return found


def package_files() -> list[Path]:
    return sorted(p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py"))


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring in `path`: module, class and function docstrings, and the bare string after
    an assignment in a class body (a dataclass field's doc, which tyro prints in `--help`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and _is_string(body[0]):
                yield body[0].lineno, body[0].value.value
            if isinstance(node, ast.ClassDef):
                for before, after in itertools.pairwise(body):
                    if isinstance(before, (ast.AnnAssign, ast.Assign)) and _is_string(after):
                        yield after.lineno, after.value.value


def _is_string(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


@functools.cache
def help_texts() -> tuple[tuple[str, str], ...]:
    """(command line, output) of `robotrl ... --help` for the top level, every group, and every command, as
    `robotrl.cli`'s own tables list them."""
    from robotrl import cli

    lines = [[], *[[group] for group in cli.COMMANDS], *[list(words) for words, _ in cli.every_command()]]
    texts = []
    for args in lines:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
            cli.main([*args, "--help"])
        texts.append((" ".join(["robotrl", *args, "--help"]), out.getvalue()))
    return tuple(texts)


def test_the_checker_catches_a_measurement_and_spares_a_stated_parameter():
    assert sorted(offences("on PushT online RL took it from measured 51% -> 75% (bench/RESULTS.md)")) == [
        "a percentage: '51%'",
        "a percentage: '75%'",
        "the word 'measured': 'measured'",
    ]
    assert offences("success with a 95% interval over held-out seeds; the gate wants 100% of 10 episodes") == []
    found = offences("sized to 15 minutes: 14 min 45 s on 2026-11-27 (~45 s here, 5-6x slower on dev-2c)")
    assert sorted(found) == [
        "a date: '2026-11-27'",
        "a duration: '14 min 45 s'",
        "a duration: '~45 s'",
        "a machine's name: 'dev-2c'",
        "a speed-up: '5-6x slower'",
    ]
    assert offences("the twelfth session's run") == ["the word 'session': 'session'"]
    assert offences("restarts from the measured joint positions; run a collect session") == []


def test_no_docstring_of_the_package_carries_a_measured_result_or_a_date():
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {hit}\n    {text.strip()[:200]!r}"
        for path in package_files()
        for line, text in docstrings(path)
        for hit in offences(text)
    ]
    assert not bad, (
        "measured results or dates in docstrings (name the bench/RESULTS.md section instead):\n" + "\n".join(bad)
    )


def test_no_help_of_the_cli_carries_a_measured_result_or_a_date():
    bad = [f"{command}: {hit}" for command, text in help_texts() for hit in offences(text)]
    assert not bad, "measured results or dates in --help (name the bench/RESULTS.md section instead):\n" + "\n".join(
        bad
    )


def results_headings() -> list[str]:
    return [
        " ".join(line.lstrip("#").split())
        for line in (ROOT / "bench" / "RESULTS.md").read_text().splitlines()
        if line.startswith("#")
    ]


def test_the_recipes_name_their_measurements_without_carrying_them():
    """A recipe's comments (robotrl/stages/recipes/*.yaml, read by users choosing settings) name the bench/RESULTS.md
    section behind a value, quoted, and carry no figure of their own: each quoted name is a heading there."""
    headings, bad = results_headings(), []
    for path in sorted((ROOT / "robotrl" / "stages" / "recipes").glob("*.yaml")):
        comments = " ".join(line.split("#", 1)[1].strip() for line in path.read_text().splitlines() if "#" in line)
        bad += [f"{path.name}: {hit}" for hit in offences(comments)]
        for name in re.findall(r'"([^"]+)"', comments):
            if not any(h == name or h.startswith(name) for h in headings):
                bad.append(f"{path.name}: section {name!r} not in bench/RESULTS.md")
    assert not bad, "\n".join(bad)


def test_every_results_section_the_package_names_exists():
    """A docstring or comment that sends the reader to `bench/RESULTS.md, "<section>"` names a heading there (the
    heading itself or its start), so a renamed section fails here rather than leaving a dead reference."""
    headings = results_headings()
    reference = re.compile(r'bench/RESULTS\.md,\s+((?:"[^"]+"(?:,?\s+(?:and|or)\s+)?)+)')
    bad = []
    for path in package_files():
        text = re.sub(r"\n\s*#:?", " ", path.read_text())  # names wrapped across comment lines
        for match in reference.finditer(text):
            for name in re.findall(r'"([^"]+)"', match.group(1)):
                name = " ".join(name.split())
                if not any(h == name or h.startswith(name) for h in headings):
                    bad.append(f"{path.relative_to(ROOT)}: {name!r}")
    assert not bad, "sections of bench/RESULTS.md named in the package but not found there:\n" + "\n".join(bad)


def test_every_command_help_is_walked():
    """The walk follows the CLI's tables, so a new command is checked without a change here."""
    commands = [command for command, _ in help_texts()]
    assert "robotrl --help" in commands and "robotrl run --help" in commands
    assert "robotrl train online --help" in commands and "robotrl data record --help" in commands
