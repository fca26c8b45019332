"""Spinning an executor in the hardware tests until something has happened (the tests import it by name: pytest
puts this folder on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node


def spin_until(
    executor: SingleThreadedExecutor, done: Callable[[], Any], timeout: float, each: Callable[[], Any] | None = None
) -> bool:
    """Spin until `done()` is true or `timeout` seconds pass (calling `each` before every spin); whether it is."""
    end = time.monotonic() + timeout
    while not done() and time.monotonic() < end:
        if each is not None:
            each()
        executor.spin_once(timeout_sec=0.005)
    return bool(done())


@contextmanager
def in_one_executor(*nodes: Node) -> Iterator[SingleThreadedExecutor]:
    """The nodes in one executor (rclpy initialised by the `ros` fixture); closed (where they can be) and
    destroyed after."""
    executor = SingleThreadedExecutor()
    for node in nodes:
        executor.add_node(node)
    try:
        yield executor
    finally:
        executor.shutdown()
        for node in nodes:
            if hasattr(node, "close"):
                node.close()
            node.destroy_node()


def spin_for(executor: SingleThreadedExecutor, seconds: float, each: Callable[[], Any] | None = None) -> None:
    """Spin for `seconds` (calling `each` before every spin)."""
    spin_until(executor, lambda: False, seconds, each)
