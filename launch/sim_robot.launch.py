"""The MuJoCo sim robot on the topics a real arm offers (joint states, task state, cameras; commands in).

    ros2 launch launch/sim_robot.launch.py task:=PushT perturbation:=task     # the perturbed "real twin"

Other parameters come from launch/params/sim_robot.yaml. The node -- executable `robotrl-sim-robot`, that
parameter file, the launch arguments as parameters -- is `robotrl.hardware.nodes.NODES["sim_robot"]`, which
the tests start the same way.
"""

from robotrl.hardware.nodes import launch_description


def generate_launch_description():  # a launch.LaunchDescription
    return launch_description("sim_robot")
