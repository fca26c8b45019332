"""Implicit Q-learning (Kostrikov et al. 2022): an offline actor-critic learned from an episode store alone.

    robotrl train iql --store data/reach.zarr --steps 20000
    result = robotrl.rl.iql.train(IqlConfig(store=Path("data/reach.zarr")))      # the same dataclass

IQL never queries the critic on actions outside the data: V(s) is an upper expectile of Q(s, a) over the data's
actions (`expectile` > 0.5 leans towards the best of them), Q regresses on r + gamma V(s'), and the actor is
advantage-weighted regression (AWR) onto the data's actions with weights exp(beta (Q - V)). That makes it the
usual offline stage before online fine-tuning, and a critic for policy evaluation of other policies.

Reads top to bottom: data (transitions of the store, `robotrl.rl.replay.DemoTransitions`) -> networks -> (resume)
-> the loop (V, Q, actor updates; Polyak target critics), log, evaluate, checkpoint. `--resume` continues
exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from robotrl.policies.gaussian import CriticEnsemble, TanhGaussianActor
from robotrl.policies.nets import mlp
from robotrl.rl.offline import OfflineOptions, offline_evaluate, offline_loop, offline_start
from robotrl.rl.sac import actor_fn
from robotrl.training.loop import RLResult, gradient_step, load_run_state, polyak


@dataclass
class IqlConfig(OfflineOptions):
    """Learn an actor and critics from a store of episodes (demonstrations, earlier runs), offline."""

    expectile: float = 0.7
    beta: float = 3.0
    """AWR inverse temperature: 0 is behaviour cloning, larger trusts the advantage more"""
    max_weight: float = 100.0

    def __post_init__(self) -> None:
        super().__post_init__()
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


def critic_update(
    agent: Any,
    opt: Mapping[str, torch.optim.Optimizer],
    batch: dict[str, torch.Tensor],
    expectile: float,
    discount: float | torch.Tensor,
    where: str,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """IQL's V and Q steps on `agent.value`, `agent.critic`, `agent.target`: V an expectile of the target critics'
    min Q at the data's actions, Q regressed on r + discount (1 - done) V(s'). `discount` is gamma, or per transition
    gamma^k for k-step transitions (action chunks). Returns (that min Q, V before its step, stats)."""
    with torch.no_grad():
        q_data = agent.target(batch["obs"], batch["action"]).squeeze(-1).min(0).values
    v = agent.value(batch["obs"]).squeeze(-1)
    value_loss = expectile_loss(q_data - v, expectile)
    gradient_step(opt["value"], value_loss, f"{where}: value")

    with torch.no_grad():
        next_v = agent.value(batch["next_obs"]).squeeze(-1)
        target = batch["reward"] + discount * (1 - batch["done"]) * next_v
    q = agent.critic(batch["obs"], batch["action"]).squeeze(-1)
    critic_loss = F.mse_loss(q, target.expand_as(q), reduction="none").mean(1).sum()
    gradient_step(opt["critic"], critic_loss, f"{where}: critic")
    return (
        q_data,
        v.detach(),
        {"loss/value": value_loss.item(), "loss/critic": critic_loss.item(), "q/mean": q.mean().item()},
    )


def update(
    agent: IqlAgent,
    opt: Mapping[str, torch.optim.Optimizer],
    batch: dict[str, torch.Tensor],
    config: IqlConfig,
    where: str,
) -> dict[str, float]:
    q_data, v, stats = critic_update(agent, opt, batch, config.expectile, config.gamma, where)
    with torch.no_grad():
        weight = torch.exp(config.beta * (q_data - v)).clamp(max=config.max_weight)
    actor_loss = -(weight * agent.actor.log_prob(batch["obs"], batch["action"])).mean()
    gradient_step(opt["actor"], actor_loss, f"{where}: actor")
    polyak(agent.critic, agent.target, config.tau)
    return {**stats, "loss/actor": actor_loss.item(), "adv/weight_mean": weight.mean().item()}


def train(config: IqlConfig) -> RLResult:
    spec, data, run_dir, state_path, rng = offline_start(config, "iql")
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in (spec.action.low_array(), spec.action.high_array()))

    # networks
    agent = IqlAgent(data.obs.shape[1], int(np.prod(spec.action.shape)), low, high, config)
    opt = {
        "value": torch.optim.Adam(agent.value.parameters(), lr=config.lr),
        "critic": torch.optim.Adam(agent.critic.parameters(), lr=config.lr),
        "actor": torch.optim.Adam(agent.actor.parameters(), lr=config.lr),
    }
    start = int(load_run_state(state_path, agent, opt, rng)["step"]) if config.resume else 0

    # the loop: V, Q, actor updates on the store's transitions
    return offline_loop(
        config,
        "iql",
        agent,
        spec,
        opt,
        rng,
        run_dir,
        state_path,
        sample=lambda g: data.sample(config.batch_size, g),
        update=lambda batch, where: update(agent, opt, batch, config, where),
        evaluate=lambda: offline_evaluate(actor_fn(agent.actor), spec, config),
        start=start,
    )


def run_train_iql(config: IqlConfig) -> RLResult:
    result = train(config)
    print(result.summary("iql", config.eval_episodes, "updates"))
    return result
