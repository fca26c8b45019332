"""Outside environments named where a robotrl task name goes: `gym:<id>` or `<module>:<callable>`.

    robotrl train sac --task gym:HalfCheetah-v5
    robotrl train sac --task "gym:HalfCheetah-v5?ctrl_cost_weight=0.05"
    robotrl data record --task my_robot.envs:make_env --demonstrator my_robot.experts:Scripted

`gym:<id>` is `gymnasium.make(id)`; `<module>:<callable>` imports `module` and calls `callable(**kwargs)`, which
returns a `gymnasium.Env`. Keyword arguments follow a `?` as `key=value` pairs joined by `&`; a value is read as
JSON where it parses (numbers, booleans, null, lists) and as a string otherwise. The name is kept in its canonical
form (keys sorted), and that form is what every spec, dataset and checkpoint records as its task: the same env
gives the same spec whether it was recorded or adapted, and a stage started from those files rebuilds it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import gymnasium as gym

GYM_PREFIX = "gym:"


def is_outside(task: object) -> bool:
    """Whether a task name names an outside env (robotrl's own tasks have no ':' before their options)."""
    return isinstance(task, str) and ":" in task.partition("?")[0]


@dataclass(frozen=True)
class OutsideEnv:
    """A parsed outside-env name: a gymnasium id or an import path, and the keyword arguments it is made with."""

    target: str
    """'gym:<id>' or '<module>:<callable>'"""
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_gym(self) -> bool:
        return self.target.startswith(GYM_PREFIX)

    @property
    def name(self) -> str:
        """The canonical name: target and keyword arguments, keys sorted."""
        if not self.kwargs:
            return self.target
        pairs = (f"{k}={quote(_text(v), safe=',:/[]{}-.')}" for k, v in sorted(self.kwargs.items()))
        return f"{self.target}?{'&'.join(pairs)}"

    def factory(self, **extra: Any) -> Callable[[], gym.Env]:
        """A zero-argument factory of the env, `extra` keyword arguments added to the name's."""
        kwargs = {**self.kwargs, **extra}
        if self.is_gym:
            env_id = self.target[len(GYM_PREFIX) :]
            return lambda: gym.make(env_id, **kwargs)
        make = resolve(self.target, "task")
        return lambda: check_env_type(make(**kwargs), self.target)


def parse(task: str) -> OutsideEnv:
    """`gym:<id>[?k=v&...]` or `<module>:<callable>[?k=v&...]`; a malformed name is a one-line error."""
    target = task.partition("?")[0]
    head, _, tail = target.partition(":")
    if not head or not tail:
        raise ValueError(f"task: expected 'gym:<id>' or '<module>:<callable>', got {task!r}")
    return OutsideEnv(target, query_options(task))


def query_options(task: str) -> dict[str, Any]:
    """The keyword arguments after a task name's '?' (`k=v&...`, values read as JSON where they parse): an outside
    env's, or a robotrl task's options (`Reach?robot=example-robot-data:ur5`)."""
    kwargs: dict[str, Any] = {}
    for pair in filter(None, task.partition("?")[2].split("&")):
        key, eq, value = pair.partition("=")
        if not eq or not key.isidentifier():
            raise ValueError(f"task: expected keyword arguments as key=value after '?', got {pair!r} in {task!r}")
        kwargs[key] = _value(unquote(value))
    return kwargs


def check_name(task: str) -> str:
    """The canonical name of an outside env after checking that it exists: a registered gymnasium id, or an
    importable callable. Nothing is constructed."""
    env = parse(task)
    if env.is_gym:
        env_id = env.target[len(GYM_PREFIX) :]
        try:
            gym.spec(env_id)
        except gym.error.Error as e:
            raise ValueError(f"task: {env_id!r} is not a registered gymnasium id ({e})") from None
    else:
        resolve(env.target, "task")
    return env.name


def resolve(path: str, field_name: str) -> Callable[..., Any]:
    """The callable `module:attr` names (attr may be dotted); a missing module or attribute is a one-line error.
    The working directory is searched too, as `python -m` does: `my_env:make` finds ./my_env.py."""
    module_name, _, attr = path.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{field_name}: cannot import module {module_name!r} of {path!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{field_name}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{field_name}: expected {path!r} to be callable, got {type(obj).__name__}")
    return obj


def check_env_type(env: Any, target: str) -> gym.Env:
    if not isinstance(env, gym.Env):
        raise TypeError(f"task: expected {target} to return a gymnasium.Env, got {type(env).__name__}")
    return env


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _text(value: Any) -> str:
    return value if isinstance(value, str) and _value(value) == value else json.dumps(value)
