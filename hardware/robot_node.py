"""What the deploy and teleop nodes share: a robot's observations, as a task's spec names them, in; the arm's
joint commands, through the safety filter, out.

Subscribes to the robot's joint states (every one goes to the safety filter), the task-state vector (objects'
poses from a simulator, perception or motion capture), the cameras, the instruction and the e-stop topic, keeps
the newest value of each with its arrival time, and counts and logs malformed messages instead of failing on
them. `observation(now)` is the newest frame of every key, or None when one is missing or older than the robot's
`max_obs_age`; `publish_command(q)` sends joint positions as the robot's file says (nothing for None).
`unconnected()` names the robot topics DDS has not matched yet: a node that starts an episode before its inputs
are matched misses the first observation, which a lockstep robot sends only once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from robotrl.core.spec import STRING, Spec, SpecMismatchError
from robotrl.hardware.messages import (
    MalformedMessage,
    float_array_to_msg,
    image_to_array,
    joint_state_to_arrays,
    joint_trajectory,
    msg_to_float_array,
)
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.safety import SafetyFilter
from robotrl.hardware.task_io import TaskIO

#: human-in-the-loop: the policy's task action each step it acts (std_msgs/Float64MultiArray, deploy -> teleop),
#: and who drives (std_msgs/Bool, True: the operator; teleop -> deploy, every control period)
POLICY_ACTION_TOPIC = "/robotrl/policy_action"
INTERVENTION_TOPIC = "/robotrl/intervention"


class RobotNode(Node):
    def connect_robot(self, robot: RobotConfig, spec: Spec, obs_keys: Sequence[str], instruction: str = "") -> None:
        """Subscribe to what `obs_keys` need from `robot` and open its command topic; call once from __init__."""
        self.robot, self.spec = robot, spec
        self.io, self.safety = TaskIO(spec, robot), SafetyFilter(robot)
        self.obs_keys = tuple(obs_keys)
        self.text_keys = tuple(k for k, v in spec.observations.items() if v.dtype == STRING)
        self.q: np.ndarray | None = None
        self.q_stamp = -np.inf
        self.latest: dict[str, tuple[Any, float]] = {}
        self.malformed: dict[str, int] = {}
        self.instruction = instruction
        topics, name = robot.topics, self.get_name()
        sensor = qos_profile_sensor_data
        self.inputs = [self.create_subscription(JointState, topics.joint_states, self._on_joint_state, sensor)]
        vector = [k for k in self.obs_keys if not spec.observations[k].is_image]
        if len(vector) > 1:
            raise SpecMismatchError(
                f"{name}: {spec.task} observes {len(vector)} vectors {vector}; the robot offers "
                f"one task-state topic ({topics.task_state})"
            )
        for key in vector:
            self.inputs.append(
                self.create_subscription(
                    Float64MultiArray, topics.task_state, lambda m, k=key: self._on_vector(k, m), sensor
                )
            )
        for key in self.obs_keys:
            if spec.observations[key].is_image:
                if key not in topics.images:
                    raise SpecMismatchError(
                        f"{name}: {spec.task} observes camera {key!r}; robot {robot.name} names "
                        f"cameras {sorted(topics.images)} (topics.images in its file)"
                    )
                self.inputs.append(
                    self.create_subscription(Image, topics.images[key], lambda m, k=key: self._on_image(k, m), sensor)
                )
        self.create_subscription(String, topics.instruction, self._on_instruction, 10)
        self.create_subscription(Bool, topics.estop, self._on_estop, 10)
        msg_type = JointTrajectory if robot.command_type == "joint_trajectory" else Float64MultiArray
        self.command_pub = self.create_publisher(msg_type, topics.command, 10)

    def unconnected(self) -> list[str]:
        """What DDS has not matched yet: input topics without a publisher, the command topic without a subscriber."""
        missing = [f"no publisher on {s.topic_name}" for s in self.inputs if s.get_publisher_count() == 0]
        if self.command_pub.get_subscription_count() == 0:
            missing.append(f"no subscriber on {self.command_pub.topic_name}")
        return missing

    # --- hooks --------------------------------------------------------------------------------------
    def on_joint_state(self, q: np.ndarray, stamp: float) -> None:
        """A joint state arrived (after `self.q` is set): the safety filter sees it."""
        self.safety.observe(q, stamp)

    def on_input(self, key: str) -> None:
        """An observation ("joint_states", a key of `obs_keys`, or a string key of the spec: the instruction)
        arrived."""

    def current_instruction(self) -> str:
        return self.instruction

    # --- inputs -------------------------------------------------------------------------------------
    def bad_message(self, topic: str, error: Exception) -> None:
        self.malformed[topic] = self.malformed.get(topic, 0) + 1
        self.get_logger().warning(
            f"malformed message on {topic} (#{self.malformed[topic]}): {error}", throttle_duration_sec=1.0
        )

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            q, _ = joint_state_to_arrays(msg, self.robot.joint_names)
        except MalformedMessage as e:
            return self.bad_message(self.robot.topics.joint_states, e)
        self.q, self.q_stamp = q, time.monotonic()
        self.on_joint_state(q, self.q_stamp)
        self.on_input("joint_states")

    def _on_vector(self, key: str, msg: Float64MultiArray) -> None:
        a = self.spec.observations[key]
        try:
            x = msg_to_float_array(msg, expected_size=a.size)
        except MalformedMessage as e:
            return self.bad_message(self.robot.topics.task_state, e)
        self.latest[key] = (x.reshape(a.shape).astype(a.dtype), time.monotonic())
        self.on_input(key)

    def _on_image(self, key: str, msg: Image) -> None:
        try:
            image = image_to_array(msg, expected_shape=tuple(self.spec.observations[key].shape))  # type: ignore[arg-type]
        except MalformedMessage as e:
            return self.bad_message(self.robot.topics.images[key], e)
        self.latest[key] = (image, time.monotonic())
        self.on_input(key)

    def _on_instruction(self, msg: String) -> None:
        if msg.data.strip():
            self.instruction = msg.data
            for key in self.text_keys:
                self.on_input(key)
        else:
            self.bad_message(self.robot.topics.instruction, ValueError("String.data: expected an instruction, got ''"))

    def _on_estop(self, msg: Bool) -> None:
        if msg.data:
            self.safety.estop(self.robot.topics.estop)
            self.get_logger().error(f"E-STOP from {self.robot.topics.estop}: nothing is published until ~/reset")

    # --- the step -----------------------------------------------------------------------------------
    def observation(self, now: float, since: float = -np.inf) -> dict[str, Any] | None:
        """The newest frame of every key (and the instruction), or None if one is missing, stale, or from before
        `since`; the joint state must be fresh too (the command is computed from it)."""
        age = self.robot.max_obs_age
        if self.q is None or now - self.q_stamp > age or self.q_stamp < since:
            return None
        obs: dict[str, Any] = {}
        for key in self.obs_keys:
            if key not in self.latest or now - self.latest[key][1] > age or self.latest[key][1] < since:
                return None
            obs[key] = self.latest[key][0]
        for key in self.text_keys:
            text = self.current_instruction()
            if not text:
                return None
            obs[key] = text
        return obs

    def publish_command(self, q: np.ndarray | None) -> None:
        if q is None:
            return
        if self.robot.command_type == "joint_trajectory":
            msg = joint_trajectory(
                self.robot.joint_names, q, self.robot.time_from_start, stamp=self.get_clock().now().to_msg()
            )
        else:
            msg = float_array_to_msg(q)
        self.command_pub.publish(msg)
