"""An evaluation's inference threads, alone and beside other jobs: `robotrl policy eval --threads`.

An evaluation calls the policy on small batches (one window per env), so torch's intra-op threads have little to
split and spin-wait between ops. Beside another job on a 2-core machine, a one-step student's 500-episode
evaluation once took ~18 minutes where it took ~1 alone. This times the same seeded evaluation at each thread
count, with no competing job and with `--hogs` processes that each run small matmuls on `--hog-threads` torch
threads (a stand-in for a second evaluation or a training beside it).

    .venv/bin/python bench/eval_threads.py --policy runs/distill/policy --episodes 50 --threads 1 2 --hogs 0 1

One JSON line per (hogs, threads); the first thread count is the baseline each row's `vs_baseline` (seconds over
the baseline's seconds, same hogs) is taken against.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from robotrl.policies.timing import torch_threads
from robotrl.training.evaluate import evaluate_policy, load_any

HOG = (
    "import torch, sys\ntorch.set_num_threads(int(sys.argv[1]))\na = torch.randn(128, 128)\n"
    "while True:\n    a = torch.tanh(a @ a)\n"
)


@dataclass
class EvalThreadsConfig:
    policy: Path
    """a checkpoint or an exported policy directory (what `robotrl policy eval --policy` takes)"""
    episodes: int = 50
    num_envs: int = 25
    execute: int = 8
    threads: tuple[int, ...] = (1, 2)
    """torch threads of the policy's inference; the first is the baseline"""
    hogs: tuple[int, ...] = (0, 1)
    """competing processes started for a row, each spinning on hog_threads torch threads"""
    hog_threads: int = 2


def timed(config: EvalThreadsConfig, threads: int) -> tuple[float, float]:
    policy = load_any(config.policy, threads=threads)
    with torch_threads(threads):
        began = time.perf_counter()
        stats = evaluate_policy(policy, config.episodes, config.num_envs, execute=config.execute)
        return time.perf_counter() - began, stats.success_rate


def main(config: EvalThreadsConfig) -> None:
    for hogs in config.hogs:
        procs = [subprocess.Popen([sys.executable, "-c", HOG, str(config.hog_threads)]) for _ in range(hogs)]
        try:
            baseline = None
            for threads in config.threads:
                seconds, success = timed(config, threads)
                baseline = baseline or seconds
                print(
                    json.dumps(
                        {
                            "policy": str(config.policy),
                            "episodes": config.episodes,
                            "hogs": hogs,
                            "hog_threads": config.hog_threads,
                            "threads": threads,
                            "seconds": round(seconds, 2),
                            "success_rate": success,
                            "vs_baseline": round(seconds / baseline, 3),
                            "cores": os.cpu_count(),
                            "load_avg_1m": round(os.getloadavg()[0], 2),
                        }
                    ),
                    flush=True,
                )
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main(tyro.cli(EvalThreadsConfig))
