"""The teleop recorder over real rclpy / DDS with the MuJoCo sim robot, recording into a real zarr store: plain
teleop (every step the operator's), intervention mode (a policy publishes its actions, the operator takes over
part of the time), a store of another spec refused, and a node killed mid-episode leaving the episodes it kept
intact. The operator is the task's scripted expert (`ScriptedDevice`, its `interventions` ranges)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.task import Future
from std_msgs.msg import Bool, Float64MultiArray
from std_srvs.srv import Trigger

from robotrl.core.spec import SpecMismatchError
from robotrl.datasets.store import EpisodeStore, StoreError, validate
from robotrl.envs import make_task
from robotrl.hardware.messages import float_array_to_msg
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.sim_robot_node import SimRobotNode, SimRobotNodeConfig
from robotrl.hardware.teleop_node import INTERVENTION_TOPIC, TeleopNode, TeleopNodeConfig
from ros_spin import spin_until

DOMAIN = int(os.environ["ROS_DOMAIN_ID"]) + 2  # apart from the other ROS tests of this worker (conftest.py)
KILL_DOMAIN = DOMAIN + 1
ROBOT = RobotConfig.load("sim_panda")
STEPS = 40
OPTIONS = json.dumps({"episode_steps": STEPS})
POLICY_TOPIC = "/robotrl/policy_action"
SPEC = make_task("PushT", episode_steps=STEPS).spec()


class Harness(Node):
    """Watches what the sim robot publishes and the commands sent to it; plays the policy in intervention mode."""

    def __init__(self) -> None:
        super().__init__("teleop_harness")
        t = ROBOT.topics
        self.states: set[bytes] = set()
        self.commands: list[np.ndarray] = []
        self.intervention: list[bool] = []
        self.create_subscription(
            Float64MultiArray, t.task_state, lambda m: self.states.add(np.asarray(m.data, np.float32).tobytes()), 100
        )
        self.create_subscription(Float64MultiArray, t.command, lambda m: self.commands.append(np.array(m.data)), 100)
        self.create_subscription(Bool, INTERVENTION_TOPIC, lambda m: self.intervention.append(m.data), 100)
        self.policy = self.create_publisher(Float64MultiArray, POLICY_TOPIC, 10)
        self.actions: set[bytes] = set()
        self.sent = 0
        self.last = -np.inf

    def publish_policy(self) -> None:
        """A policy action every 25 ms (every 5th message malformed: three values for a 2-D action)."""
        if time.monotonic() - self.last < 0.025:
            return
        self.last, self.sent = time.monotonic(), self.sent + 1
        if self.sent % 5 == 0:
            self.policy.publish(float_array_to_msg(np.zeros(3)))
            return
        action = np.array([0.8 * np.sin(0.3 * self.sent), 0.8 * np.cos(0.3 * self.sent)], dtype=np.float32)
        self.actions.add(action.tobytes())
        self.policy.publish(float_array_to_msg(action.astype(np.float64)))


@pytest.fixture
def ros43() -> Iterator[None]:
    rclpy.init(domain_id=DOMAIN)
    try:
        yield
    finally:
        rclpy.shutdown()


class LosesFirstAnswer(Node):
    """The sim robot's reset behind a service that never answers its first request (as when DDS drops an answer)
    and passes the others on."""

    def __init__(self) -> None:
        super().__init__("robotrl_lossy_reset")
        self.requests = 0
        self.sim_reset = self.create_client(Trigger, "/robotrl_sim_robot/reset")
        # reentrant: the request left unanswered holds no other (a mutually exclusive group would wait on it)
        self.create_service(Trigger, "~/reset", self._reset, callback_group=ReentrantCallbackGroup())

    async def _reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.requests += 1
        if self.requests == 1:
            await Future()  # never done: no answer is sent
        return await self.sim_reset.call_async(request)


def record(tmp_path: Path, *extra: Node, **overrides: Any) -> tuple[TeleopNode, Harness, EpisodeStore]:
    """Run the sim robot (real time), the teleop node, the harness and any `extra` nodes in one executor until the
    node is done."""
    sim = SimRobotNode(SimRobotNodeConfig(task_options=OPTIONS))
    config = TeleopNodeConfig(
        robot="sim_panda",
        task="PushT",
        task_options=OPTIONS,
        store=str(tmp_path / "t.zarr"),
        device="scripted",
        **{"max_obs_age": 0.25, "reset_service": "/robotrl_sim_robot/reset", **overrides},
    )
    teleop = TeleopNode(config)
    harness = Harness()
    executor = SingleThreadedExecutor()
    for node in (sim, teleop, harness, *extra):
        executor.add_node(node)
    try:
        each = harness.publish_policy if config.policy_topic else None
        spin_until(executor, lambda: teleop.finished, 40.0, each)
        assert teleop.finished, f"not done in 40 s: kept {teleop.kept}, safety {teleop.safety.status()}"
        spin_until(executor, lambda: False, 0.2)  # the last commands land
    finally:
        executor.shutdown()
        teleop.close()
        sim.close()
        for node in (sim, teleop, harness, *extra):
            node.destroy_node()
    return teleop, harness, EpisodeStore.open(tmp_path / "t.zarr")


def test_teleop_records_episodes_of_the_sim_robot(ros43: None, tmp_path: Path) -> None:
    teleop, harness, store = record(tmp_path, episodes=2)
    assert store.num_episodes == 2 and teleop.kept_indices == [0, 1]
    assert store.spec == SPEC
    assert validate(store, SPEC) == []
    low, high = SPEC.action.low_array(), SPEC.action.high_array()
    joints = SPEC.observations["state"].field_slices()["joint_pos"]
    tool = SPEC.observations["state"].field_slices()["tool_pos"]
    for episode in store:
        d = episode.data
        n = len(episode)
        assert STEPS // 2 <= n <= STEPS, n
        assert d["state"].dtype == np.float32 and d["state"].shape == (n, *SPEC.observations["state"].shape)
        # every recorded observation is one the sim robot published, as it published it
        assert all(row.tobytes() in harness.states for row in d["state"])
        assert np.ptp(d["state"][:, joints], axis=0).max() > 1e-3  # the arm moves under the operator
        assert np.linalg.norm(np.ptp(d["state"][:, tool], axis=0)) > 5e-3
        assert len({row.tobytes() for row in d["state"]}) > n // 2  # a new observation (nearly) every step
        assert d["action"].dtype == np.float32 and np.all(d["action"] >= low) and np.all(d["action"] <= high)
        assert np.mean(np.abs(d["action"]).max(axis=1) > 0) > 0.5  # the expert pushes (and sometimes waits)
        assert d["intervention"].all()  # plain teleop: every step is the operator's
        assert d["truncated"][-1] or d["terminated"][-1] or episode.meta["success"]
        assert not d["truncated"][:-1].any() and np.all(np.diff(d["timestamp"]) > 0)
        assert episode.meta["source"] == "scripted" and episode.meta["device"] == "scripted"
        assert episode.meta["robot"] == "sim_panda" and episode.meta["interventions"] == n
    first = store.episode(0).data["state"][0]
    second = store.episode(1).data["state"][0]
    assert not np.array_equal(first, second)  # each episode starts from a sim robot reset
    assert len(harness.commands) >= 2 * STEPS // 2
    assert all(np.all(c >= ROBOT.lower()) and np.all(c <= ROBOT.upper()) for c in harness.commands)
    assert teleop.malformed == {}


def test_a_reset_whose_answer_is_lost_is_asked_again(ros43: None, tmp_path: Path) -> None:
    """A reset service that never answers the first request: the node asks again after `reset_timeout` and records
    its episode, where it waited for that answer for good."""
    lossy = LosesFirstAnswer()
    teleop, _, store = record(
        tmp_path, lossy, episodes=1, reset_service="/robotrl_lossy_reset/reset", reset_timeout=1.0
    )
    assert lossy.requests == 2 and teleop.kept == 1 and store.num_episodes == 1


def test_intervention_mode_records_the_policy_unless_the_operator_takes_over(ros43: None, tmp_path: Path) -> None:
    teleop, harness, store = record(
        tmp_path, episodes=1, policy_topic=POLICY_TOPIC, device_options=json.dumps({"interventions": [[8, 20]]})
    )
    assert store.num_episodes == 1
    episode = store.episode(0)
    flags, actions = episode.data["intervention"], episode.data["action"]
    taken = np.flatnonzero(flags)
    # device steps 8..19 are the operator's: one contiguous block of 12 steps, the policy's around it
    assert len(taken) == 12 and np.all(np.diff(taken) == 1) and taken[0] >= 1 and taken[-1] < len(flags) - 1
    assert all(a.tobytes() in harness.actions for a in actions[~flags])  # the policy's actions, bit for bit
    assert not any(a.tobytes() in harness.actions for a in actions[flags])  # the operator's own
    # commands only while the operator drives
    assert 8 <= len(harness.commands) <= len(taken)
    assert True in harness.intervention and False in harness.intervention
    assert episode.meta["source"] == "intervention" and episode.meta["interventions"] == 12
    assert teleop.malformed.get(POLICY_TOPIC, 0) >= 1  # malformed policy actions counted, not fatal


def test_a_store_of_another_spec_is_refused(ros43: None, tmp_path: Path) -> None:
    path = tmp_path / "other.zarr"
    EpisodeStore.create(path, make_task("PushT", episode_steps=30).spec()).close()
    config = TeleopNodeConfig(task_options=OPTIONS, store=str(path), device="scripted")
    with pytest.raises(SpecMismatchError, match=r"cannot append to .*episode_steps.*30.*40"):
        TeleopNode(config)
    with EpisodeStore.open(path, mode="a") as store:  # untouched, and no writer lock left behind
        assert store.num_episodes == 0 and store.spec.episode_steps == 30
    with pytest.raises(ValueError, match="device"):
        TeleopNodeConfig(device="joystick")
    with pytest.raises(ValueError, match="task_options"):
        TeleopNodeConfig(task_options="[1, 2]")
    with pytest.raises(ValueError, match=r"TeleopNodeConfig.reset_timeout: expected > 0 s, got 0.0"):
        TeleopNodeConfig(reset_timeout=0.0)


def _ros_args(params: dict[str, Any]) -> list[str]:
    out = ["--ros-args"]
    for key, value in params.items():
        out += ["-p", f"{key}:=" + (f"'{value}'" if isinstance(value, str) else str(value))]
    return out


def test_killing_the_node_mid_episode_keeps_the_saved_episodes(tmp_path: Path) -> None:
    path = tmp_path / "killed.zarr"
    params = {
        "robot": "sim_panda",
        "task": "PushT",
        "task_options": OPTIONS,
        "store": str(path),
        "device": "scripted",
        "max_obs_age": 0.25,
        "reset_service": "/robotrl_sim_robot/reset",
    }
    env = {**os.environ, "ROS_DOMAIN_ID": str(KILL_DOMAIN)}
    log = open(tmp_path / "teleop.log", "w")  # noqa: SIM115 -- the node's output for its whole run
    proc = subprocess.Popen(
        [sys.executable, "-m", "robotrl.hardware.teleop_node", *_ros_args(params)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    rclpy.init(domain_id=KILL_DOMAIN)
    sim = SimRobotNode(SimRobotNodeConfig(task_options=OPTIONS))
    executor = SingleThreadedExecutor()
    executor.add_node(sim)
    saved: dict[str, np.ndarray] = {}
    try:

        def one_saved() -> bool:
            if proc.poll() is not None or not (path / "zarr.json").exists():
                return proc.poll() is not None
            try:
                store = EpisodeStore.open(path)
            except StoreError:  # being created
                return False
            if store.num_episodes:
                saved.update(store.episode(0).data)
            return bool(saved)

        end = time.monotonic() + 40.0
        while not one_saved() and time.monotonic() < end:
            spin_until(executor, lambda: False, 0.1)
        assert saved, f"no episode saved in 40 s:\n{(tmp_path / 'teleop.log').read_text()}"
        spin_until(executor, lambda: False, 0.6)  # well into the next episode
        assert proc.poll() is None, (tmp_path / "teleop.log").read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        executor.shutdown()
        sim.close()
        sim.destroy_node()
        rclpy.shutdown()
    assert "Traceback" not in (tmp_path / "teleop.log").read_text()
    with EpisodeStore.open(path, mode="a") as store:  # the lock died with the process; the tail is trimmed
        assert store.num_episodes == 1
        assert validate(store, SPEC) == []
        for key, value in store.episode(0).data.items():
            np.testing.assert_array_equal(value, saved[key], err_msg=key)
