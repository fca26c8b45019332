"""Behaviour cloning on a GPU to a wall-clock budget: how far a longer schedule (and more demonstrations) take
PushT's flow policy, which this machine's one core trains for hours (bench/RESULTS.md, "BC on a GPU: the samples
seen, not the demos").

One process per store: a short probe of the training step on the device (`probe_steps`, after `warmup_steps`)
sets the step count that fits `seconds` (rounded down to thousands, at most `max_steps`), then `robotrl train bc
--device cuda --steps N` runs as a user would run it, and its EMA policy is evaluated on `episodes` held-out seeds
(the policy on the GPU, the envs in CPU threads). Processes started together on one GPU probe it together, so
each budget counts the sharing. Prints one JSON line; `bench/device_bc.sh` runs the device call.

    python bench/gpu_bc.py --store demos.zarr --run-dir runs/gpu-bc --seconds 270
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import tyro

from robotrl.datasets import EpisodeStore
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.policies import load
from robotrl.stages.bc import BCConfig, make_policy, train
from robotrl.training.evaluate import evaluate_policy


@dataclass
class GpuBCConfig:
    store: Path
    run_dir: Path
    seconds: float = 270.0
    """training wall-clock budget; the step count is fitted to it"""
    max_steps: int = 100_000
    batch_size: int = 256
    lr: float = 1e-4
    device: str = "cuda"
    episodes: int = 500
    num_envs: int = 250
    warmup_steps: int = 30
    probe_steps: int = 200


def steps_per_second(config: BCConfig, warmup_steps: int, probe_steps: int) -> float:
    """The training step's rate on the device: the loss, backward and AdamW step of the run's own policy and
    batch size (its EMA update, about a tenth more, is left out; the budget's rounding absorbs it)."""
    store = EpisodeStore.open(config.store)
    sampler = SequenceSampler.from_store(
        store, SequenceConfig(config.policy.obs_horizon, config.policy.action_horizon, None)
    )
    policy = make_policy(config, store).to(config.device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr)
    rng = np.random.default_rng(0)
    began = 0.0
    for i in range(warmup_steps + probe_steps):
        if i == warmup_steps:
            torch.cuda.synchronize() if config.device.startswith("cuda") else None
            began = time.perf_counter()
        loss = policy.compute_loss(sampler.sample(config.batch_size, rng))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize() if config.device.startswith("cuda") else None
    return probe_steps / (time.perf_counter() - began)


def main(cfg: GpuBCConfig) -> None:
    base = BCConfig(
        store=cfg.store,
        policy="flow",
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        success_only=True,
        eval_episodes=0,
        checkpoint_every=5000,
        run_dir=cfg.run_dir,
        threads=1,
        device=cfg.device,
        progress=False,
    )
    rate = steps_per_second(base, cfg.warmup_steps, cfg.probe_steps)
    steps = max(1000, min(cfg.max_steps, int(rate * cfg.seconds) // 1000 * 1000))
    result = train(replace(base, steps=steps))
    began = time.perf_counter()
    stats = evaluate_policy(load(result.checkpoint, device=cfg.device), cfg.episodes, cfg.num_envs)
    lo, hi = stats.success_ci95()
    episodes = len(EpisodeStore.open(cfg.store).episodes)
    print(
        json.dumps(
            {
                "store": str(cfg.store),
                "demos": episodes,
                "device": torch.cuda.get_device_name() if cfg.device.startswith("cuda") else "cpu",
                "probe_steps_per_s": round(rate, 1),
                "steps": steps,
                "batch_size": cfg.batch_size,
                "samples_seen": steps * cfg.batch_size,
                "train_seconds": round(result.train_seconds, 1),
                "final_loss": result.final_loss,
                "episodes": len(stats.success),
                "success_rate": stats.success_rate,
                "ci95": [lo, hi],
                "eval_seconds": round(time.perf_counter() - began, 1),
                "policy": str(result.checkpoint),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(tyro.cli(GpuBCConfig))
