"""robotrl's SAC against Stable-Baselines3's SAC on gymnasium's MuJoCo envs, from the CLI alone.

For each env and seed it runs `robotrl train sac --task gym:<id>` and `robotrl train sb3-sac --task gym:<id>` at
the same time (one core each, so both see the same machine load) with matched settings, and reads each run's
metrics.jsonl: the deterministic policy's mean return on `eval_episodes` held-out seeded episodes every
`eval_every` env steps, against env steps and training seconds (evaluation excluded).

Prints one JSON line per run (its curve, final return, seconds per env step) and one per env: each side's mean
(and sample standard deviation) over the seeds of the final return and of the seconds per env step, and the
ratios ours / SB3 (the baseline, measured in the same run).

    .venv/bin/python bench/sac_gym.py                                    # HalfCheetah-v5, Hopper-v5; seeds 0-2
    .venv/bin/python bench/sac_gym.py --envs Hopper-v5 --seeds 0 --total-steps 5000

Matched settings: 256x256 networks, lr 3e-4, batch 256, gamma 0.99, tau 0.005, two critics, one update per env
step, `learning_starts` uniform random steps, the temperature learned towards -|A| from 1.0 (SB3's `auto`).
What differs is robotrl's design: its actor and critics have LayerNorm after every hidden layer. The figures go
to bench/RESULTS.md, section "Outside envs: our SAC vs Stable-Baselines3's SAC on gymnasium MuJoCo".
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import tyro

ROBOTRL = [sys.executable, "-m", "robotrl.cli"]


@dataclass
class SacGymConfig:
    envs: tuple[str, ...] = ("HalfCheetah-v5", "Hopper-v5")
    seeds: tuple[int, ...] = (0, 1, 2)
    total_steps: int = 20_000
    learning_starts: int = 2_000
    eval_every: int = 2_000
    eval_episodes: int = 5
    out: Path = Path("runs/sac-gym")
    """each run's directory: <out>/<env>/<sac|sb3-sac>-seed<seed>"""


def action_dim(env_id: str) -> int:
    env = gym.make(env_id)
    try:
        return int(env.action_space.shape[0])  # type: ignore[index]
    finally:
        env.close()


def commands(config: SacGymConfig, env_id: str, seed: int, action_dim: int) -> dict[str, list[str]]:
    """The two CLI commands of one (env, seed): robotrl's SAC and SB3's, with the same settings (the target
    entropy -`action_dim`, SB3's `auto`)."""
    shared = [
        "--task", f"gym:{env_id}",
        "--total-steps", str(config.total_steps),
        "--learning-starts", str(config.learning_starts),
        "--lr", "3e-4", "--batch-size", "256", "--gamma", "0.99", "--hidden", "256", "256",
        "--eval-every", str(config.eval_every),
        "--eval-episodes", str(config.eval_episodes), "--eval-envs", str(config.eval_episodes),
        "--seed", str(seed), "--threads", "1", "--no-progress",
    ]  # fmt: skip
    runs = config.out / env_id
    return {
        "sac": [
            *ROBOTRL, "train", "sac", *shared,
            "--critics", "2", "--critic-subset", "2", "--utd", "1", "--tau", "0.005",
            "--target-entropy", str(-action_dim), "--init-temperature", "1.0",
            "--checkpoint-every", str(config.total_steps), "--run-dir", str(runs / f"sac-seed{seed}"),
        ],
        "sb3-sac": [
            *ROBOTRL, "train", "sb3-sac", *shared,
            "--checkpoint-every", "0", "--run-dir", str(runs / f"sb3-sac-seed{seed}"),
        ],
    }  # fmt: skip


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(env steps, mean return, training seconds) of every evaluation in a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [
        (int(r["step"]), float(r["eval/mean_return"]), float(r["time/train_seconds"]))
        for r in rows
        if "eval/mean_return" in r
    ]


def mean_sd(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def main(config: SacGymConfig) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for env_id in config.envs:
        rows: dict[str, list[dict[str, Any]]] = {"sac": [], "sb3-sac": []}
        dim = action_dim(env_id)
        for seed in config.seeds:
            cmds = commands(config, env_id, seed, dim)
            began = time.perf_counter()
            procs = {
                name: subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for name, cmd in cmds.items()
            }
            for name, proc in procs.items():
                _, err = proc.communicate()
                if proc.returncode != 0:
                    sys.exit(f"{name} on {env_id} seed {seed} failed:\n{err[-2000:]}")
            for name in procs:
                points = curve(Path(cmds[name][-1]))
                steps, final, seconds = points[-1]
                row = {
                    "bench": "sac_gym",
                    "env": env_id,
                    "run": name,
                    "seed": seed,
                    "final_return": round(final, 1),
                    "train_seconds": round(seconds, 1),
                    "seconds_per_env_step": round(seconds / steps, 5),
                    "curve": [(s, round(r, 1), round(t, 1)) for s, r, t in points],
                    "command": " ".join(cmds[name][2:]),
                    "pair_wall_s": round(time.perf_counter() - began, 1),
                }
                rows[name].append(row)
                print(json.dumps(row), flush=True)
        summary: dict[str, Any] = {"bench": "sac_gym", "env": env_id, "seeds": list(config.seeds)}
        for name, runs in rows.items():
            summary[name] = {
                "final_return": mean_sd([r["final_return"] for r in runs]),
                "seconds_per_env_step": mean_sd([r["seconds_per_env_step"] for r in runs]),
            }
        ours, base = summary["sac"], summary["sb3-sac"]
        summary["vs_sb3_final_return"] = round(ours["final_return"]["mean"] / base["final_return"]["mean"], 3)
        summary["vs_sb3_seconds_per_step"] = round(
            base["seconds_per_env_step"]["mean"] / ours["seconds_per_env_step"]["mean"], 3
        )
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(tyro.cli(SacGymConfig))
