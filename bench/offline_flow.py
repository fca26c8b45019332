"""The RL-100 offline stage's policy extraction on Reach: clipped PPO over the denoising chain (RL-100's) vs
advantage-weighted flow matching on the data (IQL's AWR), against the control that tells whether the critic adds
anything: the same flow-matching steps with uniform weights (BC continuation on the growing store).

  bc       the BC starting point (the baseline row: success at iteration 0)
  ppo      `robotrl train offline` defaults (10 OPE-gated PPO updates per iteration)
  awr      --extraction awr: one update of `awr_steps` AWR steps per iteration, the EMA policy gated
  uniform  awr with --awr-temperature 1e6: every weight 1, i.e. flow-matching BC on the same data and schedule

Every run starts from the same BC checkpoint (bench/flow_rl.py's Reach recipe: 400 steps from 40 demos at noise
0.3, half-trained), runs `iterations` iterations (critic fit, gated updates, success gate, rollouts added to the
store) and evaluates the policy on `eval_episodes` held-out episodes after each. Prints one JSON line per (run,
seed) with the success curve and `vs_bc`, and one per run with the mean over seeds.

    .venv/bin/python bench/offline_flow.py                  # 2 iterations, seeds 0 1 (~15 min on 2 cores)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flow_rl import FlowRLBenchConfig, bc_checkpoint  # bench/flow_rl.py: the same BC start
from robotrl.flowrl.offline import OfflineFlowConfig, train

RUNS = ("ppo", "awr", "uniform")


@dataclass
class OfflineFlowBenchConfig:
    runs: tuple[str, ...] = RUNS
    seeds: tuple[int, ...] = (0, 1)
    iterations: int = 2
    awr_steps: int = 300
    eval_episodes: int = 100
    out_dir: Path | None = None
    """keep the BC checkpoint, its demos and the run directories here (default: a temporary directory)"""


def variant(run: str, config: OfflineFlowBenchConfig) -> dict[str, Any]:
    if run == "ppo":
        return {}
    awr = {"extraction": "awr", "lr": 3e-4, "policy_updates": 1, "epochs": config.awr_steps, "windows": 32}
    return awr if run == "awr" else {**awr, "awr_temperature": 1e6}


def main(config: OfflineFlowBenchConfig) -> list[dict[str, Any]]:
    unknown = [r for r in config.runs if r not in RUNS]
    if unknown:
        raise SystemExit(f"bench/offline_flow.py: --runs: expected some of {RUNS}; got {unknown}")
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(config.out_dir or tmp)
        policy = bc_checkpoint(FlowRLBenchConfig(), out)  # and its demos, out/demos.zarr: the stage's store
        demos = out / "demos.zarr"
        for run in config.runs:
            finals, starts = [], []
            for seed in config.seeds:
                began = time.perf_counter()
                run_dir = out / f"{run}-{seed}"
                train(
                    OfflineFlowConfig(
                        policy=policy,
                        store=demos,
                        run_dir=run_dir,
                        iterations=config.iterations,
                        execute=4,
                        sampler_steps=5,
                        eval_episodes=config.eval_episodes,
                        eval_envs=25,
                        seed=seed,
                        progress=False,
                        **variant(run, config),
                    )
                )
                metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                curve = [
                    r["eval/success_rate"] for r in metrics if "eval/success_rate" in r and "iteration/accepted" in r
                ]
                bc = metrics[0]["eval/success_rate"]
                kept = [int(r["iteration/accepted"]) for r in metrics if "iteration/accepted" in r]
                row = {
                    "bench": "offline_flow",
                    "task": "Reach",
                    "run": run,
                    "seed": seed,
                    "bc": bc,
                    "curve": [bc, *curve],
                    "iterations_kept": kept,
                    "final_success": curve[-1],
                    "vs_bc": round(curve[-1] - bc, 3),
                    "wall_s": round(time.perf_counter() - began, 1),
                }
                finals.append(curve[-1])
                starts.append(bc)
                print(json.dumps(row), flush=True)
                rows.append(row)
            mean = {
                "bench": "offline_flow",
                "task": "Reach",
                "run": run,
                "seeds": list(config.seeds),
                "mean_bc": round(float(np.mean(starts)), 3),
                "mean_final_success": round(float(np.mean(finals)), 3),
                "mean_vs_bc": round(float(np.mean(finals) - np.mean(starts)), 3),
            }
            print(json.dumps(mean), flush=True)
            rows.append(mean)
    return rows


if __name__ == "__main__":
    main(tyro.cli(OfflineFlowBenchConfig))
