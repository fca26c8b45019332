"""The sim robot node in lockstep, in-process over real Fast DDS: a subscriber that DDS matched after an observation
went out to nobody still hears it (once) while the sim waits for a command, and one matched in time hears it exactly
once -- the two halves of "a deploy node that starts just before an episode neither stalls the lockstep nor acts
twice on one observation"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String

from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.robot_file import RobotInit, run_init
from robotrl.hardware.sim_robot_node import STATUS_TOPIC, SimRobotNode, SimRobotNodeConfig
from ros_spin import spin_until

ROBOT = RobotConfig.load("sim_panda")


class Listener(Node):
    """Keeps every joint state and task state it hears, and the sim's last status."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.joint_states: list[JointState] = []
        self.states: list[Float64MultiArray] = []
        self.status: dict | None = None
        self.create_subscription(JointState, ROBOT.topics.joint_states, self.joint_states.append, 10)
        self.create_subscription(Float64MultiArray, ROBOT.topics.task_state, self.states.append, 10)
        self.create_subscription(String, STATUS_TOPIC, lambda m: setattr(self, "status", json.loads(m.data)), 10)


@pytest.fixture
def lockstep_sim(ros: None) -> Iterator[tuple[SimRobotNode, SingleThreadedExecutor]]:
    """No lockstep timeout within the test: only a command (none is sent) or the repeat can publish again."""
    sim = SimRobotNode(SimRobotNodeConfig(task="PushT", lockstep=True, lockstep_timeout=600.0))
    executor = SingleThreadedExecutor()
    executor.add_node(sim)
    try:
        yield sim, executor
    finally:
        executor.shutdown()
        sim.close()
        sim.destroy_node()


def test_a_late_subscriber_hears_the_waiting_observation_once(lockstep_sim: tuple) -> None:
    sim, executor = lockstep_sim
    executor.spin_once(timeout_sec=0.1)  # the start-up set went out before anyone listened
    late = Listener("late_listener")
    executor.add_node(late)
    assert spin_until(executor, lambda: late.joint_states and late.states, 10.0), (
        "a subscriber matched after the observation went out never heard it: a lockstep episode would stall"
    )
    spin_until(executor, lambda: False, 0.5)  # watchdog periods pass: nothing is repeated a second time
    assert len(late.joint_states) == 1 and len(late.states) == 1
    assert late.status is not None and late.status["step"] == 0  # nothing stepped the sim


def test_a_subscriber_matched_in_time_hears_each_observation_once(lockstep_sim: tuple) -> None:
    sim, executor = lockstep_sim
    first = Listener("first_listener")
    executor.add_node(first)
    assert spin_until(executor, lambda: first.joint_states and first.states, 10.0)
    sim.reset(seed=3)  # an episode starts with `first` matched on every topic
    assert spin_until(executor, lambda: len(first.joint_states) == 2 and len(first.states) == 2, 5.0)
    spin_until(executor, lambda: False, 0.5)  # watchdog periods pass while the sim waits for a command
    assert (len(first.joint_states), len(first.states)) == (2, 2)  # a lockstep deploy node would act once


def test_an_outside_env_takes_no_randomization_or_joint_noise(
    ros: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outside env has none of robotrl's randomization or joints: asking for them is one line, not a sim."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "envs"))
    task = "outside_envs:make_point"
    run_init(RobotInit(task=task, out=tmp_path / "point.yaml"))
    robot = str(tmp_path / "point.yaml")
    for options in ({"perturbation": "task"}, {"joint_noise": 0.01}):
        with pytest.raises(ValueError, match=r"SimRobotNodeConfig.perturbation/joint_noise: .* is an outside env"):
            SimRobotNode(SimRobotNodeConfig(robot=robot, task=task, **options))  # type: ignore[arg-type]
    sim = SimRobotNode(SimRobotNodeConfig(robot=robot, task=task))
    try:
        assert sim.sim.cameras == () and sim.image_pubs == {} and sim.sim.control_hz == 10.0
    finally:
        sim.close()
        sim.destroy_node()


def test_a_parameter_read_at_start_up_is_refused_when_set_later(ros: None) -> None:
    """A node's config is read once: `ros2 param set` of one of its parameters is refused, naming it (it used to
    report success and change nothing); the value stays what the node runs with."""
    from rclpy.parameter import Parameter

    node = SimRobotNode()  # its config from its ROS parameters, as the launch file starts it
    try:
        assert node.get_parameter("lockstep").value is False
        results = node.set_parameters([Parameter("lockstep", value=True), Parameter("seed", value=7)])
        assert [r.successful for r in results] == [False, False]
        assert "lockstep: read at start-up only; restart robotrl_sim_robot" in results[0].reason
        assert node.get_parameter("lockstep").value is False and node.config.lockstep is False
    finally:
        node.destroy_node()
