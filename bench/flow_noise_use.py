"""How a flow policy uses its initial noise, and how much one decision's noise matters: the questions behind
steering the noise with RL (`robotrl train online --method latent`) on a task.

For a flow checkpoint, on the held-out seeds, the same process and the same episodes:

  sampled          success with x_0 ~ N(0, I), as the policy is evaluated and deployed (the baseline row)
  zero             success with x_0 = 0: the ODE from the noise's mean (for a policy whose modes the noise picks,
                   the average of its chunks)
  scale            for each of `scales`, success with x_0 ~ N(0, scale^2 I): a sampling temperature between the two
  near_misses      for a task whose state has a `coverage` field (PushT), the peak coverage of every failed
                   episode of the sampled row: how close the failures came
  x0_signal        from `states` mid-episode states (reached by the policy itself), `candidates` draws of the
                   first decision's x_0, each followed `repeats` times by the policy for `horizon` env steps:
                   the variance of the discounted return across candidates beyond what the repeats explain
                   (the part a choice of x_0 can move), against the variance within a candidate (what the later
                   decisions add). Their ratio is one decision's signal-to-noise for a learner of x_0.

Prints one JSON line per row.

    .venv/bin/python bench/flow_noise_use.py --policy runs/bc-flow/policy --episodes 100
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

from robotrl.flowrl.chain import Windows, load_flow_policy
from robotrl.training.evaluate import HELD_OUT_SEED, evaluate_policy, make_eval_env


@dataclass
class NoiseUseConfig:
    policy: Path
    """a flow checkpoint (robotrl train bc policy:flow)"""
    episodes: int = 100
    num_envs: int = 25
    execute: int = 8
    states: int = 6
    candidates: int = 8
    repeats: int = 4
    horizon: int = 160
    gamma: float = 0.99
    seed: int = 0
    scales: tuple[float, ...] = ()
    """noise scales (temperatures) to evaluate beside 1 (sampled) and 0 (zero)"""


def chunks(policy: Any, frames: dict[str, np.ndarray], x0: torch.Tensor | None = None) -> np.ndarray:
    """The policy's clipped action chunks (env units) for observation windows, from `x0` or fresh noise."""
    with torch.no_grad():
        obs = policy.normalize_obs(frames)
        cond = policy.encoder(obs)
        if x0 is None:
            x0 = policy.noise(cond.shape[0], cond.device)
        x = policy.integrate(x0, cond, policy.config.steps)[:, : policy.action_horizon]
        chunk = policy.normalizer.unnormalize("action", x)
    low, high = policy.spec.action.low_array(), policy.spec.action.high_array()
    return np.clip(chunk.numpy(), low, high)


def success_rows(policy: Any, config: NoiseUseConfig) -> list[dict[str, Any]]:
    sampled = evaluate_policy(policy, config.episodes, config.num_envs, execute=config.execute)
    rows = [{"row": "sampled", "success": sampled.success_rate, "episodes": len(sampled.success)}]
    for scale in (0.0, *config.scales):
        scaled = load_flow_policy(config.policy, None)
        scaled.noise = lambda batch, device, s=scale, p=scaled: (
            s
            * torch.randn(  # type: ignore[method-assign]
                batch, p.horizon, p.action_dim, device=device
            )
        )
        stats = evaluate_policy(scaled, config.episodes, config.num_envs, execute=config.execute)
        rows.append(
            {
                "row": "zero" if scale == 0.0 else "scale",
                "scale": scale,
                "success": stats.success_rate,
                "episodes": len(stats.success),
                "vs_sampled": stats.success_rate - sampled.success_rate,
            }
        )
    return rows


def near_misses(policy: Any, config: NoiseUseConfig) -> dict[str, Any] | None:
    """Peak coverage of the failed episodes (one wave of `episodes` envs, sampled noise), or None without one."""
    slices = policy.spec.observations["state"].field_slices() if "state" in policy.spec.observations else {}
    if "coverage" not in slices:
        return None
    n = config.episodes
    env = make_eval_env(policy.spec, tuple(policy.obs_keys), n, HELD_OUT_SEED, autoreset=False)
    windows = Windows(tuple(policy.obs_keys), policy.obs_horizon)
    obs, _ = env.reset(seed=HELD_OUT_SEED)
    windows.start(obs)
    peak, success, alive = np.zeros(n), np.zeros(n, bool), np.ones(n, bool)
    torch.manual_seed(config.seed)
    try:
        for _ in range(policy.spec.episode_steps // config.execute):
            chunk = chunks(policy, windows.frames)
            for k in range(config.execute):
                obs, _, terminated, truncated, info = env.step(chunk[:, k])
                peak = np.where(alive, np.maximum(peak, obs["state"][:, slices["coverage"]][:, 0]), peak)
                success |= info["success"] & alive
                alive &= ~(terminated | truncated)
                windows.advance(obs, np.zeros(n, bool))
    finally:
        env.close()
    failed = np.sort(peak[~success])
    return {
        "row": "near_misses",
        "success": float(success.mean()),
        "failed": len(failed),
        "failed_peak_coverage": [round(float(x), 3) for x in failed],
        "failed_peak_coverage_median": float(np.median(failed)) if len(failed) else None,
    }


def x0_signal(policy: Any, config: NoiseUseConfig) -> dict[str, Any]:
    """One decision's x_0 against the rest (module docstring); every env starts from the state env 0 reached."""
    m, r = config.candidates, config.repeats
    n = m * r
    env = make_eval_env(policy.spec, tuple(policy.obs_keys), n, config.seed)
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    rows = []
    try:
        for state in range(config.states):
            obs, _ = env.reset(seed=config.seed + state)
            windows = Windows(tuple(policy.obs_keys), policy.obs_horizon)
            windows.start(obs)
            lead = int(rng.integers(0, policy.spec.episode_steps // (2 * config.execute)))
            for _ in range(lead):  # every env follows env 0's chunks, then takes env 0's state exactly
                chunk = chunks(policy, windows.frames)
                for k in range(config.execute):
                    obs, *_ = env.step(np.repeat(chunk[:1, k], n, axis=0))
                    windows.advance(obs, np.zeros(n, bool))
            env.set_state({k: np.repeat(v[:1], n, axis=0) for k, v in env.get_state().items()})
            windows.frames = {k: np.repeat(v[:1], n, axis=0) for k, v in windows.frames.items()}
            first = torch.randn(m, policy.horizon, policy.action_dim).repeat_interleave(r, 0)
            ret, disc, alive = np.zeros(n), 1.0, np.ones(n, bool)
            for d in range(config.horizon // config.execute):
                chunk = chunks(policy, windows.frames, first if d == 0 else None)
                for k in range(config.execute):
                    obs, reward, terminated, truncated, _ = env.step(chunk[:, k])
                    ret += disc * reward * alive
                    disc *= config.gamma
                    alive &= ~(terminated | truncated)
                    windows.advance(obs, np.zeros(n, bool))
            g = ret.reshape(m, r)
            within = float(g.var(1, ddof=1).mean())
            across = float(g.mean(1).var(ddof=1)) - within / r
            rows.append(
                {
                    "step": lead * config.execute,
                    "signal_var": round(across, 3),
                    "noise_var": round(within, 3),
                    "ratio": round(across / max(within, 1e-12), 3),
                }
            )
    finally:
        env.close()
    return {
        "row": "x0_signal",
        "candidates": m,
        "repeats": r,
        "horizon": config.horizon,
        "gamma": config.gamma,
        "states": rows,
        "median_ratio": float(np.median([s["ratio"] for s in rows])),
    }


def main(config: NoiseUseConfig) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    policy = load_flow_policy(config.policy, None)
    rows = success_rows(policy, config)
    miss = near_misses(policy, config)
    rows += [miss] if miss is not None else []
    rows.append(x0_signal(policy, config))
    for row in rows:
        print(
            json.dumps({"bench": "flow_noise_use", "task": policy.spec.task, "policy": str(config.policy), **row}),
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main(tyro.cli(NoiseUseConfig))
