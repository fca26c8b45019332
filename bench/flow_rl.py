"""Online RL fine-tuning of a flow policy: Flow-Noise vs Flow-SDE vs denoising-MDP PPO (issue 7 must-show: success
against env steps on the same budget), each from the same BC checkpoint, with the same env-step budget, seeds,
networks and PPO settings (`robotrl train online --method ...`).

  bc             the BC starting point: the baseline row (its success at env step 0, once per seed)
  denoising_mdp  RL-100 / DPPO: a fixed exploration std on every Euler step of the chain
  flow_sde       pi_RL's Flow-SDE: the marginal-preserving SDE of the flow
  flow_noise     pi_RL's Flow-Noise: a learned per-step noise network
  ode_noise      Gaussian exploration around the policy's deterministic ODE chunk (one stochastic step)
  latent         DSRL: the flow network frozen, PPO on a Gaussian prior over the ODE's initial noise
  dsrl           DSRL-SAC (`robotrl train dsrl`): the same prior trained off-policy by SAC on Q(window, x_0)

Every run evaluates the deterministic ODE policy (the checkpoint `robotrl policy eval` loads) on `eval_episodes`
held-out seeded episodes every `eval_every` env steps, outside its training time. Prints one JSON line per (run, seed):
  curve                                [(env steps, success, training seconds), ...], the BC success at step 0
  steps_to_target, seconds_to_target   first evaluation at >= target (null: not reached within total_steps)
  final_success, vs_bc                 at the end of the budget, and its gain over the BC start (points of success)
and one line per run with the mean over the seeds.

    .venv/bin/python bench/flow_rl.py                  # Reach, 16 envs, 28,800 env steps, 2 seeds (~15 min, 2 cores)
    .venv/bin/python bench/flow_rl.py --policy runs/bc-flow/policy --num-envs 32 --total-steps 200000 \\
        --eval-every 20000 --eval-episodes 200 --seeds 0 1 2
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
from robotrl.datasets.record import record_expert
from robotrl.flowrl.chain import METHODS, load_flow_policy
from robotrl.flowrl.dsrl import DsrlConfig, train as train_dsrl
from robotrl.flowrl.online import OnlineConfig, train as train_online
from robotrl.policies.flow import FlowConfig
from robotrl.stages.bc import BCConfig, train as train_bc
from robotrl.training.evaluate import evaluate_policy
from sac import curve_summary, eval_curve  # bench/sac.py, the SAC-vs-SB3 bench

RUNS = (*METHODS, "dsrl")


@dataclass
class FlowRLBenchConfig:
    policy: Path | None = None
    """the BC flow checkpoint every run starts from (default: one trained here on Reach demos)"""
    demo_episodes: int = 40
    """without --policy: Reach episodes of the scripted expert at noise 0.3 to clone"""
    bc_steps: int = 400
    """without --policy: BC steps (400 leave the policy half-trained on Reach, with room to improve: "The three
    methods on Reach" in bench/RESULTS.md)"""
    runs: tuple[str, ...] = RUNS
    seeds: tuple[int, ...] = (0, 1)
    num_envs: int = 16
    rollout_steps: int = 60
    execute: int = 4
    sampler_steps: int = 5
    total_steps: int = 28_800
    eval_every: int = 5_760
    eval_episodes: int = 100
    target: float = 0.7
    out_dir: Path | None = None
    """keep the BC checkpoint and the run directories here (default: a temporary directory)"""
    bc_success: float | None = None
    """the BC start's success already measured on the same episodes (`--runs` with no run measures it): skips
    re-measuring it in every process when runs are spread over processes"""


def bc_checkpoint(config: FlowRLBenchConfig, out: Path) -> Path:
    if config.policy is not None:
        return config.policy
    if (out / "bc" / "policy").exists():  # an earlier bench's, in the same out_dir
        return out / "bc" / "policy"
    demos = out / "demos.zarr"
    if not demos.exists():
        record_expert(demos, "Reach", episodes=config.demo_episodes, num_envs=8, noise=0.3, progress=False).close()
    result = train_bc(
        BCConfig(
            store=demos,
            policy=FlowConfig(channels=(32, 64), action_horizon=8),
            steps=config.bc_steps,
            batch_size=32,
            warmup=10,
            ema=0.99,
            execute=config.execute,
            lr=3e-4,
            eval_episodes=0,
            checkpoint_every=config.bc_steps,
            run_dir=out / "bc",
            threads=1,
            progress=False,
        )
    )
    return result.checkpoint


def main(config: FlowRLBenchConfig) -> list[dict[str, Any]]:
    unknown = [r for r in config.runs if r not in RUNS]
    if unknown:
        raise SystemExit(f"bench/flow_rl.py: --runs: expected some of {RUNS}; got {unknown}")
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(config.out_dir or tmp)
        policy = bc_checkpoint(config, out)
        start = load_flow_policy(policy, config.sampler_steps)
        bc = config.bc_success
        if bc is None:
            bc = evaluate_policy(start, config.eval_episodes, 25, execute=config.execute).success_rate
        task = start.spec.task
        base = {
            "bench": "flow_rl",
            "task": task,
            "total_steps": config.total_steps,
            "num_envs": config.num_envs,
            "sampler_steps": config.sampler_steps,
            "target": config.target,
        }
        row = {**base, "run": "bc", "seed": None, **curve_summary([(0, bc, 0.0)], config.target)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        for run in config.runs:
            finals = []
            for seed in config.seeds:
                began = time.perf_counter()
                run_dir = out / f"{run}-{seed}"
                shared = {
                    "policy": policy,
                    "num_envs": config.num_envs,
                    "execute": config.execute,
                    "sampler_steps": config.sampler_steps,
                    "total_steps": config.total_steps,
                    "eval_every": config.eval_every,
                    "eval_episodes": config.eval_episodes,
                    "checkpoint_every": config.total_steps,
                    "log_every": config.eval_every,
                    "run_dir": run_dir,
                    "seed": seed,
                    "progress": False,
                }
                if run == "dsrl":
                    train_dsrl(DsrlConfig(**shared))
                else:
                    train_online(OnlineConfig(method=run, rollout_steps=config.rollout_steps, **shared))
                curve = [(0, bc, 0.0), *eval_curve(run_dir)]
                row = {
                    **base,
                    "run": run,
                    "seed": seed,
                    **curve_summary(curve, config.target),
                    "wall_s": round(time.perf_counter() - began, 1),
                }
                row["vs_bc"] = round(row["final_success"] - bc, 3)
                finals.append(row["final_success"])
                print(json.dumps(row), flush=True)
                rows.append(row)
            mean = {
                **base,
                "run": run,
                "seeds": list(config.seeds),
                "mean_final_success": round(float(np.mean(finals)), 3),
                "mean_vs_bc": round(float(np.mean(finals)) - bc, 3),
            }
            print(json.dumps(mean), flush=True)
            rows.append(mean)
    return rows


if __name__ == "__main__":
    main(tyro.cli(FlowRLBenchConfig))
