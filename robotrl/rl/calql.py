"""Cal-QL (Nakamoto et al. 2023): calibrated conservative Q-learning, offline from an episode store, as the
starting point of online fine-tuning.

    robotrl train calql --store data/reach.zarr --steps 20000
    robotrl train sac --init runs/calql-Reach-...        # WSRL: fine-tune it online without the offline data
    result = robotrl.rl.calql.train(CalqlConfig(store=Path("data/reach.zarr")))      # the same dataclass

CQL (Kumar et al. 2020) is SAC plus a regularizer on the critic, cql_alpha * (logsumexp over actions of Q(s, a)
- Q(s, a_data)), the logsumexp over actions sampled uniformly and from the current policy at s and s' (all scored
at s), importance-weighted by their densities. It pushes Q down on actions the data does not support and up on
the data's, so the actor cannot exploit over-estimated out-of-distribution actions. It also pushes the learned
values far below the real returns, and online fine-tuning then first spends its samples "unlearning" that
(a dip in success). Cal-QL's fix is one line: inside the logsumexp, the policy actions' Q-values are bounded
below by the Monte-Carlo return-to-go of the data's episode from s (the value of the reference policy that
collected it), so the regularizer never pushes the learned policy's values below those of the data's policy.
`calibrate=False` is plain CQL, the ablation.

Reads top to bottom: data (the store's transitions with their returns-to-go, `robotrl.rl.replay.DemoTransitions`)
-> networks (the modules of `robotrl.rl.sac.Agent`, so `sac --init` loads them) -> (resume) -> the loop (critics
on TD + the calibrated regularizer, actor and temperature as in SAC, Polyak target critics), log, evaluate,
checkpoint. `--resume` continues exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from robotrl.rl.offline import OfflineOptions, offline_evaluate, offline_loop, offline_start
from robotrl.rl.sac import Agent, SacConfig, actor_fn, actor_step
from robotrl.training.loop import RLResult, gradient_step, load_run_state, polyak


@dataclass
class CalqlConfig(OfflineOptions):
    """Learn an actor and critics from a store of episodes offline with calibrated conservative Q-learning."""

    cql_alpha: float = 5.0
    """weight of the conservative regularizer (the paper: 5 on AntMaze, 1 on Adroit and Kitchen)"""
    cql_actions: int = 10
    """actions sampled per state from each of: uniform, the policy at s, the policy at s'"""
    calibrate: bool = True
    """bound the policy actions' Q below by the data's Monte-Carlo return (Cal-QL); off: plain CQL"""
    critic_subset: int = 2
    """target critics whose minimum is the TD target, drawn at random each update (REDQ; all of 2 is CQL's)"""
    init_temperature: float = 0.1
    target_entropy: float | None = None
    """default: -action_dim"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("cql_actions", "critic_subset"):
            if getattr(self, name) < 1:
                raise ValueError(f"CalqlConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.critic_subset > self.critics:
            raise ValueError(
                f"CalqlConfig.critic_subset: expected <= critics ({self.critics}), got {self.critic_subset}"
            )
        if not self.cql_alpha >= 0:
            raise ValueError(f"CalqlConfig.cql_alpha: expected >= 0, got {self.cql_alpha}")
        if not self.init_temperature > 0:
            raise ValueError(f"CalqlConfig.init_temperature: expected > 0, got {self.init_temperature}")


def make_agent(obs_dim: int, action_dim: int, low: torch.Tensor, high: torch.Tensor, config: CalqlConfig) -> Agent:
    """SAC's own agent (actor, critic ensemble, target critics, temperature), so that `sac --init` continues
    exactly what was learned here (WSRL)."""
    shape = SacConfig(
        critics=config.critics,
        critic_subset=config.critic_subset,
        hidden=config.hidden,
        critic_loss="mse",
        init_temperature=config.init_temperature,
    )
    return Agent(obs_dim, action_dim, low, high, shape)


def conservative_penalty(
    agent: Agent, batch: dict[str, torch.Tensor], q_data: torch.Tensor, config: CalqlConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """CQL's regularizer per critic, summed: mean over the batch of logsumexp_a Q(s, a) - Q(s, a_data), over
    `cql_actions` uniform actions and as many from the policy at s and at s' (all scored at s), each less its
    log-density (importance sampling). Cal-QL: the policy actions' Q enter as max(Q, MC return of s)."""
    obs, n = batch["obs"], config.cql_actions
    size, action_dim = batch["action"].shape
    low, high = agent.actor.center - agent.actor.scale, agent.actor.center + agent.actor.scale
    with torch.no_grad():
        uniform = low + (high - low) * torch.rand(size, n, action_dim)
        uniform_logp = -(high - low).log().sum().expand(size, n)
        here, here_logp = agent.actor(obs.repeat_interleave(n, 0))
        there, there_logp = agent.actor(batch["next_obs"].repeat_interleave(n, 0))
    policy = torch.cat([here.view(size, n, -1), there.view(size, n, -1)], 1)  # (B, 2n, A)
    policy_logp = torch.cat([here_logp.view(size, n), there_logp.view(size, n)], 1)
    actions = torch.cat([uniform, policy], 1)  # (B, 3n, A)
    q = agent.q(
        agent.critic,
        obs.unsqueeze(1).expand(-1, 3 * n, -1).reshape(size * 3 * n, -1),
        actions.reshape(size * 3 * n, -1),
    ).view(config.critics, size, 3 * n)
    q_uniform, q_policy = q[..., :n], q[..., n:]
    bound = batch["mc_return"].view(1, size, 1)
    below = (q_policy < bound).float().mean().item()
    if config.calibrate:
        q_policy = torch.maximum(q_policy, bound)
    scores = torch.cat([q_uniform - uniform_logp, q_policy - policy_logp], 2)
    gap = torch.logsumexp(scores, 2) - q_data  # (E, B)
    return gap.mean(1).sum(), {
        "cql/gap": gap.mean().item(),
        "cql/q_policy": q[..., n:].mean().item(),
        "cql/q_uniform": q_uniform.mean().item(),
        "calibration/below_mc": below,
    }


def update(
    agent: Agent,
    opt: Mapping[str, torch.optim.Optimizer],
    batch: dict[str, torch.Tensor],
    config: CalqlConfig,
    target_entropy: float,
    where: str,
) -> dict[str, float]:
    """One Cal-QL update: critics on TD (min over a random subset of target critics, no entropy backup, as CQL)
    plus `cql_alpha` times the calibrated regularizer, then the actor and the temperature as in SAC."""
    alpha = agent.log_alpha.exp().detach()
    with torch.no_grad():
        next_action, _ = agent.actor(batch["next_obs"])
        subset = torch.randperm(config.critics)[: config.critic_subset]
        next_q = agent.q(agent.target, batch["next_obs"], next_action)[subset].min(0).values
        target = batch["reward"] + config.gamma * (1 - batch["done"]) * next_q
    q_data = agent.q(agent.critic, batch["obs"], batch["action"])  # (E, B)
    td_loss = F.mse_loss(q_data, target.expand_as(q_data), reduction="none").mean(1).sum()
    penalty, stats = conservative_penalty(agent, batch, q_data, config)
    gradient_step(opt["critic"], td_loss + config.cql_alpha * penalty, f"{where}: critic")

    stats.update(actor_step(agent, opt, batch["obs"], alpha, target_entropy, where))
    polyak(agent.critic, agent.target, config.tau)
    return {
        "loss/td": td_loss.item(),
        "loss/cql": penalty.item(),
        "alpha": alpha.item(),
        "q/data": q_data.mean().item(),
        "q/mc_return": batch["mc_return"].mean().item(),
        **stats,
    }


def train(config: CalqlConfig) -> RLResult:
    # data: the store's transitions with their Monte-Carlo returns-to-go
    spec, data, run_dir, state_path, rng = offline_start(config, "calql", mc_gamma=config.gamma)
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in (spec.action.low_array(), spec.action.high_array()))
    action_dim = int(np.prod(spec.action.shape))
    target_entropy = config.target_entropy if config.target_entropy is not None else -float(action_dim)

    # networks
    agent = make_agent(data.obs.shape[1], action_dim, low, high, config)
    opt = agent.optimizers(config.lr)
    start = int(load_run_state(state_path, agent, opt, rng)["step"]) if config.resume else 0

    # the loop: critics on TD + the calibrated regularizer, actor and temperature as in SAC
    return offline_loop(
        config,
        "calql",
        agent,
        spec,
        opt,
        rng,
        run_dir,
        state_path,
        sample=lambda g: data.sample(config.batch_size, g),
        update=lambda batch, where: update(agent, opt, batch, config, target_entropy, where),
        evaluate=lambda: offline_evaluate(actor_fn(agent.actor), spec, config),
        start=start,
    )


def run_train_calql(config: CalqlConfig) -> RLResult:
    result = train(config)
    print(result.summary("calql", config.eval_episodes, "updates"))
    return result
