"""The robotrl ROS 2 nodes as the launch files start them: executable, node name, parameter file and the
parameters set from launch arguments. `launch/*.launch.py` build their launch_ros `Node`s from this table and
the tests start the same executables with the same files (`command`), so CI runs what a robot runs even though
`launch` itself cannot be installed from PyPI. The launch files and their parameter files ship in the package
(`robotrl.launch`'s package data: `launch_dir`), so an installed robotrl starts its nodes without a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def launch_dir() -> Path:
    """The launch files and their parameter files (params/), where robotrl is installed: `robotrl.launch`'s package
    data (in an editable checkout, the repository's launch/ folder, which pyproject maps there)."""
    from importlib.resources import files

    return Path(str(files("robotrl.launch")))


@dataclass(frozen=True)
class NodeSpec:
    executable: str
    """console script installed with robotrl (on PATH)"""
    name: str
    """ROS node name: the top-level key of its parameter file"""
    params: str
    """parameter file under the launch folder's params/ (`launch_dir`)"""
    arguments: Mapping[str, str]
    """launch argument -> its default; each sets the parameter of the same name"""

    @property
    def params_file(self) -> Path:
        return launch_dir() / "params" / self.params

    def command(self, overrides: Mapping[str, Any] | None = None) -> list[str]:
        """The command line the launch file's Node amounts to: the parameter file, then overrides."""
        cmd = [self.executable, "--ros-args", "--params-file", str(self.params_file)]
        for key, value in (overrides or {}).items():
            cmd += ["-p", f"{key}:={_ros_value(value)}"]
        return cmd


def _ros_value(value: Any) -> str:
    """`-p name:=value` parses value as YAML: strings are single-quoted so that JSON or numbers in them stay text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        return "'" + str(value).replace("'", "''") + "'"
    return str(value)


NODES: dict[str, NodeSpec] = {
    "deploy": NodeSpec("robotrl-deploy", "robotrl_deploy", "deploy.yaml", {"policy": "", "robot": "sim_panda"}),
    "sim_robot": NodeSpec(
        "robotrl-sim-robot",
        "robotrl_sim_robot",
        "sim_robot.yaml",
        {"robot": "sim_panda", "task": "PushT", "perturbation": "none"},
    ),
    "teleop": NodeSpec(
        "robotrl-teleop",
        "robotrl_teleop",
        "teleop.yaml",
        {"robot": "sim_panda", "task": "PushT", "store": "data/teleop.zarr", "device": "keyboard"},
    ),
}


def start(
    overrides: Mapping[str, Mapping[str, Any]], log_dir: Path, domain_id: int | None = None
) -> dict[str, subprocess.Popen]:
    """Start nodes as their launch files do (`NODES[key].command(params)` per key), each in its own process with
    its output in `log_dir/<key>.log`, optionally on a private DDS domain. The console scripts are looked up next
    to this interpreter first (a venv need not be activated)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, **({"ROS_DOMAIN_ID": str(domain_id)} if domain_id is not None else {})}
    procs = {}
    for key, params in overrides.items():
        with open(Path(log_dir) / f"{key}.log", "w") as log:
            procs[key] = subprocess.Popen(NODES[key].command(params), stdout=log, stderr=subprocess.STDOUT, env=env)
    return procs


def stop(procs: Mapping[str, subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGTERM each process (a clean rclpy shutdown), SIGKILL what is still running after `timeout`."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch_description(key: str) -> Any:
    """The launch description of node `key` (what `launch/<key>.launch.py` returns): one launch argument per
    entry of `arguments`, and a launch_ros `Node` running the installed executable (found on PATH, no ament
    package needed) with the parameter file, then the launch arguments as parameters. Needs a ROS 2 install
    (`launch`, `launch_ros`); robotrl itself never imports this function."""
    from launch.actions import DeclareLaunchArgument
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from launch import LaunchDescription

    spec = NODES[key]
    args = [DeclareLaunchArgument(name, default_value=default) for name, default in spec.arguments.items()]
    node = Node(
        executable=spec.executable,
        name=spec.name,
        output="screen",
        emulate_tty=True,
        parameters=[str(spec.params_file), {name: LaunchConfiguration(name) for name in spec.arguments}],
    )
    return LaunchDescription([*args, node])
