"""The ROS 2 launch files (`*.launch.py`) and their parameter files (`params/*.yaml`), installed as package data of
`robotrl.launch` so that an installed robotrl finds them (`robotrl.hardware.nodes.launch_dir`); nothing here is
imported to run a node."""
