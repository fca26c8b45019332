"""The RL-100 pipeline end to end: `robotrl run`.

    robotrl run                                   # PushT, the default preset (<= 15 min on 2 cores)
    robotrl run --preset smoke                    # every stage on a tiny budget (CI)
    robotrl run --task PickPlace --preset full    # the long version; PickPlace trains the VLA
    robotrl run --task my_envs:make_env --demonstrator my_envs:Scripted    # an outside env, with the user's expert
    robotrl.stages.pipeline.run(PipelineConfig(preset="smoke"))                       # the same dataclass

Stages, each a command of its own that reads the previous stage's files and writes its own under run_dir:

    demos    robotrl data record       the task's scripted expert (noise <= 0.5), or the
                                       outside env's `--demonstrator`                      -> demos.zarr
    bc       robotrl train bc          BC flow (or VLA) policy                            -> bc/policy
    offline  robotrl train offline     RL-100's iterative offline RL (critic from the store, OPE-gated updates:
                                       AWR by default, `--offline-extraction ppo` for the
                                       chain's clipped PPO; rollouts added to the store)   -> offline/policy
    online   robotrl train hil         online RL in the parallel vector env with the task's scripted expert (or
                                       the demonstrator) as the operator taking over when the policy strays
                                       (HIL); `--no-interventions`: plain `robotrl train online`; the full
                                       preset hands on the best of its evaluations on training seeds, the last
                                       weights otherwise; accepted only
                                       if not worse than its start on fresh seeds (else online/policy is the
                                       start's)                                            -> online/policy
    distill  robotrl policy distill    the one-step consistency student of the RL'd policy (the VLA's
                                       keeps its prefix and action expert), on the online stage's store
                                       (the teacher's own states) plus DAgger rounds (the
                                       student's own, labelled by the teacher); kept only if
                                       it beats its start, the teacher's one-step sampler  -> distill/policy
    export   robotrl policy export     the student as ONNX + manifest for the runtime      -> export/

Every policy stage is then evaluated by the pipeline itself on the same held-out seeds (so the rows compare), and
its batch-1 CPU inference latency timed. `run_dir/stages.jsonl` gets one row per finished stage as it finishes
and `run_dir/summary.md` the table; `--resume` skips the stages whose rows are there, so a killed pipeline goes
on from the stage it was in (that stage starts over).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from robotrl.core.files import default_run_dir
from robotrl.core.spec import STRING
from robotrl.training.loop import RLResult

STAGES = ("demos", "bc", "offline", "online", "distill", "export")


@dataclass(frozen=True)
class Budget:
    """How much each stage does; a preset is one of these."""

    demo_episodes: int
    bc_steps: int
    bc_batch_size: int
    bc_channels: tuple[int, ...]
    bc_lr: float
    offline_iterations: int
    offline_critic_steps: int
    offline_policy_updates: int
    """ppo extraction: OPE-gated updates per iteration"""
    offline_awr_steps: int
    """awr extraction: advantage-weighted flow-matching steps per iteration (one gated update)"""
    offline_rollout_episodes: int
    offline_gate_episodes: int
    """training-seed episodes of each policy on which the offline update must gain (beyond one standard error) to
    be kept"""
    online_total_steps: int
    online_num_envs: int
    online_rollout_steps: int
    online_gate_episodes: int
    """training-seed episodes on which the online policy must not lose to its start to be handed on"""
    online_eval_every: int
    """env steps between the online stage's evaluations on online_gate_episodes training-seed episodes (other seeds
    than the gate's); the best evaluated weights are handed on (0: the last weights)"""
    distill_steps: int
    distill_batch_size: int
    distill_dagger_rounds: int
    distill_dagger_episodes: int
    distill_gate_episodes: int
    """training-seed episodes on which the distilled student must beat its start (the teacher's one-step sampler)"""
    eval_episodes: int
    eval_envs: int
    episode_steps: int | None = None
    """at most this many steps an episode (None: the task's own length). The demos are recorded with it and every
    later stage runs the length its policy's spec carries, so a short smoke run evaluates short episodes"""


PRESETS: dict[str, Budget] = {
    "smoke": Budget(
        demo_episodes=6,
        bc_steps=40,
        bc_batch_size=16,
        bc_channels=(16, 32),
        bc_lr=1e-4,
        offline_iterations=1,
        offline_critic_steps=50,
        offline_policy_updates=2,
        offline_awr_steps=10,
        offline_rollout_episodes=2,
        offline_gate_episodes=2,
        online_total_steps=512,
        online_num_envs=4,
        online_rollout_steps=64,
        online_gate_episodes=2,
        online_eval_every=256,
        distill_steps=20,
        distill_batch_size=16,
        distill_dagger_rounds=1,
        distill_dagger_episodes=2,
        distill_gate_episodes=2,
        eval_episodes=4,
        eval_envs=4,
        episode_steps=150,
    ),
    # sized to 15 minutes on 2 cores, which 8,000 BC steps, 61,440 online env steps and twice the offline
    # critic overran (bench/RESULTS.md, "The default preset's wall-clock"); --bc-steps / --online-total-steps give
    # them back
    "default": Budget(
        demo_episodes=200,
        bc_steps=6_000,
        bc_batch_size=64,
        bc_channels=(32, 64, 128),
        bc_lr=1e-3,
        offline_iterations=1,
        offline_critic_steps=1_000,
        offline_policy_updates=10,
        offline_awr_steps=400,
        offline_rollout_episodes=10,
        offline_gate_episodes=10,
        online_total_steps=30_720,
        online_num_envs=16,
        online_rollout_steps=160,
        online_gate_episodes=20,
        online_eval_every=0,
        distill_steps=600,
        distill_batch_size=64,
        distill_dagger_rounds=1,
        distill_dagger_episodes=25,
        distill_gate_episodes=30,
        eval_episodes=50,
        eval_envs=50,
    ),
    "full": Budget(
        demo_episodes=200,
        bc_steps=22_000,
        bc_batch_size=64,
        bc_channels=(64, 128, 256),
        bc_lr=1e-4,
        offline_iterations=5,
        offline_critic_steps=5_000,
        offline_policy_updates=10,
        offline_awr_steps=3_000,
        offline_rollout_episodes=50,
        offline_gate_episodes=100,
        online_total_steps=1_000_000,
        online_num_envs=32,
        online_rollout_steps=160,
        online_gate_episodes=200,
        online_eval_every=200_000,
        distill_steps=5_000,
        distill_batch_size=64,
        distill_dagger_rounds=3,
        distill_dagger_episodes=100,
        distill_gate_episodes=200,
        eval_episodes=500,
        eval_envs=50,
    ),
}


#: PipelineConfig's numeric fields that override its preset's Budget field of the same name
OVERRIDES = (
    "demo_episodes",
    "bc_steps",
    "bc_batch_size",
    "bc_lr",
    "offline_gate_episodes",
    "online_total_steps",
    "online_num_envs",
    "online_eval_every",
    "online_gate_episodes",
    "distill_steps",
    "distill_batch_size",
    "distill_gate_episodes",
    "eval_episodes",
)


@dataclass
class PipelineConfig:
    """Demos -> BC -> offline RL -> online RL with interventions -> one-step distillation -> export, evaluated."""

    task: str = "PushT"
    preset: Literal["smoke", "default", "full"] = "default"
    """the stages' budget (PRESETS); any of the options below that is set overrides its preset value"""
    policy: str | None = None
    """the BC policy: a registered flow policy that learns from data and names a student (default: vla for a task
    with a language instruction, flow otherwise); flow is the state policy: its demos are recorded without camera
    images, so a camera task (PickPlace) trains and evaluates on its state vector (which names the target) and
    nothing is rendered; the VLA trains by its own BC recipe (`BC_RECIPES`: one frame, batch 32, lr 3e-4)"""
    interventions: bool = True
    """online stage with the simulated operator (robotrl train hil); False: plain online RL over the same Flow-SDE
    chain (on PushT from a half-trained BC policy it gained where the operator's stage held level; bench/RESULTS.md,
    "PushT and PickPlace with the anchored online stage")"""
    offline_extraction: Literal["ppo", "awr"] = "awr"
    """the offline stage's policy update (`robotrl train offline --extraction`): awr, advantage-weighted flow
    matching on the store, or ppo, RL-100's clipped PPO over the chain (on Reach awr raised a half-trained policy
    and every ppo update was undone by its gates; bench/RESULTS.md, "The offline stage's policy extraction")"""
    demonstrator: str | None = None
    """an outside env's demonstrator (`module:callable`, as `robotrl data record --demonstrator`): it records the
    demos and is the online stage's operator (an outside env has no scripted expert; its stages are judged by the
    success it reports)"""
    demo_noise: float | None = None
    """the scripted expert's noise for the demos; default: the task's demo_noise (its stand-in for a human)
    capped at 0.5, because BC learns PushT from noise-0.5 demos and barely from noise-1.0 ones (bench/RESULTS.md,
    "Sim-to-real twins over ROS 2")"""
    demo_episodes: int | None = None
    bc_steps: int | None = None
    bc_batch_size: int | None = None
    bc_lr: float | None = None
    bc_channels: tuple[int, ...] | None = None
    """the flow policy's U-Net widths. On PushT, `--bc-steps 10000 --bc-batch-size 256 --bc-lr 1e-3 --bc-channels 32 64
    128` trains a better state flow policy on one CPU core than the full preset's BC, in under half its time
    (bench/RESULTS.md, "On this machine's CPU")"""
    offline_gate_episodes: int | None = None
    """training-seed episodes of each policy in the offline stage's success gate (default preset: 10). Its update is
    kept only on a gain beyond one standard error (`train offline --gate-z`): on PushT 10 gate episodes let through
    an AWR update that lowered BC and the online stage after it (bench/RESULTS.md, "PushT through `robotrl run`")"""
    online_total_steps: int | None = None
    online_lr: float = 3e-5
    """the online stage's learning rate (`train hil`'s own default, 3e-4, is for its operator's BC loss: with it a
    half-trained PushT policy fell; bench/RESULTS.md, "The reward's weight on success")"""
    online_bc_coef: float = 1.0
    """the online stage's velocity anchor (`train online|hil --bc-coef`; 0 frees the update). With it at lr 3e-5
    the stage raised PickPlace and held PushT level, where the unanchored stage at 3e-4 had lowered PushT
    (bench/RESULTS.md, "PushT and PickPlace with the anchored online stage")"""
    online_num_envs: int | None = None
    """parallel envs of the online stage (a GPU's PushT chain: 64, bench/device_pipeline.sh)"""
    online_minibatch_size: int | None = None
    """decisions per PPO minibatch of the online stage (default: `train online`'s 64)"""
    online_criterion: Literal["stray", "stall"] = "stray"
    """when the simulated operator takes over (`train hil --criterion`): stray where the policy's actions leave the
    expert's (PickPlace's gains), stall where the episode makes no progress (PushT, whose policy may push the T from
    another side than the expert's: stray took over a large share of its steps; bench/RESULTS.md, "The operator
    from a strong BC policy")"""
    online_operator_fraction: float = 0.0
    """share of the online stage's BC windows drawn from the operator's take-overs (`train hil --operator-fraction`;
    PushT's GPU chain: 0.5)"""
    online_ema: float = 0.0
    """decay per update of the online stage's weight average, handed on instead of its last weights (`train online
    --ema`; 0: the last weights). PushT's chains on a GPU and on this machine's CPU: 0.8 (bench/RESULTS.md, "PushT
    stage by stage")"""
    online_eval_every: int | None = None
    """env steps between the online stage's evaluations on training seeds, its best checkpoint handed on (the
    preset's: default none, full 200,000)"""
    online_gate_episodes: int | None = None
    """training-seed episodes of each of the online stage's evaluations and of its gate (default preset: 20)"""
    online_sampler_steps: int | None = None
    """Euler steps of the sampler the online stage picks its best checkpoint by and is gated with (default: the
    policy's own). 1 where the one-step stage keeps the teacher's one-step sampler: on PickPlace it beat the same
    weights' ten-step samples (bench/RESULTS.md, "PickPlace's one-step policy")"""
    distill_steps: int | None = None
    distill_batch_size: int | None = None
    """the one-step student's batch (PushT's students at 1,024 on a GPU lost less to their teacher than at 64 on the
    CPU; bench/RESULTS.md, "On a GPU, stage by stage")"""
    distill_gate_episodes: int | None = None
    """training-seed episodes on which the one-step student must match its start to be deployed (default preset: 30).
    Its candidates must differ by more than the gate's noise: on PickPlace's VLA 100 episodes kept the online gain
    where 30 could not tell the candidates apart (bench/RESULTS.md, "The VLA's chain to its one-step policy")"""
    eval_episodes: int | None = None
    """held-out episodes each stage is evaluated on (default: the preset's)"""
    execute: int = 8
    """actions executed per predicted chunk (training rollouts and evaluation alike)"""
    run_dir: Path | None = None
    """default: runs/pipeline-<task>-<time>"""
    resume: bool = False
    """skip the stages already finished in run_dir"""
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    """torch device of the BC, online and distill stages ("cuda"; the envs step on the CPU either way): PushT's flow
    policy gains most from a batch a GPU trains in minutes and this machine's cores in hours (bench/RESULTS.md, "BC
    on a GPU"); the offline stage runs on the CPU"""
    progress: bool = True

    def __post_init__(self) -> None:
        from robotrl.training.loop import check_device  # torch: when a pipeline is configured, not with the CLI

        check_device(self.device, "PipelineConfig.device")
        if self.policy is not None:
            check_policy(self.policy)
        if self.preset not in PRESETS:
            raise ValueError(f"PipelineConfig.preset: expected one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.offline_extraction not in ("ppo", "awr"):
            raise ValueError(
                f"PipelineConfig.offline_extraction: expected 'ppo' or 'awr', got {self.offline_extraction!r}"
            )
        for name in (*OVERRIDES, "online_lr", "online_sampler_steps", "online_minibatch_size"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"PipelineConfig.{name}: expected > 0, got {value}")
        if not 0.0 <= self.online_bc_coef < float("inf"):
            raise ValueError(f"PipelineConfig.online_bc_coef: expected >= 0, got {self.online_bc_coef}")
        if not 0.0 <= self.online_ema < 1.0:
            raise ValueError(f"PipelineConfig.online_ema: expected a decay in [0, 1), got {self.online_ema}")
        if self.online_criterion not in ("stray", "stall"):
            raise ValueError(
                f"PipelineConfig.online_criterion: expected 'stray' or 'stall', got {self.online_criterion!r}"
            )
        if not 0.0 <= self.online_operator_fraction <= 1.0:
            raise ValueError(
                f"PipelineConfig.online_operator_fraction: expected a share in [0, 1], got "
                f"{self.online_operator_fraction}"
            )
        if not self.interventions and (self.online_criterion != "stray" or self.online_operator_fraction):
            raise ValueError(
                "PipelineConfig.interventions: the operator's options (online_criterion="
                f"{self.online_criterion!r}, online_operator_fraction={self.online_operator_fraction}) "
                "expected the online stage with the operator, got interventions=False"
            )
        if self.bc_channels is not None:
            self.bc_channels = tuple(self.bc_channels)
            if not self.bc_channels or min(self.bc_channels) < 1:
                raise ValueError(f"PipelineConfig.bc_channels: expected > 0, got {self.bc_channels}")
        if self.demo_noise is not None and not self.demo_noise >= 0.0:
            raise ValueError(f"PipelineConfig.demo_noise: expected >= 0 or None (the task's), got {self.demo_noise}")
        from robotrl.envs.outside import is_outside

        if is_outside(self.task) and self.demonstrator is None:
            raise ValueError(
                f"PipelineConfig.demonstrator: {self.task} is an outside env, without a scripted expert; expected "
                "its demonstrator as --demonstrator module:callable, got none"
            )
        if self.demonstrator is not None and self.demo_noise is not None:
            raise ValueError(
                f"PipelineConfig.demo_noise: applies to a task's scripted expert, not to the demonstrator "
                f"{self.demonstrator}; expected none, got {self.demo_noise}"
            )
        for name in ("execute", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"PipelineConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.resume and self.run_dir is None:
            raise ValueError("PipelineConfig.resume: needs run_dir (the pipeline to continue)")
        if self.run_dir is not None:
            self.run_dir = Path(self.run_dir)

    def overrides(self) -> dict[str, Any]:
        """The budget fields set on top of the preset."""
        return {k: v for k in (*OVERRIDES, "bc_channels") if (v := getattr(self, k)) is not None}

    def budget(self) -> Budget:
        return dataclasses.replace(PRESETS[self.preset], **self.overrides())


@dataclass
class StageRow:
    """One line of the pipeline's table."""

    stage: str
    output: str
    """the stage's file (a policy checkpoint, the store, the exported folder)"""
    success_rate: float | None
    success_ci95: tuple[float, float] | None
    env_steps: int
    """environment steps the stage itself took (demos recorded, rollouts; 0 for learning from files)"""
    seconds: float
    """the stage's wall-clock, its evaluation excluded"""
    latency_ms: float | None
    """batch-1 CPU inference p50 of the stage's policy (one decision: an action chunk)"""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# the stages: each returns (output path, env steps, extra) and leaves evaluation to the pipeline


def stage_demos(config: PipelineConfig, budget: Budget, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.datasets.record import record_expert
    from robotrl.envs import is_outside, spec_of

    # robotrl's tasks all report success; an outside env's spec says whether it does
    if is_outside(config.task) and not spec_of(config.task).metadata["success"]:
        raise ValueError(
            f"PipelineConfig.task: {config.task} reports no success (info['success'] or 'is_success'), by which "
            "robotrl run judges and gates its stages; train it stage by stage (robotrl train ...), judged by return"
        )
    out = run_dir / "demos.zarr"
    source: dict[str, Any] = (
        {"demonstrator": config.demonstrator}
        if config.demonstrator is not None
        else {"noise": demo_noise(config), "render_images": policy_kind(config) != STATE_POLICY}
    )
    cap = budget.episode_steps
    if cap is not None and not is_outside(config.task) and cap < spec_of(config.task).episode_steps:
        source["episode_steps"] = cap  # the task is built only for a budget that caps its episodes (smoke)
    store = record_expert(
        out,
        config.task,
        budget.demo_episodes,
        num_envs=min(8, budget.demo_episodes),
        seed=config.seed,
        progress=config.progress,
        **source,
    )
    summary = store.summary()
    store.close()
    return (
        out,
        int(summary["steps"]),
        {"episodes": int(summary["episodes"]), "demo_success_rate": float(summary["success_rate"])},
    )


#: the state policy: its demos are recorded without camera images (any other policy's with them)
STATE_POLICY = "flow"
#: BC recipes of policies that train better by their own than by the preset's batch, lr and U-Net widths: BCConfig's
#: fields, and their policy config's under "policy". The VLA's, one frame, batch 32, lr 3e-4, trains it further on
#: PickPlace in less time than the flow policy's (two frames, batch 64, lr 1e-3; bench/RESULTS.md, "The VLA's BC
#: recipe")
BC_RECIPES: dict[str, dict[str, Any]] = {"vla": {"batch_size": 32, "lr": 3e-4, "policy": {"obs_horizon": 1}}}


def check_policy(name: str) -> None:
    """A policy every stage can take: registered, learning from data (BC), a flow policy (offline and online RL
    train its chain) and a teacher (distillation)."""
    from robotrl.policies.base import register_all
    from robotrl.policies.flow import FlowPolicy

    fits = sorted(
        n
        for n, c in register_all().items()
        if c.learns_from_data and issubclass(c, FlowPolicy) and c.student is not None
    )
    if name not in fits:
        raise ValueError(
            f"PipelineConfig.policy: expected a registered flow policy that learns from data and names "
            f"a student, one of {fits}, got {name!r}"
        )


def bc_recipe(config: PipelineConfig, budget: Budget) -> dict[str, Any]:
    """BCConfig's options of the BC stage, its policy config under "policy": the preset's batch, lr and U-Net
    widths, or the policy's own BC recipe (at most the preset's batch: smoke's stays small); --bc-batch-size and
    --bc-lr override either."""
    from dataclasses import fields, replace

    from robotrl.policies.base import policy_config

    name = policy_kind(config)
    recipe = BC_RECIPES.get(name)
    policy = policy_config(name)
    if recipe is None:
        widths: dict[str, Any] = (
            {"channels": budget.bc_channels} if "channels" in {f.name for f in fields(policy)} else {}
        )
        return {"batch_size": budget.bc_batch_size, "lr": budget.bc_lr, "policy": replace(policy, **widths)}
    return {
        "batch_size": config.bc_batch_size or min(recipe["batch_size"], budget.bc_batch_size),
        "lr": config.bc_lr or recipe["lr"],
        "policy": replace(policy, **recipe.get("policy", {})),
    }


def stage_bc(config: PipelineConfig, budget: Budget, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.stages.bc import BCConfig, train

    result = train(
        BCConfig(
            store=run_dir / "demos.zarr",
            steps=budget.bc_steps,
            **bc_recipe(config, budget),
            execute=config.execute,
            warmup=min(500, budget.bc_steps // 10),
            eval_episodes=0,
            run_dir=run_dir / "bc",
            seed=config.seed,
            threads=config.threads,
            device=config.device,
            progress=config.progress,
            checkpoint_every=max(1, budget.bc_steps // 4),
        )
    )
    return result.checkpoint, 0, {"final_loss": result.final_loss}


def stage_offline(config: PipelineConfig, budget: Budget, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.datasets import EpisodeStore
    from robotrl.flowrl.offline import OfflineFlowConfig, train

    extraction: dict[str, Any] = {"policy_updates": budget.offline_policy_updates}
    if config.offline_extraction == "awr":
        extraction = {
            "extraction": "awr",
            "lr": 3e-4,
            "policy_updates": 1,
            "epochs": budget.offline_awr_steps,
            "windows": budget.bc_batch_size,
        }
    result = train(
        OfflineFlowConfig(
            policy=run_dir / "bc" / "policy",
            store=run_dir / "demos.zarr",
            iterations=budget.offline_iterations,
            critic_steps=budget.offline_critic_steps,
            rollout_episodes=budget.offline_rollout_episodes,
            rollout_envs=min(10, budget.offline_rollout_episodes),
            gate_episodes=budget.offline_gate_episodes,
            eval_envs=budget.eval_envs,
            execute=config.execute,
            eval_episodes=0,
            run_dir=run_dir / "offline",
            seed=config.seed,
            threads=config.threads,
            progress=config.progress,
            **extraction,
        )
    )
    # the env steps it took: the rollouts it appended to its copy of the store
    with (
        EpisodeStore.open(run_dir / "offline" / "store.zarr") as grown,
        EpisodeStore.open(run_dir / "demos.zarr") as demos,
    ):
        env_steps = grown.num_steps - demos.num_steps
    logged = [json.loads(line) for line in (run_dir / "offline" / "metrics.jsonl").read_text().splitlines()]
    gates = [
        {"start_success": r["gate/start_success"], "new_success": r["gate/new_success"], "kept": bool(r["gate/kept"])}
        for r in logged
        if "gate/kept" in r
    ]
    kept = sum(int(r["iteration/accepted"]) for r in logged if "iteration/accepted" in r)
    return result.weights, env_steps, {"policy_updates": result.steps, "kept_updates": kept, "gates": gates}


def stage_online(config: PipelineConfig, budget: Budget, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.training.evaluate import training_seed

    # with online_eval_every, the run evaluates on training seeds (not the gate's, not the held-out ones) and keeps
    # its best weights: PickPlace's online curve dips and climbs (bench/RESULTS.md, "PickPlace with the state flow
    # policy")
    selection = (
        {
            "eval_every": budget.online_eval_every,
            "eval_episodes": budget.online_gate_episodes,
            "eval_seed": training_seed(config.seed, 8_000),
            "eval_sampler_steps": config.online_sampler_steps,
        }
        if budget.online_eval_every
        else {}
    )
    common: dict[str, Any] = {
        "policy": run_dir / "offline" / "policy",
        "num_envs": budget.online_num_envs,
        "total_steps": budget.online_total_steps,
        "rollout_steps": budget.online_rollout_steps,
        "execute": config.execute,
        "eval_episodes": 0,
        "run_dir": run_dir / "online",
        "seed": config.seed,
        "threads": config.threads,
        "device": config.device,
        "progress": config.progress,
        "lr": config.online_lr,
        "bc_coef": config.online_bc_coef,
        "ema": config.online_ema,
        **selection,
        **({"minibatch_size": config.online_minibatch_size} if config.online_minibatch_size else {}),
    }
    extra: dict[str, Any] = {}
    result: RLResult  # the HIL run's is a HilResult, with its intervention rates
    if config.interventions:
        from robotrl.flowrl.hil import HilConfig, train as train_hil

        # the operator's stretches seed from the demos and are recorded to online/hil.zarr, the demos left as they are
        result = train_hil(
            HilConfig(
                operator=config.demonstrator or "expert",
                demos=run_dir / "demos.zarr",
                criterion=config.online_criterion,
                operator_fraction=config.online_operator_fraction,
                **common,
            )
        )
        extra = {
            "intervention_rate_first": result.first_intervention_rate,
            "intervention_rate_last": result.last_intervention_rate,
            "store": str(result.store),
        }
    else:
        from robotrl.flowrl.online import OnlineConfig, train as train_online

        # the hil stage's chain method, without the operator: the anchor needs a method that trains the flow network
        result = train_online(OnlineConfig(method="flow_sde", **common))
    if result.best_weights is not None:
        extra["best"] = hand_on_best(result.best_weights, run_dir / "online", result.best)
    return run_dir / "online" / "policy", result.steps, {**extra, "gate": accept_online(config, budget, run_dir)}


def hand_on_best(best: Path, online: Path, record: dict[str, float] | None) -> dict[str, Any]:
    """online/policy becomes the best evaluated weights; the last ones move to online/last_policy."""
    last = online / "last_policy"
    shutil.rmtree(last, ignore_errors=True)
    (online / "policy").rename(last)
    shutil.copytree(best, online / "policy")
    return {**(record or {}), "last_policy": str(last)}


def accept_online(config: PipelineConfig, budget: Budget, run_dir: Path) -> dict[str, Any]:
    """RL-100's acceptance test for the online stage: its policy is handed on only if it does not lose to its start
    on fresh training-seed episodes (a PushT default run's online stage lowered it; bench/RESULTS.md, "PushT default
    preset with DAgger distillation"); otherwise online/policy gets the start's weights and the RL'd ones move to
    online/rejected_policy."""
    from robotrl.policies import load
    from robotrl.training.evaluate import not_worse, training_seed

    start, online = run_dir / "offline" / "policy", run_dir / "online" / "policy"
    seed = training_seed(config.seed, 9_000)  # none of the distill stage's DAgger and gate seeds
    policies = [load(online), load(start)]
    for policy in policies:
        policy.config.steps = config.online_sampler_steps or policy.config.steps
    ok, online_rate, start_rate = not_worse(
        policies[0], policies[1], budget.online_gate_episodes, budget.eval_envs, seed, config.execute
    )
    kept = "online" if ok else "start"
    if not ok:
        rejected = run_dir / "online" / "rejected_policy"
        shutil.rmtree(rejected, ignore_errors=True)
        online.rename(rejected)
        shutil.copytree(start, online)
    return {"start_success": start_rate, "online_success": online_rate, "kept": kept}


def distill_store(run_dir: Path) -> Path:
    """The online stage's store once it holds at least as many steps as the demos (a smoke run's holds a few
    episodes or none; plain online RL records none), else the demos."""
    from robotrl.datasets import EpisodeStore

    online, demos = run_dir / "online" / "hil.zarr", run_dir / "demos.zarr"
    if not online.exists():
        return demos
    with EpisodeStore.open(online) as grown, EpisodeStore.open(demos) as given:
        return online if grown.num_steps >= given.num_steps else demos


def stage_distill(config: PipelineConfig, budget: Budget, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    """On the online stage's own store where it has one (the teacher's rollouts and the operator's take-overs, on
    which PickPlace's student beat the one distilled on the demos; bench/RESULTS.md, "PickPlace with the state flow
    policy"), plus DAgger rounds on the student's own windows."""
    from robotrl.stages.distill import DistillConfig, train

    store = distill_store(run_dir)
    result = train(
        DistillConfig(
            teacher=run_dir / "online" / "policy",
            store=store,
            steps=budget.distill_steps,
            warmup=min(200, budget.distill_steps // 10),
            batch_size=budget.distill_batch_size,
            dagger_rounds=budget.distill_dagger_rounds,
            dagger_episodes=budget.distill_dagger_episodes,
            gate_episodes=budget.distill_gate_episodes,
            eval_episodes=0,
            eval_envs=budget.eval_envs,
            execute=config.execute,
            run_dir=run_dir / "distill",
            seed=config.seed,
            threads=config.threads,
            device=config.device,
            progress=config.progress,
            checkpoint_every=max(1, budget.distill_steps // 2),
        )
    )
    return (
        result.checkpoint,
        result.dagger_env_steps,
        {
            "teacher_gap": result.teacher_gap,
            "store": str(store),
            "dagger_pairs": result.dagger_pairs,
            "gate": result.gate,
        },
    )


def stage_export(config: PipelineConfig, budget: Budget, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.policies.export import export

    source = run_dir / "distill" / "policy"
    return export(source, run_dir / "export", "onnx"), 0, {"format": "onnx", "source": str(source)}


RUNNERS: dict[str, Callable[[PipelineConfig, Budget, Path], tuple[Path, int, dict[str, Any]]]] = {
    "demos": stage_demos,
    "bc": stage_bc,
    "offline": stage_offline,
    "online": stage_online,
    "distill": stage_distill,
    "export": stage_export,
}


def demo_noise(config: PipelineConfig) -> float:
    if config.demo_noise is not None:
        return config.demo_noise
    from robotrl.envs import make_task

    return min(0.5, make_task(config.task).demo_noise)


def policy_kind(config: PipelineConfig) -> str:
    """The BC policy's registry name: the config's, else vla for a task with a language instruction, else the state
    policy."""
    if config.policy is not None:
        return config.policy
    from robotrl.envs import spec_of

    spec = spec_of(config.task)
    return "vla" if any(v.dtype == STRING for v in spec.observations.values()) else STATE_POLICY


# ---------------------------------------------------------------------------------------------------
# evaluation and latency of a stage's policy


def one_window(policy: Any, seed: int) -> dict[str, Any]:
    """A batch-1 observation window from the task's own reset (the first observation repeated over the horizon)."""
    from robotrl.training.evaluate import make_eval_env

    env = make_eval_env(policy.spec, tuple(policy.obs_keys), 1, seed)
    try:
        obs, _ = env.reset(seed=seed)
    finally:
        env.close()
    window = {k: np.repeat(np.asarray(obs[k])[:, None], policy.obs_horizon, axis=1) for k in policy.obs_keys}
    window.update({k: np.asarray(obs[k]) for k, v in policy.spec.observations.items() if v.dtype == STRING})
    return window


def evaluate_stage(path: Path, config: PipelineConfig, budget: Budget) -> tuple[float, tuple[float, float], float]:
    """(success rate, its 95% interval, latency p50 in ms) of the policy at `path`, on the pipeline's seeds."""
    from robotrl.policies.timing import latency, torch_threads
    from robotrl.training.evaluate import evaluate_policy, load_any

    policy = load_any(path, threads=1)  # an exported folder through the runtime, as a robot loads it
    with torch_threads(1):  # small batches: a second thread only spins; and deployed inference runs on one
        stats = evaluate_policy(policy, budget.eval_episodes, budget.eval_envs, execute=config.execute)
        window = one_window(policy, config.seed)
        ms, _ = latency(lambda: policy.act(window), calls=200, warmup=5, max_seconds=5.0)
    return stats.success_rate, stats.success_ci95(), float(np.percentile(ms, 50))


# ---------------------------------------------------------------------------------------------------
# the pipeline


def read_rows(path: Path) -> list[StageRow]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        ci = row["success_ci95"]
        rows.append(StageRow(**{**row, "success_ci95": tuple(ci) if ci is not None else None}))
    return rows


def table(rows: list[StageRow], config: PipelineConfig, budget: Budget) -> str:
    # a run with its budget overridden is not its preset's: the header says which fields it set
    changed = ", ".join(
        f"{k}={' '.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in config.overrides().items()
    )
    lines = [
        f"robotrl run: {config.task}, preset {config.preset}{f' ({changed})' if changed else ''}, success over "
        f"{budget.eval_episodes} held-out episodes",
        "",
        "| stage | success | 95% CI | env steps | wall-clock (s) | latency p50 (ms) | output |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        success = f"{r.success_rate:.1%}" if r.success_rate is not None else "-"
        ci = f"{r.success_ci95[0]:.1%}-{r.success_ci95[1]:.1%}" if r.success_ci95 else "-"
        lat = f"{r.latency_ms:.2f}" if r.latency_ms is not None else "-"
        lines.append(f"| {r.stage} | {success} | {ci} | {r.env_steps:,} | {r.seconds:.0f} | {lat} | {r.output} |")
    return "\n".join(lines)


def run(config: PipelineConfig) -> list[StageRow]:
    import torch

    from robotrl.training.loop import jsonable

    torch.set_num_threads(config.threads)
    budget = config.budget()
    run_dir = Path(config.run_dir or default_run_dir("pipeline", config.task))
    rows_path = run_dir / "stages.jsonl"
    if not config.resume and rows_path.exists():
        raise FileExistsError(
            f"PipelineConfig.run_dir: {run_dir} already holds a pipeline ({rows_path}); resume it "
            "(--resume) or pick another run_dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not config.resume:
        (run_dir / "config.json").write_text(json.dumps(jsonable(config), indent=2))
    else:  # the stages still to run may run with other options: their config is kept beside the first
        with (run_dir / "resumed.jsonl").open("a") as f:
            f.write(json.dumps(jsonable(config)) + "\n")
    rows = read_rows(rows_path)
    done = {r.stage for r in rows}
    for stage in STAGES:
        if stage in done:
            continue
        # a stage killed part-way starts over from nothing: its train state, best record or partial store would
        # otherwise refuse the fresh start (online) or be appended to (demos)
        shutil.rmtree(run_dir / ("demos.zarr" if stage == "demos" else stage), ignore_errors=True)
        began = time.perf_counter()
        output, env_steps, extra = RUNNERS[stage](config, budget, run_dir)
        seconds = time.perf_counter() - began
        success, ci, latency_ms = None, None, None
        if stage == "demos":
            success = extra.get("demo_success_rate")
        else:
            t0 = time.perf_counter()
            success, ci, latency_ms = evaluate_stage(Path(output), config, budget)
            extra["eval_seconds"] = round(time.perf_counter() - t0, 1)
        row = StageRow(
            stage,
            str(output),
            success,
            ci,
            int(env_steps),
            round(seconds, 1),
            None if latency_ms is None else round(latency_ms, 3),
            extra,
        )
        with rows_path.open("a") as f:
            f.write(json.dumps(jsonable(row)) + "\n")
        rows.append(row)
        if config.progress:
            print(table([row], config, budget).splitlines()[-1], flush=True)
    (run_dir / "summary.md").write_text(table(rows, config, budget) + "\n")
    return rows


def run_pipeline(config: PipelineConfig) -> list[StageRow]:
    rows = run(config)
    print(table(rows, config, config.budget()))
    return rows
