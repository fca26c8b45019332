"""The task suite. Each task is one module; `TASKS` maps a task name to "module:Class" (imported on use,
so listing tasks stays cheap and one task's module never loads another's)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from robotrl.envs.task import Task

#: the task every command takes when none is given
DEFAULT_TASK = "PushT"

TASKS: dict[str, str] = {
    "Reach": "robotrl.envs.tasks.reach:Reach",
    "PushT": "robotrl.envs.tasks.push_t:PushT",
    "PickPlace": "robotrl.envs.tasks.pick_place:PickPlace",
    "Quadruped": "robotrl.envs.tasks.quadruped:Quadruped",
}


def task_class(name: str) -> type[Task]:
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)
