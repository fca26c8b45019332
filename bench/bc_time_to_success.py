"""Time to success of BC on a task: held-out success against training seconds on this machine, for the task's
recipe's BC (the baseline, first) and candidate settings, each run in turn with the same threads (JSON lines).

Each variant trains `robotrl train bc` on the same demos (recorded once by the recipe's demo settings when `--store`
does not exist) and is evaluated every `--eval-every` steps on the same held-out episodes; a line per evaluation:
its step, training seconds so far (evaluations excluded), success over the episodes. The last line per variant
gives the seconds to reach `--target` success and the ratio against the baseline's. Results: bench/RESULTS.md,
"BC's time to success".

    python bench/bc_time_to_success.py --task PushT --budget quick --variants recipe mlp512 --threads 2
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

#: candidate BC settings on top of the recipe's: BCConfig fields, and the policy config's under "policy"
VARIANTS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "mlp512": {"batch_size": 256, "lr": 1e-3, "policy": {"backbone": "mlp", "mlp_width": 512, "mlp_depth": 4}},
    "mlp256": {"batch_size": 256, "lr": 1e-3, "policy": {"backbone": "mlp", "mlp_width": 256, "mlp_depth": 3}},
    "unet_b256": {"batch_size": 256, "lr": 1e-3},
    "tail20": {"success_tail": 20},
    "tail20_b256": {"success_tail": 20, "batch_size": 256},
    "tail20_b256_h8": {"success_tail": 20, "batch_size": 256, "policy": {"action_horizon": 8}},
    "unet_tail20_b256": {  # the quick budget's BC before the chunk MLP
        "success_tail": 20,
        "batch_size": 256,
        "policy": {"backbone": "unet", "channels": (32, 64, 128)},
    },
    "mlp512_tail20": {
        "success_tail": 20,
        "batch_size": 256,
        "policy": {"backbone": "mlp", "mlp_width": 512, "mlp_depth": 4},
    },
    "mlp1024_tail20": {
        "success_tail": 20,
        "batch_size": 256,
        "policy": {"backbone": "mlp", "mlp_width": 1024, "mlp_depth": 4},
    },
}


@dataclass
class TimeToSuccessConfig:
    task: str = "PushT"
    budget: str = "quick"
    """the recipe budget whose BC settings are the baseline (and whose demo settings record the demos)"""
    variants: tuple[str, ...] = ("recipe", "mlp512")
    steps: int | None = None
    """BC steps of every variant (default: the recipe's)"""
    eval_every: int = 1000
    eval_episodes: int = 100
    target: float = 0.9
    store: Path = Path("runs/bench-bc-tts/demos.zarr")
    out: Path = Path("runs/bench-bc-tts")
    threads: int = 2
    seed: int = 0


def main(cfg: TimeToSuccessConfig) -> None:
    from robotrl.datasets.record import record_expert
    from robotrl.stages.bc import train
    from robotrl.stages.pipeline import PipelineConfig, bc_config, demo_noise

    pipeline = PipelineConfig(task=cfg.task, budget=cfg.budget, bc_steps=cfg.steps, progress=False)  # type: ignore[arg-type]
    settings = pipeline.settings()
    if not cfg.store.exists():  # the demos the recipe records
        noise = demo_noise(pipeline, settings)
        record_expert(
            cfg.store, cfg.task, settings.demo_episodes, num_envs=8, noise=noise, seed=cfg.seed, progress=False
        ).close()
    baseline_seconds = None
    for name in cfg.variants:
        recipe = bc_config(pipeline, settings, cfg.out)  # the pipeline's BC stage, as `robotrl run` trains it
        change = dict(VARIANTS[name])
        policy = dataclasses.replace(recipe.policy, **change.pop("policy", {}))  # type: ignore[arg-type]
        run_dir = cfg.out / name
        began = time.perf_counter()
        train(
            dataclasses.replace(
                recipe,
                store=cfg.store,
                policy=policy,
                **change,
                eval_every=cfg.eval_every,
                eval_episodes=cfg.eval_episodes,
                eval_envs=min(50, cfg.eval_episodes),
                run_dir=run_dir,
                threads=cfg.threads,
            )
        )
        reached = None
        train_seconds = json.loads((run_dir / "result.json").read_text())["train_seconds"]
        for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
            if "eval/success_rate" not in row:
                continue
            seconds = row.get("time/train_seconds", train_seconds)  # the final evaluation's: the whole run's
            print(
                json.dumps(
                    {
                        "bench": "bc_time_to_success",
                        "task": cfg.task,
                        "variant": name,
                        "step": row["step"],
                        "train_s": round(seconds, 1),
                        "success": row["eval/success_rate"],
                        "episodes": cfg.eval_episodes,
                    }
                ),
                flush=True,
            )
            if reached is None and row["eval/success_rate"] >= cfg.target:
                reached = seconds
        if name == cfg.variants[0]:
            baseline_seconds = reached
        ratio = baseline_seconds / reached if baseline_seconds and reached else None
        summary = {"variant": name, "target": cfg.target, "seconds_to_target": reached, "speedup": ratio}
        print(json.dumps({"bench": "bc_time_to_success", **summary, "wall_s": round(time.perf_counter() - began)}))


if __name__ == "__main__":
    main(tyro.cli(TimeToSuccessConfig))
