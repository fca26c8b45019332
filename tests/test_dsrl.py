"""DSRL-SAC (robotrl/flowrl/dsrl.py) from a BC flow checkpoint trained on real Reach demos: held-out success rises within a
CI budget with the flow network untouched, a rollout's decisions become transitions with the right successors and
discounts, a killed run resumes exactly, and bad configs are refused with the field named."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.flowrl.chain import FlowAgent, Tally, Windows, load_flow_policy, rollout, training_env
from robotrl.flowrl.dsrl import DsrlConfig, PriorActor, decisions, train
from robotrl.policies import load
from robotrl.policies.generative import NoisePrior
from robotrl.training.evaluate import evaluate_policy
from robotrl.training.loop import TRAIN_STATE, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"
pytestmark = pytest.mark.usefixtures("one_thread")


def small(policy: Path, run_dir: Path, **overrides: object) -> DsrlConfig:
    """CI-sized: 16 envs, chunks of 4 executed, a 5-step ODE, 200 decisions from the BC prior before updates, batches
    of 128."""
    base = DsrlConfig(
        policy=policy,
        num_envs=16,
        execute=4,
        sampler_steps=5,
        total_steps=11_520,
        learning_starts=200,
        batch_size=128,
        eval_episodes=0,
        checkpoint_every=1920,
        log_every=1920,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


#: env steps of the learning test (bench/online_budgets.py --methods dsrl measures its gain along the way)
DSRL_STEPS = 5_760


@pytest.mark.learning
def test_dsrl_raises_held_out_success_with_the_flow_network_frozen(
    reach_bc_flow: Path, reach_bc_flow_success: float, tmp_path: Path, claim, learning_seed: int
) -> None:
    """5,760 env steps: held-out success on the same 100 episodes rises well above the BC start (seeds 0-4:
    bench/RESULTS.md, "Learning tests"). The checkpoint is what `robotrl policy eval` loads (the same success on the same
    seeds), its flow network the BC checkpoint's bit for bit: only the noise prior moved."""
    before = reach_bc_flow_success
    result = train(
        small(reach_bc_flow, tmp_path / "run", total_steps=DSRL_STEPS, eval_episodes=100, seed=learning_seed)
    )
    assert result.success_rate is not None
    claim("DSRL gain over BC", result.success_rate - before, lower=0.15, before=before, after=result.success_rate)
    tuned, start = load(result.weights), load(reach_bc_flow)
    assert tuned.prior is not None
    for name, x in start.state_dict().items():
        torch.testing.assert_close(tuned.state_dict()[name], x, rtol=0, atol=0, msg=name)
    assert evaluate_policy(tuned, 100, 25, execute=4).success_rate == result.success_rate
    std = tuned.prior.log_std.exp()
    assert bool((std <= 1.0).all()) and bool((std >= np.exp(-7.0)).all())


def test_a_rollouts_decisions_become_transitions(reach_bc_flow: Path) -> None:
    """Each decision's successor is its env's next decision (or the env's window after the rollout), its x_0 the
    action; a decision of k < execute steps is discounted by gamma^k, an ended one not bootstrapped."""
    config = small(reach_bc_flow, Path("unused"), num_envs=4, execute=7)  # 60-step episodes end mid-chunk
    online = config.online()
    policy = load_flow_policy(reach_bc_flow, 5)
    env = training_env(policy, online)
    flow = FlowAgent(policy, online, 5)
    windows, tally = Windows(tuple(policy.obs_keys), policy.obs_horizon), Tally(4)
    windows.start(env.reset(seed=0)[0])
    gamma, execute = config.gamma, 7
    ended = short = 0
    for _ in range(5):
        data = rollout(flow, env, windows, 4 * execute, execute, gamma, tally)
        batch = decisions(flow, data, windows, gamma**execute)
        features = flow.features(data["obs"])
        last = flow.features(policy.normalize_obs(windows.frames))
        torch.testing.assert_close(batch["obs"], features)
        torch.testing.assert_close(batch["action"], data["chain"][:, 0].flatten(1))
        for env_id in range(4):
            mine = np.nonzero(data["env"] == env_id)[0]
            for d, following in zip(mine, [*mine[1:], None]):
                if data["done"][d]:
                    ended += 1
                    assert batch["done"][d] == 1.0
                    continue
                successor = features[following] if following is not None else last[env_id]
                torch.testing.assert_close(batch["next_obs"][d], successor)
                k = round(float(np.log(data["discount"][d]) / np.log(gamma)))
                short += k < execute
                torch.testing.assert_close(
                    gamma**execute * (1 - batch["done"][d]), torch.tensor(gamma**k, dtype=batch["done"].dtype)
                )
    env.close()
    assert ended > 0 and short > 0, (ended, short)


def test_killed_run_resumes_exactly(
    reach_bc_flow: Path, tmp_path: Path, kill_after_first_train_state, assert_same_run
) -> None:
    """`robotrl train dsrl` is SIGKILLed after its first train state; `--resume` must end with the very weights
    (prior, critics, targets, temperature, Adam) and replay of a run that was never stopped."""
    cfg = small(
        reach_bc_flow,
        tmp_path / "killed",
        num_envs=4,
        total_steps=4 * 4 * 10,
        learning_starts=8,
        batch_size=16,
        checkpoint_every=32,
        log_every=32,
    )
    args = [
        str(ROBOTRL),
        "train",
        "dsrl",
        "--policy",
        str(reach_bc_flow),
        "--num-envs",
        "4",
        "--execute",
        "4",
        "--sampler-steps",
        "5",
        "--total-steps",
        "160",
        "--learning-starts",
        "8",
        "--batch-size",
        "16",
        "--checkpoint-every",
        "32",
        "--log-every",
        "32",
        "--eval-episodes",
        "0",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
    assert 1 <= step < 10, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed")
    a, b = (load_train_state(p / TRAIN_STATE) for p in (tmp_path / "straight", tmp_path / "killed"))
    for key in ("size", "cursor", "obs", "action", "reward", "done", "next_obs"):
        torch.testing.assert_close(
            torch.as_tensor(a["replay"][key]), torch.as_tensor(b["replay"][key]), rtol=0, atol=0, msg=key
        )


def test_the_relative_log_density_is_a_kl_estimate_to_the_bc_noise() -> None:
    """With `target_kl` the actor's log-density is the log-ratio to N(0, I): exactly 0 for the starting prior
    (N(0, I) itself), and in the mean KL(N(m, s^2) || N(0, 1)) = sum(m^2 + s^2 - 1 - 2 log s) / 2 for another."""
    torch.manual_seed(0)
    prior = NoisePrior(4, (8, 2), (16,), bound=1.5).requires_grad_(False)
    features = torch.randn(20_000, 4)
    x0, logratio = PriorActor(prior, relative=True)(features)
    assert x0.shape == (20_000, 16) and torch.equal(logratio, torch.zeros(20_000))
    with torch.no_grad():
        prior.net[-1].bias.fill_(0.5)  # mean 1.5 tanh(0.5) in every element
        prior.log_std.fill_(np.log(0.5))
    _, logratio = PriorActor(prior, relative=True)(features)
    m, s = 1.5 * np.tanh(0.5), 0.5
    expected = 16 * (m * m + s * s - 1 - 2 * np.log(s)) / 2
    assert abs(float(logratio.mean()) - expected) < 0.02 * expected, (float(logratio.mean()), expected)
    _, logp = PriorActor(prior)(features)  # the plain log-density: minus the entropy, 16 (log s + log(2 pi e) / 2)
    assert abs(float(-logp.mean()) - 16 * (np.log(s) + 0.5 * np.log(2 * np.pi * np.e))) < 0.1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"utd": 0}, r"DsrlConfig.utd: expected >= 1, got 0"),
        ({"critic_subset": 3}, r"DsrlConfig.critic_subset: expected <= critics \(2\), got 3"),
        ({"gamma": 1.0}, r"DsrlConfig.gamma / tau: expected gamma in \(0, 1\)"),
        ({"target_std": 1.5}, r"DsrlConfig.target_std: expected in \(0, 1\] .* got 1.5"),
        ({"learning_starts": -1}, r"DsrlConfig.learning_starts: expected >= 0, got -1"),
        ({"target_kl": 0.0}, r"DsrlConfig.target_kl: expected > 0 nats or None, got 0.0"),
    ],
)
def test_bad_configs_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DsrlConfig(**overrides)  # type: ignore[arg-type]


def test_a_missing_policy_is_refused_through_the_cli(tmp_path: Path, reach_bc_flow: Path) -> None:
    """The path is named and no run is started."""
    out = subprocess.run(
        [
            str(ROBOTRL),
            "train",
            "dsrl",
            "--policy",
            str(tmp_path / "missing"),
            "--run-dir",
            str(tmp_path / "run"),
            "--no-progress",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode != 0
    assert "missing" in out.stderr
    assert not (tmp_path / "run" / TRAIN_STATE).exists()
