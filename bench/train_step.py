"""A BC training step of the pipeline's flow policy with torch's default AdamW against the fused one the training
loops use, in the same process, alternated so that a busy core slows both alike.

Prints one JSON line per (threads, optimizer):
  optimizer   default   torch.optim.AdamW as constructed without options (the baseline; per-tensor kernels on a CPU)
              fused     AdamW(fused=True): one kernel over every weight
  ms_per_step the median over `repeats` blocks of `steps` steps (sample, loss, backward, clip, AdamW, EMA): what a
              BC step costs `robotrl train bc` and the pipeline's BC stage
  vs_default  default's ms_per_step / this one's

    .venv/bin/python bench/train_step.py                      # the default preset's U-Net (32 64 128), batch 64
    .venv/bin/python bench/train_step.py --channels 64 128 256 --batch-size 256
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tyro

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.policies.flow import FlowConfig
from robotrl.stages.bc import BCConfig, make_policy
from robotrl.training.loop import EMA, cosine_lr, optimizer_step


@dataclass
class BenchConfig:
    task: str = "PushT"
    channels: tuple[int, ...] = (32, 64, 128)
    batch_size: int = 64
    threads: tuple[int, ...] = (1, 2)
    steps: int = 30
    """steps per timed block"""
    repeats: int = 5
    episodes: int = 8
    """demonstration episodes recorded for the windows"""


def bc_step(store: EpisodeStore, config: BenchConfig, fused: bool) -> Callable[[], None]:
    """One step of robotrl.stages.bc's loop, with the optimizer under test."""
    bc = BCConfig(store=store.path, policy=FlowConfig(channels=config.channels), batch_size=config.batch_size, lr=1e-3)
    sampler = SequenceSampler.from_store(store, SequenceConfig(bc.policy.obs_horizon, bc.policy.action_horizon, None))
    policy = make_policy(bc, store)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=bc.lr, weight_decay=bc.weight_decay, **({"fused": True} if fused else {})
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr(s, 100_000, bc.warmup))
    ema, rng = EMA(policy, bc.ema), np.random.default_rng(0)

    def step() -> None:
        loss = policy.compute_loss(sampler.sample(config.batch_size, rng))
        optimizer_step(loss, policy, optimizer, schedule, "bench")
        ema.update(policy)

    return step


def main(config: BenchConfig) -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = record_expert(
            Path(tmp) / "demos.zarr",
            config.task,
            config.episodes,
            num_envs=min(8, config.episodes),
            noise=0.5,
            progress=False,
        )
        for threads in config.threads:
            torch.set_num_threads(threads)
            steps = {"default": bc_step(store, config, fused=False), "fused": bc_step(store, config, fused=True)}
            times: dict[str, list[float]] = {name: [] for name in steps}
            for step in steps.values():
                step()  # warm-up: first-call allocations
            for _ in range(config.repeats):
                for name, step in steps.items():
                    began = time.perf_counter()
                    for _ in range(config.steps):
                        step()
                    times[name].append((time.perf_counter() - began) / config.steps * 1e3)
            base = statistics.median(times["default"])
            for name, block in times.items():
                ms = statistics.median(block)
                print(
                    json.dumps(
                        {
                            "task": config.task,
                            "channels": list(config.channels),
                            "batch_size": config.batch_size,
                            "threads": threads,
                            "optimizer": name,
                            "ms_per_step": round(ms, 2),
                            "vs_default": round(base / ms, 3),
                        }
                    ),
                    flush=True,
                )
        store.close()


if __name__ == "__main__":
    main(tyro.cli(BenchConfig))
