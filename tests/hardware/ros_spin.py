"""Spinning an executor in the hardware tests until something has happened (the tests import it by name: pytest
puts this folder on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rclpy.executors import SingleThreadedExecutor


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
