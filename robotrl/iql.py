"""Implicit Q-learning (Kostrikov et al. 2022): an offline actor-critic learned from an episode store alone.

    robotrl train iql --store data/reach.zarr --steps 20000
    result = robotrl.iql.train(IqlConfig(store=Path("data/reach.zarr")))      # the same dataclass

IQL never queries the critic on actions outside the data: V(s) is an upper expectile of Q(s, a) over the data's
actions (`expectile` > 0.5 leans towards the best of them), Q regresses on r + gamma V(s'), and the actor is
advantage-weighted regression (AWR) onto the data's actions with weights exp(beta (Q - V)). That makes it the
usual offline stage before online fine-tuning, and a critic for policy evaluation of other policies.

Reads top to bottom: data (transitions of the store, `robotrl.replay.DemoTransitions`) -> networks -> (resume)
-> the loop (V, Q, actor updates; Polyak target critics), log, evaluate, checkpoint. `--resume` continues
exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from robotrl.datasets import EpisodeStore
from robotrl.evaluate import evaluate_state_actor
from robotrl.policies.gaussian import CriticEnsemble, TanhGaussianActor
from robotrl.policies.nets import mlp
from robotrl.replay import DemoTransitions
from robotrl.sac import actor_fn
from robotrl.training import (
    RLResult, RunLog, RunOptions, gradient_step, load_run_state, save_run_state, start_run,
)


@dataclass
class IqlConfig(RunOptions):
    """Learn an actor and critics from a store of episodes (demonstrations, earlier runs), offline."""

    store: Path = Path("data/reach.zarr")
    obs_keys: tuple[str, ...] = ("state",)
    steps: int = 20_000
    batch_size: int = 256
    expectile: float = 0.7
    beta: float = 3.0
    """AWR inverse temperature: 0 is behaviour cloning, larger trusts the advantage more"""
    max_weight: float = 100.0
    gamma: float = 0.95
    tau: float = 0.005
    lr: float = 3e-4
    critics: int = 2
    hidden: tuple[int, ...] = (256, 256)
    reward_type: Literal["dense", "sparse"] = "dense"
    """the reward the store was recorded with (evaluation uses it too)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("steps", "batch_size", "critics"):
            if getattr(self, name) < 1:
                raise ValueError(f"IqlConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if not 0.5 <= self.expectile < 1.0:
            raise ValueError(f"IqlConfig.expectile: expected a value in [0.5, 1), got {self.expectile}")
        if self.beta < 0:
            raise ValueError(f"IqlConfig.beta: expected >= 0, got {self.beta}")


class IqlAgent(torch.nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, low: torch.Tensor, high: torch.Tensor, config: IqlConfig) -> None:
        super().__init__()
        self.actor = TanhGaussianActor(obs_dim, action_dim, config.hidden, low, high)
        self.critic = CriticEnsemble(obs_dim, action_dim, config.critics, config.hidden)
        self.target = CriticEnsemble(obs_dim, action_dim, config.critics, config.hidden)
        self.target.load_state_dict(self.critic.state_dict())
        self.target.requires_grad_(False)
        self.value = mlp([obs_dim, *config.hidden, 1], act=torch.nn.ReLU, layer_norm=True)


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric squared error: positive errors (Q above V) weigh `expectile`, negative ones 1 - expectile."""
    weight = torch.where(diff > 0, expectile, 1 - expectile)
    return (weight * diff.square()).mean()


def update(agent: IqlAgent, opt: dict[str, torch.optim.Optimizer], batch: dict[str, torch.Tensor], config: IqlConfig,
           where: str) -> dict[str, float]:
    with torch.no_grad():
        q_data = agent.target(batch["obs"], batch["action"]).squeeze(-1).min(0).values
    v = agent.value(batch["obs"]).squeeze(-1)
    value_loss = expectile_loss(q_data - v, config.expectile)
    gradient_step(opt["value"], value_loss, f"{where}: value")

    with torch.no_grad():
        next_v = agent.value(batch["next_obs"]).squeeze(-1)
        target = batch["reward"] + config.gamma * (1 - batch["done"]) * next_v
    q = agent.critic(batch["obs"], batch["action"]).squeeze(-1)
    critic_loss = F.mse_loss(q, target.expand_as(q), reduction="none").mean(1).sum()
    gradient_step(opt["critic"], critic_loss, f"{where}: critic")

    with torch.no_grad():
        weight = torch.exp(config.beta * (q_data - v.detach())).clamp(max=config.max_weight)
    actor_loss = -(weight * agent.actor.log_prob(batch["obs"], batch["action"])).mean()
    gradient_step(opt["actor"], actor_loss, f"{where}: actor")
    with torch.no_grad():
        for p, tp in zip(agent.critic.parameters(), agent.target.parameters()):
            tp.lerp_(p, config.tau)
    return {"loss/value": value_loss.item(), "loss/critic": critic_loss.item(), "loss/actor": actor_loss.item(),
            "q/mean": q.mean().item(), "adv/weight_mean": weight.mean().item()}


def train(config: IqlConfig) -> RLResult:
    with EpisodeStore.open(config.store) as store:
        spec = store.spec
    run_dir, state_path, rng = start_run(config, "iql", spec.task)

    # data
    data = DemoTransitions(config.store, spec, config.obs_keys)
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in (spec.action.low_array(), spec.action.high_array()))

    # networks
    agent = IqlAgent(data.obs.shape[1], int(np.prod(spec.action.shape)), low, high, config)
    opt = {"value": torch.optim.Adam(agent.value.parameters(), lr=config.lr),
           "critic": torch.optim.Adam(agent.critic.parameters(), lr=config.lr),
           "actor": torch.optim.Adam(agent.actor.parameters(), lr=config.lr)}
    start = 0
    if config.resume:
        start = int(load_run_state(state_path, agent, opt, rng)["step"])

    def evaluate() -> object:
        return evaluate_state_actor(actor_fn(agent.actor), spec.task, config.obs_keys, config.eval_episodes,
                                    config.eval_envs, action_mode=spec.action_mode, reward_type=config.reward_type,
                                    episode_steps=spec.episode_steps)

    log = RunLog(run_dir)
    bar = tqdm(total=config.steps, initial=start, desc="iql", unit="step", disable=not config.progress, dynamic_ncols=True)
    began = time.perf_counter()
    for step in range(start, config.steps):
        stats = update(agent, opt, data.sample(config.batch_size, rng), config,
                       f"iql step {step} (last train state: {state_path})")
        done = step + 1
        bar.update(1)
        if done % config.log_every == 0:
            log.log(done, **stats)
        if config.eval_every and done % config.eval_every == 0 and done != config.steps:
            log.log(done, **{"eval/success_rate": evaluate().success_rate})  # type: ignore[attr-defined]
        if done % config.checkpoint_every == 0 or done == config.steps:
            save_run_state(state_path, done, agent, opt, rng)
            torch.save(agent.actor.state_dict(), run_dir / "actor.pt")
    bar.close()
    seconds = time.perf_counter() - began
    success, ci = None, None
    if config.eval_episodes > 0:
        stats_eval = evaluate()
        success, ci = stats_eval.success_rate, stats_eval.success_ci95()  # type: ignore[attr-defined]
        log.log(config.steps, **{"eval/success_rate": success})
    log.close()
    return RLResult(run_dir / "actor.pt", config.steps, seconds, success, ci, run_dir).save()


def run_train_iql(config: IqlConfig) -> RLResult:
    result = train(config)
    print(result.summary("iql", config.eval_episodes, "updates"))
    return result
