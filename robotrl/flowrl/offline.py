"""RL-100's iterative offline stage for a flow policy: clipped PPO over its denoising chain, scored by an IQL critic
fitted to the data, each update gated by offline policy evaluation; then roll out, add the data, repeat.

    robotrl train offline --policy runs/bc-flow/policy --store data/reach.zarr --iterations 5
    result = robotrl.flowrl.offline.train(OfflineFlowConfig(policy=Path(...), store=Path(...)))   # the same dataclass

The store is copied to `run_dir/store.zarr` (the input is never written) and every iteration reads it whole:

1. Critic. Decisions are the chunked policy's: a window of To observations and the `execute` actions that followed
   it. Q(window, executed chunk) and V(window) are IQL's (`robotrl.rl.iql.critic_update`): V an upper expectile of Q
   over the data's chunks, Q regressed on the discounted reward of the executed steps + gamma^k V(next window),
   cut at termination. A decision that reaches a time-limit cut has no stored successor window and is left out.
2. Policy. `policy_updates` times: `samples` chains drawn from the current policy for each of `windows` dataset
   windows with chain.py's stochastic chain (`FlowAgent`, `--method`), the executed part of each chain's chunk
   scored with A = min Q - V (or a per-window group baseline, `--advantage`), and `epochs` clipped PPO passes on the
   chains' exact log-likelihood ratios (chain.py's `ppo_loss`, advantages normalized per minibatch). The gate
   (AM-Q) scores the deterministic ODE chunks of the new and the current policy at windows of held-out episodes
   (the same start noise for both) with every critic member, and keeps the update only if its gain's lower bound
   is > 0: the most pessimistic member's mean gain minus `ope_z` standard errors across held-out episodes (one
   update moves Q by about its noise, so a bare new >= old passes noise). Otherwise policy and optimizer roll
   back. The held-out episodes (`ope_fraction` of the store) never feed policy updates, so a policy that games the
   critic at the windows it trains on is caught. Then (`success_gate`) the iteration's kept updates stay only if
   the new policy's success on `gate_episodes` fresh seeds beats the iteration's start policy's on the same
   seeds by more than `gate_z` standard errors: the critic's gain is biased (below), a success rate is not.
3. Data. The accepted policy (deterministic, as deployed) runs `rollout_episodes` episodes in the CPU vector env;
   they are appended to the run's store (source "policy", tagged with the iteration).
4. Held-out success (`evaluate_policy`) is logged per iteration; step 0 is the starting policy.

Why a success gate: on Reach one update moves Q by about the estimate's own noise, a gate on new AM-Q >= old lets
that noise through, and a lower-bound gate over several critics still kept updates that lowered success: the
critic's error is a bias shared by its members, not noise, so no critic-only gate is calibrated here
(bench/RESULTS.md, "Measurements behind the code's design"). The success gate makes the stage a
no-op-or-better; no PPO setting yet raises success reliably.

`--extraction awr` replaces step 2's PPO by IQL's own policy extraction: flow matching on the store's chunks
weighted by exp(A / T), so the critic only reweights chunks the data holds. Its updates train a student whose EMA
(`awr_ema`) is the policy that is gated, rolled out and saved: raw Adam steps from a BC checkpoint's EMA weights
lower its success before more steps help, with plain BC as with AWR. From a half-trained BC start, AWR raises
success as much as flow-matching BC with uniform weights on the same data and schedule does (bench/offline_flow.py;
bench/RESULTS.md, "The offline stage's policy extraction"): on demonstrations of a good expert the weights have
little to tell apart, and a half-trained BC start gains from any further fitting.

The result is an ordinary FlowPolicy checkpoint (`run_dir/policy`, sampler = the chain's K Euler steps), so eval,
`train online`, distill and export take it unchanged. A train state is written after every iteration; `--resume`
drops the store's episodes of an unfinished iteration and continues exactly. Metric steps count policy updates.
"""

from __future__ import annotations

import copy
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_policy
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.flowrl.chain import HEADS, METHODS, ChainConfig, FlowAgent, load_flow_policy, ppo_loss
from robotrl.policies.flow import FlowPolicy
from robotrl.policies.gaussian import CriticEnsemble
from robotrl.policies.nets import mlp
from robotrl.rl.iql import critic_update
from robotrl.training.evaluate import controller_for, evaluate_policy, make_eval_env, success_gain
from robotrl.training.loop import (
    TRAIN_STATE,
    PolicyRunOptions,
    RLResult,
    RunLog,
    TrainingDiverged,
    cosine_lr,
    finish_run,
    load_run_state,
    optimizer_step,
    polyak,
    save_run_state,
    start_run,
)

#: critic_update's stats -> this run's metric names
CRITIC_STATS = {"loss/value": "critic/value_loss", "loss/critic": "critic/q_loss", "q/mean": "critic/q_mean"}


@dataclass
class OfflineFlowConfig(PolicyRunOptions):
    """Improve a flow policy checkpoint offline (RL-100): an IQL critic from a store, clipped PPO over the denoising
    chain, an OPE gate on every update, and rounds of rollouts added to the data. Evaluates every iteration;
    a train state is written after every iteration (`checkpoint_every`, `log_every`, `eval_every` are unused)."""

    # each iteration's schedules are its own: more iterations continue the run as it was
    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = (*PolicyRunOptions.RESUME_MAY_CHANGE, "iterations")

    policy: Path = Path("runs/bc-flow/policy")
    """the flow policy checkpoint to start from (`robotrl train bc policy:flow` or `train online` output)"""
    store: Path = Path("data/pusht.zarr")
    """episodes with rewards (demonstrations of the task); copied to run_dir/store.zarr, which grows"""
    iterations: int = 5
    """rounds of critic fit -> gated policy updates -> rollouts added to the store -> evaluation"""
    critic_steps: int = 2_000
    """critic gradient steps per iteration (the critic carries over between iterations)"""
    policy_updates: int = 10
    """gated policy updates per iteration"""
    windows: int = 64
    """dataset observation windows per policy update"""
    samples: int = 4
    """chains sampled per window"""
    extraction: Literal["ppo", "awr"] = "ppo"
    """how a policy update uses the critic: clipped PPO over chains sampled from the policy, scored by the critic
    (ppo: RL-100's), or flow matching on the data's own chunks weighted by exp(A / awr_temperature), A = min Q - V
    of the chunk the data executed (awr: IQL's policy extraction; the critic only reweights in-distribution
    chunks, so it is never queried off the data)"""
    awr_temperature: float = 1.0
    """awr: temperature on advantages standardized over the batch (lower: greedier)"""
    awr_max_weight: float = 20.0
    """awr: weights are clipped here, then normalized to mean 1"""
    awr_ema: float = 0.99
    """awr: the policy that is gated, rolled out and saved is this EMA of the weights the updates train (raw Adam
    steps from a BC checkpoint's EMA weights lower success before they help; bench/RESULTS.md, "Measurements
    behind the code's design")"""
    advantage: Literal["value", "group"] = "value"
    """A = min Q of a chain's chunk - V(window) (value: IQL's, RL-100's), or - the mean min Q of the window's
    `samples` chains (group: a baseline at the very state, free of V's fitting error; no better on Reach so far)"""
    epochs: int = 4
    """PPO passes over an update's chains"""
    minibatch_size: int = 64
    rollout_episodes: int = 50
    """episodes of the accepted policy added to the store per iteration"""
    rollout_envs: int = 10
    execute: int = 8
    """actions executed from each chunk: the decision the critic scores, and at rollouts and evaluation"""
    sampler_steps: int | None = None
    """K: Euler steps of the chain (default: the policy's sampler steps); the saved policy samples with K too"""
    method: Literal["denoising_mdp", "flow_sde", "flow_noise", "ode_noise"] = "flow_sde"
    """how the chain is made stochastic (robotrl/flowrl/online.py)"""
    noise_std: float | None = None
    """denoising_mdp: each transition's std; flow_noise: the noise net's initial std; ode_noise: the std on the
    ODE's chunk (chain.py's defaults)"""
    sde_noise: float = 0.5
    """flow_sde: a in g(t)^2 = a^2 (1 - t) / t"""
    ratio: Literal["chain", "step"] = "chain"
    """PPO's unit: a whole chain per decision, or each chain transition (chain.py)"""
    clip: float = 0.1
    lr: float = 3e-5
    """the flow policy's learning rate"""
    noise_lr: float = 3e-4
    """flow_noise: the noise network's learning rate"""
    bc_coef: float = 0.0
    """weight of ||v - v_start||^2, the velocity's distance to the starting policy's at the chain's points"""
    max_grad_norm: float = 1.0
    gamma: float = 0.95
    """discount per env step (a decision of k steps discounts by gamma^k)"""
    expectile: float = 0.7
    critic_lr: float = 3e-4
    critic_batch_size: int = 256
    critics: int = 5
    critic_hidden: tuple[int, ...] = (256, 256)
    tau: float = 0.005
    ope_fraction: float = 0.2
    """share of the store's episodes held out for the OPE gate (never used for policy updates)"""
    ope_windows: int = 512
    """held-out windows the OPE estimate averages over (at most)"""
    ope_z: float = 2.0
    """the gate keeps an update only when its estimated gain's lower bound is > 0: the smallest critic member's mean
    gain over held-out windows minus ope_z standard errors of the gain across held-out episodes"""
    success_gate: bool = True
    """keep an iteration's updates only if the new policy's success beats the iteration's start on the same
    `gate_episodes` fresh seeds (the critic's gain is biased: on Reach the updates it kept lowered success)"""
    gate_episodes: int | None = None
    """episodes of each policy the success gate compares (default: rollout_episodes)"""
    gate_z: float = 1.0
    """the success gate keeps the updates only when the gain's lower bound, gain - gate_z standard errors
    (`success_gain`), is > 0 (0: any gain). On PushT a 10-episode gate let through an AWR update that lowered BC's
    success and the online stage's after it (bench/RESULTS.md, "PushT through `robotrl run`")"""
    reward_type: Literal["dense", "sparse"] = "dense"
    """the reward the store was recorded with (rollouts record it too)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy, self.store = Path(self.policy), Path(self.store)
        name = type(self).__name__
        chains = tuple(m for m in METHODS if m not in HEADS)  # its updates train the flow network
        if self.method not in chains:
            raise ValueError(f"{name}.method: expected one of {chains}, got {self.method!r}")
        if self.ratio not in ("chain", "step"):
            raise ValueError(f"{name}.ratio: expected 'chain' or 'step', got {self.ratio!r}")
        if self.reward_type not in ("dense", "sparse"):
            raise ValueError(f"{name}.reward_type: expected 'dense' or 'sparse', got {self.reward_type!r}")
        if self.extraction not in ("ppo", "awr"):
            raise ValueError(f"{name}.extraction: expected 'ppo' or 'awr', got {self.extraction!r}")
        if self.advantage not in ("value", "group"):
            raise ValueError(f"{name}.advantage: expected 'value' or 'group', got {self.advantage!r}")
        if self.advantage == "group" and self.samples < 2:
            raise ValueError(f"{name}.samples: expected >= 2 for advantage 'group', got {self.samples}")
        for field in (
            "iterations",
            "critic_steps",
            "policy_updates",
            "windows",
            "samples",
            "epochs",
            "minibatch_size",
            "rollout_episodes",
            "rollout_envs",
            "execute",
            "critic_batch_size",
            "critics",
            "ope_windows",
        ):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        if self.gate_episodes is not None and self.gate_episodes < 1:
            raise ValueError(f"{name}.gate_episodes: expected >= 1, got {self.gate_episodes}")
        if not 0.0 <= self.gate_z < float("inf"):
            raise ValueError(f"{name}.gate_z: expected >= 0, got {self.gate_z}")
        if self.sampler_steps is not None and self.sampler_steps < 1:
            raise ValueError(f"{name}.sampler_steps: expected >= 1, got {self.sampler_steps}")
        for field in (
            "clip",
            "lr",
            "noise_lr",
            "max_grad_norm",
            "sde_noise",
            "critic_lr",
            "awr_temperature",
            "awr_max_weight",
        ):
            if not getattr(self, field) > 0:
                raise ValueError(f"{name}.{field}: expected > 0, got {getattr(self, field)}")
        if self.noise_std is not None and not self.noise_std > 0:
            raise ValueError(f"{name}.noise_std: expected > 0, got {self.noise_std}")
        for field in ("bc_coef", "ope_z"):
            if getattr(self, field) < 0:
                raise ValueError(f"{name}.{field}: expected >= 0, got {getattr(self, field)}")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"{name}.gamma: expected a value in (0, 1), got {self.gamma}")
        if not 0.5 <= self.expectile < 1.0:
            raise ValueError(f"{name}.expectile: expected a value in [0.5, 1), got {self.expectile}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"{name}.tau: expected a value in (0, 1], got {self.tau}")
        if not 0.0 <= self.awr_ema < 1.0:
            raise ValueError(f"{name}.awr_ema: expected a decay in [0, 1), got {self.awr_ema}")
        if not 0.0 < self.ope_fraction < 1.0:
            raise ValueError(f"{name}.ope_fraction: expected a value in (0, 1), got {self.ope_fraction}")

    def chain_config(self) -> ChainConfig:
        """The settings of the chain (FlowAgent) and its clipped loss (ppo_loss), the value loss off."""
        return ChainConfig(
            policy=self.policy,
            method=self.method,
            noise_std=self.noise_std,
            sde_noise=self.sde_noise,
            ratio=self.ratio,
            clip=self.clip,
            bc_coef=self.bc_coef,
            value_coef=0.0,
            execute=self.execute,
            eval_episodes=0,
            progress=False,
        )


# ---------------------------------------------------------------------------------------------------
# decisions of the store and the critic
# ---------------------------------------------------------------------------------------------------
@dataclass
class Decisions:
    """Every decision of the store with a known successor: normalized observation windows, the normalized executed
    chunk flattened, the discounted reward of its k steps, gamma^k (0 where it terminated), the successor window,
    and whether its episode is held out for the OPE gate."""

    obs: dict[str, torch.Tensor]
    next_obs: dict[str, torch.Tensor]
    action: torch.Tensor
    chunk: torch.Tensor
    """the policy's whole normalized chunk (N, H, A) from the decision's step (what AWR regresses on)"""
    chunk_is_pad: torch.Tensor
    reward: torch.Tensor
    discount: torch.Tensor
    held_out: np.ndarray
    episode: np.ndarray

    def __len__(self) -> int:
        return len(self.action)


def held_out_episodes(count: int, fraction: float, seed: int, where: str) -> np.ndarray:
    """Which of `count` episodes the OPE gate holds out: a seeded draw that keeps every episode's lot as the
    store grows (a Generator's uniforms are prefix-stable), with at least one episode on either side."""
    held = np.random.default_rng(seed).random(count) < fraction
    if count < 2:
        raise ValueError(f"{where}: expected a store with at least 2 episodes (one held out for OPE), got {count}")
    if held.all() or not held.any():
        held[:] = False
        held[-1] = True
    return held


def read_decisions(
    path: Path, policy: FlowPolicy, execute: int, gamma: float, fraction: float, seed: int, where: str
) -> Decisions:
    """The store's decisions at every step of every episode (module docstring, step 1)."""
    with EpisodeStore.open(path) as store:
        store.check_spec(policy.spec, "the policy's spec")
        # windows of the policy's whole chunk; the decision is its first `execute` actions (execute <= horizon)
        sampler = SequenceSampler.from_store(
            store,
            SequenceConfig(
                policy.obs_horizon, policy.action_horizon, tuple(policy.obs_keys), extra_keys=("reward", "terminated")
            ),
        )
        held = held_out_episodes(store.num_episodes, fraction, seed, where)
    index = np.arange(len(sampler))
    w = sampler.get(index)
    real = ~w["action_is_pad"][:, :execute]  # (N, execute): the steps the decision takes before its episode ends
    steps = real.sum(1)
    last = sampler.ep_end - 1
    rows = np.minimum(sampler.anchor[:, None] + np.arange(execute), last[:, None])
    reward = (np.asarray(sampler.data["reward"])[rows] * real * gamma ** np.arange(execute)).sum(1)
    ends = sampler.anchor + steps - 1 == last
    terminal = ends & np.asarray(sampler.data["terminated"])[last].astype(bool)
    keep = ~ends | terminal  # a time-limit cut has no stored successor window
    succ = np.where(ends, index, index + steps)[keep]
    obs = policy.normalize_obs(w["obs"])
    next_obs = {k: v[torch.from_numpy(succ)] for k, v in obs.items()}
    chunk = policy.normalizer.normalize("action", torch.as_tensor(w["action"]).float())
    keep_t = torch.from_numpy(keep)
    return Decisions(
        {k: v[keep_t] for k, v in obs.items()},
        next_obs,
        chunk[:, :execute].flatten(1)[keep_t],
        chunk[keep_t],
        torch.from_numpy(w["action_is_pad"])[keep_t],
        torch.from_numpy(reward[keep]).float(),
        torch.from_numpy(np.where(terminal, 0.0, gamma ** steps.astype(np.float64))[keep]).float(),
        held[w["episode"]][keep],
        np.asarray(w["episode"])[keep],
    )


class ChunkCritic(nn.Module):
    """IQL's critics at the decision level: an ensemble Q(window, executed chunk), its Polyak target, and V(window),
    over the policy's normalized vector observations (the attribute names `robotrl.rl.iql.critic_update` reads)."""

    def __init__(self, feature_dim: int, chunk_dim: int, config: OfflineFlowConfig) -> None:
        super().__init__()
        self.critic = CriticEnsemble(feature_dim, chunk_dim, config.critics, config.critic_hidden)
        self.target = CriticEnsemble(feature_dim, chunk_dim, config.critics, config.critic_hidden)
        self.target.load_state_dict(self.critic.state_dict())
        self.target.requires_grad_(False)
        self.value = mlp([feature_dim, *config.critic_hidden, 1], act=nn.ReLU, layer_norm=True)

    @torch.no_grad()
    def members(self, features: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        """Every member's Q: (E, B)."""
        return self.critic(features, chunk).squeeze(-1)

    def q(self, features: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        return self.members(features, chunk).min(0).values


def executed(policy: FlowPolicy, x: torch.Tensor, execute: int) -> torch.Tensor:
    """The critic's action input for normalized chunks x (B, >= H, A): what the env would run (unnormalized,
    clipped to the bounds, as `Policy.act` does), normalized again, its first `execute` actions flattened."""
    chunk = policy.normalizer.unnormalize("action", x[:, :execute])
    low = torch.as_tensor(policy.spec.action.low_array(), dtype=chunk.dtype)
    high = torch.as_tensor(policy.spec.action.high_array(), dtype=chunk.dtype)
    return policy.normalizer.normalize("action", torch.clamp(chunk, low, high)).flatten(1)


@torch.no_grad()
def ode_chunks(agent: FlowAgent, obs: dict[str, torch.Tensor], execute: int, seed: int) -> torch.Tensor:
    """The policy's deterministic ODE chunks at windows `obs` as the critic takes them, from start noise seeded by
    `seed` (the same for every policy compared, so the OPE estimates differ by the policies alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        x = agent.policy.sample(obs)
    return executed(agent.policy, x, execute)


@torch.no_grad()
def ope_gate(
    critic: ChunkCritic, features: torch.Tensor, old: torch.Tensor, new: torch.Tensor, episode: np.ndarray, z: float
) -> dict[str, float]:
    """AM-Q's estimated gain of chunks `new` over `old` at held-out windows, and its lower bound: the most pessimistic
    critic member's mean gain (members disagree where the data does not pin Q down) minus z standard errors of the
    mean over held-out episodes (windows of one episode are correlated, episodes are not)."""
    q_old, q_new = critic.members(features, old), critic.members(features, new)
    gain = q_new - q_old  # (E, B)
    _, cluster = np.unique(episode, return_inverse=True)
    per_episode = np.bincount(cluster, gain.mean(0).double().numpy()) / np.bincount(cluster)
    se = float(per_episode.std(ddof=1) / math.sqrt(len(per_episode))) if len(per_episode) > 1 else math.inf
    member = gain.mean(1)
    return {
        "ope/old": float(q_old.min(0).values.mean()),
        "ope/new": float(q_new.min(0).values.mean()),
        "ope/gain": float(member.mean()),
        "ope/gain_lcb": float(member.min()) - z * se,
        "ope/gain_se": se,
        "ope/member_spread": float(member.max() - member.min()),
    }


def improve(
    agent: FlowAgent,
    critic: ChunkCritic,
    optimizer: torch.optim.Optimizer,
    obs: dict[str, torch.Tensor],
    config: OfflineFlowConfig,
    chain_config: ChainConfig,
    reference: FlowPolicy | None,
    rng: np.random.Generator,
    where: str,
) -> dict[str, float]:
    """One policy update (module docstring, step 2) on windows drawn from `obs`: `samples` chains of the current
    policy per window, the advantage of their executed chunks (`config.advantage`), `epochs` clipped PPO passes."""
    pick = torch.from_numpy(rng.integers(0, len(next(iter(obs.values()))), config.windows))
    pick = pick.repeat_interleave(config.samples)
    batch_obs = {k: v[pick] for k, v in obs.items()}
    chain, logp = agent.sample_chain(batch_obs)
    with torch.no_grad():
        features = agent.features(batch_obs)
        q = critic.q(features, executed(agent.policy, chain[:, -1], config.execute))
        if config.advantage == "group":
            adv = q - q.reshape(config.windows, config.samples).mean(1).repeat_interleave(config.samples)
        else:
            adv = q - critic.value(features).squeeze(-1)
    zeros = torch.zeros(len(adv))
    sums: dict[str, list[float]] = {}
    for _ in range(config.epochs):
        order = torch.from_numpy(rng.permutation(len(adv)))
        for lo in range(0, len(adv), config.minibatch_size):
            mb = order[lo : lo + config.minibatch_size]
            batch = {
                "obs": {k: v[mb] for k, v in batch_obs.items()},
                "chain": chain[mb],
                "logp": logp[mb],
                "adv": adv[mb],
                "value": zeros[mb],
                "ret": zeros[mb],
            }
            loss, stats = ppo_loss(agent, batch, chain_config, True, reference)
            _, stats["grad_norm"] = optimizer_step(loss, agent, optimizer, _NoSchedule(), where, config.max_grad_norm)
            for key, x in stats.items():
                sums.setdefault(key, []).append(x)
    sums.pop("loss/value", None)
    return {
        **{k: float(np.mean(x)) for k, x in sums.items()},
        "adv/mean": float(adv.mean()),
        "adv/std": float(adv.std()),
    }


def improve_awr(
    student: FlowPolicy,
    policy: FlowPolicy,
    critic: ChunkCritic,
    optimizer: torch.optim.Optimizer,
    data: Decisions,
    features: torch.Tensor,
    train: np.ndarray,
    config: OfflineFlowConfig,
    rng: np.random.Generator,
    where: str,
) -> dict[str, float]:
    """One policy update by advantage-weighted flow matching: `epochs` gradient steps of `student`, each on
    `windows` training decisions with the data's own chunks, weighted by exp(A / T) of the chunk the data executed
    (A standardized over the batch, clipped at `awr_max_weight`, normalized to mean 1); `policy` follows as the
    students's EMA (`awr_ema`). The learning rate warms up over the first tenth of the steps and decays to zero
    as BC's does: the start is an annealed BC policy, and a constant rate collapsed PushT's (bench/RESULTS.md,
    "Default preset from noise-0.5 demos")."""
    stats: dict[str, list[float]] = {}
    warmup = max(1, config.epochs // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_lr(step, config.epochs, warmup))
    for _ in range(config.epochs):
        k = torch.from_numpy(train[rng.integers(0, len(train), config.windows)])
        with torch.no_grad():
            adv = critic.q(features[k], data.action[k]) - critic.value(features[k]).squeeze(-1)
            z = (adv - adv.mean()) / adv.std().clamp(min=1e-6)
            weight = torch.exp(z / config.awr_temperature).clamp(max=config.awr_max_weight)
            weight = weight / weight.mean()
        loss = student.loss({key: v[k] for key, v in data.obs.items()}, data.chunk[k], data.chunk_is_pad[k], weight)
        value, grad_norm = optimizer_step(loss, student, optimizer, schedule, where, config.max_grad_norm)
        polyak(student, policy, 1.0 - config.awr_ema)
        for key, x in {
            "loss/awr": value,
            "grad_norm": grad_norm,
            "adv/mean": float(adv.mean()),
            "adv/std": float(adv.std()),
            "awr/max_weight": float(weight.max()),
        }.items():
            stats.setdefault(key, []).append(x)
    return {k: float(np.mean(x)) for k, x in stats.items()}


class _NoSchedule:
    """A constant learning rate for `optimizer_step`."""

    def step(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------
def train(config: OfflineFlowConfig) -> RLResult:
    name = type(config).__name__
    policy = load_flow_policy(config.policy, config.sampler_steps, f"{name}.policy")
    if not config.store.exists():
        raise FileNotFoundError(f"{name}.store: {config.store} does not exist (record demos: robotrl data record)")
    run_dir, state_path, rng = start_run(config, f"offline-{config.method}", policy.spec.task, holds=TRAIN_STATE)
    store_path = run_dir / "store.zarr"
    if not config.resume:
        with EpisodeStore.open(config.store) as source:
            source.check_spec(policy.spec, f"{name}.policy's spec")
        shutil.rmtree(store_path, ignore_errors=True)
        shutil.copytree(config.store, store_path)
    execute = min(config.execute, policy.action_horizon)
    chain_config = config.chain_config()
    reference = (
        load_flow_policy(config.policy, config.sampler_steps, f"{name}.policy").requires_grad_(False)
        if config.bc_coef > 0
        else None
    )

    # the chain (chain.py's FlowAgent; its value net is unused), the critic, their optimizers
    agent = FlowAgent(policy, chain_config, policy.config.steps)
    feature_dim = sum(policy.obs_horizon * policy.spec.observations[k].size for k in policy.vector_keys)
    critic = ChunkCritic(feature_dim, execute * policy.action_dim, config)
    # awr trains a student whose EMA is `policy` (gated, rolled out, saved); ppo trains `policy` itself
    student = copy.deepcopy(policy) if config.extraction == "awr" else None
    modules = nn.ModuleDict({"agent": agent, "critic": critic, **({"student": student} if student else {})})
    groups = [{"params": (student or policy).parameters(), "lr": config.lr}]
    if agent.noise_net is not None:
        groups.append({"params": agent.noise_net.parameters(), "lr": config.noise_lr})
    opt = {
        "policy": torch.optim.Adam(groups, eps=1e-5, fused=True),
        "value": torch.optim.Adam(critic.value.parameters(), lr=config.critic_lr),
        "critic": torch.optim.Adam(critic.critic.parameters(), lr=config.critic_lr),
    }
    start = 0
    if config.resume:
        state = load_run_state(state_path, modules, opt, rng)
        start = int(state["step"])  # iterations done
        with EpisodeStore.open(store_path, mode="a") as store:
            store.truncate(int(state["episodes"]))  # rollouts of the iteration that was cut short

    def snapshot() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
        return (
            copy.deepcopy(agent.state_dict()),
            copy.deepcopy(opt["policy"].state_dict()),
            copy.deepcopy(student.state_dict()) if student is not None else None,
        )

    def restore(snap: tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]) -> None:
        agent.load_state_dict(snap[0])
        opt["policy"].load_state_dict(snap[1])
        if student is not None and snap[2] is not None:
            student.load_state_dict(snap[2])

    timing = {"eval": 0.0}
    cached: dict[str, Any] = {}

    def evaluate() -> Any:
        if "stats" not in cached:
            t0 = time.perf_counter()
            cached["stats"] = evaluate_policy(policy, config.eval_episodes, config.eval_envs, execute=execute)
            timing["eval"] += time.perf_counter() - t0
        return cached["stats"]

    log = RunLog(run_dir)
    updates = config.policy_updates
    bar = tqdm(
        total=config.iterations,
        initial=start,
        desc=f"offline {config.method}",
        unit="iteration",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    began = time.perf_counter()
    if start == 0 and config.eval_episodes > 0:
        log.log(0, **{"eval/success_rate": evaluate().success_rate})
    try:
        for it in range(start, config.iterations):
            where = f"offline iteration {it} (last train state: {state_path})"
            data = read_decisions(
                store_path, policy, execute, config.gamma, config.ope_fraction, config.seed, f"{name}.store"
            )
            # 1. the critic on every decision of the store
            features, next_features = agent.features(data.obs), agent.features(data.next_obs)
            stats: dict[str, list[float]] = {}
            for _ in range(config.critic_steps):
                k = torch.from_numpy(rng.integers(0, len(data), config.critic_batch_size))
                batch = {
                    "obs": features[k],
                    "action": data.action[k],
                    "reward": data.reward[k],
                    "done": torch.zeros(len(k)),
                    "next_obs": next_features[k],
                }
                _, _, s = critic_update(critic, opt, batch, config.expectile, data.discount[k], f"{where}: critic")
                polyak(critic.critic, critic.target, config.tau)
                for key, x in s.items():
                    stats.setdefault(CRITIC_STATS[key], []).append(x)
            log.log(
                it * updates,
                **{k: float(np.mean(x[-100:])) for k, x in stats.items()},
                **{"data/decisions": len(data), "data/held_out": float(data.held_out.sum())},
            )

            # 2. gated policy updates: windows of the training episodes; OPE on the held-out ones
            train_index = np.nonzero(~data.held_out)[0]
            train_obs = {k: v[torch.from_numpy(train_index)] for k, v in data.obs.items()}
            held = np.nonzero(data.held_out)[0]
            held = held[np.linspace(0, len(held) - 1, min(len(held), config.ope_windows)).astype(int)]
            ope_obs = {k: v[torch.from_numpy(held)] for k, v in data.obs.items()}
            ope_features, ope_episode, ope_seed = agent.features(ope_obs), data.episode[held], config.seed + it
            old = ode_chunks(agent, ope_obs, execute, ope_seed)
            q_old = float(critic.q(ope_features, old).mean())
            if not math.isfinite(q_old):
                raise TrainingDiverged(
                    f"{where}: the OPE estimate of the current policy is {q_old}; the last good "
                    "train state is kept (resume with a lower critic_lr)"
                )
            accepted = 0
            check_seed = config.seed + 10_000 * (it + 1) + 5_000  # neither the rollouts' nor evaluation's seeds
            start_state = snapshot()
            gate_episodes = config.gate_episodes or config.rollout_episodes
            gate_envs = min(gate_episodes, config.eval_envs)
            start_success = (
                evaluate_policy(policy, gate_episodes, gate_envs, check_seed, execute).success_rate
                if config.success_gate
                else 0.0
            )
            for u in range(updates):
                kept = snapshot()
                if student is not None:
                    s = improve_awr(
                        student,
                        policy,
                        critic,
                        opt["policy"],
                        data,
                        features,
                        train_index,
                        config,
                        rng,
                        f"{where}, policy update {u}",
                    )
                else:
                    s = improve(
                        agent,
                        critic,
                        opt["policy"],
                        train_obs,
                        config,
                        chain_config,
                        reference,
                        rng,
                        f"{where}, policy update {u}",
                    )
                new = ode_chunks(agent, ope_obs, execute, ope_seed)
                gate = ope_gate(critic, ope_features, old, new, ope_episode, config.ope_z)
                ok = math.isfinite(gate["ope/gain_lcb"]) and gate["ope/gain_lcb"] > 0
                log.log(it * updates + u + 1, **s, **gate, **{"ope/accepted": float(ok)})
                if ok:
                    accepted, old = accepted + 1, new
                else:  # roll back: the weights and Adam's moments of before the update
                    restore(kept)

            if config.success_gate and accepted:
                new_success = evaluate_policy(policy, gate_episodes, gate_envs, check_seed, execute).success_rate
                _, lower = success_gain(new_success, start_success, gate_episodes, config.gate_z)
                kept_gain = lower > 0  # else no gain outside the gate's noise: the iteration's updates are undone
                log.log(
                    (it + 1) * updates,
                    **{
                        "gate/start_success": start_success,
                        "gate/new_success": new_success,
                        "gate/gain_lcb": lower,
                        "gate/kept": float(kept_gain),
                    },
                )
                if not kept_gain:
                    restore(start_state)
                    accepted = 0

            # 3. rollouts of the accepted policy into the store
            with EpisodeStore.open(store_path, mode="a") as store:
                before = store.num_episodes
                env = make_eval_env(
                    policy.spec,
                    tuple(policy.obs_keys),
                    config.rollout_envs,
                    config.seed + 10_000 * (it + 1),
                    reward_type=config.reward_type,
                )
                controller = controller_for(policy, execute)
                controller.reset(env.num_envs)
                try:
                    added = record_policy(
                        env,
                        controller,
                        store,
                        config.rollout_episodes,
                        source="policy",
                        on_episode_end=controller.reset_env,
                        seed=config.seed + 10_000 * (it + 1),
                        progress=False,
                        iteration=it,
                    )
                finally:
                    env.close()
                rollout_success = float(np.mean([bool(store.episodes[i].get("success")) for i in added]))
                episodes = store.num_episodes
            cached.clear()

            # 4. held-out success, train state, checkpoint
            done = (it + 1) * updates
            trained = time.perf_counter() - began - timing["eval"]
            row = {
                "iteration/accepted": accepted,
                "rollout/success_rate": rollout_success,
                "data/episodes": episodes,
                "data/added": episodes - before,
                "time/train_seconds": trained,
            }
            if config.eval_episodes > 0:
                row["eval/success_rate"] = evaluate().success_rate
            log.log(done, **row)
            bar.update(1)
            bar.set_postfix(
                accepted=f"{accepted}/{updates}", success=f"{row.get('eval/success_rate', float('nan')):.2f}"
            )
            save_run_state(state_path, it + 1, modules, opt, rng, episodes=episodes)
            policy.save(run_dir / "policy")
    finally:
        bar.close()
    if start >= config.iterations or not (run_dir / "policy").exists():  # resumed a finished run
        policy.save(run_dir / "policy")
    seconds = time.perf_counter() - began - timing["eval"]
    steps = config.iterations * updates
    return finish_run(config, log, evaluate, run_dir / "policy", steps, seconds, run_dir)


def run_train_offline(config: OfflineFlowConfig) -> RLResult:
    result = train(config)
    print(result.summary(f"offline {config.method}", config.eval_episodes, "policy updates"))
    return result
