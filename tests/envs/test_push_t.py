"""PushT on real MuJoCo: reset distribution, contact physics, coverage, reward, the scripted expert and MJX."""

import numpy as np
import pytest

from robotrl.envs import make, make_task
from robotrl.envs.rollouts import evaluate_expert
from robotrl.envs.task import Frame
from robotrl.envs.tasks import push_t
from robotrl.envs.tasks.push_t import STATE_LAYOUT, UNIT, coverage

N = 50
#: the raised teleop noise at which the expert must still succeed on >= 60% of episodes (see the report)
NOISY = 1.0


def part(obs, key):
    a, b = STATE_LAYOUT[key]
    return obs["state"][:, a:b]


def block_pose(obs):
    bp = part(obs, "block_pose")
    return np.c_[bp[:, :2], np.arctan2(bp[:, 2], bp[:, 3])]


@pytest.fixture(scope="module")
def env():
    e = make("PushT", num_envs=N, seed=0)
    yield e
    e.close()


def test_spec_matches_observations(env):
    obs, _ = env.reset(seed=0)
    spec = env.task.spec()
    assert spec.observations["state"].shape == (push_t.STATE_DIM,)
    assert obs["state"].shape == (N, push_t.STATE_DIM) and obs["state"].dtype == np.float32
    assert spec.action.shape == (2,) and spec.control_hz == 20.0


def test_reset_is_deterministic_for_a_seed_and_varied_across_envs():
    a = make("PushT", num_envs=8, seed=0)
    b = make("PushT", num_envs=8, seed=0)
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    np.testing.assert_array_equal(oa["state"], ob["state"])
    oc, _ = a.reset(seed=8)
    assert not np.allclose(oa["state"], oc["state"])
    pose = block_pose(oa)
    assert np.unique(np.round(pose, 6), axis=0).shape[0] == 8  # every env its own start
    cfg = a.task.config
    target = np.array(cfg.target)
    np.testing.assert_allclose(part(oa, "target_pose")[:, :2], np.broadcast_to(target[:2], (8, 2)), atol=1e-6)
    assert np.all(np.abs(pose[:, :2] - target[:2]) <= [cfg.max_offset_x + 1e-6, cfg.max_offset_y + 1e-6])
    turn = np.abs(np.angle(np.exp(1j * (pose[:, 2] - target[2]))))
    assert np.all((turn >= cfg.min_turn - 1e-6) & (turn <= cfg.max_turn + 1e-6))
    a.close()
    b.close()


def test_reset_starts_clear_of_the_block_and_far_from_success(env):
    obs, _ = env.reset(seed=3)
    p = part(obs, "tool_in_block")
    assert np.all(push_t.distance_to_t(np, p) > push_t.TIP_RADIUS + 0.01)
    assert np.all(part(obs, "coverage") < env.task.config.success_coverage - 0.3)
    np.testing.assert_allclose(part(obs, "tool_pos")[:, 2], push_t.TIP_Z, atol=0.01)


def test_block_moves_only_when_pushed(env):
    obs, _ = env.reset(seed=1)
    start = block_pose(obs)
    for _ in range(5):  # the tool holds still: nothing touches the block
        obs, *_ = env.step(np.zeros((N, 2), np.float32))
    np.testing.assert_allclose(block_pose(obs), start, atol=1e-9)

    first_push = np.full(N, np.nan)  # displacement along the tip's motion on the step the block first moved
    for _ in range(40):  # drive the tip straight at the block's centroid
        prev = block_pose(obs)
        gap = push_t.distance_to_t(np, part(obs, "tool_in_block")) - push_t.TIP_RADIUS
        tip = part(obs, "tool_pos")[:, :2]
        to_block = prev[:, :2] - tip
        action = to_block / np.linalg.norm(to_block, axis=-1, keepdims=True)
        obs, *_ = env.step(action.astype(np.float32))
        shift = block_pose(obs)[:, :2] - prev[:, :2]
        moved = np.linalg.norm(shift, axis=-1)
        # out of reach this step (more than one max step away): the block must not have moved at all
        far = gap > 1.5 * env.task.config.max_ee_step
        assert np.all(moved[far] < 1e-9)
        new = np.isnan(first_push) & (moved > 1e-4)
        first_push[new] = np.sum(shift * action, axis=-1)[new]
    assert not np.isnan(first_push).any()  # every block was reached and moved
    assert np.all(first_push > 0.0)  # pushed, not pulled: it gave way in the direction the tip moved


def test_tool_height_held_while_moving_in_the_plane(env):
    obs, _ = env.reset(seed=2)
    start = part(obs, "tool_pos").copy()
    action = np.zeros((N, 2), np.float32)
    action[:, 1] = -1.0  # sideways, away from every block start (the block is ahead in +x)
    for _ in range(8):
        obs, *_ = env.step(action)
    tool = part(obs, "tool_pos")
    assert np.all(tool[:, 1] - start[:, 1] < -0.06)
    np.testing.assert_allclose(tool[:, 2], push_t.TIP_Z, atol=0.005)


def test_coverage_is_one_at_the_target_and_low_far_off():
    target = np.array([[0.48, 0.0, 0.3]])
    assert coverage(np, target, target)[0] == 1.0
    assert coverage(np, target + [0.3, 0.0, 0.0], target)[0] == 0.0
    assert coverage(np, target + [0.0, 0.0, np.pi], target)[0] < 0.5  # upside down: only the seam overlaps
    # a shift of d along the bar keeps 1 - 4d / (7 UNIT) of the area (bar and stem both lose d times their height)
    d = 0.006
    along_bar = np.array([[d * np.cos(0.3), d * np.sin(0.3), 0.0]])
    np.testing.assert_allclose(coverage(np, target + along_bar, target)[0], 1 - 4 * d / (7 * UNIT), atol=0.01)
    offsets = np.linspace(0.0, 0.1, 11)
    covs = coverage(np, target + np.c_[offsets, offsets, offsets], np.repeat(target, 11, axis=0))
    assert np.all(np.diff(covs) <= 0) and covs[-1] < 0.2


def _frame(task, block, ee):
    """A hand-built frame: arm at its start pose, the block at `block` and the tool site at `ee`."""
    n = block.shape[0]
    qpos = np.c_[np.tile(push_t.START_QPOS, (n, 1)), block]
    sens = np.zeros((n, task.model.nsensordata))
    sens[:, task._sensor_slices["ee_pos"]] = ee
    return Frame(qpos, np.zeros((n, task.model.nv)), sens, np.tile(task.config.target, (n, 1)))


def test_success_and_dense_reward_are_consistent():
    task = make_task("PushT")
    target = np.array(task.config.target)
    offsets = np.array([[0, 0, 0], [0.002, 0, 0.01], [0.006, 0, 0], [0.02, 0.01, 0.1], [0.1, 0.1, 1.0]], float)
    block = target + offsets
    ee = np.c_[block[:, :2] + [0.0, -0.2], np.full(5, push_t.TIP_Z)]
    frame = _frame(task, block, ee)
    reward, success = task.reward(np, frame, np.zeros((5, 2)))
    cov = coverage(np, block, frame.goal)
    np.testing.assert_array_equal(success, cov >= task.config.success_coverage)
    assert success[:2].all() and not success[2:].any()
    np.testing.assert_array_equal(reward[success], 1.0)
    assert np.all(reward[~success] < 1.0) and np.all(reward >= 0.0)
    assert np.all(np.diff(reward) <= 0)  # further from the target pose, less reward
    # a tip touching the block earns more than one far away (the reach term), all else equal
    touching = np.array([[0.0, push_t.BOXES[1, 1] - push_t.BOXES[1, 3] - push_t.TIP_RADIUS]])  # below the stem
    near_xy = push_t.from_frame(np, block[4:], touching)[:, 0]
    near = _frame(task, block[4:], np.c_[near_xy, [push_t.TIP_Z]])
    assert task.reward(np, near, np.zeros((1, 2)))[0][0] > reward[4]


def test_rollout_rewards_match_success_and_sparse_mode():
    dense_env = make("PushT", num_envs=10, seed=0)
    sparse_env = make("PushT", num_envs=10, seed=0, reward_type="sparse")
    expert_d, expert_s = dense_env.task.expert(seed=0), sparse_env.task.expert(seed=0)
    od, _ = dense_env.reset(seed=4)
    os_, _ = sparse_env.reset(seed=4)
    seen_success = False
    for _ in range(150):
        od, rd, _, _, info_d = dense_env.step(expert_d.act(od))
        os_, rs, _, _, info_s = sparse_env.step(expert_s.act(os_))
        np.testing.assert_array_equal(info_d["success"], info_s["success"])
        np.testing.assert_array_equal(rs, info_s["success"].astype(float))
        np.testing.assert_array_equal(rd[info_d["success"]], 1.0)
        assert np.all(rd[~info_d["success"]] < 1.0)
        np.testing.assert_array_equal(info_d["success"], part(od, "coverage")[:, 0] >= 0.9)
        seen_success |= bool(info_d["success"].any())
    assert seen_success
    dense_env.close()
    sparse_env.close()


def test_task_functions_agree_between_numpy_and_jax():
    jnp = pytest.importorskip("jax.numpy")
    task = make_task("PushT")
    u = np.random.default_rng(0).random((6, task.reset_dims))
    start_np, start_jx = task.reset(np, u), task.reset(jnp, jnp.asarray(u))
    np.testing.assert_allclose(np.asarray(start_jx.qpos), start_np.qpos, atol=1e-5)
    ee = np.c_[start_np.qpos[:, 7:9] + [0.0, -0.1], np.full(6, push_t.TIP_Z)]
    frame = _frame(task, start_np.qpos[:, 7:10], ee)
    frame_jx = Frame(*(jnp.asarray(x) for x in frame))
    action = np.tile([[0.3, -0.5]], (6, 1))
    np.testing.assert_allclose(
        np.asarray(task.observe(jnp, frame_jx)["state"]), task.observe(np, frame)["state"], atol=1e-4
    )
    np.testing.assert_allclose(
        np.asarray(task.control(jnp, frame_jx, jnp.asarray(action))), task.control(np, frame, action), atol=1e-4
    )
    for a, b in zip(task.reward(jnp, frame_jx, jnp.asarray(action)), task.reward(np, frame, action)):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)


def test_joint_pos_mode_reaches_commanded_joint_targets():
    env = make("PushT", num_envs=2, seed=0, action_mode="joint_pos")
    env.reset(seed=0)
    assert env.single_action_space.shape == (7,)
    lo, hi = env.task.arm.limits.T
    target = (push_t.START_QPOS - lo) / (hi - lo) * 2 - 1
    target = np.tile(target + 0.05, (2, 1)).astype(np.float32)
    for _ in range(10):
        env.step(target)
    want = lo + 0.5 * (target[0] + 1) * (hi - lo)
    np.testing.assert_allclose(env.frame().qpos[:, :7], np.broadcast_to(want, (2, 7)), atol=0.03)
    env.close()


def test_expert_succeeds_fast_check(env):
    stats = evaluate_expert(env, noise=0.0, episodes=50, seed=0)
    assert stats.success_rate >= 0.95


@pytest.mark.slow
def test_expert_succeeds_on_200_seeded_episodes(env):
    assert evaluate_expert(env, noise=0.0, episodes=200, seed=0).success_rate >= 0.95


@pytest.mark.slow
def test_noisy_expert_is_imperfect_but_competent(env):
    clean = evaluate_expert(env, noise=0.0, episodes=200, seed=0)
    noisy = evaluate_expert(env, noise=NOISY, episodes=200, seed=0)
    assert noisy.success_rate >= 0.60
    assert noisy.returns.mean() < clean.returns.mean()


def test_noisy_expert_fast_check(env):
    assert evaluate_expert(env, noise=NOISY, episodes=50, seed=1).success_rate >= 0.60


def test_expert_holds_only_at_success_coverage():
    """Once done, the expert holds only while the coverage is at the success threshold or above and pushes again
    below it: demonstrations of holds at near-miss coverages taught BC to stop short of success. At demo noise
    (its hand drifts, and the block with it) the coverage does fall back below the threshold in some episodes."""
    e = make("PushT", num_envs=16, seed=2)
    expert = e.task.expert(noise=0.5, seed=2)
    obs, _ = e.reset(seed=2)
    threshold = e.task.config.success_coverage
    held_short = pushed_back = 0
    was_done = np.zeros(16, bool)
    for _ in range(e.task.config.episode_steps):
        action = expert.act(obs)  # its phase is the one it gives this observation
        cov = part(obs, "coverage")[:, 0]
        held_short += int(np.sum((expert.phase == push_t.DONE) & (cov < threshold)))
        pushed_back += int(np.sum(was_done & ~expert.done))
        was_done = expert.done.copy()
        obs, *_ = e.step(action)
    e.close()
    assert held_short == 0
    assert pushed_back > 0


def test_demo_holds_bench_counts_the_near_miss_steps(pusht_demos):
    """bench/pusht_demo_holds.py on real (short) expert episodes: the band's steps split into before and after the
    first success, slow ones among them, and the share after success in [0, 1]."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import pusht_demo_holds

    (row,) = pusht_demo_holds.main(pusht_demo_holds.DemoHoldsConfig(stores=(pusht_demos.path,), low=0.0))
    assert row["episodes"] == pusht_demos.num_episodes
    inside = row["steps_in_band_before_first_success"] + row["steps_in_band_after"]
    assert 0 < inside <= pusht_demos.num_steps  # low=0: every step under the threshold is in the band
    assert row["slow_in_band_before"] <= row["steps_in_band_before_first_success"]
    assert row["share_of_band_after_success"] == round(row["steps_in_band_after"] / inside, 3)
    # low=0: the band is every step under the threshold, so with the steps at or over it they are every step
    cov = pusht_demos.load(["state"])["state"][:, STATE_LAYOUT["coverage"][0]]
    assert inside == int(np.sum(cov < push_t.PushTConfig.success_coverage))


def test_only_the_tip_and_the_block_can_collide_and_the_target_is_visual():
    import mujoco

    task = make_task("PushT")
    m = task.model
    pairs = set()
    for i in range(m.ngeom):
        for j in range(i + 1, m.ngeom):
            filt = (m.geom_contype[i] & m.geom_conaffinity[j]) or (m.geom_contype[j] & m.geom_conaffinity[i])
            if filt and m.geom_bodyid[i] != m.geom_bodyid[j]:
                pairs.add(
                    tuple(sorted(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, m.geom_bodyid[k]) for k in (i, j)))
                )
    assert pairs == {("block", "flange")}  # the pusher sphere (on the flange) against the T's boxes
    tip = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "tip")
    assert m.geom_type[tip] == mujoco.mjtGeom.mjGEOM_SPHERE
    assert sum(1 for g in range(m.ngeom) if m.geom_bodyid[g] == m.body("block").id) == 2
    goal = np.array([[0.5, 0.1, 0.7]])
    pos, quat = task.mocap(np, goal)
    np.testing.assert_allclose(pos[0, 0, :2], goal[0, :2])
    np.testing.assert_allclose(quat[0, 0], [np.cos(0.35), 0.0, 0.0, np.sin(0.35)])
    assert m.nmocap == 1


def test_overhead_image_observation():
    from robotrl.envs import make

    env = make("PushT", num_envs=2, images=True, image_size=96)
    assert env.task_spec.observations["image_top"].shape == (96, 96, 3)
    assert env.task_spec.metadata["task_options"]["images"] is True  # an evaluation rebuilds the same env
    obs, _ = env.reset(seed=0)
    assert obs["image_top"].shape == (2, 96, 96, 3) and obs["image_top"].dtype == np.uint8
    assert np.abs(obs["image_top"][0].astype(int) - obs["image_top"][1].astype(int)).mean() > 1.0  # blocks differ
    assert "image_top" not in make("PushT", num_envs=1).task_spec.observations
