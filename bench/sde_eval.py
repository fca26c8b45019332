"""Which sampler did online PPO improve? A flow policy evaluated with its deterministic ODE (how it is saved,
evaluated and deployed) and with the Flow-SDE chain that `robotrl train online --method flow_sde` samples, trains
and scores in its rollouts, on the same held-out seeds.

Flow-SDE's chain has the ODE's marginals only for the velocity field BC learned; PPO moves the field to raise the
return of the SDE's samples, and nothing holds the ODE's samples to them. If PPO helped the chain it trains while
the deployed ODE falls, the two rows of a fine-tuned policy part and the BC start's do not.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sde_eval.py --policies runs/bc/policy runs/online/policy --episodes 100

One JSON line per policy and sampler; the first policy is the baseline the others' ratios are taken against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

from robotrl.flowrl.chain import FlowAgent, load_flow_policy
from robotrl.flowrl.online import OnlineConfig
from robotrl.training.evaluate import HELD_OUT_SEED, rollout


@dataclass
class SdeEvalConfig:
    policies: tuple[Path, ...]
    """flow checkpoints; the first is the baseline (usually the BC start of the others)"""
    episodes: int = 100
    num_envs: int = 25
    execute: int = 8
    sde_noise: float = 0.5
    """a of Flow-SDE's g(t)^2 = a^2 (1 - t) / t: what the online run trained with (OnlineConfig.sde_noise)"""
    seed: int = HELD_OUT_SEED
    threads: int = 1


def sde_actor(policy: Any, config: SdeEvalConfig) -> Any:
    """The policy's `act` with its chain sampled as Flow-SDE's rollouts sample it (clipped env-unit chunks)."""
    agent = FlowAgent(
        policy, OnlineConfig(policy=Path("unused"), method="flow_sde", sde_noise=config.sde_noise), policy.config.steps
    )

    def act(window: dict[str, Any]) -> np.ndarray:
        chain, _ = agent.sample_chain(policy.normalize_obs(window))
        return agent.chunk(chain)

    return act


def main(config: SdeEvalConfig) -> None:
    torch.set_num_threads(config.threads)
    baseline: dict[str, float] = {}
    for path in config.policies:
        policy = load_flow_policy(path, None, field="SdeEvalConfig.policies").eval()
        for sampler in ("ode", "sde"):
            act = sde_actor(policy, config) if sampler == "sde" else None
            stats, _ = rollout(policy, config.episodes, config.num_envs, config.seed, config.execute, act)
            rate = stats.success_rate
            baseline.setdefault(sampler, rate)
            lo, hi = stats.success_ci95()
            print(
                json.dumps(
                    {
                        "policy": str(path),
                        "sampler": sampler,
                        "episodes": config.episodes,
                        "success_rate": rate,
                        "ci95": [round(lo, 4), round(hi, 4)],
                        "vs_baseline": round(rate / max(baseline[sampler], 1e-9), 4),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main(tyro.cli(SdeEvalConfig))
