"""Training-window throughput of the episode store's samplers against a naive per-sample zarr read, side by
side with the rate a BC training step consumes samples, on the same machine in the same process.

Prints one JSON line per (data, method):
  data              'state' (PushT demos, state 34 + action 2) or 'image96' (two 96x96 RGB cameras + state)
  method            naive         a Dataset.__getitem__ that slices each key's window straight from zarr, one
                                  sample at a time (the baseline)
                    memory        SequenceSampler, every key in RAM, one vectorized gather per batch
                    disk          SequenceSampler through ChunkCache (each needed zarr chunk decoded once)
                    loader_memory the torch DataLoader (in the main process) over the memory path: tensors
                    loader_disk   the torch DataLoader (2 workers) over the disk path: tensors
                    train_step    a BC training step (forward, backward, Adam) on batches of this shape: the
                                  rate the sampler must keep ahead of
  samples_per_s     windows (To=2 observations, H=16 actions) per second
  vs_naive          samples_per_s / naive's
  vs_train_step     samples_per_s / train_step's (>= 1: the sampler is not the bottleneck)

    .venv/bin/python bench/datasets.py               # both datasets
    .venv/bin/python bench/datasets.py --data state
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro
from torch import nn

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler, dataloader


@dataclass
class BenchConfig:
    data: tuple[str, ...] = ("state", "image96")
    batch_size: int = 64
    seconds: float = 3.0
    """timed seconds per method (after warm-up)"""
    episodes: int = 24
    """demonstration episodes recorded for each dataset"""
    workers: int = 2
    seed: int = 0


def timed(fn: Callable[[], Any], seconds: float, warmup: int = 2) -> float:
    """Calls per second of `fn` over about `seconds`."""
    for _ in range(warmup):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def endless(make: Callable[[], Any]) -> Callable[[], Any]:
    """next() of a DataLoader that starts a new epoch when one ends."""
    it = iter(make())

    def step() -> Any:
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(make())
            return next(it)

    return step


def naive_sample(store: EpisodeStore, keys: list[str], to: int, h: int, rng: np.random.Generator) -> dict[str, Any]:
    """What a first Dataset.__getitem__ does: pick (episode, t), slice each window from zarr, pad by hand."""
    i = int(rng.integers(store.num_episodes))
    start, end = int(store.episode_starts[i]), int(store.episode_ends[i])
    t = int(rng.integers(start, end))
    out = {}
    for k in keys:
        lo = max(start, t - to + 1)
        x = np.asarray(store.array(k)[lo : t + 1])
        out[k] = np.concatenate([np.repeat(x[:1], to - len(x), 0), x])
    a = np.asarray(store.array("action")[t : min(end, t + h)])
    out["action"] = np.concatenate([a, np.repeat(a[-1:], h - len(a), 0)])
    return out


class ImageEncoder(nn.Module):
    """A ResNet-style encoder with GroupNorm and a spatial-softmax-like pooling, sized like diffusion policy's
    per-camera encoder, standing in for the BC policy's training step until the policy library lands."""

    def __init__(self, out: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        chans = [3, 32, 64, 128, 256]
        for a, b in itertools.pairwise(chans):
            layers += [
                nn.Conv2d(a, b, 3, stride=2, padding=1),
                nn.GroupNorm(8, b),
                nn.ReLU(),
                nn.Conv2d(b, b, 3, padding=1),
                nn.GroupNorm(8, b),
                nn.ReLU(),
            ]
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train_step_rate(batch: dict[str, Any], seconds: float) -> float:
    """Samples per second a BC step (encoders + MLP head regressing the action chunk) consumes."""
    obs = {k: torch.as_tensor(v) for k, v in batch["obs"].items()}
    action = torch.as_tensor(batch["action"])
    b = action.shape[0]
    images = [k for k, v in obs.items() if v.ndim == 5]
    encoders = nn.ModuleDict({k: ImageEncoder() for k in images})
    feat = sum(64 * obs[k].shape[1] for k in images) + sum(v[0].numel() for k, v in obs.items() if k not in images)
    head = nn.Sequential(
        nn.Linear(feat, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, action[0].numel())
    )
    params = [*encoders.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-4)

    def step() -> None:
        parts = []
        for k, v in obs.items():
            if k in images:
                x = v.flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
                parts.append(encoders[k](x).reshape(b, -1))
            else:
                parts.append(v.reshape(b, -1))
        loss = ((head(torch.cat(parts, -1)) - action.reshape(b, -1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return timed(step, seconds) * b


def make_data(kind: str, root: Path, episodes: int, seed: int) -> EpisodeStore:
    if kind == "state":
        return record_expert(
            root / "state.zarr", "PushT", episodes, num_envs=8, seed=seed, episode_steps=300, progress=False
        )
    if kind == "image96":
        return record_expert(
            root / "image96.zarr", "PickPlace", episodes, num_envs=8, seed=seed, image_size=96, progress=False
        )
    raise ValueError(f"data: expected 'state' or 'image96', got {kind!r}")


def bench(kind: str, config: BenchConfig, root: Path) -> list[dict[str, Any]]:
    store = make_data(kind, root, config.episodes, config.seed)
    store = EpisodeStore.open(store.path)
    cfg = SequenceConfig(obs_horizon=2, action_horizon=16)
    rng = np.random.default_rng(config.seed)
    b, s = config.batch_size, config.seconds
    keys = [k for k, v in store.spec.observations.items() if v.dtype != "str"]
    memory = SequenceSampler.from_store(store, cfg)
    disk = SequenceSampler.from_store(store, SequenceConfig(obs_horizon=2, action_horizon=16, in_memory=False))
    memory_loader = endless(lambda: dataloader(memory, b, num_workers=0, seed=config.seed))
    disk_loader = endless(lambda: dataloader(disk, b, num_workers=config.workers, seed=config.seed))

    rates = {
        "naive": timed(lambda: [naive_sample(store, keys, 2, 16, rng) for _ in range(b)], s) * b,
        "memory": timed(lambda: memory.sample(b, rng), s) * b,
        "disk": timed(lambda: disk.sample(b, rng), s) * b,
        "loader_memory": timed(memory_loader, s) * b,
        "loader_disk": timed(disk_loader, s) * b,
        "train_step": train_step_rate(memory.sample(b, rng), s),
    }
    shape = {k: list(v.shape) for k, v in memory.sample(1, rng)["obs"].items()}
    return [
        {
            "data": kind,
            "method": m,
            "samples_per_s": round(r, 1),
            "vs_naive": round(r / rates["naive"], 2),
            "vs_train_step": round(r / rates["train_step"], 2),
            "batch": b,
            "steps": store.num_steps,
            "obs_shapes": shape,
            "torch_threads": torch.get_num_threads(),
        }
        for m, r in rates.items()
    ]


def main(config: BenchConfig) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in config.data:
            for row in bench(kind, config, Path(tmp)):
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    main(tyro.cli(BenchConfig))
