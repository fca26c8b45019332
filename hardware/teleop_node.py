"""`robotrl-teleop`: record a robot's topics and an operator's device into an episode store, episode by episode,
with the operator's interventions marked.

    robotrl-teleop --ros-args -p robot:=sim_panda -p task:=PushT -p store:=data/pusht.zarr -p device:=spacemouse
    robotrl-teleop --ros-args ... -p policy_topic:=/robotrl/policy_action      # human-in-the-loop (HIL-SERL)

Every control period (the robot file's control_hz, which must be the task's) the node reads the device, turns
its command into the task action (`command_to_action`), maps the action to joint targets with the task's own
controller (`TaskIO.joint_targets`, from the newest joint state), publishes what the safety filter lets through
on the robot's command topic (JointTrajectory or Float64MultiArray per the robot's file), and appends a step to
the episode being recorded: the newest observations the task's spec names (the task-state vector, cameras,
the instruction), the action and `intervention`. A step's reward, success and termination are the sim robot's
status (`/robotrl/sim/status`) after it, when that topic is there; without it they are 0 / False. Stale or
missing observations: nothing is recorded and the safety filter holds.

Intervention mode (`policy_topic` set, HIL-SERL style): a policy drives the robot (the deploy node) and
publishes its task action on `policy_topic` (`std_msgs/Float64MultiArray`). While the operator is not driving,
the node publishes no command and records the policy's newest action with intervention=False. The operator
drives while the device says so: its take-over flag (`TeleopCommand.intervention`: the keyboard's I, the
gamepad's X, a `ScriptedDevice`'s `interventions` ranges) or a non-zero twist (hands on the SpaceMouse, the
sticks or the motion keys); a scripted action without the flag is not an intervention. Those steps are
published and recorded with intervention=True, and `/robotrl/intervention` (`std_msgs/Bool`, every period)
says who drives, for the policy side to yield. Each take-over restarts the safety filter from the measured
position (the arm moved while the policy drove). In plain teleop mode every step is the operator's
(intervention=True).

Episodes end as `robotrl data collect` ends them: the device's keep / discard / quit events, or the episode is done
(the sim robot reports it terminated or truncated, or `episode_steps` steps were recorded), whereupon the
device decides (a scripted operator at once; a person presses keep or discard while the robot holds). A
discarded episode is never written; a kept one is committed atomically by the store's writer, so killing the
node loses at most the episode in progress. With `reset_service` (the sim robot's `/robotrl_sim_robot/reset`)
each episode starts with that reset; on a real cell the next episode starts at once. Malformed messages are
counted (`malformed`) and logged, never a crash. The e-stop topic latches (nothing published or recorded)
until `~/reset`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from std_msgs.msg import Bool, Float64MultiArray, String
from std_srvs.srv import Trigger

from robotrl.core.spec import STRING, SpecMismatchError
from robotrl.datasets.collect import check_store
from robotrl.datasets.store import EpisodeStore
from robotrl.datasets.teleop import (
    DEVICES,
    EpisodeStatus,
    TeleopCommand,
    TeleopDevice,
    TeleopError,
    action_axes,
    command_to_action,
    make_device,
)
from robotrl.hardware.messages import MalformedMessage, msg_to_float_array
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.robot_node import INTERVENTION_TOPIC, RobotNode
from robotrl.hardware.ros import declare_config, json_object, spin_node
from robotrl.hardware.safety import SafetyState
from robotrl.hardware.sim_robot_node import STATUS_TOPIC

STATUS_KEYS = ("episode", "success", "reward", "terminated", "truncated")


@dataclass
class TeleopNodeConfig:
    robot: str = "sim_panda"
    """a bundled robot (hardware/robots/<name>.yaml) or a path to a robot file"""
    task: str = "PushT"
    """the task whose spec the store uses (its observations, action and rate)"""
    task_options: str = "{}"
    """JSON object of task config fields, e.g. {"images": true, "episode_steps": 300}"""
    store: str = "data/teleop.zarr"
    """episode store to create, or to append to when its spec is the task's"""
    device: str = "keyboard"
    """teleop device: keyboard, gamepad, spacemouse or scripted (the task's expert)"""
    device_options: str = "{}"
    """JSON object of the device's constructor options, e.g. {"deadzone": 0.1} or, scripted,
    {"noise": 0.5, "seed": 3, "interventions": [[10, 30]]}"""
    policy_topic: str = ""
    """'' : plain teleop. A topic (e.g. /robotrl/policy_action, std_msgs/Float64MultiArray with the policy's task
    action): intervention mode, the operator takes over from the policy"""
    episode_steps: int = 0
    """> 0: the task's episode length (part of the spec: must match an existing store); 0: task_options' or the
    task's default"""
    episodes: int = 0
    """stop after this many kept episodes; 0: until the operator quits or Ctrl-C"""
    max_obs_age: float = 0.0
    """> 0: observations older than this (seconds) are stale (for the safety filter too); 0: the robot file's"""
    reset_service: str = ""
    """std_srvs/Trigger called to start each episode (the sim robot: /robotrl_sim_robot/reset); '' on a real cell"""
    reset_timeout: float = 5.0
    """seconds to wait for `reset_service`'s answer before asking again: DDS can drop the answer to a client the
    server has not fully matched yet (a loaded machine's slow discovery), and an answer never coming would hold
    the node in its reset for good. A second sim robot reset only starts one more episode"""
    instruction: str = ""
    """the instruction until one arrives on the instruction topic (tasks with a language observation)"""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"TeleopNodeConfig.device: expected one of {sorted(DEVICES)}, got {self.device!r}")
        for name in ("task_options", "device_options"):
            json_object(getattr(self, name), f"TeleopNodeConfig.{name}")
        if not self.store:
            raise ValueError("TeleopNodeConfig.store: expected the path of an episode store, got ''")
        for name in ("policy_topic", "reset_service"):
            value = getattr(self, name)
            if value and (not value.startswith("/") or " " in value):
                raise ValueError(
                    f"TeleopNodeConfig.{name}: expected '' or an absolute name like "
                    f"'/robotrl/policy_action', got {value!r}"
                )
        for name in ("episode_steps", "episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"TeleopNodeConfig.{name}: expected >= 0, got {getattr(self, name)}")
        if not self.reset_timeout > 0:
            raise ValueError(f"TeleopNodeConfig.reset_timeout: expected > 0 s, got {self.reset_timeout}")
        if not self.max_obs_age >= 0:
            raise ValueError(
                f"TeleopNodeConfig.max_obs_age: expected >= 0 (0: the robot file's), got {self.max_obs_age}"
            )

    def options(self) -> dict[str, Any]:
        """The task's options: `task_options` with `episode_steps` folded in."""
        options = json_object(self.task_options, "TeleopNodeConfig.task_options")
        if self.episode_steps:
            if options.get("episode_steps", self.episode_steps) != self.episode_steps:
                raise ValueError(
                    f"TeleopNodeConfig: episode_steps is {self.episode_steps} but task_options sets "
                    f"episode_steps {options['episode_steps']}; set one of them"
                )
            options["episode_steps"] = self.episode_steps
        return options


def operator_drives(command: TeleopCommand) -> bool:
    """Whether the operator is driving: the device's take-over flag, or a twist off zero (hands on the device)."""
    return bool(command.intervention) or bool(np.any(command.twist != 0.0))


class TeleopNode(RobotNode):
    """`device` replaces the one the config names (tests, custom drivers); it is started and closed here."""

    def __init__(self, config: TeleopNodeConfig | None = None, device: TeleopDevice | None = None) -> None:
        super().__init__("robotrl_teleop")
        self.device: TeleopDevice | None = None
        self.store: EpisodeStore | None = None
        self.writer: Any = None
        try:
            self._setup(config, device)
        except BaseException:
            self.close()
            self.destroy_node()
            raise

    def _setup(self, config: TeleopNodeConfig | None, device: TeleopDevice | None) -> None:
        from robotrl.envs import make_task

        cfg = self.config = config or declare_config(self, TeleopNodeConfig)
        robot = RobotConfig.load(cfg.robot)
        self.robot = dataclasses.replace(robot, max_obs_age=cfg.max_obs_age) if cfg.max_obs_age > 0 else robot
        self.task = make_task(cfg.task, **cfg.options())
        spec = self.spec = self.task.spec()
        if not np.isclose(spec.control_hz, self.robot.control_hz):
            raise SpecMismatchError(
                f"robotrl-teleop: task {spec.task} records at {spec.control_hz:g} Hz, robot "
                f"{self.robot.name} is controlled at {self.robot.control_hz:g} Hz (control_hz in "
                "its file); the store's rate must be the rate the steps are taken at"
            )
        self.intervention_mode = bool(cfg.policy_topic)
        if device is None:
            device = make_device(cfg.device, self.task, **json_object(cfg.device_options, "device_options"))
        if device.human:
            action_axes(spec)  # a task a twist cannot drive fails here, before the store or the device opens
        store_path = Path(cfg.store)
        check_store(store_path, spec, who="robotrl-teleop", instead="Record into a new store")
        device.start()  # the device first: a missing device leaves no empty store behind
        self.device = device
        self.store = EpisodeStore.create(store_path, spec, exist_ok=True)
        source = "intervention" if self.intervention_mode else ("teleop" if device.human else "scripted")
        self.writer = self.store.writer(
            source=source,
            robot=self.robot.name,
            device=device.name,
            mode="intervention" if self.intervention_mode else "teleop",
        )

        self.sim_status: dict[str, Any] | None = None
        self.policy_action: tuple[np.ndarray, float] | None = None
        self.kept = self.discarded = 0
        self.kept_indices: list[int] = []
        self.finished = False
        self.episode = 0
        self.ep = EpisodeStatus()
        self.pending: tuple[dict[str, Any], np.ndarray, bool, float] | None = None
        self.episode_instruction: str | None = None
        self.operator_was_driving = False
        self.phase = "recording"
        self.reset_future: Any = None
        self.reset_sent = -np.inf
        self.min_sim_episode = 0
        self.reseed = True

        self.connect_robot(
            self.robot, spec, [k for k, v in spec.observations.items() if v.dtype != STRING], cfg.instruction
        )
        self.create_subscription(String, STATUS_TOPIC, self._on_status, 10)
        self.create_service(Trigger, "~/reset", self._srv_reset)
        if self.intervention_mode:
            self.create_subscription(Float64MultiArray, cfg.policy_topic, self._on_policy_action, 10)
            self.intervention_pub = self.create_publisher(Bool, INTERVENTION_TOPIC, 10)
        self.reset_client: Any = self.create_client(Trigger, cfg.reset_service) if cfg.reset_service else None
        self._begin_episode()
        self.create_timer(1.0 / self.robot.control_hz, self.tick)
        mode = f"intervention mode (policy on {cfg.policy_topic})" if self.intervention_mode else "teleop"
        self.get_logger().info(
            f"recording {spec.task} on {self.robot.name} into {store_path} "
            f"({self.store.num_episodes} episodes there) with {device.name}, {mode}"
        )
        if device.human and device.help:
            self.get_logger().info(f"{device.name}: {device.help}")

    # --- inputs -------------------------------------------------------------------------------------
    def current_instruction(self) -> str:
        return self.episode_instruction or self.instruction

    def _on_status(self, msg: String) -> None:
        try:
            status = json.loads(msg.data)
            if not isinstance(status, dict) or any(k not in status for k in STATUS_KEYS):
                raise ValueError("not an object with those keys")
            int(status["episode"]), float(status["reward"])
        except (ValueError, TypeError) as e:
            return self.bad_message(
                STATUS_TOPIC,
                MalformedMessage(
                    "String", "data", f"a JSON object with {list(STATUS_KEYS)}", f"{msg.data[:80]!r} ({e})"
                ),
            )
        self.sim_status = status

    def _on_policy_action(self, msg: Float64MultiArray) -> None:
        a = self.spec.action
        try:
            x = msg_to_float_array(msg, expected_size=a.size)
        except MalformedMessage as e:
            return self.bad_message(self.config.policy_topic, e)
        action = np.clip(x.reshape(a.shape), a.low_array(), a.high_array()).astype(a.dtype)
        self.policy_action = (action, time.monotonic())

    def _srv_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        """Re-arm after an e-stop (only with a fresh joint state); the episode in progress goes on."""
        if self.safety.state is SafetyState.ESTOPPED:
            response.success, response.message = self.safety.reset(time.monotonic())
        else:
            response.success, response.message = True, "not e-stopped"
        return response

    # --- episodes -----------------------------------------------------------------------------------
    def _begin_episode(self) -> None:
        self.writer.discard()
        self.pending, self.episode_instruction = None, None
        self.device.reset_episode()  # type: ignore[union-attr]
        self.ep = EpisodeStatus(episode=self.episode)
        self.reseed = True
        if self.reset_client is not None:
            self.phase, self.reset_future = "resetting", None
        else:
            self.phase = "recording"

    def _current_status(self) -> dict[str, Any] | None:
        """The sim robot's status if it is about this episode (statuses from before the reset are not)."""
        s = self.sim_status
        return s if s is not None and int(s["episode"]) >= self.min_sim_episode else None

    def _outcome(self) -> tuple[float, bool, bool, bool]:
        """(reward, terminated, truncated, success) of the step recorded last: the status after it."""
        s = self._current_status()
        at_limit = self.ep.step >= self.spec.episode_steps > 0
        if s is None:
            return 0.0, False, at_limit, False
        terminated = bool(s["terminated"])
        truncated = (bool(s["truncated"]) or at_limit) and not terminated
        return float(s["reward"]), terminated, truncated, bool(s["success"])

    def _flush(self) -> None:
        """Write the pending step with its outcome into the episode (still in memory)."""
        if self.pending is None:
            return
        obs, action, intervention, stamp = self.pending
        reward, terminated, truncated, success = self._outcome()
        self.writer.add(obs, action, reward, terminated, truncated, success, intervention, stamp)
        self.pending = None

    def _steps(self) -> int:
        return len(self.writer) + (self.pending is not None)

    def _end(self, verdict: str, reason: str) -> None:
        """keep / discard / restart (nothing recorded) / quit the episode in progress, then begin the next."""
        steps = self._steps()
        if verdict == "keep":
            self._flush()
            index = self.writer.finalize(success=bool(self.ep.any_success), end_reason=reason)
            self.kept += 1
            self.kept_indices.append(index)
            self.get_logger().info(
                f"episode {self.episode}: kept as #{index} ({steps} steps, "
                f"{'success' if self.ep.any_success else 'no success'}, {reason})"
            )
        else:
            self.writer.discard()
            self.pending = None
            if verdict == "discard" and steps:
                self.discarded += 1
                self.get_logger().info(f"episode {self.episode}: discarded ({steps} steps, {reason})")
        if verdict == "quit" or (self.config.episodes and self.kept >= self.config.episodes):
            self.finished = True
            self.get_logger().info(
                f"done: {self.kept} episode(s) kept, {self.discarded} discarded "
                f"({'operator quit' if verdict == 'quit' else 'enough episodes'})"
            )
            return
        self.episode += 1
        self._begin_episode()

    def _resetting(self, now: float) -> bool:
        """Drive the reset service; True once the new episode may be recorded."""
        assert self.reset_client is not None
        if self.reset_future is None:
            if not self.reset_client.service_is_ready():
                self.get_logger().info(f"waiting for {self.config.reset_service}", throttle_duration_sec=5.0)
                return False
            self.min_sim_episode = int(self.sim_status["episode"]) + 1 if self.sim_status else 0
            self.reset_sent = now
            self.reset_future = self.reset_client.call_async(Trigger.Request())
            return False
        if not self.reset_future.done():
            if now - self.reset_sent > self.config.reset_timeout:  # its answer is lost: ask again
                self.reset_client.remove_pending_request(self.reset_future)
                self.reset_future = None
                self.get_logger().warning(
                    f"{self.config.reset_service} did not answer within {self.config.reset_timeout} s; asking again"
                )
            return False
        result, self.reset_future = self.reset_future.result(), None
        if result is None or not result.success:
            self.get_logger().error(
                f"{self.config.reset_service} failed ({result}); trying again", throttle_duration_sec=1.0
            )
            return False
        numbered = re.fullmatch(r"episode (\d+)", result.message)  # the sim robot answers with its new episode
        if numbered:
            self.min_sim_episode = int(numbered.group(1))
        self.phase = "recording"
        return True

    # --- the control step ---------------------------------------------------------------------------
    def tick(self) -> None:
        if self.finished or self.device is None:
            return
        now = time.monotonic()
        if self.phase == "resetting" and not self._resetting(now):
            return  # nothing is published while the robot is being reset
        if self.safety.state is SafetyState.ESTOPPED:
            self.safety.step(None, now)  # counted as blocked; nothing is published or recorded
            return
        status = self._current_status()
        if status is not None:
            self.ep.success = bool(status["success"])
            self.ep.any_success = self.ep.any_success or self.ep.success
        limit = self.spec.episode_steps
        self.ep.done = bool(status and (status["terminated"] or status["truncated"])) or 0 < limit <= self._steps()
        obs = self.observation(now, since=self.reset_sent)  # nothing from before the reset
        command = None
        if obs is not None or self.ep.done or self.device.human:
            try:
                command = self.device.read(obs if obs is not None else {}, self.ep)
            except TeleopError as e:
                self.get_logger().error(f"{self.device.name}: {e}; the episode in progress is dropped")
                return self._end("quit", "device failed")
        if command is not None:
            if command.quit:
                return self._end("quit", "operator")
            if command.discard:
                return self._end("discard" if self._steps() else "restart", "operator")
            if command.keep and self._steps():
                return self._end("keep", "end" if self.ep.done else ("success" if self.ep.success else "operator"))
        if self.ep.done:
            if not self._steps():
                return self._end("restart", "ended before a step was recorded")
            self.get_logger().info(f"episode {self.episode} ended: keep or discard it", throttle_duration_sec=10.0)
            return self._hold(now)
        if obs is None or command is None or self.q is None:
            return self._hold(now)
        if self.reseed:
            self._resume_from_measured()
        drives = not self.intervention_mode or operator_drives(command)
        if self.intervention_mode:
            self.intervention_pub.publish(Bool(data=drives))
            if drives and not self.operator_was_driving:
                self._resume_from_measured()  # the arm moved while the policy drove
            self.operator_was_driving = drives
        if drives:
            action = command_to_action(command, self.spec)
            target = self.io.joint_targets(self.q, action)
            self.publish_command(self.safety.step(target, now))
        else:
            fresh = self.policy_action is not None and now - self.policy_action[1] <= self.robot.max_obs_age
            if not fresh:
                return  # the policy is not acting: nothing to record
            action = self.policy_action[0]  # type: ignore[index]
        self._record(obs, action, drives)

    def _record(self, obs: dict[str, Any], action: np.ndarray, intervention: bool) -> None:
        self._flush()  # the step before gets the status as it is now: its outcome
        if self.text_keys and self.episode_instruction is None:
            self.episode_instruction = str(obs[self.text_keys[0]])
        self.pending = (obs, np.asarray(action, dtype=self.spec.action.dtype), intervention, time.time())
        self.ep.step = self._steps()

    def _hold(self, now: float) -> None:
        if not self.intervention_mode:
            self.publish_command(self.safety.step(None, now))

    def _resume_from_measured(self) -> None:
        """The arm moved since this node's last command (a reset, or the policy drove): limit from where it is."""
        self.safety.restart()
        self.reseed = False

    def close(self) -> None:
        """Drop the episode in progress (kept ones are committed), release the store and the device."""
        if self.writer is not None:
            self.writer.discard()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.device is not None:
            self.device.close()
            self.device = None


def main(args: list[str] | None = None) -> int:
    """Spin the node until it has its episodes, the operator quits, Ctrl-C or SIGTERM; 0 on a clean stop (the
    episode in progress is dropped, kept episodes are saved)."""
    return spin_node(TeleopNode, args, finished=lambda node: node.finished)


if __name__ == "__main__":
    sys.exit(main())
