"""Batch-1 CPU latency of one `act` call (observation history in, action chunk out) for the generative policies,
in eager torch and as an ONNX export run by `robotrl.policies.runtime` (onnxruntime), side by side with the
10-step flow teacher that the one-step students are distilled from, in the same process.

Prints one JSON line per (policy, backend):
  policy         a label of VARIANTS below, or any registry name (its default config): the one-step students
                 `consistency` and `meanflow` are in the default list (a line with "skipped" when not present)
  registry       the policy class's registry name; sampler, steps, nfe: the sampler (ddpm, ddim, euler, heun), its
                 steps and the network evaluations per call
  backend        torch         `Policy.act` (normalize, sample, unnormalize, clip; torch.no_grad)
                 onnxruntime   `runtime.load(export).act`: input checks, numpy noise, the exported graph
                 torchscript   the same through torch.jit (not in the default list)
  p50_ms, p99_ms, mean_ms   over `calls` timed calls after `warmup` untimed ones (fewer calls when a variant
                 would exceed `max_seconds`; `calls` says how many)
  speedup_vs_flow10   flow10's p50 / this p50, same backend (> 1: faster than the teacher)
  speedup_vs_torch    this policy's eager torch p50 / this p50
  export_s       seconds to export (and verify) the file; load_avg_1m: the machine's load when the row ended
  torch_threads  torch.set_num_threads (and onnxruntime intra-op threads) for every backend

Untrained weights (latency does not depend on them), the state-only PushT spec (state 34, action 2, To=2, H=16)
and the default GenerativeConfig sizes (U-Net channels 64-128-256).

    .venv/bin/python bench/policies.py
    .venv/bin/python bench/policies.py --policies flow10 flow1 --backends torch onnxruntime torchscript
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

from robotrl.envs import make_task
from robotrl.policies import runtime
from robotrl.policies.base import Policy, register_all
from robotrl.policies.export import export
from robotrl.policies.timing import latency

#: label -> (registry name, config options): the samplers compared; anything else is taken as a registry name
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddpm100": ("diffusion", {"sampler": "ddpm", "train_steps": 100}),
    "ddim10": ("diffusion", {"sampler": "ddim", "train_steps": 100, "steps": 10}),
    "flow10": ("flow", {"steps": 10, "solver": "euler"}),
    "flow1": (
        "flow",
        {"steps": 1, "solver": "euler"},
    ),  # one call of the teacher net: the latency floor of a same-size student
    # the narrower student `robotrl policy distill --channels 32 64 128` makes: one call of a quarter-width U-Net
    "consistency_narrow": ("consistency", {"channels": (32, 64, 128)}),
}


@dataclass
class BenchConfig:
    policies: tuple[str, ...] = (
        "ddpm100",
        "ddim10",
        "flow10",
        "flow1",
        "consistency",
        "consistency_narrow",
        "meanflow",
    )
    """labels of VARIANTS or registry names (default config)"""
    backends: tuple[str, ...] = ("torch", "onnxruntime")
    """any of torch, onnxruntime, torchscript"""
    baseline: str = "flow10"
    """the teacher every row is compared with (measured first, added if missing)"""
    calls: int = 200
    warmup: int = 10
    max_seconds: float = 30.0
    """stop timing a (policy, backend) after this long"""
    threads: int = 1
    """torch and onnxruntime intra-op threads (1: steady batch-1 latency on a shared 2-core box)"""
    seed: int = 0


def build(label: str, seed: int) -> Policy | None:
    name, options = VARIANTS.get(label, (label, {}))
    policies = register_all()
    if name not in policies:  # a policy module not (yet) in base.POLICY_MODULES, named as its registry name
        try:
            importlib.import_module(f"robotrl.policies.{name}")
        except ModuleNotFoundError:
            return None
    if name not in policies:
        return None
    cls = policies[name]
    known = {f.name for f in fields(cls.config_cls)}
    torch.manual_seed(seed)
    return cls(make_task("PushT").spec(), cls.config_cls(**{k: v for k, v in options.items() if k in known})).eval()


def sampler(policy: Policy) -> tuple[str | None, int | None]:
    """(sampler or solver name, its steps per call) as the policy runs them."""
    cfg = policy.config
    if getattr(cfg, "sampler", None) == "ddpm":
        return "ddpm", int(cfg.train_steps)
    name = getattr(cfg, "sampler", None) or getattr(cfg, "solver", None)
    return name, getattr(cfg, "steps", None)


def network_evaluations(policy: Policy) -> int:
    cfg = policy.config
    if getattr(cfg, "sampler", None) == "ddpm":
        return int(cfg.train_steps)
    steps = int(getattr(cfg, "steps", 1))
    return 2 * steps if getattr(cfg, "solver", None) == "heun" else steps


def main(config: BenchConfig) -> list[dict[str, Any]]:
    torch.set_num_threads(config.threads)
    labels = [config.baseline, *[p for p in config.policies if p != config.baseline]]
    rng = np.random.default_rng(config.seed)
    baseline: dict[str, float] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label in labels:
            policy = build(label, config.seed)
            if policy is None:
                row: dict[str, Any] = {
                    "policy": label,
                    "skipped": f"not a variant {sorted(VARIANTS)} nor a registered policy",
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
                continue
            obs = {
                k: rng.uniform(-1, 1, (1, policy.config.obs_horizon, *policy.spec.observations[k].shape)).astype(
                    np.float32
                )
                for k in policy.obs_keys
            }
            torch_p50 = None
            for backend in config.backends:
                export_s = None
                if backend == "torch":
                    fn: Callable[[], Any] = lambda policy=policy, obs=obs: policy.act(obs)  # noqa: E731
                else:
                    fmt = "onnx" if backend == "onnxruntime" else "torchscript"
                    start = time.perf_counter()
                    out = export(policy, Path(tmp) / f"{label}-{fmt}", fmt)
                    export_s = round(time.perf_counter() - start, 1)
                    rt = runtime.load(out, threads=config.threads, seed=config.seed)
                    fn = lambda rt=rt, obs=obs: rt.act(obs)  # noqa: E731
                ms, calls = latency(fn, config.calls, config.warmup, config.max_seconds)
                p50 = float(np.percentile(ms, 50))
                if label == config.baseline:
                    baseline[backend] = p50
                if backend == "torch":
                    torch_p50 = p50
                row = {
                    "policy": label,
                    "registry": policy.name,
                    "sampler": sampler(policy)[0],
                    "steps": sampler(policy)[1],
                    "nfe": network_evaluations(policy),
                    "backend": backend,
                    "batch": 1,
                    "p50_ms": round(p50, 3),
                    "p99_ms": round(float(np.percentile(ms, 99)), 3),
                    "mean_ms": round(float(ms.mean()), 3),
                    "calls": calls,
                    "warmup": config.warmup,
                    "speedup_vs_" + config.baseline: round(baseline[backend] / p50, 2) if backend in baseline else None,
                    "speedup_vs_torch": round(torch_p50 / p50, 2) if torch_p50 is not None else None,
                    "export_s": export_s,
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                    "torch_threads": torch.get_num_threads(),
                    "channels": list(getattr(policy.config, "channels", ())),
                    "horizon": [policy.config.obs_horizon, policy.config.action_horizon],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    main(tyro.cli(BenchConfig))
