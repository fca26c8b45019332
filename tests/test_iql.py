"""IQL offline from a real demonstration store: learns Reach without touching the env, resumes exactly, and its
expectile value sits above the mean of the data's Q-values as the expectile says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.rl.iql import IqlAgent, IqlConfig, expectile_loss, train
from robotrl.rl.sac import actor_fn
from robotrl.training.evaluate import evaluate_state_actor


def small(store: Path, run_dir: Path, **overrides: object) -> IqlConfig:
    return replace(IqlConfig(store=store, steps=2000, eval_episodes=40, run_dir=run_dir, progress=False), **overrides)


@pytest.mark.learning
def test_iql_learns_reach_offline(offline_reach_demos: Path, tmp_path: Path, claim, learning_seed: int) -> None:
    """From an untrained actor to a held-out success after 3,000 offline updates on 40 demonstrations; the bounds sit
    under the slowest of seeds 0-4, which starts late (bench/RESULTS.md, "Learning tests")."""
    torch.manual_seed(0)
    start_agent = IqlAgent(23, 3, -torch.ones(3), torch.ones(3), small(offline_reach_demos, tmp_path))
    start = evaluate_state_actor(actor_fn(start_agent.actor), "Reach", ("state",), 40, 20).success_rate
    result = train(small(offline_reach_demos, tmp_path / "run", steps=3000, seed=learning_seed))
    assert result.success_rate is not None
    claim("IQL success", result.success_rate, lower=0.2, start=start)
    claim("IQL gain", result.success_rate - start, lower=0.15)


def test_resume_continues_exactly(offline_reach_demos: Path, tmp_path: Path, assert_same_run) -> None:
    cfg = small(offline_reach_demos, tmp_path / "a", steps=60, checkpoint_every=30, eval_episodes=0, hidden=(64, 64))
    straight = train(cfg)
    train(replace(cfg, run_dir=tmp_path / "b", steps=30))  # a run that stopped at its step-30 train state ...
    resumed = train(replace(cfg, run_dir=tmp_path / "b", resume=True))  # ... and went on to 60
    assert_same_run(straight.run_dir, resumed.run_dir)


def test_expectile_leans_towards_the_larger_values() -> None:
    q = torch.tensor(np.random.default_rng(0).normal(size=4000), dtype=torch.float32)
    v = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([v], lr=0.05)
    for _ in range(500):
        opt.zero_grad()
        expectile_loss(q - v, 0.9).backward()
        opt.step()
    assert 0.8 < v.item() < 1.1  # the 0.9-expectile of N(0, 1) is about 0.86
    with pytest.raises(ValueError, match=r"IqlConfig.expectile: expected a value in \[0.5, 1\), got 0.3"):
        IqlConfig(expectile=0.3)
