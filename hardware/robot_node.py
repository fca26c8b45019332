"""What the deploy and teleop nodes share: a robot's observations, as a task's spec names them, in; the arm's
joint commands, through the safety filter, out.

Subscribes to the robot's joint states (every one goes to the safety filter), the task-state vector (objects'
poses from a simulator, perception or motion capture), the cameras, the instruction and the e-stop topic, keeps
the newest value of each with its arrival time, and counts and logs malformed messages instead of failing on
them. `observation(now)` is the newest frame of every key, or None when one is missing or older than the robot's
`max_obs_age`; `publish_command(q)` sends joint positions as the robot's file says (nothing for None), and the
same positions as a `sensor_msgs/JointState` on `command_stamped`, stamped with the joint state they were computed
from, so that each command can be paired with its observation from outside.
A message with a header stamp is used only if the stamp is no older than the robot's `max_obs_age`, no further
ahead of this node's clock than that, and not before the topic's previous stamp; any other is dropped and counted
(`bad_stamps`), so the inputs go stale and the robot holds. A zero stamp (a driver that stamps nothing) counts
from its arrival. The node's clock is ROS time: the system clock, or the simulator's /clock with `use_sim_time`.
`unconnected()` names the robot topics DDS has not matched yet: a node that starts an episode before its inputs
are matched misses the first observation, which a lockstep robot sends only once.

A robot file that names the task's objects (`topics.objects`) has no task-state topic either: each object's
`geometry_msgs/PoseStamped` (perception, motion capture) gives its joint positions, two successive ones (over their
stamps) its velocities, and with the joint states and the goal (a `PoseStamped` on `topics.goal`, or the
instruction naming it) they make the state observation through the task's own `observe` (`TaskIO.object_observation`).
A new episode (`forget_episode`) waits for its goal to be heard again, and its objects start at rest.

A floating-base robot (a legged one) has no task-state topic: its IMU (`sensor_msgs/Imu`), odometry
(`nav_msgs/Odometry`) and velocity command (`geometry_msgs/Twist` on /cmd_vel, zero once older than the robot
file's `base.cmd_vel_timeout`) make its state observation with the joint states, through the task's own
`observe` (`TaskIO.base_observation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped, Twist
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, Imu, JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from robotrl.core.spec import STRING, Spec, SpecMismatchError
from robotrl.hardware.floating_base import BaseReading
from robotrl.hardware.messages import (
    MalformedMessage,
    arrays_to_joint_state,
    float_array_to_msg,
    image_to_array,
    imu_to_arrays,
    joint_state_to_arrays,
    joint_trajectory,
    msg_to_float_array,
    odometry_to_arrays,
    pose_to_arrays,
    stamp_to_seconds,
    twist_to_command,
)
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.safety import SafetyFilter, SafetyState
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
        self.dq: np.ndarray | None = None
        self.q_stamp = -np.inf
        self.q_header_stamp = Time()  # the newest joint state's own stamp
        self.latest: dict[str, tuple[Any, float]] = {}
        self.malformed: dict[str, int] = {}
        self.stamps: dict[str, float] = {}  # the newest header stamp used, per input
        self.bad_stamps: dict[str, int] = {}
        self.instruction = instruction
        topics, name = robot.topics, self.get_name()
        sensor = qos_profile_sensor_data
        # the e-stop first: an executor takes the ready messages of one wake-up in the order their subscriptions were
        # made, so an e-stop that arrived with an observation set is latched before that set can make a command
        self.estop_sub = self.create_subscription(Bool, topics.estop, self._on_estop, 10)
        self.inputs = [self.create_subscription(JointState, topics.joint_states, self._on_joint_state, sensor)]
        vector = [k for k in self.obs_keys if not spec.observations[k].is_image]
        #: what makes a whole observation set (trigger=observation): the inputs the policy's observation is made of
        self.input_keys = {"joint_states", *self.obs_keys, *self.text_keys}
        self.base_vector: list[str] = []
        if robot.base is not None:  # the state is made from the base's sensors, not read from a task-state topic
            readings: list[tuple[str, Any, str, Callable[[Any], Any], Any]] = [
                ("imu", Imu, topics.imu, imu_to_arrays, sensor),
                ("odometry", Odometry, topics.odometry, odometry_to_arrays, sensor),
                ("cmd_vel", Twist, topics.cmd_vel, twist_to_command, 10),
            ]
            self.inputs += [
                self.create_subscription(
                    kind, topic, lambda m, k=key, t=topic, c=convert: self._on_reading(k, t, c, m), qos
                )
                for key, kind, topic, convert, qos in readings
            ]
            self.input_keys = {*(self.input_keys - set(vector)), "imu", "odometry", "cmd_vel"}
            self.base_vector, vector = vector, []
        #: poses: the state vector rebuilt from the objects' poses and the goal (robot file `topics.objects`)
        self.pose_vector: list[str] = []
        self.motion: dict[str, tuple[np.ndarray, float]] = {}  # an object's newest joint positions and their stamp
        self.goal_pose: tuple[np.ndarray, np.ndarray] | None = None
        self.goal_heard = True  # a goal pose or instruction since the episode began (poses: `forget_episode`)
        self.goal_by_words = False  # the goal named by the instruction (poses, PickPlace)
        if topics.objects is not None and vector and not self.io.native and robot.base is None:
            self.io.check_objects()
            self.inputs += [
                self.create_subscription(
                    PoseStamped, topics.objects[k], lambda m, k=k: self._on_pose(k, topics.objects[k], m), sensor
                )
                for k in self.io.objects.names
            ]
            if self.io.goal_source == "pose":
                self.inputs.append(self.create_subscription(PoseStamped, topics.goal, self._on_goal_pose, 10))
            self.input_keys = {*(self.input_keys - set(vector)), *(f"object:{k}" for k in self.io.objects.names)}
            self.pose_vector, vector = vector, []
            self.goal_by_words = self.io.goal_source == "instruction"
            self.forget_episode()
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
        msg_type = JointTrajectory if robot.command_type == "joint_trajectory" else Float64MultiArray
        self.command_pub = self.create_publisher(msg_type, topics.command, 10)
        self.stamped_pub = self.create_publisher(JointState, topics.command_stamped, 10)
        self.damping_pub = self.create_publisher(Bool, topics.damping, 10) if robot.base is not None else None
        self.damped = False  # what the damping topic last said

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

    def stamp_ok(self, key: str, topic: str, msg: Any) -> bool:
        """Whether a message's header stamp lets it be used (see the module's docstring); counted and warned if not."""
        try:
            stamp = stamp_to_seconds(msg.header.stamp)
        except MalformedMessage as e:
            self.bad_message(topic, e)
            return False
        if stamp == 0.0:
            return True
        now = self.get_clock().now().nanoseconds * 1e-9
        age, limit = now - stamp, self.robot.max_obs_age
        problem = (
            f"{age:.3f} s old (max_obs_age {limit:g} s)"
            if age > limit
            else f"{-age:.3f} s ahead of this node's clock"
            if -age > limit
            else f"before the previous one ({self.stamps[key]:.3f} s)"
            if stamp < self.stamps.get(key, -np.inf)
            else ""
        )
        if problem:
            self.bad_stamps[topic] = self.bad_stamps.get(topic, 0) + 1
            self.get_logger().warning(
                f"{topic}: stamp {stamp:.3f} s is {problem}; not used (#{self.bad_stamps[topic]})",
                throttle_duration_sec=1.0,
            )
            return False
        self.stamps[key] = stamp
        return True

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            q, dq = joint_state_to_arrays(msg, self.robot.joint_names)
        except MalformedMessage as e:
            return self.bad_message(self.robot.topics.joint_states, e)
        if not self.stamp_ok("joint_states", self.robot.topics.joint_states, msg):
            return
        self.q_header_stamp = msg.header.stamp
        self.q, self.dq, self.q_stamp = q, dq, time.monotonic()
        self.on_joint_state(q, self.q_stamp)
        self.on_input("joint_states")

    def _on_reading(self, key: str, topic: str, convert: Callable[[Any], Any], msg: Any) -> None:
        """A floating base's IMU, odometry or velocity command: kept converted, or counted as malformed."""
        try:
            value = convert(msg)
        except MalformedMessage as e:
            return self.bad_message(topic, e)
        if hasattr(msg, "header") and not self.stamp_ok(key, topic, msg):
            return
        self.latest[key] = (value, time.monotonic())
        self.on_input(key)

    def base_reading(self, now: float) -> BaseReading | None:
        """A floating base's newest IMU and odometry readings, or None when one is missing or stale."""
        got = [self.latest.get(k) for k in ("imu", "odometry")]
        if any(g is None or now - g[1] > self.robot.max_obs_age for g in got):
            return None
        (orientation, gyro, accel), (position, velocity) = (g[0] for g in got)  # type: ignore[index]
        return BaseReading(position, orientation, velocity, gyro, accel)

    def velocity_command(self, now: float) -> np.ndarray:
        """The newest /cmd_vel, zero once it is older than `base.cmd_vel_timeout` (or before the first)."""
        assert self.robot.base is not None
        got = self.latest.get("cmd_vel")
        if got is None or now - got[1] > self.robot.base.cmd_vel_timeout:
            return np.zeros(3)
        return got[0]

    def _on_pose(self, name: str, topic: str, msg: PoseStamped) -> None:
        """An object's pose: kept as its joint positions, and its velocities from the pose before (at rest when
        there is none this episode, or it is older than `max_obs_age`)."""
        try:
            position, orientation = pose_to_arrays(msg)
        except MalformedMessage as e:
            return self.bad_message(topic, e)
        key = f"object:{name}"
        if not self.stamp_ok(key, topic, msg):
            return
        now = time.monotonic()
        stamp = stamp_to_seconds(msg.header.stamp) or now  # unstamped: its arrival
        objects, before = self.io.objects, self.motion.get(name)
        qpos = objects.qpos_of(name, position, orientation, None if before is None else before[0])
        qvel = np.zeros(objects.joints[name].dadr.size)
        if before is not None and 0.0 < stamp - before[1] <= self.robot.max_obs_age:
            qvel = objects.qvel_of(name, before[0], qpos, stamp - before[1])
        self.motion[name] = (qpos, stamp)
        self.latest[key] = ((qpos, qvel), now)
        self.on_input(key)

    def _on_goal_pose(self, msg: PoseStamped) -> None:
        """The goal as a pose: kept until another comes or the episode ends (a goal tool sends it once)."""
        try:
            self.goal_pose = pose_to_arrays(msg)
        except MalformedMessage as e:
            return self.bad_message(self.robot.topics.goal, e)
        self.heard_goal()

    def heard_goal(self) -> None:
        first, self.goal_heard = not self.goal_heard, True
        if first:
            self.on_input("goal")

    def forget_episode(self) -> None:
        """A new episode: its objects start at rest (no velocity across the reset) and its goal must be heard."""
        self.motion.clear()
        self.goal_pose, self.goal_heard = None, not self.pose_vector or self.io.goal_source == "none"

    def awaited(self) -> set[str]:
        """The inputs a whole observation set needs: `input_keys`, and the goal until it is heard this episode."""
        return self.input_keys if self.goal_heard else {*self.input_keys, "goal"}

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
        if not self.stamp_ok(key, self.robot.topics.images[key], msg):
            return
        self.latest[key] = (image, time.monotonic())
        self.on_input(key)

    def _on_instruction(self, msg: String) -> None:
        topic = self.robot.topics.instruction
        if not msg.data.strip():
            return self.bad_message(topic, ValueError("String.data: expected an instruction, got ''"))
        if self.goal_by_words:
            try:
                self.io.goal_of(None, msg.data)
            except ValueError as e:
                return self.bad_message(topic, e)
        self.instruction = msg.data
        for key in self.text_keys:
            self.on_input(key)
        if self.goal_by_words:
            self.heard_goal()

    def _on_estop(self, msg: Bool) -> None:
        if msg.data:
            self.safety.estop(self.robot.topics.estop)
            self.get_logger().error(f"E-STOP from {self.robot.topics.estop}: nothing is published until ~/reset")
            self.publish_damping()

    def poll_estop(self) -> None:
        """Take an e-stop that has arrived but not yet been handed to its callback (the executor runs an overdue
        control timer before the subscriptions of the same wake-up): the control step calls this first, so no
        command goes out after an e-stop this process has received."""
        with self.estop_sub.handle:
            taken = self.estop_sub.handle.take_message(self.estop_sub.msg_type, self.estop_sub.raw)
        if taken is not None:
            self._on_estop(taken[0])

    def publish_damping(self) -> None:
        """A floating base's damping mode, as the safety filter's state says: on while e-stopped (a fall, an
        overspeed or an e-stop; said again every step, for a driver that starts listening late), off once re-armed."""
        if self.damping_pub is None:
            return
        on = self.safety.state is SafetyState.ESTOPPED
        if on or self.damped:
            self.damping_pub.publish(Bool(data=on))
            if on and not self.damped:
                self.get_logger().error(f"damping: {self.safety.estop_reason}")
            self.damped = on

    # --- the step -----------------------------------------------------------------------------------
    def observation(self, now: float, since: float = -np.inf) -> dict[str, Any] | None:
        """The newest frame of every key (and the instruction), or None if one is missing, stale, or from before
        `since`; the joint state must be fresh too (the command is computed from it)."""
        age = self.robot.max_obs_age
        if self.q is None or now - self.q_stamp > age or self.q_stamp < since:
            return None
        obs: dict[str, Any] = {}
        if self.robot.base is not None:
            reading = self.base_reading(now)
            if reading is None or self.dq is None:
                return None
            state = self.io.base_observation(self.q, self.dq, reading, self.velocity_command(now))
            obs = {k: state[k].astype(self.spec.observations[k].dtype) for k in self.base_vector}
        if self.pose_vector:
            objects = {}
            for name in self.io.objects.names:
                got = self.latest.get(f"object:{name}")
                if got is None or now - got[1] > age or got[1] < since:
                    return None
                objects[name] = got[0]
            goal = self.io.goal_of(self.goal_pose, self.current_instruction()) if self.goal_heard else None
            if goal is None or self.dq is None:
                return None
            state = self.io.object_observation(self.q, self.dq, objects, goal)
            obs = {k: state[k].astype(self.spec.observations[k].dtype) for k in self.pose_vector}
        for key in self.obs_keys:
            if key in obs:
                continue
            if key not in self.latest or now - self.latest[key][1] > age or self.latest[key][1] < since:
                return None
            obs[key] = self.latest[key][0]
        for key in self.text_keys:
            text = self.current_instruction()
            if not text:
                return None
            obs[key] = text
        return obs

    def publish_command(self, q: np.ndarray | None, plan: list[Any] | None = None) -> None:
        """Send `q` (nothing for None). A trajectory robot gets a JointTrajectory: `q` due `time_from_start`
        after now, then the safety-filtered points `plan` [(positions, velocity), ...] ahead on the control grid,
        each with its velocity (the command's own: the safety filter's)."""
        if q is None:
            return
        if self.robot.command_type == "joint_trajectory":
            points = [(q, self.safety.velocity), *(plan or [])]
            msg = joint_trajectory(
                self.robot.joint_names,
                np.stack([p for p, _ in points]),
                self.robot.time_from_start,
                stamp=self.get_clock().now().to_msg(),
                velocities=np.stack([v for _, v in points]),
                period=1.0 / self.robot.control_hz,
            )
        else:
            msg = float_array_to_msg(q)
        self.command_pub.publish(msg)
        # stamped as the joint state it was computed from, to the nanosecond (a float of seconds loses ~100 ns)
        self.stamped_pub.publish(
            arrays_to_joint_state(self.robot.joint_names, q, self.safety.velocity, stamp=self.q_header_stamp)
        )

    def plan_ahead(self, command: np.ndarray | None, actions: np.ndarray) -> list[Any]:
        """A trajectory robot's points after `command`: the policy's next actions turned into joint targets (each
        from the point before, where the arm is headed) and passed through the safety filter as it would pass
        them (stopping at the first it would not); none for a position-stream robot, a hold or no plan."""
        if (
            command is None
            or self.robot.command_type != "joint_trajectory"
            or self.safety.state is not SafetyState.ARMED
        ):
            return []
        plan: list[Any] = []
        with self.safety.previewing() as preview:
            before = command
            for action in actions:
                point = preview(self.io.joint_targets(before, action))
                if point is None:
                    break
                plan.append(point)
                before = point[0]
        return plan
