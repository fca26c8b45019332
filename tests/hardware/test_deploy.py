"""The deploy node over real rclpy / Fast DDS, in one process with a harness node that plays the robot: it
publishes commands from fresh observations, holds within one period when they go stale, publishes nothing from
a NaN policy or while e-stopped (until ~/reset), and counts malformed messages without crashing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from hypothesis import HealthCheck, given, settings, strategies as st
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64MultiArray
from std_srvs.srv import Trigger

from robotrl.envs import make
from robotrl.envs.tasks.push_t import START_QPOS
from robotrl.hardware.deploy import DeployConfig, DeployNode
from robotrl.hardware.messages import arrays_to_joint_state, float_array_to_msg
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig
from robotrl.hardware.robot_node import INTERVENTION_TOPIC, POLICY_ACTION_TOPIC
from robotrl.hardware.safety import SafetyState
from ros_spin import in_one_executor, spin_until

ROBOT = RobotConfig.load("sim_panda")
DT = 1.0 / ROBOT.control_hz
V, A = np.asarray(ROBOT.limits.velocity), np.asarray(ROBOT.limits.acceleration)
HOME = np.asarray(START_QPOS, dtype=np.float64)


class Robot(Node):
    """The harness: publishes joint states and the task state, records commands."""

    def __init__(self) -> None:
        super().__init__("harness")
        t = ROBOT.topics
        self.js = self.create_publisher(JointState, t.joint_states, 10)
        self.state = self.create_publisher(Float64MultiArray, t.task_state, 10)
        self.estop = self.create_publisher(Bool, t.estop, 10)
        self.commands: list[tuple[float, np.ndarray]] = []
        self.create_subscription(
            Float64MultiArray, t.command, lambda m: self.commands.append((time.monotonic(), np.array(m.data))), 10
        )
        env = make("PushT", num_envs=1, seed=0)
        self.obs = env.reset(seed=0)[0]["state"][0]
        env.close()

    def publish(self, joints: JointState | None = None, state: Float64MultiArray | None = None) -> None:
        self.js.publish(joints or arrays_to_joint_state(ROBOT.joint_names, HOME))
        self.state.publish(state or float_array_to_msg(self.obs))


def run(
    executor: SingleThreadedExecutor, seconds: float, each: Callable[[], Any] | None = None, period: float = 0.01
) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if each is not None:
            each()
        executor.spin_once(timeout_sec=period)


def call_reset(executor: SingleThreadedExecutor, client: Any) -> Trigger.Response:
    """The deploy node's ~/reset answer (success or the refusal's reason)."""
    future = client.call_async(Trigger.Request())
    executor.spin_until_future_complete(future, timeout_sec=5.0)
    assert future.done(), "~/reset did not answer"
    return future.result()


@contextmanager
def deployed(config: DeployConfig) -> Iterator[tuple[DeployNode, Robot, SingleThreadedExecutor]]:
    """The deploy node and the harness robot in one executor (rclpy initialised by the `ros` fixture)."""
    deploy, robot = DeployNode(config), Robot()
    with in_one_executor(deploy, robot) as executor:
        yield deploy, robot, executor


@pytest.fixture
def nodes(ros: None, pusht_export: Path) -> Iterator[tuple[DeployNode, Robot, SingleThreadedExecutor]]:
    with deployed(DeployConfig(policy=str(pusht_export), robot="sim_panda")) as nodes:
        yield nodes


def test_commands_flow_from_fresh_observations_and_hold_when_stale(nodes: Any) -> None:
    deploy, robot, executor = nodes
    run(executor, 1.0, robot.publish)
    assert len(robot.commands) >= 10, deploy.safety.status()
    q = np.stack([c for _, c in robot.commands])
    assert q.shape[1] == 7 and np.all(np.isfinite(q))
    assert np.all(q >= ROBOT.lower()) and np.all(q <= ROBOT.upper())
    assert np.any(np.abs(q - HOME) > 1e-6)  # the policy moves the arm
    # the observations stop: within max_obs_age + one period every command is the same hold
    stopped = time.monotonic()
    run(executor, 0.6)
    late = [c for t, c in robot.commands if t > stopped + ROBOT.max_obs_age + 1.0 / ROBOT.control_hz]
    assert late and all(np.array_equal(c, late[0]) for c in late)
    assert deploy.safety.counters["held_stale"] > 0


def test_a_silent_heartbeat_holds_the_robot(ros: None, pusht_export: Path) -> None:
    """With a dead-man topic the policy drives only while True arrives on it: before the first one and within
    heartbeat_timeout + one period of the last, every command is the same hold; a False releases at once."""
    config = DeployConfig(policy=str(pusht_export), robot="sim_panda", heartbeat="/robotrl/enable")
    with deployed(config) as (deploy, robot, executor):
        pedal = robot.create_publisher(Bool, "/robotrl/enable", 10)
        run(executor, 0.5, robot.publish)  # observations, no heartbeat
        before = [c for _, c in robot.commands]
        assert all(np.array_equal(c, before[0]) for c in before)

        def both() -> None:
            robot.publish()
            pedal.publish(Bool(data=True))

        run(executor, 1.0, both)
        driven = [c for _, c in robot.commands[len(before) :]]
        assert any(not np.array_equal(c, driven[0]) for c in driven)  # the policy moves the arm
        for release in ("silence", "false"):
            if release == "false":
                run(executor, 0.5, both)
                pedal.publish(Bool(data=False))
            stopped = time.monotonic()
            run(executor, 0.6, robot.publish)  # observations keep coming; the heartbeat does not
            wait = config.heartbeat_timeout if release == "silence" else 0.0  # a False needs no timeout
            late = [c for t, c in robot.commands if t > stopped + wait + 1.0 / ROBOT.control_hz]
            assert late and all(np.array_equal(c, late[0]) for c in late), release


def test_estop_stops_everything_until_reset(nodes: Any) -> None:
    deploy, robot, executor = nodes
    diagnostics: list[DiagnosticStatus] = []
    robot.create_subscription(DiagnosticArray, ROBOT.topics.diagnostics, lambda m: diagnostics.extend(m.status), 10)
    run(executor, 0.4, robot.publish)
    robot.estop.publish(Bool(data=True))
    run(executor, 0.2, robot.publish)
    n = len(robot.commands)
    run(executor, 1.2, robot.publish)
    assert len(robot.commands) == n and deploy.safety.status()["state"] == "estopped"
    last = diagnostics[-1]  # what an operator's rqt_robot_monitor shows
    values = {kv.key: kv.value for kv in last.values}
    assert last.level == DiagnosticStatus.ERROR and last.message.startswith("estopped")
    assert int(values["blocked_estop"]) > 0 and int(values["estops"]) == 1
    client = robot.create_client(Trigger, "/robotrl_deploy/reset")
    assert client.wait_for_service(timeout_sec=5.0)
    future = client.call_async(Trigger.Request())
    assert spin_until(executor, future.done, 10.0, robot.publish), "~/reset did not answer"
    assert future.result().success, future.result()
    run(executor, 0.4, robot.publish)
    assert len(robot.commands) > n


def test_reset_is_refused_until_the_robot_topics_are_matched(ros: None, pusht_export: Path) -> None:
    """A lockstep robot sends an episode's first observation once: an episode started before DDS matched the
    node's topics would wait for it forever, so the reset says what is missing and the caller retries."""
    deploy = DeployNode(DeployConfig(policy=str(pusht_export), robot="sim_panda"))
    caller = Node("reset_caller")
    executor = SingleThreadedExecutor()
    executor.add_node(deploy)
    executor.add_node(caller)
    client = caller.create_client(Trigger, "/robotrl_deploy/reset")
    robot = None
    try:
        assert client.wait_for_service(timeout_sec=5.0)
        refused = call_reset(executor, client)
        assert not refused.success
        for missing in (
            f"no publisher on {ROBOT.topics.joint_states}",
            f"no publisher on {ROBOT.topics.task_state}",
            f"no subscriber on {ROBOT.topics.command}",
        ):
            assert missing in refused.message
        robot = Robot()  # the robot's driver comes up
        executor.add_node(robot)
        end = time.monotonic() + 10.0
        while not (answer := call_reset(executor, client)).success and time.monotonic() < end:
            run(executor, 0.05)
        assert answer.success, answer.message
    finally:
        executor.shutdown()
        deploy.close()
        for node in (deploy, caller, robot):
            if node is not None:
                node.destroy_node()


def test_a_policy_trained_at_another_control_rate_is_refused(ros: None, pusht_export: Path, tmp_path: Path) -> None:
    """A 20 Hz policy on a 200 Hz robot ran each chunk 10x as fast, without a word: the deploy node now refuses the
    pair in one line naming both rates."""
    robot = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    (tmp_path / "fast.yaml").write_text(yaml.safe_dump({**robot, "name": "fast_panda", "control_hz": 200.0}))
    with pytest.raises(ValueError, match=r"robot fast_panda runs at 200 Hz, the policy was trained at 20 Hz"):
        DeployNode(DeployConfig(policy=str(pusht_export), robot=str(tmp_path / "fast.yaml")))


def test_the_node_executes_the_actions_per_chunk_its_policy_was_chosen_at(
    ros: None, pusht_export: Path, tmp_path: Path
) -> None:
    """`execute: 0` (the parameter file's) runs the actions per chunk the export recorded (`robotrl policy export
    --execute`, the pipeline's `deploy_execute`), else 8; a number given wins; a negative one is refused by name."""
    recorded = tmp_path / "recorded"
    shutil.copytree(pusht_export, recorded)
    manifest = json.loads((recorded / "manifest.json").read_text())
    manifest["export"]["execute"] = 2
    (recorded / "manifest.json").write_text(json.dumps(manifest))
    for policy, execute, runs in ((pusht_export, 0, 8), (recorded, 0, 2), (recorded, 5, 5)):
        with deployed(DeployConfig(policy=str(policy), execute=execute)) as (deploy, robot, executor):
            assert deploy.runner.config.execute == runs
            seen: set[int] = set()  # the steps at which a chunk took over (the executor keeps only the last)

            def step(seen: set[int] = seen, deploy: DeployNode = deploy, robot: Robot = robot) -> None:
                robot.publish()
                seen.update(start for start, _ in deploy.runner.chunks)

            run(executor, 1.0, step)
            starts = sorted(seen)
            assert len(starts) >= 2 and set(np.diff(starts)) == {runs}, starts
    with pytest.raises(ValueError, match=r"DeployConfig.execute: expected >= 1 actions per chunk, or 0 \(the policy"):
        DeployConfig(policy=str(recorded), execute=-1)


def test_a_robot_file_that_allows_it_resamples_the_chunks_in_time(
    ros: None, pusht_export: Path, tmp_path: Path
) -> None:
    """With resample_chunks the 20 Hz policy runs on a 200 Hz robot: each chunk spread over 10x as many robot steps
    (its ee_delta motion divided among them), 10x as many executed, its two observation frames 10 steps apart as in
    training; at 2.5x, two frames cannot be spaced as in training: refused in one line."""
    robot = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    fast = {**robot, "name": "fast_panda", "control_hz": 200.0, "resample_chunks": True}
    (tmp_path / "fast.yaml").write_text(yaml.safe_dump(fast))
    with deployed(DeployConfig(policy=str(pusht_export), robot=str(tmp_path / "fast.yaml"))) as (deploy, r, executor):
        assert (deploy.runner.config.execute, deploy.runner.config.frame_stride) == (80, 10)
        run(executor, 1.0, r.publish)
        assert len(r.commands) >= 100  # 200 Hz
        assert deploy.runner.chunks and len(deploy.runner.chunks[-1][1]) == 80  # H = 8 policy steps
        q = np.stack([c for _, c in r.commands])
        assert np.all(np.abs(np.diff(q, axis=0)) * 200.0 <= np.asarray(ROBOT.limits.velocity) + 1e-9)
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump({**fast, "name": "odd_panda", "control_hz": 50.0}))
    with pytest.raises(ValueError, match=r"resample_chunks: a PushT policy \(obs_horizon 2\) at 2.5x its rate"):
        DeployNode(DeployConfig(policy=str(pusht_export), robot=str(tmp_path / "odd.yaml")))


def test_lockstep_reset_waits_for_the_robots_waiting_observation(ros: None, pusht_export: Path) -> None:
    """trigger=observation, wait_for_reset (the ROS eval's deploy node): a lockstep sim robot re-sends its waiting
    observation set to a late-matched subscriber. Heard after the first reset, that stale set took a step and put
    the episode one action ahead of the in-process one, so the reset is refused until a whole set has arrived; the
    episode's own set then gets exactly one command."""
    config = DeployConfig(policy=str(pusht_export), robot="sim_panda", trigger="observation", wait_for_reset=True)
    with deployed(config) as (deploy, robot, executor):
        caller = Node("reset_caller")
        executor.add_node(caller)
        client = caller.create_client(Trigger, "/robotrl_deploy/reset")
        try:
            assert client.wait_for_service(timeout_sec=5.0)
            end = time.monotonic() + 10.0
            while deploy.unconnected() and time.monotonic() < end:
                run(executor, 0.05)
            refused = call_reset(executor, client)
            assert not refused.success and refused.message == "no whole observation set from the robot yet"
            robot.publish()  # the waiting set, heard before the episode starts: no command
            run(executor, 0.3)
            assert deploy.heard_set and not robot.commands
            assert call_reset(executor, client).success
            robot.publish()  # the episode's first set
            run(executor, 0.3)
            assert len(robot.commands) == 1 and deploy.ticks == 1
        finally:
            caller.destroy_node()


def test_malformed_messages_are_counted_not_fatal(nodes: Any) -> None:
    deploy, robot, executor = nodes
    wrong_names = arrays_to_joint_state([f"j{i}" for i in range(7)], HOME)
    short_state = float_array_to_msg(robot.obs[:10])
    nan_joints = arrays_to_joint_state(ROBOT.joint_names, np.full(7, np.nan))
    bad = [(wrong_names, None), (None, short_state), (nan_joints, None)]
    k = iter(range(10**6))
    run(executor, 0.6, lambda: robot.publish(*bad[next(k) % 3]))
    assert deploy.malformed.get(ROBOT.topics.joint_states, 0) >= 2
    assert deploy.malformed.get(ROBOT.topics.task_state, 0) >= 1
    n = len(robot.commands)
    run(executor, 0.5, robot.publish)  # and good messages still drive it
    assert len(robot.commands) > n


def test_a_nan_policys_actions_never_reach_the_wire(ros: None, nan_export: Path) -> None:
    """Every action NaN: what is published is the hold, the arm where it was measured."""
    with deployed(DeployConfig(policy=str(nan_export), robot="sim_panda")) as (deploy, robot, executor):
        run(executor, 1.0, robot.publish)
        assert robot.commands and all(np.array_equal(c, HOME) for _, c in robot.commands)
        assert deploy.safety.counters["rejected_nonfinite"] >= 10


@pytest.mark.parametrize(
    "options",
    [{"asynchronous": True, "delay_steps": 2}, {"ensemble_decay": 0.01}],
    ids=["asynchronous", "temporal-ensembling"],
)
def test_asynchronous_and_ensembled_execution_drive_the_robot(ros: None, pusht_export: Path, options: dict) -> None:
    with deployed(DeployConfig(policy=str(pusht_export), robot="sim_panda", **options)) as (deploy, robot, executor):
        end = time.monotonic() + 20.0  # ~1 s on an idle machine; it ends as soon as they have driven it
        while (len(robot.commands) < 10 or deploy.runner.inferences < 2) and time.monotonic() < end:
            run(executor, 0.2, robot.publish)
        assert len(robot.commands) >= 10 and deploy.runner.inferences >= 2
        q = np.stack([c for _, c in robot.commands])
        assert np.all(np.isfinite(q)) and np.any(np.abs(q - HOME) > 1e-6)


joint_states = st.builds(
    lambda names, pos, vel: JointState(name=names, position=pos, velocity=vel),
    st.one_of(
        st.just(list(ROBOT.joint_names)), st.lists(st.sampled_from([*ROBOT.joint_names, "finger", ""]), max_size=9)
    ),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=9),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=9),
)
task_states = st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=40).map(
    lambda x: Float64MultiArray(data=x)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(joint_states, task_states), min_size=1, max_size=5))
def test_fuzzed_messages_never_crash_it_or_reach_the_wire(nodes: Any, batch: list) -> None:
    """Random joint states and task states (wrong names, counts, NaN, inf) between good ones: the node keeps
    running, and everything it publishes is finite and inside the joint limits."""
    deploy, robot, executor = nodes
    robot.commands.clear()
    for joints, state in batch:
        robot.publish(joints, state)
        executor.spin_once(timeout_sec=0.005)
        robot.publish()
        executor.spin_once(timeout_sec=0.005)
    run(executor, 0.15, robot.publish)
    assert robot.commands, "good messages after the fuzzed ones no longer drive the node"
    for _, q in robot.commands:
        assert q.shape == (7,) and np.all(np.isfinite(q))
        assert np.all(q >= ROBOT.lower()) and np.all(q <= ROBOT.upper())


def test_the_policy_yields_while_the_operator_drives(nodes: Any) -> None:
    """Human in the loop: the policy's actions go out on /robotrl/policy_action; while /robotrl/intervention says
    the operator drives, the deploy node publishes no command, and it drives again when they let go."""
    deploy, robot, executor = nodes
    actions: list[np.ndarray] = []
    robot.create_subscription(Float64MultiArray, POLICY_ACTION_TOPIC, lambda m: actions.append(np.array(m.data)), 10)
    driving = robot.create_publisher(Bool, INTERVENTION_TOPIC, 10)
    run(executor, 0.5, robot.publish)
    assert actions and all(a.shape == (2,) and np.all(np.abs(a) <= 1.0) for a in actions)
    run(executor, 0.2, lambda: (robot.publish(), driving.publish(Bool(data=True))))
    n, k = len(robot.commands), len(actions)
    run(executor, 0.5, lambda: (robot.publish(), driving.publish(Bool(data=True))))
    assert len(robot.commands) <= n + 1 and len(actions) <= k + 1  # at most one already in flight
    run(executor, 0.5, lambda: (robot.publish(), driving.publish(Bool(data=False))))
    assert len(robot.commands) > n + 3 and len(actions) > k + 3


def test_the_robot_side_imports_no_torch_nor_training_code() -> None:
    """DESIGN: robotrl.hardware runs a policy through the runtime only; torch stays off the robot."""
    code = (
        "import sys, robotrl.hardware.deploy, robotrl.hardware.sim_robot_node, robotrl.hardware.teleop_node, "
        "robotrl.policies.runtime; print(sorted(m for m in sys.modules if m.startswith('robotrl.policies')), "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['robotrl.policies',", "'robotrl.policies.runtime']", "False"], out.stdout


def test_the_deploy_node_is_a_managed_lifecycle_node(ros: None, pusht_export: Path) -> None:
    """Without autostart the node waits for a lifecycle manager: unconfigured it has no policy and commands nothing;
    configured (the policy loaded and warmed up) it still commands nothing; active it drives; deactivated its
    commanded motion brakes to rest within the limits, then nothing more is commanded; cleanup lets the robot go."""
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState, GetState

    config = DeployConfig(policy=str(pusht_export), robot="sim_panda", autostart=False)
    with deployed(config) as (deploy, robot, executor):
        change = robot.create_client(ChangeState, "/robotrl_deploy/change_state")
        get = robot.create_client(GetState, "/robotrl_deploy/get_state")
        assert change.wait_for_service(timeout_sec=5.0) and get.wait_for_service(timeout_sec=5.0)

        def call(client: Any, request: Any) -> Any:
            future = client.call_async(request)
            executor.spin_until_future_complete(future, timeout_sec=10.0)
            assert future.done()
            return future.result()

        def transition(tid: int) -> None:
            assert call(change, ChangeState.Request(transition=Transition(id=tid))).success, tid

        def state() -> str:
            return call(get, GetState.Request()).current_state.label

        assert state() == "unconfigured" and not hasattr(deploy, "policy")
        run(executor, 0.5, robot.publish)
        assert robot.commands == []
        transition(Transition.TRANSITION_CONFIGURE)
        run(executor, 0.5, robot.publish)
        assert state() == "inactive" and deploy.policy is not None and robot.commands == []
        transition(Transition.TRANSITION_ACTIVATE)
        run(executor, 1.0, robot.publish)
        assert state() == "active" and len(robot.commands) >= 10
        moving = bool(np.any(deploy.safety.velocity != 0.0))
        transition(Transition.TRANSITION_DEACTIVATE)
        n = len(robot.commands)
        run(executor, 1.0, robot.publish)
        braking = np.array([HOME if n == 0 else robot.commands[n - 1][1]] + [c for _, c in robot.commands[n:]])
        run(executor, 0.5, robot.publish)
        assert state() == "inactive" and len(robot.commands) == n + len(braking) - 1  # at rest: no more commands
        assert len(braking) > 1 or not moving  # it was moving: it braked over periods
        v = np.diff(braking, axis=0) * ROBOT.control_hz
        assert np.all(np.abs(np.diff(v, axis=0)) <= np.asarray(ROBOT.limits.acceleration) / ROBOT.control_hz + 1e-9)
        transition(Transition.TRANSITION_CLEANUP)
        assert state() == "unconfigured" and deploy.made == {}
        assert not any(p.topic_name == ROBOT.topics.command for p in deploy.publishers)  # the robot let go


@pytest.mark.parametrize("bad", ["100 s old", "1 h ahead", "backwards"])
def test_header_stamps_that_are_stale_future_or_backwards_hold_the_robot(
    ros: None, pusht_export: Path, bad: str
) -> None:
    """After a second of well-stamped joint states that drive the arm, joint states stamped 100 s in the past, an
    hour ahead of the node's clock, or running backwards are not used: the robot is held (braking to rest)."""
    with deployed(DeployConfig(policy=str(pusht_export), robot="sim_panda")) as (deploy, robot, executor):

        def now() -> float:
            return deploy.get_clock().now().nanoseconds * 1e-9

        def stamped(at: float) -> None:
            robot.publish(arrays_to_joint_state(ROBOT.joint_names, HOME, stamp=at))

        run(executor, 1.0, lambda: stamped(now()))
        assert any(not np.array_equal(c, HOME) for _, c in robot.commands), deploy.safety.status()
        frozen = now()
        stamp = {
            "100 s old": lambda: now() - 100.0,
            "1 h ahead": lambda: now() + 3600.0,
            "backwards": lambda: frozen - 0.05,
        }
        before = len(robot.commands)
        run(executor, 1.0, lambda: stamped(stamp[bad]()))
        late = [c for _, c in robot.commands[before:]]
        assert len(late) > 10 and all(np.array_equal(c, late[-1]) for c in late[-5:])  # held, at rest
        assert deploy.bad_stamps.get(ROBOT.topics.joint_states, 0) > 10
        assert deploy.safety.counters["held_stale"] > 0


def test_a_trajectory_robot_gets_the_chunk_ahead_on_the_control_grid(
    ros: None, pusht_export: Path, tmp_path: Path
) -> None:
    """With `command_type: joint_trajectory` each command carries the rest of the chunk being executed: positions
    and velocities on the control grid (the first one period ahead), every point passed by the safety filter --
    within the velocity and acceleration limits from the point before -- and the first point what a position
    stream would have been sent."""
    from trajectory_msgs.msg import JointTrajectory

    from robotrl.hardware.messages import trajectory_points

    data = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    data.update(command_type="joint_trajectory", time_from_start=1.0 / data["control_hz"])
    data["topics"]["command"] = "/arm_controller/joint_trajectory"  # the harness's command topic has another type
    (tmp_path / "panda_jtc.yaml").write_text(yaml.safe_dump(data))
    config = DeployConfig(policy=str(pusht_export), robot=str(tmp_path / "panda_jtc.yaml"), execute=8)
    with deployed(config) as (deploy, robot, executor):
        trajectories: list[JointTrajectory] = []
        robot.create_subscription(JointTrajectory, "/arm_controller/joint_trajectory", trajectories.append, 10)
        run(executor, 1.5, robot.publish)
        assert len(trajectories) >= 10
        lengths = [len(m.points) for m in trajectories]
        assert max(lengths) == 8 and min(lengths) == 1 and len(set(lengths)) == 8  # the chunk's rest, 8 down to 1
        for msg in trajectories:
            points = trajectory_points(msg, ROBOT.joint_names)
            times = np.array([at for at, _ in points])
            np.testing.assert_allclose(times, DT * np.arange(1, len(points) + 1), atol=1e-9)  # the control grid
            q = np.stack([deploy_q for _, deploy_q in points])
            v = np.stack([np.asarray(p.velocities) for p in msg.points])
            np.testing.assert_allclose(np.diff(q, axis=0) / DT, v[1:], atol=1e-9)  # each point's velocity
            assert np.all(np.abs(v) <= V + 1e-9) and np.all(np.abs(np.diff(v, axis=0)) <= A * DT + 1e-9)
            assert np.all(q >= ROBOT.lower()) and np.all(q <= ROBOT.upper())
        firsts = np.stack([trajectory_points(m, ROBOT.joint_names)[0][1] for m in trajectories])
        step = np.diff(firsts, axis=0) / DT
        assert np.all(np.abs(step) <= V + 1e-9)  # what the robot is sent now moves within the limits


def test_an_estop_that_arrives_with_an_observation_set_is_latched_before_it(ros: None, pusht_export: Path) -> None:
    """In lockstep (a command per observation set) an e-stop sent right after a set, both waiting when the node
    wakes, stops the command that set would have made: the e-stop's subscription is taken first."""
    config = DeployConfig(policy=str(pusht_export), robot="sim_panda", trigger="observation")
    with deployed(config) as (deploy, robot, executor):
        run(executor, 0.5, robot.publish)
        run(executor, 0.3)  # every command of those sets delivered
        n = len(robot.commands)
        assert n > 0
        robot.publish()
        robot.estop.publish(Bool(data=True))
        time.sleep(0.1)  # both wait for the node's next wake-up
        run(executor, 0.5)
        assert deploy.safety.state is SafetyState.ESTOPPED and len(robot.commands) == n


def test_a_control_step_takes_an_estop_that_arrived_before_it_runs(nodes: Any) -> None:
    """An executor runs an overdue control timer before the subscriptions of the same wake-up: the step itself takes
    an e-stop waiting in its subscription first, so it commands nothing."""
    deploy, robot, executor = nodes
    run(executor, 0.5, robot.publish)
    published = deploy.safety.counters["published"]
    assert published > 0
    robot.estop.publish(Bool(data=True))
    time.sleep(0.1)  # delivered to the node, not yet taken by its executor
    deploy.tick()  # the timer's callback, as an executor runs it ahead of the e-stop's
    assert deploy.safety.state is SafetyState.ESTOPPED and deploy.safety.counters["published"] == published
