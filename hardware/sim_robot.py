"""The MuJoCo sim robot: a robotrl task's model behind the interface a real arm offers through its driver.

A real cell takes joint-position targets (a ros2_control position or trajectory controller) and offers joint
states, camera images and, from perception or motion capture, the task's state. `SimRobot` offers the same,
so the deploy node, the safety filter and a policy can be run end to end against simulation, unchanged:

    sim = SimRobot(SimRobotConfig(task="PushT"), RobotConfig.load("sim_panda"))
    sim.command(q_target, now)         # whenever a command arrives
    sim.step(now)                      # every control period (1 / sim.control_hz)
    q, dq = sim.joint_state()          # -> /joint_states
    obs = sim.observation()            # -> the task-state and image topics
    sim.base_reading()                 # a floating base (Quadruped): -> its IMU and odometry topics

The physics is the vector env's, step for step: a reset draws from the same random stream as
`CpuVectorEnv(task, 1, seed=seed)`, and one `step` is `task.n_substeps` `mj_step`s with the commanded targets
as the position actuators' controls, so the same joint targets give the same trajectory (tests check it to
1e-9). A floating-base robot (its robot file's `base`: Quadruped) also offers its IMU and odometry
readings, takes its velocity command (the task's goal) and has a damping mode, its safe stop. What a real cell
adds -- command latency, joint-encoder noise, and dynamics that are not the nominal
model (`perturbation`: one fixed draw of a domain randomization, the "real twin") -- is opt-in.

Torch-free and rclpy-free: the ROS 2 node wraps this class.
"""

from __future__ import annotations

import copy
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np

from robotrl.envs import make_task
from robotrl.envs.randomization import (
    RANDOMIZATION_DIMS,
    Randomization,
    nominal_fields,
    sample_latency,
    sample_model_fields,
)
from robotrl.envs.task import Frame
from robotrl.hardware.floating_base import BaseReading, BaseSensors, base_joint
from robotrl.hardware.objects import task_objects
from robotrl.hardware.robot import RobotConfig

FULLPHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
#: seconds of slack when comparing a command's due time with the clock (float sums like t + latency)
TIME_EPS = 1e-9


@dataclass
class SimRobotConfig:
    """What the sim robot simulates; the defaults are the nominal PushT cell."""

    task: str = "PushT"
    task_options: dict[str, Any] = field(default_factory=dict)
    """the task's config fields (e.g. {"images": True}), as `robotrl.envs.make` takes them"""
    seed: int = 0
    """seeds the episodes (as `CpuVectorEnv(seed=...)`), the perturbation draw and the noise"""
    perturbation: Randomization | None = None
    """None: nominal dynamics. Otherwise one fixed draw of this randomization, made at construction from `seed`
    and kept for every episode: model scales (friction, mass, damping, actuator gain), a command delay of
    `latency_steps` control periods, a camera offset and light level, and `obs_noise` on the task state"""
    joint_noise: float = 0.0
    """std (rad) of Gaussian noise on the published joint positions (encoder noise; the physics is exact)"""
    command_latency: float = 0.0
    """seconds between receiving a command and applying it (transport and driver delay)"""


class SimRobot:
    """One simulated cell: the task's physics, driven by joint-position targets in the robot's joint order."""

    def __init__(self, config: SimRobotConfig, robot: RobotConfig) -> None:
        self.config = config
        self.robot = robot
        self.task = make_task(config.task, **config.task_options)
        task = self.task
        names = tuple(task.joint_names())
        if tuple(robot.joint_names) != names:
            raise ValueError(
                f"robot.joint_names: robot {robot.name!r} has joints {list(robot.joint_names)}, but task "
                f"{task.name!r} drives {list(names)} (same names, same order); use a robot file for this task's arm"
            )
        check_seed(config.seed, "SimRobotConfig.seed")
        if config.perturbation is not None and not isinstance(config.perturbation, Randomization):
            raise TypeError(
                f"SimRobotConfig.perturbation: expected a Randomization or None, "
                f"got {type(config.perturbation).__name__}"
            )
        for name in ("joint_noise", "command_latency"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"SimRobotConfig.{name}: expected a finite number >= 0, got {value!r}")
        self.model = copy.copy(task.model)  # private: the perturbation edits it, never the task's model
        self.data = mujoco.MjData(self.model)
        m = self.model
        self.control_hz = float(task.control_hz)
        jids = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n) for n in names]
        self._qadr = np.array([m.jnt_qposadr[j] for j in jids], dtype=np.int64)
        self._dadr = np.array([m.jnt_dofadr[j] for j in jids], dtype=np.int64)
        self._act_joint = self._actuated_joints(jids)
        self._action_spec = task.spec().action
        self._zero_action = np.zeros((1, *self._action_spec.shape))
        self._state = np.zeros(mujoco.mj_stateSize(m, FULLPHYSICS))

        perturb_stream, noise_stream = np.random.SeedSequence(config.seed).spawn(2)
        self._noise_rng = np.random.default_rng(noise_stream)
        n_cams = max(len(task.cameras), 1)
        self.perturbation = config.perturbation
        self.latency = float(config.command_latency)
        self._camera_jitter = np.zeros((1, n_cams, 3))
        self._light_scale = np.ones(1)
        self._obs_noise = 0.0
        if self.perturbation is not None:
            p, rng = self.perturbation, np.random.default_rng(perturb_stream)
            u = rng.random((1, RANDOMIZATION_DIMS))
            if p.changes_model:
                for name, values in sample_model_fields(np, p, nominal_fields(m), u).items():
                    getattr(m, name)[:] = values[0]
            self.latency += int(sample_latency(np, p, u[:, 4])[0]) / self.control_hz
            self._camera_jitter = p.camera_pos * (2.0 * rng.random((1, n_cams, 3)) - 1.0)
            self._light_scale = 1.0 + p.light * (2.0 * rng.random(1) - 1.0)
            self._obs_noise = float(p.obs_noise)

        self.base = BaseSensors(m, f"robot {robot.name}: base") if robot.base is not None else None
        if self.base is None and base_joint(m) is not None:
            raise ValueError(
                f"robot.base: task {task.name!r} has a floating base; expected a robot file with a base section "
                f"(fall limits, damping), got robot {robot.name!r} without one"
            )
        self._position_gains = (m.actuator_gainprm.copy(), m.actuator_biasprm.copy())
        self.damping = False
        self.objects = task_objects(task, m)
        self._renderer: Any = None
        self._rng = np.random.default_rng(config.seed)
        self._pending: list[tuple[float, int, np.ndarray]] = []  # heap of (due time, arrival number, target)
        self._arrivals = 0
        self.reset()

    def _actuated_joints(self, jids: list[int]) -> np.ndarray:
        """Per actuator, the index (robot order) of the joint it servoes: a joint target can only become
        ctrl for a position actuator on one of the robot's joints, one actuator per joint."""
        m = self.model
        index = {j: i for i, j in enumerate(jids)}
        out = []
        for a in range(m.nu):
            name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a) or f"#{a}"
            joint = int(m.actuator_trnid[a, 0])
            position = int(m.actuator_biastype[a]) == int(mujoco.mjtBias.mjBIAS_AFFINE) and m.actuator_biasprm[a, 1] < 0
            if int(m.actuator_trntype[a]) != int(mujoco.mjtTrn.mjTRN_JOINT) or joint not in index or not position:
                raise ValueError(
                    f"SimRobot: task {self.task.name!r}: actuator {name!r} is not a position actuator "
                    f"on one of the joints {list(self.robot.joint_names)}; expected one per joint"
                )
            out.append(index[joint])
        if sorted(out) != list(range(len(jids))):
            raise ValueError(
                f"SimRobot: task {self.task.name!r}: expected one position actuator per joint of "
                f"{list(self.robot.joint_names)}, got actuators on joints {out}"
            )
        return np.array(out, dtype=np.int64)

    # --- episodes ------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """A new episode, drawn from the same stream as `CpuVectorEnv(task, 1, seed)`'s resets.

        Pending commands are dropped and the arm holds its start pose until the first command is due.
        """
        if seed is not None:
            self._rng = np.random.default_rng(check_seed(seed, "seed"))
        task, m, d = self.task, self.model, self.data
        start = task.reset(np, self._rng.random((1, task.reset_dims)))
        # the draws the vector env makes per reset (its randomization, camera jitter, light), so the next
        # episode's start is the vector env's next episode's start too; the sim robot's own are fixed
        self._rng.random((1, RANDOMIZATION_DIMS))
        self._rng.random(self._camera_jitter.shape)
        self._rng.random(1)
        self._state[:] = 0.0
        self._state[1 : 1 + m.nq] = start.qpos[0]
        self._state[1 + m.nq : 1 + m.nq + m.nv] = start.qvel[0]
        mujoco.mj_setState(m, d, self._state, FULLPHYSICS)
        d.qacc_warmstart[:] = 0.0  # a new episode starts the solver cold, as the vector env's reset does
        self._goal = np.array(start.goal[0], dtype=np.float64)
        mocap = task.mocap(np, self._goal[None])
        self._mocap = None if mocap is None else (np.asarray(mocap[0]), np.asarray(mocap[1]))
        if self._mocap is not None and m.nmocap:
            d.mocap_pos[:] = self._mocap[0][0]
            d.mocap_quat[:] = self._mocap[1][0]
        mujoco.mj_forward(m, d)  # sensors of the start state
        self._target = d.qpos[self._qadr].copy()
        self._pending.clear()
        self._steps = 0
        self.damp(False)
        self._evaluate()

    # --- the driver's interface -----------------------------------------------------------------------
    def command(self, q_target: np.ndarray, now: float) -> None:
        """Take a joint-position target (robot joint order), to be applied from `now + latency` on."""
        q = command_vector(q_target, self.robot, "q_target", "joint positions")
        now = check_time(now, "now")
        heapq.heappush(self._pending, (now + self.latency, self._arrivals, q))
        self._arrivals += 1

    def follow(self, points: list[tuple[float, np.ndarray]], now: float) -> None:
        """A joint trajectory [(time_from_start, q), ...] taken as a JointTrajectoryController takes it: what is
        left of the previous one is replaced, and each point is the target of the control period that ends at
        its time (from `now + latency`), so a point on the control grid is reached as the period it names ends and
        the sim goes on along the points if no new trajectory comes."""
        now = check_time(now, "now")
        period = 1.0 / self.control_hz
        self._pending = [entry for entry in self._pending if entry[0] <= now + TIME_EPS]
        heapq.heapify(self._pending)
        for at, q in points:
            target = command_vector(q, self.robot, "trajectory point", "joint positions")
            due = now + self.latency + max(float(at) - period, 0.0)
            heapq.heappush(self._pending, (due, self._arrivals, target))
            self._arrivals += 1

    def step(self, now: float) -> None:
        """One control period of physics, servoing to the latest command due at `now`."""
        now = check_time(now, "now")
        while self._pending and self._pending[0][0] <= now + TIME_EPS:
            self._target = heapq.heappop(self._pending)[2]
        m, d = self.model, self.data
        d.ctrl[:] = self._target[self._act_joint]
        for _ in range(self.task.n_substeps):
            mujoco.mj_step(m, d)
        self._steps += 1
        self._evaluate()

    def damp(self, on: bool) -> None:
        """A floating base's safe stop: every motor without position gain, with the robot file's `base.damping`
        of velocity gain (a legged driver's damping mode; the robot folds down gently); off: position control."""
        if on == self.damping:
            return
        gain, bias = (x.copy() for x in self._position_gains)
        if on:
            if self.robot.base is None:
                raise ValueError(f"SimRobot.damp: robot {self.robot.name!r} has no floating base to damp")
            gain[:, 0], bias[:, 1], bias[:, 2] = 0.0, 0.0, -self.robot.base.damping
        self.model.actuator_gainprm[:], self.model.actuator_biasprm[:] = gain, bias
        self.damping = on

    def base_reading(self) -> BaseReading:
        """A floating base's IMU and odometry readings (its sensors' values; exact: no noise)."""
        if self.base is None:
            raise ValueError(f"SimRobot.base_reading: robot {self.robot.name!r} has no floating base")
        return self.base.read(self.data.qpos, self.data.sensordata)

    def object_poses(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each object's world pose (position, quaternion w first) as perception or motion capture would see it
        (exact: no noise), by the task model's body name (`hardware/objects.py`)."""
        return self.objects.poses(self.data.qpos)

    def goal_pose(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the episode's goal is shown (its mocap target), for a task whose goal is a pose; else None."""
        mocap = self.task.mocap(np, self._goal[None])
        if mocap is None or not self.task.goal_is_pose:
            return None
        return np.asarray(mocap[0])[0, 0], np.asarray(mocap[1])[0, 0]

    @property
    def goal(self) -> np.ndarray:
        """The episode's goal (Quadruped: its velocity command), drawn at reset."""
        return self._goal.copy()

    def set_goal(self, goal: Any) -> None:
        """A goal from outside (Quadruped: the velocity command on /cmd_vel), from the next step on."""
        n = self._goal.shape[0]
        try:
            value = np.array(goal, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            value = np.zeros(0)
        if value.shape != (n,) or not np.isfinite(value).all():
            raise ValueError(f"SimRobot.set_goal: expected {n} finite numbers, got {goal!r}")
        self._goal = value

    @property
    def cameras(self) -> tuple[str, ...]:
        """The task's cameras, each published as an image topic."""
        return tuple(self.task.cameras)

    def joint_state(self) -> tuple[np.ndarray, np.ndarray]:
        """Positions (with `joint_noise`) and velocities of the robot's joints, in its joint order."""
        q = self.data.qpos[self._qadr].copy()
        if self.config.joint_noise > 0:
            q += self.config.joint_noise * self._noise_rng.standard_normal(q.shape)
        return q, self.data.qvel[self._dadr].copy()

    def observation(self) -> dict[str, np.ndarray]:
        """The task's observation of this cell, as `CpuVectorEnv` gives it for one env (without the env axis)."""
        obs = {k: np.asarray(v)[0] for k, v in self.task.observe(np, self.frame()).items()}
        if self._obs_noise > 0:
            for key, value in obs.items():
                if value.dtype.kind == "f":
                    noise = self._obs_noise * self._noise_rng.standard_normal(value.shape)
                    obs[key] = (value + noise).astype(value.dtype)
        if self.task.cameras:
            images = self._render()
            for cam in self.task.cameras:
                obs[f"image_{cam}"] = images[cam][0]
        instructions = self.task.instruction(self._goal[None])
        if instructions is not None:
            obs["instruction"] = np.array(instructions[0], dtype=object)
        return obs

    def status(self) -> dict[str, Any]:
        """The episode after the last step (or reset): control steps taken, success, dense reward, and whether
        the episode is over (the task's termination, a diverged simulation, or the time limit).

        The reward is the task's for a zero action: the sim robot sees joint targets, not task actions (of the
        suite's tasks, only Quadruped's torque penalty reads the action)."""
        return dict(self._status)

    def arm_targets(self, action: np.ndarray) -> np.ndarray:
        """Joint targets (robot order) for a task action from the current state: the task's own `control`.

        What a policy trained on the task's action space (e.g. PushT's end-effector deltas) must be turned
        into before it can command this robot, or a real one. The action is clipped to its bounds, as the
        vector env clips it.
        """
        spec = self._action_spec
        try:
            arr = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"action: expected {spec.shape} numbers, got {action!r}") from e
        if arr.shape != spec.shape:
            raise ValueError(
                f"action: expected shape {spec.shape} (task {self.task.name!r}, action mode "
                f"{self.task.config.action_mode!r}), got {arr.shape}"
            )
        if not np.isfinite(arr).all():
            raise ValueError(f"action: expected finite values, got {arr.tolist()}")
        arr = np.clip(arr, spec.low_array(), spec.high_array()).astype(np.float64)
        ctrl = np.asarray(self.task.control(np, self.frame(), arr[None]))[0]
        targets = np.empty(len(self._act_joint))
        targets[self._act_joint] = ctrl
        return targets

    def frame(self) -> Frame:
        """The current state as the task's pure functions read it (a batch of one)."""
        d = self.data
        return Frame(d.qpos[None].copy(), d.qvel[None].copy(), d.sensordata[None].copy(), self._goal[None].copy())

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # --- internals ----------------------------------------------------------------------------------
    def _evaluate(self) -> None:
        frame = self.frame()
        dense, success = self.task.reward(np, frame, self._zero_action)
        mujoco.mj_getState(self.model, self.data, self._state, FULLPHYSICS)
        diverged = not bool(np.isfinite(self._state).all())
        terminated = bool(np.asarray(self.task.terminated(np, frame))[0]) or diverged
        self._status = {
            "step": self._steps,
            "success": bool(np.asarray(success)[0]),
            "reward": 0.0 if diverged else float(np.asarray(dense)[0]),
            "terminated": terminated,
            "truncated": self._steps >= self.task.config.episode_steps and not terminated,
        }

    def _render(self) -> dict[str, np.ndarray]:
        if self._renderer is None:
            from robotrl.envs.render import BatchRenderer

            # the nominal model draws: a perturbation changes physics, not looks (as in the vector env)
            self._renderer = BatchRenderer(self.task.model, self.task.config.image_size)
        mujoco.mj_getState(self.model, self.data, self._state, FULLPHYSICS)
        return self._renderer.render(
            states=self._state[None],
            mocap=self._mocap,
            cameras=self.task.cameras,
            camera_jitter=self._camera_jitter,
            light_scale=self._light_scale,
        )


def command_vector(values: Any, robot: RobotConfig, what: str, noun: str) -> np.ndarray:
    """A command for `robot` (one finite number per name of its file, in its order) as float64, or a ValueError
    naming `what`, the expected and the actual value."""
    n, names = robot.dof, list(robot.joint_names)
    try:
        q = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: expected {n} {noun} {names}, got {values!r}") from e
    if q.shape != (n,):
        raise ValueError(f"{what}: expected shape ({n},), one of the {noun} {names} each, got {q.shape}")
    bad = [names[i] for i in np.nonzero(~np.isfinite(q))[0]]
    if bad:
        raise ValueError(f"{what}: expected finite {noun}, got NaN/inf for {bad}")
    return q


def check_time(now: Any, what: str) -> float:
    if isinstance(now, bool) or not isinstance(now, (int, float, np.floating, np.integer)) or not math.isfinite(now):
        raise ValueError(f"{what}: expected a finite time in seconds, got {now!r}")
    return float(now)


def check_seed(seed: Any, what: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{what}: expected an integer >= 0, got {seed!r}")
    return int(seed)
