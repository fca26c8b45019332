"""Quadruped policies by what locomotion needs: the fall rate, the fraction of steps that track the commanded
velocity, and the mean return, over seeded held-out episodes (one per env, random commands; steps after a fall
count as not tracking). `run_episodes`' success (any step tracking) says little for a legged robot.

Each policy is a checkpoint (`<run>/policy`, e.g. what `robotrl train ppo --task Quadruped` saves) or its export
(`robotrl policy export`, run by the runtime); the scripted expert and the zero action are the baselines, on the
same episodes. Prints one JSON line per policy.

    python bench/quadruped_tracking.py --policies ppo=runs/quad/policy onnx=runs/quad/policy-onnx --episodes 100
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tyro

from robotrl.envs.tasks.quadruped import tracking, tracking_stats
from robotrl.training.evaluate import HELD_OUT_SEED, controller_for, load_any


@dataclass
class TrackingBenchConfig:
    policies: tuple[str, ...] = ()
    """label=checkpoint or export directory"""
    episodes: int = 100
    seed: int = HELD_OUT_SEED
    baselines: bool = True
    """also the scripted expert (noise 0) and the zero action on the same episodes"""


def main(config: TrackingBenchConfig) -> None:
    rows: list[tuple[str, dict[str, float]]] = []
    for item in config.policies:
        label, path = item.split("=", 1)
        policy = load_any(Path(path), threads=1)
        controller = controller_for(policy, execute=1)
        rows.append((label, tracking(controller, config.episodes, config.seed, controller.reset)))
    if config.baselines:
        rows.append(("expert", tracking_stats("expert", 0.0, config.episodes, config.seed)))
        rows.append(("zero", tracking_stats("zero", 0.0, config.episodes, config.seed)))
    for label, stats in rows:
        print(json.dumps({"bench": "quadruped_tracking", "policy": label, "episodes": config.episodes, **stats}))


if __name__ == "__main__":
    main(tyro.cli(TrackingBenchConfig))
