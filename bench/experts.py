"""Scripted-expert success over seeded episodes, at noise 0 and at each task's `demo_noise` (JSON lines).

The experts stand in for human demonstrators downstream, so their success (with a Wilson 95% interval) is a
property of the task suite worth tracking like any speed figure.

    python bench/experts.py --episodes 200
    python bench/experts.py --tasks 'Reach?robot=example-robot-data:ur5&robot_base=[0.2,0,0]' --noises 0 0.3 1
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import tyro

from robotrl.envs import make
from robotrl.envs.rollouts import evaluate_expert


@dataclass
class ExpertBenchConfig:
    tasks: tuple[str, ...] = ("Reach", "PushT", "PickPlace")
    episodes: int = 200
    num_envs: int = 50
    seed: int = 0
    noises: tuple[float, ...] = ()
    """the expert's noise levels (default: 0 and each task's demo_noise)"""


def main(cfg: ExpertBenchConfig) -> None:
    for task in cfg.tasks:
        env = make(task, num_envs=cfg.num_envs, seed=cfg.seed, render_images=False)
        for noise in cfg.noises or (0.0, env.task.demo_noise):
            start = time.perf_counter()
            stats = evaluate_expert(env, noise=noise, episodes=cfg.episodes, seed=cfg.seed)
            low, high = stats.success_ci95()
            print(
                json.dumps(
                    {
                        "bench": "expert_success",
                        "task": task,
                        "noise": noise,
                        "episodes": len(stats.success),
                        "success_rate": stats.success_rate,
                        "ci95": [round(low, 4), round(high, 4)],
                        "mean_length": float(stats.lengths.mean()),
                        "wall_s": round(time.perf_counter() - start, 1),
                    }
                ),
                flush=True,
            )
        env.close()


if __name__ == "__main__":
    main(tyro.cli(ExpertBenchConfig))
