"""The `ros` extra installs a working rclpy over real DDS (Fast DDS); the hardware layer builds on it."""

import time

import pytest
import rclpy  # a hard import: CI installs the extra, a missing one must fail
from sensor_msgs.msg import JointState


def test_joint_state_round_trip_over_dds():
    rclpy.init()
    try:
        node = rclpy.create_node("robotrl_extra_check")
        got: list[JointState] = []
        node.create_subscription(JointState, "/robotrl_test/joint_states", got.append, 10)
        pub = node.create_publisher(JointState, "/robotrl_test/joint_states", 10)
        msg = JointState(name=["joint1", "joint2"], position=[0.1, -0.2])
        deadline = time.monotonic() + 10.0
        while not got and time.monotonic() < deadline:
            pub.publish(msg)
            rclpy.spin_once(node, timeout_sec=0.05)
        assert got, "no JointState came back over DDS within 10 s"
        assert list(got[0].name) == ["joint1", "joint2"]
        assert list(got[0].position) == pytest.approx([0.1, -0.2])
        node.destroy_node()
    finally:
        rclpy.shutdown()
