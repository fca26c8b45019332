"""How soon the deploy node stops commanding after an e-stop, in its deployed configuration (a command timer at the
robot's rate; the launch file's SCHED_FIFO 50, or the default scheduler with `--deploy-priority 0`) at 200 Hz, with
both cores busy.

The deploy node runs as a robot runs it (its own process, the launch table's parameter file, `realtime_priority`
from it unless `--deploy-priority`); this process plays the robot, under SCHED_FIFO as a robot's driver runs (so
the times it notes are not its own wait for a core): it publishes joint state + PushT task state at the rate, and
every `interval` seconds an e-stop (`std_msgs/Bool` True on the robot's e-stop topic), noting when it sent it, then
re-arms the node through its `~/reset` service. For each e-stop it records the commands that arrived after it was
sent: how many and how late the last one came. The goal (issue 44): nothing later than one control period after
the e-stop.

Prints one JSON line: e-stops, commands_after (max per e-stop), last_after_ms p50 / max, within_one_period (the
share of e-stops after which nothing came later than a period), load.

    .venv/bin/python bench/estop.py --rate 200 --estops 30 --load 2
    .venv/bin/python bench/estop.py --rate 200 --estops 30 --load 2 --deploy-priority 0   # the default scheduler
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
import tyro
import yaml
from std_msgs.msg import Bool, Float64MultiArray
from std_srvs.srv import Trigger

sys.path.insert(0, str(Path(__file__).parent))
import ros2  # bench/ros2.py: its robot side

from policies import build  # bench/policies.py: the same policy variants
from robotrl.hardware import nodes
from robotrl.hardware.realtime import set_fifo
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig
from robotrl.policies.export import export

DOMAIN = 59


@dataclass
class EstopBenchConfig:
    policy: str = "consistency_narrow"
    rate: float = 200.0
    estops: int = 30
    interval: float = 0.5
    """seconds of commanding between e-stops"""
    load: int = 2
    """busy processes beside the nodes (2: both cores busy)"""
    deploy_priority: int | None = None
    """the deploy node's `realtime_priority`; None: the launch file's (its deployed configuration: SCHED_FIFO 50
    where the OS allows it); 0: the default scheduler"""
    robot_priority: int = 50
    """SCHED_FIFO priority of this process, the robot side (as a robot's driver runs), so that its receipt times
    are the deploy node's and not this process waiting for a core; 0: the default scheduler"""
    seed: int = 0


class Robot(ros2.Robot):
    """bench/ros2.py's robot side (observation sets out, every command's receipt timed), with an e-stop and the
    deploy node's ~/reset."""

    def __init__(self, robot: RobotConfig) -> None:
        super().__init__(robot)
        self.estop_pub = self.node.create_publisher(Bool, robot.topics.estop, 10)
        self.reset = self.node.create_client(Trigger, "/robotrl_deploy/reset")
        # the driver's end of the command topic: the deploy node re-arms only with it matched
        self.node.create_subscription(Float64MultiArray, robot.topics.command, lambda m: None, 10)

    def publish_for(self, seconds: float, rate: float) -> None:
        end, period = time.perf_counter() + seconds, 1.0 / rate
        while time.perf_counter() < end:
            self.js_pub.publish(self.joints)
            self.state_pub.publish(self.state)
            time.sleep(period)

    def rearm(self) -> bool:
        future = self.reset.call_async(Trigger.Request())
        end = time.monotonic() + 5.0
        while not future.done() and time.monotonic() < end:
            self.publish_for(0.005, 200.0)
        return bool(future.done() and future.result().success)


def main(config: EstopBenchConfig) -> dict[str, Any]:
    period = 1.0 / config.rate
    rclpy.init(domain_id=DOMAIN)
    hogs: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            policy = build(config.policy, config.seed)
            if policy is None:
                raise ValueError(f"bench: unknown policy {config.policy!r}")
            policy.spec = dataclasses.replace(policy.spec, control_hz=float(config.rate))
            out = export(policy, Path(tmp) / "policy", "onnx")
            spec = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
            spec["control_hz"] = float(config.rate)
            robot_file = Path(tmp) / "robot.yaml"
            robot_file.write_text(yaml.safe_dump(spec))
            params: dict[str, Any] = {"policy": str(out), "robot": str(robot_file)}
            if config.deploy_priority is not None:
                params["realtime_priority"] = config.deploy_priority
            procs = nodes.start({"deploy": params}, Path(tmp), DOMAIN)
            robot = Robot(RobotConfig.load(robot_file))
            try:
                robot.wait_for_deploy()
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(config.load)]
                refused = set_fifo(config.robot_priority)  # after the hogs: a child inherits SCHED_FIFO
                if refused:
                    raise RuntimeError(f"bench: {refused[0]}")
                after, last = [], []
                for _ in range(config.estops):
                    robot.publish_for(config.interval, config.rate)
                    sent = time.perf_counter()
                    robot.estop_pub.publish(Bool(data=True))
                    robot.publish_for(0.2, config.rate)  # observations keep coming: only the e-stop may stop it
                    late = [r - sent for _, r in list(robot.received) if r > sent]
                    after.append(len(late))
                    last.append(max(late) * 1e3 if late else 0.0)
                    if not robot.rearm():
                        raise RuntimeError("bench: the deploy node did not re-arm")
                last_ms = np.asarray(last)
                row = {
                    "bench": "estop",
                    "policy": config.policy,
                    "rate_hz": config.rate,
                    "estops": config.estops,
                    "commands_after_max": int(max(after)),
                    "last_after_ms_p50": round(float(np.percentile(last_ms, 50)), 3),
                    "last_after_ms_max": round(float(last_ms.max()), 3),
                    "within_one_period": round(float(np.mean(last_ms <= period * 1e3)), 3),
                    "load": config.load,
                    "robot_priority": config.robot_priority,
                    "deploy_priority": config.deploy_priority,
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                }
            finally:
                set_fifo(0)
                for hog in hogs:
                    hog.kill()
                robot.close()
                nodes.stop(procs)
    finally:
        rclpy.shutdown()
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main(tyro.cli(EstopBenchConfig))
