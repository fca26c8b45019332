"""PPO on the threaded CPU backend: learns Reach within a CI budget, resumes exactly after a SIGKILL, bootstraps
time-limit cuts, and refuses configs it cannot run."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from robotrl.rl.ppo import PpoAgent, PpoConfig, gae, train
from robotrl.training.evaluate import evaluate_state_actor

ROBOTRL = Path(sys.executable).parent / "robotrl"


@pytest.mark.learning
def test_ppo_learns_reach(tmp_path: Path, claim, learning_seed: int) -> None:
    """32 envs, 40,960 env steps: from the untrained agent to a high success on 40 held-out episodes (seeds 0-4:
    bench/RESULTS.md, "Learning tests")."""
    cfg = PpoConfig(
        task="Reach",
        num_envs=32,
        total_steps=40_960,
        eval_episodes=40,
        run_dir=tmp_path / "run",
        progress=False,
        seed=learning_seed,
    )
    torch.manual_seed(learning_seed)
    start = evaluate_state_actor(PpoAgent(23, 3, cfg).act, "Reach", ("state",), 40, 25).success_rate
    result = train(cfg)
    assert result.success_rate is not None
    claim("PPO success", result.success_rate, lower=0.8, start=start)
    claim("PPO gain", result.success_rate - start, lower=0.6)


def test_killed_run_resumes_exactly(tmp_path: Path, kill_after_first_train_state, assert_same_run) -> None:
    cfg = PpoConfig(
        task="Reach",
        num_envs=8,
        rollout_steps=16,
        total_steps=8 * 16 * 6,
        hidden=(32, 32),
        checkpoint_every=128,
        eval_episodes=0,
        run_dir=tmp_path / "killed",
        progress=False,
    )
    args = [
        str(ROBOTRL),
        "train",
        "ppo",
        "--task",
        "Reach",
        "--num-envs",
        "8",
        "--rollout-steps",
        "16",
        "--total-steps",
        str(8 * 16 * 6),
        "--hidden",
        "32",
        "32",
        "--checkpoint-every",
        "128",
        "--eval-episodes",
        "0",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / "train_state.pt")
    assert 1 <= step < 6, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed")


def test_gae_stops_at_episode_ends() -> None:
    reward = torch.tensor([[1.0], [1.0], [1.0]])
    value = torch.tensor([[0.5], [0.5], [0.5]])
    done = torch.tensor([[0.0], [1.0], [0.0]])  # the episode ends after step 1; step 2 starts a new one
    adv = gae(reward, value, done, torch.tensor([2.0]), gamma=0.9, lam=1.0)
    # step 1 ends its episode: no bootstrap; step 0 sees step 1 only; step 2 bootstraps from last_value
    torch.testing.assert_close(adv[:, 0], torch.tensor([1 + 0.9 * 1 - 0.5, 1 - 0.5, 1 + 0.9 * 2 - 0.5]))


def test_bad_configs_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"PpoConfig.minibatches: expected a divisor of num_envs \* rollout_steps \(96\), got 5"
    ):
        PpoConfig(num_envs=3, rollout_steps=32, minibatches=5)
    with pytest.raises(ValueError, match=r"PpoConfig.num_envs: expected >= 1, got 0"):
        PpoConfig(num_envs=0)
