"""The threaded CPU backend: API semantics, determinism, input errors and domain randomization."""

import numpy as np
import pytest
import torch

from robotrl.core.spec import SpecMismatchError
from robotrl.envs import Randomization, make


def rollout(env, actions, seed=0):
    env.reset(seed=seed)
    out = []
    for a in actions:
        obs, reward, *_ = env.step(a)
        out.append((obs["state"].copy(), np.asarray(reward).copy()))
    return out


def random_actions(n, steps, dim, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, dim)).astype(np.float32)


def test_observations_match_the_spec():
    env = make("Reach", num_envs=3, seed=0)
    obs, info = env.reset(seed=0)
    for key, spec in env.task_spec.observations.items():
        spec.validate(obs[key], f"obs[{key!r}]")
    assert env.observation_space.contains(obs)
    obs, reward, term, trunc, info = env.step(env.action_space.sample())
    assert reward.shape == (3,) and term.dtype == bool and trunc.dtype == bool
    assert info["success"].shape == (3,)


def test_reset_is_deterministic_per_seed_and_differs_across_seeds():
    env = make("Reach", num_envs=4)
    a, _ = env.reset(seed=7)
    b, _ = env.reset(seed=7)
    c, _ = env.reset(seed=8)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert not np.allclose(a["state"], c["state"])
    assert len({tuple(r) for r in a["state"][:, 17:20].round(6)}) == 4  # each env its own target


def test_thread_count_does_not_change_results():
    acts = random_actions(6, 10, 3)
    one = rollout(make("Reach", num_envs=6, num_threads=1), acts)
    two = rollout(make("Reach", num_envs=6, num_threads=2), acts)
    for (s1, r1), (s2, r2) in zip(one, two):
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(r1, r2)


def test_same_step_autoreset_keeps_final_observation():
    env = make("Reach", num_envs=2, seed=0, episode_steps=5)
    env.reset(seed=0)
    zero = np.zeros((2, 3), np.float32)
    for _ in range(4):
        _, _, term, trunc, info = env.step(zero)
        assert not trunc.any() and "final_obs" not in info
    obs, _, term, trunc, info = env.step(zero)
    assert trunc.all() and not term.any()
    assert info["_final_obs"].all()
    final = info["final_obs"]["state"]
    # the returned obs is a fresh episode (new targets), the final one is where the arm ended
    assert not np.allclose(final[:, 17:20], obs["state"][:, 17:20])
    assert np.all(env._steps == 0)


def test_get_and_set_state_replay_exactly():
    env = make("Reach", num_envs=3, seed=0)
    env.reset(seed=0)
    acts = random_actions(3, 6, 3, seed=1)
    env.step(acts[0])
    saved = env.get_state()
    first = [env.step(a)[0]["state"].copy() for a in acts[1:]]
    env.set_state(saved)
    second = [env.step(a)[0]["state"].copy() for a in acts[1:]]
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)


def test_each_env_is_one_mujoco_simulation_stepped_on_warm():
    """An env is what one MjData stepped by mj_step gives under the same controls, bit for bit and at any thread
    count: the solver's warm start carries over from one control step to the next, as on a robot's sim."""
    import mujoco

    envs = [make("PushT", num_envs=3, seed=0, num_threads=t) for t in (1, 2)]
    for env in envs:
        env.reset(seed=0)
    m, nsub = envs[0].task.model, envs[0].task.n_substeps
    data = mujoco.MjData(m)
    mujoco.mj_setState(m, data, envs[0].get_state()["physics"][1], mujoco.mjtState.mjSTATE_FULLPHYSICS)
    for a in random_actions(3, 15, 2, seed=2):
        for env in envs:
            env.step(a)
        data.ctrl[:] = envs[0]._ctrl[1]  # what env 1 was commanded this step
        for _ in range(nsub):
            mujoco.mj_step(m, data)
        np.testing.assert_array_equal(envs[0].frame().qpos[1], data.qpos)
        np.testing.assert_array_equal(envs[0].frame().sensordata[1], data.sensordata)
        np.testing.assert_array_equal(envs[1].frame().qpos, envs[0].frame().qpos)
    np.testing.assert_array_equal(envs[0].get_state()["warmstart"][1], data.qacc_warmstart)
    assert np.abs(data.qacc_warmstart).max() > 0.0


def test_a_reset_env_is_the_models_defaults_with_the_tasks_start():
    """A reset writes each env's whole state row: what mj_resetData leaves (time 0, no controls, a cold solver) with
    the task's start pose, however far the env had run; the envs not reset keep theirs."""
    import mujoco

    from robotrl.envs.cpu import INTEGRATION

    env = make("PushT", num_envs=3, seed=0)
    env.reset(seed=0)
    for a in random_actions(3, 5, 2, seed=3):
        env.step(a)
    rows = env._live().state
    before = rows.copy()
    assert np.abs(env.get_state()["warmstart"]).max() > 0.0 and (rows[:, 0] > 0).all()  # warm, time running
    env._reset_envs(np.array([1]))
    m = env.task.model
    data = mujoco.MjData(m)
    mujoco.mj_resetData(m, data)
    data.qpos[:], data.qvel[:] = env.frame().qpos[1], env.frame().qvel[1]
    expected = np.zeros(mujoco.mj_stateSize(m, INTEGRATION))
    mujoco.mj_getState(m, data, expected, INTEGRATION)
    np.testing.assert_array_equal(rows[1], expected)
    np.testing.assert_array_equal(rows[[0, 2]], before[[0, 2]])


def test_divergence_reads_the_three_blow_up_warnings():
    import mujoco

    from robotrl.envs.step import DIVERGED

    counters = list(range(int(mujoco.mjtWarning.mjNWARNING)))[DIVERGED]
    assert counters == [
        int(mujoco.mjtWarning.mjWARN_BADQPOS),
        int(mujoco.mjtWarning.mjWARN_BADQVEL),
        int(mujoco.mjtWarning.mjWARN_BADQACC),
    ]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_simulation_that_blows_up_ends_its_episode_with_zero_reward(compiled):
    """MuJoCo resets a simulation whose state blows up and warns: the env reports it as diverged, ends that episode
    (reward 0) and starts a new one, and the other envs step on (the step's code as numpy and compiled)."""
    env = make("Reach", num_envs=3, seed=0, compile_task=compiled)
    env.reset(seed=0)
    state = env.get_state()
    nq = env.task.model.nq
    state["physics"][1, 1 + nq : 1 + 2 * nq] = 1e300  # env 1 flies apart
    env.set_state(state)
    obs, reward, term, trunc, info = env.step(np.zeros((3, 3), np.float32))
    assert term[1] and info["diverged"][1] and reward[1] == 0.0 and info["_final_obs"][1]
    assert not term[[0, 2]].any() and not info["diverged"][[0, 2]].any() and np.isfinite(obs["state"]).all()
    _, _, term, _, info = env.step(np.zeros((3, 3), np.float32))
    assert not term.any() and not info["diverged"].any()  # the new episode steps normally


def test_torch_output():
    env = make("Reach", num_envs=2, seed=0, output="torch")
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["state"], torch.Tensor) and obs["state"].dtype == torch.float32
    obs, reward, term, trunc, _ = env.step(torch.zeros(2, 3))
    assert isinstance(reward, torch.Tensor) and isinstance(term, torch.Tensor)


@pytest.mark.parametrize("compiled", [False, True])
def test_out_of_bounds_actions_are_clipped(compiled):
    a = make("Reach", num_envs=2, seed=0, compile_task=compiled)
    b = make("Reach", num_envs=2, seed=0, compile_task=compiled)
    big = np.full((2, 3), 5.0, np.float32)
    ra = rollout(a, [big] * 3)
    rb = rollout(b, [np.ones((2, 3), np.float32)] * 3)
    np.testing.assert_array_equal(ra[-1][0], rb[-1][0])


# --- bad input --------------------------------------------------------------------------------------


def test_unknown_task_names_the_choices_and_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown task 'Reech'.*Did you mean 'Reach'"):
        make("Reech")


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_non_positive_env_count(n):
    with pytest.raises(ValueError, match=f"num_envs: expected a positive integer, got {n!r}"):
        make("Reach", num_envs=n)


def test_unknown_backend_and_option():
    with pytest.raises(ValueError, match="backend: expected one of"):
        make("Reach", backend="gpu")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['episode_len'\]"):
        make("Reach", episode_len=3)
    with pytest.raises(ValueError, match="action_mode must be one of"):
        make("Reach", action_mode="torque")


@pytest.mark.parametrize("compiled", [False, True])
def test_wrong_action_shape_dtype_and_nan_are_errors(compiled):
    env = make("Reach", num_envs=2, seed=0, compile_task=compiled)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions: expected shape \(2, 3\) \(num_envs, action_dim\), got \(3,\)"):
        env.step(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"got \(2, 7\)"):
        env.step(np.zeros((2, 7), np.float32))
    with pytest.raises(TypeError, match="actions: expected a float dtype"):
        env.step(np.array([["a", "b", "c"]] * 2))
    nan = np.zeros((2, 3), np.float32)
    nan[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN/inf in env\(s\) \[1\]"):
        env.step(nan)
    before = env.get_state()
    with pytest.raises(ValueError):
        env.step(nan)
    np.testing.assert_array_equal(before["physics"], env.get_state()["physics"])  # a bad step changes nothing
    assert (env._compiled is not None) == compiled


def test_spec_mismatch_between_tasks_is_an_error():
    reach = make("Reach", num_envs=1).task_spec
    joint = make("Reach", num_envs=1, action_mode="joint_pos").task_spec
    with pytest.raises(SpecMismatchError, match="spec.action.shape"):
        reach.check(joint, "policy", "env")


# --- domain randomization ---------------------------------------------------------------------------


def test_randomization_validates_ranges():
    with pytest.raises(ValueError, match=r"Randomization.mass: expected 0 < low <= high, got \(1.2, 0.8\)"):
        Randomization(mass=(1.2, 0.8))
    with pytest.raises(ValueError, match="latency_steps"):
        Randomization(latency_steps=(2, 1))


def test_dynamics_randomization_differs_per_env_and_per_reset():
    dr = Randomization(friction=(0.5, 1.5), mass=(0.5, 2.0), damping=(0.5, 2.0), actuator_gain=(0.5, 1.5))
    env = make("Reach", num_envs=4, seed=0, randomization=dr, action_mode="joint_pos")
    env.reset(seed=0)
    masses = np.array([m.body_mass[3] for m in env._models])
    assert len(set(masses.round(6))) == 4
    assert np.all((masses >= 0.5 * env.task.model.body_mass[3]) & (masses <= 2.0 * env.task.model.body_mass[3]))
    # identical initial state and command in every env: different dynamics give different motion
    state = env.get_state()
    state["physics"][:] = state["physics"][0]
    env.set_state(state)
    obs, *_ = env.step(np.full((4, 7), 0.3, np.float32))
    qpos = obs["state"][:, :7]
    assert np.ptp(qpos, axis=0).max() > 1e-3
    env.reset(seed=1)
    assert not np.allclose(masses, [m.body_mass[3] for m in env._models])
    # the nominal model is never touched
    nominal = make("Reach", num_envs=1).task.model.body_mass[3]
    assert env.task.model.body_mass[3] == nominal


def test_a_seeds_reset_states_do_not_depend_on_the_randomization():
    """Every reset draws the randomization's uniforms whether it is on or not: the same seed starts the same episodes
    with and without the looks' jitter, through auto-resets too; the camera and light stay nominal when it is off."""
    looks = Randomization(camera_pos=0.02, light=0.3)
    on = make("Quadruped", num_envs=4, seed=0, render_images=False, randomization=looks)
    off = make("Quadruped", num_envs=4, seed=0, render_images=False)
    on.reset(seed=3), off.reset(seed=3)
    starts = {id(on): [], id(off): []}
    for env in (on, off):
        env.set_state({**env.get_state(), "physics": env.get_state()["physics"][[0]].repeat(4, axis=0)})
        toppling = np.full((40, 4, 12), 1.0, np.float32)  # every leg at its limit: the trunk falls and resets
        toppling[:, :, ::2] = -1.0
        for a in toppling:
            *_, term, trunc, _ = env.step(a)
            done = np.nonzero(term | trunc)[0]
            starts[id(env)] += [env.frame().qpos[i].copy() for i in done]
    assert len(starts[id(off)]) >= 4
    np.testing.assert_array_equal(starts[id(on)], starts[id(off)])
    assert np.ptp(on._camera_jitter) > 0 and np.ptp(on._light_scale) > 0
    assert not off._camera_jitter.any() and (off._light_scale == 1.0).all()


@pytest.mark.parametrize("compiled", [False, True])
def test_latency_delays_commands_by_the_drawn_steps(compiled):
    delayed = make(
        "Reach", num_envs=2, seed=0, randomization=Randomization(latency_steps=(2, 2)), compile_task=compiled
    )
    plain = make("Reach", num_envs=2, seed=0, compile_task=compiled)
    up = np.zeros((2, 3), np.float32)
    up[:, 2] = 1.0
    zero = np.zeros_like(up)
    d = rollout(delayed, [up, up, up])
    p = rollout(plain, [zero, zero, up])
    for (sd, _), (sp, _) in zip(d, p):
        np.testing.assert_allclose(sd, sp, atol=1e-9)


def test_observation_noise_has_the_configured_scale():
    noisy = make("Reach", num_envs=64, seed=0, randomization=Randomization(obs_noise=0.01))
    clean = make("Reach", num_envs=64, seed=0)
    a, _ = noisy.reset(seed=0)
    b, _ = clean.reset(seed=0)
    diff = a["state"] - b["state"]
    assert 0.008 < diff.std() < 0.012


def test_without_rendering_the_spec_and_space_promise_no_images():
    env = make("PickPlace", num_envs=2, seed=0, render_images=False)
    assert not [k for k in env.task_spec.observations if k.startswith("image_")]
    assert "instruction" in env.task_spec.observations
    obs, _ = env.reset(seed=0)
    assert set(obs) == set(env.single_observation_space.spaces) == set(env.task_spec.observations)


def test_task_randomization_is_configured_per_task():
    quad = make("Quadruped", num_envs=4, seed=0, randomization="task")
    assert quad.randomization == quad.task.default_randomization()
    assert quad.randomization.friction == (0.4, 1.25) and quad.randomization.camera_pos == 0.0
    quad.reset(seed=0)
    frictions = {m.geom_friction[:, 0].max() for m in quad._models}
    assert len(frictions) == 4
    reach = make("Reach", num_envs=2, randomization="task")
    assert reach.randomization == Randomization.sim2real()
    with pytest.raises(ValueError, match=r"randomization: expected a Randomization, 'task' or None, got 'sim'"):
        make("Reach", randomization="sim")


def test_torch_output_keeps_instructions_as_strings():
    env = make("PickPlace", num_envs=2, seed=0, output="torch", render_images=False)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["state"], torch.Tensor)
    assert all(text.startswith("put the ") for text in obs["instruction"])
    obs, *_ = env.step(torch.zeros(2, 5))
    assert isinstance(obs["state"], torch.Tensor) and len(obs["instruction"]) == 2
