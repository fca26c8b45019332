"""SAC / RLPD on real MuJoCo envs: learns Reach from demonstrations within a CI budget, keeps every transition on
the store, resumes exactly after a SIGKILL, stops on a NaN loss keeping the last good train state."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl import SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.envs import make
from robotrl.policies import CheckpointError, load, runtime
from robotrl.policies.export import export
from robotrl.rl.sac import Agent, SacConfig, evaluate, train
from robotrl.training.evaluate import evaluate_policy
from robotrl.training.loop import TRAIN_STATE, TrainingDiverged, TrainStateError, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"


def small(run_dir: Path, **overrides: object) -> SacConfig:
    base = SacConfig(
        task="Reach",
        num_envs=2,
        total_steps=400,
        learning_starts=100,
        hidden=(64, 64),
        lr=1e-3,
        eval_episodes=1,
        eval_envs=1,
        checkpoint_every=200,
        log_every=100,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


@pytest.mark.learning
@pytest.mark.parametrize("critic_loss", ["mse", "hl_gauss"])
def test_rlpd_learns_reach_from_demos(
    critic_loss: str, reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """From an untrained actor (a few % on Reach) to a clear held-out success over 40 episodes in 2,000 env steps
    with 20 noisy demonstrations, with either critic loss (regression, or HL-Gauss's cross-entropy against a
    histogram); seeds 0-4: bench/RESULTS.md, "Learning tests"."""
    cfg = SacConfig(
        task="Reach",
        total_steps=2000,
        learning_starts=200,
        demos=reach_demos,
        eval_episodes=40,
        eval_envs=20,
        run_dir=tmp_path / "rlpd",
        progress=False,
        critic_loss=critic_loss,
        seed=learning_seed,
    )
    torch.manual_seed(learning_seed)
    obs_dim, action_dim = 23, 3
    start = evaluate(Agent(obs_dim, action_dim, -torch.ones(3), torch.ones(3), cfg), cfg).success_rate
    result = train(cfg)
    assert result.success_rate is not None
    claim(f"RLPD ({critic_loss}) success", result.success_rate, lower=0.4, start=start)
    claim(f"RLPD ({critic_loss}) gain", result.success_rate - start, lower=0.3)
    # the saved policy (what eval, export and deploy load) is what the run evaluated: the same held-out episodes
    assert evaluate_policy(load(result.weights), 40, 20).success_rate == result.success_rate
    # every finished episode of the run is on disk, tagged with its env
    store = EpisodeStore.open(tmp_path / "rlpd" / "replay.zarr")
    assert store.num_episodes == 2000 // 60 and store.num_steps == 60 * (2000 // 60)  # the unfinished one is not
    assert {e["source"] for e in store.episodes} == {"policy"} and {e["env"] for e in store.episodes} == {0}


def test_killed_run_resumes_exactly(tmp_path: Path, kill_after_first_train_state, assert_same_run) -> None:
    """`robotrl train sac` is SIGKILLed after its first train state; `--resume` ends with the weights and the
    replay store of a run that was never stopped (envs mid-episode, RNGs, replay rebuilt from the store)."""
    cfg = small(tmp_path / "killed", checkpoint_every=100)
    args = [
        str(ROBOTRL),
        "train",
        "sac",
        "--task",
        "Reach",
        "--num-envs",
        "2",
        "--total-steps",
        "400",
        "--learning-starts",
        "100",
        "--hidden",
        "64",
        "64",
        "--lr",
        "1e-3",
        "--eval-episodes",
        "1",
        "--eval-envs",
        "1",
        "--checkpoint-every",
        "100",
        "--log-every",
        "100",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
    assert 50 <= step < 200, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed", store_keys=("state", "action", "reward"))


def test_nan_loss_stops_and_keeps_the_last_good_train_state(tmp_path: Path) -> None:
    cfg = small(tmp_path / "nan", lr=1e6, checkpoint_every=50)  # an absurd learning rate blows the weights up
    with pytest.raises(
        TrainingDiverged, match=r"sac step \d+ \(last train state: .*train_state.safetensors\): \w+ loss is nan"
    ):
        train(cfg)
    state = load_train_state(tmp_path / "nan" / TRAIN_STATE)
    assert state["step"] * 2 <= 100  # taken before the first update
    assert all(torch.isfinite(v).all() for v in state["agent"].values())


def test_bad_configs_and_demos_are_refused(reach_demos: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"SacConfig.critic_subset: expected <= critics \(2\), got 3"):
        small(tmp_path, critic_subset=3)
    with pytest.raises(
        ValueError, match=r"SacConfig.obs_keys: \['nope'\] are not numeric or image observations of Reach"
    ):
        train(small(tmp_path / "keys", obs_keys=("nope",)))
    pusht = tmp_path / "pusht.zarr"
    record_expert(pusht, "PushT", episodes=1, num_envs=1, progress=False, episode_steps=5).close()
    with pytest.raises(SpecMismatchError, match="spec.task"):
        train(small(tmp_path / "mismatch", demos=pusht))
    train(small(tmp_path / "once", total_steps=20, learning_starts=10))
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(small(tmp_path / "once", total_steps=20, learning_starts=10))


def test_hl_gauss_critic_represents_its_targets(tmp_path: Path) -> None:
    from robotrl.policies.gaussian import HLGauss

    hl = HLGauss(-10.0, 60.0, bins=101)  # bins 0.7 wide, sigma 0.525
    inside, outside = torch.tensor([-3.3, 0.0, 12.5, 40.0]), torch.tensor([-20.0, 80.0])
    torch.testing.assert_close(hl.target_probs(inside).sum(-1), torch.ones(4))
    # the histogram's mean is the target inside the range; outside, within a sigma of the edge it was clamped to
    torch.testing.assert_close(hl.value(hl.target_probs(inside).log()), inside, atol=0.02, rtol=0)
    torch.testing.assert_close(
        hl.value(hl.target_probs(outside).log()), torch.tensor([-10.0, 60.0]), atol=hl.sigma, rtol=0
    )
    # cross-entropy against the histogram drives free logits to represent the target
    logits = torch.randn(4, 101, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.2)
    for _ in range(2000):
        opt.zero_grad()
        hl.loss(logits, inside).mean().backward()
        opt.step()
    torch.testing.assert_close(hl.value(logits.detach()), inside, atol=0.1, rtol=0)
    # SAC learns with it end to end: test_rlpd_learns_reach_from_demos[hl_gauss]


# slow: the same `sac --init` fine-tuning as tests/test_calql.py's default-suite WSRL test, from IQL instead of Cal-QL
@pytest.mark.slow
@pytest.mark.learning
def test_wsrl_fine_tunes_an_offline_iql_agent_online(
    reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """WSRL: IQL learns offline from 20 noisy demonstrations; SAC starts from its actor and critics, warms up with
    its rollouts and fine-tunes on online data only, ending well above where the offline agent started (seeds 0-4:
    bench/RESULTS.md, "Learning tests")."""
    from robotrl.rl.iql import IqlConfig, train as train_iql

    offline = train_iql(
        IqlConfig(
            store=reach_demos,
            steps=1500,
            eval_episodes=40,
            eval_envs=20,
            run_dir=tmp_path / "iql",
            progress=False,
            seed=learning_seed,
        )
    )
    online = train(
        SacConfig(
            task="Reach",
            total_steps=1500,
            learning_starts=300,
            init=tmp_path / "iql",
            lr=1e-3,
            eval_episodes=40,
            eval_envs=20,
            run_dir=tmp_path / "wsrl",
            progress=False,
            seed=learning_seed,
        )
    )
    assert online.success_rate is not None and offline.success_rate is not None
    claim("WSRL from IQL success", online.success_rate, lower=0.5, offline=offline.success_rate)
    claim("WSRL from IQL gain", online.success_rate - offline.success_rate, lower=0.4)
    with pytest.raises(
        ValueError, match=r"SacConfig.init: .*train_state.safetensors actor.trunk.0.weight: expected shape \(64, 23\)"
    ):
        train(small(tmp_path / "mismatch", init=tmp_path / "iql"))


def test_the_run_saves_its_actor_as_a_registered_policy(tmp_path: Path) -> None:
    """`policy/` is the registered `gaussian` policy: its action is the agent's deterministic one (the squashed
    mean) to the bit, and its ONNX export, run by the runtime, acts as it does."""
    cfg = small(tmp_path / "run", eval_episodes=0)
    result = train(cfg)
    policy = load(result.weights)
    assert result.weights == tmp_path / "run" / "policy" and policy.name == "gaussian"
    agent = Agent(23, 3, -torch.ones(3), torch.ones(3), cfg)
    agent.load_state_dict(load_train_state(tmp_path / "run" / TRAIN_STATE)["agent"])
    env = make("Reach", num_envs=16, seed=3)
    obs, _ = env.reset(seed=3)
    env.close()
    window = {"state": obs["state"][:, None]}
    expected = agent.act(obs, ("state",), deterministic=True)
    np.testing.assert_array_equal(policy.act(window)[:, 0], expected)
    exported = runtime.load(export(result.weights, tmp_path / "onnx"))
    assert exported.manifest["export"]["deterministic"]
    assert np.abs(exported.act(window)[:, 0] - expected).max() <= 1e-5

    # a run of an earlier version (its actor pickled as actor.pt, no policy/) is named with its conversion
    saved = policy.state_dict()
    shutil.rmtree(result.weights)
    torch.save(agent.actor.state_dict(), tmp_path / "run" / "actor.pt")
    with pytest.raises(CheckpointError, match=r"actor.pt: the pickled actor .* `robotrl policy convert --run-dir"):
        load(tmp_path / "run")
    convert = subprocess.run(
        [str(ROBOTRL), "policy", "convert", "--run-dir", str(tmp_path / "run")], capture_output=True, text=True
    )
    assert convert.returncode == 0, convert.stderr[-2000:]
    converted = load(tmp_path / "run" / "policy").state_dict()
    assert converted.keys() == saved.keys() and all(torch.equal(converted[k], saved[k]) for k in saved)

    # a tampered policy and a truncated train state are refused, each naming its file
    weights = tmp_path / "run" / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model.safetensors: sha256 .* does not match the manifest"):
        load(tmp_path / "run" / "policy")
    state = tmp_path / "run" / TRAIN_STATE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    with pytest.raises(
        TrainStateError, match=r"train_state.safetensors: not a whole train state \(Error while deserializing header"
    ):
        train(replace(cfg, resume=True))
