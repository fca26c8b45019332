"""The stochastic K-step chain of a flow policy, and what every RL method of flow policies shares around it: online
PPO (robotrl/flowrl/online.py), human-in-the-loop PPO (hil.py), RL-100's offline stage (offline.py) and DSRL-SAC
(dsrl.py) import it, never each other's insides.

A decision is an action chunk, drawn by the policy's K-step Euler chain from noise (t = 0) to the chunk (t = 1)
made stochastic by one of `METHODS` (robotrl/flowrl/online.py's docstring tells them apart). Every stochastic
transition is Gaussian, so a stored chain's log-likelihood is exact and recomputed under new weights (`FlowAgent`);
`ppo_loss` is the clipped surrogate on it that online, HIL and offline PPO take. Around the chain: the starting
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
from robotrl.policies.nets import SinusoidalEmbedding, mlp
from robotrl.training.evaluate import make_eval_env
from robotrl.training.loop import BestCheckpoint, RLResult, RunLog, RunOptions, TrainClock, finish_iterations

METHODS = ("denoising_mdp", "flow_sde", "flow_noise", "ode_noise", "latent", "residual")
#: methods that train a head of a frozen flow network (its prior or residual), with a Gaussian over one action
HEADS = {"latent": "prior", "residual": "residual"}


@dataclass
class ChainConfig(RunOptions):
    """The settings of a flow-RL run that the chain, its PPO loss and its training env read (`train online` and
    `train hil` take them all; DSRL and the offline stage fill in theirs)."""

    policy: Path = Path("runs/bc-flow/policy")
    """the flow policy checkpoint to start from (`robotrl train bc --policy flow` output)"""
    method: Literal["denoising_mdp", "flow_sde", "flow_noise", "ode_noise", "latent", "residual"] = "latent"
    """how the policy explores and what trains (robotrl/flowrl/online.py's docstring): latent learned Reach fastest
    in bench/flow_rl.py (100% at 43,200 env steps; flow_sde 96.5% at 86,400) and, its flow network frozen, cannot
    lose what BC learned (flow_sde lowered PushT from 79% to 6%)"""
    num_envs: int = 32
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
    clip: float = 0.1
    value_clip: float | None = None
    """clip the value update around the rollout's values (None: plain regression)"""
    value_coef: float = 0.5
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
    reward_classifier: Path | None = None
    """a success classifier (`robotrl train classifier`) whose verdict replaces the env's reward and success in
    training (a robot's env gives none); evaluation still reports the task's own success"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy = Path(self.policy)
        if self.reward_classifier is not None:
            self.reward_classifier = Path(self.reward_classifier)
            if not self.reward_classifier.is_dir():
                raise FileNotFoundError(f"{type(self).__name__}.reward_classifier: expected a classifier directory "
                                        f"(robotrl train classifier), got {self.reward_classifier}")
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
        if self.denoise_steps is not None and self.denoise_steps < 1:
            raise ValueError(f"{name}.denoise_steps: expected >= 1, got {self.denoise_steps}")
        for field in ("sde_noise", "clip", "prior_bound", "residual_bound"):
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
        if self.advantage_floor is not None and not math.isfinite(self.advantage_floor):
            raise ValueError(f"{name}.advantage_floor: expected a finite number or None, got {self.advantage_floor}")
        for field in ("bc_coef", "value_coef"):
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

    def __init__(self, policy: FlowPolicy, config: ChainConfig, steps: int) -> None:
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


def training_env(policy: FlowPolicy, config: ChainConfig) -> Any:
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


# ---------------------------------------------------------------------------------------------------
# what the learners share at the end: PPO's clipped loss over chains, and a run whose result is a policy
# ---------------------------------------------------------------------------------------------------
def ppo_loss(agent: FlowAgent, batch: dict[str, Any], config: ChainConfig, actor: bool,
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


def finish_policy_run(config: RunOptions, log: RunLog, evaluate: Any, policy: FlowPolicy, clock: TrainClock,
                      run_dir: Path, iterations: int, start: int, per_iteration: int,
                      best: BestCheckpoint) -> RLResult:
    """`finish_iterations` for a run whose result is `run_dir/policy` (its last weights; `best` keeps the best
    evaluated ones); saved here when a finished run was resumed (no iteration ran to save it)."""
    if start >= iterations:
        policy.save(run_dir / "policy")
    return finish_iterations(config, log, evaluate, run_dir / "policy", clock, run_dir, iterations, start,
                             per_iteration, best)
