"""What every robotrl ROS 2 node shares: its dataclass config read from ROS parameters (so the launch files'
parameter files, `--ros-args -p name:=value` and the Python API are one thing), and a main that spins the node
until Ctrl-C or SIGTERM and shuts rclpy down cleanly."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter

C = TypeVar("C")


def declare_config(node: Node, cls: type[C]) -> C:
    """Declare one ROS parameter per field of the dataclass `cls` (its default as the parameter's default) and
    build the config from the values the node was started with. A value of the wrong type is refused by rclpy
    naming the parameter; the dataclass's own checks name the field. The config is read once, at start-up: a later
    `ros2 param set` of one of its parameters is refused, saying so, rather than reported as a success that
    changes nothing."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]  # no field lacks both
        ros_default = str(default) if isinstance(default, Path) else default
        value = node.declare_parameter(f.name, ros_default).value
        values[f.name] = Path(value) if isinstance(default, Path) else value
    fixed = set(values)

    def refuse(parameters: list[Parameter]) -> SetParametersResult:
        read_once = sorted(p.name for p in parameters if p.name in fixed)
        if not read_once:
            return SetParametersResult(successful=True)
        return SetParametersResult(
            successful=False,
            reason=f"{', '.join(read_once)}: read at start-up only; restart {node.get_name()} with the new value",
        )

    node.add_on_set_parameters_callback(refuse)
    return cls(**values)


def json_object(text: str, where: str) -> dict[str, Any]:
    """A ROS string parameter that holds a JSON object (task or device options), or a ValueError naming it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: expected a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {text!r}")
    return value


def spin_node(
    make: Callable[[], Node], args: Sequence[str] | None = None, finished: Callable[[Any], bool] | None = None
) -> int:
    """rclpy.init, build the node, spin until Ctrl-C / SIGTERM (or until `finished(node)`), close and destroy it
    and shut down; 0 on a clean stop. One executor for the node's lifetime: `rclpy.spin_once(node)` would add and
    remove the node (rebuilding its wait set) on every wake-up, a cost paid on the control path."""
    rclpy.init(args=list(args) if args is not None else sys.argv)
    signal.signal(signal.SIGTERM, _interrupt)
    executor = SingleThreadedExecutor()
    node = None
    try:
        node = make()
        executor.add_node(node)
        while rclpy.ok() and not (finished is not None and finished(node)):
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            close = getattr(node, "close", None)
            if close is not None:
                close()
            node.destroy_node()
        executor.shutdown()
        if rclpy.ok():
            rclpy.shutdown()
    return 0


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt
