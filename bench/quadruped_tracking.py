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
from typing import Any

import numpy as np
import tyro

from robotrl.envs import make
from robotrl.training.evaluate import HELD_OUT_SEED, controller_for


@dataclass
class TrackingBenchConfig:
    policies: tuple[str, ...] = ()
    """label=checkpoint or export directory"""
    episodes: int = 100
    seed: int = HELD_OUT_SEED
    baselines: bool = True
    """also the scripted expert (noise 0) and the zero action on the same episodes"""


def load_any(path: Path) -> Any:
    """An export through the runtime, a checkpoint through the policy registry."""
    manifest = json.loads((path / "manifest.json").read_text())
    if "export" in manifest:
        from robotrl.policies import runtime

        return runtime.load(path, threads=1)
    from robotrl.policies import load

    return load(path).eval()


def tracking(act: Any, episodes: int, seed: int, reset: Any = None) -> dict[str, float]:
    env = make("Quadruped", num_envs=episodes, seed=seed, autoreset=False)
    obs, _ = env.reset(seed=seed)
    if reset is not None:
        reset(episodes)
    steps = env.task.config.episode_steps
    alive, tracked, ret = np.ones(episodes, bool), np.zeros(episodes), np.zeros(episodes)
    for _ in range(steps):
        obs, reward, terminated, _, info = env.step(act(obs))
        tracked += info["success"] & alive
        ret += np.where(alive, reward, 0.0)
        alive &= ~terminated
    env.close()
    return {
        "fall_rate": float(1.0 - alive.mean()),
        "tracking": float(tracked.mean() / steps),
        "return": float(ret.mean()),
    }


def main(config: TrackingBenchConfig) -> None:
    rows: list[tuple[str, dict[str, float]]] = []
    for item in config.policies:
        label, path = item.split("=", 1)
        policy = load_any(Path(path))
        controller = controller_for(policy, execute=1)
        rows.append((label, tracking(controller, config.episodes, config.seed, controller.reset)))
    if config.baselines:
        env = make("Quadruped", num_envs=config.episodes, seed=config.seed)
        expert = env.task.expert(noise=0.0, seed=config.seed)
        env.close()
        rows.append(("expert", tracking(expert.act, config.episodes, config.seed, expert.reset)))
        rows.append(
            ("zero", tracking(lambda obs: np.zeros((config.episodes, 12), np.float32), config.episodes, config.seed))
        )
    for label, stats in rows:
        print(json.dumps({"bench": "quadruped_tracking", "policy": label, "episodes": config.episodes, **stats}))


if __name__ == "__main__":
    main(tyro.cli(TrackingBenchConfig))
