"""Training windows: edge padding, masks, in-memory vs chunk-cached disk reads, mixing, the torch path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl import SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.sampler import MixedSampler, SequenceConfig, SequenceSampler, dataloader
from test_store import SPEC, episode_data, episode_length


@pytest.fixture()
def store(tmp_path: Path) -> EpisodeStore:
    s = EpisodeStore.create(tmp_path / "d.zarr", SPEC)
    for k in range(5):
        s.append_episode(episode_data(k), {"k": k, "instruction": f"task {k}"})
    return EpisodeStore.open(tmp_path / "d.zarr")


def test_windows_pad_at_episode_edges(store: EpisodeStore) -> None:
    cfg = SequenceConfig(obs_horizon=3, action_horizon=8, extra_keys=("reward",))
    sampler = SequenceSampler.from_store(store, cfg)
    assert len(sampler) == store.num_steps
    starts = store.episode_starts
    for k in range(5):
        n, d = episode_length(k), episode_data(k)
        first, last = int(starts[k]), int(starts[k]) + n - 1
        b = sampler.get(np.array([first, first + 1, last]))  # anchors are global rows here (all episodes chosen)
        # first step: history repeats the first frame, flagged as padding
        np.testing.assert_array_equal(b["obs"]["state"][0], d["state"][[0, 0, 0]])
        np.testing.assert_array_equal(b["obs_is_pad"][0], [True, True, False])
        np.testing.assert_array_equal(b["obs"]["state"][1], d["state"][[0, 0, 1]])
        np.testing.assert_array_equal(b["action"][1], d["action"][1:9])
        assert not b["action_is_pad"][1].any()
        # last step: the chunk repeats the last action, flagged
        np.testing.assert_array_equal(b["action"][2], d["action"][[n - 1] * 8])
        np.testing.assert_array_equal(b["action_is_pad"][2], [False] + [True] * 7)
        np.testing.assert_array_equal(b["obs"]["image_front"][2], d["image_front"][n - 3 : n])
        assert list(b["episode"]) == [k] * 3 and list(b["t"]) == [0, 1, n - 1]
        np.testing.assert_array_equal(b["reward"], d["reward"][[0, 1, n - 1]])


def test_disk_path_matches_memory_path(store: EpisodeStore) -> None:
    mem = SequenceSampler.from_store(store, SequenceConfig(in_memory=True))
    disk = SequenceSampler.from_store(store, SequenceConfig(in_memory=False))
    idx = np.random.default_rng(0).integers(0, len(mem), 64)
    a, b = mem.get(idx), disk.get(idx)
    for key in a["obs"]:
        np.testing.assert_array_equal(a["obs"][key], b["obs"][key])
    np.testing.assert_array_equal(a["action"], b["action"])


def test_episode_subset_and_bad_keys(store: EpisodeStore) -> None:
    sub = SequenceSampler.from_store(store, episodes=[1, 3])
    assert len(sub) == episode_length(1) + episode_length(3)
    assert set(sub.sample(200, np.random.default_rng(0))["episode"]) == {1, 3}
    with pytest.raises(SpecMismatchError, match="obs_keys: \\['joint'\\] not in store"):
        SequenceSampler.from_store(store, SequenceConfig(obs_keys=("joint",)))
    with pytest.raises(ValueError, match="action_horizon: expected an integer >= 1, got 0"):
        SequenceConfig(action_horizon=0)
    with pytest.raises(IndexError, match="episodes: expected indices in \\[0, 5\\)"):
        SequenceSampler.from_store(store, episodes=[7])


def test_mixed_sampling_keeps_ratios_exactly(store: EpisodeStore) -> None:
    demos = SequenceSampler.from_store(store, episodes=[0, 1])
    online = SequenceSampler.from_store(store, episodes=[2, 3, 4])
    mixed = MixedSampler([demos, online], [0.5, 0.5])
    rng = np.random.default_rng(0)
    for batch in (256, 7):
        b = mixed.sample(batch, rng)
        counts = np.bincount(b["source"], minlength=2)
        assert counts.sum() == batch and abs(counts[0] - counts[1]) <= 1
        assert set(b["episode"][b["source"] == 0]) <= {0, 1} and set(b["episode"][b["source"] == 1]) <= {2, 3, 4}
        assert b["obs"]["state"].shape == (batch, 2, 6)
    assert list(MixedSampler([demos, online], [1, 4]).counts(10)) == [2, 8]
    assert list(MixedSampler([demos, online], [2, 1]).counts(10)) == [7, 3]  # 6.67 / 3.33: largest remainder
    with pytest.raises(SpecMismatchError, match="windows"):
        MixedSampler([demos, SequenceSampler.from_store(store, SequenceConfig(action_horizon=4))], [1, 1])
    with pytest.raises(ValueError, match="ratios"):
        MixedSampler([demos, online], [0, 0])


def test_torch_dataloader_with_workers(store: EpisodeStore) -> None:
    sampler = SequenceSampler.from_store(store, SequenceConfig(in_memory=False))
    loader = dataloader(sampler, batch_size=16, num_workers=2, seed=0)
    batches = [b for _, b in zip(range(6), loader)]
    assert all(isinstance(b["action"], torch.Tensor) and b["action"].shape == (16, 16, 2) for b in batches)
    assert batches[0]["obs"]["image_front"].dtype == torch.uint8
    again = next(iter(dataloader(sampler, batch_size=16, num_workers=0, seed=0)))
    torch.testing.assert_close(again["action"], batches[0]["action"])  # same seed, same first batch


def test_windows_carry_their_episode_instruction() -> None:
    """String observations live per episode; each window gets its own episode's, through every batch path."""
    ends = np.array([3, 7, 12])
    data = {"state": np.arange(12, dtype=np.float32)[:, None], "action": np.zeros((12, 2), np.float32)}
    text = {
        "instruction": ["put the red cube in the bin", "put the green cube in the bin", "put the blue cube in the bin"]
    }
    sampler = SequenceSampler(data, ends, ["state"], SequenceConfig(obs_horizon=2, action_horizon=4), text=text)
    batch = sampler.sample(64, np.random.default_rng(0))
    got = batch["obs"]["instruction"]
    assert got.shape == (64,) and got.dtype == object
    assert list(got) == [text["instruction"][e] for e in batch["episode"]]
    # the episode follows from the observed state itself (state = row index), not from the batch's bookkeeping
    assert all(
        t == text["instruction"][int(np.searchsorted(ends, s[-1, 0], side="right"))]
        for t, s in zip(got, batch["obs"]["state"])
    )
    subset = SequenceSampler(data, ends, ["state"], SequenceConfig(2, 4), episodes=[2], text=text)
    assert set(subset.sample(16, np.random.default_rng(1))["obs"]["instruction"]) == {text["instruction"][2]}
    loader_batch = next(iter(dataloader(sampler, batch_size=8)))
    assert len(loader_batch["obs"]["instruction"]) == 8

    plain = SequenceSampler(data, ends, ["state"], SequenceConfig(2, 4))
    with pytest.raises(SpecMismatchError, match=r"string observations \[\]"):
        MixedSampler([sampler, plain], [0.5, 0.5])
    mixed = MixedSampler([sampler, subset], [0.5, 0.5]).sample(10, np.random.default_rng(2))
    assert len(mixed["obs"]["instruction"]) == 10
    with pytest.raises(ValueError, match=r"text\['instruction'\]: expected one string per episode \(3\)"):
        SequenceSampler(data, ends, ["state"], text={"instruction": ["only one"]})


def test_success_tail_ends_each_episodes_anchors_after_its_first_success(tmp_path: Path) -> None:
    """Anchors stop `success_tail` steps after an episode's first success (every step where it never succeeds);
    the windows still read the actions after that point, as data, not padding."""
    store = EpisodeStore.create(tmp_path / "s.zarr", SPEC)
    first = {0: 10, 1: None, 2: 0, 3: 28}  # 3: its tail runs past its 31 steps  # episode -> step of its first success
    for k, hit in first.items():
        d = episode_data(k)
        d["success"] = np.arange(episode_length(k)) >= (hit if hit is not None else 10**6)
        store.append_episode(d, {"k": k})
    store = EpisodeStore.open(tmp_path / "s.zarr")
    tail = 3
    sampler = SequenceSampler.from_store(store, SequenceConfig(action_horizon=8, success_tail=tail))
    every = sampler.get(np.arange(len(sampler)))
    for k, hit in first.items():
        n = episode_length(k)
        kept = n if hit is None else min(n, hit + 1 + tail)
        np.testing.assert_array_equal(every["t"][every["episode"] == k], np.arange(kept))
    last = np.flatnonzero(every["episode"] == 0)[-1]  # anchor 13 of a 20-step episode: its chunk runs to the end
    np.testing.assert_array_equal(every["action"][last], episode_data(0)["action"][[13, 14, 15, 16, 17, 18, 19, 19]])
    np.testing.assert_array_equal(every["action_is_pad"][last], [False] * 7 + [True])
    assert len(SequenceSampler.from_store(store, SequenceConfig())) == store.num_steps
    with pytest.raises(ValueError, match=r"SequenceConfig.success_tail: expected None or an integer >= 0, got -1"):
        SequenceConfig(success_tail=-1)
