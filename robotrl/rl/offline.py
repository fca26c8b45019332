"""What the offline actor-critic runs (IQL, Cal-QL) share: their config's common fields, the store's transitions
checked against the observation keys, evaluation of the learned actor, and the update loop with its logging,
evaluation and train states."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from robotrl.core.spec import Spec
from robotrl.datasets import EpisodeStore
from robotrl.envs.rollouts import EpisodeStats
from robotrl.policies.gaussian import GaussianConfig, actor_policy
from robotrl.rl.replay import DemoTransitions, split_obs_keys
from robotrl.training.evaluate import evaluate_state_actor
from robotrl.training.loop import PolicyRunOptions, RLResult, RunLog, TrainClock, finish_run, save_run_state, start_run


@dataclass
class OfflineOptions(PolicyRunOptions):
    """What an offline actor-critic run (IQL, Cal-QL) reads and how it updates: its config's shared fields."""

    # a constant learning rate: more steps continue the run as it was
    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = (*PolicyRunOptions.RESUME_MAY_CHANGE, "steps")

    store: Path = Path("data/pusht.zarr")
    """episodes to learn from (demonstrations, earlier runs)"""
    obs_keys: tuple[str, ...] = ("state",)
    steps: int = 20_000
    """gradient updates"""
    batch_size: int = 256
    gamma: float = 0.95
    tau: float = 0.005
    lr: float = 3e-4
    critics: int = 2
    hidden: tuple[int, ...] = (256, 256)
    reward_type: Literal["dense", "sparse"] = "dense"
    """the reward the store was recorded with (evaluation uses it too)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        for field in ("steps", "batch_size", "critics"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        if not self.lr > 0:
            raise ValueError(f"{name}.lr: expected > 0, got {self.lr}")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"{name}.gamma: expected a value in (0, 1), got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"{name}.tau: expected a value in (0, 1], got {self.tau}")


def offline_start(
    config: OfflineOptions, name: str, mc_gamma: float | None = None
) -> tuple[Spec, DemoTransitions, Path, Path, np.random.Generator]:
    """The store's spec and transitions (with returns-to-go at `mc_gamma`), after checking the observation keys,
    and the run started: (spec, data, run_dir, train state path, the run's generator)."""
    with EpisodeStore.open(config.store) as store:
        spec = store.spec
    split_obs_keys(spec, config.obs_keys, f"{type(config).__name__}.obs_keys", images=False)
    run_dir, state_path, rng = start_run(config, name, spec.task)
    return spec, DemoTransitions(config.store, spec, config.obs_keys, mc_gamma=mc_gamma), run_dir, state_path, rng


def offline_evaluate(actor: Any, spec: Spec, config: OfflineOptions) -> EpisodeStats:
    """Held-out success of the learned actor in the task the store was recorded in."""
    return evaluate_state_actor(
        actor,
        spec.task,
        config.obs_keys,
        config.eval_episodes,
        config.eval_envs,
        action_mode=spec.action_mode,
        reward_type=config.reward_type,
        episode_steps=spec.episode_steps,
    )


def offline_loop(
    config: OfflineOptions,
    name: str,
    agent: nn.Module,
    spec: Spec,
    opt: Mapping[str, torch.optim.Optimizer],
    rng: np.random.Generator,
    run_dir: Path,
    state_path: Path,
    sample: Any,
    update: Any,
    evaluate: Any,
    start: int,
) -> RLResult:
    """The loop of an offline run from step `start`: `update(batch, where)` on `sample(rng)`, log every
    `log_every`, evaluate every `eval_every` (not counted as training time), train state and actor weights every
    `checkpoint_every`, a final held-out evaluation; returns the run's result."""
    log = RunLog(run_dir)
    bar = tqdm(
        total=config.steps, initial=start, desc=name, unit="step", disable=not config.progress, dynamic_ncols=True
    )
    clock = TrainClock()
    try:
        for step in range(start, config.steps):
            stats = update(sample(rng), f"{name} step {step} (last train state: {state_path})")
            done = step + 1
            bar.update(1)
            if done % config.log_every == 0:
                log.log(done, **stats)
            clock.evaluate_every(config, log, evaluate, done, step, last=done == config.steps)
            if done % config.checkpoint_every == 0 or done == config.steps:
                save_run_state(state_path, done, agent, opt, rng)
                actor = GaussianConfig(obs_keys=tuple(config.obs_keys), hidden=tuple(config.hidden))
                actor_policy(spec, actor, {"actor": agent.get_submodule("actor")}).save(run_dir / "policy")
    finally:
        bar.close()
    seconds = clock.trained()
    return finish_run(config, log, evaluate, run_dir / "policy", config.steps, seconds, run_dir)
