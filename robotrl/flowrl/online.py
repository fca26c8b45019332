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
                 flow_sde does; on PushT it has no more gradient signal (bench/pg_snr.py; bench/RESULTS.md,
                 "Why online PPO lowers PushT").
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
the chain's K Euler steps, deterministic at evaluation and deployment), so `robotrl policy eval`, `robotrl policy
distill --teacher` and `robotrl policy export` take it unchanged. The loop needs of a policy only FlowPolicy's `encoder`
(conditioning) and `velocity`, so the VLA (a FlowPolicy whose velocity net is its action expert) runs through it
as it is, its instruction carried with the observation windows; the value and noise networks read the policy's
normalized vector observations. A killed run resumes exactly from its last iteration (`--resume`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from robotrl.core.spec import STRING
from robotrl.flowrl.chain import (
    ChainConfig,
    FlowAgent,
    Operator,
    Tally,
    Windows,
    finish_policy_run,
    load_flow_policy,
    ppo_loss,
    rollout,
    training_env,
)
from robotrl.policies.flow import FlowPolicy
from robotrl.training.evaluate import HELD_OUT_SEED, evaluate_policy
from robotrl.training.loop import (
    EMA,
    TRAIN_STATE,
    BestCheckpoint,
    RLResult,
    RunLog,
    TrainClock,
    check_device,
    check_finite_weights,
    load_run_state,
    optimizer_step,
    postfix,
    recent_episodes,
    save_run_state,
    start_run,
)


@dataclass
class OnlineConfig(ChainConfig):
    """Fine-tune a flow policy checkpoint with PPO over its stochastic denoising chain in the parallel vector env."""

    total_steps: int = 300_000
    """environment steps, all envs together"""
    rollout_steps: int = 120
    """env steps per env between updates (a multiple of `execute` keeps every decision whole)"""
    gamma: float = 0.95
    """discount per env step"""
    gae_lambda: float = 0.9
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
    dense_scale: float = 1.0
    """the dense reward below success is multiplied by this in training (success stays 1): PushT's shaping scores
    a near miss at ~0.96 of a success, so with 1.0 the return barely tells them apart. On PushT 0.1 made PPO fall
    faster than 1.0, and `advantage_floor` 0 took most of that back (bench/RESULTS.md, "The reward's weight on
    success"): the rarer the high-return decisions, the more of the update pushes the chain away from its own
    samples"""
    device: str = "cpu"
    """torch device of the policy, value and noise networks ("cuda"): the envs step on the CPU; a GPU runs the chain's
    sampling and the PPO update over a large rollout's thousands of decisions, which PushT's gradient needs for a
    signal-to-noise ratio of 1 (bench/RESULTS.md, "Why online PPO lowers PushT")"""
    eval_seed: int = HELD_OUT_SEED
    """first seed of the run's evaluations (periodic and final): the held-out ones by default; `robotrl run` picks
    the best checkpoint on training seeds, so the seeds its table reports took no part in the choice"""
    eval_sampler_steps: int | None = None
    """Euler steps of the sampler in the run's evaluations (default: the policy's own), so the best checkpoint kept
    is the best for the sampler that will be deployed: 1 for a task whose one-step stage keeps the teacher's one-step
    sampler (on PickPlace it beat the same weights' ten-step samples; bench/RESULTS.md, "PickPlace's one-step
    policy")"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_device(self.device, f"{type(self).__name__}.device")
        name = type(self).__name__
        if self.eval_sampler_steps is not None and self.eval_sampler_steps < 1:
            raise ValueError(
                f"{name}.eval_sampler_steps: expected >= 1 (or None: the policy's own), got {self.eval_sampler_steps}"
            )
        for field in ("total_steps", "rollout_steps", "epochs", "minibatch_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        for field in ("lr", "critic_lr", "noise_lr", "max_grad_norm"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{name}.{field}: expected > 0, got {getattr(self, field)}")
        if not (0.0 < self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise ValueError(
                f"{name}.gamma / gae_lambda: expected (0, 1] and [0, 1], got {self.gamma}, {self.gae_lambda}"
            )
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"{name}.ema: expected a decay in [0, 1), got {self.ema}")
        if not 0.0 < self.dense_scale <= 1.0:
            raise ValueError(f"{name}.dense_scale: expected (0, 1], got {self.dense_scale}")
        if self.critic_warmup < 0:
            raise ValueError(f"{name}.critic_warmup: expected >= 0, got {self.critic_warmup}")


# ---------------------------------------------------------------------------------------------------
# PPO over the rollout's decisions
# ---------------------------------------------------------------------------------------------------
def semi_mdp_gae(
    reward: np.ndarray,
    discount: np.ndarray,
    done: np.ndarray,
    value: np.ndarray,
    env: np.ndarray,
    last_value: np.ndarray,
    lam: float,
) -> np.ndarray:
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


def collect(
    agent: FlowAgent,
    env: Any,
    windows: Windows,
    steps: int,
    execute: int,
    config: OnlineConfig,
    tally: Tally,
    operator: Operator | None = None,
) -> dict[str, Any]:
    """A rollout (`rollout`) with its decisions' GAE advantages (`adv`) and value targets (`ret`), on the agent's
    device."""
    data = rollout(agent, env, windows, steps, execute, config.gamma, tally, operator, config.dense_scale)
    device = data["value"].device
    value = data["value"].cpu().numpy()
    adv = semi_mdp_gae(
        data["reward"], data["discount"], data["done"], value, data["env"], data["last_value"], config.gae_lambda
    )
    data.update(adv=torch.from_numpy(adv).float().to(device), ret=torch.from_numpy(adv + value).float().to(device))
    return data


def explained_variance(data: dict[str, Any]) -> float:
    """1 - Var(return - value) / Var(return) over a rollout's decisions: how much of the returns the value network
    (as it was during the rollout) already predicts; near 0 or below, the advantages are mostly its error."""
    ret, value = data["ret"].cpu().numpy(), data["value"].cpu().numpy()
    return 1.0 - float(np.var(ret - value) / max(float(np.var(ret)), 1e-12))


def make_optimizer(agent: FlowAgent, config: OnlineConfig) -> tuple[torch.optim.Adam, Any]:
    """Adam with a learning rate per network (policy, value, noise), and the constant schedule `optimizer_step`
    steps."""
    policy_group = (
        {"params": [p for p in agent.policy.parameters() if p.requires_grad], "lr": config.noise_lr}
        if agent.method.head is not None
        else {"params": agent.policy.parameters(), "lr": config.lr}
    )
    groups = [policy_group, {"params": agent.value_net.parameters(), "lr": config.critic_lr}]
    if agent.noise_net is not None:
        groups.append({"params": agent.noise_net.parameters(), "lr": config.noise_lr})

    optimizer = torch.optim.Adam(groups, eps=1e-5, fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def ppo_update(
    agent: FlowAgent,
    data: dict[str, Any],
    config: OnlineConfig,
    actor: bool,
    reference: FlowPolicy | None,
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    rng: np.random.Generator,
    where: str,
    extra: Any = None,
) -> dict[str, list[float]]:
    """`config.epochs` passes of shuffled minibatches of a rollout's decisions (with their `adv` and `ret`), one
    clipped step each; `extra()` -> (loss, stats) is added to every minibatch's loss (robotrl/flowrl/hil.py: BC on the
    operator's interventions). Returns every step's stats; weights gone non-finite raise `TrainingDiverged`."""
    count = len(data["adv"])
    sums: dict[str, list[float]] = {}
    keys = [k for k in ("chain", "logp", "value", "adv", "ret", "operated") if k in data]
    for _ in range(config.epochs):
        order = torch.from_numpy(rng.permutation(count)).to(data["adv"].device)
        for lo in range(0, count, config.minibatch_size):
            mb = order[lo : lo + config.minibatch_size]
            batch: dict[str, Any] = {k: data[k][mb] for k in keys}
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
                raise ValueError(
                    f"{self.config_name}.ema: the run in {self.run_dir} was started without an average of "
                    f"its weights (ema 0); resume it with ema 0, got {self.ema.max_decay}"
                )
            self.ema.load(state)


def start_online(config: OnlineConfig, algorithm: str) -> OnlineStart:
    """The starting policy (and its frozen copy for the velocity regularizer), the run directory (refused if a fresh
    run would overwrite one), the envs on training seeds, agent and optimizer, observation windows and tallies."""
    name = type(config).__name__
    policy = load_flow_policy(config.policy, config.sampler_steps, field=f"{name}.policy")
    run_dir, state_path, rng = start_run(config, algorithm, policy.spec.task, holds=TRAIN_STATE)
    reference = None
    if config.bc_coef > 0:
        reference = load_flow_policy(config.policy, config.sampler_steps).requires_grad_(False).to(config.device)
    env = training_env(policy, config)
    agent = FlowAgent(policy, config, policy.config.steps).to(config.device)  # a learning rate per network
    optimizer, constant = make_optimizer(agent, config)
    text = tuple(k for k, v in policy.spec.observations.items() if v.dtype == STRING)
    return OnlineStart(
        policy,
        run_dir,
        state_path,
        rng,
        reference,
        env,
        agent,
        optimizer,
        constant,
        math.ceil(config.total_steps / (config.num_envs * config.rollout_steps)),
        Windows(tuple(policy.obs_keys), policy.obs_horizon, text),
        Tally(config.num_envs),
        EMA(policy, config.ema, warmup=False) if config.ema > 0 else None,
        name,
    )


def train(config: OnlineConfig) -> RLResult:
    run = start_online(config, f"online-{config.method}")
    policy, agent, env, windows, tally, rng = run.policy, run.agent, run.env, run.windows, run.tally, run.rng
    run_dir, state_path, optimizer, iterations = run.run_dir, run.state_path, run.optimizer, run.iterations
    n, horizon, execute = config.num_envs, config.rollout_steps, min(config.execute, policy.action_horizon)
    reports_success = getattr(env, "reports_success", True)
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
    bar = tqdm(
        total=iterations * n * horizon,
        initial=start * n * horizon,
        desc=f"online {config.method}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    clock = TrainClock()
    try:
        for it in range(start, iterations):
            data = collect(agent, env, windows, horizon, execute, config, tally)

            # update: the value network alone while it warms up
            count = len(data["adv"])
            sums = ppo_update(
                agent,
                data,
                config,
                it >= config.critic_warmup,
                run.reference,
                optimizer,
                run.constant,
                rng,
                f"online iteration {it} (last train state: {state_path})",
            )
            run.average()

            # log, evaluate, checkpoint
            now, before = (it + 1) * n * horizon, it * n * horizon
            bar.update(n * horizon)
            recent = recent_episodes(tally.returns, tally.success, 100, reports_success)
            trained_s = clock.trained()
            if now // config.log_every != before // config.log_every or it + 1 == iterations:
                log.log(
                    now,
                    **{k: float(np.mean(x)) for k, x in sums.items()},
                    **{
                        "time/train_seconds": trained_s,
                        "time/steps_per_second": now / max(trained_s, 1e-9),
                        "rollout/decisions": count,
                        "rollout/chain_logp": float(data["logp"].sum(1).mean()),
                        "rollout/explained_variance": explained_variance(data),
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
                    {"adam": optimizer},
                    rng,
                    env,
                    tally=tally.state(),
                    windows=windows.state(),
                    **run.ema_state(),
                )
                run.kept.save(run_dir / "policy")
    finally:
        bar.close()
        env.close()
    return finish_policy_run(config, log, evaluate, run.kept, clock, run_dir, iterations, start, n * horizon, best)


def run_train_online(config: OnlineConfig) -> RLResult:
    result = train(config)
    print(result.summary(f"online {config.method}", config.eval_episodes, "env steps"))
    return result
