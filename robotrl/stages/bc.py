"""Behaviour cloning: from an episode store to a policy checkpoint.

    robotrl train bc --store data/pusht.zarr --steps 20000 policy:diffusion --policy.sampler ddpm
    result = robotrl.stages.bc.train(BCConfig(store=Path("data/pusht.zarr"), policy=DiffusionConfig(sampler="ddpm")))

The policy is any registered one that learns from data (`robotrl.policies.POLICIES`, `@register`), with every
field of its own config: on the command line `policy:<name>` picks it and `--policy.<field>` sets its fields; in
Python `policy` is its config (or its registered name, for its defaults).

Reads top to bottom: data -> policy -> optimizer, LR schedule and EMA -> (resume) -> the loop (sample a
window batch, loss, step, EMA, log, checkpoint, evaluate) -> the final EMA policy, evaluated and saved.
A run killed at any point resumes exactly (`--resume`): the same batches, noise and weights as a run that
was never stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from robotrl.datasets import EpisodeStore
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.envs.rollouts import EpisodeStats
from robotrl.policies.base import Policy, PolicyConfig, policy_class, policy_config, register_all
from robotrl.training.loop import (
    EMA,
    TRAIN_STATE,
    PolicyRunOptions,
    RunLog,
    TrainClock,
    check_device,
    cosine_lr,
    jsonable,
    load_train_state,
    optimizer_step,
    rng_state,
    save_train_state,
    set_rng_state,
    start_run,
)


@dataclass
class BCConfig(PolicyRunOptions):
    """Train a policy by behaviour cloning on an episode store; evaluates it in the vector env."""

    store: Path = Path("data/pusht.zarr")
    policy: PolicyConfig | str = "flow"
    """the policy and its config (`policy:<name>`, then `--policy.<field>`): flow or diffusion (multi-step samplers),
    meanflow (one step, learned from the data alone), vla (images + language instruction + state through a
    transformer with a flow action expert; needs a store with instructions), or any other registered policy"""
    steps: int = 20_000
    batch_size: int = 256
    lr: float = 1e-4
    weight_decay: float = 1e-6
    warmup: int = 500
    ema: float = 0.999
    """EMA decay of the weights that are evaluated and saved (0 turns EMA off)"""
    execute: int = 8
    """actions executed per predicted chunk at evaluation"""
    success_only: bool = False
    """train on the episodes in which the task succeeded (filtered BC: demonstrations recorded under heavy noise or
    domain randomization fail often, and cloning the failures teaches them)"""
    success_tail: int | None = None
    """train on each episode up to this many steps after its first success (None: every step). Success counts at
    any step, and demonstrations that run on after it (PushT's expert holds the T for most of its episode) spend
    most samples on steps success never needed (datasets/sampler.py, SequenceConfig.success_tail)"""
    device: str = "cpu"
    """torch device the policy trains on ("cuda", "cuda:1"); evaluation and the saved weights are the same either
    way (checkpoints hold CPU tensors). A GPU against the CPU: bench/RESULTS.md, "BC on a GPU" """
    checkpoint_every: int = 1000
    """gradient steps between train states"""
    log_every: int = 50
    """gradient steps between metrics rows"""
    threads: int = 2
    """torch CPU threads (a U-Net's convolutions use a second core)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.policy, str):
            self.policy = policy_config(self.policy)
        cls = policy_class(self.policy)
        if not cls.learns_from_data:
            trainable = sorted(name for name, c in register_all().items() if c.learns_from_data)
            raise ValueError(
                f"BCConfig.policy: {cls.name!r} learns from a teacher (robotrl policy distill), not "
                f"from data; expected one of {trainable}"
            )
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"BCConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"BCConfig.ema: expected a decay in [0, 1), got {self.ema}")
        check_device(self.device, "BCConfig.device")


@dataclass
class BCResult:
    checkpoint: Path
    steps: int
    train_seconds: float
    final_loss: float
    success_rate: float | None
    success_ci95: tuple[float, float] | None
    run_dir: Path
    mean_return: float | None = None
    """the final evaluation's mean return (what an env without success is judged by)"""


def make_policy(config: BCConfig, store: EpisodeStore) -> Policy:
    """The registered policy of `config.policy`'s class, built with that config on the store's spec and
    statistics."""
    assert isinstance(config.policy, PolicyConfig)
    return policy_class(config.policy)(store.spec, config.policy, store.stats())


def successful_episodes(store: EpisodeStore) -> list[int]:
    chosen = [i for i, meta in enumerate(store.episodes) if meta.get("success")]
    if not chosen:
        raise ValueError(
            f"BCConfig.success_only: expected a store with successful episodes, got none of "
            f"{len(store.episodes)} in {store.path}"
        )
    return chosen


def evaluate(policy: Policy, config: BCConfig) -> EpisodeStats:
    from robotrl.training.evaluate import evaluate_policy

    return evaluate_policy(policy, config.eval_episodes, config.eval_envs, execute=config.execute)


def train(config: BCConfig) -> BCResult:
    store = EpisodeStore.open(config.store)
    chosen = config.policy
    assert isinstance(chosen, PolicyConfig)
    name = policy_class(chosen).name
    run_dir, state_path, rng = start_run(config, f"bc-{name}", store.spec.task, holds=TRAIN_STATE)

    # data
    windows = SequenceConfig(
        chosen.obs_horizon, chosen.action_horizon, chosen.obs_keys, success_tail=config.success_tail
    )
    sampler = SequenceSampler.from_store(
        store, windows, episodes=successful_episodes(store) if config.success_only else None
    )

    # policy, optimizer, schedule, EMA
    policy = make_policy(config, store).to(config.device)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=True
    )  # one kernel for all weights (bench/train_step.py)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr(s, config.steps, config.warmup))
    ema = EMA(policy, config.ema) if config.ema > 0 else None

    start = 0
    if config.resume:
        state = load_train_state(state_path)
        policy.load_state_dict(state["policy"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        if ema is not None:
            ema.load(state)
        set_rng_state(state["rng"], rng)
        start = state["step"]

    def evaluate_now() -> EpisodeStats:
        stats = evaluate(ema.model if ema else policy, config)
        policy.train()  # the evaluation left it in eval mode
        return stats

    def checkpoint(step: int) -> None:
        save_train_state(
            state_path,
            step=step,
            policy=policy.state_dict(),
            optimizer=optimizer.state_dict(),
            schedule=schedule.state_dict(),
            **(ema.state() if ema else {}),
            rng=rng_state(rng),
        )
        (ema.model if ema else policy).save(run_dir / "checkpoint")

    log = RunLog(run_dir)
    bar = tqdm(
        total=config.steps,
        initial=start,
        desc=f"bc {name}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    clock = TrainClock()
    loss_value = float("nan")
    policy.train()
    for step in range(start, config.steps):
        loss = policy.compute_loss(sampler.sample(config.batch_size, rng))
        loss_value, grad_norm = optimizer_step(
            loss, policy, optimizer, schedule, f"bc step {step} (last checkpoint: {run_dir / 'checkpoint'})"
        )
        if ema is not None:
            ema.update(policy)
        done = step + 1
        bar.update(1)
        if done % config.log_every == 0 or done == config.steps:
            log.log(
                done, **{"train/loss": loss_value, "train/grad_norm": grad_norm, "train/lr": schedule.get_last_lr()[0]}
            )
            bar.set_postfix(loss=f"{loss_value:.4f}")
        if done % config.checkpoint_every == 0 or done == config.steps:
            checkpoint(done)
        clock.evaluate_every(config, log, evaluate_now, done, step, last=done == config.steps)
    bar.close()
    seconds = clock.trained()

    final = ema.model if ema else policy
    final.eval()
    path = final.save(run_dir / "policy")
    success, ci, mean_return = None, None, None
    if config.eval_episodes > 0:
        stats = evaluate(final, config)
        mean_return = stats.mean_return
        if stats.reports_success:
            success, ci = stats.success_rate, stats.success_ci95()
        log.log(config.steps, **stats.metrics())
    log.close()
    result = BCResult(path, config.steps, seconds, loss_value, success, ci, run_dir, mean_return)
    (run_dir / "result.json").write_text(json.dumps(jsonable(result), indent=2))
    return result


def run_train_bc(config: BCConfig) -> BCResult:
    result = train(config)
    ci = f" (95% CI {result.success_ci95[0]:.1%}-{result.success_ci95[1]:.1%})" if result.success_ci95 else ""
    success = (
        f"success {result.success_rate:.1%}{ci} over {config.eval_episodes} held-out episodes; "
        if result.success_rate is not None
        else f"mean return {result.mean_return:.2f} over {config.eval_episodes} held-out episodes (no success "
        "reported); "
        if result.mean_return is not None
        else ""
    )
    assert isinstance(config.policy, PolicyConfig)  # BCConfig.__post_init__ resolved a name
    print(
        f"bc {policy_class(config.policy).name}: {success}{result.steps} steps in {result.train_seconds:.0f} s; "
        f"policy {result.checkpoint}"
    )
    return result
