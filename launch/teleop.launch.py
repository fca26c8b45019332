"""Record teleoperated episodes of a robot (real or the sim robot) into a robotrl episode store.

    ros2 launch launch/teleop.launch.py robot:=franka_fr3 task:=PushT store:=data/fr3_pusht.zarr device:=spacemouse

Other parameters come from launch/params/teleop.yaml (`policy_topic` for human-in-the-loop interventions). The
node -- executable `robotrl-teleop`, that parameter file, the launch arguments as parameters -- is
`robotrl.hardware.nodes.NODES["teleop"]`.
"""

from robotrl.hardware.nodes import launch_description


def generate_launch_description():  # a launch.LaunchDescription
    return launch_description("teleop")
