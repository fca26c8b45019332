"""One control step of the CPU backend around its physics call, written once against an array namespace `xp`.

`before_physics` turns the actions into actuator controls (the task's control of the actions clipped to their bounds)
and reads what a blow-up is judged against; `after_physics` computes what the step returns (the task's observation,
reward and termination, a blow-up's end, the time limit). The backend runs them as numpy (`NumpyStep`) or as two
native calls compiled from this very code (robotrl/envs/compiled.py): the step's own bookkeeping then costs no
numpy call per array operation either, and the two forms are checked equal on the env's first state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import mujoco
import numpy as np

from robotrl.envs.task import Frame, ResetState, Task

#: the warnings MuJoCo raises when a simulation blows up (and which reset that simulation's data): consecutive in
#: mjtWarning, so a slice of the counters reads them without a gather
DIVERGED = slice(int(mujoco.mjtWarning.mjWARN_BADQPOS), int(mujoco.mjtWarning.mjWARN_BADQACC) + 1)


class Before(NamedTuple):
    """What `before_physics` gives the physics call."""

    ctrl: Any  # (n, nu) the actuators' controls
    action: Any  # (n, *action) the actions clipped to their bounds
    finite: Any  # (n,) bool: the env's action was finite (the backend raises, naming the others)
    blowups: Any  # (n,) int64: the env's blow-up warnings so far


class After(NamedTuple):
    """What `after_physics` computes of the new state: the step's results."""

    numeric: dict[str, Any]  # the task's numeric observations
    reward: Any  # (n,) float64: dense, or success as 0/1 for reward_type "sparse"; 0 where the env blew up
    success: Any  # (n,) bool
    terminated: Any  # (n,) bool: the task's end, or a blow-up
    truncated: Any  # (n,) bool: the time limit, where not terminated
    diverged: Any  # (n,) bool: MuJoCo warned of a blow-up (and reset the simulation) or the state is not finite
    steps: Any  # (n,) int64: the episode's steps, this one included


def blowup_count(xp: Any, warning: Any) -> Any:
    """Each simulation's count of blow-up warnings, from `mujoco.batch.Batch.warning` (n, mjNWARNING, 2)."""
    return warning[:, DIVERGED, 1].astype(xp.int64).sum(axis=1)


def before_physics(
    xp: Any, task: Task, bounds: tuple[np.ndarray, np.ndarray], frame: Frame, action: Any, warning: Any
) -> Before:
    """The controls of `action` (n, *action) within `bounds` (low, high); an env whose action is not finite gets
    `finite` False and the controls of a stand-in (zero, clipped), never a NaN: the backend raises for it."""
    low, high = bounds
    finite = xp.isfinite(action).reshape(action.shape[0], -1).all(axis=1)
    keep = finite.reshape((-1,) + (1,) * (action.ndim - 1))
    clipped = xp.clip(xp.where(keep, action, 0.0), low, high)
    return Before(task.control(xp, frame, clipped), clipped, finite, blowup_count(xp, warning))


def after_physics(
    xp: Any,
    task: Task,
    reward_type: str,
    frame: Frame,
    action: Any,
    rows: Any,
    warning: Any,
    blowups: Any,
    steps: Any,
) -> After:
    """The step's results at the new state `frame`; `rows` are the simulations' state rows, `blowups` the counts
    `before_physics` read and `steps` the episodes' steps before this one."""
    numeric, dense, success = task.observe_and_reward(xp, frame, action)
    diverged = (blowup_count(xp, warning) > blowups) | ~xp.isfinite(rows).all(axis=1)
    terminated = task.terminated(xp, frame) | diverged
    steps = steps + 1
    truncated = (steps >= task.config.episode_steps) & ~terminated
    reward = success.astype(xp.float64) if reward_type == "sparse" else xp.where(diverged, 0.0, dense)
    return After(numeric, reward, success, terminated, truncated, diverged, steps)


def before_rows(xp: Any, task: Task, bounds: tuple[np.ndarray, np.ndarray], *arrays: Any) -> Before:
    """`before_physics` of flat arrays (qpos, qvel, sensordata, goal, action, warning): the form a kernel takes."""
    q, v, s, g, action, warning = arrays
    return before_physics(xp, task, bounds, Frame(q, v, s, g), action, warning)


def after_rows(xp: Any, task: Task, reward_type: str, *arrays: Any) -> After:
    """`after_physics` of flat arrays (qpos, qvel, sensordata, goal, action, rows, warning, blowups, steps)."""
    q, v, s, g, *rest = arrays
    return after_physics(xp, task, reward_type, Frame(q, v, s, g), *rest)


class NumpyStep:
    """The step's code as numpy: vectorized calls, nothing to compile (the fallback, and the reference the compiled
    code is checked against). `CompiledStep` (robotrl/envs/compiled.py) swaps its two functions for kernels."""

    def __init__(self, task: Task, reward_type: str) -> None:
        self.task, self.reward_type = task, reward_type
        spec = task.action_spec()
        self.bounds = (spec.low_array(), spec.high_array())
        self._before: Callable[..., Before] = functools.partial(before_rows, np, task, self.bounds)
        self._after: Callable[..., After] = functools.partial(after_rows, np, task, reward_type)
        self._reset: Callable[..., ResetState] = functools.partial(task.reset, np)

    def before(self, frame: Frame, action: np.ndarray, warning: np.ndarray) -> Before:
        return self._before(*frame, action, warning)

    def after(
        self,
        frame: Frame,
        action: np.ndarray,
        rows: np.ndarray,
        warning: np.ndarray,
        blowups: np.ndarray,
        steps: np.ndarray,
    ) -> After:
        return self._after(*frame, action, rows, warning, blowups, steps)

    def observe(self, frame: Frame) -> dict[str, np.ndarray]:
        return self.task.observe(np, frame)

    def reset(self, draws: np.ndarray) -> ResetState:
        """The task's start states for uniform draws (k, reset_dims)."""
        return self._reset(draws)
