"""An outside gymnasium env behind the sim robot's interface (hardware/sim_env.py): its episodes are the vector
env's step for step, commands are its actions (checked, delayed, clipped to its bounds), and `robotrl robot init
--task` writes the robot file that commands it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from robotrl.core.spec import SpecMismatchError
from robotrl.envs import make
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.robot_file import RobotInit, run_init
from robotrl.hardware.sim_env import SimEnv, SimEnvConfig
from robotrl.hardware.task_io import TaskIO

ENVS = Path(__file__).resolve().parents[1] / "envs"  # tests/envs/outside_envs.py: a user's env module
POINT = "outside_envs:make_point?radius=0.1"


@pytest.fixture(autouse=True)
def outside_envs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ENVS))


@pytest.fixture
def point_robot(tmp_path: Path) -> RobotConfig:
    run_init(RobotInit(task=POINT, out=tmp_path / "point.yaml"))
    return RobotConfig.load(tmp_path / "point.yaml")


def test_robot_init_writes_the_envs_commands_with_its_bounds(point_robot: RobotConfig, tmp_path: Path) -> None:
    assert point_robot.joint_names == ("action_0", "action_1")
    assert point_robot.limits.lower == (-1.0, -1.0) and point_robot.limits.upper == (1.0, 1.0)
    assert point_robot.command_type == "float64_multi_array" and point_robot.control_hz == 10.0  # render_fps
    assert point_robot.max_obs_age == pytest.approx(0.2)
    with pytest.raises(FileExistsError, match="exists; pass --overwrite"):
        run_init(RobotInit(task=POINT, out=tmp_path / "point.yaml"))
    with pytest.raises(ValueError, match=r"RobotInit: expected a --model .* or a --task"):
        run_init(RobotInit(model="task:Reach", task=POINT, out=tmp_path / "both.yaml"))
    with pytest.raises(ValueError, match=r"RobotInit.task: expected an outside env .* a robotrl task's arm is"):
        run_init(RobotInit(task="Reach", out=tmp_path / "reach.yaml"))
    with pytest.raises(ValueError, match=r"RobotInit.task: .* expected a flat action space with finite bounds"):
        run_init(RobotInit(task="outside_envs:make_unbounded", out=tmp_path / "free.yaml"))
    assert not (tmp_path / "free.yaml").exists()


def test_episodes_are_the_vector_envs_step_for_step(point_robot: RobotConfig) -> None:
    """The demonstrator drives both through three episodes: the first from a seed, the next from the stream the
    vector env auto-resets to; every observation, reward, success and end agrees exactly."""
    demo = __import__("outside_envs").Demonstrator()
    env = make(POINT, num_envs=1, seed=7)
    obs, _ = env.reset(seed=7)
    sim = SimEnv(SimEnvConfig(POINT, seed=3), point_robot)
    sim.reset(seed=7)
    dt = 1.0 / sim.control_hz
    k, episodes, successes = 0, 0, 0
    while episodes < 3:
        assert np.array_equal(sim.observation()["state"], obs["state"][0])
        action = demo.act(obs)
        sim.command(action[0], k * dt)
        sim.step(k * dt)
        obs, reward, terminated, truncated, info = env.step(action)
        status = sim.status()
        assert status["reward"] == float(reward[0]) and status["success"] == bool(info["success"][0])
        assert (status["terminated"], status["truncated"]) == (bool(terminated[0]), bool(truncated[0]))
        assert np.array_equal(sim.joint_state()[0], action[0])  # the action applied, echoed
        successes += status["success"]
        k += 1
        if terminated[0] or truncated[0]:
            assert np.array_equal(sim.observation()["state"], info["final_obs"]["state"][0])  # the last state
            sim.step(k * dt)  # a finished episode is not stepped
            assert sim.status()["step"] == status["step"] == 30
            episodes += 1
            sim.reset()
    assert successes > 0
    sim.close()


def test_commands_are_checked_delayed_and_clipped(point_robot: RobotConfig) -> None:
    sim = SimEnv(SimEnvConfig(POINT, seed=0, command_latency=0.25), point_robot)
    q, dq = sim.joint_state()
    assert np.array_equal(q, [0.0, 0.0]) and np.array_equal(dq, [0.0, 0.0])  # the middle of the bounds
    with pytest.raises(ValueError, match=r"action: expected finite actions, got NaN/inf for \['action_1'\]"):
        sim.command([0.5, float("nan")], 0.0)
    with pytest.raises(
        ValueError, match=r"action: expected shape \(2,\), one of the actions \['action_0', 'action_1'\] each"
    ):
        sim.command([0.5], 0.0)
    with pytest.raises(ValueError, match="now: expected a finite time in seconds"):
        sim.command([0.5, 0.5], float("inf"))
    start = sim.observation()["state"][:2].copy()
    sim.command([3.0, -0.5], 0.0)
    sim.step(0.1)  # not due yet: the neutral action
    assert np.array_equal(sim.observation()["state"][:2], start)
    sim.step(0.25)
    assert np.array_equal(sim.joint_state()[0], [1.0, -0.5])  # clipped to the bounds, as the vector env clips
    moved = sim.observation()["state"][:2] - start
    np.testing.assert_allclose(moved, [0.1, -0.05], atol=1e-6)
    with pytest.raises(ValueError, match=r"SimEnvConfig.task: expected an outside env"):
        SimEnv(SimEnvConfig("Reach"), point_robot)
    with pytest.raises(ValueError, match=r"SimEnvConfig.command_latency: expected a finite number >= 0, got -1"):
        SimEnv(SimEnvConfig(POINT, command_latency=-1.0), point_robot)


def test_a_robot_file_that_does_not_fit_the_env_is_refused(point_robot: RobotConfig, tmp_path: Path) -> None:
    data = yaml.safe_load((tmp_path / "point.yaml").read_text())
    data["limits"]["upper"] = [2.0, 1.0]
    wide = tmp_path / "wide.yaml"
    wide.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecMismatchError, match=r"limits of 'action_0' \[-1.0, 2.0\] exceed .* bounds \[-1.0, 1.0\]"):
        SimEnv(SimEnvConfig(POINT), RobotConfig.load(wide))
    arm = RobotConfig.load("sim_panda")
    with pytest.raises(SpecMismatchError, match=r"takes actions of shape \(2,\), the robot file names 7 commands"):
        SimEnv(SimEnvConfig(POINT), arm)
    spec = make(POINT).task_spec
    with pytest.raises(SpecMismatchError, match=r"robotrl robot init --task"):
        TaskIO(spec, arm)
    io = TaskIO(spec, point_robot)  # the deploy node's mapping: an outside env's action is the command
    assert np.array_equal(io.joint_targets(np.zeros(2), np.array([0.25, -0.5], np.float32)), [0.25, -0.5])
    history = {"state": np.ones((2, 4), np.float32)}
    assert io.roll_forward(history, np.zeros((3, 2))) is history
