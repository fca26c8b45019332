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
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rclpy
import yaml
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from robotrl.envs import make
from robotrl.envs.rollouts import EpisodeStats, run_episodes, wilson_ci95
from robotrl.hardware import nodes as nodes_table
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig
from robotrl.hardware.ros_eval import evaluate_over_ros
from robotrl.policies import runtime
from robotrl.training.evaluate import controller_for, seeded_sampling

DOMAIN = int(os.environ["ROS_DOMAIN_ID"]) + 1  # apart from the in-process node tests (conftest.py)
SEED, STEPS, EPISODES = 1_000_003, 60, 3


def start_nodes(tmp_path: Path, overrides: dict[str, dict]) -> dict[str, subprocess.Popen]:
    """The nodes as the launch files start them (parameter file, then overrides), on a private DDS domain."""
    return nodes_table.start(overrides, tmp_path, DOMAIN)


def stop_nodes(procs: dict[str, subprocess.Popen], tmp_path: Path) -> None:
    nodes_table.stop(procs)
    for key in procs:
        text = (tmp_path / f"{key}.log").read_text()
        assert "Traceback" not in text, f"{key} crashed:\n{text}"


def start_lockstep(
    tmp_path: Path, robot_name: str | Path, task: str, options: dict, policy: Path
) -> dict[str, subprocess.Popen]:
    """The sim robot in lockstep and the deploy node stepping on its observations, seeded alike, both on the
    simulated time (the sim robot's /clock and stamps, the deploy node's use_sim_time: the stamps it checks are the
    simulation's), on a robot file with its motion limits out of the policy's way (the in-process env has none)
    and the wall clock out of the lockstep: no observation set counts as stale and the sim robot waits for every command (with the sim robot's
    1 s and the robot's 0.1 s, a loaded 2-core CI machine could time a step out, and the episode left the
    in-process one). Staleness on the robot's real limits is the kill test's below."""
    robot_file = robot_name if isinstance(robot_name, Path) else ROBOTS_DIR / f"{robot_name}.yaml"
    robot = yaml.safe_load(robot_file.read_text())
    joints = len(robot["limits"]["velocity"])
    robot["limits"].update(velocity=[100.0] * joints, acceleration=[1e5] * joints)
    robot["max_obs_age"] = 60.0
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(robot))
    return start_nodes(
        tmp_path,
        {
            "sim_robot": {
                "robot": str(path),
                "task": task,
                "task_options": json.dumps(options),
                "lockstep": True,
                "lockstep_timeout": 60.0,
                "seed": SEED,
                "clock": True,
            },
            "deploy": {
                "robot": str(path),
                "policy": str(policy),
                "trigger": "observation",
                "seed": SEED,
                "wait_for_reset": True,
                "use_sim_time": True,
            },
        },
    )


@pytest.fixture
def ros_domain() -> Iterator[None]:
    rclpy.init(domain_id=DOMAIN)
    try:
        yield
    finally:
        rclpy.shutdown()


@pytest.fixture(params=["state", "image"])
def policy_and_options(request: pytest.FixtureRequest) -> tuple[Path, dict]:
    """A state policy, and an image policy (camera + arm state, the block's pose hidden from it)."""
    if request.param == "state":
        return request.getfixturevalue("pusht_export"), {"episode_steps": STEPS}
    return request.getfixturevalue("pusht_image_export"), {"episode_steps": STEPS, "images": True, "image_size": 32}


@pytest.fixture
def nodes(policy_and_options: tuple[Path, dict], tmp_path: Path, ros_domain: None) -> Iterator[dict]:
    export_dir, options = policy_and_options
    procs = start_lockstep(tmp_path, "sim_panda", "PushT", options, export_dir)
    try:
        yield procs
    finally:
        stop_nodes(procs, tmp_path)


def in_process_episodes(
    export_dir: Path, options: dict, episodes: int, task: str = "PushT", **env_options: object
) -> EpisodeStats:
    """The exported policy's episodes in process, seeded as the lockstep nodes are."""
    policy = runtime.load(export_dir, threads=1)
    env = make(task, num_envs=1, seed=SEED, **env_options, **options)
    controller = controller_for(policy, execute=8)
    controller.reset(1)
    with seeded_sampling(policy, SEED):
        stats = run_episodes(env, controller, episodes, seed=SEED, on_episode_start=controller.reset_env)
    env.close()
    return stats


def over_ros_in_lockstep(
    tmp_path: Path, robot: str | Path, task: str, options: dict, policy: Path, episodes: int
) -> EpisodeStats:
    """The exported policy's episodes over ROS 2: sim robot and deploy node in lockstep (`start_lockstep`)."""
    procs = start_lockstep(tmp_path, robot, task, options, policy)
    try:
        over_ros = evaluate_over_ros(episodes, SEED, episode_timeout=60.0)
        assert all(p.poll() is None for p in procs.values()), "a node died"
    finally:
        stop_nodes(procs, tmp_path)
    return over_ros


def test_lockstep_episodes_over_ros_are_the_in_process_episodes(nodes: dict, policy_and_options: tuple) -> None:
    export_dir, options = policy_and_options
    over_ros = evaluate_over_ros(EPISODES, SEED, episode_timeout=60.0)
    assert all(p.poll() is None for p in nodes.values()), "a node died"
    in_process = in_process_episodes(export_dir, options, EPISODES)

    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(over_ros.success, in_process.success)
    assert len(set(np.round(over_ros.returns, 6))) == EPISODES  # three different episodes, not one replayed


def test_pickplace_vla_and_its_gripper_over_ros_are_the_in_process_episodes(
    pickplace_vla_export: Path, tmp_path: Path, ros_domain: None
) -> None:
    """PickPlace through `sim_panda_hand`: the arm's seven joints and the two fingers in one command, the
    instruction from the sim robot with every step; in lockstep the language-conditioned policy's episodes over
    ROS 2 are the in-process ones, the instruction and the gripper included."""
    options = {"episode_steps": 25}
    over_ros = over_ros_in_lockstep(tmp_path, "sim_panda_hand", "PickPlace", options, pickplace_vla_export, 2)
    in_process = in_process_episodes(pickplace_vla_export, options, 2, "PickPlace", render_images=False)
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    # the deploy process embeds the instruction itself: under another torch thread count its last bit may differ
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-4)
    assert over_ros.returns[0] != over_ros.returns[1]


def test_a_ur5_from_its_urdf_over_ros_runs_the_in_process_episodes(
    ur5_export: tuple[Path, dict], tmp_path: Path, ros_domain: None
) -> None:
    """The second arm end to end: Reach on example-robot-data's UR5 (scene composed from its URDF), a flow policy
    trained on its expert's demos and exported, a robot file written from the URDF by `robotrl robot init`, the sim
    robot and the deploy node in lockstep on it: the episodes over ROS 2 are the in-process ones."""
    from robotrl.hardware.robot_file import RobotInit, run_init

    policy, options = ur5_export
    run_init(RobotInit(model="example-robot-data:ur5", out=tmp_path / "ur5.yaml"))
    robot = RobotConfig.load(tmp_path / "ur5.yaml")
    assert robot.joint_names == runtime.load(policy).spec.joint_names and robot.limits.velocity[0] == 3.15
    over_ros = over_ros_in_lockstep(tmp_path, tmp_path / "ur5.yaml", "Reach", options, policy, 2)
    in_process = in_process_episodes(policy, options, 2, "Reach")
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-6)
    assert over_ros.returns[0] != over_ros.returns[1]


def test_killing_the_sim_robot_makes_the_deploy_node_hold_within_one_period(
    pusht_export: Path, tmp_path: Path, ros_domain: None
) -> None:
    """Real time, the arm's real limits: the robot process dies (SIGKILL, no goodbye); the deploy node's commands
    become one constant hold no later than max_obs_age + one control period after the last joint state."""
    robot = RobotConfig.load("sim_panda")
    procs = start_nodes(tmp_path, {"sim_robot": {}, "deploy": {"policy": str(pusht_export)}})
    node = rclpy.create_node("watcher")
    commands: list[tuple[float, np.ndarray]] = []
    last_state = [0.0]
    node.create_subscription(
        Float64MultiArray, robot.topics.command, lambda m: commands.append((time.monotonic(), np.array(m.data))), 100
    )

    def on_joint_state(msg: JointState) -> None:
        last_state[0] = time.monotonic()

    node.create_subscription(JointState, robot.topics.joint_states, on_joint_state, 100)
    try:
        end = time.monotonic() + 60
        while (len(commands) < 20 or not last_state[0]) and time.monotonic() < end:  # the policy drives the robot
            rclpy.spin_once(node, timeout_sec=0.05)
        assert len(commands) >= 20 and last_state[0], f"{len(commands)} commands, joint states seen: {last_state}"
        procs["sim_robot"].kill()
        procs["sim_robot"].wait()
        killed = time.monotonic()
        while time.monotonic() < killed + 1.0:
            rclpy.spin_once(node, timeout_sec=0.01)
        after = [(t, q) for t, q in commands if t > last_state[0]]
        hold = after[-1][1]
        first_hold = next(t for t, q in after if np.array_equal(q, hold))
        assert all(np.array_equal(q, hold) for t, q in after if t >= first_hold)
        assert first_hold - last_state[0] <= robot.max_obs_age + 1.0 / robot.control_hz + 0.03, (
            first_hold - last_state[0]
        )
        assert procs["deploy"].poll() is None  # and it keeps running
    finally:
        node.destroy_node()
        stop_nodes({"deploy": procs["deploy"]}, tmp_path)


def test_ros_eval_command_line(nodes: dict, policy_and_options: tuple) -> None:
    """`python -m robotrl.hardware.ros_eval`: the success rate over the running nodes, as a JSON line."""
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN)}
    out = subprocess.run(
        [sys.executable, "-m", "robotrl.hardware.ros_eval", "--episodes", "2", "--seed", str(SEED)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    in_process = in_process_episodes(*policy_and_options, 2)
    assert result["episodes"] == 2 and result["success_rate"] == float(in_process.success.mean())
    assert result["ci95"] == pytest.approx(list(wilson_ci95(in_process.success)))


def test_an_outside_env_over_ros_runs_the_in_process_episodes(
    point_export: tuple[Path, str], tmp_path: Path, ros_domain: None
) -> None:
    """A user's gymnasium env (tests/envs/outside_envs.py, imported by name) end to end: a flow policy trained on its
    demonstrator's episodes and exported, a robot file written from the env's action space by `robotrl robot init
    --task`, the sim robot hosting the env and the deploy node sending its actions in lockstep: the episodes over
    ROS 2 are the in-process ones."""
    from robotrl.hardware.robot_file import RobotInit, run_init

    policy, task = point_export
    run_init(RobotInit(task=task, out=tmp_path / "point.yaml"))
    over_ros = over_ros_in_lockstep(tmp_path, tmp_path / "point.yaml", task, {}, policy, 3)
    in_process = in_process_episodes(policy, {}, 3, task)
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(over_ros.success, in_process.success)
    assert len(set(np.round(over_ros.returns, 6))) == 3


def test_an_actor_critic_policy_over_ros_runs_the_in_process_episodes(tmp_path: Path, ros_domain: None) -> None:
    """The registered `gaussian` policy every actor-critic learner saves (SAC's tanh-Gaussian actor here, on PushT's
    state), exported for the runtime, deploys as a BC policy does: one action per observation, and the episodes
    over ROS 2 are the in-process ones."""
    import torch

    from robotrl.policies.export import export
    from robotrl.policies.gaussian import GaussianConfig, GaussianPolicy

    options = {"episode_steps": STEPS}
    env = make("PushT", num_envs=1, **options)
    torch.manual_seed(0)
    policy = GaussianPolicy(env.task_spec, GaussianConfig(hidden=(32, 32)))
    env.close()
    exported = export(policy, tmp_path / "sac", "onnx")
    over_ros = over_ros_in_lockstep(tmp_path, "sim_panda", "PushT", options, exported, 2)
    in_process = in_process_episodes(exported, options, 2, "PushT")
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-6)
    assert over_ros.returns[0] != over_ros.returns[1]


def test_a_legged_policy_over_ros_runs_the_in_process_episodes(
    tmp_path: Path, ros_domain: None, quadruped_export: tuple[Path, dict]
) -> None:
    """Quadruped over ROS 2: the sim robot publishes joint states, IMU, odometry and the episode's velocity command
    on /cmd_vel, and the deploy node makes the policy's observation from them through the task's own `observe` (no
    task-state topic). In lockstep its episodes are the in-process ones: the same steps tracking the command, the
    same falls (each one switched the sim robot to damping), the same lengths."""
    policy, options = quadruped_export
    episodes = 6  # on these seeds: falls in three, a few steps tracking in the sixth
    procs = start_lockstep(tmp_path, "sim_quadruped", "Quadruped", options, policy)
    try:
        over_ros = evaluate_over_ros(episodes, SEED, episode_timeout=60.0)
        assert all(p.poll() is None for p in procs.values()), "a node died"
    finally:
        stop_nodes(procs, tmp_path)
    in_process = in_process_episodes(policy, options, episodes, "Quadruped")
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_array_equal(over_ros.success_steps, in_process.success_steps)
    np.testing.assert_array_equal(over_ros.terminated, in_process.terminated)
    assert over_ros.terminated.any() and over_ros.success_steps.any()  # it fell, and it tracked on some steps
    sim_log = (tmp_path / "sim_robot.log").read_text()
    assert sim_log.count("damping on") == int(over_ros.terminated.sum())
    task = make("Quadruped", num_envs=1, **options).task
    assert task.measures(over_ros) == task.measures(in_process)


def test_a_trajectory_robot_over_ros_runs_the_in_process_episodes(
    tmp_path: Path, ros_domain: None, pusht_export: Path
) -> None:
    """A robot taking JointTrajectory (a JointTrajectoryController's interface): the deploy node sends the rest of
    each chunk on the control grid, the sim robot follows the points on their times, and in lockstep the episodes
    are the in-process ones -- the first point of each trajectory is due as the period it names ends."""
    data = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    data.update(command_type="joint_trajectory", time_from_start=1.0 / data["control_hz"])
    robot = tmp_path / "panda_jtc.yaml"
    robot.write_text(yaml.safe_dump(data))
    options = {"episode_steps": STEPS}
    over_ros = over_ros_in_lockstep(tmp_path, robot, "PushT", options, pusht_export, 2)
    in_process = in_process_episodes(pusht_export, options, 2)
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=1e-6)


def test_object_poses_and_a_goal_pose_over_ros_run_the_in_process_episodes(
    tmp_path: Path, ros_domain: None, pusht_export: Path
) -> None:
    """A cell whose perception publishes the block's pose (geometry_msgs/PoseStamped, as motion capture does) and
    the target's (RViz's goal tool), not the task's state vector (its robot file from `robotrl robot init --objects`): the deploy node rebuilds the state from them --
    the block's velocity from two successive poses, the rest exactly -- through the task's own `observe`. In
    lockstep the episodes follow the in-process ones: the same lengths, returns within what the velocity estimate
    moves them."""
    from robotrl.hardware.robot_file import RobotInit, run_init

    robot = tmp_path / "panda_mocap.yaml"
    run_init(RobotInit(model="task:PushT", objects="PushT", out=robot))
    assert RobotConfig.load(robot).topics.objects == {"block": "/mocap/block/pose"}
    options = {"episode_steps": STEPS}
    over_ros = over_ros_in_lockstep(tmp_path, robot, "PushT", options, pusht_export, 3)
    in_process = in_process_episodes(pusht_export, options, 3)
    np.testing.assert_array_equal(over_ros.lengths, in_process.lengths)
    np.testing.assert_allclose(over_ros.returns, in_process.returns, rtol=0, atol=0.05)
    np.testing.assert_array_equal(over_ros.success, in_process.success)
    log = (tmp_path / "deploy.log").read_text()
    assert "malformed" not in log and "not used" not in log
