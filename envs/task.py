"""The task interface shared by both simulation backends.

A task is an MJCF model plus a handful of pure, batched functions written against an array namespace `xp`
(numpy on the CPU backend, jax.numpy on MJX). Reset, control, observation, reward and termination are
therefore one piece of code for both backends; the backends only differ in how they step the physics.

Every function receives a leading env dimension `n`. Randomness enters only as uniform draws `u` that the
backend makes (numpy Generator or jax.random), so a task is deterministic given its draws.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import mujoco
import numpy as np

from robotrl.core.spec import ArraySpec, Spec
from robotrl.envs.randomization import Randomization

if TYPE_CHECKING:
    from robotrl.envs.rollouts import EpisodeStats


def state_layout(*fields: tuple[str, int]) -> tuple[dict[str, tuple[int, int]], int]:
    """Name -> (start, stop) of consecutive fields of a flat "state" vector, and its total size.

    Tasks concatenate their observation in this order; experts and tests then read fields by name.
    """
    layout: dict[str, tuple[int, int]] = {}
    offset = 0
    for name, size in fields:
        layout[name] = (offset, offset + size)
        offset += size
    return layout, offset


def state_spec(layout: dict[str, tuple[int, int]]) -> ArraySpec:
    """The float32 "state" observation spec of a layout, with its named fields."""
    fields = tuple((name, b - a) for name, (a, b) in layout.items())
    return ArraySpec((sum(k for _, k in fields),), "float32", fields=fields)


def split_state(state: Any, layout: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The named fields (n, size) of batched state vectors (n, dim)."""
    return {name: state[:, a:b] for name, (a, b) in layout.items()}


class Frame(NamedTuple):
    """What a task may read of the simulation after a control step (all batched over envs)."""

    qpos: Any  # (n, nq)
    qvel: Any  # (n, nv)
    sensordata: Any  # (n, nsensordata)
    goal: Any  # (n, goal_dim) task variables drawn at reset (target, command, object id, ...)


class ResetState(NamedTuple):
    qpos: Any  # (n, nq)
    qvel: Any  # (n, nv)
    goal: Any  # (n, goal_dim)


@dataclass
class TaskConfig:
    """Options every task has. Subclasses add their own fields; the dataclass is also the CLI."""

    action_mode: str = "ee_delta"
    episode_steps: int = 100
    image_size: int = 64


class Task(abc.ABC):
    """One robot task, defined once for both backends."""

    name: ClassVar[str]
    config_cls: ClassVar[type[TaskConfig]] = TaskConfig
    action_modes: ClassVar[tuple[str, ...]] = ("ee_delta", "joint_pos")
    control_hz: ClassVar[float] = 20.0
    #: names of MJCF cameras whose RGB images are observations (`image_<camera>` keys); CPU backend only
    cameras: tuple[str, ...] = ()  # a task may set its own per config (PushT, Reach)
    #: how many uniform draws per env `reset` consumes
    reset_dims: ClassVar[int] = 0
    goal_dim: ClassVar[int] = 0
    #: expert noise at which it stands in for a human demonstrator (imperfect, still mostly successful)
    demo_noise: ClassVar[float] = 1.0
    #: which teleop command axis ("x", "y", "z", "roll", "pitch", "yaw", "gripper") drives each element of the
    #: ee_delta action, in action order (`robotrl.datasets.teleop`); None: a twist cannot drive this task
    teleop_axes: ClassVar[tuple[str, ...] | None] = None
    #: the goal is a base velocity command (vx, vy, yaw rate): a robot takes it as a geometry_msgs/Twist on /cmd_vel
    twist_goal: ClassVar[bool] = False

    def __init__(self, config: TaskConfig | None = None) -> None:
        self.config = config if config is not None else self.config_cls()
        if not isinstance(self.config, self.config_cls):
            raise TypeError(
                f"{self.name}: expected config of type {self.config_cls.__name__}, got {type(self.config).__name__}"
            )
        if self.config.action_mode not in self.action_modes:
            raise ValueError(
                f"{self.name}: action_mode must be one of {self.action_modes}, got {self.config.action_mode!r}"
            )
        if self.config.episode_steps <= 0:
            raise ValueError(f"{self.name}: episode_steps must be positive, got {self.config.episode_steps}")
        self.model = self.compile()
        self.n_substeps = max(1, round(1.0 / (self.control_hz * self.model.opt.timestep)))
        self._sensor_slices = {
            mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_SENSOR, i): slice(
                int(self.model.sensor_adr[i]), int(self.model.sensor_adr[i] + self.model.sensor_dim[i])
            )
            for i in range(self.model.nsensor)
        }

    @classmethod
    def with_options(cls, **overrides: Any) -> Task:
        return cls(dataclasses.replace(cls.config_cls(), **overrides))

    # --- the model ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def mjcf(self) -> str:
        """The task's MJCF (primitive geoms only, so MJX can run it)."""

    def compile(self) -> mujoco.MjModel:
        """The task's compiled model: its MJCF, or a scene composed from it (robotrl/envs/tasks/arm.py)."""
        return mujoco.MjModel.from_xml_string(self.mjcf())

    def sensor(self, frame: Frame, name: str) -> Any:
        return frame.sensordata[:, self._sensor_slices[name]]

    # --- pure batched functions (xp = numpy or jax.numpy) -------------------------------------------
    @abc.abstractmethod
    def reset(self, xp: Any, u: Any) -> ResetState:
        """Initial state from uniform draws `u` (n, reset_dims)."""

    def mocap(self, xp: Any, goal: Any) -> tuple[Any, Any] | None:
        """Mocap body poses (n, nmocap, 3), (n, nmocap, 4) that show the goal; None if the model has none."""
        return None

    @abc.abstractmethod
    def control(self, xp: Any, frame: Frame, action: Any) -> Any:
        """Actuator controls (n, nu) for a (clipped) action (n, action_dim)."""

    @abc.abstractmethod
    def observe(self, xp: Any, frame: Frame) -> dict[str, Any]:
        """Numeric observations (images and instruction are added by the backend)."""

    @abc.abstractmethod
    def reward(self, xp: Any, frame: Frame, action: Any) -> tuple[Any, Any]:
        """(dense reward (n,), success (n,) bool); the sparse reward is `success` as a float."""

    def observe_and_reward(self, xp: Any, frame: Frame, action: Any) -> tuple[dict[str, Any], Any, Any]:
        """`observe` and `reward` of one frame together, as a backend's step needs both; a task whose two share work
        (PushT's coverage) overrides it to do that work once."""
        dense, success = self.reward(xp, frame, action)
        return self.observe(xp, frame), dense, success

    def terminated(self, xp: Any, frame: Frame) -> Any:
        """Episode ends before the time limit (a fall, an object off the table). Default: never."""
        return xp.zeros(frame.qpos.shape[0], dtype=bool)

    # --- host-side ----------------------------------------------------------------------------------
    def instruction(self, goal: np.ndarray) -> list[str] | None:
        """Language instruction per env, or None for tasks without one."""
        return None

    @property
    def has_instructions(self) -> bool:
        """Whether the task says its goal in words (`instruction`)."""
        return self.instruction(np.zeros((1, max(self.goal_dim, 1)))) is not None

    @property
    def goal_is_pose(self) -> bool:
        """Whether the task's goal is a pose (`goal_from_pose`), which a robot takes as a PoseStamped."""
        return self.goal_from_pose(np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0])) is not None

    def goal_from_pose(self, position: np.ndarray, orientation: np.ndarray) -> np.ndarray | None:
        """The goal (goal_dim,) that a world pose (position (3,), unit quaternion (4,) w first) stands for -- the pose
        `mocap` shows the goal at, as a planner or RViz's goal tool sends it (geometry_msgs/PoseStamped); None for
        a task whose goal is not a pose."""
        return None

    def goal_from_instruction(self, text: str) -> np.ndarray | None:
        """The goal (goal_dim,) an `instruction` names; None for a task whose goal no instruction names. A text
        that names no goal is a ValueError saying which texts would."""
        return None

    def wrong_object(self, obs: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Per env (n,) bool: an object other than the instructed one is where the instruction wants it, read from
        the observation. For tasks that pick one of several objects (the wrong-object rate of a language-
        conditioned policy); None for tasks with one object."""
        return None

    def default_randomization(self) -> Randomization:
        """The task's sim-to-real randomization (`make(..., randomization="task")`); tasks tune the ranges."""
        return Randomization.sim2real()

    def expert(self, noise: float = 0.0, seed: int | None = None) -> Expert:
        raise NotImplementedError(f"{self.name} has no scripted expert")

    def measures(self, stats: EpisodeStats) -> dict[str, float] | None:
        """The task's own measures of an evaluation's episodes, where an episode's success says little (a legged
        task: the share of steps tracking the command, the fall rate); None where success says it."""
        return None

    @abc.abstractmethod
    def action_spec(self) -> ArraySpec:
        """Action shape and bounds for the configured action mode."""

    @abc.abstractmethod
    def state_obs_specs(self) -> dict[str, ArraySpec]:
        """Specs of the keys `observe` returns."""

    def joint_names(self) -> tuple[str, ...]:
        """Actuated hinge/slide joints in model order: the joints a robot driver reports."""
        actuated = {int(j) for j in self.model.actuator_trnid[:, 0]}
        kinds = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
        return tuple(
            mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_JOINT, i)
            for i in range(self.model.njnt)
            if int(self.model.jnt_type[i]) in kinds and i in actuated
        )

    def spec(self) -> Spec:
        obs = dict(self.state_obs_specs())
        s = self.config.image_size
        for cam in self.cameras:
            obs[f"image_{cam}"] = ArraySpec((s, s, 3), "uint8", 0, 255)
        if self.has_instructions:
            obs["instruction"] = ArraySpec((), "str")
        names = self.joint_names()
        limits = []
        for name in names:
            jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
            limits.append(tuple(self.model.jnt_range[jid]))
        return Spec(
            task=self.name,
            observations=obs,
            action=self.action_spec(),
            action_mode=self.config.action_mode,
            control_hz=self.control_hz,
            joint_names=names,
            joint_limits=tuple(limits),
            episode_steps=self.config.episode_steps,
            # the options the data was made with, so an evaluation rebuilds the very same env (never compared)
            metadata={"task_options": json.loads(json.dumps(dataclasses.asdict(self.config), default=float))},
        )


class Expert(abc.ABC):
    """A scripted policy over a batch of envs; `noise` makes it act like an imperfect human teleoperator."""

    def __init__(self, task: Task, noise: float = 0.0, seed: int | None = None) -> None:
        self.task = task
        self.noise = float(noise)
        self.rng = np.random.default_rng(seed)

    def reset(self, num_envs: int) -> None:
        """Called by the caller at the start of a batch of episodes (optional state)."""

    def reset_env(self, index: int) -> None:
        """Called when env `index` starts a new episode (auto-reset)."""

    @abc.abstractmethod
    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Actions (n, action_dim) for a batch of observations."""


class TeleopNoise:
    """Noise that makes a scripted expert look like a human at a teleop device.

    Humans drift (temporally correlated error, an Ornstein-Uhlenbeck process), jitter (white noise) and
    hesitate (hold still for a few steps). All three scale with `noise`; `noise=0` leaves actions untouched.
    """

    def __init__(self, noise: float, action_dim: int, rng: np.random.Generator, theta: float = 0.15) -> None:
        self.noise, self.theta, self.rng = noise, theta, rng
        self.action_dim = action_dim
        self.drift = np.zeros((0, action_dim))
        self.pause = np.zeros(0, dtype=np.int64)

    def reset(self, num_envs: int) -> None:
        self.drift = np.zeros((num_envs, self.action_dim))
        self.pause = np.zeros(num_envs, dtype=np.int64)

    def reset_env(self, index: int) -> None:
        self.drift[index] = 0.0
        self.pause[index] = 0

    def __call__(self, action: np.ndarray) -> np.ndarray:
        if self.noise <= 0.0:
            return action
        n = action.shape[0]
        if self.drift.shape[0] != n:
            self.reset(n)
        self.drift += -self.theta * self.drift + 0.5 * self.noise * self.rng.standard_normal(self.drift.shape)
        jitter = 0.3 * self.noise * self.rng.standard_normal(action.shape)
        start = (self.pause == 0) & (self.rng.random(n) < 0.05 * self.noise)
        self.pause[start] = self.rng.integers(2, 6, size=int(start.sum()))
        out = action + self.drift + jitter
        out[self.pause > 0] = 0.0
        self.pause = np.maximum(self.pause - 1, 0)
        return out
