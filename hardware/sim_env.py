"""An outside gymnasium env behind the sim robot's interface: its own actions in, its observation and episode
status out, so that `robotrl-sim-robot` and `robotrl-deploy` run a policy trained on a user's env over ROS 2.

An outside env has no arm: its action space is the command interface (the "native action" of its spec). The robot
file of such an env (`robotrl robot init --task <env>`) names one command per action dimension with the action
space's bounds as its limits; the deploy node sends the policy's action through the safety filter (finite, inside
the bounds, nothing on stale observations) as `Float64MultiArray`, and this class applies it:

    sim = SimEnv(SimEnvConfig(task="outside_envs:make_point"), RobotConfig.load("point.yaml"))
    sim.command(action, now)         # whenever a command arrives
    sim.step(now)                    # every control period (1 / sim.control_hz)
    q, dq = sim.joint_state()        # the action being applied (what an actuator's driver echoes back)
    obs = sim.observation()          # the env's observation -> the task-state topic

The env is `robotrl.envs.make(task, num_envs=1, seed=seed)`, the very vector env the in-process evaluation steps:
a reset with a seed is its `reset(seed=...)`, a reset without one is the episode it started by itself when the last
one ended, so the episodes over ROS 2 are the in-process episodes (same starts, same actions: same returns).
Until the first command the env is given the middle of the action bounds (0 on an unbounded axis).

Torch-free and rclpy-free: the ROS 2 node wraps this class.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robotrl.core.spec import Spec, SpecMismatchError
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.sim_robot import TIME_EPS, check_seed, check_time, command_vector


@dataclass
class SimEnvConfig:
    """Which env the sim robot hosts and how it is seeded."""

    task: str
    """an outside env: `gym:<id>` or `<module>:<callable>`, with options after `?`"""
    task_options: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the env (as `robotrl.envs.make` takes them)"""
    seed: int = 0
    """the first episode's seed (as `make(task, 1, seed=seed)`)"""
    command_latency: float = 0.0
    """seconds between receiving a command and applying it"""


class SimEnv:
    """One outside env stepped by its own actions, in the robot file's command order (one per action dimension)."""

    cameras: tuple[str, ...] = ()
    """an outside env's observations travel on the task-state topic; it offers no camera topics"""

    def __init__(self, config: SimEnvConfig, robot: RobotConfig) -> None:
        from robotrl.envs import is_outside, make

        if not is_outside(config.task):
            raise ValueError(
                f"SimEnvConfig.task: expected an outside env (gym:<id> or module:callable), got {config.task!r}"
            )
        check_seed(config.seed, "SimEnvConfig.seed")
        latency = config.command_latency
        if check_time(latency, "SimEnvConfig.command_latency") < 0:
            raise ValueError(f"SimEnvConfig.command_latency: expected a finite number >= 0, got {latency!r}")
        self.config, self.robot = config, robot
        self.env = make(config.task, num_envs=1, seed=int(config.seed), **config.task_options)
        self.spec: Spec = self.env.task_spec
        check_native_robot(self.spec, robot)
        self.control_hz = float(self.spec.control_hz or robot.control_hz)
        self.latency = float(latency)
        self._low, self._high = self.spec.action.low_array(), self.spec.action.high_array()
        self._neutral = self.spec.action.middle()
        self._pending: list[tuple[float, int, np.ndarray]] = []
        self._arrivals = 0
        self._next_obs: dict[str, np.ndarray] | None = None  # the episode the env started when the last one ended
        self.reset()

    # --- episodes ------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """A new episode: `seed`'s, or the next of the seeded stream (the one a vector env auto-resets to).

        Pending commands are dropped; the env is given the middle of its action bounds until the first is due."""
        if seed is not None:
            obs, _ = self.env.reset(seed=check_seed(seed, "seed"))
        elif self._next_obs is not None:
            obs = self._next_obs
        else:  # the first episode (the vector env's constructor seed), or a reset mid-episode: the stream's next
            obs, _ = self.env.reset()
        self._obs = {k: np.asarray(v)[0] for k, v in obs.items()}
        self._next_obs = None
        self._target = self._neutral.copy()
        self._pending.clear()
        self._steps = 0
        self._status: dict[str, Any] = {
            "step": 0,
            "success": False,
            "reward": 0.0,
            "terminated": False,
            "truncated": False,
        }

    # --- the driver's interface -----------------------------------------------------------------------
    def command(self, action: np.ndarray, now: float) -> None:
        """Take an action (robot file order = the action's), to be applied from `now + latency` on."""
        a = command_vector(action, self.robot, "action", "actions")
        heapq.heappush(self._pending, (check_time(now, "now") + self.latency, self._arrivals, a))
        self._arrivals += 1

    def step(self, now: float) -> None:
        """One control period: the env steps once with the latest action due at `now` (clipped to its bounds,
        as the vector env clips it). A finished episode is not stepped: the next one starts with `reset`."""
        now = check_time(now, "now")
        while self._pending and self._pending[0][0] <= now + TIME_EPS:
            self._target = np.clip(heapq.heappop(self._pending)[2], self._low, self._high)
        if self._status["terminated"] or self._status["truncated"]:
            return
        obs, reward, terminated, truncated, info = self.env.step(self._target.astype(self.spec.action.dtype)[None])
        done = bool(terminated[0]) or bool(truncated[0])
        if done:  # the vector env started the next episode already: keep it for `reset`, show the last state
            self._next_obs = {k: np.asarray(v) for k, v in obs.items()}
            obs = info["final_obs"]
        self._obs = {k: np.asarray(v)[0] for k, v in obs.items()}
        self._steps += 1
        self._status = {
            "step": self._steps,
            "success": bool(np.asarray(info["success"])[0]),
            "reward": float(np.asarray(reward)[0]),
            "terminated": bool(terminated[0]),
            "truncated": bool(truncated[0]),
        }

    def joint_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The action being applied (the actuators' setpoints, what their driver echoes back), and zero rates."""
        return self._target.copy(), np.zeros_like(self._target)

    def observation(self) -> dict[str, np.ndarray]:
        """The env's observation after the last step (or reset), as the vector env gives it for one env."""
        return {k: v.copy() for k, v in self._obs.items()}

    def status(self) -> dict[str, Any]:
        """The episode after the last step (or reset): steps taken, success (the env's `success`/`is_success`),
        the env's reward for that step, and whether the env terminated or was truncated."""
        return dict(self._status)

    def close(self) -> None:
        self.env.close()


def check_native_robot(spec: Spec, robot: RobotConfig) -> None:
    """A robot file fits an env's native actions: one command per action dimension, limits inside its bounds."""
    shape = spec.action.shape
    if len(shape) != 1 or shape[0] != robot.dof:
        raise SpecMismatchError(
            f"robot {robot.name}: {spec.task} takes actions of shape {shape}, the robot file names {robot.dof} "
            f"commands {list(robot.joint_names)}; write one for this env with `robotrl robot init --task {spec.task}`"
        )
    low, high = spec.action.low_array(), spec.action.high_array()
    outside = np.nonzero((robot.lower() < low - 1e-9) | (robot.upper() > high + 1e-9))[0]
    if len(outside):
        i = int(outside[0])
        raise SpecMismatchError(
            f"robot {robot.name}: limits of {robot.joint_names[i]!r} [{robot.lower()[i]}, {robot.upper()[i]}] "
            f"exceed {spec.task}'s action bounds [{low[i]}, {high[i]}]"
        )
