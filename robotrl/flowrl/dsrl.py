"""DSRL-SAC: soft actor-critic in the initial-noise space of a frozen flow policy (Wagenmaker et al. 2025).

    robotrl train dsrl --policy runs/bc-flow/policy --total-steps 100000
    result = robotrl.flowrl.dsrl.train(DsrlConfig(policy=Path("runs/bc-flow/policy")))     # the same dataclass

`train online --method latent` steers the same frozen flow network by PPO on its noise prior; this is the off-policy
learner for that latent action space. The action is x_0, the noise the policy's deterministic Euler ODE maps to a
chunk; the decision is that chunk's `execute` env steps (a semi-MDP, the rewards summed with the per-step discount).
A critic Q(observation window, x_0) is trained on every decision ever taken, so each one keeps teaching it, where
PPO uses a decision once; and neither the critic nor the actor update touches the U-Net (only the rollout integrates
the ODE), so an update costs two MLPs and a high update-to-data ratio is cheap.

The pieces are the repo's own: the rollout, windows and the noise prior of `robotrl.flowrl.chain` (the prior, starting
as N(0, I), i.e. as the BC policy, is SAC's actor: a Gaussian with an exact density, its std state-independent and
<= 1), and SAC/RLPD's agent and update from `robotrl.rl.sac` (a LayerNorm critic ensemble, REDQ's min over a random
subset, the temperature tuned towards a target entropy) with the per-decision discount gamma^execute. A time-limit
cut is bootstrapped at collection time from the critic's soft value of the final window (as the PPO rollout
bootstraps from its value network). The result is an ordinary flow policy checkpoint with its trained prior
(`run_dir/policy`): `robotrl policy eval`, `distill` and `export` take it unchanged. A killed run resumes exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from robotrl.core.spec import STRING
from robotrl.flowrl.chain import (
    ChainConfig,
    FlowAgent,
    Tally,
    Windows,
    finish_policy_run,
    gaussian_log_prob,
    load_flow_policy,
    rollout,
    training_env,
)
from robotrl.policies.generative import NoisePrior
from robotrl.rl.sac import Agent, SacConfig, update
from robotrl.training.evaluate import evaluate_policy
from robotrl.training.loop import (
    TRAIN_STATE,
    BestCheckpoint,
    PolicyRunOptions,
    RLResult,
    RunLog,
    TrainClock,
    check_finite_weights,
    load_run_state,
    postfix,
    recent_episodes,
    save_run_state,
    start_run,
)


@dataclass
class DsrlConfig(PolicyRunOptions):
    """Steer a frozen flow policy with SAC on the initial noise of its ODE (DSRL-SAC) in the parallel vector env."""

    policy: Path = Path("runs/bc-flow/policy")
    """the flow policy checkpoint to steer (`robotrl train bc policy:flow` or a `train online --method latent` /
    `train dsrl` output, whose prior it continues)"""
    num_envs: int = 16
    total_steps: int = 100_000
    """environment steps, all envs together"""
    execute: int = 8
    """actions executed from each chunk before the next decision (and at evaluation)"""
    sampler_steps: int | None = None
    """Euler steps of the ODE (default: the policy's sampler steps); the saved policy samples with them"""
    gamma: float = 0.95
    """discount per env step (a decision of `execute` steps discounts its successor by gamma^execute); on Reach
    0.99 let the critic's loss and Q grow and success fall back after a peak, 0.95 held it (bench/RESULTS.md,
    "DSRL-SAC against PPO on the same noise prior")"""
    learning_starts: int = 256
    """decisions collected (from the starting prior, i.e. the BC policy) before the first update"""
    utd: int = 2
    """gradient updates per decision collected"""
    batch_size: int = 256
    buffer_size: int = 200_000
    """decisions kept (the oldest dropped beyond it)"""
    critics: int = 2
    critic_subset: int = 2
    """critics whose minimum is the TD target, drawn at random each update (REDQ)"""
    hidden: tuple[int, ...] = (256, 256)
    """the critics' hidden widths"""
    prior_hidden: tuple[int, ...] = (128, 128)
    """the noise prior's hidden widths (a policy that has one keeps its own)"""
    prior_bound: float = 1.5
    """the prior's mean stays in [-bound, bound] per element of x_0"""
    tau: float = 0.005
    lr: float = 3e-4
    init_temperature: float = 0.01
    target_std: float = 0.3
    """the target entropy is that of N(0, target_std^2) over every element of x_0 (the starting prior, N(0, I), is
    above it: the temperature lets the std shrink to it as the mean moves where the critic points)"""
    target_kl: float | None = None
    """regularize towards the BC policy's noise instead of towards high entropy: SAC's log-density becomes the
    log-ratio of the prior to N(0, I), and the temperature holds KL(prior || N(0, I)) per decision at this many nats
    (target_std unused; the logged `entropy` is minus that KL). A mean shift of m per element costs m^2 / 2 nats:
    the flow network only knows noise near N(0, I)'s typical set"""
    reward_type: Literal["dense", "sparse"] = "dense"
    reward_classifier: Path | None = None
    """a success classifier (`robotrl train classifier`) whose verdict replaces the env's reward in training"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy = Path(self.policy)
        name = type(self).__name__
        for field in (
            "num_envs",
            "total_steps",
            "execute",
            "utd",
            "batch_size",
            "buffer_size",
            "critics",
            "critic_subset",
        ):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        if self.learning_starts < 0:
            raise ValueError(f"{name}.learning_starts: expected >= 0, got {self.learning_starts}")
        if self.critic_subset > self.critics:
            raise ValueError(f"{name}.critic_subset: expected <= critics ({self.critics}), got {self.critic_subset}")
        if not (0.0 < self.gamma < 1.0 and 0.0 < self.tau <= 1.0):
            raise ValueError(
                f"{name}.gamma / tau: expected gamma in (0, 1) and tau in (0, 1], got {self.gamma}, {self.tau}"
            )
        for field in ("lr", "init_temperature", "prior_bound"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{name}.{field}: expected > 0, got {getattr(self, field)}")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"{name}.target_kl: expected > 0 nats or None, got {self.target_kl}")
        if not 0.0 < self.target_std <= 1.0:
            raise ValueError(
                f"{name}.target_std: expected in (0, 1] (the prior's std is at most 1), got {self.target_std}"
            )

    def online(self) -> ChainConfig:
        """The rollout's settings in the chain's terms: its latent method draws x_0 from the prior."""
        return ChainConfig(
            policy=self.policy,
            method="latent",
            num_envs=self.num_envs,
            execute=self.execute,
            sampler_steps=self.sampler_steps,
            noise_hidden=self.prior_hidden,
            prior_bound=self.prior_bound,
            reward_type=self.reward_type,
            reward_classifier=self.reward_classifier,
            seed=self.seed,
            eval_episodes=0,
        )

    def sac(self, task: str, execute: int) -> SacConfig:
        """The critic and temperature settings in SAC's terms, discounting per decision."""
        return SacConfig(
            task=task,
            gamma=self.gamma**execute,
            critics=self.critics,
            critic_subset=self.critic_subset,
            hidden=self.hidden,
            tau=self.tau,
            lr=self.lr,
            init_temperature=self.init_temperature,
            batch_size=self.batch_size,
            eval_episodes=0,
        )


class PriorActor(nn.Module):
    """The policy's noise prior as SAC's actor: features (B, F) -> (x_0 flattened (B, D), its log-density (B,)),
    reparameterized so that the critic's gradient reaches the prior's mean and std. With `relative`, the
    log-density less N(0, I)'s at the same x_0: its mean is KL(prior || N(0, I)), so that SAC's entropy bonus
    becomes a KL penalty towards the BC policy's noise (`DsrlConfig.target_kl`)."""

    def __init__(self, prior: NoisePrior, relative: bool = False) -> None:
        super().__init__()
        self.prior, self.relative = prior, relative

    def forward(self, features: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = self.prior(features)
        x0 = mean if deterministic else mean + std * torch.randn_like(mean)
        logp = gaussian_log_prob(x0, mean, std)
        if self.relative:
            logp = logp - gaussian_log_prob(x0, torch.zeros_like(x0), torch.ones_like(x0))
        return x0.flatten(1), logp


class SoftValue(nn.Module):
    """The critics' mean Q at the prior's mean: the rollout's value of a time-limit cut's final window."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x0, _ = self.agent.actor(features, deterministic=True)
        return self.agent.q(self.agent.critic, features, x0).mean(0)[:, None]


class DecisionReplay:
    """A ring of decisions: (features, x_0, discounted reward, episode ended, next decision's features); tensors,
    so that it travels in the train state."""

    def __init__(self, capacity: int, feature_dim: int, action_dim: int) -> None:
        self.capacity, self.size, self.cursor = capacity, 0, 0
        self.data = {
            "obs": torch.zeros(capacity, feature_dim),
            "action": torch.zeros(capacity, action_dim),
            "reward": torch.zeros(capacity),
            "done": torch.zeros(capacity),
            "next_obs": torch.zeros(capacity, feature_dim),
        }

    def add(self, **batch: torch.Tensor) -> None:
        n = len(batch["obs"])
        idx = (self.cursor + torch.arange(n)) % self.capacity
        for key, x in batch.items():
            self.data[key][idx] = x.float()
        self.cursor, self.size = int((self.cursor + n) % self.capacity), min(self.size + n, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        idx = torch.from_numpy(rng.integers(0, self.size, batch_size))
        return {key: x[idx] for key, x in self.data.items()}

    def state(self) -> dict[str, Any]:
        return {"size": self.size, "cursor": self.cursor, **{k: x[: self.size].clone() for k, x in self.data.items()}}

    def load(self, state: dict[str, Any]) -> None:
        self.size, self.cursor = int(state["size"]), int(state["cursor"])
        for key in self.data:
            self.data[key][: self.size] = state[key]


def decisions(flow: FlowAgent, data: dict[str, Any], windows: Windows, discount: float) -> dict[str, torch.Tensor]:
    """A rollout's decisions as transitions: each decision's successor is the next one its env took in the rollout,
    or the env's window after it (an ended decision's successor is never read: its bootstrap, if a time limit cut
    it, is in its reward already). SAC's update discounts every decision by `discount` (gamma^execute) times
    (1 - done); a decision of k < execute steps (one that began after an episode ended mid-rollout) gets the
    `done` that makes that gamma^k."""
    features = flow.features(data["obs"])
    last = flow.features(flow.policy.normalize_obs(windows.frames))
    following = last[torch.from_numpy(data["env"])].clone()
    seen: dict[int, int] = {}
    for d in reversed(range(len(data["env"]))):
        env = int(data["env"][d])
        if env in seen:
            following[d] = features[seen[env]]
        seen[env] = d
    continuation = (1.0 - data["done"]) * data["discount"] / discount
    return {
        "obs": features,
        "action": data["chain"][:, 0].flatten(1),
        "reward": torch.from_numpy(data["reward"]),
        "done": torch.from_numpy(1.0 - continuation),
        "next_obs": following,
    }


def train(config: DsrlConfig) -> RLResult:
    online = config.online()
    policy = load_flow_policy(config.policy, config.sampler_steps, field="DsrlConfig.policy")
    run_dir, state_path, rng = start_run(config, "dsrl", policy.spec.task, holds=TRAIN_STATE)

    # the rollout's agent (its prior is the actor) and SAC's agent around the same prior
    env = training_env(policy, online)
    reports_success = getattr(env, "reports_success", True)
    flow = FlowAgent(policy, online, policy.config.steps)  # only its prior trains (latent freezes the rest)
    execute = min(config.execute, policy.action_horizon)
    sac_config = config.sac(policy.spec.task, execute)
    shape = flow.chunk_shape
    action_dim = shape[0] * shape[1]
    feature_dim = flow.feature_dim
    bound = torch.full((action_dim,), config.prior_bound)
    agent = Agent(feature_dim, action_dim, -bound, bound, sac_config)
    # DSRL's SAC acts in the noise space: the prior's actor in the agent's actor slot, the soft value as the chain's
    agent.actor = PriorActor(flow.prior, relative=config.target_kl is not None)  # type: ignore[assignment]
    flow.value_net = SoftValue(agent)  # type: ignore[assignment]  # the rollout's bootstrap of a time-limit cut
    opt = agent.optimizers(config.lr)
    target_entropy = (
        -config.target_kl
        if config.target_kl is not None  # SAC's update: -target is the bound
        else action_dim * (0.5 * math.log(2 * math.pi * math.e) + math.log(config.target_std))
    )
    replay = DecisionReplay(config.buffer_size, feature_dim, action_dim)
    text = tuple(k for k, v in policy.spec.observations.items() if v.dtype == STRING)
    windows, tally = Windows(tuple(policy.obs_keys), policy.obs_horizon, text), Tally(config.num_envs)

    # start or resume: an iteration is one decision in every env (more where an episode ends mid-chunk)
    per_iteration = config.num_envs * execute
    iterations, start, collected = math.ceil(config.total_steps / per_iteration), 0, 0
    if config.resume:
        state = load_run_state(state_path, agent, opt, rng, env)
        windows.load(state["windows"])
        tally.load(state["tally"])
        replay.load(state["replay"])
        start, collected = int(state["step"]), int(state["collected"])
    else:
        windows.start(env.reset(seed=config.seed)[0])

    def evaluate() -> Any:
        return evaluate_policy(policy, config.eval_episodes, config.eval_envs, execute=execute)

    log = RunLog(run_dir)
    bar = tqdm(
        total=iterations * per_iteration,
        initial=start * per_iteration,
        desc="dsrl",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    clock = TrainClock()
    best = BestCheckpoint(run_dir, policy.save)
    stats: dict[str, float] = {}
    try:
        for it in range(start, iterations):
            data = rollout(flow, env, windows, execute, execute, config.gamma, tally)
            batch = decisions(flow, data, windows, sac_config.gamma)
            replay.add(**batch)
            collected += len(batch["obs"])
            where = f"dsrl iteration {it} (last train state: {state_path})"
            if collected >= config.learning_starts:
                for _ in range(config.utd * len(batch["obs"])):
                    stats = update(agent, opt, replay.sample(config.batch_size, rng), sac_config, target_entropy, where)
                    with torch.no_grad():  # projected onto the std's range: beyond it the clamp passes no gradient
                        flow.prior.log_std.clamp_(-7.0, 0.0)
                check_finite_weights(agent, where)

            now, before = (it + 1) * per_iteration, it * per_iteration
            bar.update(per_iteration)
            recent = recent_episodes(tally.returns, tally.success, 100, reports_success)
            if now // config.log_every != before // config.log_every or it + 1 == iterations:
                with torch.no_grad():
                    mean, std = flow.prior(batch["obs"])
                log.log(
                    now,
                    **stats,
                    **{
                        "time/train_seconds": clock.trained(),
                        "rollout/decisions": collected,
                        "prior/std": float(std.mean()),
                        "prior/mean_abs": float(mean.abs().mean()),
                    },
                    **recent,
                )
            bar.set_postfix(postfix(recent))
            clock.evaluate_every(config, log, evaluate, now, before, last=it + 1 == iterations, best=best)
            if now // config.checkpoint_every != before // config.checkpoint_every or it + 1 == iterations:
                save_run_state(
                    state_path,
                    it + 1,
                    agent,
                    opt,
                    rng,
                    env,
                    tally=tally.state(),
                    windows=windows.state(),
                    replay=replay.state(),
                    collected=collected,
                )
                policy.save(run_dir / "policy")
    finally:
        bar.close()
        env.close()
    return finish_policy_run(config, log, evaluate, policy, clock, run_dir, iterations, start, per_iteration, best)


def run_train_dsrl(config: DsrlConfig) -> RLResult:
    result = train(config)
    print(result.summary("dsrl", config.eval_episodes, "env steps"))
    return result
