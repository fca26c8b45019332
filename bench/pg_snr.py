"""Is there a direction in online PPO's policy update? The signal-to-noise of the policy gradient of
`robotrl train online` (robotrl/flowrl/online.py) for a flow checkpoint, per `--method`.

One rollout of num_envs x rollout_steps env steps is taken after `warmup` value-only iterations (as a run's
critic warm-up does); its decisions are split into `parts` disjoint groups and each group's policy gradient is
computed (the clipped surrogate's gradient at ratio 1: -mean(normalized advantage * grad log pi)). Independent
groups share only the true gradient, so their mean pairwise cosine c estimates |g|^2 / (|g|^2 + noise^2 / n) for
n decisions a group: one group's SNR^2 is c / (1 - c), and a gradient that is mostly signal (SNR^2 = 1) needs
about n (1 - c) / c decisions. The baseline, in the same process on the same chains: the advantages shuffled
across the decisions (noise with the same marginal, no signal); its cosine is what 0 looks like at this size.
Per chain transition (the chain methods), the gradient's size and cosine show where the noise comes from.

Prints one JSON line per method:
  explained_variance          of the returns by the warmed-up value network
  cosine, cosine_shuffled     mean pairwise cosine of the groups' gradients, with real and shuffled advantages
  decisions_for_snr1          decisions an update needs for SNR^2 = 1 (null where cosine <= cosine_shuffled)
  per_step                    [(grad norm, cosine), ...] per chain transition

    .venv/bin/python bench/pg_snr.py --policy runs/bc-flow/policy --methods flow_sde ode_noise
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import tyro

from robotrl.flowrl.chain import METHODS
from robotrl.flowrl.online import OnlineConfig, collect, explained_variance, ppo_update, start_online


@dataclass
class PGSNRConfig:
    policy: Path
    """the flow checkpoint whose update is measured (robotrl train bc policy:flow)"""
    methods: tuple[str, ...] = ("flow_sde", "ode_noise")
    num_envs: int = 64
    rollout_steps: int = 160
    execute: int = 8
    warmup: int = 6
    """value-only iterations before the measured rollout"""
    parts: int = 8
    gamma: float = 0.99
    gae_lambda: float = 0.95
    seed: int = 0


def mean_cosine(grads: torch.Tensor) -> float:
    """Mean cosine over distinct pairs of rows of (parts, P)."""
    unit = grads / grads.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cos = unit @ unit.T
    n = len(grads)
    return float((cos.sum() - cos.diagonal().sum()) / (n * (n - 1)))


def measure(config: PGSNRConfig, method: str, out: Path) -> dict[str, Any]:
    online = OnlineConfig(
        policy=config.policy,
        method=method,
        num_envs=config.num_envs,  # type: ignore[arg-type]
        rollout_steps=config.rollout_steps,
        execute=config.execute,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
        seed=config.seed,
        run_dir=out / method,
        progress=False,
    )
    run = start_online(online, f"pg-snr-{method}")
    agent, env, rng = run.agent, run.env, run.rng
    run.windows.start(env.reset(seed=config.seed)[0])
    try:
        for it in range(config.warmup + 1):
            data = collect(agent, env, run.windows, config.rollout_steps, online.execute, online, run.tally)
            if it < config.warmup:
                ppo_update(agent, data, online, False, None, run.optimizer, run.constant, rng, "pg_snr warm-up")
    finally:
        env.close()
    ret = data["ret"].numpy()
    explained = explained_variance(data)
    params = [p for p in agent.policy.parameters() if p.requires_grad]
    count = len(ret)
    order = torch.from_numpy(rng.permutation(count))
    advantage = (data["adv"] - data["adv"].mean()) / data["adv"].std()
    shuffled = advantage[torch.from_numpy(rng.permutation(count))]

    def group_grads(idx: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        """(transitions, P): each stochastic transition's share of the group's gradient."""
        logp, _ = agent.chain_log_prob({k: x[idx] for k, x in data["obs"].items()}, data["chain"][idx])
        out = []
        for k in range(logp.shape[1]):
            grads = torch.autograd.grad(-(adv[idx] * logp[:, k]).mean(), params, retain_graph=True)
            out.append(torch.cat([g.flatten() for g in grads]))
        return torch.stack(out)

    groups = [order[i :: config.parts] for i in range(config.parts)]
    real = torch.stack([group_grads(g, advantage) for g in groups])  # (parts, transitions, P)
    noise = torch.stack([group_grads(g, shuffled) for g in groups])
    cosine, baseline = mean_cosine(real.sum(1)), mean_cosine(noise.sum(1))
    size = count // config.parts
    return {
        "bench": "pg_snr",
        "task": run.policy.spec.task,
        "method": method,
        "decisions": count,
        "parts": config.parts,
        "gamma": config.gamma,
        "gae_lambda": config.gae_lambda,
        "explained_variance": round(explained, 3),
        "cosine": round(cosine, 4),
        "cosine_shuffled": round(baseline, 4),
        "decisions_for_snr1": round(size * (1 - cosine) / cosine) if cosine > max(baseline, 0.0) else None,
        "per_step": [
            (round(float(real[:, k].norm(dim=-1).mean()), 3), round(mean_cosine(real[:, k]), 4))
            for k in range(real.shape[1])
        ],
    }


def main(config: PGSNRConfig) -> list[dict[str, Any]]:
    unknown = [m for m in config.methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"bench/pg_snr.py: --methods: expected some of {METHODS}; got {unknown}")
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in config.methods:
            rows.append(measure(config, method, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main(tyro.cli(PGSNRConfig))
