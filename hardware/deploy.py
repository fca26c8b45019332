"""`robotrl-deploy`: an exported policy on a robot over ROS 2, behind the safety filter.

    robotrl-deploy --ros-args -p policy:=runs/pusht-student/onnx -p robot:=sim_panda
    ros2 launch launch/deploy.launch.py policy:=... robot:=franka_fr3      # the same node, from a launch file

The launch files and their parameter files are installed with robotrl (`robotrl.hardware.nodes.launch_dir()`:
deploy.launch.py, params/deploy.yaml), so a wheel's install starts the node as the launch file does:
`robotrl-deploy --ros-args --params-file <launch_dir>/params/deploy.yaml -p policy:=...` (`NODES["deploy"]`).

Subscribes to the robot's joint states, the task state (objects' poses from a simulator, perception or motion
capture), its cameras and an instruction; every control period (or, with `trigger:=observation`, once per new set of
observations: lockstep with a simulator) it feeds the newest observations to the chunk executor, turns the action
into joint targets with the task's own controller (an outside env's action is the command itself,
`hardware/sim_env.py`) and publishes what the safety filter lets through, as a JointTrajectory or a
Float64MultiArray per the robot's file. The policy runs through `robotrl.policies.runtime` (onnxruntime; no training
code). Malformed messages are counted and logged, never a crash. The e-stop (a `std_msgs/Bool` topic or the
`~/estop` service) latches; `~/reset` re-arms it and starts a new episode (history and chunks cleared); it refuses,
saying which, while a robot topic is not matched yet (and, with `trigger:=observation`, until a whole observation
set has arrived).
Diagnostics (`diagnostic_msgs`) carry the safety state, its counters, malformed-message counts and inference times.

It is a managed (lifecycle) node: configure loads and warms up the policy and connects to the robot, activate
commands, deactivate brakes the commanded motion to rest and commands nothing more, cleanup lets the robot go. By
default it configures and activates itself at start-up; with `autostart:=false` a lifecycle manager drives it
(`ros2 lifecycle set /robotrl_deploy configure`, then `activate`).

A legged robot (a robot file with a `base`: `robot:=sim_quadruped`) has no task-state topic: the policy's observation
is made from its joint states, IMU, odometry and the velocity command on /cmd_vel (`hardware/robot_node.py`), a fall
or an overspeed e-stops it, and its e-stop is the driver's damping mode, published on the damping topic.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn
from std_msgs.msg import Bool, Float64MultiArray
from std_srvs.srv import Trigger

from robotrl.hardware.execution import ChunkExecutor, ExecutionConfig, resample_chunk
from robotrl.hardware.messages import float_array_to_msg
from robotrl.hardware.realtime import make_realtime
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.robot_node import INTERVENTION_TOPIC, POLICY_ACTION_TOPIC, RobotNode
from robotrl.hardware.ros import declare_config, spin_node
from robotrl.hardware.safety import SafetyState

TRIGGERS = ("timer", "observation")


@dataclass
class DeployConfig:
    policy: str = ""
    """exported policy directory (`robotrl policy export`)"""
    robot: str = "sim_panda"
    """a bundled robot (hardware/robots/<name>.yaml) or a path to a robot file"""
    execute: int = 0
    """receding horizon: actions executed per chunk; 0: the policy's own (the `execute` its export recorded: what
    it was chosen at in simulation), else 8"""
    ensemble_decay: float = -1.0
    """>= 0: temporal ensembling with this decay (ACT: 0.01); < 0: receding horizon"""
    asynchronous: bool = False
    """inference in a worker thread, chunks aligned with the state they start from (slow policies)"""
    delay_steps: int = 1
    """asynchronous: control periods an inference is expected to take"""
    trigger: str = "timer"
    """'timer' (a command every control period) or 'observation' (one per new joint state + observation set, the
    safety filter's clock advancing one control period each: lockstep with a simulator; a language-conditioned
    policy's set includes the instruction, which the sim robot sends with every step)"""
    instruction: str = ""
    """the instruction until one arrives on the instruction topic (language-conditioned policies)"""
    threads: int = 1
    """onnxruntime threads"""
    seed: int = 0
    """the policy's sampling noise"""
    wait_for_reset: bool = False
    """publish nothing until the first ~/reset, which also restarts the noise stream at `seed` (an episode
    runner comparing with the in-process evaluation); False: act as soon as observations arrive"""
    diagnostics_hz: float = 1.0
    hil: bool = True
    """human in the loop: publish each executed task action on /robotrl/policy_action, and yield (publish no
    command) while /robotrl/intervention says the operator drives (robotrl-teleop with policy_topic)"""
    realtime_priority: int = 0
    """SCHED_FIFO priority (1-99) of the node's threads, with its memory locked (`hardware/realtime.py`); 0: the
    default scheduler. Needs an rtprio limit or CAP_SYS_NICE, else it warns. The launch file's parameters ask for
    50, ros2_control's default; 0 here, so that a process embedding the node keeps its own scheduling"""
    heartbeat: str = ""
    """a dead-man topic (std_msgs/Bool): the policy drives only while a True has arrived on it within
    `heartbeat_timeout` (an operator's enabling switch, a supervisor's watchdog); its silence, or a False, holds
    the robot as stale observations do. '' = none"""
    heartbeat_timeout: float = 0.2
    """seconds a True on `heartbeat` keeps the policy driving"""
    autostart: bool = True
    """configure and activate at start-up; False: wait for a lifecycle manager's transitions
    (`ros2 lifecycle set /robotrl_deploy configure`, then `activate`)"""

    def __post_init__(self) -> None:
        if not self.policy:
            raise ValueError("DeployConfig.policy: expected an exported policy directory, got ''")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"DeployConfig.trigger: expected one of {TRIGGERS}, got {self.trigger!r}")
        if self.execute < 0:
            raise ValueError(
                f"DeployConfig.execute: expected >= 1 actions per chunk, or 0 (the policy's), got {self.execute}"
            )
        if not self.heartbeat_timeout > 0:
            raise ValueError(f"DeployConfig.heartbeat_timeout: expected > 0 s, got {self.heartbeat_timeout}")
        if not 0 <= self.realtime_priority <= 99:
            raise ValueError(
                f"DeployConfig.realtime_priority: expected 0 (off) or a SCHED_FIFO priority in 1..99, "
                f"got {self.realtime_priority}"
            )


class DeployNode(LifecycleNodeMixin, RobotNode):
    """A managed (lifecycle) node: configure loads the policy, warms it up and connects to the robot; activate
    commands the robot; deactivate brings the commanded motion to rest and then leaves the robot to its driver;
    cleanup lets go of the robot and the policy. `autostart` runs configure and activate at start-up."""

    def __init__(self, config: DeployConfig | None = None) -> None:
        RobotNode.__init__(self, "robotrl_deploy")
        LifecycleNodeMixin.__init__(self)
        self.config = config or declare_config(self, DeployConfig)
        self.active, self.configured = False, False
        self.configure_error: Exception | None = None
        self.made: dict[str, set[Any]] = {}
        if self.config.autostart:
            self.trigger_configure()
            if self.configure_error is not None:
                raise self.configure_error  # one line at start-up, as the node always refused a bad setting
            self.trigger_activate()

    # --- the lifecycle ------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        before = self.entities()
        try:
            self.configure()
        except (ValueError, OSError) as e:  # refused: back to unconfigured, saying why in one line
            self.configure_error = e
            self.get_logger().error(f"configure: {e}")
            self.destroy(self.made_since(before))
            return TransitionCallbackReturn.FAILURE
        self.configure_error, self.configured = None, True
        self.made = self.made_since(before)
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.runner.reset()
        self.safety.restart()  # from the measured pose, at rest
        self.active = True
        self.get_logger().info("active: commanding the robot")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.active = False
        self.get_logger().info("inactive: the commanded motion brakes to rest, then nothing more is commanded")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.close()
        self.destroy(self.made)
        self.made, self.configured = {}, False
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.active = False
        return TransitionCallbackReturn.SUCCESS

    def resampled(self, ratio: float, execute: int) -> tuple[Any, int, int]:
        """The policy's act, the actions executed per chunk and the frame stride at the robot's rate: as they are at
        the policy's own rate; otherwise (the robot file allows resample_chunks) every chunk resampled in time to the
        robot's rate, `ratio` times as many actions executed, and the observation frames as far apart as in
        training (a robot an integer multiple faster, where the policy sees more than one frame)."""
        if math.isclose(ratio, 1.0, rel_tol=1e-9):
            return self.policy.act, execute, 1
        deltas = self.io.delta_dims()
        stride = round(ratio)
        if deltas is None or (self.policy.obs_horizon > 1 and not (ratio >= 1 and math.isclose(ratio, stride))):
            raise ValueError(
                f"DeployConfig.robot: resample_chunks: a {self.policy.spec.task} policy "
                f"(obs_horizon {self.policy.obs_horizon}) at {ratio:g}x its rate cannot be resampled; expected a "
                "robotrl task's policy, and a robot an integer multiple faster for more than one observation frame"
            )
        act = self.policy.act

        def resampled_act(window: dict[str, Any]) -> np.ndarray:
            chunks = np.asarray(act(window))
            return np.stack([resample_chunk(chunk, ratio, deltas) for chunk in chunks])

        self.get_logger().info(f"resampling chunks: the policy's {1 / ratio:g}x rate to the robot's")
        return resampled_act, max(1, round(execute * ratio)), stride if self.policy.obs_horizon > 1 else 1

    def entities(self) -> dict[str, set[Any]]:
        return {
            "subscription": set(self.subscriptions),
            "publisher": set(self.publishers),
            "timer": set(self.timers),
            "service": set(self.services),
        }

    def made_since(self, before: dict[str, set[Any]]) -> dict[str, set[Any]]:
        """The entities made since `before` (an `entities()`), by kind."""
        return {kind: now - before[kind] for kind, now in self.entities().items()}

    def destroy(self, entities: dict[str, set[Any]]) -> None:
        for kind, made in entities.items():
            for entity in made:
                getattr(self, f"destroy_{kind}")(entity)

    def configure(self) -> None:
        from robotrl.policies import runtime

        cfg = self.config
        self.policy = runtime.load(cfg.policy, seed=cfg.seed, threads=cfg.threads)
        warmup = self.policy.warmup()  # the language encoder loads now, not at the first control step
        robot = RobotConfig.load(cfg.robot)
        trained = float(self.policy.spec.control_hz)
        ratio = robot.control_hz / trained
        if not math.isclose(ratio, 1.0, rel_tol=1e-9) and not robot.resample_chunks:
            raise ValueError(
                f"DeployConfig.robot: robot {robot.name} runs at {robot.control_hz:g} Hz, the policy was trained at "
                f"{trained:g} Hz (each of its actions is one period of that rate: at {robot.control_hz:g} Hz its "
                f"motions would run {ratio:g}x as fast); deploy it with a robot file at {trained:g} Hz, or one "
                "that allows resample_chunks"
            )
        self.connect_robot(robot, self.policy.spec, self.policy.obs_keys, cfg.instruction)
        act, execute, stride = self.resampled(ratio, cfg.execute or self.policy.execute)
        execution = ExecutionConfig(
            execute,
            cfg.ensemble_decay if cfg.ensemble_decay >= 0 else None,
            cfg.asynchronous,
            cfg.delay_steps,
            stride,
        )
        self.runner = ChunkExecutor(
            act,
            self.policy.obs_keys,
            self.policy.obs_horizon,
            execution,
            roll_forward=self.io.roll_forward,
            text_keys=self.text_keys,
        )
        self.fresh: set[str] = set()  # keys updated since the last command (trigger=observation)
        self.heard_set = False  # a whole observation set has arrived (trigger=observation)
        self.inference_ms: list[float] = []
        self.ticks = 0
        self.started = not cfg.wait_for_reset
        self.operator: tuple[bool, float] = (False, -np.inf)  # (drives, when it said so)
        self.yielded = False
        if cfg.hil:
            self.action_pub = self.create_publisher(Float64MultiArray, POLICY_ACTION_TOPIC, 10)
            self.create_subscription(
                Bool, INTERVENTION_TOPIC, lambda m: setattr(self, "operator", (bool(m.data), time.monotonic())), 10
            )
        self.heartbeat_at = -np.inf  # when the dead-man topic last said True
        if cfg.heartbeat:
            self.create_subscription(Bool, cfg.heartbeat, self._on_heartbeat, 10)
        topics = self.robot.topics
        self.create_service(Trigger, "~/estop", self._srv_estop)
        self.create_service(Trigger, "~/reset", self._srv_reset)
        self.diag_pub = self.create_publisher(DiagnosticArray, topics.diagnostics, 10)
        if cfg.trigger == "timer":
            self.create_timer(1.0 / self.robot.control_hz, self.tick)
        self.create_timer(1.0 / cfg.diagnostics_hz, self._publish_diagnostics)
        self.get_logger().info(
            f"deploying {self.policy!r} on {self.robot.name} ({self.robot.command_type} on "
            f"{topics.command}, {self.robot.control_hz:g} Hz, trigger {cfg.trigger}; warm-up "
            f"{warmup:.2f} s)"
        )
        for problem in make_realtime(cfg.realtime_priority):  # last: the node's threads all exist now
            self.get_logger().warning(problem)

    # --- inputs -------------------------------------------------------------------------------------
    def on_joint_state(self, q: np.ndarray, stamp: float) -> None:
        if self.config.trigger == "timer":  # lockstep: the safety filter gets it on the step's own clock (tick)
            self.safety.observe(q, stamp, self.dq)

    def on_input(self, key: str) -> None:
        if self.config.trigger == "observation":
            self.fresh.add(key)
            if self.awaited() <= self.fresh:
                self.fresh.clear()
                self.heard_set = True
                self.tick()

    def _srv_estop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.safety.estop("~/estop service")
        self.get_logger().error("E-STOP from the ~/estop service: no commands until ~/reset")
        self.publish_damping()
        response.success, response.message = True, "e-stopped"
        return response

    def _srv_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        """A new episode: the executor starts over; an e-stop is re-armed if the joint states are fresh. Refused
        while a robot topic is unmatched (the caller retries): the episode's first observation would go unheard;
        in lockstep also until the robot's waiting observation set has been heard."""
        if missing := self.unconnected():
            response.success, response.message = False, "not connected to the robot: " + "; ".join(missing)
            return response
        if self.config.trigger == "observation" and not self.heard_set:
            # a lockstep sim robot re-sends its waiting observation set to a subscriber DDS matched late; heard
            # after the reset, that stale set took a step and the episode ran one action ahead of the in-process one
            response.success, response.message = False, "no whole observation set from the robot yet"
            return response
        now = time.monotonic()
        if not self.started:
            self.policy.rng, self.started = np.random.default_rng(self.config.seed), True
        self.runner.reset()
        self.fresh.clear()
        self.forget_episode()
        if self.safety.state is SafetyState.ESTOPPED:
            response.success, response.message = self.safety.reset(self.clock(now))
            self.publish_damping()  # re-armed: position control again
        else:
            response.success, response.message = True, "new episode"
        return response

    # --- the control step ---------------------------------------------------------------------------
    def tick(self) -> None:
        if not self.started:
            return
        self.poll_estop()
        now = time.monotonic()
        self.ticks += 1
        clock = self.clock(now)
        if not self.active:  # deactivated: the commanded motion brakes to rest within the limits, then nothing
            if self.safety.last is not None and np.any(self.safety.velocity != 0.0):
                self.publish_command(self.safety.step(None, clock))
            return
        if self.config.trigger == "observation" and self.q is not None:
            self.safety.observe(self.q, clock, self.dq)
        if self.robot.base is not None and (reading := self.base_reading(now)) is not None:
            self.safety.observe_base(reading)  # a fall e-stops: damping
        self.publish_damping()
        if self._operator_drives(now):
            return
        target, ahead = None, np.zeros((0, 0))
        obs = self.observation(now) if self._heartbeat_alive(now) else None  # None: the safety filter holds
        if obs is not None and self.safety.state is not SafetyState.ESTOPPED:
            t0 = time.perf_counter()
            action = self.runner.step(obs)
            self.inference_ms.append(1e3 * (time.perf_counter() - t0))
            if action is not None:
                target = self.io.joint_targets(self.q, action)  # type: ignore[arg-type]
                ahead = self.runner.ahead()
                if self.config.hil:
                    self.action_pub.publish(float_array_to_msg(action))
        command = self.safety.step(target, clock)
        self.publish_command(command, self.plan_ahead(command, ahead) if target is not None else None)

    def clock(self, now: float) -> float:
        """The safety filter's clock: the wall clock, or in lockstep the simulator's, one control period per
        observation set however fast they come."""
        return now if self.config.trigger == "timer" else self.ticks / self.robot.control_hz

    def _on_heartbeat(self, msg: Bool) -> None:
        self.heartbeat_at = time.monotonic() if msg.data else -np.inf  # a False releases at once

    def _heartbeat_alive(self, now: float) -> bool:
        """No dead-man topic, or a True on it within `heartbeat_timeout`."""
        return not self.config.heartbeat or now - self.heartbeat_at <= self.config.heartbeat_timeout

    def _operator_drives(self, now: float) -> bool:
        """Human in the loop: while the operator drives (a fresh True on /robotrl/intervention) the policy yields;
        when they let go it starts a new chunk from the arm where the operator left it."""
        drives = self.operator[0] and now - self.operator[1] <= self.robot.max_obs_age
        if drives and not self.yielded:
            self.get_logger().info("the operator drives: the policy yields")
        elif self.yielded and not drives:
            self.runner.reset()
            self.safety.restart()
            self.get_logger().info("the operator let go: the policy drives again")
        self.yielded = drives
        return drives

    def _publish_diagnostics(self) -> None:
        status = self.safety.status()
        level = {
            "armed": DiagnosticStatus.OK,
            "waiting": DiagnosticStatus.WARN,
            "holding": DiagnosticStatus.WARN,
            "estopped": DiagnosticStatus.ERROR,
        }[status["state"]]
        times = np.asarray(self.inference_ms[-1000:]) if self.inference_ms else np.zeros(1)
        values = {
            **status,
            **{f"malformed {k}": v for k, v in self.malformed.items()},
            **{f"bad stamps {k}": v for k, v in self.bad_stamps.items()},
            "ticks": self.ticks,
            "inferences": self.runner.inferences,
            "step ms p50": f"{np.percentile(times, 50):.3f}",
            "step ms p99": f"{np.percentile(times, 99):.3f}",
        }
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [
            DiagnosticStatus(
                level=level,
                name="robotrl_deploy: safety",
                hardware_id=self.robot.name,
                message=status["state"] + (f" ({status['estop_reason']})" if status["estop_reason"] else ""),
                values=[KeyValue(key=str(k), value=str(v)) for k, v in values.items()],
            )
        ]
        self.diag_pub.publish(msg)

    def close(self) -> None:
        if self.configured:
            self.runner.close()


def main(args: list[str] | None = None) -> int:
    return spin_node(DeployNode, args)
