"""The success classifier: labels, a real training run on PickPlace's front camera against the step-index baseline,
its checkpoint, refusals, exact resume and the reward wrapper on a real env rollout."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.core.spec import SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.store import user_meta
from robotrl.envs import make
from robotrl.flowrl.classifier import (
    ClassifierConfig,
    ClassifierResult,
    ClassifierReward,
    Metrics,
    choose_threshold,
    frame_labels,
    load,
    load_frames,
    train,
)
from robotrl.policies.base import CheckpointError
from robotrl.policies.flow import FlowConfig
from robotrl.training.loop import TRAIN_STATE


def small(store: Path, run_dir: Path, **overrides: object) -> ClassifierConfig:
    base = ClassifierConfig(
        store=store,
        camera="front",
        steps=300,
        batch_size=32,
        encoder_widths=(8, 16, 32),
        encoder_dim=32,
        hidden=(64,),
        holdout=0.3,
        target_precision=0.8,
        eval_every=0,
        checkpoint_every=100,
        log_every=50,
        threads=1,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def pickplace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """18 PickPlace episodes of the expert at noise 0.8 with 32 px cameras: half of them succeed (measured 9/18)."""
    path = tmp_path_factory.mktemp("classifier") / "pickplace.zarr"
    record_expert(
        path, "PickPlace", episodes=18, num_envs=9, noise=0.8, seed=3, progress=False, image_size=32, episode_steps=120
    ).close()
    return path


@pytest.fixture(scope="module")
def trained(pickplace: Path, tmp_path_factory: pytest.TempPathFactory, learning_seed: int) -> ClassifierResult:
    return train(small(pickplace, tmp_path_factory.mktemp("classifier") / "run", seed=learning_seed))


def test_labels_are_the_frames_a_successful_step_reached() -> None:
    # row t's success is the outcome of its action: the frame that shows it is row t + 1
    assert frame_labels(np.array([0, 0, 1, 1, 0, 1]), True, 3).tolist() == [0, 0, 0, 1, 1, 0]
    # a successful episode without per-step flags (an operator's verdict): its last k frames
    assert frame_labels(np.zeros(6), True, 2).tolist() == [0, 0, 0, 0, 1, 1]
    assert not frame_labels(np.zeros(6), False, 2).any()
    # the threshold: the lowest score that keeps the target precision, else the best F0.5 (or F-beta)
    scores, labels = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), np.array([1, 1, 0, 1, 0, 0], bool)
    assert choose_threshold(scores, labels, 0.75) == (0.6, True)
    assert choose_threshold(scores, labels, 1.0) == (0.8, True)
    assert choose_threshold(scores, 1 - labels, 0.99) == (0.4, False)
    mixed = np.array([1, 0, 1, 0, 0, 1], bool)
    assert choose_threshold(scores, mixed, None) == (0.9, False)  # F0.5 0.71 at 0.9, 0.67 at 0.7
    assert choose_threshold(scores, mixed, None, beta=1.0) == (0.7, False)  # F1 0.67 at 0.7 (first of the ties)
    m = Metrics.of(scores, labels, 0.6)
    assert (m.precision, m.recall, m.predicted) == (0.75, 1.0, 4)


@pytest.mark.learning
def test_classifier_beats_the_step_baseline_on_held_out_episodes(
    trained: ClassifierResult, pickplace: Path, claim
) -> None:
    """Held-out precision and recall of the success classifier against the step-index baseline and the majority
    class (seeds 0-4: bench/RESULTS.md, "Learning tests")."""
    m, step, majority = trained.heldout, trained.baselines["step"], trained.baselines["majority"]
    claim("classifier precision", m.precision, lower=0.8, recall=m.recall, f1=m.f1)
    claim("classifier precision over the step baseline", m.precision - step.precision, lower=0.25)
    # F1 is not held: the threshold buys precision with recall, and F1 over the step baseline ranged from -0.16 to
    # +0.31 over seeds 0-4 (bench/RESULTS.md, "Learning tests"); precision over the baseline never fell under 0.33
    # it finds successes at that precision: recall 0.18 on seed 4, about 0.5-0.75 on seeds 0-3 (the step baseline's
    # recall is 1.0 at precision 0.3, the majority class's 0)
    claim("classifier recall", m.recall, lower=0.1, majority=majority.recall)
    assert trained.target_met
    assert trained.heldout_episodes >= 4 and m.positives > 0 and m.frames > m.positives
    log = [json.loads(line) for line in (trained.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["train/loss"] for row in log if "train/loss" in row]
    assert np.mean(losses[-2:]) < losses[0]


def test_checkpoint_round_trips_with_its_threshold_and_report(
    trained: ClassifierResult, pickplace: Path, tmp_path: Path
) -> None:
    clf = load(trained.classifier)
    manifest = json.loads((trained.classifier / "manifest.json").read_text())
    assert manifest["inputs"]["image_front"]["shape"] == [32, 32, 3] and manifest["threshold"] == clf.threshold
    assert manifest["heldout"]["precision"] == trained.heldout.precision
    # the saved weights are the trained ones: the held-out report is reproduced from the file alone
    held = load_frames(EpisodeStore.open(pickplace), "image_front").select(manifest["labels"]["heldout_episodes"])
    p = clf.predict(held.images)
    assert Metrics.of(p, held.labels, clf.threshold) == trained.heldout
    again = load(clf.save(tmp_path / "copy"))
    np.testing.assert_array_equal(again.predict(torch.from_numpy(held.images[:50])), clf.predict(held.images[:50]))
    assert again.metadata["target_met"] is True


def test_bad_inputs_are_refused(trained: ClassifierResult, pickplace: Path, tmp_path: Path) -> None:
    clf = load(trained.classifier)
    with pytest.raises(
        SpecMismatchError, match=r"'image_front': expected shape \(N, 32, 32, 3\), got \(2, 48, 48, 3\)"
    ):
        clf.predict(np.zeros((2, 48, 48, 3), np.uint8))
    with pytest.raises(SpecMismatchError, match="expected uint8 images"):
        clf.predict(np.zeros((2, 32, 32, 3), np.float32))
    # an env whose camera differs from the one the classifier was trained on (another size; no such camera)
    env = make("PickPlace", num_envs=1, image_size=48)
    with pytest.raises(SpecMismatchError, match=r"input 'image_front': expected .*\[32, 32, 3\].*has .*\[48, 48, 3\]"):
        ClassifierReward(env, clf)
    env.close()
    env = make("PushT", num_envs=1, images=True, image_size=32)
    with pytest.raises(SpecMismatchError, match="input 'image_front'.*'PushT' has no such observation"):
        ClassifierReward(env, clf)
    env.close()
    with pytest.raises(
        SpecMismatchError,
        match=r"camera: expected one of the image observations \['image_front', "
        r"'image_wrist'\] of task 'PickPlace', got 'side'",
    ):
        train(small(pickplace, tmp_path / "bad", camera="side"))
    with pytest.raises(ValueError, match="ClassifierConfig.target_precision: expected a value in \\(0, 1\\], got 1.5"):
        small(pickplace, tmp_path / "bad", target_precision=1.5)
    # a store of successes only cannot teach what failure looks like
    ok = tmp_path / "ok.zarr"
    store = EpisodeStore.create(ok, EpisodeStore.open(pickplace).spec)
    src = EpisodeStore.open(pickplace)
    for i in [i for i, e in enumerate(src.episodes) if e["success"]][:3]:
        ep = src.episode(i)
        store.append_episode(ep.data, user_meta(ep.meta))
    store.close()
    with pytest.raises(
        ValueError,
        match="ClassifierConfig.store: expected at least 2 episodes with success frames and 2 without .*, got 3 and 0",
    ):
        train(small(ok, tmp_path / "bad2"))
    # tampered weights
    copy = clf.save(tmp_path / "tampered")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["weights_sha256"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="does not match the manifest"):
        load(copy)


def test_reward_wrapper_follows_the_classifier_on_a_rollout(trained: ClassifierResult) -> None:
    clf = load(trained.classifier)
    env = ClassifierReward(make("PickPlace", num_envs=2, seed=11, image_size=32, episode_steps=70), clf)
    expert = env.task.expert(noise=0.0, seed=11)
    expert.reset(env.num_envs)
    obs, _ = env.reset(seed=11)
    rewards, env_success, resets = [], [], 0
    for _ in range(80):
        obs, reward, _, _, info = env.step(expert.act(obs))
        reached = obs["image_front"].copy()
        if "final_obs" in info:  # an env that auto-reset: the frame its last step reached, not the new first frame
            done = info["_final_obs"]
            reached[done] = info["final_obs"]["image_front"][done]
            resets += int(done.sum())
            for i in np.flatnonzero(done):
                expert.reset_env(i)
        p = clf.predict(reached)
        np.testing.assert_array_equal(info["classifier_p"], p)
        np.testing.assert_array_equal(reward, (p >= clf.threshold).astype(np.float64))
        np.testing.assert_array_equal(info["success"], p >= clf.threshold)
        rewards.append(reward)
        env_success.append(info["env_success"])
    env.close()
    rewards, env_success = np.array(rewards), np.array(env_success)
    assert resets == 2
    # the perfect expert succeeds in both episodes; the classifier's reward agrees with the env's own success
    assert env_success.any(axis=0).all() and rewards.sum() > 0
    assert np.mean(rewards.astype(bool) == env_success) >= 0.85, np.mean(rewards.astype(bool) == env_success)


def test_killed_run_resumes_exactly(pickplace: Path, tmp_path: Path, kill_after_first_train_state) -> None:
    cfg = small(pickplace, tmp_path / "killed", steps=40, checkpoint_every=10, log_every=10)
    code = (
        f"from pathlib import Path; from robotrl.flowrl.classifier import ClassifierConfig, train; "
        f"train(ClassifierConfig(store=Path({str(pickplace)!r}), camera='front', steps=40, batch_size=32, "
        f"encoder_widths=(8, 16, 32), encoder_dim=32, hidden=(64,), holdout=0.3, target_precision=0.8, eval_every=0, "
        f"checkpoint_every=10, log_every=10, threads=1, run_dir=Path({str(cfg.run_dir)!r}), progress=False))"
    )
    step = kill_after_first_train_state([sys.executable, "-c", code], cfg.run_dir / TRAIN_STATE)
    assert 10 <= step < 40, step
    resumed = train(replace(cfg, resume=True))
    straight = train(replace(cfg, run_dir=tmp_path / "straight"))
    a, b = load(straight.classifier), load(resumed.classifier)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
    assert a.threshold == b.threshold and resumed.heldout == straight.heldout


def test_proprioception_is_an_input_when_asked_for(pickplace: Path, tmp_path: Path) -> None:
    result = train(small(pickplace, tmp_path / "proprio", proprio=("state",), steps=20, log_every=10))
    clf = load(result.classifier)
    assert (
        clf.net.proprio == ("state",)
        and "state" in json.loads((result.classifier / "manifest.json").read_text())["inputs"]
    )
    frames = load_frames(EpisodeStore.open(pickplace), "image_front", ("state",)).select([0])
    with pytest.raises(SpecMismatchError, match=r"proprioception \['state'\] missing"):
        clf.predict(frames.images)
    p = clf.predict(frames.images, frames.proprio)
    moved = clf.predict(frames.images, {"state": frames.proprio["state"] + 1.0})
    assert p.shape == (len(frames.labels),) and np.abs(p - moved).max() > 0  # the state reaches the output
    with pytest.raises(
        SpecMismatchError,
        match="ClassifierConfig.proprio: expected some of the vector observations "
        r"\['state'\], got \['image_wrist'\]",
    ):
        train(small(pickplace, tmp_path / "bad", proprio=("image_wrist",)))


def test_online_rl_trains_on_the_classifiers_reward(trained: ClassifierResult, pickplace: Path, tmp_path: Path) -> None:
    """`train online --reward-classifier`: the env renders the classifier's camera although the policy reads only
    the state, and its reward and success are the classifier's."""
    from robotrl.flowrl.chain import load_flow_policy, training_env
    from robotrl.flowrl.online import OnlineConfig, train as train_online
    from robotrl.stages.bc import BCConfig, train as train_bc

    bc = train_bc(
        BCConfig(
            store=pickplace,
            policy=FlowConfig(channels=(8, 16), obs_keys=("state",)),
            steps=10,
            batch_size=8,
            warmup=1,
            eval_episodes=0,
            run_dir=tmp_path / "bc",
            threads=1,
            progress=False,
        )
    )
    config = OnlineConfig(
        policy=bc.checkpoint,
        reward_classifier=trained.classifier,
        num_envs=2,
        total_steps=96,
        rollout_steps=48,
        execute=8,
        sampler_steps=2,
        eval_episodes=0,
        threads=1,
        run_dir=tmp_path / "online",
        progress=False,
    )
    env = training_env(load_flow_policy(bc.checkpoint, 2), config)
    assert isinstance(env, ClassifierReward) and "image_front" in env.reset(seed=0)[0]
    obs, reward, _, _, info = env.step(np.zeros((2, *env.task_spec.action.shape), np.float32))
    np.testing.assert_array_equal(reward, info["success"].astype(np.float64))
    np.testing.assert_array_equal(info["classifier_p"], load(trained.classifier).predict(obs["image_front"]))
    env.close()
    result = train_online(config)
    assert result.steps == 96 and (tmp_path / "online" / "policy").exists()
    with pytest.raises(FileNotFoundError, match="OnlineConfig.reward_classifier: expected a classifier directory"):
        replace(config, reward_classifier=tmp_path / "nothing")
