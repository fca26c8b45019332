"""How an arm's servos follow an end-effector step: the tool's motion per control step over the commanded step, for a
constant ee-delta command of 1 on each horizontal axis from the reset (JSON lines).

1.0 is a servo that lands on each step's target; above 1 it overshoots (the tasks' controllers read what moved
minus what was asked as drift), well below 1 it lags. Results: bench/RESULTS.md, "Robots from description files".

    python bench/robot_servo.py --tasks 'Reach?robot=example-robot-data:ur5&robot_base=[0.2,0,0]' Reach
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import tyro

from robotrl.envs import make


@dataclass
class ServoBenchConfig:
    tasks: tuple[str, ...] = (
        "Reach?robot=example-robot-data:ur5&robot_base=[0.2,0,0]",
        "PushT?robot=example-robot-data:ur5",
        "PickPlace?robot=example-robot-data:ur5&robot_base=[0.2,0,0]",
        "Reach",
        "PushT",
        "PickPlace",
    )
    steps: int = 4
    seed: int = 0


def step_response(task: str, axis: int, steps: int, seed: int) -> list[float]:
    """The tool's motion along `axis` per control step, over the step commanded (`max_ee_step`)."""
    env = make(task, num_envs=1, seed=seed, render_images=False)
    env.reset(seed=seed)
    action = np.zeros((1, *env.single_action_space.shape))
    action[0, axis] = 1.0
    ee = env.task.sensor(env.frame(), "ee_pos").copy()
    moved = []
    for _ in range(steps):
        env.step(action)
        now = env.task.sensor(env.frame(), "ee_pos").copy()
        moved.append(float((now - ee)[0, axis] / env.task.config.max_ee_step))
        ee = now
    env.close()
    return moved


def main(cfg: ServoBenchConfig) -> None:
    for task in cfg.tasks:
        for axis, name in enumerate("xy"):
            moved = step_response(task, axis, cfg.steps, cfg.seed)
            print(json.dumps({"bench": "servo_step", "task": task, "axis": name, "moved_per_step": moved}), flush=True)


if __name__ == "__main__":
    main(tyro.cli(ServoBenchConfig))
