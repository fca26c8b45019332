"""PPO on the threaded CPU backend: learns Reach within a CI budget, resumes exactly after a SIGKILL, bootstraps
time-limit cuts, and refuses configs it cannot run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.envs import make
from robotrl.policies import load
from robotrl.rl.ppo import PpoAgent, PpoConfig, gae, train
from robotrl.training.evaluate import evaluate_policy, evaluate_state_actor
from robotrl.training.loop import TRAIN_STATE, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"


def small(run_dir: Path, **overrides: object) -> PpoConfig:
    """8 envs of Reach, 16-step rollouts, a (32, 32) agent, no evaluation."""
    base = PpoConfig(
        task="Reach", num_envs=8, rollout_steps=16, hidden=(32, 32), eval_episodes=0, run_dir=run_dir, progress=False
    )
    return replace(base, **overrides)


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
    # the saved policy (what eval, export and deploy load) is what the run evaluated: the same held-out episodes
    deployed = evaluate_policy(load(result.weights), cfg.eval_episodes, cfg.eval_envs)
    assert deployed.success_rate == result.success_rate


def test_the_run_saves_its_actor_as_a_registered_policy(tmp_path: Path) -> None:
    """`policy/` is the registered `gaussian` policy: the actor's mean over the running-normalized observations,
    as the agent of the train state computes it, clipped to the action bounds the env clips to."""
    cfg = small(tmp_path / "run", total_steps=8 * 16 * 2)
    result = train(cfg)
    policy = load(result.weights)
    assert result.weights == tmp_path / "run" / "policy" and policy.name == "gaussian"
    agent = PpoAgent(23, 3, cfg)
    agent.load_state_dict(load_train_state(tmp_path / "run" / TRAIN_STATE)["agent"])
    assert agent.norm.count > 100  # the statistics moved: the policy must carry them
    env = make("Reach", num_envs=16, seed=3)
    obs, _ = env.reset(seed=3)
    env.close()
    expected = np.clip(agent.act(obs["state"]), -1.0, 1.0)
    np.testing.assert_array_equal(policy.act({"state": obs["state"][:, None]})[:, 0], expected)

    # a run of an earlier version (the whole agent pickled as agent.pt): `policy convert` gives the same policy
    saved = policy.state_dict()
    shutil.rmtree(result.weights)
    torch.save(agent.state_dict(), tmp_path / "run" / "agent.pt")
    convert = subprocess.run(
        [str(ROBOTRL), "policy", "convert", "--run-dir", str(tmp_path / "run")], capture_output=True, text=True
    )
    assert convert.returncode == 0, convert.stderr[-2000:]
    converted = load(tmp_path / "run" / "policy").state_dict()
    assert converted.keys() == saved.keys() and all(torch.equal(converted[k], saved[k]) for k in saved)


def test_killed_run_resumes_exactly(tmp_path: Path, kill_after_first_train_state, assert_same_run) -> None:
    cfg = small(tmp_path / "killed", total_steps=8 * 16 * 6, checkpoint_every=128)
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
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
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
