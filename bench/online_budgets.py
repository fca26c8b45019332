"""The online methods' learning-test budgets against their seeds: held-out success along each run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/online_budgets.py                       # every method, seeds 0-4
    OMP_NUM_THREADS=1 .venv/bin/python bench/online_budgets.py --methods residual --seeds 3 4
    OMP_NUM_THREADS=1 .venv/bin/python bench/online_budgets.py --methods dsrl --every 1920

tests/test_online.py's per-method learning test trains a half-trained Reach flow policy (tests/conftest.py's
`train_bc_flow`, the backbone `START[method]`) for `BUDGET[method]` env steps and asserts a gain of `GAIN` on 100
held-out episodes. This runs the same configuration (the test's `small`; `dsrl`: tests/test_dsrl.py's, whose budget
is `DSRL_STEPS`) with a held-out evaluation every `--every` env steps: the learning rate is constant and evaluations
run in their own RNG, so the value at step S is what the test gives with a budget of S. One JSON line per (method,
seed): the BC start and the gain at each evaluated step; the budgets and their spread go to bench/RESULTS.md,
section "Learning tests: thresholds against their spread over seeds".
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


@dataclass
class OnlineBudgetsConfig:
    methods: tuple[str, ...] = ()
    """methods to run (default: every one of `robotrl train online`; `dsrl`: `robotrl train dsrl`)"""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    every: int = 4800
    """env steps between held-out evaluations (a multiple of the test's 960 env steps per iteration)"""
    steps: dict[str, int] = field(default_factory=dict)
    """env steps per method (default: the test's BUDGET)"""
    start: str | None = None
    """the BC start of every method ('mlp' or 'unet': tests/conftest.py's `train_bc_flow` backbone; default: the
    test's START, 'unet' for dsrl)"""
    out: Path = Path("runs/online-budgets")


def main(config: OnlineBudgetsConfig) -> list[dict]:
    import test_dsrl
    from conftest import record_reach, start_success, train_bc_flow
    from test_online import BUDGET, START, small

    from robotrl.flowrl import dsrl
    from robotrl.flowrl.chain import METHODS
    from robotrl.flowrl.online import train

    torch.set_num_threads(1)
    demos = config.out / "reach_flow.zarr"  # the suite's `flow_reach_demos`
    if not demos.exists():
        record_reach(demos, episodes=40, num_envs=8, noise=0.3)
    starts: dict[str, tuple[Path, float]] = {}

    def bc_start(backbone: str) -> tuple[Path, float]:
        if backbone not in starts:
            bc = config.out / f"bc-{backbone}"
            policy = bc / "policy" if (bc / "policy").exists() else train_bc_flow(demos, bc, backbone)
            starts[backbone] = policy, start_success(policy)
        return starts[backbone]

    rows = []
    for method in config.methods or METHODS:
        policy, start = bc_start(config.start or START.get(method, "unet"))
        for seed in config.seeds:
            run = config.out / f"{method}-seed{seed}"
            run_options = {"eval_episodes": 100, "eval_every": config.every, "seed": seed}
            if method == "dsrl":
                steps = config.steps.get(method, test_dsrl.DSRL_STEPS)
                result = dsrl.train(test_dsrl.small(policy, run, total_steps=steps, **run_options))
            else:
                steps = config.steps.get(method, BUDGET[method])
                result = train(small(policy, run, method=method, total_steps=steps, **run_options))
            metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
            gains = [[m["step"], round(m["eval/success_rate"] - start, 4)] for m in metrics if "eval/success_rate" in m]
            row = {"method": method, "seed": seed, "start": policy.parent.name, "bc": start, "gain_at_step": gains}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main(tyro.cli(OnlineBudgetsConfig))
