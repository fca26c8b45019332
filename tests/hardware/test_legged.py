"""A legged robot over ROS 2 (issue 43): the Quadruped's robot file, its IMU / odometry / velocity-command messages,
the observation the deploy node makes from them (the task's own `observe`, to the bit), and leg safety -- a fall or
an overspeed e-stops it, and its e-stop is the driver's damping mode."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from geometry_msgs.msg import Twist
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Bool, Float64MultiArray
from std_srvs.srv import Trigger

from robotrl.envs import make_task
from robotrl.envs.tasks.quadruped import DEFAULT_QPOS
from robotrl.hardware.deploy import DeployConfig, DeployNode
from robotrl.hardware.floating_base import BaseReading
from robotrl.hardware.messages import (
    MalformedMessage,
    arrays_to_joint_state,
    imu_msg,
    imu_to_arrays,
    odometry_msg,
    odometry_to_arrays,
    twist_msg,
    twist_to_command,
)
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig, RobotConfigError
from robotrl.hardware.safety import SafetyFilter, SafetyState
from robotrl.hardware.sim_robot import SimRobot, SimRobotConfig
from robotrl.hardware.task_io import TaskIO
from ros_spin import in_one_executor, spin_for, spin_until

ROBOT = RobotConfig.load("sim_quadruped")
LEVEL = np.array([1.0, 0.0, 0.0, 0.0])


def reading(orientation: np.ndarray = LEVEL, height: float = 0.3) -> BaseReading:
    return BaseReading(np.array([0.0, 0.0, height]), orientation, np.zeros(3), np.zeros(3), np.zeros(3))


def tilted(angle: float) -> np.ndarray:
    """A base rolled by `angle` rad about its x axis."""
    return np.array([np.cos(angle / 2), np.sin(angle / 2), 0.0, 0.0])


def test_the_quadruped_robot_file_is_the_tasks_robot() -> None:
    task = make_task("Quadruped")
    assert ROBOT.joint_names == task.joint_names() and ROBOT.base is not None
    assert ROBOT.control_hz == task.control_hz
    lo, hi = ROBOT.lower(), ROBOT.upper()
    ranges = np.array([task.model.joint(n).range for n in ROBOT.joint_names])
    np.testing.assert_array_equal(np.stack([lo, hi], 1), ranges)
    assert ROBOT.base.max_tilt == task.config.max_tilt and ROBOT.base.min_height == task.config.min_height
    assert np.isinf(ROBOT.limits.acceleration).all()  # PD set-points: bounded by position and measured speed


def test_a_broken_base_section_is_refused_in_one_line(tmp_path: Path) -> None:
    data = yaml.safe_load((ROBOTS_DIR / "sim_quadruped.yaml").read_text())
    for base, message in [
        ({"max_tilt": 1.0, "min_height": 0.15}, r"base: missing field\(s\) \['damping'\]"),
        ({"max_tilt": 4.0, "min_height": 0.15, "damping": 1.0}, r"base: expected 0 < max_tilt < pi"),
        ({"max_tilt": 1.0, "min_height": 0.15, "damping": 1.0, "kd": 1}, r"base: unknown field\(s\) \['kd'\]"),
    ]:
        path = tmp_path / "q.yaml"
        path.write_text(yaml.safe_dump({**data, "base": base}))
        with pytest.raises(RobotConfigError, match=message) as info:
            RobotConfig.load(path)
        assert "\n" not in str(info.value)
    # a legged task on a robot file without a base section: refused, naming it
    with pytest.raises(ValueError, match=r"robot.base: task 'Quadruped' has a floating base; expected a robot file"):
        no_base = tmp_path / "nobase.yaml"
        no_base.write_text(
            yaml.safe_dump(
                {k: v for k, v in data.items() if k != "base"}
                | {"limits": {**data["limits"], "acceleration": [10.0] * 12}}
            )
        )
        SimRobot(SimRobotConfig(task="Quadruped"), RobotConfig.load(no_base))


def test_imu_odometry_and_twist_messages_round_trip_and_refuse_garbage() -> None:
    r = BaseReading(
        np.array([0.1, -0.2, 0.3]), tilted(0.3), np.array([0.5, -0.1, 0.02]), np.array([0.1, 0.2, -0.3]),
        np.array([0.0, 0.0, 9.81]),
    )  # fmt: skip
    quat, gyro, accel = imu_to_arrays(imu_msg(r))
    np.testing.assert_array_equal(quat, r.orientation)  # ROS's (x, y, z, w) back to MuJoCo's (w, x, y, z)
    np.testing.assert_array_equal(gyro, r.angular_velocity)
    np.testing.assert_array_equal(accel, r.linear_acceleration)
    position, velocity = odometry_to_arrays(odometry_msg(r))
    np.testing.assert_array_equal(position, r.position)
    np.testing.assert_array_equal(velocity, r.linear_velocity)
    np.testing.assert_array_equal(twist_to_command(twist_msg(np.array([0.4, -0.2, 0.7]))), [0.4, -0.2, 0.7])
    unknown = Imu()
    unknown.orientation.w = 0.0  # an IMU without an orientation estimate sends zeros
    with pytest.raises(MalformedMessage, match=r"Imu.orientation: expected a unit quaternion, got norm 0"):
        imu_to_arrays(unknown)
    bad = Twist()
    bad.linear.x = float("nan")
    with pytest.raises(MalformedMessage, match=r"Twist.linear.x, linear.y, angular.z: expected finite values"):
        twist_to_command(bad)
    odom = Odometry()
    odom.pose.pose.position.z = float("inf")
    with pytest.raises(MalformedMessage, match=r"Odometry.pose.pose.position: expected finite values"):
        odometry_to_arrays(odom)


def test_the_observation_made_from_the_robots_messages_is_the_simulators_to_the_bit() -> None:
    """Joint states + IMU + odometry + velocity command, through the messages and the task's own `observe`, give
    the policy exactly what the simulator's observation gives it, step after step of a random gait."""
    sim = SimRobot(SimRobotConfig(task="Quadruped", seed=3), ROBOT)
    io = TaskIO(make_task("Quadruped").spec(), ROBOT)
    rng = np.random.default_rng(0)
    for step in range(40):
        q, dq = sim.joint_state()
        r = sim.base_reading()
        (quat, gyro, accel), (position, velocity) = imu_to_arrays(imu_msg(r)), odometry_to_arrays(odometry_msg(r))
        wire = BaseReading(position, quat, velocity, gyro, accel)
        command = twist_to_command(twist_msg(sim.goal))
        np.testing.assert_array_equal(io.base_observation(q, dq, wire, command)["state"], sim.observation()["state"])
        now = step / sim.control_hz
        sim.command(io.joint_targets(q, rng.uniform(-1, 1, 12)), now)
        sim.step(now)
    # the command is the policy's input: another one changes the observation's command field, nothing else
    state = io.base_observation(q, dq, wire, np.array([0.9, 0.0, 0.0]))["state"]
    field = io.fields["command"]
    np.testing.assert_array_equal(state[field], np.float32([0.9, 0.0, 0.0]))


def test_a_fall_or_an_overspeed_estops_and_targets_are_only_position_clipped() -> None:
    safety = SafetyFilter(ROBOT)
    safety.observe(DEFAULT_QPOS, 0.0, np.zeros(12))
    safety.observe_base(reading())
    far = DEFAULT_QPOS + 0.7  # a PD set-point far from the pose: taken as it is, clipped to the position limits
    out = safety.step(far, 0.0)
    np.testing.assert_array_equal(out, np.clip(far, ROBOT.lower(), ROBOT.upper()))
    safety.observe_base(reading(tilted(0.9)))
    assert safety.state is SafetyState.ARMED
    safety.observe_base(reading(tilted(1.1)))  # past max_tilt (1.0 rad)
    assert safety.state is SafetyState.ESTOPPED and safety.estop_reason.startswith("fall: tilt 1.10 rad > 1")
    assert safety.step(DEFAULT_QPOS, 0.02) is None  # nothing reaches the wire: the node publishes damping
    assert safety.reset(0.02)[0] and safety.state is SafetyState.ARMED
    safety.observe_base(reading(height=0.1))
    assert safety.estop_reason == "fall: height 0.100 m < 0.15" and safety.counters["falls"] == 2
    safety.reset(0.02)
    speed = np.zeros(12)
    speed[2] = -25.0  # FL_knee past its 20.1 rad/s
    safety.observe(DEFAULT_QPOS, 0.04, speed)
    assert safety.estop_reason == "joint speed: FL_knee at -25.0 rad/s, limit 20.1"
    assert safety.counters["overspeed"] == 1 and safety.counters["estops"] == 3


def test_the_sim_robots_damping_mode_lets_it_fold_and_a_reset_restores_position_control() -> None:
    sim = SimRobot(SimRobotConfig(task="Quadruped"), ROBOT)
    for step in range(25):
        sim.command(DEFAULT_QPOS, step * 0.02)
        sim.step(step * 0.02)
    standing = sim.base_reading().position[2]
    sim.damp(True)
    for step in range(25, 75):
        sim.command(DEFAULT_QPOS, step * 0.02)  # position targets are ignored by the unpowered motors
        sim.step(step * 0.02)
    assert sim.base_reading().position[2] < standing - 0.1 and sim.status()["terminated"]
    sim.reset()
    assert not sim.damping
    for step in range(25):
        sim.command(DEFAULT_QPOS, step * 0.02)
        sim.step(step * 0.02)
    assert abs(sim.base_reading().position[2] - standing) < 0.02


class LeggedRobot(Node):
    """The harness: a quadruped's driver and state estimator (joint states, IMU, odometry), an operator's
    /cmd_vel, and a recorder of commands and of the damping mode."""

    def __init__(self) -> None:
        super().__init__("legged_harness")
        t = ROBOT.topics
        self.js = self.create_publisher(JointState, t.joint_states, 10)
        self.imu = self.create_publisher(Imu, t.imu, 10)
        self.odom = self.create_publisher(Odometry, t.odometry, 10)
        self.cmd = self.create_publisher(Twist, t.cmd_vel, 10)
        self.estop = self.create_publisher(Bool, t.estop, 10)
        self.commands: list[np.ndarray] = []
        self.damping: list[bool] = []
        self.create_subscription(Float64MultiArray, t.command, lambda m: self.commands.append(np.array(m.data)), 10)
        self.create_subscription(Bool, t.damping, lambda m: self.damping.append(bool(m.data)), 10)
        self.base = reading()

    def publish(self) -> None:
        self.js.publish(arrays_to_joint_state(ROBOT.joint_names, DEFAULT_QPOS, np.zeros(12)))
        self.imu.publish(imu_msg(self.base))
        self.odom.publish(odometry_msg(self.base))


@pytest.fixture
def legged(
    ros: None, quadruped_export: tuple[Path, dict]
) -> Iterator[tuple[DeployNode, LeggedRobot, SingleThreadedExecutor]]:
    deploy, robot = DeployNode(DeployConfig(policy=str(quadruped_export[0]), robot="sim_quadruped")), LeggedRobot()
    with in_one_executor(deploy, robot) as executor:
        yield deploy, robot, executor


def test_the_deploy_node_walks_on_cmd_vel_and_damps_on_a_fall_or_an_estop(legged: Any) -> None:
    deploy, robot, executor = legged
    spin_for(executor, 0.6, robot.publish)
    assert len(robot.commands) >= 10 and not robot.damping, deploy.safety.status()
    assert all(np.all(c >= ROBOT.lower()) and np.all(c <= ROBOT.upper()) for c in robot.commands)
    # the command input is /cmd_vel's newest twist, and zero once it is older than base.cmd_vel_timeout
    now = time.monotonic()
    assert np.array_equal(deploy.velocity_command(now), np.zeros(3))
    robot.cmd.publish(twist_msg(np.array([0.5, 0.0, 0.3])))
    spin_for(executor, 0.1, robot.publish)
    np.testing.assert_array_equal(deploy.velocity_command(time.monotonic()), [0.5, 0.0, 0.3])
    obs = deploy.observation(time.monotonic())
    assert obs is not None and np.array_equal(obs["state"][deploy.io.fields["command"]], np.float32([0.5, 0, 0.3]))
    assert np.array_equal(deploy.velocity_command(time.monotonic() + 0.6), np.zeros(3))
    # it tips over: damping within a period, and no position command after
    robot.base = reading(tilted(1.3))
    spin_for(executor, 0.1, robot.publish)
    n = len(robot.commands)
    spin_for(executor, 0.3, robot.publish)
    assert deploy.safety.state is SafetyState.ESTOPPED and deploy.safety.estop_reason.startswith("fall: tilt 1.30")
    assert robot.damping and all(robot.damping) and len(robot.commands) == n
    # stood up again and re-armed: position control (damping off), commands flow
    robot.base = reading()
    spin_for(executor, 0.3, robot.publish)  # up again: the e-stop holds (latched) until the reset
    assert deploy.safety.state is SafetyState.ESTOPPED and len(robot.commands) == n
    client = robot.create_client(Trigger, "/robotrl_deploy/reset")
    assert client.wait_for_service(timeout_sec=5.0)
    future = client.call_async(Trigger.Request())
    assert spin_until(executor, future.done, 10.0, robot.publish), "~/reset did not answer"
    assert future.result().success, future.result()
    spin_for(executor, 0.3, robot.publish)
    assert robot.damping[-1] is False and len(robot.commands) > n
    # the e-stop of a legged robot is damping too, not a frozen posture
    robot.estop.publish(Bool(data=True))
    spin_for(executor, 0.2, robot.publish)
    n = len(robot.commands)
    spin_for(executor, 0.3, robot.publish)
    assert robot.damping[-1] is True and len(robot.commands) == n and deploy.safety.counters["estops"] == 2


def test_go2_loads_from_its_urdf_and_robot_init_writes_a_legged_file(tmp_path: Path) -> None:
    """A real legged robot from example-robot-data: its joints and position limits are read from its URDF (no end
    effector: every joint), and `robotrl robot init --legged` writes the file the nodes read."""
    from robotrl.envs.robots import load_joints
    from robotrl.hardware.robot_file import RobotInit, run_init

    go2 = RobotConfig.load("go2")
    urdf = load_joints("example-robot-data:go2")
    assert go2.joint_names == urdf.joint_names and len(go2.joint_names) == 12 and go2.base is not None
    assert go2.joint_names[:3] == ("FL_hip_joint", "FL_thigh_joint", "FL_calf_joint")
    assert (go2.lower()[2], go2.upper()[2]) == pytest.approx((-2.7227, -0.83776))  # the URDF's calf limits
    run_init(RobotInit(model="example-robot-data:go2", legged=True, out=tmp_path / "go2.yaml"))
    written = RobotConfig.load(tmp_path / "go2.yaml")
    assert written.joint_names == go2.joint_names and written.limits == go2.limits and written.base is not None
    assert written.limits.velocity[:3] == (30.1, 30.1, 15.7)  # the URDF's <limit velocity>
    data = yaml.safe_load((tmp_path / "go2.yaml").read_text())
    data["workspace"] = {"lower": [0, 0, 0], "upper": [1, 1, 1]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(RobotConfigError, match=r"workspace: a floating base has no end-effector box; expected none"):
        RobotConfig.load(tmp_path / "bad.yaml")


def test_the_sim_robot_node_in_real_time_offers_imu_odometry_and_the_command_and_takes_damping(ros: None) -> None:
    """The Quadruped's sim robot in real time: joint states, IMU and odometry of its base every period, the
    episode's velocity command on /cmd_vel; a True on the damping topic unpowers its motors, a False powers them."""
    from robotrl.hardware.sim_robot_node import SimRobotNode, SimRobotNodeConfig
    from ros_spin import spin_until

    sim = SimRobotNode(SimRobotNodeConfig(robot="sim_quadruped", task="Quadruped"))
    heard: dict[str, list[Any]] = {"imu": [], "odom": [], "cmd": [], "js": []}
    listener = Node("legged_listener")
    t = ROBOT.topics
    for key, kind, topic in (
        ("imu", Imu, t.imu), ("odom", Odometry, t.odometry), ("cmd", Twist, t.cmd_vel), ("js", JointState, t.joint_states)
    ):  # fmt: skip
        listener.create_subscription(kind, topic, heard[key].append, 10)
    damping = listener.create_publisher(Bool, t.damping, 10)
    with in_one_executor(sim, listener) as executor:
        assert spin_until(executor, lambda: all(len(v) >= 5 for v in heard.values()), 10.0), {
            k: len(v) for k, v in heard.items()
        }
        assert isinstance(sim.sim, SimRobot)
        np.testing.assert_array_equal(twist_to_command(heard["cmd"][-1]), sim.sim.goal)
        imu_to_arrays(heard["imu"][-1])  # well formed: a unit orientation, finite rates
        assert odometry_to_arrays(heard["odom"][-1])[0][2] > ROBOT.base.min_height  # standing  # type: ignore[union-attr]
        assert spin_until(executor, lambda: sim.sim.damping, 5.0, lambda: damping.publish(Bool(data=True)))
        assert spin_until(executor, lambda: not sim.sim.damping, 5.0, lambda: damping.publish(Bool(data=False)))
