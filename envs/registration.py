"""gymnasium ids for the task suite: `robotrl/<Task>-v0`, registered on `import robotrl.envs`.

`gym.make(id)` gives the single-env `RobotEnv`; `gym.make_vec(id, num_envs=n, vectorization_mode="vector_entry_point")`
gives the batched CPU backend directly (one `mujoco.batch` call per step instead of n Python envs).
Registration is by name only, so importing `robotrl.envs` never imports a task module.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from robotrl.envs.tasks import TASKS

NAMESPACE = "robotrl"
VERSION = 0


def env_id(task: str) -> str:
    return f"{NAMESPACE}/{task}-v{VERSION}"


def make_vector(task: str, num_envs: int = 1, **options: Any) -> gym.vector.VectorEnv:
    """Vector entry point: the CPU backend (gymnasium passes `render_mode`, which the backend ignores)."""
    from robotrl.envs import make

    options.pop("render_mode", None)
    return make(task, num_envs=num_envs, **options)


def register_envs() -> list[str]:
    """Register every task in `TASKS` (idempotent) and return their ids."""
    ids = []
    for task in TASKS:
        name = env_id(task)
        if name not in gym.registry:
            gym.register(
                id=name,
                entry_point="robotrl.envs.gym_env:RobotEnv",
                vector_entry_point="robotrl.envs.registration:make_vector",
                kwargs={"task": task},
            )
        ids.append(name)
    return ids
