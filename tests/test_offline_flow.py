"""RL-100's iterative offline stage for flow policies (robotrl/flowrl/offline.py), from a BC flow checkpoint trained on
real Reach demos: the stage runs end to end into an ordinary flow checkpoint and a grown store, the store's decisions
are the chunked policy's, the OPE gate rolls a bad update back, a stopped run resumes exactly, a NaN stops with the
last good train state, bad configs are refused naming the field, and (slow) held-out success rises."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.datasets import EpisodeStore
from robotrl.flowrl.chain import load_flow_policy
from robotrl.flowrl.offline import OfflineFlowConfig, read_decisions, train
from robotrl.policies import load
from robotrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from robotrl.training.evaluate import evaluate_policy
from robotrl.training.loop import TRAIN_STATE, TrainingDiverged, load_train_state

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bc_flow(offline_reach_mlp_flow: Path) -> Path:
    """The chunk-MLP start: the stage's critic and gates see the same store, its flow updates and rollouts cost less."""
    return offline_reach_mlp_flow


def tiny(policy: Path, store: Path, run_dir: Path, **overrides: object) -> OfflineFlowConfig:
    """CI-sized: chunks of 4 executed, a 5-step chain, 100 critic steps and 2 gated updates of 16 windows x 4 chains
    per iteration, 4 rollout episodes."""
    base = OfflineFlowConfig(
        policy=policy,
        store=store,
        run_dir=run_dir,
        iterations=1,
        critic_steps=100,
        policy_updates=2,
        windows=16,
        samples=4,
        minibatch_size=32,
        epochs=2,
        rollout_episodes=4,
        rollout_envs=4,
        execute=4,
        sampler_steps=5,
        eval_episodes=4,
        eval_envs=4,
        progress=False,
    )
    return replace(base, **overrides)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_stage_runs_end_to_end_into_a_flow_checkpoint_and_a_grown_store(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path
) -> None:
    result = train(tiny(bc_flow, offline_reach_demos, tmp_path / "run"))
    tuned = load(result.weights)  # an ordinary FlowPolicy checkpoint: eval, online, distill, export take it
    assert tuned.name == "flow" and tuned.config.steps == 5 and tuned.config.solver == "euler"
    assert evaluate_policy(tuned, 4, 4, execute=4).success_rate == result.success_rate
    with EpisodeStore.open(offline_reach_demos) as demos, EpisodeStore.open(tmp_path / "run" / "store.zarr") as grown:
        assert demos.num_episodes == 40  # the input store is never written
        added = grown.episodes[40:]
        assert len(added) >= 4 and all(m["source"] == "policy" and m["iteration"] == 0 for m in added)
        np.testing.assert_array_equal(grown.episode(0).data["action"], demos.episode(0).data["action"])
    rows = metrics(tmp_path / "run")
    assert rows[0]["step"] == 0 and "eval/success_rate" in rows[0]  # the starting policy, so the change shows
    gate = [r for r in rows if "ope/accepted" in r]
    assert len(gate) == 2 and all(np.isfinite(r["ope/new"]) for r in gate)
    # an update is kept exactly when its gain's lower bound is positive, and the next update is compared to it
    for a, b in itertools.pairwise(gate):
        assert b["ope/old"] == pytest.approx(a["ope/new"] if a["ope/accepted"] else a["ope/old"])
    assert all(r["ope/accepted"] == float(r["ope/gain_lcb"] > 0) for r in gate)
    assert all(r["ope/gain_lcb"] <= r["ope/gain"] - 2 * r["ope/gain_se"] + 1e-6 for r in gate)
    iteration = next(r for r in rows if "iteration/accepted" in r)
    assert iteration["data/added"] >= 4 and iteration["step"] == 2
    assert (tmp_path / "run" / "result.json").exists() and any((tmp_path / "run" / "tb").iterdir())


def test_decisions_are_the_chunked_policys(bc_flow: Path, offline_reach_demos: Path) -> None:
    """Reach never terminates, so every 60-step episode has 60 - 4 decisions of 4 executed steps with a stored
    successor window (the last 4 reach the time-limit cut); each one's reward is the discounted sum of its steps and
    its successor the window 4 steps on."""
    policy = load_flow_policy(bc_flow, 5)
    gamma = 0.9
    data = read_decisions(offline_reach_demos, policy, 4, gamma, 0.2, 0, "store")
    assert len(data) == 40 * 56
    assert 0 < data.held_out.sum() < len(data) and data.held_out.sum() % 56 == 0
    with EpisodeStore.open(offline_reach_demos) as store:
        ep = store.episode(1).data
    t, d = 10, 56 + 10  # episode 1, step 10
    np.testing.assert_allclose(float(data.reward[d]), sum(gamma**j * ep["reward"][t + j] for j in range(4)), rtol=1e-5)
    assert float(data.discount[d]) == pytest.approx(gamma**4)
    window = policy.normalize_obs({"state": ep["state"][None, t + 3 : t + 5]})["state"][0]
    torch.testing.assert_close(data.next_obs["state"][d], window)
    action = policy.normalizer.normalize("action", torch.as_tensor(ep["action"][t : t + 4]).float()).flatten()
    torch.testing.assert_close(data.action[d], action)


def test_ope_gate_rejects_a_bad_update_and_keeps_the_old_weights(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path
) -> None:
    """An absurd learning rate (1.0) wrecks the policy in one update; the OPE estimate falls and every update is
    rolled back, so the run ends with the starting weights exactly."""
    result = train(tiny(bc_flow, offline_reach_demos, tmp_path / "run", lr=1.0, eval_episodes=0))
    gate = [r for r in metrics(tmp_path / "run") if "ope/accepted" in r]
    assert len(gate) == 2 and all(r["ope/accepted"] == 0.0 and not r["ope/new"] >= r["ope/old"] for r in gate), gate
    start, tuned = load(bc_flow).state_dict(), load(result.weights).state_dict()
    for name, x in start.items():
        torch.testing.assert_close(tuned[name], x, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("extraction", ["ppo", "awr"])
def test_stopped_run_resumes_exactly(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path, extraction: str, assert_same_run
) -> None:
    """A run stopped after its first iteration's train state, with episodes a killed second iteration had already
    rolled out left on its store, resumes (dropping them) to the very weights (awr: the student's and its EMA's),
    Adam states and store of a run that was never stopped."""
    cfg = tiny(
        bc_flow,
        offline_reach_demos,
        tmp_path / "stopped",
        iterations=2,
        eval_episodes=0,
        critic_steps=30,
        policy_updates=1,
        extraction=extraction,
    )
    train(replace(cfg, iterations=1))
    with EpisodeStore.open(tmp_path / "stopped" / "store.zarr", mode="a") as store:
        store.append_episode(store.episode(0).data, {"source": "policy"})  # what a killed iteration left behind
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "stopped")
    a, b = (load_train_state(p / TRAIN_STATE) for p in (tmp_path / "straight", tmp_path / "stopped"))
    assert a["step"] == b["step"] == 2 and a["episodes"] == b["episodes"]
    assert json.dumps(a["opt"], default=str) == json.dumps(b["opt"], default=str)
    s1, s2 = (
        EpisodeStore.open(tmp_path / "straight" / "store.zarr"),
        EpisodeStore.open(tmp_path / "stopped" / "store.zarr"),
    )
    assert s1.num_episodes == s2.num_episodes
    np.testing.assert_array_equal(s1.load(["action"])["action"], s2.load(["action"])["action"])


def test_nan_stops_and_keeps_the_last_good_train_state(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path
) -> None:
    """A NaN reward on the store makes the critic's loss NaN in the second iteration: the run stops naming it and
    the train state (and checkpoint) of the first iteration stay."""
    cfg = tiny(bc_flow, offline_reach_demos, tmp_path / "run", iterations=2, eval_episodes=0)
    train(replace(cfg, iterations=1))
    kept = (tmp_path / "run" / "policy" / "model.safetensors").read_bytes()
    with EpisodeStore.open(tmp_path / "run" / "store.zarr", mode="a") as store:
        store.array("reward")[5] = np.nan
    message = r"offline iteration 1 \(last train state: .*train_state.safetensors\): critic: (value|critic) loss is nan"
    with pytest.raises(TrainingDiverged, match=message):
        train(replace(cfg, resume=True))
    state = load_train_state(tmp_path / "run" / TRAIN_STATE)
    assert state["step"] == 1 and all(torch.isfinite(v).all() for v in state["agent"].values())
    assert (tmp_path / "run" / "policy" / "model.safetensors").read_bytes() == kept


def test_bad_configs_and_inputs_are_refused(bc_flow: Path, offline_reach_demos: Path, tmp_path: Path) -> None:
    for overrides, message in (
        ({"iterations": 0}, r"OfflineFlowConfig.iterations: expected >= 1, got 0"),
        (
            {"method": "ddpo"},
            (
                r"OfflineFlowConfig.method: expected one of \('denoising_mdp', 'flow_sde', "
                r"'flow_noise', 'ode_noise'\), got 'ddpo'"
            ),
        ),
        (
            {"method": "latent"},
            (
                r"OfflineFlowConfig.method: expected one of \('denoising_mdp', 'flow_sde', "
                r"'flow_noise', 'ode_noise'\), got 'latent'"
            ),
        ),
        ({"advantage": "gae"}, r"OfflineFlowConfig.advantage: expected 'value' or 'group', got 'gae'"),
        (
            {"advantage": "group", "samples": 1},
            r"OfflineFlowConfig.samples: expected >= 2 for advantage 'group', got 1",
        ),
        ({"ope_fraction": 1.0}, r"OfflineFlowConfig.ope_fraction: expected a value in \(0, 1\), got 1.0"),
        ({"ope_z": -0.1}, r"OfflineFlowConfig.ope_z: expected >= 0, got -0.1"),
        ({"gate_episodes": 0}, r"OfflineFlowConfig.gate_episodes: expected >= 1, got 0"),
        ({"gate_z": -1.0}, r"OfflineFlowConfig.gate_z: expected >= 0, got -1.0"),
        ({"expectile": 0.3}, r"OfflineFlowConfig.expectile: expected a value in \[0.5, 1\), got 0.3"),
        ({"gamma": 1.0}, r"OfflineFlowConfig.gamma: expected a value in \(0, 1\), got 1.0"),
        ({"lr": 0.0}, r"OfflineFlowConfig.lr: expected > 0, got 0.0"),
        ({"extraction": "dpo"}, r"OfflineFlowConfig.extraction: expected 'ppo' or 'awr', got 'dpo'"),
        ({"awr_ema": 1.0}, r"OfflineFlowConfig.awr_ema: expected a decay in \[0, 1\), got 1.0"),
        ({"awr_temperature": 0.0}, r"OfflineFlowConfig.awr_temperature: expected > 0, got 0.0"),
    ):
        with pytest.raises(ValueError, match=message):
            tiny(bc_flow, offline_reach_demos, tmp_path / "run", **overrides)
    with pytest.raises(ValueError, match=r"OfflineFlowConfig.resume: needs run_dir"):
        OfflineFlowConfig(policy=bc_flow, resume=True)
    flow = load(bc_flow)
    DiffusionPolicy(flow.spec, DiffusionConfig(channels=(32, 64), action_horizon=8), flow.stats).save(tmp_path / "diff")
    with pytest.raises(
        ValueError,
        match=r"OfflineFlowConfig.policy: expected a flow policy checkpoint \(robotrl train "
        r"bc policy:flow\), got a 'diffusion' policy",
    ):
        train(tiny(tmp_path / "diff", offline_reach_demos, tmp_path / "run"))
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"OfflineFlowConfig.store: {tmp_path / 'none.zarr'} does not exist")
    ):
        train(tiny(bc_flow, tmp_path / "none.zarr", tmp_path / "run"))
    once = tiny(bc_flow, offline_reach_demos, tmp_path / "once", critic_steps=1, policy_updates=1, eval_episodes=0)
    train(once)
    with pytest.raises(FileExistsError, match=r"OfflineFlowConfig.run_dir: .*once already holds a run"):
        train(once)


@pytest.mark.learning
def test_awr_extraction_raises_held_out_success_on_reach(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """--extraction awr, CI-sized: one iteration, 300 critic steps, one update of 300 advantage-weighted flow-matching
    steps whose EMA is gated, 40 rollouts. Held-out success over 50 paired episodes rises (seeds 0-4:
    bench/RESULTS.md, "Learning tests"); the saved policy is the gated EMA, not the trained weights."""
    config = OfflineFlowConfig(
        policy=bc_flow,
        store=offline_reach_demos,
        run_dir=tmp_path / "run",
        iterations=1,
        extraction="awr",
        lr=3e-4,
        policy_updates=1,
        epochs=300,
        windows=32,
        critic_steps=300,
        rollout_episodes=40,
        rollout_envs=20,
        execute=4,
        sampler_steps=5,
        eval_episodes=50,
        eval_envs=25,
        progress=False,
        seed=learning_seed,
    )
    result = train(config)
    rows = metrics(tmp_path / "run")
    start = rows[0]["eval/success_rate"]
    claim("offline AWR gain", result.success_rate - start, lower=0.4, start=start, end=result.success_rate)
    awr = [r for r in rows if "loss/awr" in r]
    assert len(awr) == 1 and awr[0]["awr/max_weight"] <= config.awr_max_weight and awr[0]["ope/accepted"] == 1.0
    state = load_train_state(tmp_path / "run" / TRAIN_STATE)["agent"]
    saved = load(tmp_path / "run" / "policy").state_dict()
    student = {k[len("student.") :]: v for k, v in state.items() if k.startswith("student.")}
    assert student and any(not torch.equal(saved[k], student[k]) for k in saved if k in student)


def test_success_gate_undoes_an_update_whose_gain_is_inside_its_noise(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path
) -> None:
    """The AWR update of the test above passes the OPE gate; asked for a gain of 100 standard errors, the success
    gate undoes it: the saved policy is the BC checkpoint's weights."""
    config = OfflineFlowConfig(
        policy=bc_flow,
        store=offline_reach_demos,
        run_dir=tmp_path / "run",
        iterations=1,
        extraction="awr",
        lr=3e-4,
        policy_updates=1,
        epochs=300,
        windows=32,
        critic_steps=300,
        rollout_episodes=4,
        rollout_envs=4,
        gate_episodes=20,
        gate_z=100.0,
        execute=4,
        sampler_steps=5,
        eval_episodes=0,
        progress=False,
    )
    result = train(config)
    rows = metrics(tmp_path / "run")
    assert [r["ope/accepted"] for r in rows if "ope/accepted" in r] == [1.0]
    check = next(r for r in rows if "gate/gain_lcb" in r)
    assert check["gate/gain_lcb"] < 0 and check["gate/kept"] == 0.0 and 0.0 <= check["gate/start_success"] <= 1.0
    assert next(r for r in rows if "iteration/accepted" in r)["iteration/accepted"] == 0
    saved, start = load(result.weights).state_dict(), load(bc_flow).state_dict()
    assert saved.keys() == start.keys() and all(torch.equal(saved[k], start[k]) for k in start)


@pytest.mark.learning
def test_stage_does_no_harm_to_held_out_success_on_reach(
    bc_flow: Path, offline_reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """A CI-sized stage (2 iterations of 500 critic steps and 4 gated updates, a 50-episode success gate) from the
    half-trained Reach policy: the OPE gate keeps only updates whose gain's lower bound is positive, the success gate
    keeps an iteration's updates only on a measured gain beyond a standard error, and held-out success over 100
    paired episodes ends no more than 3 points below the BC start (seeds 0-4: bench/RESULTS.md, "Learning tests")."""
    result = train(
        OfflineFlowConfig(
            policy=bc_flow,
            store=offline_reach_demos,
            run_dir=tmp_path / "run",
            iterations=2,
            critic_steps=500,
            critics=2,
            critic_hidden=(128, 128),
            policy_updates=4,
            windows=32,
            rollout_episodes=10,
            gate_episodes=50,
            execute=4,
            sampler_steps=5,
            eval_episodes=100,
            eval_envs=25,
            progress=False,
            seed=learning_seed,
        )
    )
    assert_gates_decided_by_their_bounds(tmp_path / "run", updates=8)
    start = metrics(tmp_path / "run")[0]["eval/success_rate"]
    claim("offline stage - BC start", result.success_rate - start, lower=-0.03, start=start, end=result.success_rate)


def assert_gates_decided_by_their_bounds(run_dir: Path, updates: int) -> None:
    """Every update the OPE gate accepted had a positive lower bound on its gain, and every iteration's updates stayed
    exactly when the success gate's lower bound was positive (which needs the new success above the start's)."""
    rows = metrics(run_dir)
    gate = [r for r in rows if "ope/accepted" in r]
    assert len(gate) == updates and all(r["ope/gain_lcb"] > 0 for r in gate if r["ope/accepted"])
    kept = {r["step"]: r["iteration/accepted"] for r in rows if "iteration/accepted" in r}
    for check in (r for r in rows if "gate/new_success" in r):
        assert (kept[check["step"]] > 0) == (check["gate/gain_lcb"] > 0) == bool(check["gate/kept"]), check
        assert (check["gate/gain_lcb"] > 0) <= (check["gate/new_success"] > check["gate/start_success"])


@pytest.mark.slow
@pytest.mark.learning
def test_stage_does_not_lower_held_out_success_on_reach(
    offline_reach_bc_flow: Path, offline_reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """The defaults on the Reach setup of the module docstring (K = 5, chunks of 4 executed, 2 iterations): held-out
    success over 100 paired episodes ends no more than 3 points below the BC start (bench/RESULTS.md, "Measurements
    behind the code's design"; the U-Net start it was measured on)."""
    result = train(
        OfflineFlowConfig(
            policy=offline_reach_bc_flow,
            store=offline_reach_demos,
            run_dir=tmp_path / "run",
            iterations=2,
            execute=4,
            sampler_steps=5,
            eval_episodes=100,
            eval_envs=25,
            progress=False,
            seed=learning_seed,
        )
    )
    assert_gates_decided_by_their_bounds(tmp_path / "run", updates=20)
    start = metrics(tmp_path / "run")[0]["eval/success_rate"]
    claim(
        "offline stage (defaults) - BC start",
        result.success_rate - start,
        lower=-0.03,
        start=start,
        end=result.success_rate,
    )
