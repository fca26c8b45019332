"""PickPlace on real MuJoCo: seeded resets, instructions, a real friction grasp, the expert and MJX."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from robotrl.envs import make
from robotrl.envs.tasks.pick_place import (
    CARRY,
    COLORS,
    CUBE_HALF,
    NUM_CUBES,
    STATE_LAYOUT,
    PickPlace,
)


def _env(n: int, **kw):
    return make("PickPlace", num_envs=n, seed=0, render_images=False, autoreset=False, num_threads=1, **kw)


def _get(obs: dict, key: str) -> np.ndarray:
    a, b = STATE_LAYOUT[key]
    return np.asarray(obs["state"])[:, a:b]


def _run_expert(n: int, noise: float, seed: int) -> np.ndarray:
    env = _env(n)
    expert = env.task.expert(noise=noise, seed=seed)
    expert.reset(n)
    obs, _ = env.reset(seed=seed)
    success = np.zeros(n, bool)
    for _ in range(env.task.config.episode_steps):
        obs, _, _, _, info = env.step(expert.act(obs))
        success |= info["success"]
    env.close()
    return success


def test_reset_is_deterministic_per_seed_and_cubes_do_not_overlap() -> None:
    env = _env(4)
    a, _ = env.reset(seed=11)
    b, _ = env.reset(seed=11)
    c, _ = env.reset(seed=12)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert list(a["instruction"]) == list(b["instruction"])
    assert not np.allclose(_get(a, "cube_pos"), _get(c, "cube_pos"))
    env.close()

    task = PickPlace()
    start = task.reset(np, np.random.default_rng(0).random((500, task.reset_dims)))
    cubes = start.qpos[:, 9 : 9 + 7 * NUM_CUBES].reshape(500, NUM_CUBES, 7)[:, :, :3]
    gaps = [np.linalg.norm(cubes[:, i, :2] - cubes[:, j, :2], axis=-1) for i in range(3) for j in range(i + 1, 3)]
    assert np.min(gaps) > 0.1  # room for the open fingers between neighbours
    assert np.allclose(cubes[:, :, 2], CUBE_HALF)
    assert set(np.argmax(start.goal, axis=-1)) == {0, 1, 2}  # every cube gets to be the target


def test_instruction_names_the_target_cube_colour() -> None:
    env = _env(12)
    obs, _ = env.reset(seed=3)
    m = env.task.model
    qpos = env.frame().qpos
    named = set()
    for i, text in enumerate(obs["instruction"]):
        colour = [c for c in COLORS if f" {c} " in text]
        assert len(colour) == 1 and text == f"put the {colour[0]} cube in the bin"
        named.add(colour[0])
        # the cube with that colour in the MJCF is the one the state calls the target
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, f"cube_{colour[0]}")
        adr = m.jnt_qposadr[jid]
        target = _get(obs, "target_rel")[i] + _get(obs, "tool_pos")[i]
        np.testing.assert_allclose(qpos[i, adr : adr + 3], target, atol=1e-5)
    assert len(named) >= 2
    env.close()


def test_grasp_lifts_the_cube_by_friction_and_dropping_it_lets_it_fall() -> None:
    env = _env(4)
    expert = env.task.expert(seed=0)
    expert.reset(4)
    obs, _ = env.reset(seed=5)
    idx = np.argmax(_get(obs, "target"), axis=-1)
    rewards_before, rewards_lifted = [], []
    for _ in range(80):
        obs, reward, _, _, _ = env.step(expert.act(obs))
        (rewards_lifted if (expert.phase == CARRY).all() else rewards_before).append(reward)
        if (expert.phase == CARRY).all():
            break
    assert (expert.phase == CARRY).all(), f"expert phases {expert.phase}"
    cube = _get(obs, "cube_pos").reshape(4, NUM_CUBES, 3)[np.arange(4), idx]
    ee = _get(obs, "tool_pos")
    assert (cube[:, 2] > CUBE_HALF + 0.06).all()  # lifted well off the table
    np.testing.assert_allclose(cube, ee, atol=0.02)  # and held between the fingers
    assert (np.abs(_get(obs, "gripper")[:, 0] - 2 * CUBE_HALF) < 0.006).all()  # fingers stopped by the cube
    assert np.mean(rewards_lifted[-1]) > np.mean(rewards_before[0]) + 0.3  # the dense reward tracks the stages

    # open the gripper mid-air: nothing holds the cube but friction, so it falls back to the table
    action = np.zeros((4, 5), np.float32)
    action[:, 4] = -1.0
    for _ in range(15):
        obs, *_ = env.step(action)
    cube = _get(obs, "cube_pos").reshape(4, NUM_CUBES, 3)[np.arange(4), idx]
    assert (cube[:, 2] < CUBE_HALF + 0.01).all()
    env.close()


def test_expert_succeeds_fast_check() -> None:
    assert _run_expert(16, noise=0.0, seed=100).mean() >= 15 / 16
    assert _run_expert(16, noise=0.5, seed=100).mean() >= 0.5


@pytest.mark.slow
def test_expert_success_rates_200_seeds() -> None:
    clean = _run_expert(200, noise=0.0, seed=0).mean()
    noisy = _run_expert(200, noise=0.5, seed=0).mean()
    assert clean >= 0.95, clean
    assert noisy >= 0.60, noisy


def test_joint_pos_mode_drives_joints_and_gripper() -> None:
    env = _env(2, action_mode="joint_pos")
    assert env.single_action_space.shape == (8,)
    obs, _ = env.reset(seed=0)
    action = np.zeros((2, 8), np.float32)
    action[:, 7] = 1.0  # close
    for _ in range(10):
        obs, *_ = env.step(action)
    lo, hi = env.task.model.jnt_range[:7].T
    np.testing.assert_allclose(_get(obs, "joint_pos"), np.broadcast_to(0.5 * (lo + hi), (2, 7)), atol=0.05)
    assert (_get(obs, "gripper") < 0.005).all()
    env.close()


def test_pure_functions_agree_between_numpy_and_jax() -> None:
    jnp = pytest.importorskip("jax.numpy")
    task = PickPlace()
    u = np.random.default_rng(1).random((5, task.reset_dims))
    a, b = task.reset(np, u), task.reset(jnp, jnp.asarray(u))
    np.testing.assert_allclose(a.qpos, np.asarray(b.qpos), atol=1e-6)
    np.testing.assert_array_equal(a.goal, np.asarray(b.goal))

    env = _env(3)  # a mid-episode frame: control, observation and reward agree too
    expert = env.task.expert(seed=0)
    obs, _ = env.reset(seed=2)
    for _ in range(20):
        obs, *_ = env.step(expert.act(obs))
    frame = env.frame()
    jframe = type(frame)(*(jnp.asarray(x) for x in frame))
    action = expert.act(obs).astype(np.float64)
    np.testing.assert_allclose(
        task.control(np, frame, action), np.asarray(task.control(jnp, jframe, jnp.asarray(action))), atol=1e-4
    )
    np.testing.assert_allclose(
        task.observe(np, frame)["state"], np.asarray(task.observe(jnp, jframe)["state"]), atol=1e-4
    )
    (r_np, s_np), (r_j, s_j) = task.reward(np, frame, action), task.reward(jnp, jframe, jnp.asarray(action))
    np.testing.assert_allclose(r_np, np.asarray(r_j), atol=1e-4)
    np.testing.assert_array_equal(s_np, np.asarray(s_j))
    np.testing.assert_array_equal(task.terminated(np, frame), np.asarray(task.terminated(jnp, jframe)))
    env.close()


def test_mjx_accepts_the_model_with_only_the_needed_contact_pairs() -> None:
    mjx = pytest.importorskip("mujoco.mjx")
    from mujoco.mjx._src import collision_driver

    task = PickPlace()
    mjx.make_data(mjx.put_model(task.model))  # raises on anything MJX does not implement
    m = task.model
    pairs = list(collision_driver.geom_pairs(m))
    for g1, g2, _ in pairs:
        assert collision_driver.has_collision_fn(m.geom_type[g1], m.geom_type[g2])
    names = [
        sorted(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, m.geom_bodyid[g]) for g in (g1, g2))
        for g1, g2, _ in pairs
    ]
    assert all(any(b.startswith("cube_") for b in pair) for pair in names)  # every contact involves a cube
    # per cube: table, 4 bin walls, 2 fingers; plus the 3 cube-cube pairs. Arm links and palm touch nothing.
    assert len(pairs) == NUM_CUBES * (1 + 4 + 2) + 3


@pytest.mark.slow  # XLA's CPU compile of mjx.step takes 30-100 s on a small shared machine
def test_model_steps_in_mjx_without_nan() -> None:
    jax = pytest.importorskip("jax")
    mjx = pytest.importorskip("mujoco.mjx")
    import jax.numpy as jnp

    task = PickPlace()
    mx = mjx.put_model(task.model)
    start = task.reset(np, np.random.default_rng(0).random((1, task.reset_dims)))
    d = mjx.make_data(mx).replace(
        qpos=jnp.asarray(start.qpos[0]), ctrl=jnp.asarray(np.r_[start.qpos[0, :7], 0.04, 0.04])
    )
    step = jax.jit(mjx.step)  # compiling dominates (tens of seconds on CPU), so only a few steps
    for _ in range(5):
        d = step(mx, d)
    qpos = np.asarray(d.qpos)
    assert np.isfinite(qpos).all() and np.isfinite(np.asarray(d.qvel)).all()
    cubes = qpos[9:].reshape(NUM_CUBES, 7)
    np.testing.assert_allclose(cubes[:, 2], CUBE_HALF, atol=3e-3)  # resting on the table, not falling through


def test_wrong_cube_is_detected_and_outcomes_are_split_by_instruction() -> None:
    """The expert told the wrong cube (its 'target' field rotated) puts that cube in the bin: every episode is a
    wrong-object episode and none succeeds; the true expert has no wrong-object episode. Both per instruction."""
    from robotrl.envs.rollouts import run_episodes

    a, b = STATE_LAYOUT["target"]
    for misled in (False, True):
        env = make("PickPlace", num_envs=6, seed=3, render_images=False, num_threads=1)
        expert = env.task.expert(noise=0.0, seed=3)
        expert.reset(6)

        def act(obs: dict) -> np.ndarray:
            if misled:  # noqa: B023 -- act runs within this iteration
                obs = {**obs, "state": np.asarray(obs["state"]).copy()}
                obs["state"][:, a:b] = np.roll(obs["state"][:, a:b], 1, axis=1)
            return expert.act(obs)  # noqa: B023

        stats = run_episodes(env, act, 6, seed=3, on_episode_start=expert.reset_env)
        env.close()
        assert stats.instruction is not None and stats.wrong_object is not None
        assert all(t in {f"put the {c} cube in the bin" for c in COLORS} for t in stats.instruction)
        rows = stats.by_instruction()
        assert sum(r["episodes"] for r in rows.values()) == 6 and len(rows) >= 2
        if misled:
            assert stats.wrong_object.all() and not stats.success.any(), stats
            assert all(r["wrong_object_rate"] == 1.0 and r["success_rate"] == 0.0 for r in rows.values())
        else:
            assert not stats.wrong_object.any() and stats.success.all(), stats
