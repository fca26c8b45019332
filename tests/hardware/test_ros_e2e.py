"""End to end over DDS, in separate processes started exactly as the launch files start them
(`robotrl.hardware.nodes`): the sim robot and the deploy node run an exported PushT policy, and in lockstep the
episodes over ROS 2 are the in-process evaluation's episodes -- same starts, same policy noise, same physics,
so the same returns and successes, to the last bit. The arm's velocity and acceleration limits are opened up
here so that the safety filter never intervenes: with the real limits its interventions are the only
difference (measured in bench/ros2.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rclpy
import yaml

from robotrl.envs import make
from robotrl.envs.rollouts import run_episodes
from robotrl.evaluate import controller_for, seeded_sampling
from robotrl.hardware.nodes import NODES
from robotrl.hardware.robot import ROBOTS_DIR
from robotrl.hardware.ros_eval import evaluate_over_ros
from robotrl.policies import runtime

DOMAIN = 42  # apart from the in-process node tests
SEED, STEPS, EPISODES = 1_000_003, 60, 3


@pytest.fixture
def nodes(pusht_export: Path, tmp_path: Path) -> Iterator[dict[str, subprocess.Popen]]:
    # the console scripts sit next to this interpreter (the venv's bin/), which need not be on PATH
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN), "PATH": path}
    robot = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    robot["limits"].update(velocity=[100.0] * 7, acceleration=[1e5] * 7)
    (tmp_path / "robot.yaml").write_text(yaml.safe_dump(robot))
    overrides = {
        "sim_robot": {"robot": str(tmp_path / "robot.yaml"), "task_options": json.dumps({"episode_steps": STEPS}), "lockstep": True, "seed": SEED},
        "deploy": {"robot": str(tmp_path / "robot.yaml"), "policy": str(pusht_export), "trigger": "observation", "seed": SEED,
                   "wait_for_reset": True},
    }
    procs = {}
    for key, params in overrides.items():
        log = open(tmp_path / f"{key}.log", "w")
        procs[key] = subprocess.Popen(NODES[key].command(params), stdout=log, stderr=subprocess.STDOUT, env=env)
    rclpy.init(domain_id=DOMAIN)
    try:
        yield procs
    finally:
        rclpy.shutdown()
        for p in procs.values():
            p.terminate()
        for key, p in procs.items():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        logs = {key: (tmp_path / f"{key}.log").read_text() for key in procs}
        for key, text in logs.items():
            assert "Traceback" not in text, f"{key} crashed:\n{text}"


def test_lockstep_episodes_over_ros_are_the_in_process_episodes(nodes: dict, pusht_export: Path) -> None:
    over_ros = evaluate_over_ros(EPISODES, SEED, episode_timeout=60.0)
    assert all(p.poll() is None for p in nodes.values()), "a node died"

    policy = runtime.load(pusht_export, threads=1)
    env = make("PushT", num_envs=1, seed=SEED, episode_steps=STEPS)
    controller = controller_for(policy, execute=8)
    controller.reset(1)
    with seeded_sampling(policy, SEED):
        in_process = run_episodes(env, controller, EPISODES, seed=SEED, on_episode_start=controller.reset_env)
    env.close()

    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(over_ros.success, in_process.success)
    assert len(set(np.round(over_ros.returns, 6))) == EPISODES  # three different episodes, not one replayed
