"""Quadruped on real MuJoCo: reset, standing, fall detection, numpy/jax parity, the trot expert and MJX."""

import mujoco
import numpy as np
import pytest

from robotrl.envs import make, make_task
from robotrl.envs.task import Frame
from robotrl.envs.tasks import quadruped as Q
from robotrl.envs.tasks.quadruped import STATE_LAYOUT


def part(obs, key):
    a, b = STATE_LAYOUT[key]
    return obs["state"][:, a:b]


def set_command(env, command):
    state = env.get_state()
    state["goal"][:] = command
    env.set_state(state)
    return env._observe()


def test_spec_and_leg_kinematics_match_mujoco():
    task = make_task("Quadruped")
    spec = task.spec()
    assert spec.action.shape == (12,) and spec.control_hz == 50.0 and len(spec.joint_names) == 12
    assert spec.observations["state"].shape == (Q.STATE_DIM,)
    assert 11.0 < task.model.body_mass.sum() < 14.0 and task.n_substeps == 5
    m, d = task.model, mujoco.MjData(task.model)
    q = Q.DEFAULT_QPOS + 0.3 * np.random.default_rng(0).standard_normal(12)
    d.qpos[3], d.qpos[7:] = 1.0, q
    mujoco.mj_forward(m, d)
    feet = np.array([d.geom_xpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, f"{leg}_foot")] for leg in Q.LEGS])
    np.testing.assert_allclose(Q.leg_fk(np, q[None])[0], feet - d.qpos[:3], atol=1e-9)
    np.testing.assert_allclose(Q.leg_ik(np, feet[None] - d.qpos[:3]), q[None], atol=1e-9)


def test_reset_is_deterministic_for_a_seed_and_varied_across_envs():
    a, b = make("Quadruped", num_envs=6, seed=0), make("Quadruped", num_envs=6, seed=0)
    oa, _ = a.reset(seed=5)
    ob, _ = b.reset(seed=5)
    np.testing.assert_array_equal(oa["state"], ob["state"])
    np.testing.assert_array_equal(a.get_state()["physics"], b.get_state()["physics"])
    oc, _ = a.reset(seed=6)
    assert not np.allclose(oa["state"], oc["state"])
    cmd = part(oa, "command")
    assert np.unique(np.round(cmd, 6), axis=0).shape[0] == 6
    cfg = a.task.config
    for i, (lo, hi) in enumerate((cfg.vx_range, cfg.vy_range, cfg.yaw_rate_range)):
        assert np.all((cmd[:, i] >= lo) & (cmd[:, i] <= hi))
    np.testing.assert_allclose(part(oa, "gravity"), np.tile([0.0, 0.0, -1.0], (6, 1)), atol=1e-6)  # upright
    assert np.all(np.abs(part(oa, "joint_pos")) <= cfg.init_joint_noise + 1e-6)
    a.close()
    b.close()


def test_standing_with_zero_action_lasts_a_full_episode():
    env = make("Quadruped", num_envs=8, seed=0, autoreset=False)
    env.reset(seed=0)
    zero = np.zeros((8, 12), np.float32)
    for _ in range(env.task.config.episode_steps - 1):
        _, _, terminated, truncated, _ = env.step(zero)
        assert not terminated.any() and not truncated.any()
    _, _, terminated, truncated, _ = env.step(zero)
    assert not terminated.any() and truncated.all()
    f = env.frame()
    assert np.all(np.abs(f.qpos[:, 2] - Q.STAND_HEIGHT) < 0.05)  # standing, not crouched on the knees
    assert np.all(np.linalg.norm(f.qvel[:, :3], axis=1) < 0.05)  # and at rest
    env.close()


def test_fall_is_detected_and_terminates():
    env = make("Quadruped", num_envs=3, seed=0)
    env.reset(seed=0)
    state = env.get_state()
    qpos = state["physics"][:, 1:20]
    qpos[0, 3:7] = [0.0, 1.0, 0.0, 0.0]  # upside down
    qpos[1, 3:7] = [np.cos(0.7), np.sin(0.7), 0.0, 0.0]  # rolled 1.4 rad onto its side
    qpos[2, 2] = 0.10  # trunk on the ground
    env.set_state(state)
    obs, reward, terminated, truncated, info = env.step(np.zeros((3, 12), np.float32))
    assert terminated.all() and not truncated.any() and not info["success"].any()
    assert info["_final_obs"].all()  # auto-reset into a fresh, upright start
    np.testing.assert_allclose(part(obs, "gravity")[:, 2], -1.0, atol=1e-6)
    # a small tilt is not a fall
    env.reset(seed=0)
    state = env.get_state()
    state["physics"][:, 4:8] = [np.cos(0.15), np.sin(0.15), 0.0, 0.0]
    env.set_state(state)
    _, _, terminated, _, _ = env.step(np.zeros((3, 12), np.float32))
    assert not terminated.any()
    env.close()


def test_success_and_reward_follow_tracking_error():
    task = make_task("Quadruped")
    n = 3
    qpos = np.tile(np.r_[0.0, 0.0, Q.STAND_HEIGHT, 1.0, 0.0, 0.0, 0.0, Q.DEFAULT_QPOS], (n, 1))
    sens = np.zeros((n, task.model.nsensordata))
    sens[:, task._sensor_slices["imu_quat"]] = [1.0, 0.0, 0.0, 0.0]
    sens[:, task._sensor_slices["imu_vel"]] = [[0.5, 0.0, 0.0], [0.7, 0.0, 0.0], [0.0, 0.0, 0.0]]
    goal = np.tile([0.5, 0.0, 0.0], (n, 1))
    frame = Frame(qpos, np.zeros((n, 18)), sens, goal)
    dense, success = task.reward(np, frame, np.zeros((n, 12)))
    assert success.tolist() == [True, True, False]  # 0.2 m/s error tracks, 0.5 m/s does not
    assert dense[0] > dense[1] > dense[2]


def test_task_functions_agree_between_numpy_and_jax():
    jnp = pytest.importorskip("jax.numpy")
    task = make_task("Quadruped")
    u = np.random.default_rng(0).random((5, task.reset_dims))
    a, b = task.reset(np, u), task.reset(jnp, jnp.asarray(u))
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(y), x, atol=1e-5)
    sens = np.random.default_rng(1).standard_normal((5, task.model.nsensordata))
    qvel = np.random.default_rng(2).standard_normal((5, 18))
    frame = Frame(a.qpos, qvel, sens, a.goal)
    fj = Frame(*(jnp.asarray(x) for x in frame))
    action = np.random.default_rng(3).uniform(-1, 1, (5, 12))
    np.testing.assert_allclose(np.asarray(task.observe(jnp, fj)["state"]), task.observe(np, frame)["state"], atol=1e-4)
    np.testing.assert_allclose(
        np.asarray(task.control(jnp, fj, jnp.asarray(action))), task.control(np, frame, action), atol=1e-5
    )
    for x, y in zip(task.reward(jnp, fj, jnp.asarray(action)), task.reward(np, frame, action)):
        np.testing.assert_allclose(np.asarray(x), y, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(task.terminated(jnp, fj)), task.terminated(np, frame))


def _walk(policy_is_expert: bool, command, n=8, steps=200, noise=0.0):
    env = make("Quadruped", num_envs=n, seed=0, autoreset=False)
    env.reset(seed=0)
    obs = set_command(env, command)
    expert = env.task.expert(noise=noise, seed=0)
    expert.reset(n)
    start = env.frame().qpos.copy()
    ret, fell = np.zeros(n), np.zeros(n, bool)
    for _ in range(steps):
        action = expert.act(obs) if policy_is_expert else np.zeros((n, 12), np.float32)
        obs, reward, terminated, _, _ = env.step(action)
        ret += np.where(fell, 0.0, reward)
        fell |= terminated
    end = env.frame().qpos
    # displacement along the initial heading (the command is in the trunk frame)
    yaw = 2.0 * np.arctan2(start[:, 6], start[:, 3])
    forward = (end[:, 0] - start[:, 0]) * np.cos(yaw) + (end[:, 1] - start[:, 1]) * np.sin(yaw)
    env.close()
    return forward, ret, fell


def test_expert_walks_forward_and_beats_standing_still():
    fwd, ret, fell = _walk(True, [0.6, 0.0, 0.0])
    fwd0, ret0, _ = _walk(False, [0.6, 0.0, 0.0])
    assert not fell.any()
    assert np.all(fwd > 1.5), fwd  # 4 s at 0.6 m/s is 2.4 m (the expert makes ~2.0); standing still goes nowhere
    assert np.all(np.abs(fwd0) < 0.2)
    assert ret.mean() > ret0.mean() + 50.0


def test_mjx_accepts_the_model_with_only_foot_floor_contacts():
    mjx = pytest.importorskip("mujoco.mjx")
    from mujoco.mjx._src import collision_driver

    task = make_task("Quadruped")
    mjx.make_data(mjx.put_model(task.model))  # raises on anything MJX does not implement
    m = task.model
    pairs = list(collision_driver.geom_pairs(m))
    names = sorted(
        tuple(sorted(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (g1, g2))) for g1, g2, _ in pairs
    )
    assert names == sorted(tuple(sorted(("floor", f"{leg}_foot"))) for leg in Q.LEGS)


@pytest.mark.slow  # XLA's CPU compile of mjx.step takes tens of seconds on a small shared machine
def test_model_steps_in_mjx_without_nan():
    jax = pytest.importorskip("jax")
    from mujoco import mjx

    task = make_task("Quadruped")
    mx = mjx.put_model(task.model)
    qpos = np.r_[0.0, 0.0, Q.STAND_HEIGHT + 0.01, 1.0, 0.0, 0.0, 0.0, Q.DEFAULT_QPOS]
    d = mjx.make_data(mx).replace(qpos=jax.numpy.asarray(qpos), ctrl=jax.numpy.asarray(Q.DEFAULT_QPOS))
    step = jax.jit(mjx.step)
    for _ in range(50):
        d = step(mx, d)
    q = np.asarray(d.qpos)
    assert np.all(np.isfinite(q)) and np.all(np.isfinite(np.asarray(d.qvel)))
    assert abs(q[2] - Q.STAND_HEIGHT) < 0.03  # landed on its feet and stands


def test_teleop_noise_degrades_the_expert():
    _, clean, _ = _walk(True, [0.6, 0.0, 0.0])
    _, noisy, _ = _walk(True, [0.6, 0.0, 0.0], noise=0.3)
    assert noisy.mean() < clean.mean() - 10.0
