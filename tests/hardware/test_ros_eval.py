"""The episode runner's service calls (`hardware/ros_eval.py`) against a real Trigger server over DDS."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_srvs.srv import Trigger

from robotrl.hardware.ros_eval import EpisodeRunner


class SlowReset(Node):
    """A reset service whose first `slow` requests take `delay` s to answer: an answer the caller stops waiting for,
    as one DDS dropped would be."""

    def __init__(self, slow: int, delay: float) -> None:
        super().__init__("robotrl_slow_reset")
        self.slow, self.delay, self.requests = slow, delay, 0
        self.create_service(Trigger, "~/reset", self._reset)

    def _reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.requests += 1
        if self.requests <= self.slow:
            time.sleep(self.delay)
        response.success, response.message = True, f"request {self.requests}"
        return response


@contextmanager
def serving(node: Node) -> Iterator[None]:
    """`node` spun by its own executor on a thread beside the caller's."""
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        executor.shutdown()
        thread.join(timeout=5.0)
        node.destroy_node()


def test_an_unanswered_reset_is_asked_again_until_one_answers(ros: None) -> None:
    server, runner = SlowReset(slow=1, delay=1.5), EpisodeRunner()
    client = runner.create_client(Trigger, "/robotrl_slow_reset/reset")
    try:
        with serving(server):
            start = time.monotonic()
            runner.call(client, timeout=0.5, discovery=20.0)
            waited = time.monotonic() - start
        assert server.requests >= 2  # the first went unanswered in time: asked again
        assert waited < 10.0
    finally:
        runner.executor_.shutdown()
        runner.destroy_node()


def test_a_reset_never_answered_in_time_fails_in_one_line(ros: None) -> None:
    server, runner = SlowReset(slow=1000, delay=0.6), EpisodeRunner()
    client = runner.create_client(Trigger, "/robotrl_slow_reset/reset")
    try:
        with serving(server), pytest.raises(TimeoutError, match="robotrl_slow_reset/reset did not answer"):
            runner.call(client, timeout=0.2, discovery=1.0)
    finally:
        runner.executor_.shutdown()
        runner.destroy_node()
