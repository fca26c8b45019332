"""Online RL fine-tuning of a flow policy in the parallel vector env: PPO over stochastic denoising chains.

    robotrl train online --policy runs/bc-flow/policy --method flow_sde --num-envs 32 --total-steps 300000
    result = robotrl.flowrl.online.train(OnlineConfig(policy=Path("runs/bc-flow/policy")))     # the same dataclass

The decision is an action chunk. The policy draws it by a stochastic K-step Euler chain x_0 ~ N(0, I), x_{k+1} ~
N(mean_k, std_k^2 I) from t = 0 (noise) to t = 1 (the chunk), the env executes `execute` actions of it (the
rewards summed with the per-step discount: a semi-MDP), then the next chunk is drawn from the next observation
window, as the ChunkController does at evaluation. Every transition of the chain is Gaussian, so the chain's
log-likelihood is exact: the sum of the K transitions' log-densities. The rollout keeps the whole chain, so the
PPO ratio is recomputed from it under the new weights. Three ways to make the chain stochastic (`--method`):

  denoising_mdp  RL-100 / DPPO: mean_k = x_k + v dt, a fixed exploration std (optionally scheduled along the chain)
  flow_sde       pi_RL's Flow-SDE: the ODE turned into the SDE with the same marginals. For x_t = (1 - t) x0 + t x1,
                 E[x0 | x_t] = x_t - t v, so the score is -(x_t - t v) / (1 - t), and dx = (v + g^2/2 score) dt + g dW
                 keeps every marginal of the ODE for any g. g(t)^2 = a^2 (1 - t) / t (Flow-GRPO's schedule in this
                 time direction; t clamped at dt on the first step), so the drift is v - a^2 (x - t v) / (2 t).
  flow_noise     pi_RL's Flow-Noise: mean_k = x_k + v dt and std_k from a small learned noise network
                 (observation window, x_k, t_k) -> per-element std in [noise_min, noise_max], trained by the PPO loss.
  ode_noise      the policy's own deterministic Euler ODE from its drawn x_0, and Gaussian noise of std `noise_std`
                 on the chunk it ends in: one stochastic transition, its mean the whole ODE (recomputed with
                 gradients from the stored x_0, exogenous noise the likelihood is conditioned on), so the deployed
                 ODE is the exploring policy's mean and the score carries one chunk's noise where the chain methods
                 carry K transitions' (whose late, small stds dominate the gradient's size). On Reach it gains as
                 flow_sde does (51% -> 96%); on PushT it has no more gradient signal (bench/pg_snr.py).
  latent         DSRL (Wagenmaker et al. 2025): the flow network is frozen and PPO trains a Gaussian prior over
                 the chain's initial noise x_0 given the observation (`GenerativeConfig.noise_prior`, starting as
                 N(0, I), i.e. as the BC policy), x_0 -> chunk being the policy's own deterministic Euler ODE. The
                 action PPO sees is x_0: one Gaussian with an exact density, a small network, and no update that can
                 unlearn the demonstrations, since the imitating network never moves; the clip applies to the
                 joint ratio of x_0 (the other methods average the log-ratio per element, DPPO's convention).
  residual       ResiP (Ankile et al. 2024) at the chunk level: the flow network is frozen, and PPO trains a
                 Gaussian correction of its ODE's chunk given the observation (`GenerativeConfig.action_residual`:
                 mean zero at first, std `noise_std` then learned). What RL learns is a small correction where
                 imitation is close but not exact; the correction's noise stays in the saved policy (on PushT the
                 mean alone scored below the BC policy where mean and noise scored above it). Joint ratio, as latent.

The PPO unit (`--ratio`): `chain` clips one ratio per decision from the chain's summed log-likelihood (pi_RL's
one-layer MDP); `step` gives every transition of a chain its own clipped ratio and its decision's advantage (the
denoising MDP of DPPO, pi_RL's two-layer MDP). Log-ratios are averaged over the chunk's elements (DPPO), so that
the clip range means the same for any chunk size. On Reach, `step` with the same clip drifted and lost success
where `chain` gained it. Besides: a value network on the decision's normalized observation window, GAE over
decisions (gamma^k for a k-step decision), a time-limit cut bootstrapped from the value of the final window, a
value loss (optionally clipped), a value-only warm-up, and an optional velocity regularizer towards the start.

The fine-tuned policy is saved as an ordinary checkpoint (`run_dir/policy`: the same FlowPolicy, its sampler set to
the chain's K Euler steps, deterministic at evaluation and deployment), so `robotrl eval`, `robotrl distill
--teacher` and `robotrl export` take it unchanged. The loop needs of a policy only FlowPolicy's `encoder`
(conditioning) and `velocity`, so the VLA (a FlowPolicy whose velocity net is its action expert) runs through it
as it is, its instruction carried with the observation windows; the value and noise networks read the policy's
normalized vector observations. A killed run resumes exactly from its last iteration (`--resume`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from robotrl.core.spec import STRING
from robotrl.policies import load
from robotrl.policies.flow import FlowPolicy
from robotrl.policies.generative import GenerativeConfig, NoisePrior
from robotrl.policies.nets import SinusoidalEmbedding, mlp
from robotrl.training.evaluate import HELD_OUT_SEED, evaluate_policy, make_eval_env
from robotrl.training.loop import (
    EMA,
    BestCheckpoint,
    RLResult,
    RunLog,
    RunOptions,
    TrainClock,
    check_device,
    check_finite_weights,
    finish_iterations,
    load_run_state,
    optimizer_step,
    save_run_state,
    start_run,
)

METHODS = ("denoising_mdp", "flow_sde", "flow_noise", "ode_noise", "latent", "residual")
#: methods that train a head of a frozen flow network (its prior or residual), with a Gaussian over one action
HEADS = {"latent": "prior", "residual": "residual"}


@dataclass
class OnlineConfig(RunOptions):
    """Fine-tune a flow policy checkpoint with PPO over its stochastic denoising chain in the parallel vector env."""

    policy: Path = Path("runs/bc-flow/policy")
    """the flow policy checkpoint to start from (`robotrl train bc --policy flow` output)"""
    method: Literal["denoising_mdp", "flow_sde", "flow_noise", "ode_noise", "latent", "residual"] = "latent"
    """how the policy explores and what trains (module docstring): latent learned Reach fastest in bench/flow_rl.py
    (100% at 43,200 env steps; flow_sde 96.5% at 86,400) and, its flow network frozen, cannot lose what BC learned
    (flow_sde lowered PushT from 79% to 6%)"""
    num_envs: int = 32
    total_steps: int = 300_000
    """environment steps, all envs together"""
    rollout_steps: int = 120
    """env steps per env between updates (a multiple of `execute` keeps every decision whole)"""
    execute: int = 8
    """actions executed from each chunk before the next decision (and at evaluation)"""
    denoise_steps: int | None = None
    """K: Euler steps of the chain (default: the policy's sampler steps); the saved policy samples with K too"""
    noise_std: float | None = None
    """denoising_mdp: std of each transition (normalized action units; default 0.1); flow_noise: the noise net's
    initial std (default 0.2: from 0.1 it gained 12 points on Reach in 86,400 steps, from 0.2 34); ode_noise: the
    std of the noise on the ODE's chunk (default 0.2); residual: the initial std of the noise on the corrected
    chunk (default 0.1)"""
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
    gamma: float = 0.95
    """discount per env step"""
    gae_lambda: float = 0.9
    clip: float = 0.1
    value_clip: float | None = None
    """clip the value update around the rollout's values (None: plain regression)"""
    value_coef: float = 0.5
    epochs: int = 4
    minibatch_size: int = 64
    """decisions per minibatch (a decision costs K velocity evaluations)"""
    lr: float = 3e-5
    """the flow policy's learning rate"""
    critic_lr: float = 1e-3
    noise_lr: float = 3e-4
    """flow_noise: the noise network's learning rate; latent / residual: the prior's / residual's (and its std's)"""
    max_grad_norm: float = 1.0
    ema: float = 0.0
    """decay per update (one rollout's epochs) of an average of the policy's weights, started at the start's, that is
    evaluated and saved instead of the last weights (0: the last; 0.8 averages ~5 updates); rollouts use the live
    weights, as PPO's ratio needs. BC saves its average too: one noisy update can cost what a run gained"""
    critic_warmup: int = 3
    """iterations that train only the value network (its first estimates are random)"""
    advantage_floor: float | None = None
    """clamp the minibatch-normalized advantages from below (0: only better-than-average decisions move the policy,
    as self-imitation learning does; below-average ones push the chain's mean away from its own samples). On PushT
    from 79% BC it fell more slowly than the plain update but still fell (bench/RESULTS.md)"""
    bc_coef: float = 0.0
    """weight of ||v - v_start||^2, the velocity's distance to the starting policy's at the chain's points. On PushT
    from a 79% BC policy the unanchored update fell to 6% in 102k env steps; 1.0 held it at 80%, and from a 53% one
    raised it to 62% (bench/RESULTS.md)"""
    value_hidden: tuple[int, ...] = (256, 256)
    noise_hidden: tuple[int, ...] = (128, 128)
    """flow_noise: the noise network's hidden widths; latent / residual: the noise prior's / the residual's (a
    policy that has one keeps its own)"""
    prior_bound: float = 1.5
    """latent: the prior's mean stays in [-bound, bound] per element of x_0"""
    residual_bound: float = 0.3
    """residual: the correction stays in [-bound, bound] per chunk element (normalized action units)"""
    reward_type: Literal["dense", "sparse"] = "dense"
    dense_scale: float = 1.0
    """the dense reward below success is multiplied by this in training (success stays 1): PushT's shaping scores
    a near miss at ~0.96 of a success, so with 1.0 the return barely tells them apart. On PushT from a 55% BC
    policy, 0.1 fell to 5.5% in 51,200 env steps (1.0: 58%); with `advantage_floor` 0, to 47% (bench/RESULTS.md):
    the rarer the high-return decisions, the more of the update pushes the chain away from its own samples"""
    reward_classifier: Path | None = None
    """a success classifier (`robotrl train classifier`) whose verdict replaces the env's reward and success in
    training (a robot's env gives none); evaluation still reports the task's own success"""
    device: str = "cpu"
    """torch device of the policy, value and noise networks ("cuda"): the envs step on the CPU; a GPU runs the chain's
    sampling and the PPO update over a large rollout's thousands of decisions, which PushT's gradient needs (~6,400
    for a signal-to-noise ratio of 1, bench/RESULTS.md)"""
    eval_seed: int = HELD_OUT_SEED
    """first seed of the run's evaluations (periodic and final): the held-out ones by default; `robotrl run` picks
    the best checkpoint on training seeds, so the seeds its table reports took no part in the choice"""
    eval_sampler_steps: int | None = None
    """Euler steps of the sampler in the run's evaluations (default: the policy's own), so the best checkpoint kept
    is the best for the sampler that will be deployed: 1 for a task whose one-step stage keeps the teacher's one-step
    sampler (on PickPlace it scored 96.2% where the same weights' ten-step samples scored 82.2%, bench/RESULTS.md)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_device(self.device, f"{type(self).__name__}.device")
        self.policy = Path(self.policy)
        if self.reward_classifier is not None:
            self.reward_classifier = Path(self.reward_classifier)
            if not self.reward_classifier.is_dir():
                raise FileNotFoundError(f"{type(self).__name__}.reward_classifier: expected a classifier directory "
                                        f"(robotrl train classifier), got {self.reward_classifier}")
        name = type(self).__name__
        if self.method not in METHODS:
            raise ValueError(f"{name}.method: expected one of {METHODS}, got {self.method!r}")
        if self.eval_sampler_steps is not None and self.eval_sampler_steps < 1:
            raise ValueError(f"{name}.eval_sampler_steps: expected >= 1 (or None: the policy's own), got "
                             f"{self.eval_sampler_steps}")
        if self.ratio not in ("step", "chain"):
            raise ValueError(f"{name}.ratio: expected 'chain' or 'step', got {self.ratio!r}")
        if self.likelihood not in ("chunk", "executed"):
            raise ValueError(f"{name}.likelihood: expected 'chunk' or 'executed', got {self.likelihood!r}")
        for field in ("num_envs", "total_steps", "rollout_steps", "execute", "epochs", "minibatch_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        if self.denoise_steps is not None and self.denoise_steps < 1:
            raise ValueError(f"{name}.denoise_steps: expected >= 1, got {self.denoise_steps}")
        for field in ("sde_noise", "lr", "critic_lr", "noise_lr", "clip", "max_grad_norm", "prior_bound",
                      "residual_bound"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{name}.{field}: expected > 0, got {getattr(self, field)}")
        if self.noise_std is not None and not self.noise_std > 0:
            raise ValueError(f"{name}.noise_std: expected > 0, got {self.noise_std}")
        if self.noise_std_end is not None and not self.noise_std_end > 0:
            raise ValueError(f"{name}.noise_std_end: expected > 0, got {self.noise_std_end}")
        if not 0 < self.noise_min < self.noise_max:
            raise ValueError(f"{name}.noise_min / noise_max: expected 0 < noise_min < noise_max, got "
                             f"{self.noise_min}, {self.noise_max}")
        if self.method == "flow_noise" and not self.noise_min < self.initial_std() < self.noise_max:
            raise ValueError(f"{name}.noise_std: expected the initial std inside (noise_min, noise_max) = "
                             f"({self.noise_min}, {self.noise_max}) for flow_noise, got {self.initial_std()}")
        if not (0.0 < self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise ValueError(f"{name}.gamma / gae_lambda: expected (0, 1] and [0, 1], got {self.gamma}, "
                             f"{self.gae_lambda}")
        if self.advantage_floor is not None and not math.isfinite(self.advantage_floor):
            raise ValueError(f"{name}.advantage_floor: expected a finite number or None, got {self.advantage_floor}")
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"{name}.ema: expected a decay in [0, 1), got {self.ema}")
        if not 0.0 < self.dense_scale <= 1.0:
            raise ValueError(f"{name}.dense_scale: expected (0, 1], got {self.dense_scale}")
        for field in ("critic_warmup", "bc_coef", "value_coef"):
            if getattr(self, field) < 0:
                raise ValueError(f"{name}.{field}: expected >= 0, got {getattr(self, field)}")

    def initial_std(self) -> float:
        """`noise_std`, or the method's default (left unresolved in the config, so that `replace(method=...)`
        moves it along)."""
        if self.noise_std is not None:
            return self.noise_std
        return 0.2 if self.method in ("flow_noise", "ode_noise") else 0.1


# ---------------------------------------------------------------------------------------------------
# the stochastic chain
# ---------------------------------------------------------------------------------------------------
def flow_sde_step(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, dt: float,
                  a: float) -> tuple[torch.Tensor, torch.Tensor]:
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

    def __init__(self, feature_dim: int, chunk_shape: tuple[int, int], hidden: tuple[int, ...], low: float,
                 high: float, init: float) -> None:
        super().__init__()
        self.chunk_shape, self.low, self.high = chunk_shape, low, high
        self.time = SinusoidalEmbedding(16, scale=10.0)
        size = chunk_shape[0] * chunk_shape[1]
        self.net = mlp([feature_dim + size + 16, *hidden, size], act=nn.Tanh)
        with torch.no_grad():
            self.net[-1].weight.mul_(0.01)
            self.net[-1].bias.fill_(math.log((init - low) / (high - init)))  # sigmoid^-1 of init's place in [low, high]

    def forward(self, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.net(torch.cat([features, x.flatten(1), self.time(t)], dim=-1))
        return (self.low + (self.high - self.low) * torch.sigmoid(h)).reshape(-1, *self.chunk_shape)


class FlowAgent(nn.Module):
    """The flow policy being fine-tuned, its value network and (Flow-Noise) its noise network: one module, so that
    the train state holds them together. For `latent` / `residual` the policy gets its noise prior / chunk
    residual here (unless it has one) and only that head trains."""

    def __init__(self, policy: FlowPolicy, config: OnlineConfig, steps: int) -> None:
        super().__init__()
        self.policy, self.method, self.steps = policy, config.method, steps
        head = HEADS.get(config.method)
        if head is not None:
            if not isinstance(policy.config, GenerativeConfig):
                raise ValueError(f"{type(config).__name__}.method: {config.method!r} trains a {head} of a U-Net flow "
                                 f"policy; a {policy.name!r} policy has none (use flow_sde)")
            if head == "prior" and policy.prior is None:
                policy.add_noise_prior(config.noise_hidden, config.prior_bound)
            if head == "residual" and policy.residual is None:
                policy.add_action_residual(config.noise_hidden, config.residual_bound, config.initial_std())
            for name, p in policy.named_parameters():
                p.requires_grad_(name.startswith(f"{head}."))
        drawn = {"latent": ("prior",), "residual": ("prior", "residual")}.get(config.method, ())
        ignored = [h for h in ("residual", "prior") if getattr(policy, h, None) is not None and h not in drawn]
        if ignored:  # the rollouts would not draw what the saved policy samples
            raise ValueError(f"{type(config).__name__}.method: {config.method!r} would ignore the {ignored[0]} this "
                             f"policy was given by online RL; continue it with --method "
                             f"{'residual' if ignored[0] == 'residual' else 'latent or residual'}")
        self.sde_noise = config.sde_noise
        std = config.initial_std()
        end = std if config.noise_std_end is None else config.noise_std_end
        schedule = torch.linspace(std, end, steps)
        if config.method == "ode_noise":  # deterministic Euler steps, then the chunk's noise
            schedule = torch.zeros(steps).index_fill_(0, torch.tensor([steps - 1]), std)
        self.register_buffer("schedule", schedule, persistent=False)
        window = policy.obs_horizon
        #: the value, noise and head networks' input size: `features`
        self.feature_dim = feature_dim = sum(window * policy.spec.observations[k].size for k in policy.vector_keys)
        self.value_net = mlp([feature_dim, *config.value_hidden, 1], act=nn.Tanh)
        self.chunk_shape = (policy.horizon, policy.action_dim)
        #: leading chunk steps whose likelihood the ratio scores (`likelihood`)
        self.scored = policy.horizon if config.likelihood == "chunk" else min(config.execute, policy.horizon)
        #: the log-ratio is divided by this: per chunk element for the chain methods (DPPO), joint for the heads
        self.ratio_elements = 1 if head is not None else self.scored * policy.action_dim
        self.noise_net = NoiseNet(feature_dim, self.chunk_shape, config.noise_hidden, config.noise_min,
                                  config.noise_max, std) if config.method == "flow_noise" else None

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The value (and noise) network's input: the policy's normalized vector observations, window flattened."""
        return self.policy.vector_features(obs)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.value_net(self.features(obs)).squeeze(-1)

    def transition(self, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor,
                   features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of x_{k+1} given x_k, the velocity v at (x_k, t_k) and the step indices k (B,)."""
        dt = 1.0 / self.steps
        t = k.to(x.dtype) / self.steps
        if self.method == "flow_sde":
            return flow_sde_step(x, v, t, dt, self.sde_noise)
        mean = x + v * dt
        if self.method == "flow_noise":
            assert self.noise_net is not None
            return mean, self.noise_net(features, x, t)
        return mean, self.schedule[k].reshape(-1, 1, 1).expand_as(x)

    @torch.no_grad()
    def sample_chain(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A stochastic chain for normalized observation windows: (x_0 .. x_K (B, K+1, H', A), the log-density of
        each transition (B, K))."""
        cond, features = self.policy.encoder(obs), self.features(obs)
        x = self.policy.noise(cond.shape[0], cond.device)
        if self.method == "latent":  # x_0 from the prior, then the policy's own ODE
            mean, std = self.prior(features)
            x0 = mean + std * x
            chunk = self.policy.integrate(x0, cond, self.steps)
            return torch.stack([x0, chunk], 1), gaussian_log_prob(x0, mean, std)[:, None]
        if self.method == "residual":  # the ODE's chunk from the first rows of the noise, corrected with the rest
            base = self.policy.integrate(self.policy.initial_noise(obs, x), cond, self.steps)
            mean, std = self.residual_mean_std(base, features)
            chunk = mean + std * x[:, self.chunk_shape[0]:]
            return torch.stack([x[:, : self.chunk_shape[0]], base, chunk], 1), self.log_density(chunk, mean, std)[:, None]
        chain, logp = [x], []
        for k in range(self.steps):
            ks = torch.full((x.shape[0],), k, device=x.device)
            v = self.policy.velocity(x, ks.to(x.dtype) / self.steps, cond)
            mean, std = self.transition(x, v, ks, features)
            x = mean + std * torch.randn_like(mean)
            chain.append(x)
            if self.method != "ode_noise" or k == self.steps - 1:  # ode_noise: only the last step is stochastic
                logp.append(self.log_density(x, mean, std))
        return torch.stack(chain, 1), torch.stack(logp, 1)

    def log_density(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """A transition's log-density over the scored chunk steps (B, H', A) -> (B,)."""
        h = self.scored
        return gaussian_log_prob(x[:, :h], mean[:, :h], std.expand_as(mean)[:, :h])

    def chain_log_prob(self, obs: dict[str, torch.Tensor], chain: torch.Tensor,
                       reference: FlowPolicy | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-density of each stored stochastic transition under the current weights (B, K), all K at once
        (ode_noise: (B, 1), its ODE recomputed from x_0), and the mean squared distance of the velocities there to
        `reference`'s (0 without one)."""
        if self.method == "ode_noise":
            return self.ode_log_prob(obs, chain, reference)
        if self.method == "latent":
            mean, std = self.prior(self.features(obs))
            return gaussian_log_prob(chain[:, 0], mean, std)[:, None], torch.zeros((), device=chain.device)
        if self.method == "residual":
            mean, std = self.residual_mean_std(chain[:, 1], self.features(obs))
            return self.log_density(chain[:, 2], mean, std)[:, None], torch.zeros((), device=chain.device)
        b, k = chain.shape[0], self.steps
        x = chain[:, :-1].reshape(b * k, *chain.shape[2:])
        ks = torch.arange(k, device=chain.device).repeat(b)
        cond = self.policy.encoder(obs).repeat_interleave(k, 0)
        v = self.policy.velocity(x, ks.to(x.dtype) / self.steps, cond)
        mean, std = self.transition(x, v, ks, self.features(obs).repeat_interleave(k, 0))
        logp = self.log_density(chain[:, 1:].reshape(b * k, *chain.shape[2:]), mean, std).reshape(b, k)
        gap = torch.zeros((), device=chain.device)
        if reference is not None:
            with torch.no_grad():
                cond_ref = reference.encoder(obs).repeat_interleave(k, 0)
                v_ref = reference.velocity(x, ks.to(x.dtype) / self.steps, cond_ref)
            gap = (v - v_ref).square().mean()
        return logp, gap

    def ode_log_prob(self, obs: dict[str, torch.Tensor], chain: torch.Tensor,
                     reference: FlowPolicy | None) -> tuple[torch.Tensor, torch.Tensor]:
        """ode_noise's log-density of the drawn chunk around the ODE's end from the stored x_0 (B, 1), the ODE run
        step by step so that the gradient reaches every step of it, and the velocity gap along it."""
        cond, dt = self.policy.encoder(obs), 1.0 / self.steps
        with torch.no_grad():
            cond_ref = reference.encoder(obs) if reference is not None else None
        x, gaps = chain[:, 0], []
        for k in range(self.steps):
            v = self.policy.velocity(x, k * dt, cond)
            if reference is not None:
                with torch.no_grad():
                    v_ref = reference.velocity(x, k * dt, cond_ref)
                gaps.append((v - v_ref).square().mean())
            x = x + v * dt
        logp = self.log_density(chain[:, -1], x, self.schedule[-1].expand_as(x))[:, None]
        gap = torch.stack(gaps).mean() if gaps else torch.zeros((), device=chain.device)
        return logp, gap

    @property
    def prior(self) -> NoisePrior:
        assert self.policy.prior is not None, "latent: the policy's noise prior is added in FlowAgent.__init__"
        return self.policy.prior

    def residual_mean_std(self, base: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """residual: the corrected chunk's Gaussian (mean, std) around the ODE's chunk `base` (B, horizon, A)."""
        assert self.policy.residual is not None, "residual: the policy's residual is added in FlowAgent.__init__"
        mean, std = self.policy.residual(features)
        return base + mean, std

    def chunk(self, chain: torch.Tensor) -> np.ndarray:
        """The env's action chunk (B, H, A) from the chain's end: unnormalized and clipped to the action bounds,
        as `Policy.act` does."""
        policy = self.policy
        chunk = policy.normalizer.unnormalize("action", chain[:, -1, : policy.action_horizon])
        low = torch.as_tensor(policy.spec.action.low_array(), dtype=chunk.dtype, device=chunk.device)
        high = torch.as_tensor(policy.spec.action.high_array(), dtype=chunk.dtype, device=chunk.device)
        return torch.clamp(chunk, low, high).cpu().numpy()


def training_env(policy: FlowPolicy, config: OnlineConfig) -> Any:
    """The policy's task on training seeds, configured as its data was; with `reward_classifier`, rendering the
    classifier's camera and rewarded by it."""
    if config.reward_classifier is None:
        return make_eval_env(policy.spec, tuple(policy.obs_keys), config.num_envs, config.seed,
                             reward_type=config.reward_type)
    from robotrl.flowrl.classifier import ClassifierReward, load

    classifier = load(config.reward_classifier)
    env = make_eval_env(policy.spec, tuple(policy.obs_keys), config.num_envs, config.seed,
                        reward_type=config.reward_type, render_images=True)
    return ClassifierReward(env, classifier)


def load_flow_policy(path: Path, steps: int | None, field: str = "OnlineConfig.policy") -> FlowPolicy:
    """The starting checkpoint, refused unless it is a flow policy; its sampler set to the chain's Euler steps.
    `field` names the config field in errors."""
    policy = load(path)
    if not isinstance(policy, FlowPolicy):  # a bad value of the config's field, as the CLI reports them
        raise ValueError(  # noqa: TRY004
            f"{field}: expected a flow policy checkpoint (robotrl train bc --policy flow), got a "
            f"{policy.name!r} policy at {path}")
    if not policy.vector_keys:
        raise ValueError(f"{field}: expected a policy with vector observations for the value network, "
                         f"got only {list(policy.obs_keys)} at {path}")
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
        return {k: torch.from_numpy(v.copy()) if k in self.keys else [str(x) for x in v]
                for k, v in self.frames.items()}

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
        return {"ret": torch.from_numpy(self.ret.copy()), "succ": torch.from_numpy(self.succ.copy()),
                "returns": list(self.returns), "success": list(self.success)}

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

    def observe(self, action: np.ndarray, operated: np.ndarray, next_obs: dict[str, Any], reward: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray, info: dict[str, Any]) -> None:
        """The step taken: the actions executed, which envs the operator drove, and what the env returned."""


def rollout(agent: FlowAgent, env: Any, windows: Windows, steps: int, execute: int, gamma: float,
            tally: Tally, operator: Operator | None = None, dense_scale: float = 1.0) -> dict[str, Any]:
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
    out = {"obs": {k: torch.cat([o[k] for o in taken["obs"]]) for k in taken["obs"][0]},
           "chain": torch.cat(taken["chain"]), "logp": torch.cat(taken["logp"]), "value": torch.cat(taken["value"]),
           "env": np.concatenate(taken["env"]), "reward": reward[:count], "discount": discount[:count],
           "done": done[:count], "last_value": last_value}
    if operator is not None:
        out["operated"] = torch.from_numpy(np.concatenate(operated_taken)).to(out["value"].device)
    return out


def semi_mdp_gae(reward: np.ndarray, discount: np.ndarray, done: np.ndarray, value: np.ndarray, env: np.ndarray,
                 last_value: np.ndarray, lam: float) -> np.ndarray:
    """GAE(lambda) over decisions in the order they were taken (several envs interleaved): a decision of k env
    steps discounts its successor by gamma^k (`discount`); `done` cuts at episode ends (a time-limit cut has its
    bootstrap in `reward` already); an env's last decision bootstraps from `last_value[env]`."""
    adv = np.zeros_like(reward)
    next_value, running = last_value.astype(np.float64), np.zeros(len(last_value))
    for d in reversed(range(len(reward))):
        i, keep = env[d], 1.0 - done[d]
        delta = reward[d] + discount[d] * keep * next_value[i] - value[d]
        running[i] = delta + discount[d] * lam * keep * running[i]
        adv[d], next_value[i] = running[i], value[d]
    return adv


def collect(agent: FlowAgent, env: Any, windows: Windows, steps: int, execute: int, config: OnlineConfig,
            tally: Tally, operator: Operator | None = None) -> dict[str, Any]:
    """A rollout (`rollout`) with its decisions' GAE advantages (`adv`) and value targets (`ret`), on the agent's
    device."""
    data = rollout(agent, env, windows, steps, execute, config.gamma, tally, operator, config.dense_scale)
    device = data["value"].device
    value = data["value"].cpu().numpy()
    adv = semi_mdp_gae(data["reward"], data["discount"], data["done"], value, data["env"], data["last_value"],
                       config.gae_lambda)
    data.update(adv=torch.from_numpy(adv).float().to(device), ret=torch.from_numpy(adv + value).float().to(device))
    return data


def explained_variance(data: dict[str, Any]) -> float:
    """1 - Var(return - value) / Var(return) over a rollout's decisions: how much of the returns the value network
    (as it was during the rollout) already predicts; near 0 or below, the advantages are mostly its error."""
    ret, value = data["ret"].cpu().numpy(), data["value"].cpu().numpy()
    return 1.0 - float(np.var(ret - value) / max(float(np.var(ret)), 1e-12))


def ppo_loss(agent: FlowAgent, batch: dict[str, Any], config: OnlineConfig, actor: bool,
             reference: FlowPolicy | None) -> tuple[torch.Tensor, dict[str, float]]:
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
        batch = {**{k: batch[k][own] for k in ("chain", "logp", "adv")},
                 "obs": {k: x[own] for k, x in batch["obs"].items()}}
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
        stats.update({"loss/policy": policy_loss.item(), "loss/bc": gap.item(),
                      "approx_kl": ((ratio - 1) - logratio).mean().item(),
                      "clip_frac": ((ratio - 1).abs() > config.clip).float().mean().item()})
    return loss, stats


def make_optimizer(agent: FlowAgent, config: OnlineConfig) -> tuple[torch.optim.Adam, Any]:
    """Adam with a learning rate per network (policy, value, noise), and the constant schedule `optimizer_step`
    steps."""
    head = HEADS.get(config.method)
    policy_group = ({"params": [p for p in agent.policy.parameters() if p.requires_grad], "lr": config.noise_lr}
                    if head is not None else {"params": agent.policy.parameters(), "lr": config.lr})
    groups = [policy_group,
              {"params": agent.value_net.parameters(), "lr": config.critic_lr}]
    if agent.noise_net is not None:
        groups.append({"params": agent.noise_net.parameters(), "lr": config.noise_lr})

    optimizer = torch.optim.Adam(groups, eps=1e-5, fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def ppo_update(agent: FlowAgent, data: dict[str, Any], config: OnlineConfig, actor: bool,
               reference: FlowPolicy | None, optimizer: torch.optim.Optimizer, schedule: Any, rng: np.random.Generator,
               where: str, extra: Any = None) -> dict[str, list[float]]:
    """`config.epochs` passes of shuffled minibatches of a rollout's decisions (with their `adv` and `ret`), one
    clipped step each; `extra()` -> (loss, stats) is added to every minibatch's loss (robotrl/flowrl/hil.py: BC on the
    operator's interventions). Returns every step's stats; weights gone non-finite raise `TrainingDiverged`."""
    count, sums = len(data["adv"]), {}
    keys = [k for k in ("chain", "logp", "value", "adv", "ret", "operated") if k in data]
    for _ in range(config.epochs):
        order = torch.from_numpy(rng.permutation(count)).to(data["adv"].device)
        for lo in range(0, count, config.minibatch_size):
            mb = order[lo:lo + config.minibatch_size]
            batch = {k: data[k][mb] for k in keys}
            batch["obs"] = {k: x[mb] for k, x in data["obs"].items()}
            loss, stats = ppo_loss(agent, batch, config, actor, reference)
            if extra is not None:
                more, more_stats = extra()
                loss, stats = loss + more, {**stats, **more_stats}
            _, stats["grad_norm"] = optimizer_step(loss, agent, optimizer, schedule, where, config.max_grad_norm)
            for key, x in stats.items():
                sums.setdefault(key, []).append(x)
    check_finite_weights(agent, where)
    return sums


# ---------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------
@dataclass
class OnlineStart:
    """What an online run (`train online`, `train hil`) is made of before its first iteration."""

    policy: FlowPolicy
    run_dir: Path
    state_path: Path
    rng: np.random.Generator
    reference: FlowPolicy | None
    env: Any
    agent: FlowAgent
    optimizer: torch.optim.Optimizer
    constant: Any
    iterations: int
    windows: Windows
    tally: Tally
    ema: EMA | None
    config_name: str
    """the run's config class (OnlineConfig, HilConfig): what its errors name"""

    @property
    def kept(self) -> FlowPolicy:
        """The weights a run evaluates and saves: the average's when `ema` is on, else the live policy."""
        return self.policy if self.ema is None else self.ema.model

    def evaluate(self, config: OnlineConfig, execute: int) -> Any:
        """`EpisodeStats` of the kept weights on the run's evaluation seeds, sampled with `eval_sampler_steps`."""
        kept = self.kept
        saved = kept.config.steps
        kept.config.steps = config.eval_sampler_steps or saved
        try:
            return evaluate_policy(kept, config.eval_episodes, config.eval_envs, config.eval_seed, execute)
        finally:
            kept.config.steps = saved

    def average(self) -> None:
        """After an update: move the average towards the live weights."""
        if self.ema is not None:
            self.ema.update(self.policy)

    def ema_state(self) -> dict[str, Any]:
        return {} if self.ema is None else self.ema.state()

    def load_ema(self, state: dict[str, Any]) -> None:
        if self.ema is not None:
            if "ema" not in state:
                raise ValueError(f"{self.config_name}.ema: the run in {self.run_dir} was started without an average of "
                                 f"its weights (ema 0); resume it with ema 0, got {self.ema.max_decay}")
            self.ema.load(state)


def start_online(config: OnlineConfig, algorithm: str) -> OnlineStart:
    """The starting policy (and its frozen copy for the velocity regularizer), the run directory (refused if a fresh
    run would overwrite one), the envs on training seeds, agent and optimizer, observation windows and tallies."""
    name = type(config).__name__
    policy = load_flow_policy(config.policy, config.denoise_steps, field=f"{name}.policy")
    run_dir, state_path, rng = start_run(config, algorithm, policy.spec.task, holds="train_state.pt")
    reference = None
    if config.bc_coef > 0:
        reference = load_flow_policy(config.policy, config.denoise_steps).requires_grad_(False).to(config.device)
    env = training_env(policy, config)
    agent = FlowAgent(policy, config, policy.config.steps).to(config.device)  # a learning rate per network
    optimizer, constant = make_optimizer(agent, config)
    text = tuple(k for k, v in policy.spec.observations.items() if v.dtype == STRING)
    return OnlineStart(policy, run_dir, state_path, rng, reference, env, agent, optimizer, constant,
                       math.ceil(config.total_steps / (config.num_envs * config.rollout_steps)),
                       Windows(tuple(policy.obs_keys), policy.obs_horizon, text), Tally(config.num_envs),
                       EMA(policy, config.ema, warmup=False) if config.ema > 0 else None, name)


def train(config: OnlineConfig) -> RLResult:
    run = start_online(config, f"online-{config.method}")
    policy, agent, env, windows, tally, rng = run.policy, run.agent, run.env, run.windows, run.tally, run.rng
    run_dir, state_path, optimizer, iterations = run.run_dir, run.state_path, run.optimizer, run.iterations
    n, horizon, execute = config.num_envs, config.rollout_steps, min(config.execute, policy.action_horizon)
    start = 0
    if config.resume:
        state = load_run_state(state_path, agent, {"adam": optimizer}, rng, env)
        windows.load(state["windows"])
        tally.load(state["tally"])
        run.load_ema(state)
        start = int(state["step"])  # iterations done
    else:
        windows.start(env.reset(seed=config.seed)[0])

    def evaluate() -> Any:
        return run.evaluate(config, execute)

    log = RunLog(run_dir)
    best = BestCheckpoint(run_dir, run.kept.save)
    bar = tqdm(total=iterations * n * horizon, initial=start * n * horizon, desc=f"online {config.method}", unit="step",
               disable=not config.progress, dynamic_ncols=True)
    clock = TrainClock()
    try:
        for it in range(start, iterations):
            data = collect(agent, env, windows, horizon, execute, config, tally)

            # update: the value network alone while it warms up
            count = len(data["adv"])
            sums = ppo_update(agent, data, config, it >= config.critic_warmup, run.reference, optimizer, run.constant, rng,
                              f"online iteration {it} (last train state: {state_path})")
            run.average()

            # log, evaluate, checkpoint
            now, before = (it + 1) * n * horizon, it * n * horizon
            bar.update(n * horizon)
            recent = tally.success[-100:]
            trained_s = clock.trained()
            if now // config.log_every != before // config.log_every or it + 1 == iterations:
                log.log(now, **{k: float(np.mean(x)) for k, x in sums.items()},
                        **{"time/train_seconds": trained_s, "time/steps_per_second": now / max(trained_s, 1e-9),
                           "rollout/decisions": count, "rollout/chain_logp": float(data["logp"].sum(1).mean()),
                           "rollout/explained_variance": explained_variance(data)},
                        **({"train/success_rate": float(np.mean(recent)),
                            "train/return": float(np.mean(tally.returns[-100:]))} if recent else {}))
            bar.set_postfix(success=f"{np.mean(recent):.2f}" if recent else "-")
            clock.evaluate_every(config, log, evaluate, now, before, last=it + 1 == iterations, best=best)
            if now // config.checkpoint_every != before // config.checkpoint_every or it + 1 == iterations:
                save_run_state(state_path, it + 1, agent, {"adam": optimizer}, rng, env, tally=tally.state(),
                               windows=windows.state(), **run.ema_state())
                run.kept.save(run_dir / "policy")
    finally:
        bar.close()
        env.close()
    return finish_policy_run(config, log, evaluate, run.kept, clock, run_dir, iterations, start, n * horizon, best)


def finish_policy_run(config: RunOptions, log: RunLog, evaluate: Any, policy: FlowPolicy, clock: TrainClock,
                      run_dir: Path, iterations: int, start: int, per_iteration: int,
                      best: BestCheckpoint) -> RLResult:
    """`finish_iterations` for a run whose result is `run_dir/policy` (its last weights; `best` keeps the best
    evaluated ones); saved here when a finished run was resumed (no iteration ran to save it)."""
    if start >= iterations:
        policy.save(run_dir / "policy")
    return finish_iterations(config, log, evaluate, run_dir / "policy", clock, run_dir, iterations, start,
                             per_iteration, best)


def run_train_online(config: OnlineConfig) -> RLResult:
    result = train(config)
    print(result.summary(f"online {config.method}", config.eval_episodes, "env steps"))
    return result
