"""The MuJoCo sim robot on real MuJoCo: step-for-step parity with the CPU vector env, the scripted expert through
joint-position commands, command latency, joint noise, a perturbed "real twin", input checks and images."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from robotrl.envs import make
from robotrl.envs.randomization import Randomization
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.sim_robot import SimRobot, SimRobotConfig

DT = 1.0 / 20.0  # PushT's control period


@pytest.fixture(scope="module")
def robot() -> RobotConfig:
    return RobotConfig.load("sim_panda")


def sim(robot: RobotConfig, **kw) -> SimRobot:
    return SimRobot(SimRobotConfig(**kw), robot)


def run_both(robot: RobotConfig, seed: int, steps: int, until_success: bool = False) -> dict:
    """The noise-free expert drives the vector env by task actions and the sim robot by their joint targets."""
    env = make("PushT", num_envs=1, seed=seed)
    obs, _ = env.reset(seed=seed)
    s = sim(robot, seed=seed)
    env_expert, sim_expert = env.task.expert(0.0), s.task.expert(0.0)
    env_expert.reset(1)
    sim_expert.reset(1)
    err, flags_env, flags_sim = 0.0, [], []
    for k in range(steps):
        sim_obs = s.observation()
        err = max(err, float(np.abs(sim_obs["state"] - obs["state"][0]).max()))
        action = sim_expert.act({"state": sim_obs["state"][None]})[0]
        s.command(s.arm_targets(action), k * DT)
        s.step(k * DT)
        obs, reward, terminated, truncated, info = env.step(env_expert.act(obs))
        status = s.status()
        flags_env.append(bool(info["success"][0]))
        flags_sim.append(status["success"])
        assert status["step"] == k + 1
        assert status["reward"] == pytest.approx(float(reward[0]), abs=1e-9)
        assert (status["terminated"], status["truncated"]) == (bool(terminated[0]), bool(truncated[0]))
        if until_success and (flags_env[-1] or flags_sim[-1]):
            break
        if terminated[0] or truncated[0]:
            break
    err = max(err, float(np.abs(s.observation()["state"] - obs["state"][0]).max()))
    env.close()
    return {"err": err, "env": flags_env, "sim": flags_sim, "sim_robot": s}


def test_joint_targets_reproduce_the_vector_env(robot: RobotConfig) -> None:
    for seed in (0, 5):
        out = run_both(robot, seed, steps=100)
        assert out["err"] <= 1e-9
        assert out["sim"] == out["env"]
        s = out["sim_robot"]
        q, dq = s.joint_state()
        np.testing.assert_array_equal(q, s.data.qpos[:7])  # no joint noise: the exact joint positions
        np.testing.assert_array_equal(q.astype(np.float32), s.observation()["state"][:7])
        np.testing.assert_array_equal(dq, s.data.qvel[:7])


def test_expert_episodes_succeed_as_in_the_vector_env(robot: RobotConfig) -> None:
    outcomes = []
    for seed in (1, 2, 3):
        out = run_both(robot, seed, steps=600, until_success=True)
        assert out["sim"] == out["env"]
        outcomes.append(any(out["sim"]))
    assert all(outcomes), outcomes  # the noise-free expert solves these starts


def test_reset_matches_the_vector_env_and_episodes_end_on_time(robot: RobotConfig) -> None:
    s = sim(robot, seed=7, task_options={"episode_steps": 3})
    env = make("PushT", num_envs=1, seed=7, episode_steps=3, autoreset=False)
    obs, _ = env.reset()
    np.testing.assert_array_equal(s.observation()["state"], obs["state"][0])
    status = s.status()
    assert set(status) == {"step", "success", "reward", "terminated", "truncated"}
    assert (status["step"], status["success"], status["terminated"], status["truncated"]) == (0, False, False, False)
    assert 0.0 < status["reward"] < 1.0
    for k in range(3):
        s.step(k * DT)  # no command yet: the arm holds its start pose
    assert s.status()["truncated"] and s.status()["step"] == 3
    np.testing.assert_allclose(s.joint_state()[0], obs["state"][0, :7], atol=1e-3)
    s.reset()  # the next episode is the vector env's next one (same random stream)
    second, _ = env.reset()
    np.testing.assert_array_equal(s.observation()["state"], second["state"][0])
    assert not np.array_equal(second["state"], obs["state"])
    s.reset(seed=7)
    np.testing.assert_array_equal(s.observation()["state"], obs["state"][0])
    assert s.status()["step"] == 0
    env.close()


def test_command_latency_delays_the_command(robot: RobotConfig) -> None:
    late, now = sim(robot, seed=0, command_latency=2 * DT), sim(robot, seed=0)
    start = late.joint_state()[0]
    target = start + np.array([0.3, -0.2, 0.2, 0.2, 0.0, 0.1, 0.0])
    late.command(target, 0.0)
    for k in range(2):  # not due yet: the arm holds
        late.step(k * DT)
        now.step(k * DT)
        np.testing.assert_array_equal(late.data.ctrl, start)
    now.command(target, 2 * DT)  # the same command, received when the late one becomes due
    for k in range(2, 8):
        late.step(k * DT)
        now.step(k * DT)
        np.testing.assert_array_equal(late.data.ctrl, target)
    np.testing.assert_array_equal(late.data.qpos, now.data.qpos)
    assert np.abs(late.joint_state()[0] - start).max() > 0.1  # it did move


def test_latest_due_command_wins(robot: RobotConfig) -> None:
    s = sim(robot, seed=0, command_latency=0.1)
    start = s.joint_state()[0]
    a, b = start + 0.1, start - 0.1
    s.command(a, 0.0)
    s.command(b, 0.02)
    s.step(0.1)
    np.testing.assert_array_equal(s.data.ctrl, a)
    s.step(0.12)
    np.testing.assert_array_equal(s.data.ctrl, b)
    s.command(a, 0.2)
    s.reset()  # a new episode drops what is pending and holds the new start pose
    start = s.joint_state()[0]
    s.step(0.3)
    np.testing.assert_array_equal(s.data.ctrl, start)


def test_joint_noise_changes_what_is_published_not_the_physics(robot: RobotConfig) -> None:
    noisy, clean = sim(robot, seed=0, joint_noise=0.01), sim(robot, seed=0)
    target = clean.joint_state()[0] + 0.05
    for s in (noisy, clean):
        s.command(target, 0.0)
    diffs = []
    for k in range(5):
        noisy.step(k * DT)
        clean.step(k * DT)
        (qn, vn), (qc, vc) = noisy.joint_state(), clean.joint_state()
        diffs.append(qn - qc)
        np.testing.assert_array_equal(vn, vc)
        np.testing.assert_array_equal(noisy.data.qpos, clean.data.qpos)
        np.testing.assert_array_equal(noisy.observation()["state"], clean.observation()["state"])
    assert 0.003 < np.std(diffs) < 0.03


PERTURBATION = Randomization(friction=(0.5, 1.5), mass=(0.5, 2.0), damping=(0.5, 2.0), actuator_gain=(0.7, 1.3))


def test_perturbation_is_one_fixed_draw_with_other_dynamics(robot: RobotConfig) -> None:
    nominal = sim(robot, seed=0)
    a, b = sim(robot, seed=0, perturbation=PERTURBATION), sim(robot, seed=0, perturbation=PERTURBATION)
    other = sim(robot, seed=1, perturbation=PERTURBATION)
    for field in ("body_mass", "dof_damping", "geom_friction", "actuator_gainprm"):
        np.testing.assert_array_equal(getattr(a.model, field), getattr(b.model, field))
        assert not np.array_equal(getattr(a.model, field), getattr(nominal.model, field)), field
        assert not np.array_equal(getattr(a.model, field), getattr(other.model, field)), field
        # the task's own model stays nominal
        np.testing.assert_array_equal(getattr(a.task.model, field), getattr(nominal.model, field))
    np.testing.assert_array_equal(a.observation()["state"], nominal.observation()["state"])  # same start
    a.reset(seed=3)  # the draw is kept across episodes
    np.testing.assert_array_equal(a.model.body_mass, b.model.body_mass)
    a.reset(seed=0)
    target = nominal.joint_state()[0] + np.array([0.3, -0.2, 0.2, 0.2, 0.0, 0.1, 0.0])
    for s in (nominal, a, b):
        s.command(target, 0.0)
        for k in range(6):
            s.step(k * DT)
    np.testing.assert_array_equal(a.data.qpos, b.data.qpos)
    assert np.abs(a.data.qpos - nominal.data.qpos).max() > 1e-4


def test_perturbation_latency_adds_control_periods(robot: RobotConfig) -> None:
    s = sim(robot, seed=0, command_latency=0.01, perturbation=Randomization(latency_steps=(2, 2)))
    assert s.latency == pytest.approx(0.01 + 2 * DT)
    assert s.model.body_mass.tolist() == s.task.model.body_mass.tolist()  # no model scales asked for


def test_bad_input_is_refused_naming_the_field(robot: RobotConfig) -> None:
    fr3 = RobotConfig.load("franka_fr3")
    with pytest.raises(ValueError, match=r"robot\.joint_names.*fr3_joint1.*joint1"):
        SimRobot(SimRobotConfig(), fr3)
    with pytest.raises(ValueError, match=r"robot\.joint_names.*finger"):
        SimRobot(SimRobotConfig(task="PickPlace"), robot)  # the gripper's joints are not the robot's
    for field in ("command_latency", "joint_noise"):
        with pytest.raises(ValueError, match=field):
            sim(robot, **{field: -0.1})
    with pytest.raises(ValueError, match="seed"):
        sim(robot, seed=-1)
    with pytest.raises(TypeError, match="perturbation"):
        sim(robot, perturbation={"mass": (0.5, 2.0)})
    s = sim(robot, seed=0)
    q = s.joint_state()[0]
    with pytest.raises(ValueError, match=r"q_target.*\(7,\).*\(6,\)"):
        s.command(q[:6], 0.0)
    with pytest.raises(ValueError, match=r"q_target.*\(7,\)"):
        s.command(np.stack([q, q]), 0.0)
    bad = q.copy()
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"q_target.*finite.*joint3"):
        s.command(bad, 0.0)
    with pytest.raises(ValueError, match="q_target"):
        s.command(["a"] * 7, 0.0)
    with pytest.raises(ValueError, match="now"):
        s.command(q, float("nan"))
    with pytest.raises(ValueError, match=r"action.*\(2,\)"):
        s.arm_targets(np.zeros(3))
    with pytest.raises(ValueError, match="action.*finite"):
        s.arm_targets(np.array([np.inf, 0.0]))
    s.step(0.0)  # nothing refused was queued: the arm still holds its start pose
    np.testing.assert_array_equal(s.data.ctrl, q)


def test_arm_targets_clip_the_action_like_the_vector_env(robot: RobotConfig) -> None:
    s = sim(robot, seed=0)
    np.testing.assert_array_equal(s.arm_targets(np.array([5.0, -5.0])), s.arm_targets(np.array([1.0, -1.0])))
    joint = sim(robot, seed=0, task_options={"action_mode": "joint_pos"})
    np.testing.assert_allclose(
        joint.arm_targets(np.zeros(7)), np.mean(np.stack([robot.lower(), robot.upper()]), 0), atol=1e-12
    )


def test_images_match_the_vector_env(robot: RobotConfig) -> None:
    options = {"images": True, "image_size": 32}
    s = sim(robot, seed=4, task_options=options)
    env = make("PushT", num_envs=1, seed=4, **options)
    obs, _ = env.reset()
    first = s.observation()["image_top"]
    assert first.shape == (32, 32, 3) and first.dtype == np.uint8 and first.std() > 5
    np.testing.assert_array_equal(first, obs["image_top"][0])
    expert = env.task.expert(0.0)
    expert.reset(1)
    for k in range(15):
        action = expert.act(obs)
        s.command(s.arm_targets(action[0]), k * DT)
        s.step(k * DT)
        obs, *_ = env.step(action)
    image = s.observation()["image_top"]
    np.testing.assert_array_equal(image, obs["image_top"][0])
    assert np.abs(image.astype(np.int16) - first).mean() > 0.1  # the arm moved in view
    s.close()
    env.close()


def test_config_is_a_plain_dataclass() -> None:
    config = SimRobotConfig()
    assert dataclasses.asdict(config)["task"] == "PushT" and config.perturbation is None
    assert SimRobotConfig().task_options is not config.task_options


def test_a_trajectory_is_followed_point_by_point_and_a_new_one_replaces_what_is_left(robot: RobotConfig) -> None:
    """As a JointTrajectoryController: each point on the control grid is the target of the period that ends at
    its time; without a new trajectory the sim goes on along the points; a new one drops the rest of the old."""
    s = sim(robot, seed=0)
    start = s.joint_state()[0]
    points = [(DT * (k + 1), start + 0.01 * (k + 1)) for k in range(4)]
    s.follow(points, 0.0)
    for k in range(3):
        s.step(k * DT)
        np.testing.assert_array_equal(s.data.ctrl, points[k][1])
    s.follow([(DT, start - 0.02), (2 * DT, start - 0.03)], 3 * DT)  # replaces the old trajectory's last point
    for k, expected in enumerate((start - 0.02, start - 0.03, start - 0.03)):
        s.step((3 + k) * DT)
        np.testing.assert_array_equal(s.data.ctrl, expected)
