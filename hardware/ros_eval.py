"""Success over ROS 2: episodes of the sim robot with the deploy node in the loop, both in their own processes,
counted from the sim robot's status topic -- the figure compared with the in-process `robotrl policy eval`.

    stats = evaluate_over_ros(episodes=50, seed=1_000_000)    # both nodes already running

Each episode: the deploy node's `~/reset` (history and chunks cleared; retried while it says its robot topics
are not matched yet), then the sim robot reset to episode k's seed, `wave_seed(seed, k)` -- the start
`run_episodes` gives episode k of a one-env evaluation from `seed` -- and the episode runs until the sim robot
reports it terminated or truncated. Success is "succeeded at any step", as `run_episodes` counts it; the steps that
succeeded and whether the task terminated the episode (a fall) are kept too, for a task judged per step
(`Task.measures`: Quadruped's tracking and fall rate).
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import Int64, String
from std_srvs.srv import Trigger

from robotrl.envs.rollouts import EpisodeStats, wave_seed
from robotrl.hardware.nodes import NODES
from robotrl.hardware.sim_robot_node import RESET_TOPIC, STATUS_TOPIC


class EpisodeRunner(Node):
    def __init__(self) -> None:
        super().__init__("robotrl_episode_runner")
        self.status: dict[str, Any] | None = None
        self.create_subscription(String, STATUS_TOPIC, self._on_status, 100)
        self.reset_seed = self.create_publisher(Int64, RESET_TOPIC, 10)
        self.deploy_reset: Any = self.create_client(Trigger, f"/{NODES['deploy'].name}/reset")
        self.executor_ = SingleThreadedExecutor()
        self.executor_.add_node(self)

    def _on_status(self, msg: String) -> None:
        self.status = json.loads(msg.data)

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor_.spin_once(timeout_sec=min(0.01, max(end - time.monotonic(), 0.0)))

    def call(self, client: Any, timeout: float = 10.0, discovery: float = 60.0) -> None:
        """Call a Trigger service until it succeeds; `discovery` allows for a node that is still starting (loading
        its policy, its topics not matched yet: the deploy node refuses a reset until they are).

        A request not answered within `timeout` is sent again, until `discovery` has passed: DDS can drop the
        answer to a client whose response reader the server has not discovered yet (rmw_fastrtps waits a moment
        for it, then sends nothing), which a loaded machine's slow discovery makes happen. The service called here,
        the deploy node's reset, may run twice: it does the same before the episode's seed is published, and a
        server answers in order, so an answer means every earlier request has run."""
        end = time.monotonic() + discovery
        if not client.wait_for_service(timeout_sec=discovery):
            raise TimeoutError(f"ros eval: service {client.srv_name} not available within {discovery} s")
        while True:
            future = client.call_async(Trigger.Request())
            self.executor_.spin_until_future_complete(future, timeout_sec=timeout)
            if not future.done():
                client.remove_pending_request(future)
                if time.monotonic() > end:
                    raise TimeoutError(
                        f"ros eval: {client.srv_name} did not answer within {discovery} s (asked every {timeout} s)"
                    )
                continue
            if future.result().success:
                return
            if time.monotonic() > end:
                raise RuntimeError(f"ros eval: {client.srv_name} refused for {discovery} s: {future.result().message}")
            self.spin_for(0.1)

    def wait_for_status(self, timeout: float = 30.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while self.status is None and time.monotonic() < end:
            self.spin_for(0.05)
        if self.status is None:
            raise TimeoutError(f"ros eval: no status on {STATUS_TOPIC} within {timeout} s (is the sim robot running?)")
        return self.status

    def episode(self, seed: int, timeout: float) -> tuple[bool, float, int, int, bool]:
        """One episode: (succeeded at any step, return, steps, steps that succeeded, terminated)."""
        previous = self.wait_for_status()["episode"]
        self.spin_for(0.2)  # let the messages of the last episode land before the deploy node forgets them
        self.call(self.deploy_reset)
        end = time.monotonic() + 10.0
        while self.reset_seed.get_subscription_count() == 0 and time.monotonic() < end:
            self.spin_for(0.05)  # a message published before discovery is lost
        self.reset_seed.publish(Int64(data=seed))
        success, ret, steps, good, seen = False, 0.0, 0, 0, -1
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.executor_.spin_once(timeout_sec=0.05)
            s = self.status
            if s is None or s["episode"] <= previous or s["step"] == seen:
                continue
            seen = s["step"]
            if s["step"] > 0:
                success |= bool(s["success"])
                good += int(bool(s["success"]))
                ret += float(s["reward"])
                steps = int(s["step"])
            if s["terminated"] or s["truncated"]:
                return success, ret, steps, good, bool(s["terminated"])
        raise TimeoutError(f"ros eval: episode not finished within {timeout} s (last status {self.status})")


def evaluate_over_ros(episodes: int, seed: int, episode_timeout: float = 120.0) -> EpisodeStats:
    """Run `episodes` episodes through the running sim robot and deploy nodes (rclpy must be initialised)."""
    runner = EpisodeRunner()
    try:
        results = [runner.episode(wave_seed(seed, i), episode_timeout) for i in range(episodes)]
    finally:
        runner.executor_.shutdown()
        runner.destroy_node()
    success, returns, lengths, good, terminated = (np.array(x) for x in zip(*results))
    return EpisodeStats(
        success.astype(bool),
        returns.astype(np.float64),
        lengths.astype(np.int64),
        success_steps=good.astype(np.int64),
        terminated=terminated.astype(bool),
    )


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1_000_000)
    args = parser.parse_args()
    rclpy.init()
    try:
        stats = evaluate_over_ros(args.episodes, args.seed)
    finally:
        rclpy.shutdown()
    print(
        json.dumps({"episodes": len(stats.success), "success_rate": stats.success_rate, "ci95": stats.success_ci95()})
    )


if __name__ == "__main__":
    main()
