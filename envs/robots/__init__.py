"""Robots from description files (URDF, MJCF, `example-robot-data`) and the kinematics read from their compiled
MuJoCo models."""

from robotrl.envs.robots.description import (
    EXAMPLE_ROBOTS,
    JointsDescription,
    RobotDescription,
    RobotDescriptionError,
    load_joints,
    load_robot,
    load_spec,
    robot_spec,
)
from robotrl.envs.robots.kinematics import Chain, IKConfig

__all__ = [
    "EXAMPLE_ROBOTS",
    "Chain",
    "IKConfig",
    "JointsDescription",
    "RobotDescription",
    "RobotDescriptionError",
    "load_joints",
    "load_robot",
    "load_spec",
    "robot_spec",
]
