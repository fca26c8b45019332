"""Task state from object poses (`hardware/objects.py`, `TaskIO.object_observation`): what a perception or
motion-capture system publishes (one geometry_msgs/PoseStamped per object, the goal as a pose or an instruction)
turned back into the task's state observation, against the simulator's own observation of the same state."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from robotrl.core.spec import SpecMismatchError
from robotrl.envs import make_task
from robotrl.hardware.deploy import DeployConfig, DeployNode
from robotrl.hardware.messages import MalformedMessage, arrays_to_joint_state, pose_stamped, pose_to_arrays
from robotrl.hardware.objects import task_objects
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig
from robotrl.hardware.sim_robot import SimRobot, SimRobotConfig
from robotrl.hardware.task_io import TaskIO
from ros_spin import in_one_executor, spin_until

CASES = [("PushT", "sim_panda"), ("PickPlace", "sim_panda_hand"), ("Reach", "sim_panda")]


def test_an_objects_pose_gives_back_its_joint_positions() -> None:
    """PushT's block (slides and a hinge) and PickPlace's cubes (free joints): pose -> joint positions is exact;
    the block's heading continues past pi from the previous one; a tilted estimate of the planar block (a camera's
    error) is projected onto the joints it has; a cube's quaternion keeps the previous one's sign."""
    rng = np.random.default_rng(0)
    for task in ("PushT", "PickPlace"):
        objects = task_objects(make_task(task))
        for name, joints in objects.joints.items():
            for _ in range(5):
                qpos = objects.model.qpos0.copy()
                qpos[joints.qadr] += rng.uniform(-0.3, 0.3, joints.qadr.size)
                if joints.free:
                    qpos[joints.qadr[3:]] /= np.linalg.norm(qpos[joints.qadr[3:]])
                pose = objects.poses(qpos)[name]
                np.testing.assert_allclose(objects.qpos_of(name, *pose), qpos[joints.qadr], rtol=0, atol=1e-9)
    block = task_objects(make_task("PushT"))
    qpos = block.model.qpos0.copy()
    qpos[block.joints["block"].qadr] = [0.5, 0.1, -3.1]  # just past -pi from +3.1
    position, orientation = block.poses(qpos)["block"]
    np.testing.assert_allclose(
        block.qpos_of("block", position, orientation, guess=np.array([0.5, 0.1, 3.1])),
        [0.5, 0.1, 2 * np.pi - 3.1],
        atol=1e-9,
    )
    tilt = np.array([np.cos(0.02), np.sin(0.02), 0.0, 0.0])  # 2.3 degrees about x, then the block's own yaw
    w1, x1, y1, z1 = tilt
    w2, x2, y2, z2 = orientation
    tilted = np.array(
        [w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
         w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2]
    )  # fmt: skip
    np.testing.assert_allclose(block.qpos_of("block", position, tilted)[:2], [0.5, 0.1], atol=1e-9)
    assert abs(np.angle(np.exp(1j * (block.qpos_of("block", position, tilted)[2] + 3.1)))) < 1e-3
    cubes = task_objects(make_task("PickPlace"))
    position, orientation = cubes.poses(cubes.model.qpos0)["cube_red"]
    flipped = cubes.qpos_of("cube_red", position, -orientation, guess=np.r_[position, orientation])
    np.testing.assert_array_equal(flipped[3:], orientation)


@pytest.mark.parametrize(("task", "robot"), CASES)
def test_the_observation_made_from_poses_is_the_simulators(task: str, robot: str) -> None:
    """Step after step of the task's noisy expert, the state made from the joint states, the objects' poses and
    the goal (both through their messages) is the simulator's: exactly, but for the tool position (MuJoCo's sensor
    of the state itself; the simulator's is one physics substep old) and the objects' velocities, which are
    their mean over the control period (from two successive poses) where the simulator's are the period's last."""
    config = RobotConfig.load(robot)
    sim = SimRobot(SimRobotConfig(task=task, seed=3), config)
    io = TaskIO(make_task(task).spec(), config)
    expert = sim.task.expert(noise=0.3, seed=0)
    expert.reset(1)
    dt = 1.0 / sim.control_hz
    before: dict[str, np.ndarray] = {}
    fields = io.fields
    moved = 0.0
    for step in range(40):
        q, dq = sim.joint_state()
        objects = {}
        for name, pose in sim.object_poses().items():
            qpos = io.objects.qpos_of(name, *pose_to_arrays(pose_stamped(*pose)), guess=before.get(name))
            velocity = np.zeros(io.objects.joints[name].dadr.size)
            if name in before:
                velocity = io.objects.qvel_of(name, before[name], qpos, dt)
                mean = io.objects.qvel_of(name, before[name], sim.data.qpos[io.objects.joints[name].qadr], dt)
                np.testing.assert_allclose(velocity, mean, rtol=0, atol=1e-9)
            before[name] = qpos
            objects[name] = (qpos, velocity)
        goal_pose = sim.goal_pose()
        instruction = str(sim.observation().get("instruction", ""))
        goal = io.goal_of(None if goal_pose is None else pose_to_arrays(pose_stamped(*goal_pose)), instruction)
        np.testing.assert_allclose(goal, sim.goal, rtol=0, atol=1e-12)
        got, want = io.object_observation(q, dq, objects, goal)["state"], sim.observation()["state"]
        for field, where in fields.items():
            if field in ("block_vel",):
                continue
            tolerance = 3e-3 if field in ("tool_pos", "target_rel", "tool_in_block") else 1e-6
            np.testing.assert_allclose(got[where], want[where], rtol=0, atol=tolerance, err_msg=f"{task} {field}")
        if "block_vel" in fields:
            moved = max(moved, float(np.abs(want[fields["block_vel"]]).max()))
        action = expert.act({k: v[None] for k, v in sim.observation().items()})[0]
        sim.command(io.joint_targets(q, action), step * dt)
        sim.step(step * dt)
    assert task != "PushT" or moved > 0.05  # the block was pushed: its velocities were checked while it moved


def test_a_robot_file_naming_no_topic_for_an_object_or_a_bad_pose_is_refused_in_one_line(tmp_path: Path) -> None:
    data = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    data["topics"]["objects"] = {"cube_red": "/mocap/cube_red/pose"}
    path = tmp_path / "panda.yaml"
    path.write_text(yaml.safe_dump(data))
    io = TaskIO(make_task("PushT").spec(), RobotConfig.load(path))
    with pytest.raises(SpecMismatchError, match=r"topics.objects: expected a PoseStamped topic for each of PushT's "
                       r"objects \['block'\], got none for \['block'\]"):  # fmt: skip
        io.check_objects()
    data["topics"]["objects"] = ["/mocap/block/pose"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="topics.objects"):
        RobotConfig.load(path)
    bad = pose_stamped(np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0]))
    bad.pose.orientation.w = 0.0
    with pytest.raises(MalformedMessage, match=r"PoseStamped.pose.orientation: expected a unit quaternion, got norm 0"):
        pose_to_arrays(bad)
    bad = pose_stamped(np.array([np.nan, 0.0, 0.0]), np.array([1.0, 0.0, 0.0, 0.0]))
    with pytest.raises(MalformedMessage, match=r"PoseStamped.pose.position: expected finite values"):
        pose_to_arrays(bad)
    with pytest.raises(ValueError, match=r"instruction: expected one cube colour of \['red', 'green', 'blue'\]"):
        make_task("PickPlace").goal_from_instruction("put it in the bin")


def test_the_deploy_node_acts_on_poses_once_it_has_the_goal_and_holds_when_they_stop(
    ros: None, pusht_export: Path, tmp_path: Path
) -> None:
    """In process over DDS, a harness publishing what a motion-capture cell does (joint states, the block's pose):
    the deploy node's state is the simulator's own (the block at rest: exactly, to float32); it does not act until
    the goal pose is heard; then it drives the arm; a malformed pose is counted, not used; when the poses stop, it
    holds within one `max_obs_age`."""
    data = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    data["topics"].update(objects={"block": "/mocap/block/pose"}, goal="/goal_pose")
    path = tmp_path / "panda_mocap.yaml"
    path.write_text(yaml.safe_dump(data))
    config = RobotConfig.load(path)
    sim = SimRobot(SimRobotConfig(task="PushT", seed=0), config)
    q, dq = sim.joint_state()
    block, goal = sim.object_poses()["block"], sim.goal_pose()
    assert goal is not None

    harness = Node("mocap_harness")
    joints = harness.create_publisher(JointState, config.topics.joint_states, 10)
    pose = harness.create_publisher(PoseStamped, "/mocap/block/pose", 10)
    goal_pub = harness.create_publisher(PoseStamped, "/goal_pose", 10)
    commands: list[tuple[float, np.ndarray]] = []
    harness.create_subscription(
        Float64MultiArray, config.topics.command, lambda m: commands.append((time.monotonic(), np.array(m.data))), 10
    )
    poses = {"on": True, "bad": False}

    def publish() -> None:
        joints.publish(arrays_to_joint_state(config.joint_names, q, dq))
        if poses["on"]:
            message = pose_stamped(*block)
            if poses["bad"]:
                message.pose.orientation.w = 2.0
            pose.publish(message)

    deploy = DeployNode(DeployConfig(policy=str(pusht_export), robot=str(path)))
    with in_one_executor(deploy, harness) as executor:
        spin_until(executor, lambda: False, 0.6, publish)
        assert deploy.observation(time.monotonic()) is None and not deploy.inference_ms  # no goal: no action
        assert all(np.array_equal(c, commands[0][1]) for _, c in commands)
        goal_pub.publish(pose_stamped(*goal))
        assert spin_until(executor, lambda: len(deploy.inference_ms) > 5, 5.0, publish)
        obs = deploy.observation(time.monotonic())
        assert obs is not None
        np.testing.assert_allclose(obs["state"], sim.observation()["state"], rtol=0, atol=1e-6)
        assert any(np.abs(c - q).max() > 1e-4 for _, c in commands)  # it drives the arm
        poses["bad"] = True
        spin_until(executor, lambda: False, 0.3, publish)
        assert deploy.malformed.get("/mocap/block/pose", 0) >= 3
        poses.update(on=False, bad=False)
        held = deploy.safety.counters["held_no_target"]
        stopped = time.monotonic()
        spin_until(executor, lambda: False, 1.0, publish)
        assert deploy.safety.counters["held_no_target"] > held
        late = [c for t, c in commands if t > stopped + 0.6]  # braked to rest (within the limits) by then
        assert len(late) > 3 and all(np.array_equal(c, late[0]) for c in late)
    harness.destroy_node()
