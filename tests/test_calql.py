"""Cal-QL offline from real demonstration stores: Monte-Carlo returns-to-go as the paper computes them, Reach
learned without touching the env, the calibration measured against plain CQL on the same data, exact resume
after a SIGKILL, a NaN loss keeping the last good train state, bad configs named, and WSRL from its run."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.datasets import EpisodeStore
from robotrl.envs import make
from robotrl.rl.calql import CalqlConfig, make_agent, train
from robotrl.rl.replay import DemoTransitions
from robotrl.rl.sac import Agent, SacConfig, actor_fn, load_pretrained, train as train_sac
from robotrl.training.evaluate import evaluate_state_actor
from robotrl.training.loop import TRAIN_STATE, RLResult, TrainingDiverged, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"


def small(store: Path, run_dir: Path, **overrides: object) -> CalqlConfig:
    """CI-sized Cal-QL: (128, 128) networks, 4 sampled actions of each kind, batch 128, lr 1e-3."""
    base = CalqlConfig(
        store=store,
        steps=2000,
        batch_size=128,
        cql_actions=4,
        hidden=(128, 128),
        lr=1e-3,
        eval_episodes=40,
        eval_envs=20,
        log_every=250,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def calql_run(offline_reach_demos: Path, tmp_path_factory: pytest.TempPathFactory, learning_seed: int) -> RLResult:
    return train(small(offline_reach_demos, tmp_path_factory.mktemp("calql") / "run", seed=learning_seed))


def trained_agent(run: RLResult, config: CalqlConfig) -> Agent:
    agent = make_agent(23, 3, -torch.ones(3), torch.ones(3), config)
    agent.load_state_dict(load_train_state(run.run_dir / TRAIN_STATE)["agent"])
    return agent


def direct_returns(rewards: list[float], gamma: float) -> list[float]:
    return [sum(gamma ** (k - t) * rewards[k] for k in range(t, len(rewards))) for t in range(len(rewards))]


def test_mc_returns_end_with_each_episode(offline_reach_demos: Path, tmp_path: Path) -> None:
    """A hand-built store: an episode that terminated, one cut by the time limit, one kept unfinished; each
    step's return-to-go sums its own episode's discounted rewards and nothing past its end."""
    env = make("Reach", num_envs=1)
    spec = env.task_spec
    env.close()
    episodes = [([1.0, 2.0, 3.0, 4.0], "terminated"), ([0.5, -1.0, 0.25, 2.0, 1.0], "truncated"), ([3.0, 1.0], "none")]
    store = EpisodeStore.create(tmp_path / "hand.zarr", spec)
    writer, t = store.writer(), 0
    for rewards, end in episodes:
        for i, r in enumerate(rewards):
            last = i == len(rewards) - 1
            state = np.zeros(23, np.float32)
            state[0] = t  # which step this is, to find it in a sampled batch
            writer.add(
                {"state": state}, np.zeros(3, np.float32), r, last and end == "terminated", last and end == "truncated"
            )
            t += 1
        writer.finalize()
    store.close()
    gamma = 0.9
    expected = np.concatenate([direct_returns(r, gamma) for r, _ in episodes])
    data = DemoTransitions(tmp_path / "hand.zarr", spec, ("state",), mc_gamma=gamma)
    np.testing.assert_allclose(data.mc_return, expected, rtol=1e-6)
    assert data.mc_return[3] == 4.0 and data.mc_return[8] == 1.0 and data.mc_return[10] == 1.0  # last steps: r only
    batch = data.sample(500, np.random.default_rng(0))
    steps = batch["obs"][:, 0].long().numpy()
    np.testing.assert_allclose(batch["mc_return"].numpy(), expected[steps], rtol=1e-6)
    assert 3 in steps and 8 not in steps and 10 not in steps  # a terminated end is a transition, a cut one is not
    plain = DemoTransitions(tmp_path / "hand.zarr", spec, ("state",))  # without mc_gamma: as before
    assert plain.mc_return is None and "mc_return" not in plain.sample(4, np.random.default_rng(0))

    # a real store: 40 Reach episodes of 60 steps, every one cut by the time limit
    real = DemoTransitions(offline_reach_demos, spec, ("state",), mc_gamma=0.95)
    with EpisodeStore.open(offline_reach_demos) as demos:
        for index in (0, 17, 39):
            episode = demos.episode(index, ["reward", "truncated"]).data
            start = int(demos.episode_starts[index])
            assert episode["truncated"][-1]
            got = real.mc_return[start : start + len(episode["reward"])]
            np.testing.assert_allclose(got, direct_returns(episode["reward"].tolist(), 0.95), rtol=1e-5)


@pytest.mark.learning
def test_calql_learns_reach_offline(calql_run: RLResult, offline_reach_demos: Path, tmp_path: Path, claim) -> None:
    """From an untrained actor (a few % on Reach) to a clear held-out success after 2,000 offline updates on 40
    noisy demonstrations (seeds 0-4: bench/RESULTS.md, "Learning tests")."""
    torch.manual_seed(0)
    untrained = make_agent(23, 3, -torch.ones(3), torch.ones(3), small(offline_reach_demos, tmp_path))
    start = evaluate_state_actor(actor_fn(untrained.actor), "Reach", ("state",), 40, 20).success_rate
    assert calql_run.success_rate is not None
    claim("Cal-QL success", calql_run.success_rate, lower=0.5, start=start)
    claim("Cal-QL gain", calql_run.success_rate - start, lower=0.4)


@torch.no_grad()
def below_mc(agent: Agent, data: DemoTransitions) -> dict[str, float]:
    """How far the ensemble's mean Q sits under the data's Monte-Carlo returns, on the data's actions and on the
    learned policy's, over every transition of the store."""
    obs, mc = torch.from_numpy(data.obs), torch.from_numpy(data.mc_return)
    q_data = agent.q(agent.critic, obs, torch.from_numpy(data.action)).mean(0)
    q_policy = agent.q(agent.critic, obs, agent.actor(obs, deterministic=True)[0]).mean(0)
    return {
        "data_below": (q_data < mc).float().mean().item(),
        "policy_below": (q_policy < mc).float().mean().item(),
        "data_gap": (q_data - mc).mean().item(),
    }


def test_calibration_keeps_q_above_the_mc_returns_that_cql_falls_under(
    calql_run: RLResult, offline_reach_demos: Path, tmp_path: Path
) -> None:
    """The same code, data, seed and budget with the calibration off (plain CQL): CQL's Q on the data's and the
    policy's actions sinks below the data's Monte-Carlo returns on most transitions; Cal-QL's stays above them
    on most (the measured shares: bench/RESULTS.md, "Learning tests: thresholds against their spread over seeds")."""
    cql_config = small(offline_reach_demos, tmp_path / "cql", calibrate=False, eval_episodes=0)
    cql_run = train(cql_config)
    data = DemoTransitions(
        offline_reach_demos, EpisodeStore.open(offline_reach_demos).spec, ("state",), mc_gamma=cql_config.gamma
    )
    cql = below_mc(trained_agent(cql_run, cql_config), data)
    calql = below_mc(trained_agent(calql_run, cql_config), data)
    assert cql["data_below"] >= 0.6 and cql["policy_below"] >= 0.6, cql
    assert calql["data_below"] <= 0.4 and calql["policy_below"] <= 0.4, calql
    assert calql["data_gap"] >= cql["data_gap"] + 3.0, (calql, cql)


def test_killed_run_resumes_exactly(
    offline_reach_demos: Path, tmp_path: Path, kill_after_first_train_state, assert_same_run
) -> None:
    """`robotrl train calql` is SIGKILLed after its first train state; `--resume` ends with the weights (actor,
    critics, targets, temperature) of a run that was never stopped."""
    cfg = small(
        offline_reach_demos,
        tmp_path / "killed",
        steps=200,
        checkpoint_every=50,
        batch_size=32,
        cql_actions=2,
        hidden=(32, 32),
        eval_episodes=0,
        log_every=50,
    )
    args = [
        str(ROBOTRL),
        "train",
        "calql",
        "--store",
        str(offline_reach_demos),
        "--steps",
        "200",
        "--checkpoint-every",
        "50",
        "--batch-size",
        "32",
        "--cql-actions",
        "2",
        "--hidden",
        "32",
        "32",
        "--lr",
        "1e-3",
        "--eval-episodes",
        "0",
        "--log-every",
        "50",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
    assert 50 <= step < 200, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed")


def test_nan_loss_stops_and_keeps_the_last_good_train_state(offline_reach_demos: Path, tmp_path: Path) -> None:
    cfg = small(
        offline_reach_demos,
        tmp_path / "nan",
        lr=1e6,
        steps=200,
        checkpoint_every=1,
        batch_size=32,
        hidden=(32, 32),
        eval_episodes=0,
    )  # an absurd learning rate blows the weights up
    message = r"calql step (\d+) \(last train state: .*train_state.safetensors\): \w+ loss is (nan|inf)"
    with pytest.raises(TrainingDiverged, match=message) as error:
        train(cfg)
    failed = int(re.search(message, str(error.value)).group(1))  # type: ignore[union-attr]
    state = load_train_state(tmp_path / "nan" / TRAIN_STATE)
    assert state["step"] == failed  # the state after the last update that went through
    assert all(torch.isfinite(v).all() for v in state["agent"].values())


def test_bad_configs_are_refused(offline_reach_demos: Path, tmp_path: Path) -> None:
    for overrides, message in (
        ({"critic_subset": 3}, r"CalqlConfig.critic_subset: expected <= critics \(2\), got 3"),
        ({"cql_actions": 0}, r"CalqlConfig.cql_actions: expected >= 1, got 0"),
        ({"cql_alpha": -1.0}, r"CalqlConfig.cql_alpha: expected >= 0, got -1.0"),
        ({"gamma": 1.0}, r"CalqlConfig.gamma: expected a value in \(0, 1\), got 1.0"),
        ({"tau": 0.0}, r"CalqlConfig.tau: expected a value in \(0, 1\], got 0.0"),
        ({"lr": 0.0}, r"CalqlConfig.lr: expected > 0, got 0.0"),
    ):
        with pytest.raises(ValueError, match=message):
            small(offline_reach_demos, tmp_path, **overrides)
    with pytest.raises(ValueError, match=r"CalqlConfig.resume: needs run_dir"):
        CalqlConfig(store=offline_reach_demos, resume=True)
    with pytest.raises(
        ValueError,
        match=r"CalqlConfig.obs_keys: \['nope'\] are not numeric state observations of Reach; expected some of \['state'\]",
    ):
        train(small(offline_reach_demos, tmp_path / "keys", obs_keys=("nope",)))


@pytest.mark.learning
def test_wsrl_fine_tunes_a_calql_agent_online(
    offline_reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """WSRL from Cal-QL: `sac --init` loads its actor, critics and target critics as they are, warms up with its
    rollouts and fine-tunes on online data only, ending well above the offline agent (seeds 0-4: bench/RESULTS.md,
    "Learning tests")."""
    offline = train(small(offline_reach_demos, tmp_path / "calql", steps=600, seed=learning_seed))
    assert offline.success_rate is not None
    online_config = SacConfig(
        task="Reach",
        total_steps=3000,
        learning_starts=300,
        init=tmp_path / "calql",
        hidden=(128, 128),
        lr=1e-3,
        eval_episodes=40,
        eval_envs=20,
        run_dir=tmp_path / "wsrl",
        progress=False,
        seed=learning_seed,
    )
    sac_agent = Agent(23, 3, -torch.ones(3), torch.ones(3), online_config)
    load_pretrained(sac_agent, tmp_path / "calql")
    weights = load_train_state(tmp_path / "calql" / TRAIN_STATE)["agent"]
    loaded = {k: v for k, v in sac_agent.state_dict().items() if k.startswith(("actor.", "critic.", "target."))}
    assert loaded and all(torch.equal(v, weights[k]) for k, v in loaded.items())
    online = train_sac(online_config)
    assert online.success_rate is not None and offline.success_rate is not None
    claim("WSRL from Cal-QL success", online.success_rate, lower=0.5, offline=offline.success_rate)
    claim("WSRL from Cal-QL gain", online.success_rate - offline.success_rate, lower=0.4)
