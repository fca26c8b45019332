"""The learning tests' thresholds against their spread over seeds.

    .venv/bin/python bench/learning_tests.py                      # the default suite's learning tests, seeds 0-4
    .venv/bin/python bench/learning_tests.py --seeds 0 1 --slow   # the slow ones too
    .venv/bin/python bench/learning_tests.py --tests tests/test_online.py

A test marked `learning` trains with the seed in $ROBOTRL_LEARNING_SEED (0 in the suite) and checks its measured
values through the `claim` fixture (tests/conftest.py), which also appends each check to $ROBOTRL_CLAIMS. This script
reruns those tests once per seed and prints one JSON line per claim: its values over the seeds, the bound the test
asserts, and the margin of the worst seed over it (the bound's baseline is the measured spread itself). A bound that
a seed fails, or one that no seed comes near, is a threshold to reconsider. The figures go to bench/RESULTS.md,
section "Learning tests: thresholds against their spread over seeds".
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class LearningTestsConfig:
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """the seeds each learning test trains with, one pytest run per seed"""
    slow: bool = False
    """also the `slow` learning tests (claims too long for the default suite)"""
    tests: tuple[str, ...] = ()
    """test files or node ids (default: the whole suite's learning tests)"""
    workers: int = 2
    """pytest-xdist workers per run (a file each, as the suite runs)"""
    out: Path = Path("runs/learning-tests")
    """where each seed's claims and pytest log go"""


def run_seed(config: LearningTestsConfig, seed: int) -> tuple[Path, int, float]:
    """One pytest run of the learning tests with `seed`: (its claims file, pytest's exit code, seconds)."""
    config.out.mkdir(parents=True, exist_ok=True)
    claims, log = config.out / f"claims-seed{seed}.jsonl", config.out / f"pytest-seed{seed}.log"
    claims.unlink(missing_ok=True)
    marker = "learning" if config.slow else "learning and not slow"
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        marker,
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        str(config.workers),
        *config.tests,
    ]
    env = {**os.environ, "ROBOTRL_LEARNING_SEED": str(seed), "ROBOTRL_CLAIMS": str(claims.resolve())}
    start = time.monotonic()
    with log.open("w") as f:
        code = subprocess.run(args, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return claims, code, time.monotonic() - start


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (test, claim): the values by seed, their spread, the bound and the worst seed's margin over it."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["test"], row["claim"]].append(row)
    out = []
    for (test, name), group in sorted(groups.items()):
        values = [r["value"] for r in group]
        lower, upper = group[0]["lower"], group[0]["upper"]
        margins = [
            m
            for m in (lower is not None and min(values) - lower, upper is not None and upper - max(values))
            if m is not False
        ]
        out.append(
            {
                "test": test,
                "claim": name,
                "seeds": [r["seed"] for r in group],
                "values": values,
                "min": min(values),
                "mean": statistics.fmean(values),
                "max": max(values),
                "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                "lower": lower,
                "upper": upper,
                "worst_margin": min(margins),
                "failed_seeds": [r["seed"] for r in group if not r["ok"]],
            }
        )
    return out


def main(config: LearningTestsConfig) -> list[dict]:
    rows: list[dict] = []
    for seed in config.seeds:
        claims, code, seconds = run_seed(config, seed)
        print(json.dumps({"seed": seed, "pytest_exit": code, "seconds": round(seconds, 1)}), flush=True)
        if claims.exists():
            rows += [json.loads(line) for line in claims.read_text().splitlines()]
    summary = summarize(rows)
    for row in summary:
        print(json.dumps(row, default=float), flush=True)
    return summary


if __name__ == "__main__":
    main(tyro.cli(LearningTestsConfig))
