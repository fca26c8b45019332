"""Our SAC / RLPD against Stable-Baselines3's SAC (the baseline, same process): env steps and training wall-clock
to a stated success rate, on the same task, seeds, network sizes and hyperparameters, evaluated the same way
(the deterministic policy on `eval_episodes` held-out seeded episodes of the CPU vector env every `eval_every`
env steps; evaluation time is not training time).

Prints one JSON line per run:
  steps_to_target, seconds_to_target   first evaluation at >= target (null: not reached within total_steps)
  final_success                        at the end of the budget
  curve                                [(env steps, success, training seconds), ...]
  vs_sb3_steps, vs_sb3_seconds         the baseline's figure / this one (> 1: fewer steps / less time)

    .venv/bin/python bench/sac.py                                   # Reach, 12,000 env steps
    .venv/bin/python bench/sac.py --task PushT --total-steps 100000 --demos runs/pusht.zarr

Shared settings: 256x256 networks, lr 1e-3, batch 256, gamma 0.95, 1,000 random steps, one env, one update per
step. Ours differs as the RLPD recipe says: LayerNorm critics, target entropy -A/2, initial temperature 0.1;
the `rlpd` run adds demonstrations (half of every batch), a 10-critic ensemble and `rlpd_utd` updates per step.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import tyro

from robotrl.datasets.record import record_expert
from robotrl.envs import make
from robotrl.envs.rollouts import run_episodes
from robotrl.rl.sac import SacConfig, train as train_sac
from robotrl.rl.sb3 import Sb3Config, flatten_batch
from robotrl.training.evaluate import HELD_OUT_SEED


@dataclass
class SacBenchConfig:
    task: str = "Reach"
    total_steps: int = 12_000
    eval_every: int = 1_000
    eval_episodes: int = 50
    target: float = 0.9
    runs: tuple[str, ...] = ("sb3-sac", "sac", "rlpd")
    demos: Path | None = None
    """RLPD's demonstrations (default: 20 episodes of the task's noisy expert, recorded here)"""
    rlpd_utd: int = 4
    rlpd_critics: int = 10
    """RLPD's LayerNorm critic ensemble size (the paper's 10; fewer where the CPU budget is the limit)"""
    seed: int = 0


def curve_row(
    bench: str,
    task: str,
    run: str,
    target: float,
    total_steps: int,
    curve: list[tuple[int, float, float]],
    began: float,
    baseline: dict[str, Any] | None,
    name: str,
) -> dict[str, Any]:
    """One run's JSON line: its curve summary and, against the `baseline` run's row, the ratios `vs_<name>_steps`
    and `vs_<name>_seconds` (> 1: it reached the target in fewer steps / less time)."""
    row = {
        "bench": bench,
        "task": task,
        "run": run,
        "target": target,
        "total_steps": total_steps,
        **curve_summary(curve, target),
        "wall_s": round(time.perf_counter() - began, 1),
    }
    if baseline is not None:
        for key, ratio in (("steps_to_target", f"vs_{name}_steps"), ("seconds_to_target", f"vs_{name}_seconds")):
            a, b = baseline[key], row[key]
            row[ratio] = round(a / b, 2) if a is not None and b else None
    return row


def curve_summary(curve: list[tuple[int, float, float]], target: float) -> dict[str, Any]:
    hit = next(((s, t) for s, success, t in curve if success >= target), None)
    return {
        "steps_to_target": hit[0] if hit else None,
        "seconds_to_target": round(hit[1], 1) if hit else None,
        "final_success": curve[-1][1] if curve else None,
        "curve": [(s, round(x, 3), round(t, 1)) for s, x, t in curve],
    }


def run_ours(config: SacBenchConfig, demos: Path | None, run_dir: Path) -> list[tuple[int, float, float]]:
    rlpd = {"demos": demos, "critics": config.rlpd_critics, "utd": config.rlpd_utd} if demos is not None else {}
    train_sac(
        SacConfig(
            task=config.task,
            total_steps=config.total_steps,
            lr=1e-3,
            batch_size=256,
            gamma=0.95,
            learning_starts=1000,
            hidden=(256, 256),
            eval_every=config.eval_every,
            eval_episodes=config.eval_episodes,
            eval_envs=25,
            checkpoint_every=config.total_steps,
            log_every=config.eval_every,
            run_dir=run_dir,
            seed=config.seed,
            progress=False,
            **rlpd,
        )
    )
    return eval_curve(run_dir)


def eval_curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(env steps, held-out success, training seconds) of every evaluation a run logged in metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/success_rate"], r["time/train_seconds"]) for r in rows if "eval/success_rate" in r]


def run_sb3(config: SacBenchConfig, run_dir: Path) -> list[tuple[int, float, float]]:
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    from robotrl.rl.sb3 import make_sb3_env

    cfg = Sb3Config(
        task=config.task,
        algo="sac",
        total_steps=config.total_steps,
        lr=1e-3,
        batch_size=256,
        gamma=0.95,
        learning_starts=1000,
        hidden=(256, 256),
        seed=config.seed,
        run_dir=run_dir,
    )
    env = make_sb3_env(cfg, config.seed)
    keys = tuple(env.env.observation_space.spaces)  # type: ignore[attr-defined]
    model = SAC(
        "MlpPolicy",
        env,
        seed=config.seed,
        device="cpu",
        verbose=0,
        learning_rate=1e-3,
        batch_size=256,
        gamma=0.95,
        learning_starts=1000,
        buffer_size=config.total_steps,
        policy_kwargs={"net_arch": [256, 256]},
    )
    curve: list[tuple[int, float, float]] = []
    clock = {"start": time.perf_counter(), "eval": 0.0}

    def success() -> float:
        venv = make(config.task, num_envs=25, seed=HELD_OUT_SEED)
        try:
            return run_episodes(
                venv,
                lambda obs: model.predict(flatten_batch(obs, keys), deterministic=True)[0],
                config.eval_episodes,
                seed=HELD_OUT_SEED,
            ).success_rate
        finally:
            venv.close()

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % config.eval_every == 0:
                t0 = time.perf_counter()
                trained = t0 - clock["start"] - clock["eval"]
                curve.append((self.num_timesteps, success(), trained))
                clock["eval"] += time.perf_counter() - t0
            return True

    model.learn(config.total_steps, callback=Evaluate())
    env.close()
    return curve


def main(config: SacBenchConfig) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    baseline: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        demos = config.demos
        if "rlpd" in config.runs and demos is None:
            demos = Path(tmp) / "demos.zarr"
            record_expert(demos, config.task, episodes=20, num_envs=10, progress=False).close()
        for run in config.runs:
            began = time.perf_counter()
            if run == "sb3-sac":
                curve = run_sb3(config, Path(tmp) / "sb3")
            elif run in ("sac", "rlpd"):
                curve = run_ours(config, demos if run == "rlpd" else None, Path(tmp) / run)
            else:
                raise ValueError(f"bench: unknown run {run!r}; expected sb3-sac, sac or rlpd")
            row = curve_row("sac", config.task, run, config.target, config.total_steps, curve, began, baseline, "sb3")
            if run == "sb3-sac":
                baseline = row
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main(tyro.cli(SacBenchConfig))
