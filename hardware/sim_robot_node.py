"""`robotrl-sim-robot`: the MuJoCo sim robot (`SimRobot`) behind the topics a real arm's driver and a cell's
perception offer, so that the deploy node runs against it unchanged.

    robotrl-sim-robot --ros-args -p robot:=sim_panda -p task:=PushT -p perturbation:=task

Publishes the robot's joint states, the task state (`Float64MultiArray`, the task's "state" observation; or,
where the robot file names the task's objects, each object's `geometry_msgs/PoseStamped` and the goal's), the
cameras (`sensor_msgs/Image`, rgb8) and, for a task with instructions (PickPlace), the episode's instruction
(`std_msgs/String`, what an operator would say) once per control step, and the episode's status on `/robotrl/sim/status`
(`std_msgs/String`, JSON: episode, step, success, reward, terminated, truncated); takes commands as the robot's
file says (`Float64MultiArray`, or `JointTrajectory` followed point by point on its times, as a
JointTrajectoryController does). A finished episode ignores commands until the next reset:
`~/reset` (std_srvs/Trigger, the next episode of the seeded stream) or `/robotrl/sim/reset` (std_msgs/Int64:
that seed).

Real time (default): a timer steps the physics every control period with the newest command that is due.
Lockstep (`lockstep:=true`): one step per command, taken as soon as the command arrives (or after
`lockstep_timeout` with the last target; while it waits it repeats its status every period, and the observation
on any topic that DDS matched to a subscriber since it went out, which that subscriber missed, once the match has
settled): the sim then runs
exactly as the in-process evaluation does, as fast as the policy answers -- for comparing success over ROS 2 with
`robotrl policy eval`.

A floating-base robot (`robot:=sim_quadruped -p task:=Quadruped`) also publishes its IMU (`sensor_msgs/Imu`) and
odometry (`nav_msgs/Odometry`, the twist in the base frame) and takes the damping mode (`std_msgs/Bool`, its safe
stop); its velocity command is the episode's, drawn at reset as in training and published on /cmd_vel with every
step (`cmd_vel:=publish`: the sim stands in for the operator), or taken from /cmd_vel (`cmd_vel:=subscribe`: a
joystick or a planner drives it).

An outside env (`task:=gym:<id>` or `module:callable`) is hosted as it is (`SimEnv`): its robot file
(`robotrl robot init --task <env>`) names one command per action dimension, the commands are its actions, the
joint states echo the action being applied and the task state is its observation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geometry_msgs.msg import PoseStamped, Twist
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.publisher import Publisher
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, Imu, JointState
from std_msgs.msg import Bool, Float64MultiArray, Int64, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robotrl.hardware.messages import (
    MalformedMessage,
    array_to_image,
    arrays_to_joint_state,
    float_array_to_msg,
    imu_msg,
    msg_to_float_array,
    odometry_msg,
    pose_stamped,
    seconds_to_stamp,
    trajectory_points,
    twist_msg,
    twist_to_command,
)
from robotrl.hardware.objects import check_named
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.ros import declare_config, json_object, spin_node
from robotrl.hardware.sim_env import SimEnv, SimEnvConfig
from robotrl.hardware.sim_robot import SimRobot, SimRobotConfig

STATUS_TOPIC = "/robotrl/sim/status"
RESET_TOPIC = "/robotrl/sim/reset"
PERTURBATIONS = ("none", "task")
CMD_VEL = ("publish", "subscribe")
#: seconds a subscriber must have been matched before the waiting observation set is repeated to it: DDS matches the
#: two ends one after the other, and a message sent when only the publisher's end had matched was lost (a lockstep
#: sim then waited its whole `lockstep_timeout` for a command)
REPEAT_SETTLE_S = 2.0
#: the simulated time at start-up (`clock:=true`), seconds
SIM_EPOCH = 1.0


@dataclass
class SimRobotNodeConfig:
    robot: str = "sim_panda"
    """a bundled robot or a path to a robot file (the task's arm, or an outside env's commands)"""
    task: str = "PushT"
    """a robotrl task, or an outside env (gym:<id> or module:callable) hosted as it is"""
    task_options: str = "{}"
    """JSON object of task config fields, e.g. {"images": true}"""
    seed: int = 0
    perturbation: str = "none"
    """'none' (nominal dynamics) or 'task' (one fixed draw of the task's sim-to-real randomization: the twin)"""
    joint_noise: float = 0.0
    """std (rad) of the joint-encoder noise"""
    command_latency: float = 0.0
    """seconds from a command's arrival to its application"""
    lockstep: bool = False
    """one physics step per command instead of real time"""
    lockstep_timeout: float = 1.0
    clock: bool = False
    """publish the simulated time on /clock (rosgraph_msgs/Clock) and stamp every message with it, so that nodes
    run with `use_sim_time:=true` judge stamps by the simulation (in lockstep it waits, and so does its time)"""
    cmd_vel: str = "publish"
    """a floating base's velocity command: 'publish' (the episode's, drawn at reset, sent on /cmd_vel with every
    step) or 'subscribe' (taken from /cmd_vel)"""

    def __post_init__(self) -> None:
        if self.cmd_vel not in CMD_VEL:
            raise ValueError(f"SimRobotNodeConfig.cmd_vel: expected one of {CMD_VEL}, got {self.cmd_vel!r}")
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(
                f"SimRobotNodeConfig.perturbation: expected one of {PERTURBATIONS}, got {self.perturbation!r}"
            )
        json_object(self.task_options, "SimRobotNodeConfig.task_options")


class SimRobotNode(Node):
    def __init__(self, config: SimRobotNodeConfig | None = None) -> None:
        super().__init__("robotrl_sim_robot")
        cfg = self.config = config or declare_config(self, SimRobotNodeConfig)
        from robotrl.envs import is_outside, make_task

        self.robot = RobotConfig.load(cfg.robot)
        options = json_object(cfg.task_options, "task_options")
        self.sim: SimRobot | SimEnv
        if is_outside(cfg.task):
            if cfg.perturbation != "none" or cfg.joint_noise:
                raise ValueError(
                    f"SimRobotNodeConfig.perturbation/joint_noise: {cfg.task} is an outside env, which has no "
                    f"randomization or joints of robotrl's; expected 'none' and 0, got {cfg.perturbation!r} and "
                    f"{cfg.joint_noise}"
                )
            self.sim = SimEnv(SimEnvConfig(cfg.task, options, cfg.seed, cfg.command_latency), self.robot)
        else:
            perturbation = (
                make_task(cfg.task, **options).default_randomization() if cfg.perturbation == "task" else None
            )
            self.sim = SimRobot(
                SimRobotConfig(cfg.task, options, cfg.seed, perturbation, cfg.joint_noise, cfg.command_latency),
                self.robot,
            )
        self.episode, self.malformed = 0, 0
        self.done = False
        self.awaiting_since = time.monotonic()
        # the last observation set: (topic, message, matched then); topics unmatched then: when a subscriber appeared
        self.sent: list[tuple[Publisher, Any, bool]] = []
        self.appeared: dict[int, float] = {}
        t = self.robot.topics
        self.js_pub = self.create_publisher(JointState, t.joint_states, 10)
        self.state_pub = self.create_publisher(Float64MultiArray, t.task_state, 10)
        #: the objects' poses and the goal's instead of the state vector, where the robot file names the objects
        self.pose_pubs: dict[str, Publisher] = {}
        self.goal_pub: Publisher | None = None
        self.poses = t.objects is not None and isinstance(self.sim, SimRobot) and self.robot.base is None
        if self.poses:
            assert isinstance(self.sim, SimRobot) and t.objects is not None
            check_named(self.sim.objects, t.objects, self.robot.name, cfg.task)
            self.pose_pubs = {k: self.create_publisher(PoseStamped, t.objects[k], 10) for k in self.sim.objects.names}
            if self.sim.goal_pose() is not None:
                self.goal_pub = self.create_publisher(PoseStamped, t.goal, 10)
        self.image_pubs = {
            f"image_{c}": self.create_publisher(Image, t.images.get(f"image_{c}", f"/camera/{c}/image_raw"), 10)
            for c in self.sim.cameras
        }
        self.status_pub = self.create_publisher(String, STATUS_TOPIC, 10)
        self.clock_pub = self.create_publisher(Clock, "/clock", 10) if cfg.clock else None
        self.sim_time = SIM_EPOCH  # seconds of simulated time (a zero stamp means "unstamped")
        self.instruction_pub = self.create_publisher(String, t.instruction, 10)
        self.base_pubs: tuple[Publisher, Publisher, Publisher | None] | None = None
        if self.robot.base is not None and isinstance(self.sim, SimRobot):
            publish = cfg.cmd_vel == "publish"
            self.base_pubs = (
                self.create_publisher(Imu, t.imu, 10),
                self.create_publisher(Odometry, t.odometry, 10),
                self.create_publisher(Twist, t.cmd_vel, 10) if publish else None,
            )
            if not publish:
                self.create_subscription(Twist, t.cmd_vel, self._on_cmd_vel, 10)
            self.create_subscription(Bool, t.damping, self._on_damping, 10)
        if self.robot.command_type == "joint_trajectory":
            self.create_subscription(JointTrajectory, t.command, self._on_trajectory, 10)
        else:
            self.create_subscription(Float64MultiArray, t.command, self._on_array, 10)
        self.create_subscription(Int64, RESET_TOPIC, lambda m: self.reset(int(m.data)), 10)
        self.create_service(Trigger, "~/reset", self._srv_reset)
        period = 1.0 / self.sim.control_hz
        self.create_timer(period, self._lockstep_watchdog if cfg.lockstep else self._tick)
        self.get_logger().info(
            f"sim robot {self.robot.name}: {cfg.task}, {self.sim.control_hz:g} Hz, "
            f"{'lockstep' if cfg.lockstep else 'real time'}, perturbation {cfg.perturbation}"
        )
        self.publish()

    # --- commands -----------------------------------------------------------------------------------
    def _on_array(self, msg: Float64MultiArray) -> None:
        try:
            q = msg_to_float_array(msg, expected_size=self.robot.dof).reshape(-1)
        except MalformedMessage as e:
            return self._bad(e)
        self._command(lambda now: self.sim.command(q, now))

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        """A JointTrajectoryController's way: the sim follows the points on their times (`SimRobot.follow`)."""
        try:
            points = trajectory_points(msg, self.robot.joint_names)
        except MalformedMessage as e:
            return self._bad(e)
        sim = self.sim
        if isinstance(sim, SimRobot):
            self._command(lambda now: sim.follow(points, now))
        else:  # an outside env steps on one action
            self._command(lambda now: sim.command(points[-1][1], now))

    def _on_cmd_vel(self, msg: Twist) -> None:
        try:
            self.sim.set_goal(twist_to_command(msg))  # type: ignore[union-attr]
        except MalformedMessage as e:
            self._bad(e)

    def _on_damping(self, msg: Bool) -> None:
        assert isinstance(self.sim, SimRobot)
        if bool(msg.data) != self.sim.damping:
            self.sim.damp(bool(msg.data))
            self.get_logger().warning(f"damping {'on' if msg.data else 'off'}")

    def _bad(self, error: Exception) -> None:
        self.malformed += 1
        self.get_logger().warning(f"malformed command (#{self.malformed}): {error}", throttle_duration_sec=1.0)

    def _command(self, take: Callable[[float], None]) -> None:
        """Hand a command to the sim (`take(now)`) unless its episode is over; in lockstep, step on it."""
        if self.done:
            return
        now = time.monotonic()
        take(now)
        if self.config.lockstep:
            self._step(now + self.sim.latency)

    # --- stepping -----------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self.done:
            self._publish_status()  # a finished episode keeps saying so, for whoever starts listening now
        else:
            self._step(time.monotonic())

    def _lockstep_watchdog(self) -> None:
        if not self.done and time.monotonic() - self.awaiting_since > self.config.lockstep_timeout:
            self._step(time.monotonic())
        else:  # waiting for a command (or finished): whoever starts listening now hears where the sim stands
            if not self.done:
                self._repeat_to_new_subscribers()
            self._publish_status()

    def _repeat_to_new_subscribers(self) -> None:
        """A deploy node that started just before the reset may match a topic after its message went out: without
        the repeat it never completes the observation set and a lockstep sim waits for a command that never comes.
        Only topics unmatched at publication are repeated, once, so no subscriber hears an observation twice; and
        only `REPEAT_SETTLE_S` after their subscriber appeared, so that DDS has matched both ends."""
        now = time.monotonic()
        for i, (pub, msg, matched) in enumerate(self.sent):
            if matched or pub.get_subscription_count() == 0:
                continue
            if now - self.appeared.setdefault(i, now) >= REPEAT_SETTLE_S:
                pub.publish(msg)
                self.sent[i] = (pub, msg, True)

    def _step(self, now: float) -> None:
        self.sim.step(now)
        self.sim_time += 1.0 / self.sim.control_hz
        status = self.sim.status()
        self.done = bool(status["terminated"] or status["truncated"])
        self.publish()

    def publish(self) -> None:
        # render first, then publish the whole set back to back: a frame rendered between the joint state and the
        # images made the joint state look up to a render older on arrival (a deploy node drops stale sets)
        obs = self.sim.observation()
        if self.clock_pub is not None:
            stamp = seconds_to_stamp(self.sim_time)
            self.clock_pub.publish(Clock(clock=stamp))
        else:
            stamp = self.get_clock().now().to_msg()
        q, dq = self.sim.joint_state()
        messages: list[tuple[Publisher, Any]] = [
            (self.js_pub, arrays_to_joint_state(self.robot.joint_names, q, dq, stamp=stamp))
        ]
        if "instruction" in obs:
            messages.append((self.instruction_pub, String(data=str(obs["instruction"]))))
        messages += [(pub, array_to_image(obs[key], stamp=stamp, frame_id=key)) for key, pub in self.image_pubs.items()]
        if self.poses:
            assert isinstance(self.sim, SimRobot)
            if self.goal_pub is not None:  # a task whose goal is a pose (checked at start-up)
                goal = self.sim.goal_pose()
                assert goal is not None
                messages.append((self.goal_pub, pose_stamped(*goal, stamp=stamp)))
            poses = self.sim.object_poses()
            messages += [(pub, pose_stamped(*poses[k], stamp=stamp)) for k, pub in self.pose_pubs.items()]
        elif "state" in obs:
            messages.append((self.state_pub, float_array_to_msg(obs["state"])))
        if self.base_pubs is not None:
            assert isinstance(self.sim, SimRobot)
            reading = self.sim.base_reading()
            imu_pub, odom_pub, cmd_pub = self.base_pubs
            messages += [(imu_pub, imu_msg(reading, stamp=stamp)), (odom_pub, odometry_msg(reading, stamp=stamp))]
            if cmd_pub is not None:
                messages.append((cmd_pub, twist_msg(self.sim.goal)))
        self.sent = [(pub, msg, pub.get_subscription_count() > 0) for pub, msg in messages]
        self.appeared = {}
        for pub, msg in messages:
            pub.publish(msg)
        self._publish_status()
        self.awaiting_since = time.monotonic()

    def _publish_status(self) -> None:
        status = {"episode": self.episode, **{k: _plain(v) for k, v in self.sim.status().items()}}
        self.status_pub.publish(String(data=json.dumps(status)))

    def reset(self, seed: int | None = None) -> None:
        self.sim.reset(seed)
        self.episode += 1
        self.done = False
        self.publish()

    def _srv_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.reset()
        response.success, response.message = True, f"episode {self.episode}"
        return response

    def close(self) -> None:
        self.sim.close()


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def main(args: list[str] | None = None) -> int:
    return spin_node(SimRobotNode, args)
