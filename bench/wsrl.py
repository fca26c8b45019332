"""Offline-to-online: WSRL vs RLPD with the offline data vs online SAC from scratch, on the same demonstrations,
task, seeds and budget (issue 6 must-show: success against env steps).

  wsrl      an offline actor-critic (`--offline iql|calql` on the demonstrations) fine-tuned online by SAC
            (`robotrl train sac --init`): a warm-up of `warmup` transitions from the pretrained actor, then
            online data only; the offline data is not kept
  rlpd      SAC from fresh networks with the demonstrations in half of every batch (the data is kept)
  scratch   SAC from fresh networks, online data only (the baseline)

Every run evaluates the deterministic actor on `eval_episodes` held-out seeded episodes every `eval_every` env
steps (evaluation time is not training time). The `wsrl` curve starts at env step 0 with the offline agent's own
success. Prints one JSON line per run: the curve [(env steps, success, training seconds)], the steps and seconds
to `target`, and, against `scratch` (run first), the ratios (> 1: fewer steps / less time than from scratch).

    .venv/bin/python bench/wsrl.py                                            # Reach, small budget
    .venv/bin/python bench/wsrl.py --task PushT --total-steps 60000 --eval-every 6000 --demo-episodes 100
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robotrl.datasets.record import record_expert
from robotrl.rl.sac import SacConfig, train as train_sac
from sac import curve_row, eval_curve  # bench/sac.py, the SAC-vs-SB3 bench


@dataclass
class WsrlBenchConfig:
    task: str = "Reach"
    demos: Path | None = None
    """demonstrations of the task (default: `demo_episodes` of its noisy scripted expert, recorded here)"""
    demo_episodes: int = 20
    offline: Literal["iql", "calql"] = "iql"
    offline_steps: int = 3_000
    cql_alpha: float = 5.0
    """Cal-QL's regularizer weight (`--offline calql`)"""
    total_steps: int = 6_000
    """online env steps of every run"""
    warmup: int = 1_000
    """WSRL's warm-up transitions from the pretrained actor (SAC's learning_starts for the other runs too)"""
    eval_every: int = 1_000
    eval_episodes: int = 50
    target: float = 0.6
    runs: tuple[str, ...] = ("scratch", "rlpd", "wsrl")
    critics: int = 10
    utd: int = 2
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 3e-4
    gamma: float = 0.95
    seed: int = 0
    out_dir: Path | None = None
    """keep the run directories here (default: a temporary directory)"""


def offline_pretrain(config: WsrlBenchConfig, demos: Path, run_dir: Path) -> tuple[float, float]:
    """The offline agent WSRL starts from: (its held-out success, training seconds)."""
    common = dict(
        store=demos,
        steps=config.offline_steps,
        hidden=config.hidden,
        critics=config.critics,
        gamma=config.gamma,
        lr=config.lr,
        eval_episodes=config.eval_episodes,
        eval_envs=25,
        checkpoint_every=config.offline_steps,
        log_every=max(1, config.offline_steps // 10),
        run_dir=run_dir,
        seed=config.seed,
        progress=False,
    )
    if config.offline == "iql":
        from robotrl.rl.iql import IqlConfig, train as train_iql

        result = train_iql(IqlConfig(**common))  # type: ignore[arg-type]
    else:
        from robotrl.rl.calql import CalqlConfig, train as train_calql

        result = train_calql(CalqlConfig(**common, cql_alpha=config.cql_alpha))
    assert result.success_rate is not None
    return result.success_rate, result.train_seconds


def online(
    config: WsrlBenchConfig, run: str, demos: Path, offline_dir: Path, run_dir: Path
) -> list[tuple[int, float, float]]:
    extra: dict[str, Any] = {"scratch": {}, "rlpd": {"demos": demos}, "wsrl": {"init": offline_dir}}[run]
    train_sac(
        SacConfig(
            task=config.task,
            total_steps=config.total_steps,
            learning_starts=config.warmup,
            critics=config.critics,
            utd=config.utd,
            hidden=config.hidden,
            lr=config.lr,
            gamma=config.gamma,
            eval_every=config.eval_every,
            eval_episodes=config.eval_episodes,
            eval_envs=25,
            checkpoint_every=config.total_steps,
            log_every=config.eval_every,
            run_dir=run_dir,
            seed=config.seed,
            progress=False,
            **extra,
        )
    )
    return eval_curve(run_dir)


def main(config: WsrlBenchConfig) -> list[dict[str, Any]]:
    unknown = [r for r in config.runs if r not in ("scratch", "rlpd", "wsrl")]
    if unknown:
        raise SystemExit(f"bench/wsrl.py: --runs: expected some of scratch, rlpd, wsrl; got {unknown}")
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(config.out_dir or tmp)
        demos = config.demos
        if demos is None:
            demos = out / "demos.zarr"
            if not demos.exists():
                record_expert(demos, config.task, episodes=config.demo_episodes, num_envs=10, progress=False).close()
        offline_dir = out / config.offline
        if "wsrl" in config.runs:
            offline_success, offline_seconds = offline_pretrain(config, demos, offline_dir)
            print(
                json.dumps(
                    {
                        "bench": "wsrl",
                        "task": config.task,
                        "run": config.offline,
                        "steps": config.offline_steps,
                        "success": offline_success,
                        "train_s": round(offline_seconds, 1),
                    }
                ),
                flush=True,
            )
        baseline: dict[str, Any] | None = None
        for run in config.runs:
            began = time.perf_counter()
            curve = online(config, run, demos, offline_dir, out / run)
            if run == "wsrl":
                curve = [(0, offline_success, 0.0), *curve]
            row = curve_row(
                "wsrl", config.task, run, config.target, config.total_steps, curve, began, baseline, "scratch"
            )
            if run == "scratch":
                baseline = row
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main(tyro.cli(WsrlBenchConfig))
