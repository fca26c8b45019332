"""Proximal policy optimization for many parallel envs (the Brax / MuJoCo Playground regime), on the CPU backend's
native threads.

    robotrl train ppo --task Reach --num-envs 32 --total-steps 300000
    result = robotrl.rl.ppo.train(PpoConfig(task="Reach"))       # the same dataclass

Reads top to bottom (CleanRL's layout): envs -> agent (Gaussian policy with a state-independent std, value
function) -> (resume) -> per iteration: a rollout of `rollout_steps` in every env, GAE(lambda) advantages, then
`epochs` passes of clipped-surrogate updates over shuffled minibatches -> log, evaluate, checkpoint.

Options as the large-batch recipes use them: running observation normalization, value clipping, advantage
normalization, a linearly annealed learning rate. An episode cut by the time limit is bootstrapped from the value
of its final observation (auto-reset hands the next episode's first one back), so time limits do not read as
failures. A killed run resumes exactly from its last iteration (`--resume`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from robotrl.core.spec import Spec, flatten_obs
from robotrl.envs import make
from robotrl.policies.gaussian import GaussianConfig, GaussianPolicy, actor_policy
from robotrl.policies.nets import last_linear, mlp
from robotrl.training.evaluate import evaluate_state_actor
from robotrl.training.loop import (
    LOWER_LR,
    PolicyRunOptions,
    RLResult,
    RunLog,
    TaskOptions,
    TrainClock,
    TrainingDiverged,
    finish_iterations,
    load_run_state,
    postfix,
    recent_episodes,
    save_run_state,
    start_run,
)


@dataclass
class PpoConfig(PolicyRunOptions, TaskOptions):
    """Train a Gaussian policy and a value function with PPO on a task's parallel vector env."""

    backend: Literal["cpu", "mjx"] = "cpu"
    """cpu: torch on the CPU backend's threads; mjx: robotrl/rl/ppo_mjx.py, rollout and update on the accelerator"""
    num_envs: int = 32
    total_steps: int = 300_000
    """environment steps, all envs together"""
    rollout_steps: int = 64
    """steps per env between updates"""
    epochs: int = 4
    minibatches: int = 4
    gamma: float = 0.97
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_clip: float | None = 0.2
    """clip the value update around the rollout's values (None: plain regression)"""
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    lr: float = 3e-4
    anneal_lr: bool = True
    max_grad_norm: float = 0.5
    normalize_obs: bool = True
    normalize_advantages: bool = True
    hidden: tuple[int, ...] = (256, 256)
    init_log_std: float = -0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in ("cpu", "mjx"):
            raise ValueError(f"PpoConfig.backend: expected 'cpu' or 'mjx', got {self.backend!r}")
        for name in ("num_envs", "total_steps", "rollout_steps", "epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"PpoConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if (self.num_envs * self.rollout_steps) % self.minibatches:
            raise ValueError(
                f"PpoConfig.minibatches: expected a divisor of num_envs * rollout_steps "
                f"({self.num_envs * self.rollout_steps}), got {self.minibatches}"
            )
        if not (0.0 < self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0 and self.clip > 0):
            raise ValueError(
                f"PpoConfig.gamma / gae_lambda / clip: expected (0, 1], [0, 1], > 0, got "
                f"{self.gamma}, {self.gae_lambda}, {self.clip}"
            )


class RunningNorm(nn.Module):
    """Running mean / variance of observations (parallel-variance update per batch); part of the agent's state."""

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, dim: int, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip

    def update(self, x: torch.Tensor) -> None:
        x = x.double()
        n, mean, var = x.shape[0], x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.var.copy_((self.var * self.count + var * n + delta.square() * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean.float()) / (self.var.float() + 1e-8).sqrt()).clamp(-self.clip, self.clip)


class PpoAgent(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, config: PpoConfig) -> None:
        super().__init__()
        self.norm = RunningNorm(obs_dim)
        self.normalize = config.normalize_obs
        self.actor = mlp([obs_dim, *config.hidden, action_dim], act=nn.Tanh)
        self.critic = mlp([obs_dim, *config.hidden, 1], act=nn.Tanh)
        self.log_std = nn.Parameter(torch.full((action_dim,), config.init_log_std))
        with torch.no_grad():  # small initial actions, as the large-batch recipes initialize the last layer
            last_linear(self.actor).weight.mul_(0.01)
            last_linear(self.actor).bias.zero_()

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.norm(obs) if self.normalize else obs

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.actor(self.features(obs)), self.log_std.exp())

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The deterministic action (the mean) for flattened observations: evaluation and deployment."""
        with torch.no_grad():
            return self.actor(self.features(torch.from_numpy(obs))).numpy()


def actor_policy_of(agent: PpoAgent, spec: Spec, config: PpoConfig) -> GaussianPolicy:
    """The agent's actor with its running observation statistics, as the registered `gaussian` policy (its mean:
    the deterministic action PPO evaluates): the run's `policy/`, which eval, export and deploy load."""
    gaussian = GaussianConfig(
        obs_keys=tuple(config.obs_keys),
        hidden=tuple(config.hidden),
        squash=False,
        activation="tanh",
        layer_norm=False,
        obs_norm=config.normalize_obs,
        obs_clip=agent.norm.clip,
    )
    parts: dict[str, nn.Module | torch.Tensor] = {"actor": agent.actor}
    if config.normalize_obs:
        parts |= {"obs_mean": agent.norm.mean, "obs_var": agent.norm.var}
    return actor_policy(spec, gaussian, parts)


def ppo_loss(
    agent: PpoAgent, batch: dict[str, torch.Tensor], config: PpoConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate + (clipped) value regression - entropy bonus, on one minibatch."""
    dist = agent.dist(batch["obs"])
    logp = dist.log_prob(batch["action"]).sum(-1)
    ratio = (logp - batch["logp"]).exp()
    adv = batch["adv"]
    if config.normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - config.clip, 1 + config.clip)).mean()
    v = agent.value(batch["obs"])
    value_loss = (v - batch["ret"]).square()
    if config.value_clip is not None:
        clipped = batch["value"] + (v - batch["value"]).clamp(-config.value_clip, config.value_clip)
        value_loss = torch.max(value_loss, (clipped - batch["ret"]).square())
    value_loss = 0.5 * value_loss.mean()
    entropy = dist.entropy().sum(-1).mean()
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - (logp - batch["logp"])).mean()
        clip_frac = ((ratio - 1).abs() > config.clip).float().mean()
    return loss, {
        "loss/policy": policy_loss.item(),
        "loss/value": value_loss.item(),
        "entropy": entropy.item(),
        "approx_kl": approx_kl.item(),
        "clip_frac": clip_frac.item(),
    }


def gae(
    reward: torch.Tensor, value: torch.Tensor, done: torch.Tensor, last_value: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """GAE(lambda) advantages over a (T, N) rollout; `done` cuts the recursion at episode ends (a time-limit cut
    has its bootstrap folded into the reward already)."""
    adv = torch.zeros_like(reward)
    running = torch.zeros_like(last_value)
    next_value = last_value
    for t in reversed(range(reward.shape[0])):
        keep = 1.0 - done[t]
        delta = reward[t] + gamma * next_value * keep - value[t]
        running = delta + gamma * lam * keep * running
        adv[t] = running
        next_value = value[t]
    return adv


def train(config: PpoConfig) -> RLResult:
    if config.backend == "mjx":  # robotrl/rl/ppo_mjx.py builds on this module, so this one never imports it
        raise ValueError(
            "PpoConfig.backend: 'mjx' is trained by robotrl.rl.ppo_mjx.train (as `robotrl train ppo "
            "--backend mjx` does); robotrl.rl.ppo.train is the CPU backend's"
        )
    run_dir, state_path, rng = start_run(config, "ppo", config.task)

    # envs
    n, horizon = config.num_envs, config.rollout_steps
    env = make(
        config.task,
        num_envs=n,
        seed=config.seed,
        action_mode=config.action_mode,
        reward_type=config.reward_type,
        render_images=False,
    )
    spec = env.task_spec
    obs_dim = int(sum(np.prod(spec.observations[k].shape) for k in config.obs_keys))
    action_dim = int(np.prod(spec.action.shape))

    # agent
    agent = PpoAgent(obs_dim, action_dim, config)
    optimizer = torch.optim.Adam(agent.parameters(), lr=config.lr, eps=1e-5)
    iterations = math.ceil(config.total_steps / (n * horizon))
    start = 0
    if config.resume:
        state = load_run_state(state_path, agent, {"adam": optimizer}, rng, env)
        obs = state["obs"].numpy()
        start, episodes = int(state["step"]), state["episodes"]  # iterations done
        ret, succ = state["running"]["ret"].numpy().copy(), state["running"]["succ"].numpy().copy()
    else:
        obs = flatten_obs(env.reset(seed=config.seed)[0], config.obs_keys)
        episodes = {"returns": [], "success": []}
        ret, succ = np.zeros(n), np.zeros(n, bool)

    def evaluate() -> Any:
        return evaluate_state_actor(
            agent.act,
            config.task,
            config.obs_keys,
            config.eval_episodes,
            config.eval_envs,
            action_mode=config.action_mode,
            reward_type=config.reward_type,
        )

    log = RunLog(run_dir)
    bar = tqdm(
        total=iterations * n * horizon,
        initial=start * n * horizon,
        desc=f"ppo {config.task}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    buf = {
        k: torch.zeros((horizon, n, *shape))
        for k, shape in (
            ("obs", (obs_dim,)),
            ("action", (action_dim,)),
            ("logp", ()),
            ("reward", ()),
            ("done", ()),
            ("value", ()),
        )
    }
    clock = TrainClock()
    try:
        for it in range(start, iterations):
            if config.anneal_lr:
                optimizer.param_groups[0]["lr"] = config.lr * (1 - it / iterations)
            # rollout
            for t in range(horizon):
                x = torch.from_numpy(obs)
                if config.normalize_obs:
                    agent.norm.update(x)
                with torch.no_grad():
                    dist = agent.dist(x)
                    action = dist.sample()
                    buf["logp"][t] = dist.log_prob(action).sum(-1)
                    buf["value"][t] = agent.value(x)
                next_obs, raw_reward, terminated, truncated, info = env.step(action.numpy())
                reward = torch.as_tensor(raw_reward, dtype=torch.float32)
                cut = truncated & ~terminated
                if cut.any():  # bootstrap a time-limit cut from its final observation's value
                    final = torch.from_numpy(flatten_obs(info["final_obs"], config.obs_keys)[cut])
                    with torch.no_grad():
                        reward[torch.from_numpy(cut)] += config.gamma * agent.value(final)
                buf["obs"][t], buf["action"][t], buf["reward"][t] = x, action, reward
                buf["done"][t] = torch.from_numpy((terminated | truncated).astype(np.float32))
                ret += raw_reward
                succ |= info["success"]
                for i in np.nonzero(terminated | truncated)[0]:
                    episodes["returns"].append(float(ret[i]))
                    episodes["success"].append(bool(succ[i]))
                    ret[i], succ[i] = 0.0, False
                obs = flatten_obs(next_obs, config.obs_keys)
            with torch.no_grad():
                last_value = agent.value(torch.from_numpy(obs))
            adv = gae(buf["reward"], buf["value"], buf["done"], last_value, config.gamma, config.gae_lambda)
            flat = {
                "obs": buf["obs"].reshape(-1, obs_dim),
                "action": buf["action"].reshape(-1, action_dim),
                "logp": buf["logp"].reshape(-1),
                "value": buf["value"].reshape(-1),
                "adv": adv.reshape(-1),
                "ret": (adv + buf["value"]).reshape(-1),
            }

            # update
            size = n * horizon // config.minibatches
            for _ in range(config.epochs):
                order = torch.from_numpy(rng.permutation(n * horizon))
                for k in range(config.minibatches):
                    idx = order[k * size : (k + 1) * size]
                    loss, stats = ppo_loss(agent, {key: v[idx] for key, v in flat.items()}, config)
                    if not math.isfinite(loss.item()):
                        raise TrainingDiverged(
                            f"ppo iteration {it}: loss is {loss.item()}; the last good train "
                            f"state is kept ({state_path}); {LOWER_LR}"
                        )
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), config.max_grad_norm)
                    optimizer.step()

            # log, evaluate, checkpoint
            now, before = (it + 1) * n * horizon, it * n * horizon
            bar.update(n * horizon)
            recent = recent_episodes(
                episodes["returns"], episodes["success"], 100, getattr(env, "reports_success", True)
            )
            trained_s = clock.trained()
            log.log(
                now,
                **stats,
                **{"time/train_seconds": trained_s, "time/steps_per_second": now / max(trained_s, 1e-9)},
                **recent,
            )
            bar.set_postfix(postfix(recent))
            clock.evaluate_every(config, log, evaluate, now, before, last=it + 1 == iterations)
            if now // config.checkpoint_every != before // config.checkpoint_every or it + 1 == iterations:
                save_run_state(
                    state_path,
                    it + 1,
                    agent,
                    {"adam": optimizer},
                    rng,
                    env,
                    obs=torch.from_numpy(obs),
                    episodes=episodes,
                    running={"ret": torch.from_numpy(ret.copy()), "succ": torch.from_numpy(succ.copy())},
                )
                actor_policy_of(agent, spec, config).save(run_dir / "policy")
    finally:
        bar.close()
        env.close()
    return finish_iterations(config, log, evaluate, run_dir / "policy", clock, run_dir, iterations, start, n * horizon)
