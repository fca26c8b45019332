"""Deploy an exported robotrl policy on a robot, behind the safety filter.

    ros2 launch launch/deploy.launch.py policy:=/path/to/export robot:=franka_fr3

`robot` is a bundled robot (hardware/robots/<name>.yaml) or a path to a robot file; the other parameters
come from launch/params/deploy.yaml. The node -- executable `robotrl-deploy`, that parameter file, the launch
arguments as parameters -- is `robotrl.hardware.nodes.NODES["deploy"]`, which the tests start the same way.
"""

from robotrl.hardware.nodes import launch_description


def generate_launch_description():  # a launch.LaunchDescription
    return launch_description("deploy")
