"""Observation-to-command latency of the deploy node over ROS 2 (Fast DDS), and its deadline-miss rate, at
100, 200 and 500 Hz, for the one-step students and their 10-step flow teacher (the baseline, same process).

The deploy node runs as a robot runs it: its own process, started from the launch table
(`robotrl.hardware.nodes`), an ONNX export through the runtime, the safety filter before the wire. This process
plays the robot: at the rate it publishes a joint state (stamped, each stamp its own) and the PushT task state, and
times the command that the deploy node (`trigger:=observation`: one command per observation set, as soon as it has
them) sends back, paired with its observation exactly by the stamp the command carries (`command_stamped`: the
stamp of the joint state it was computed from). `--load N` keeps N busy processes running beside both (N = 2:
both cores busy, as a robot PC running its other nodes).
Chunks are executed as deployed (receding horizon, `execute` actions per inference), so one step in `execute`
runs the policy and the others only the executor, task controller and safety filter: p99 is the inference
step's latency whenever 1 / execute > 1% -- unless `--asynchronous`, where the policy runs in the node's worker
thread and no command waits for it (how a robot should run it).

Prints one JSON line per (policy, rate):
  p50_ms, p99_ms, max_ms   publish of the observation set -> receipt of the command computed from it, wall clock,
                           this process
  miss_rate                observations whose command came later than one period, or never / observations sent
  vs_<baseline>_p99        the baseline's p99 / this p99 at the same rate (> 1: faster)
  inference_p50_ms         the same export's `runtime.act` alone in this process (batch 1), for reference
  tick_p50_ms, tick_p99_ms the deploy node's own control step (`DeployNode.tick`) in this process, no DDS
  vs_default_scheduler_p99 with `--realtime-priorities 0 50`: the default scheduler's p99 / this one's

Untrained weights (latency does not depend on them) of the state-only PushT policies of bench/policies.py.

    .venv/bin/python bench/ros2.py
    .venv/bin/python bench/ros2.py --policies flow10 consistency --rates 200 --seconds 20
    .venv/bin/python bench/ros2.py --asynchronous
    .venv/bin/python bench/ros2.py --policies consistency_narrow --rates 200 --realtime-priorities 0 50
    .venv/bin/python bench/ros2.py --policies consistency_narrow --rates 200 --load 2 --realtime-priorities 0 50
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
import torch
import tyro
import yaml
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

sys.path.insert(0, str(Path(__file__).parent))
from policies import build  # bench/policies.py: the same policy variants
from robotrl.envs import make
from robotrl.envs.tasks.push_t import START_QPOS
from robotrl.hardware import nodes
from robotrl.hardware.messages import arrays_to_joint_state, float_array_to_msg
from robotrl.hardware.realtime import set_fifo
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig
from robotrl.policies import runtime
from robotrl.policies.export import export

DOMAIN = 57


@dataclass
class Ros2BenchConfig:
    policies: tuple[str, ...] = ("flow10", "consistency", "consistency_narrow")
    baseline: str = "flow10"
    rates: tuple[float, ...] = (100.0, 200.0, 500.0)
    seconds: float = 10.0
    """timed seconds per (policy, rate), after `warmup` seconds"""
    warmup: float = 1.0
    execute: int = 8
    threads: int = 1
    """onnxruntime threads of the deploy node"""
    asynchronous: bool = False
    """the deploy node's asynchronous inference (a worker thread; the command never waits for the policy), each
    chunk requested the periods one inference takes (its p50, rounded up) plus one before it is due"""
    seed: int = 0
    realtime_priorities: tuple[int, ...] = (0,)
    """run every (policy, rate) under each: 0 is the default scheduler; > 0 is SCHED_FIFO at that priority for the
    deploy node (`realtime_priority:=`) and for this process's robot side, as a robot's driver runs"""
    load: int = 0
    """busy processes running beside the nodes while they are timed (2: both cores of this machine busy)"""


def observation_messages(robot: RobotConfig) -> tuple[JointState, Float64MultiArray]:
    """A real PushT observation: the arm at its start pose and the task state of a reset."""
    env = make("PushT", num_envs=1, seed=0)
    state = float_array_to_msg(env.reset(seed=0)[0]["state"][0])
    env.close()
    return arrays_to_joint_state(robot.joint_names, np.asarray(START_QPOS, dtype=np.float64)), state


class Robot:
    """Publishes observation sets at a fixed rate and times the commands that come back."""

    def __init__(self, robot: RobotConfig) -> None:
        self.node = rclpy.create_node("bench_robot")
        t = robot.topics
        self.js_pub = self.node.create_publisher(JointState, t.joint_states, 100)
        self.state_pub = self.node.create_publisher(Float64MultiArray, t.task_state, 100)
        self.received: list[tuple[int, float]] = []  # (the stamp the command carries, ns; receipt time)
        self.node.create_subscription(
            JointState,
            t.command_stamped,
            lambda m: self.received.append((m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, time.perf_counter())),
            1000,
        )
        self.joints, self.state = observation_messages(robot)
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.spinning = True
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        while self.spinning:
            self.executor.spin_once(timeout_sec=0.001)

    def wait_for_deploy(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not self.received and time.monotonic() < end:
            self.js_pub.publish(self.joints)
            self.state_pub.publish(self.state)
            time.sleep(0.05)
        if not self.received:
            raise TimeoutError("bench: no command from the deploy node")

    def run(self, rate: float, seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """Send times of `rate * seconds` observation sets, and the receipt time of the command computed from each
        (nan: none came)."""
        time.sleep(0.2)
        self.received.clear()
        period, n = 1.0 / rate, int(rate * seconds)
        sent, stamps = np.zeros(n), np.zeros(n, dtype=np.int64)
        start = time.perf_counter()
        for k in range(n):
            due = start + k * period
            wait = due - time.perf_counter()
            if wait > 3e-4:
                time.sleep(wait - 3e-4)
            while time.perf_counter() < due:  # the last 0.3 ms busy: sleep() overshoots by ~0.1 ms
                pass
            now = self.node.get_clock().now()
            self.joints.header.stamp = now.to_msg()
            stamps[k] = now.nanoseconds
            self.js_pub.publish(self.joints)
            self.state_pub.publish(self.state)
            sent[k] = time.perf_counter()
        time.sleep(0.5)
        got = dict(self.received)  # the first command per stamp (a hold repeats an old one)
        return sent, np.array([got.get(int(s), np.nan) for s in stamps])

    def close(self) -> None:
        self.spinning = False
        self.thread.join()
        self.executor.shutdown()
        self.node.destroy_node()


def measure(robot: Robot, rate: float, seconds: float, warmup: float) -> dict[str, Any]:
    robot.run(rate, warmup)
    sent, received = robot.run(rate, seconds)
    n = len(sent)
    answered = ~np.isnan(received)
    lat = (received[answered] - sent[answered]) * 1e3  # each command against the observation it was computed from
    late = int((lat > 1e3 / rate).sum()) + int((~answered).sum())
    return {
        "observations": n,
        "commands": int(answered.sum()),
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "max_ms": round(float(lat.max()), 3),
        "miss_rate": round(late / n, 5),
    }


def inference_p50(policy_dir: Path, threads: int) -> float:
    rt = runtime.load(policy_dir, threads=threads)
    obs = {k: np.zeros((1, rt.obs_horizon, *rt.spec.observations[k].shape), np.float32) for k in rt.obs_keys}
    for _ in range(5):
        rt.act(obs)
    times = []
    for _ in range(100):
        t = time.perf_counter()
        rt.act(obs)
        times.append(time.perf_counter() - t)
    return round(float(np.percentile(times, 50)) * 1e3, 3)


def tick_ms(
    policy_dir: Path,
    robot_file: Path,
    config: Ros2BenchConfig,
    execution: dict[str, Any],
    rate: float,
    seconds: float = 3.0,
) -> tuple[float, float]:
    """p50 and p99 of the deploy node's own control step (`DeployNode.tick`: executor, task controller, safety
    filter, publish) in this process, observations set directly, one step per period of `rate` (an asynchronous
    inference gets the time it has on the robot): the part of the latency that is not DDS or the executor that
    delivers the messages."""
    from robotrl.hardware.deploy import DeployConfig, DeployNode

    node = DeployNode(
        DeployConfig(
            policy=str(policy_dir),
            robot=str(robot_file),
            trigger="observation",
            threads=config.threads,
            seed=config.seed,
            hil=False,
            **execution,
        )
    )
    joints, state_msg = observation_messages(node.robot)
    state = np.asarray(state_msg.data, dtype=np.float32)
    q = np.asarray(joints.position, dtype=np.float64)
    times = []
    start = time.perf_counter()
    try:
        for k in range(int(rate * seconds)):
            time.sleep(max(0.0, start + k / rate - time.perf_counter()))
            now = time.monotonic()
            node.q, node.q_stamp = q, now
            node.latest["state"] = (state, now)
            t = time.perf_counter()
            node.tick()
            times.append(time.perf_counter() - t)
    finally:
        node.close()
        node.destroy_node()
    ms = np.asarray(times[len(times) // 10 :]) * 1e3  # after a warm-up
    return round(float(np.percentile(ms, 50)), 3), round(float(np.percentile(ms, 99)), 3)


def main(config: Ros2BenchConfig) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    # the receiving thread must not wait for the publishing loop's GIL time slice (5 ms by default) to timestamp
    sys.setswitchinterval(1e-5)
    labels = [config.baseline, *[p for p in config.policies if p != config.baseline]]
    rows: list[dict[str, Any]] = []
    baseline: dict[tuple[float, int], float] = {}
    rclpy.init(domain_id=DOMAIN)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label in labels:
                policy = build(label, config.seed)
                if policy is None:
                    raise ValueError(f"bench: unknown policy {label!r}")
                infer = inference_p50(export(policy, Path(tmp) / label, "onnx"), config.threads)
                rated: dict[float, Path] = {}  # the policy as trained at each rate: the deploy node checks it
                for rate, priority in ((r, q) for r in config.rates for q in config.realtime_priorities):
                    if rate not in rated:
                        policy.spec = dataclasses.replace(policy.spec, control_hz=float(rate))
                        rated[rate] = export(policy, Path(tmp) / f"{label}_{rate:g}hz", "onnx")
                    out = rated[rate]
                    spec = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
                    spec["control_hz"] = float(rate)
                    robot_file = Path(tmp) / f"robot_{rate:g}.yaml"
                    robot_file.write_text(yaml.safe_dump(spec))
                    robot_cfg = RobotConfig.load(robot_file)
                    logs = Path(tmp) / f"{label}_{rate:g}_rt{priority}"
                    logs.mkdir()
                    execution = {
                        "execute": config.execute,
                        "asynchronous": config.asynchronous,
                        "delay_steps": math.ceil(infer * rate / 1e3) + 1,
                    }
                    procs = nodes.start(
                        {
                            "deploy": {
                                "policy": str(out),
                                "robot": str(robot_file),
                                "trigger": "observation",
                                "threads": config.threads,
                                "seed": config.seed,
                                "realtime_priority": priority,
                                **execution,
                            }
                        },
                        logs,
                        DOMAIN,
                    )
                    tick_p50, tick_p99 = tick_ms(
                        out, robot_file, config, execution, rate
                    )  # before any other thread runs here
                    robot = Robot(robot_cfg)
                    hogs: list[subprocess.Popen] = []
                    try:
                        robot.wait_for_deploy()
                        hogs += [  # started first: a child inherits SCHED_FIFO, and FIFO busy loops starve the machine
                            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(config.load)
                        ]
                        refused = set_fifo(priority)  # the robot side too, as its driver would run
                        if refused:
                            raise RuntimeError(f"bench: {refused[0]}")
                        row = {
                            "bench": "ros2",
                            "policy": label,
                            "registry": policy.name,
                            "rate_hz": rate,
                            "execute": config.execute,
                            "asynchronous": config.asynchronous,
                            "delay_steps": execution["delay_steps"] if config.asynchronous else None,
                            "load": config.load,
                            **measure(robot, rate, config.seconds, config.warmup),
                            "inference_p50_ms": infer,
                            "tick_p50_ms": tick_p50,
                            "tick_p99_ms": tick_p99,
                            "load_avg_1m": round(os.getloadavg()[0], 2),
                        }
                    finally:
                        for hog in hogs:
                            hog.kill()
                        set_fifo(0)
                        robot.close()
                        nodes.stop(procs)
                    row["realtime_priority"] = priority
                    if label == config.baseline:
                        baseline[(rate, priority)] = row["p99_ms"]
                    row[f"vs_{config.baseline}_p99"] = (
                        round(baseline[(rate, priority)] / row["p99_ms"], 2) if (rate, priority) in baseline else None
                    )
                    if priority:
                        default = next(
                            (
                                r
                                for r in rows
                                if r["policy"] == label and r["rate_hz"] == rate and r["realtime_priority"] == 0
                            ),
                            None,
                        )
                        row["vs_default_scheduler_p99"] = (
                            round(default["p99_ms"] / row["p99_ms"], 2) if default else None
                        )
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        rclpy.shutdown()
    return rows


if __name__ == "__main__":
    main(tyro.cli(Ros2BenchConfig))
