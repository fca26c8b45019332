"""GymVectorAdapter: outside gymnasium envs behind the robotrl vector API (auto-reset, success, checks, torch)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import robotrl.envs  # noqa: F401  (registers robotrl/<Task>-v0)
from robotrl.envs.adapter import GymVectorAdapter


def test_box_env_gets_a_state_key_spec_and_same_step_autoreset():
    env = GymVectorAdapter("Pendulum-v1", num_envs=3, seed=0)
    spec = env.task_spec
    assert spec.task == "gym:Pendulum-v1" and spec.episode_steps == 200 and spec.action.shape == (1,)
    assert spec.observations["state"].shape == (3,)
    obs, _ = env.reset()
    assert obs["state"].shape == (3, 3) and env.observation_space.contains(obs)
    for t in range(200):
        obs, reward, term, trunc, info = env.step(np.full((3, 1), 0.5, np.float32))
        # Pendulum reports no success: the adapter says so, and fills the key the stages read with False
        assert reward.shape == (3,) and not env.reports_success and not info["success"].any()
        if t < 199:
            assert not trunc.any() and "final_obs" not in info
    assert trunc.all() and info["_final_obs"].all()
    assert not np.allclose(info["final_obs"]["state"], obs["state"])  # obs is already the next episode's first


def test_seeding_is_per_env_and_reproducible():
    a, _ = GymVectorAdapter("Pendulum-v1", num_envs=2).reset(seed=5)
    b, _ = GymVectorAdapter("Pendulum-v1", num_envs=2).reset(seed=5)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert not np.allclose(a["state"][0], a["state"][1])


def test_gymnasium_mujoco_env_terminates_and_resets_only_that_env():
    env = GymVectorAdapter("InvertedPendulum-v5", num_envs=2, seed=0)
    env.reset()
    push = np.array([[3.0], [0.0]], np.float32)  # env 0 falls over, env 1 balances for a while
    for _ in range(100):
        obs, _, term, _, info = env.step(push)
        if term.any():
            break
    assert term[0] and not term[1]
    assert info["_final_obs"].tolist() == [True, False]
    assert abs(info["final_obs"]["state"][0, 1]) > 0.2 and abs(obs["state"][0, 1]) < 0.02


def test_dict_env_with_success_and_torch_output():
    env = GymVectorAdapter("robotrl/Reach-v0", num_envs=2, seed=0, output="torch", episode_steps=3)
    obs, _ = env.reset()
    assert isinstance(obs["state"], torch.Tensor) and obs["state"].shape == (2, 23)
    for _ in range(3):
        obs, reward, term, trunc, info = env.step(torch.zeros(2, 3))
    assert info["success"].dtype == bool and info["success"].shape == (2,)
    assert isinstance(reward, torch.Tensor) and bool(trunc.all())
    assert isinstance(info["final_obs"]["state"], torch.Tensor)


def test_text_observations_stay_strings():
    pytest.importorskip("robotrl.envs.tasks.pick_place")
    env = GymVectorAdapter("robotrl/PickPlace-v0", num_envs=2, seed=0, env_kwargs={"render_images": False})
    obs, _ = env.reset()
    assert obs["instruction"].dtype == object and isinstance(obs["instruction"][0], str)


def test_action_checks_match_the_robotrl_backends():
    env = GymVectorAdapter("Pendulum-v1", num_envs=2, seed=0)
    env.reset()
    with pytest.raises(ValueError, match=r"actions: expected shape \(2, 1\).*got \(2,\)"):
        env.step(np.zeros(2))
    with pytest.raises(ValueError, match=r"NaN/inf in env\(s\) \[1\]"):
        env.step(np.array([[0.0], [np.nan]]))
    env.step(np.array([[100.0], [-100.0]]))  # clipped to the bounds, as in the backends


def test_unsupported_spaces_are_clear_errors():
    with pytest.raises(TypeError, match=r"action_space: expected a gymnasium.spaces.Box, got Discrete\(2\)"):
        GymVectorAdapter("CartPole-v1")
    with pytest.raises(ValueError, match="num_envs: expected a positive integer, got 0"):
        GymVectorAdapter("Pendulum-v1", num_envs=0)
    with pytest.raises(ValueError, match="output: expected 'numpy' or 'torch', got 'jax'"):
        GymVectorAdapter("Pendulum-v1", output="jax")


def test_factory_and_no_autoreset():
    env = GymVectorAdapter(lambda: gym.make("Pendulum-v1", max_episode_steps=2), num_envs=1, autoreset=False)
    assert env.task_spec.task == "gym:Pendulum-v1"  # a lambda has no import path: named by its gymnasium id
    env.reset(seed=0)
    env.step(np.zeros((1, 1)))
    _, _, _, trunc, info = env.step(np.zeros((1, 1)))
    assert trunc[0] and "final_obs" not in info


def test_outside_env_runs_through_the_episode_runner():
    """run_episodes (evaluation, expert checks) works on an adapted env, which has no robotrl Task."""
    from robotrl.envs.rollouts import run_episodes

    env = GymVectorAdapter("robotrl/Reach-v0", num_envs=2, seed=0, episode_steps=3)
    assert not hasattr(env, "task")
    stats = run_episodes(env, lambda obs: np.zeros((2, 3), np.float32), 4, seed=0)
    assert len(stats.success) == 4 and stats.wrong_object is None and stats.instruction is None
    assert stats.lengths.tolist() == [3, 3, 3, 3]
