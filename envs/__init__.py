"""robotrl.envs: the MuJoCo task suite behind one vector-env API on two backends (CPU threads, MJX).

from robotrl.envs import make
env = make("Reach", num_envs=8)                   # CPU threads
env = make("Reach", num_envs=4096, backend="mjx")  # JAX / GPU
env = make("gym:HalfCheetah-v5", num_envs=4)       # an outside gymnasium env (robotrl.envs.outside)
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Literal, overload

from robotrl.core.spec import Spec
from robotrl.envs.outside import is_outside
from robotrl.envs.randomization import Randomization
from robotrl.envs.registration import register_envs
from robotrl.envs.task import Expert, Task, TaskConfig
from robotrl.envs.tasks import TASKS, task_class

if TYPE_CHECKING:
    from robotrl.envs.adapter import GymVectorAdapter
    from robotrl.envs.cpu import CpuVectorEnv
    from robotrl.envs.mjx import MjxVectorEnv
    from robotrl.envs.vector import RobotVectorEnv

BACKENDS = ("cpu", "mjx")


def list_tasks() -> list[str]:
    return sorted(TASKS)


def make_task(name: str, config: TaskConfig | None = None, **options: Any) -> Task:
    """A task by name; `options` override fields of its config dataclass (None: the task's default). The name may
    carry options itself, `Reach?robot=example-robot-data:ur5&robot_base=[0.2,0,0]` (JSON values), so that every
    command that takes a task name takes them; options given both ways must agree."""
    options = {k: v for k, v in options.items() if v is not None}
    if is_outside(name):
        raise ValueError(f"task: {name} is an outside env, not a robotrl task; it has no scripted expert or scene")
    if "?" in name:
        from robotrl.envs.outside import query_options

        named = query_options(name)
        clash = sorted(k for k in named if k in options and options[k] != named[k])
        if clash:
            raise ValueError(f"task: {name!r} sets {clash[0]}={named[clash[0]]!r}, the options {options[clash[0]]!r}")
        name, options = name.partition("?")[0], {**named, **options}
    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"task: unknown task {name!r}; expected one of {list_tasks()}.{hint}")
    cls = task_class(name)
    if config is None:
        known = {f for f in cls.config_cls.__dataclass_fields__}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"{name}: unknown option(s) {sorted(unknown)}; expected some of {sorted(known)}")
        config = cls.config_cls(**options)
    elif options:
        raise ValueError("make_task: pass either a config or options, not both")
    return cls(config)


def spec_of(task: str, **options: Any) -> Spec:
    """The spec of a task (with task options) or of an outside env, without stepping it."""
    if not is_outside(task):
        return make_task(task, **options).spec()
    env = make(task, **options)
    env.close()
    return env.task_spec


def is_task(task: object) -> bool:
    """Whether `task` is one of robotrl's own tasks (scripted expert, scene, randomization, MJX), not an outside env."""
    return isinstance(task, Task) or not is_outside(task)


@overload
def make(
    task: str | Task,
    num_envs: int = 1,
    backend: Literal["cpu"] = "cpu",
    randomization: Randomization | str | None = None,
    seed: int | None = None,
    **options: Any,
) -> CpuVectorEnv: ...
@overload
def make(
    task: str | Task,
    num_envs: int = 1,
    *,
    backend: Literal["mjx"],
    randomization: Randomization | str | None = None,
    seed: int | None = None,
    **options: Any,
) -> MjxVectorEnv: ...
@overload
def make(
    task: str | Task,
    num_envs: int = 1,
    backend: str = "cpu",
    randomization: Randomization | str | None = None,
    seed: int | None = None,
    **options: Any,
) -> RobotVectorEnv | GymVectorAdapter: ...
def make(
    task: str | Task,
    num_envs: int = 1,
    backend: str = "cpu",
    randomization: Randomization | str | None = None,
    seed: int | None = None,
    **options: Any,
) -> RobotVectorEnv | GymVectorAdapter:
    """A vector env of `num_envs` copies of `task` on `backend` ('cpu' or 'mjx').

    `task` may also name an outside env, `gym:<id>` or `<module>:<callable>` (`robotrl.envs.outside`): then it is
    a `GymVectorAdapter` on the CPU, and only the options that have a meaning for it are taken.

    `randomization` is a `Randomization`, "task" for the task's own sim-to-real ranges, or None (off).

    Backend options (`output`, `autoreset`, `reward_type`, `num_threads`, ...) and task options
    (`action_mode`, `episode_steps`, ...) may be mixed in `options`.
    """
    from robotrl.envs.vector import check_num_envs

    check_num_envs(num_envs)
    if isinstance(task, str) and is_outside(task):
        from robotrl.envs.adapter import make_outside

        return make_outside(task, num_envs, backend, randomization, seed, **options)
    backend_keys = {
        "output",
        "autoreset",
        "reward_type",
        "num_threads",
        "render_images",
        "render_workers",
        "compile_task",
        "fuse_step",
    }
    backend_opts = {k: v for k, v in options.items() if k in backend_keys}
    task_opts = {k: v for k, v in options.items() if k not in backend_keys}
    t = task if isinstance(task, Task) else make_task(task, **task_opts)
    if isinstance(randomization, str):
        if randomization != "task":
            raise ValueError(f"randomization: expected a Randomization, 'task' or None, got {randomization!r}")
        randomization = t.default_randomization()
    if backend == "cpu":
        from robotrl.envs.cpu import CpuVectorEnv

        return CpuVectorEnv(t, num_envs, randomization, seed, **backend_opts)
    if backend == "mjx":
        from robotrl.envs.mjx import MjxVectorEnv

        for key in ("compile_task", "fuse_step"):
            if key in backend_opts:
                raise ValueError(f"{key}: an option of the cpu backend (MJX compiles the whole step already)")

        return MjxVectorEnv(t, num_envs, randomization, seed, **backend_opts)
    raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


register_envs()  # gymnasium ids robotrl/<Task>-v0 (by name; no task module is imported)

__all__ = [
    "BACKENDS",
    "Expert",
    "Randomization",
    "Task",
    "TaskConfig",
    "is_outside",
    "is_task",
    "list_tasks",
    "make",
    "make_task",
    "spec_of",
]
