"""The stochastic K-step chain of a flow policy, and what every RL method of flow policies shares around it: online
PPO (robotrl/flowrl/online.py), human-in-the-loop PPO (hil.py), RL-100's offline stage (offline.py) and DSRL-SAC
(dsrl.py) import it, never each other's insides.

A decision is an action chunk, drawn by the policy's K-step Euler chain from noise (t = 0) to the chunk (t = 1)
made stochastic by one of `METHODS` (robotrl/flowrl/online.py's docstring tells them apart). Each method is one
class (`CHAIN_METHODS` maps `--method` to it): how it draws a decision's chain, how it recomputes the chain's
log-likelihood, what of the policy trains. Every stochastic transition is Gaussian, so a stored chain's
log-likelihood is exact and recomputed under new weights (`FlowAgent`, which asks its method); `ppo_loss` is the
clipped surrogate on it that online, HIL and offline PPO take. Around the chain: the starting
checkpoint (`load_flow_policy`), the training env (`training_env`), per-env observation windows (`Windows`),
episode tallies (`Tally`), an operator who may drive (`Operator`, HIL), the semi-MDP rollout of chunks
(`rollout`), the settings these read (`ChainConfig`), and the end of a run whose result is a policy
(`finish_policy_run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import nn

from robotrl.policies import load
from robotrl.policies.flow import FlowPolicy
from robotrl.policies.generative import GenerativeConfig, NoisePrior
from robotrl.policies.nets import SinusoidalEmbedding, last_linear, mlp
from robotrl.training.evaluate import make_eval_env
from robotrl.training.loop import BestCheckpoint, PolicyRunOptions, RLResult, RunLog, TrainClock, finish_iterations


@dataclass
class ChainConfig(PolicyRunOptions):
    """The settings of a flow-RL run that the chain, its PPO loss and its training env read (`train online` and
    `train hil` take them all; DSRL and the offline stage fill in theirs)."""

    policy: Path = Path("runs/bc-flow/policy")
    """the flow policy checkpoint to start from (`robotrl train bc policy:flow` output)"""
    method: Literal["denoising_mdp", "flow_sde", "flow_noise", "ode_noise", "latent", "residual"] = "latent"
    """how the policy explores and what trains (robotrl/flowrl/online.py's docstring): latent learned Reach fastest
    in bench/flow_rl.py and, its flow network frozen, cannot lose what BC learned, where flow_sde lowered PushT
    (bench/RESULTS.md, "Steering a frozen flow network" and "PPO over the chain from a strong BC policy")"""
    num_envs: int = 32
    execute: int = 8
    """actions executed from each chunk before the next decision (and at evaluation)"""
    sampler_steps: int | None = None
    """K: Euler steps of the chain (default: the policy's sampler steps); the saved policy samples with K too"""
    noise_std: float | None = None
    """denoising_mdp: std of each transition (normalized action units; default 0.1); flow_noise: the noise net's
    initial std (default 0.2, which gained more on Reach than 0.1; bench/RESULTS.md, "Measurements behind the
    code's design"); ode_noise: the std of the noise on the ODE's chunk (default 0.2); residual: the initial std of
    the noise on the corrected chunk (default 0.1)"""
    noise_std_end: float | None = None
    """denoising_mdp: the std of the last transition, linear from noise_std along the chain (default: constant)"""
    noise_min: float = 0.02
    """flow_noise: lower bound of the learned std"""
    noise_max: float = 0.5
    """flow_noise: upper bound of the learned std"""
    sde_noise: float = 0.5
    """flow_sde: a in g(t)^2 = a^2 (1 - t) / t"""
    ratio: Literal["chain", "step"] = "chain"
    """PPO's unit: a decision, its ratio from the whole chain's log-likelihood (chain), or each chain transition
    with a ratio of its own (step: DPPO's denoising MDP; the chain's ratio then moves up to K times further per
    update, so it wants a smaller clip or lr)"""
    likelihood: Literal["chunk", "executed"] = "chunk"
    """the chunk elements the PPO ratio scores: all of the chunk the chain draws (chunk), or only the `execute`
    actions the env runs (executed; the rest never act, so their likelihood only adds noise to the ratio)"""
    clip: float = 0.1
    value_clip: float | None = None
    """clip the value update around the rollout's values (None: plain regression)"""
    value_coef: float = 0.5
    advantage_floor: float | None = None
    """clamp the minibatch-normalized advantages from below (0: only better-than-average decisions move the policy,
    as self-imitation learning does; below-average ones push the chain's mean away from its own samples). On PushT
    from a strong BC policy it fell more slowly than the plain update but still fell (bench/RESULTS.md, "Why online
    PPO lowers PushT")"""
    bc_coef: float = 0.0
    """weight of ||v - v_start||^2, the velocity's distance to the starting policy's at the chain's points. On PushT
    1.0 held a strong BC policy level where the unanchored update lowered it, and raised a half-trained one
    (bench/RESULTS.md, "PPO over the chain from a strong BC policy" and "The reward's weight on success")"""
    value_hidden: tuple[int, ...] = (256, 256)
    noise_hidden: tuple[int, ...] = (128, 128)
    """flow_noise: the noise network's hidden widths; latent / residual: the noise prior's / the residual's (a
    policy that has one keeps its own)"""
    prior_bound: float = 1.5
    """latent: the prior's mean stays in [-bound, bound] per element of x_0"""
    residual_bound: float = 0.3
    """residual: the correction stays in [-bound, bound] per chunk element (normalized action units)"""
    reward_type: Literal["dense", "sparse"] = "dense"
    reward_classifier: Path | None = None
    """a success classifier (`robotrl train classifier`) whose verdict replaces the env's reward and success in
    training (a robot's env gives none); evaluation still reports the task's own success"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy = Path(self.policy)
        if self.reward_classifier is not None:
            self.reward_classifier = Path(self.reward_classifier)
            if not self.reward_classifier.is_dir():
                raise FileNotFoundError(
                    f"{type(self).__name__}.reward_classifier: expected a classifier directory "
                    f"(robotrl train classifier), got {self.reward_classifier}"
                )
        name = type(self).__name__
        if self.method not in METHODS:
            raise ValueError(f"{name}.method: expected one of {METHODS}, got {self.method!r}")
        if self.ratio not in ("step", "chain"):
            raise ValueError(f"{name}.ratio: expected 'chain' or 'step', got {self.ratio!r}")
        if self.likelihood not in ("chunk", "executed"):
            raise ValueError(f"{name}.likelihood: expected 'chunk' or 'executed', got {self.likelihood!r}")
        for field in ("num_envs", "execute"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        if self.sampler_steps is not None and self.sampler_steps < 1:
            raise ValueError(f"{name}.sampler_steps: expected >= 1, got {self.sampler_steps}")
        for field in ("sde_noise", "clip", "prior_bound", "residual_bound"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{name}.{field}: expected > 0, got {getattr(self, field)}")
        if self.noise_std is not None and not self.noise_std > 0:
            raise ValueError(f"{name}.noise_std: expected > 0, got {self.noise_std}")
        if self.noise_std_end is not None and not self.noise_std_end > 0:
            raise ValueError(f"{name}.noise_std_end: expected > 0, got {self.noise_std_end}")
        if not 0 < self.noise_min < self.noise_max:
            raise ValueError(
                f"{name}.noise_min / noise_max: expected 0 < noise_min < noise_max, got "
                f"{self.noise_min}, {self.noise_max}"
            )
        CHAIN_METHODS[self.method].check(self, name)
        if self.advantage_floor is not None and not math.isfinite(self.advantage_floor):
            raise ValueError(f"{name}.advantage_floor: expected a finite number or None, got {self.advantage_floor}")
        for field in ("bc_coef", "value_coef"):
            if getattr(self, field) < 0:
                raise ValueError(f"{name}.{field}: expected >= 0, got {getattr(self, field)}")

    def initial_std(self) -> float:
        """`noise_std`, or the method's default (left unresolved in the config, so that `replace(method=...)`
        moves it along)."""
        return self.noise_std if self.noise_std is not None else CHAIN_METHODS[self.method].default_std


# ---------------------------------------------------------------------------------------------------
# the stochastic chain
# ---------------------------------------------------------------------------------------------------
def flow_sde_step(
    x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, dt: float, a: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Euler-Maruyama step of the marginal-preserving SDE of a rectified flow: (mean, std) of x_{t+dt} given x_t
    and the velocity v there; t (B,) in [0, 1 - dt]."""
    t = t.reshape(-1, *([1] * (x.dim() - 1)))
    tc = t.clamp(min=dt)  # g^2 = a^2 (1 - t) / t is infinite at the noise end: its first step uses t = dt
    mean = x + (v - a * a * (x - t * v) / (2 * tc)) * dt
    std = a * ((1 - t) / tc * dt).sqrt()
    return mean, std.expand_as(x)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std^2) summed over every dimension but the first."""
    z = (x - mean) / std
    return (-0.5 * z.square() - std.log() - 0.5 * math.log(2 * math.pi)).flatten(1).sum(1)


class NoiseNet(nn.Module):
    """Flow-Noise: (observation features, x_k, t_k) -> the std of every chunk element for the next transition,
    squashed into [low, high] and starting at `init` everywhere."""

    def __init__(
        self,
        feature_dim: int,
        chunk_shape: tuple[int, int],
        hidden: tuple[int, ...],
        low: float,
        high: float,
        init: float,
    ) -> None:
        super().__init__()
        self.chunk_shape, self.low, self.high = chunk_shape, low, high
        self.time = SinusoidalEmbedding(16, scale=10.0)
        size = chunk_shape[0] * chunk_shape[1]
        self.net = mlp([feature_dim + size + 16, *hidden, size], act=nn.Tanh)
        with torch.no_grad():
            last_linear(self.net).weight.mul_(0.01)
            # sigmoid^-1 of init's place in [low, high]
            last_linear(self.net).bias.fill_(math.log((init - low) / (high - init)))

    def forward(self, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.net(torch.cat([features, x.flatten(1), self.time(t)], dim=-1))
        return (self.low + (self.high - self.low) * torch.sigmoid(h)).reshape(-1, *self.chunk_shape)


# ---------------------------------------------------------------------------------------------------
# the methods (`--method`): one class each, how the chain is drawn and scored and what of the policy trains
# ---------------------------------------------------------------------------------------------------
class ChainMethod:
    """What a method of making the chain stochastic decides, all of it here; `FlowAgent` asks its method (the
    entry of `CHAIN_METHODS` that the config's `method` names) and branches on no name. The methods are stateless:
    the networks they read are the agent's (`policy`, `noise_net`, the `schedule` of transition stds)."""

    name: str
    head: str | None = None
    """the head of a frozen flow network that trains instead of the network (the policy's `prior` or `residual`),
    its action one Gaussian with a joint ratio; None: the flow network trains, the log-ratio per chunk element"""
    draws: tuple[str, ...] = ()
    """the heads a policy may carry that this method's rollouts draw through (a policy with another is refused)"""
    default_std = 0.1
    """the initial exploration std when the config's `noise_std` is None"""

    def check(self, config: ChainConfig, name: str) -> None:
        """Refuse settings this method cannot start from; `name` is the config class the error names."""

    def prepare(self, policy: FlowPolicy, config: ChainConfig) -> None:
        """Before the agent's networks are made: give the policy what this method trains."""

    def schedule(self, std: float, end: float, steps: int) -> torch.Tensor:
        """The std of each of the K transitions: linear from `noise_std` to `noise_std_end` along the chain."""
        return torch.linspace(std, end, steps)

    def noise_net(
        self, feature_dim: int, chunk_shape: tuple[int, int], config: ChainConfig, std: float
    ) -> NoiseNet | None:
        """The network that learns the transitions' std, for a method that has one."""
        return None

    def transition(
        self, agent: FlowAgent, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of x_{k+1} given x_k: the K-step chain methods' Gaussian transition."""
        raise NotImplementedError

    def sample(
        self,
        agent: FlowAgent,
        obs: dict[str, torch.Tensor],
        cond: torch.Tensor,
        features: torch.Tensor,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decision's stochastic chain from the policy's start noise `x`, given the observation windows, their
        conditioning and features: (the chain, the log-density of each of its stochastic transitions (B, n))."""
        raise NotImplementedError

    def log_prob(
        self, agent: FlowAgent, obs: dict[str, torch.Tensor], chain: torch.Tensor, reference: FlowPolicy | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-densities `sample` returned, recomputed from the stored chain under the current weights, and
        the mean squared distance of the velocities along it to `reference`'s (0 without one or without any)."""
        raise NotImplementedError


class DenoisingMDP(ChainMethod):
    """RL-100 / DPPO: each of the K Euler steps a Gaussian transition around x_k + v dt with a fixed exploration
    std (`schedule`), every transition scored. The other chain methods change its transition or what it scores."""

    name = "denoising_mdp"

    def transition(
        self, agent: FlowAgent, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of x_{k+1} given x_k, the velocity v at (x_k, t_k) and the step indices k (B,)."""
        dt = 1.0 / agent.steps
        mean = x + v * dt
        return mean, agent.schedule[k].reshape(-1, 1, 1).expand_as(x)

    def stochastic(self, k: int, steps: int) -> bool:
        """Whether transition k of the chain is stochastic (its log-density part of the decision's)."""
        return True

    def sample(
        self,
        agent: FlowAgent,
        obs: dict[str, torch.Tensor],
        cond: torch.Tensor,
        features: torch.Tensor,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x_0 .. x_K (B, K+1, H', A) and the log-density of each stochastic transition (B, K)."""
        chain, logp = [x], []
        for k in range(agent.steps):
            ks = torch.full((x.shape[0],), k, device=x.device)
            v = agent.policy.velocity(x, ks.to(x.dtype) / agent.steps, cond)
            mean, std = self.transition(agent, x, v, ks, features)
            x = mean + std * torch.randn_like(mean)
            chain.append(x)
            if self.stochastic(k, agent.steps):
                logp.append(agent.log_density(x, mean, std))
        return torch.stack(chain, 1), torch.stack(logp, 1)

    def log_prob(
        self, agent: FlowAgent, obs: dict[str, torch.Tensor], chain: torch.Tensor, reference: FlowPolicy | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All K transitions at once (B, K), and the velocity gap at the chain's points."""
        policy = agent.policy
        b, k = chain.shape[0], agent.steps
        x = chain[:, :-1].reshape(b * k, *chain.shape[2:])
        ks = torch.arange(k, device=chain.device).repeat(b)
        cond = policy.encoder(obs).repeat_interleave(k, 0)
        v = policy.velocity(x, ks.to(x.dtype) / agent.steps, cond)
        mean, std = self.transition(agent, x, v, ks, agent.features(obs).repeat_interleave(k, 0))
        logp = agent.log_density(chain[:, 1:].reshape(b * k, *chain.shape[2:]), mean, std).reshape(b, k)
        gap = torch.zeros((), device=chain.device)
        if reference is not None:
            with torch.no_grad():
                cond_ref = reference.encoder(obs).repeat_interleave(k, 0)
                v_ref = reference.velocity(x, ks.to(x.dtype) / agent.steps, cond_ref)
            gap = (v - v_ref).square().mean()
        return logp, gap


class FlowSDE(DenoisingMDP):
    """pi_RL's Flow-SDE: each transition an Euler-Maruyama step of the SDE with the ODE's marginals
    (`flow_sde_step`, a = `sde_noise`)."""

    name = "flow_sde"

    def transition(
        self, agent: FlowAgent, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dt = 1.0 / agent.steps
        t = k.to(x.dtype) / agent.steps
        return flow_sde_step(x, v, t, dt, agent.sde_noise)


class FlowNoise(DenoisingMDP):
    """pi_RL's Flow-Noise: mean x_k + v dt, and a per-element std that a small noise network (`NoiseNet`) learns by
    the PPO loss, in [noise_min, noise_max]."""

    name = "flow_noise"
    default_std = 0.2

    def check(self, config: ChainConfig, name: str) -> None:
        if not config.noise_min < config.initial_std() < config.noise_max:
            raise ValueError(
                f"{name}.noise_std: expected the initial std inside (noise_min, noise_max) = "
                f"({config.noise_min}, {config.noise_max}) for flow_noise, got {config.initial_std()}"
            )

    def noise_net(
        self, feature_dim: int, chunk_shape: tuple[int, int], config: ChainConfig, std: float
    ) -> NoiseNet | None:
        return NoiseNet(feature_dim, chunk_shape, config.noise_hidden, config.noise_min, config.noise_max, std)

    def transition(
        self, agent: FlowAgent, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dt = 1.0 / agent.steps
        t = k.to(x.dtype) / agent.steps
        mean = x + v * dt
        assert agent.noise_net is not None
        return mean, agent.noise_net(features, x, t)


class OdeNoise(DenoisingMDP):
    """The policy's own deterministic Euler ODE from its drawn x_0 (transitions of std 0), and Gaussian noise of std
    `noise_std` on the chunk it ends in: one scored transition, whose mean, the whole ODE, is recomputed with
    gradients from the stored x_0."""

    name = "ode_noise"
    default_std = 0.2

    def schedule(self, std: float, end: float, steps: int) -> torch.Tensor:
        return torch.zeros(steps).index_fill_(0, torch.tensor([steps - 1]), std)

    def stochastic(self, k: int, steps: int) -> bool:
        return k == steps - 1

    def log_prob(
        self, agent: FlowAgent, obs: dict[str, torch.Tensor], chain: torch.Tensor, reference: FlowPolicy | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drawn chunk's log-density around the ODE's end from the stored x_0 (B, 1), the ODE run step by step
        so that the gradient reaches every step of it, and the velocity gap along it."""
        policy = agent.policy
        cond, dt = policy.encoder(obs), 1.0 / agent.steps
        with torch.no_grad():
            cond_ref: Any = reference.encoder(obs) if reference is not None else None
        x, gaps = chain[:, 0], []
        for k in range(agent.steps):
            v = policy.velocity(x, k * dt, cond)
            if reference is not None:
                with torch.no_grad():
                    v_ref = reference.velocity(x, k * dt, cond_ref)
                gaps.append((v - v_ref).square().mean())
            x = x + v * dt
        logp = agent.log_density(chain[:, -1], x, agent.schedule[-1].expand_as(x))[:, None]
        gap = torch.stack(gaps).mean() if gaps else torch.zeros((), device=chain.device)
        return logp, gap


class FrozenFlowHead(ChainMethod):
    """A head of a frozen U-Net flow network trains alone (`head`): the policy gets it here unless it has one, and
    every other weight of the policy stops training."""

    def prepare(self, policy: FlowPolicy, config: ChainConfig) -> None:
        if not isinstance(policy.config, GenerativeConfig):
            raise ValueError(
                f"{type(config).__name__}.method: {config.method!r} trains a {self.head} of a U-Net flow "
                f"policy; a {policy.name!r} policy has none (use flow_sde)"
            )
        self.add_head(policy, config)
        for name, p in policy.named_parameters():
            p.requires_grad_(name.startswith(f"{self.head}."))

    def add_head(self, policy: FlowPolicy, config: ChainConfig) -> None:
        raise NotImplementedError


class Latent(FrozenFlowHead):
    """DSRL: a Gaussian prior over the chain's initial noise x_0 given the observation trains (starting as N(0, I),
    the BC policy), x_0 -> chunk the policy's own deterministic ODE; the scored action is x_0."""

    name, head, draws = "latent", "prior", ("prior",)

    def add_head(self, policy: FlowPolicy, config: ChainConfig) -> None:
        if policy.prior is None:
            policy.add_noise_prior(config.noise_hidden, config.prior_bound)

    def sample(
        self,
        agent: FlowAgent,
        obs: dict[str, torch.Tensor],
        cond: torch.Tensor,
        features: torch.Tensor,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_0, chunk) (B, 2, H', A) and x_0's log-density (B, 1)."""
        mean, std = agent.prior(features)
        x0 = mean + std * x
        chunk = agent.policy.integrate(x0, cond, agent.steps)
        return torch.stack([x0, chunk], 1), gaussian_log_prob(x0, mean, std)[:, None]

    def log_prob(
        self, agent: FlowAgent, obs: dict[str, torch.Tensor], chain: torch.Tensor, reference: FlowPolicy | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = agent.prior(agent.features(obs))
        return gaussian_log_prob(chain[:, 0], mean, std)[:, None], torch.zeros((), device=chain.device)


class Residual(FrozenFlowHead):
    """ResiP at the chunk level: a Gaussian correction of the ODE's chunk given the observation trains (mean zero at
    first, std `noise_std` then learned); the scored action is the corrected chunk."""

    name, head, draws = "residual", "residual", ("prior", "residual")

    def add_head(self, policy: FlowPolicy, config: ChainConfig) -> None:
        if policy.residual is None:
            policy.add_action_residual(config.noise_hidden, config.residual_bound, config.initial_std())

    def corrected(
        self, agent: FlowAgent, base: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The corrected chunk's Gaussian (mean, std) around the ODE's chunk `base` (B, horizon, A)."""
        assert agent.policy.residual is not None, "residual: the policy's residual is added in FlowAgent.__init__"
        mean, std = agent.policy.residual(features)
        return base + mean, std

    def sample(
        self,
        agent: FlowAgent,
        obs: dict[str, torch.Tensor],
        cond: torch.Tensor,
        features: torch.Tensor,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the noise's first rows, the ODE's chunk from them, the corrected chunk drawn with the rest of the noise)
        (B, 3, H', A) and the corrected chunk's log-density (B, 1)."""
        h = agent.chunk_shape[0]
        base = agent.policy.integrate(agent.policy.initial_noise(obs, x), cond, agent.steps)
        mean, std = self.corrected(agent, base, features)
        chunk = mean + std * x[:, h:]
        return torch.stack([x[:, :h], base, chunk], 1), agent.log_density(chunk, mean, std)[:, None]

    def log_prob(
        self, agent: FlowAgent, obs: dict[str, torch.Tensor], chain: torch.Tensor, reference: FlowPolicy | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = self.corrected(agent, chain[:, 1], agent.features(obs))
        return agent.log_density(chain[:, 2], mean, std)[:, None], torch.zeros((), device=chain.device)


#: `--method` -> the method
CHAIN_METHODS: dict[str, ChainMethod] = {
    m.name: m for m in (DenoisingMDP(), FlowSDE(), FlowNoise(), OdeNoise(), Latent(), Residual())
}
METHODS = tuple(CHAIN_METHODS)
#: methods that train a head of a frozen flow network (its prior or residual), with a Gaussian over one action
HEADS = {name: m.head for name, m in CHAIN_METHODS.items() if m.head is not None}


# ---------------------------------------------------------------------------------------------------
# the agent, its starting checkpoint and its env
# ---------------------------------------------------------------------------------------------------
class FlowAgent(nn.Module):
    """The flow policy being fine-tuned, its value network and (Flow-Noise) its noise network: one module, so that
    the train state holds them together. For `latent` / `residual` the policy gets its noise prior / chunk
    residual here (unless it has one) and only that head trains. How the chain is drawn and scored is its
    method's (`method`, an entry of `CHAIN_METHODS`)."""

    schedule: torch.Tensor

    def __init__(self, policy: FlowPolicy, config: ChainConfig, steps: int) -> None:
        super().__init__()
        self.policy, self.steps = policy, steps
        self.method = method = CHAIN_METHODS[config.method]
        method.prepare(policy, config)
        ignored = [h for h in ("residual", "prior") if getattr(policy, h, None) is not None and h not in method.draws]
        if ignored:  # the rollouts would not draw what the saved policy samples
            drawing = " or ".join(m.name for m in CHAIN_METHODS.values() if ignored[0] in m.draws)
            raise ValueError(
                f"{type(config).__name__}.method: {config.method!r} would ignore the {ignored[0]} this "
                f"policy was given by online RL; continue it with --method {drawing}"
            )
        self.sde_noise = config.sde_noise
        std = config.initial_std()
        end = std if config.noise_std_end is None else config.noise_std_end
        self.register_buffer("schedule", method.schedule(std, end, steps), persistent=False)
        window = policy.obs_horizon
        #: the value, noise and head networks' input size: `features`
        self.feature_dim = feature_dim = sum(window * policy.spec.observations[k].size for k in policy.vector_keys)
        self.value_net = mlp([feature_dim, *config.value_hidden, 1], act=nn.Tanh)
        self.chunk_shape = (policy.horizon, policy.action_dim)
        #: leading chunk steps whose likelihood the ratio scores (`likelihood`)
        self.scored = policy.horizon if config.likelihood == "chunk" else min(config.execute, policy.horizon)
        #: the log-ratio is divided by this: per chunk element for the chain methods (DPPO), joint for the heads
        self.ratio_elements = 1 if method.head is not None else self.scored * policy.action_dim
        self.noise_net = method.noise_net(feature_dim, self.chunk_shape, config, std)

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The value (and noise) network's input: the policy's normalized vector observations, window flattened."""
        return self.policy.vector_features(obs)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.value_net(self.features(obs)).squeeze(-1)

    def transition(
        self, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of x_{k+1} given x_k, the velocity v at (x_k, t_k) and the step indices k (B,) (the K-step
        chain methods)."""
        return self.method.transition(self, x, v, k, features)

    @torch.no_grad()
    def sample_chain(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A stochastic chain for normalized observation windows, drawn from the policy's start noise by the method:
        (x_0 .. x_K (B, K+1, H', A) for the K-step chain methods, the log-density of each stochastic transition)."""
        cond, features = self.policy.encoder(obs), self.features(obs)
        return self.method.sample(self, obs, cond, features, self.policy.noise(cond.shape[0], cond.device))

    def log_density(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """A transition's log-density over the scored chunk steps (B, H', A) -> (B,)."""
        h = self.scored
        return gaussian_log_prob(x[:, :h], mean[:, :h], std.expand_as(mean)[:, :h])

    def chain_log_prob(
        self, obs: dict[str, torch.Tensor], chain: torch.Tensor, reference: FlowPolicy | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-density of each stored stochastic transition under the current weights (B, K), all K at once
        (ode_noise: (B, 1), its ODE recomputed from x_0), and the mean squared distance of the velocities there to
        `reference`'s (0 without one)."""
        return self.method.log_prob(self, obs, chain, reference)

    @property
    def prior(self) -> NoisePrior:
        assert self.policy.prior is not None, "latent: the policy's noise prior is added in FlowAgent.__init__"
        return self.policy.prior

    def chunk(self, chain: torch.Tensor) -> np.ndarray:
        """The env's action chunk (B, H, A) from the chain's end: unnormalized and clipped to the action bounds,
        as `Policy.act` does."""
        policy = self.policy
        chunk = policy.normalizer.unnormalize("action", chain[:, -1, : policy.action_horizon])
        low = torch.as_tensor(policy.spec.action.low_array(), dtype=chunk.dtype, device=chunk.device)
        high = torch.as_tensor(policy.spec.action.high_array(), dtype=chunk.dtype, device=chunk.device)
        return torch.clamp(chunk, low, high).cpu().numpy()


def training_env(policy: FlowPolicy, config: ChainConfig) -> Any:
    """The policy's task on training seeds, configured as its data was; with `reward_classifier`, rendering the
    classifier's camera and rewarded by it."""
    if config.reward_classifier is None:
        return make_eval_env(
            policy.spec, tuple(policy.obs_keys), config.num_envs, config.seed, reward_type=config.reward_type
        )
    from robotrl.flowrl.classifier import ClassifierReward, load

    classifier = load(config.reward_classifier)
    env = make_eval_env(
        policy.spec,
        tuple(policy.obs_keys),
        config.num_envs,
        config.seed,
        reward_type=config.reward_type,
        render_images=True,
    )
    return ClassifierReward(env, classifier)


def load_flow_policy(path: Path, steps: int | None, field: str = "OnlineConfig.policy") -> FlowPolicy:
    """The starting checkpoint, refused unless it is a flow policy; its sampler set to the chain's Euler steps.
    `field` names the config field in errors."""
    policy = load(path)
    if not isinstance(policy, FlowPolicy):  # a bad value of the config's field, as the CLI reports them
        raise ValueError(
            f"{field}: expected a flow policy checkpoint (robotrl train bc policy:flow), got a "
            f"{policy.name!r} policy at {path}"
        )
    if not policy.vector_keys:
        raise ValueError(
            f"{field}: expected a policy with vector observations for the value network, "
            f"got only {list(policy.obs_keys)} at {path}"
        )
    policy.config.steps, policy.config.solver = steps or policy.config.steps, "euler"
    return policy


# ---------------------------------------------------------------------------------------------------
# observation windows and the semi-MDP rollout
# ---------------------------------------------------------------------------------------------------
def shifted(frames: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A window (B, To, ...) moved on by one frame x (B, ...)."""
    return np.concatenate([frames[:, 1:], x[:, None]], axis=1)


class Windows:
    """Per-env windows of the last `horizon` observations, a new episode's first frame repeated (as the
    ChunkController and the training windows pad an episode's start), and the current value of each text
    observation (a VLA's instruction)."""

    def __init__(self, keys: tuple[str, ...], horizon: int, text_keys: tuple[str, ...] = ()) -> None:
        self.keys, self.horizon, self.text_keys = keys, horizon, text_keys
        self.frames: dict[str, np.ndarray] = {}

    def start(self, obs: dict[str, Any]) -> None:
        self.frames = {k: np.repeat(np.asarray(obs[k])[:, None], self.horizon, axis=1) for k in self.keys}
        self.frames.update({k: np.asarray(obs[k], dtype=object).copy() for k in self.text_keys})

    def advance(self, obs: dict[str, Any], new_episode: np.ndarray) -> None:
        for k in self.keys:
            x = np.asarray(obs[k])
            self.frames[k] = shifted(self.frames[k], x)
            self.frames[k][new_episode] = x[new_episode, None]
        self.frames.update({k: np.asarray(obs[k], dtype=object).copy() for k in self.text_keys})

    def final(self, obs: dict[str, Any], idx: np.ndarray) -> dict[str, np.ndarray]:
        """The windows of envs `idx` moved on to their episode's final observations `obs` (all envs)."""
        out = {k: shifted(self.frames[k][idx], np.asarray(obs[k])[idx]) for k in self.keys}
        return {**out, **{k: np.asarray(obs[k], dtype=object)[idx] for k in self.text_keys}}

    def state(self) -> dict[str, Any]:
        return {
            k: torch.from_numpy(v.copy()) if k in self.keys else [str(x) for x in v] for k, v in self.frames.items()
        }

    def load(self, state: dict[str, Any]) -> None:
        self.frames = {k: v.numpy().copy() if k in self.keys else np.asarray(v, dtype=object) for k, v in state.items()}


class Tally:
    """Return and success of every env's running episode, and of the episodes that ended (train metrics)."""

    def __init__(self, num_envs: int) -> None:
        self.ret, self.succ = np.zeros(num_envs), np.zeros(num_envs, bool)
        self.returns: list[float] = []
        self.success: list[bool] = []

    def step(self, reward: np.ndarray, success: np.ndarray, ended: np.ndarray) -> None:
        self.ret += reward
        self.succ |= success
        for i in np.nonzero(ended)[0]:
            self.returns.append(float(self.ret[i]))
            self.success.append(bool(self.succ[i]))
            self.ret[i], self.succ[i] = 0.0, False

    def state(self) -> dict[str, Any]:
        return {
            "ret": torch.from_numpy(self.ret.copy()),
            "succ": torch.from_numpy(self.succ.copy()),
            "returns": list(self.returns),
            "success": list(self.success),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.ret, self.succ = state["ret"].numpy().copy(), state["succ"].numpy().copy()
        self.returns, self.success = list(state["returns"]), list(state["success"])


class Operator(Protocol):
    """Someone who may drive envs instead of the policy during a rollout (robotrl/flowrl/hil.py: the task's expert or a
    teleop device), consulted at every env step: `wants` before it (a change of hands starts a new decision),
    `decide` for the decisions that start (given the policy's proposed first actions), `act` for the actions of
    the envs it drives, and `observe` for the step's outcome."""

    def wants(self) -> np.ndarray:
        """(n,) bool: the envs the operator means to drive now."""

    def decide(self, idx: np.ndarray, proposal: np.ndarray) -> np.ndarray:
        """(len(idx),) bool: whether the operator drives the decisions starting in envs `idx`, whose chunks the
        policy proposes to start with `proposal` (len(idx), A) (env units)."""

    def act(self) -> np.ndarray:
        """(n, A): the operator's actions for the current observations (used in the envs it drives)."""

    def observe(
        self,
        action: np.ndarray,
        operated: np.ndarray,
        next_obs: dict[str, Any],
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any],
    ) -> None:
        """The step taken: the actions executed, which envs the operator drove, and what the env returned."""


def rollout(
    agent: FlowAgent,
    env: Any,
    windows: Windows,
    steps: int,
    execute: int,
    gamma: float,
    tally: Tally,
    operator: Operator | None = None,
    dense_scale: float = 1.0,
) -> dict[str, Any]:
    """`steps` env steps in every env. A decision starts when an env's chunk is used up or its episode begins, and
    every env starts afresh at the first step (a decision never spans two rollouts). Per decision, in the order
    they were taken: the normalized window, the chain and its transitions' log-densities, the value, the env, the
    discounted reward of its k steps (a time-limit cut bootstrapped from the final window's value), gamma^k,
    whether its episode ended; and the value of every env's window after the last step. Rewards below success are
    scaled by `dense_scale` (the tally keeps the env's own).

    With an `operator`, each decision is the policy's or the operator's (`operated`: its actions came from the
    operator, step by step, so `ppo_loss` keeps it out of the ratio; its rewards still count in the returns), and
    a change of hands mid-chunk starts a new decision."""
    policy, n = agent.policy, env.num_envs
    chunk = np.zeros((n, policy.action_horizon, policy.action_dim), np.float32)
    cursor, current, disc = np.full(n, execute), np.zeros(n, np.int64), np.ones(n)
    taken: dict[str, list[Any]] = {"obs": [], "chain": [], "logp": [], "value": [], "env": []}
    reward, discount, done = np.zeros(n * steps), np.ones(n * steps), np.zeros(n * steps)
    operated, operated_taken = np.zeros(n, bool), []
    count = 0
    for _ in range(steps):
        if operator is not None:
            cursor[operator.wants() != operated] = execute
        idx = np.nonzero(cursor >= execute)[0]
        if len(idx):
            obs = policy.normalize_obs({k: v[idx] for k, v in windows.frames.items()})
            chain, logp = agent.sample_chain(obs)
            with torch.no_grad():
                value = agent.value(obs)
            for key, x in zip(taken, (obs, chain, logp, value, idx)):
                taken[key].append(x)
            chunk[idx] = agent.chunk(chain)
            if operator is not None:
                operated[idx] = operator.decide(idx, chunk[idx, 0])
                operated_taken.append(operated[idx].copy())
            current[idx] = np.arange(count, count + len(idx))
            count += len(idx)
            cursor[idx], disc[idx] = 0, 1.0
        action = chunk[np.arange(n), cursor]
        if operator is not None:
            action = np.where(operated[:, None], operator.act(), action).astype(np.float32)
        next_obs, raw_reward, terminated, truncated, info = env.step(action)
        if operator is not None:
            operator.observe(action, operated.copy(), next_obs, raw_reward, terminated, truncated, info)
        cursor += 1
        reward[current] += disc * np.where(info["success"], raw_reward, dense_scale * raw_reward)
        disc *= gamma
        discount[current] = disc
        ended = terminated | truncated
        cut = np.nonzero(truncated & ~terminated)[0]
        if len(cut):
            final = policy.normalize_obs(windows.final(info["final_obs"], cut))
            with torch.no_grad():
                reward[current[cut]] += disc[cut] * agent.value(final).cpu().numpy()
        done[current[ended]] = 1.0
        windows.advance(next_obs, ended)
        cursor[ended] = execute
        tally.step(raw_reward, info["success"], ended)
    with torch.no_grad():
        last_value = agent.value(policy.normalize_obs(windows.frames)).cpu().numpy()
    out: dict[str, Any] = {
        "obs": {k: torch.cat([o[k] for o in taken["obs"]]) for k in taken["obs"][0]},
        "chain": torch.cat(taken["chain"]),
        "logp": torch.cat(taken["logp"]),
        "value": torch.cat(taken["value"]),
        "env": np.concatenate(taken["env"]),
        "reward": reward[:count],
        "discount": discount[:count],
        "done": done[:count],
        "last_value": last_value,
    }
    if operator is not None:
        out["operated"] = torch.from_numpy(np.concatenate(operated_taken)).to(out["value"].device)
    return out


# ---------------------------------------------------------------------------------------------------
# what the learners share at the end: PPO's clipped loss over chains, and a run whose result is a policy
# ---------------------------------------------------------------------------------------------------
def ppo_loss(
    agent: FlowAgent, batch: dict[str, Any], config: ChainConfig, actor: bool, reference: FlowPolicy | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate over chain transitions or whole chains + value regression (+ the velocity regularizer);
    the value loss alone while the critic warms up. Decisions marked `operated` (an operator's, robotrl/flowrl/hil.py)
    train the value only: their actions were not drawn from the policy's chain."""
    v = agent.value(batch["obs"])
    value_loss = (v - batch["ret"]).square()
    if config.value_clip is not None:
        clipped = batch["value"] + (v - batch["value"]).clamp(-config.value_clip, config.value_clip)
        value_loss = torch.max(value_loss, (clipped - batch["ret"]).square())
    value_loss = 0.5 * value_loss.mean()
    stats = {"loss/value": value_loss.item()}
    if "operated" in batch:
        own = ~batch["operated"]
        batch = {
            **{k: batch[k][own] for k in ("chain", "logp", "adv")},
            "obs": {k: x[own] for k, x in batch["obs"].items()},
        }
        actor = actor and bool(own.any())
    if not actor:
        return config.value_coef * value_loss, stats
    logp, gap = agent.chain_log_prob(batch["obs"], batch["chain"], reference if config.bc_coef > 0 else None)
    logratio = (logp - batch["logp"]) / agent.ratio_elements  # (B, K)
    if config.ratio == "chain":
        logratio = logratio.sum(1, keepdim=True)
    ratio = logratio.exp()
    adv = batch["adv"]
    adv = ((adv - adv.mean()) / (adv.std(correction=0) + 1e-8))[:, None]  # a minibatch may hold one decision
    if config.advantage_floor is not None:
        adv = adv.clamp(min=config.advantage_floor)
    policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - config.clip, 1 + config.clip)).mean()
    loss = policy_loss + config.value_coef * value_loss + config.bc_coef * gap
    with torch.no_grad():
        stats.update(
            {
                "loss/policy": policy_loss.item(),
                "loss/bc": gap.item(),
                "approx_kl": ((ratio - 1) - logratio).mean().item(),
                "clip_frac": ((ratio - 1).abs() > config.clip).float().mean().item(),
            }
        )
    return loss, stats


def finish_policy_run(
    config: PolicyRunOptions,
    log: RunLog,
    evaluate: Any,
    policy: FlowPolicy,
    clock: TrainClock,
    run_dir: Path,
    iterations: int,
    start: int,
    per_iteration: int,
    best: BestCheckpoint,
) -> RLResult:
    """`finish_iterations` for a run whose result is `run_dir/policy` (its last weights; `best` keeps the best
    evaluated ones); saved here when a finished run was resumed (no iteration ran to save it)."""
    if start >= iterations:
        policy.save(run_dir / "policy")
    return finish_iterations(
        config, log, evaluate, run_dir / "policy", clock, run_dir, iterations, start, per_iteration, best
    )
