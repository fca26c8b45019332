"""Success of imitation policies over held-out seeds, beside the scripted expert that made their demonstrations
(the baseline, run in the same process on the same seeds). One JSON line per policy:

  policy         the label given (label=checkpoint); registry: the policy class; steps: sampler steps per chunk
  success_rate, ci95   over `episodes` episodes from seed HELD_OUT_SEED up (Wilson 95% interval)
  vs_expert      success_rate / the expert's, same seeds; vs_teacher (students): minus their teacher's, in points
  by_instruction, wrong_object_rate   on tasks with instructions (PickPlace)
  train_steps, train_wall_s   from the run's metrics.jsonl (the last logged step of the checkpoint's run; for a
                 distilled student, the distillation alone: its teacher's training comes first)
  eval_wall_s    seconds for this evaluation

    .venv/bin/python bench/imitation.py --task PushT --policies flow=runs/bc-flow/checkpoint \\
        consistency=runs/distill/policy --teacher flow
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from robotrl.envs import make
from robotrl.envs.rollouts import evaluate_expert
from robotrl.training.evaluate import HELD_OUT_SEED, evaluate_policy, load_any


@dataclass
class ImitationBenchConfig:
    task: str = "PushT"
    policies: tuple[str, ...] = ()
    """label=checkpoint (a `train bc` / `distill` checkpoint or policy directory, or an export)"""
    teacher: str | None = None
    """label of the multi-step teacher the one-step students (consistency, meanflow) are compared with"""
    episodes: int = 200
    num_envs: int = 50
    execute: int = 8
    seed: int = HELD_OUT_SEED
    expert_noise: float | None = None
    """the expert baseline's noise (default: the task's demo_noise, the level of the demonstrations)"""


def run_record(checkpoint: Path) -> dict[str, Any]:
    """Steps and wall-clock of the training run that wrote `checkpoint` (its parent directory)."""
    metrics = checkpoint.parent / "metrics.jsonl"
    if not metrics.exists():
        return {}
    last = [json.loads(line) for line in metrics.read_text().splitlines() if '"train/' in line or '"distill/' in line][
        -1:
    ]
    return {"train_steps": last[0]["step"], "train_wall_s": round(last[0]["wall_s"], 1)} if last else {}


def row(label: str, stats: Any, seconds: float, **extra: Any) -> dict[str, Any]:
    low, high = stats.success_ci95()
    out = {
        "bench": "imitation",
        "policy": label,
        "episodes": len(stats.success),
        "success_rate": stats.success_rate,
        "ci95": [round(low, 4), round(high, 4)],
        "eval_wall_s": round(seconds, 1),
        **extra,
    }
    if stats.wrong_object is not None:
        out["wrong_object_rate"] = float(stats.wrong_object.mean())
        out["by_instruction"] = stats.by_instruction()
    return out


def main(cfg: ImitationBenchConfig) -> None:
    env = make(cfg.task, num_envs=cfg.num_envs, seed=cfg.seed, render_images=False)
    noise = env.task.demo_noise if cfg.expert_noise is None else cfg.expert_noise
    start = time.perf_counter()
    expert = evaluate_expert(env, noise=noise, episodes=cfg.episodes, seed=cfg.seed)
    env.close()
    print(json.dumps(row("expert", expert, time.perf_counter() - start, task=cfg.task, noise=noise)), flush=True)

    rates: dict[str, float] = {}
    for item in cfg.policies:
        label, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"policies: expected label=checkpoint, got {item!r}")
        policy = load_any(Path(path))
        if policy.spec.task != cfg.task:
            raise ValueError(f"policies: {label} was trained on {policy.spec.task!r}, not {cfg.task!r}")
        start = time.perf_counter()
        stats = evaluate_policy(policy, cfg.episodes, cfg.num_envs, cfg.seed, cfg.execute)
        rates[label] = stats.success_rate
        manifest = policy.manifest if isinstance(getattr(policy, "manifest", None), dict) else policy.manifest()
        extra: dict[str, Any] = {
            "registry": manifest["policy"],
            "steps": getattr(getattr(policy, "config", None), "steps", None),
            "vs_expert": round(stats.success_rate / expert.success_rate, 3) if expert.success_rate else None,
            **run_record(Path(path)),
        }
        if cfg.teacher and label != cfg.teacher and cfg.teacher in rates:
            extra["vs_teacher_points"] = round(100 * (stats.success_rate - rates[cfg.teacher]), 1)
        print(json.dumps(row(label, stats, time.perf_counter() - start, **extra)), flush=True)


if __name__ == "__main__":
    main(tyro.cli(ImitationBenchConfig))
