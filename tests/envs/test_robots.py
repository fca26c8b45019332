"""Robots from description files (robotrl/envs/robots): URDFs of example-robot-data and the user's own, MJCF files
and the task arm's scene compile with their joints, limits and an `ee` site; the chain's forward kinematics and
Jacobian are MuJoCo's own (mj_kinematics, mj_jacSite) to float rounding, in numpy and under jax.jit; its IK reaches
poses; broken descriptions are one line naming the source."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from robotrl.envs.robots import Chain, IKConfig, RobotDescriptionError, load_robot
from robotrl.envs.robots.description import example_robot_data

ROBOTS = [
    "task:Reach",
    "task:PickPlace",
    "example-robot-data:ur5",
    "example-robot-data:so101",
    "example-robot-data:panda",
]

#: hinges off their body's origin, two joints on one body, a slide, tilted axes and a reference angle (qpos0)
ODD_ARM = """
<mujoco>
  <worldbody>
    <body name="b1" pos="0.1 0 0.2" quat="0.9 0.1 0.3 0.2">
      <joint name="j1" type="hinge" axis="0.3 0.4 0.866" pos="0.05 -0.02 0.01" ref="0.4"/>
      <geom size="0.05"/>
      <body name="b2" pos="0 0.3 0">
        <joint name="j2" type="slide" axis="1 1 0"/>
        <joint name="j3" type="hinge" axis="0 1 0" pos="0 0 0.1"/>
        <geom size="0.05"/>
        <body name="b3" pos="0.2 0 0" euler="0.3 -0.2 1.0">
          <joint name="j4" type="hinge" axis="1 0 0" range="-1 1"/>
          <geom size="0.05"/>
          <site name="tip" pos="0.1 0.02 -0.03" euler="0.5 0.1 0"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>"""


def mujoco_kinematics(model: mujoco.MjModel, chain: Chain, q: np.ndarray) -> tuple[np.ndarray, ...]:
    """MuJoCo's own site pose and Jacobian columns of the chain's joints, per configuration."""
    data, sid = mujoco.MjData(model), mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, chain.site)
    dofs = [int(model.jnt_dofadr[j]) for j in chain.joint_ids]
    pos, rot, jac = [], [], []
    for qi in q:
        data.qpos[:] = model.qpos0
        data.qpos[chain.qpos_adr] = qi
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        jp, jr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
        mujoco.mj_jacSite(model, data, jp, jr, sid)
        pos.append(data.site_xpos[sid].copy())
        rot.append(data.site_xmat[sid].reshape(3, 3).copy())
        jac.append(np.vstack([jp, jr])[:, dofs])
    return np.array(pos), np.array(rot), np.array(jac)


def random_q(chain: Chain, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(chain.limits[:, 0], chain.limits[:, 1], (n, chain.dof))


@pytest.mark.parametrize("source", ROBOTS)
def test_chain_is_mujocos_kinematics(source: str) -> None:
    robot = load_robot(source)
    q = random_q(robot.chain, 20)
    ours, theirs = robot.chain.forward(np, q), mujoco_kinematics(robot.model, robot.chain, q)
    for name, a, b in zip(("position", "rotation", "jacobian"), ours, theirs):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(robot.ee_position(q[3]), theirs[0][3], atol=1e-12)


def test_chain_handles_offset_anchors_slides_tilted_axes_and_reference_angles() -> None:
    model = mujoco.MjModel.from_xml_string(ODD_ARM)
    chain = Chain(model, "tip")
    assert chain.joint_names == ("j1", "j2", "j3", "j4")
    q = np.random.default_rng(1).uniform(-1.5, 1.5, (20, 4))
    for name, a, b in zip(
        ("position", "rotation", "jacobian"), chain.forward(np, q), mujoco_kinematics(model, chain, q)
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=name)


def test_chain_is_the_same_under_jax_jit() -> None:
    chain = load_robot("example-robot-data:ur5").chain
    q = random_q(chain, 8)
    with jax.enable_x64(True):
        ours = jax.jit(lambda x: chain.forward(jnp, x))(jnp.asarray(q))
    for a, b in zip(ours, chain.forward(np, q)):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-12)


@pytest.mark.parametrize("source, pose", [("example-robot-data:ur5", True), ("example-robot-data:so101", False)])
def test_ik_reaches_reachable_poses(source: str, pose: bool) -> None:
    """Poses of random configurations around a start, reached from it by repeated DLS steps: the full pose on the
    6-joint UR5, the position on the 5-joint SO-101 (its wrist cannot take every orientation). The start is a
    random configuration too: the middle of the ranges is the UR's stretched-out singularity."""
    chain = load_robot(source).chain
    home = 0.5 * random_q(chain, 1, seed=5)[0] + 0.5 * chain.limits.mean(axis=1)
    goal = home + np.random.default_rng(2).uniform(-0.4, 0.4, (16, chain.dof))  # around the start: local IK's reach
    target_pos, target_rot, _ = chain.forward(np, goal)
    q, exact = np.tile(home, (16, 1)), IKConfig(damping=0.01, nullspace_gain=0.0)
    for _ in range(300):
        q = chain.ik(np, q, target_pos, target_rot if pose else None, home, exact)
    pos, rot, _ = chain.forward(np, q)
    reached = np.linalg.norm(pos - target_pos, axis=1) < 2e-3
    if pose:
        reached &= np.abs(rot - target_rot).max(axis=(1, 2)) < 1e-2
    assert reached.all(), np.linalg.norm(pos - target_pos, axis=1)
    assert (q >= chain.limits[:, 0]).all() and (q <= chain.limits[:, 1]).all()


def test_a_users_own_urdf_and_mjcf_load(tmp_path: Path) -> None:
    """A URDF copied out of its package keeps finding its meshes by package:// (example-robot-data's folder); an
    MJCF file loads with a site as its end effector, moved along the site's z by a tool offset."""
    urdf = tmp_path / "my_ur5.urdf"
    urdf.write_text((example_robot_data() / "ur_description/urdf/ur5_robot.urdf").read_text())
    mine, theirs = load_robot(urdf, ee="tool0"), load_robot("example-robot-data:ur5")
    assert mine.joint_names == theirs.joint_names and mine.model.nmesh == theirs.model.nmesh > 0
    mjcf = tmp_path / "odd.xml"
    mjcf.write_text(ODD_ARM)
    robot = load_robot(mjcf, ee="tip", tool_offset=0.1)
    q = np.zeros(4)
    tip = Chain(robot.model, "tip").forward(np, q[None])
    np.testing.assert_allclose(robot.ee_position(q), tip[0][0] + 0.1 * tip[1][0][:, 2], atol=1e-12)


def test_broken_descriptions_are_one_line(tmp_path: Path) -> None:
    cases = [
        ("example-robot-data:nope", "expected one of .*'ur5'"),
        (tmp_path / "missing.urdf", "no such file"),
        (tmp_path / "robot.stl", r"expected a \.urdf or \.xml"),
        ("task:Nope", "robot 'task:Nope'"),
    ]
    for source, match in cases:
        with pytest.raises(RobotDescriptionError, match=match) as err:
            load_robot(source)
        assert "\n" not in str(err.value)
    with pytest.raises(RobotDescriptionError, match="ee: no body or site named 'hand'"):
        load_robot("example-robot-data:ur5", ee="hand")
    with pytest.raises(RobotDescriptionError, match="ee: expected the end effector's body or site name"):
        load_robot(example_robot_data() / "ur_description/urdf/ur5_robot.urdf")
    broken = tmp_path / "broken.xml"
    broken.write_text(
        "<mujoco><worldbody><body name='hand'><geom type='mesh' mesh='nope'/></body></worldbody></mujoco>"
    )
    with pytest.raises(RobotDescriptionError, match="broken.xml: MuJoCo cannot"):
        load_robot(broken, ee="hand")


def test_reach_takes_a_ur5_from_its_urdf() -> None:
    """Reach composed with example-robot-data's UR5 (MuJoCo's model editing: the UR5 attached to Reach's scene, its
    stylus on tool0): the spec and observation carry the UR5's six joints under their URDF names, the start pose is
    solved by the chain's IK (tool down at the ready point), the scripted expert reaches its targets, and the
    task's own arm is unchanged when no robot is given."""
    from robotrl.envs import make, make_task
    from robotrl.envs.rollouts import evaluate_expert

    env = make("Reach", num_envs=25, seed=0, robot="example-robot-data:ur5", robot_base=(0.2, 0.0, 0.0))
    ur5 = load_robot("example-robot-data:ur5")
    assert env.task_spec.joint_names == ur5.joint_names
    assert env.single_observation_space["state"].shape == (2 * 6 + 9,)
    tool, rot, _ = env.task.arm.forward(np, env.task.home[None])
    np.testing.assert_allclose(tool[0], env.task.ready_point, atol=0.01)
    np.testing.assert_allclose(rot[0][:, 2], [0, 0, -1], atol=0.01)  # pointing down
    assert evaluate_expert(env, noise=0.0, episodes=100, seed=0).success_rate >= 0.95
    env.close()
    joints = make("Reach", num_envs=2, seed=0, robot="example-robot-data:ur5", action_mode="joint_pos")
    assert joints.single_action_space.shape == (6,)
    joints.close()
    assert make_task("Reach").spec().observations["state"].shape == (23,)


def test_pusht_takes_a_ur5() -> None:
    """PushT with the UR5: the pusher on tool0, the robot attached after the block (its joints after the block's in
    qpos, read through the task's slices), the start solved with the tip at the task's start point; the expert
    pushes the T home as with the task arm. The base at the origin puts the start 0.30 m from the UR5's base axis
    (at `robot_base=[0.2,0,0]` it is at the arm's inner singularity, where an x command barely moves the tool)."""
    from robotrl.envs import make
    from robotrl.envs.rollouts import evaluate_expert
    from robotrl.envs.tasks.push_t import TIP_START

    env = make("PushT?robot=example-robot-data:ur5", num_envs=10, seed=0)
    task = env.task
    assert task.block_q == 0 and task.arm_q == slice(3, 9) and env.task_spec.joint_names[0] == "shoulder_pan_joint"
    assert env.single_observation_space["state"].shape == (2 * 6 + 20,)
    np.testing.assert_allclose(task.arm.forward(np, task.start[None])[0][0], TIP_START, atol=0.01)
    assert evaluate_expert(env, noise=0.0, episodes=20, seed=0).success_rate >= 0.9
    env.close()


@pytest.mark.parametrize(
    "name", ["Reach?robot=example-robot-data:ur5&robot_base=[0.2,0,0]", "PushT?robot=example-robot-data:ur5"]
)
def test_a_loaded_robot_tracks_its_steps_without_overshoot(name: str) -> None:
    """A loaded robot's servos are critically damped: a constant end-effector step command moves the tool, each
    control step, most of the way to its target and never past it (the URDF's undamped drives overshot a step by
    up to 1.8x, and a limited drive with the damping lagged it at a fifth of the step). Measured by
    bench/robot_servo.py's step response."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from robot_servo import step_response

    for axis in (0, 1):
        moved = step_response(name, axis, steps=4, seed=0)
        assert all(0.6 <= m <= 1.0 for m in moved), f"{name}: axis {axis}: the tool moved {moved} of each step"


def test_pick_place_takes_a_ur5() -> None:
    """PickPlace with the UR5: the gripper (fingers on slide joints, the wrist camera) on tool0, the robot and its
    fingers attached after the cubes in qpos, the actuators reordered to control()'s [arm, fingers]; the expert
    picks and places by a real friction grasp as with the task arm, in both action modes' spaces."""
    from robotrl.envs import make
    from robotrl.envs.rollouts import evaluate_expert

    env = make("PickPlace?robot=example-robot-data:ur5&robot_base=[0.2,0,0]", num_envs=10, seed=0)
    task = env.task
    assert (task.cube_q, task.arm_q, task.finger_q) == (0, slice(21, 27), [27, 28])
    names = [task.model.actuator(i).name for i in task.ctrl_order.argsort()]
    assert names == [f"act_{j}" for j in task.arm.joint_names] + ["act_finger_l", "act_finger_r"]
    assert env.single_observation_space["state"].shape == (2 * 6 + 36,)
    assert evaluate_expert(env, noise=0.0, episodes=10, seed=0).success_rate >= 0.9
    env.close()
    joints = make("PickPlace?robot=example-robot-data:ur5", num_envs=1, seed=0, action_mode="joint_pos")
    assert joints.single_action_space.shape == (7,) and joints.task.model.camera("wrist").id >= 0
    joints.close()


def test_a_task_name_carries_its_options() -> None:
    """`Reach?robot=...&robot_base=[...]` is Reach with those options (JSON values) wherever a task name goes, not
    an outside env for the ':' inside an option; options given both ways must agree."""
    from robotrl.envs import make_task
    from robotrl.envs.outside import is_outside

    name = "Reach?robot=example-robot-data:ur5&robot_base=[0.2,0,0]"
    assert not is_outside(name) and is_outside("gym:Pendulum-v1?g=9.8")
    task = make_task(name)
    assert task.config.robot == "example-robot-data:ur5" and list(task.config.robot_base) == [0.2, 0, 0]
    assert task.spec().metadata["task_options"]["robot"] == "example-robot-data:ur5"  # what evaluations rebuild
    assert make_task(name, robot="example-robot-data:ur5").arm.dof == 6
    with pytest.raises(ValueError, match="sets robot='example-robot-data:ur5', the options 'x.urdf'"):
        make_task(name, robot="x.urdf")


def test_ik_takes_one_rotation_for_every_env_in_numpy_and_under_jax_jit() -> None:
    """A target rotation shared by all envs (3, 3), as Reach's tool pointing down, is the same step as that rotation
    given per env (n, 3, 3); and the step under jax.jit is numpy's."""
    chain = load_robot("example-robot-data:ur5").chain
    q = random_q(chain, 8, seed=3)
    home = chain.limits.mean(axis=1)
    target_pos = chain.forward(np, q)[0] + 0.05
    target_rot = chain.forward(np, random_q(chain, 1, seed=4))[1][0]
    shared = chain.ik(np, q, target_pos, target_rot, home)
    np.testing.assert_array_equal(shared, chain.ik(np, q, target_pos, np.broadcast_to(target_rot, (8, 3, 3)), home))
    assert np.abs(shared - q).max() > 1e-3  # a real step
    with jax.enable_x64(True):
        traced = jax.jit(lambda x: chain.ik(jnp, x, target_pos, target_rot, home))(jnp.asarray(q))
    np.testing.assert_allclose(np.asarray(traced), shared, atol=1e-12)
