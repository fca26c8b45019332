"""SAC / RLPD from pixels: PushT's overhead camera through the policy library's image encoder, trained by the
critic with DrQ's per-sample random shifts; frames kept on the replay store and rebuilt exactly on resume."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.envs import make
from robotrl.policies.nets import random_shift
from robotrl.rl.sac import SacConfig, build_agent, env_options, evaluate, train
from robotrl.training.loop import TRAIN_STATE, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"


def pixels(run_dir: Path, **overrides: object) -> SacConfig:
    base = SacConfig(
        task="PushT",
        obs_keys=("state", "image_top"),
        image_size=32,
        episode_steps=40,
        num_envs=2,
        total_steps=240,
        learning_starts=80,
        batch_size=32,
        hidden=(64, 64),
        encoder_widths=(8, 16),
        encoder_dim=16,
        lr=1e-3,
        eval_episodes=2,
        eval_envs=2,
        checkpoint_every=80,
        log_every=80,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def image_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demos") / "pusht_images.zarr"
    record_expert(
        path, "PushT", episodes=4, num_envs=2, progress=False, episode_steps=40, images=True, image_size=32
    ).close()
    return path


def test_random_shift_moves_each_image_on_its_own() -> None:
    torch.manual_seed(0)
    x = torch.rand(64, 12, 12, 3)
    y = random_shift(x, 2)
    assert y.shape == x.shape and random_shift(x, 0) is x
    # the centre of every shifted image is the original moved by some (dy, dx) in [-2, 2]^2: find it per image
    found = []
    for a, b in zip(x, y):
        hits = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if torch.equal(b[4:8, 4:8], a[4 + dy : 8 + dy, 4 + dx : 8 + dx])
        ]
        assert len(hits) == 1
        found.append(hits[0])
    assert len(set(found)) > 5  # per sample, not one offset for the whole batch


@pytest.mark.learning
def test_rlpd_with_a_camera_in_the_observation_learns_reach(tmp_path: Path, claim, learning_seed: int) -> None:
    """RLPD with Reach's front camera (16 px) beside the state, through the image encoder with DrQ's shifts and the
    frames on the replay store, learns Reach from 20 demonstrations recorded with images as the state-only RLPD test
    does (tests/test_sac.py), evaluated on the camera env over 20 held-out episodes (seeds 0-4: bench/RESULTS.md,
    "Learning tests"): a pixel path that broke the critic's or the actor's inputs would not. (16 px and batch 64
    keep it inside the CI budget: every env step renders, every update encodes the batch's frames. DrQ's shift is
    1 pixel here: its 4 pixels on 84-px frames, scaled to 16 px (4 would move the scene by a quarter of the frame).)"""
    demos = tmp_path / "reach_images.zarr"
    record_expert(demos, "Reach", episodes=20, num_envs=10, progress=False, images=True, image_size=16).close()
    cfg = SacConfig(
        task="Reach",
        obs_keys=("state", "image_front"),
        image_size=16,
        total_steps=2000,
        learning_starts=200,
        batch_size=64,
        demos=demos,
        encoder_widths=(8, 16),
        encoder_dim=16,
        eval_episodes=20,
        eval_envs=20,
        run_dir=tmp_path / "run",
        progress=False,
        seed=learning_seed,
        augment_pad=1,
    )
    result = train(cfg)
    assert result.success_rate is not None
    claim("pixel RLPD success", result.success_rate, lower=0.4)
    frames = EpisodeStore.open(tmp_path / "run" / "replay.zarr").load(["image_front"])["image_front"]
    assert frames.shape[1:] == (16, 16, 3) and frames.std() > 5


def test_rlpd_from_pixels_trains_the_encoder_and_reads_the_camera(image_demos: Path, tmp_path: Path) -> None:
    cfg = pixels(tmp_path / "run", demos=image_demos)
    result = train(cfg)
    assert result.success_rate is not None

    # every finished episode's frames are on the replay store, rendered (not blank)
    store = EpisodeStore.open(tmp_path / "run" / "replay.zarr")
    frames = store.load(["image_top"])["image_top"]
    assert (
        frames.dtype == np.uint8
        and frames.shape == (store.num_steps, 32, 32, 3)
        and store.num_episodes == 2 * 240 // 80
    )
    assert frames.std() > 5

    # the encoder was trained (by the critic's loss) and the actor's action depends on the pixels
    env = make("PushT", num_envs=2, seed=5, **env_options(cfg))
    torch.manual_seed(cfg.seed)
    fresh, vector_keys = build_agent(env.task_spec, cfg, "test")
    trained, _ = build_agent(env.task_spec, cfg, "test")
    trained.load_state_dict(load_train_state(tmp_path / "run" / TRAIN_STATE)["agent"])
    changed = [not torch.equal(a, b) for a, b in zip(fresh.encoder.parameters(), trained.encoder.parameters())]
    assert all(changed)
    assert evaluate(trained, cfg).success_rate == result.success_rate  # evaluated on the camera env, as saved
    obs, _ = env.reset(seed=5)
    env.close()
    seen = trained.act(obs, vector_keys, deterministic=True)
    dark = trained.act({**obs, "image_top": np.zeros_like(obs["image_top"])}, vector_keys, deterministic=True)
    assert np.abs(seen - dark).max() > 1e-4


def test_killed_pixel_run_resumes_exactly(tmp_path: Path, kill_after_first_train_state, assert_same_run) -> None:
    """SIGKILLed after its first train state, `--resume` ends with the weights (encoder included) and the
    frames on the store of a run that was never stopped."""
    cfg = pixels(tmp_path / "killed", total_steps=200, eval_episodes=0)
    args = [
        str(ROBOTRL),
        "train",
        "sac",
        "--task",
        "PushT",
        "--obs-keys",
        "state",
        "image_top",
        "--image-size",
        "32",
        "--episode-steps",
        "40",
        "--num-envs",
        "2",
        "--total-steps",
        "200",
        "--learning-starts",
        "80",
        "--batch-size",
        "32",
        "--hidden",
        "64",
        "64",
        "--encoder-widths",
        "8",
        "16",
        "--encoder-dim",
        "16",
        "--lr",
        "1e-3",
        "--eval-episodes",
        "0",
        "--eval-envs",
        "2",
        "--checkpoint-every",
        "80",
        "--log-every",
        "80",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
    assert 40 <= step < 100, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert any(k.startswith("encoder.") for k in load_train_state(tmp_path / "killed" / TRAIN_STATE)["agent"])
    assert_same_run(tmp_path / "straight", tmp_path / "killed", store_keys=("image_top", "state", "action"))


def test_pixel_configs_are_checked(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"SacConfig.obs_keys: \['image_front'\] are not numeric or image observations of PushT"
    ):
        train(pixels(tmp_path / "bad", obs_keys=("state", "image_front")))
