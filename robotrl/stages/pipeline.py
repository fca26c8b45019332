"""The RL-100 pipeline end to end: `robotrl run`.

    robotrl run                                     # PushT, its recipe's quick budget (<= 20 min on 2 cores)
    robotrl run --budget standard                   # <= 90 min on 2 cores; also gpu, full, smoke (CI)
    robotrl run --task PickPlace --policy vla       # PickPlace's VLA recipe (its default one trains the state policy)
    robotrl run --print-config                      # the settings it would run, as config.yaml holds them
    robotrl run --config runs/<run>/config.yaml     # a run's settings again, exactly
    robotrl run --task my_envs:make_env --demonstrator my_envs:Scripted    # an outside env, with the user's expert
    robotrl.stages.pipeline.run(PipelineConfig(budget="smoke"))                       # the same dataclass

The settings of every stage come from the task's recipe (robotrl/stages/recipes: data files of what the
measurements chose, per budget); any option given overrides the recipe's value.

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
                                       recipe may hand on the best of its evaluations on training seeds, the last
                                       weights otherwise; accepted only
                                       if not worse than its start on fresh seeds (else online/policy is the
                                       start's)                                            -> online/policy
    distill  robotrl policy distill    the one-step consistency student of the RL'd policy (the VLA's
                                       keeps its prefix and action expert), on the online stage's store
                                       (the teacher's own states) plus DAgger rounds (the
                                       student's own, labelled by the teacher); kept only if
                                       it beats its start, the teacher's one-step sampler  -> distill/policy
    export   robotrl policy export     the student as ONNX + manifest for the runtime      -> export/

A recipe of the `gaussian` policy (Quadruped's: a legged robot learns to walk from scratch, not from demos) runs the
PPO chain instead:

    ppo      robotrl train ppo         PPO on the task's parallel vector env (the CPU backend, or MJX)
                                                                                           -> ppo/policy
    export   robotrl policy export     its Gaussian policy's mean action as ONNX + manifest -> export/

Every policy stage is then evaluated by the pipeline itself on the same held-out episodes (so the rows compare, and
each row's gain over the stage before pairs them episode by episode: `paired_gain`), by the task's own measures too
where it has them (Quadruped: steps tracking the command, falls; `Task.measures`), and its batch-1 CPU inference
latency timed. `run_dir/stages.jsonl` gets one row per finished stage as it finishes
and `run_dir/summary.md` the table; `--resume` skips the stages whose rows are there, so a killed pipeline goes
on from the stage it was in (that stage starts over).
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from robotrl.core.files import claim_run_dir, default_run_dir, release_run_dir
from robotrl.core.spec import STRING
from robotrl.stages.recipes import (
    BUDGETS,
    AnySettings,
    Budget,
    PpoSettings,
    Recipe,
    RecipeError,
    Settings,
    read_yaml,
    recipe_for,
    settings_class,
    settings_from,
)
from robotrl.training.loop import RLResult

if TYPE_CHECKING:
    from robotrl.envs.rollouts import EpisodeStats
    from robotrl.rl.ppo import PpoConfig
    from robotrl.stages.bc import BCConfig

STAGES = ("demos", "bc", "offline", "online", "distill", "export")
#: the PPO chain's stages (a recipe of the gaussian policy)
PPO_STAGES = ("ppo", "export")
#: the RL stages a budget may leave out, by the setting that is 0 then: the stage before's policy is handed on
SKIPPED_BY = {"offline": "offline_iterations", "online": "online_total_steps"}
#: PipelineConfig's fields that override the recipe's setting of the same name (`Settings`)
OVERRIDES = tuple(
    dict.fromkeys(
        f.name
        for kind in (Settings, PpoSettings)
        for f in dataclasses.fields(kind)
        if f.name not in ("bc_policy", "ppo")
    )
)
#: PipelineConfig's fields that default to the recipe's value
RECIPE_OPTIONS = (*OVERRIDES, "bc_channels")
#: the file in a run directory that holds what ran: `robotrl run --config <it>` runs it again
CONFIG_FILE = "config.yaml"
#: PipelineConfig's fields that say what runs (a config file holds them besides its settings)
RUN_FIELDS = ("task", "policy", "budget", "demonstrator", "seed", "threads", "device")


@dataclass
class PipelineConfig:
    """Demos -> BC -> offline RL -> online RL with interventions -> one-step distillation -> export, evaluated.

    The stages' settings are the task's recipe for the budget (robotrl/stages/recipes: what the measurements chose);
    every option below that is set overrides the recipe's value of the same name."""

    task: str = "PushT"
    budget: Budget = "quick"
    """quick (<= 20 min on 2 cores), standard (<= 90 min), gpu (one GPU, <= 15 min), full, smoke (CI)"""
    policy: str | None = None
    """the BC policy, a flow policy with a student (None: the recipe's, flow; PickPlace also has vla). flow is the
    state policy: its demos carry no camera images"""
    config: Path | None = None
    """a run's config.yaml, run again exactly (options given here override the file's)"""
    print_config: bool = False
    """print the resolved settings (config.yaml's form) and run nothing"""
    demonstrator: str | None = None
    """an outside env's demonstrator (`module:callable`, as `robotrl data record --demonstrator`): it records the
    demos and is the online stage's operator (an outside env has no scripted expert; its stages are judged by the
    success it reports)"""
    demo_episodes: int | None = None
    demo_noise: float | None = None
    """the scripted expert's noise for the demos (the recipe's; where it sets none, the task's stand-in for a human
    capped at 0.5)"""
    bc_steps: int | None = None
    bc_batch_size: int | None = None
    bc_lr: float | None = None
    bc_channels: tuple[int, ...] | None = None
    """the flow policy's U-Net widths (the recipe's `bc_policy.channels`)"""
    offline_extraction: Literal["ppo", "awr"] | None = None
    """the offline stage's policy update: awr, advantage-weighted flow matching on the store, or ppo, RL-100's
    clipped PPO over the chain"""
    offline_iterations: int | None = None
    """0 leaves the offline stage out (BC's policy handed on)"""
    offline_critic_steps: int | None = None
    offline_policy_updates: int | None = None
    offline_awr_steps: int | None = None
    offline_rollout_episodes: int | None = None
    offline_gate_episodes: int | None = None
    """training-seed episodes of each policy in the offline stage's success gate (its update kept only on a gain
    beyond one standard error)"""
    interventions: bool | None = None
    """the online stage with the simulated operator (robotrl train hil); False: plain online RL over the same
    Flow-SDE chain"""
    online_total_steps: int | None = None
    """0 leaves the online stage out (the policy before it handed on)"""
    online_num_envs: int | None = None
    online_rollout_steps: int | None = None
    online_minibatch_size: int | None = None
    """decisions per PPO minibatch of the online stage"""
    online_lr: float | None = None
    online_bc_coef: float | None = None
    """the online stage's velocity anchor (`train online|hil --bc-coef`; 0 frees the update)"""
    online_criterion: Literal["stray", "stall"] | None = None
    """when the simulated operator takes over (`train hil --criterion`): stray where the policy's actions leave the
    expert's, stall where the episode makes no progress"""
    online_operator_fraction: float | None = None
    """share of the online stage's BC windows drawn from the operator's take-overs"""
    online_ema: float | None = None
    """decay per update of the online stage's weight average, handed on instead of its last weights (0: the last)"""
    online_eval_every: int | None = None
    """env steps between the online stage's evaluations on training seeds, its best checkpoint handed on (0: none)"""
    online_gate_episodes: int | None = None
    """training-seed episodes of each of the online stage's evaluations and of its gate"""
    online_sampler_steps: int | None = None
    """Euler steps of the sampler the online stage picks its best checkpoint by and is gated with (the recipe's:
    the policy's own)"""
    distill_steps: int | None = None
    distill_batch_size: int | None = None
    distill_dagger_rounds: int | None = None
    distill_dagger_episodes: int | None = None
    distill_gate_episodes: int | None = None
    """training-seed episodes on which the distilled student must match its start to be deployed"""
    distill_solve_weight: float | None = None
    """weight of the student's direct regression onto the teacher's whole ODE solve (`policy distill --solve-weight`)"""
    eval_episodes: int | None = None
    """held-out episodes each stage is evaluated on"""
    eval_envs: int | None = None
    execute: int | None = None
    """actions executed per predicted chunk (training rollouts and evaluation alike)"""
    episode_steps: int | None = None
    """at most this many steps an episode (the recipe's: the task's own length)"""
    ppo_total_steps: int | None = None
    """environment steps of the PPO chain's ppo stage (a recipe of the gaussian policy)"""
    ppo_num_envs: int | None = None
    success_tail: int | None = None
    """BC and distillation train on each episode up to this many steps after its first success (`train bc
    --success-tail`)"""
    deploy_execute: int | None = None
    """actions the one-step policy executes per chunk (its DAgger rounds, gate and evaluations; the recipe's,
    else `execute`); its export records it for the robot"""
    run_dir: Path | None = None
    """default: runs/pipeline-<task>-<time>"""
    resume: bool = False
    """skip the stages finished in run_dir (the rest run by its config.yaml and the options given here)"""
    overwrite: bool = False
    """start afresh in a run_dir that holds a pipeline, deleting what it holds"""
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    """torch device of the BC, online and distill stages ("cuda"; envs and the offline stage run on the CPU)"""
    progress: bool = True

    def __post_init__(self) -> None:
        from robotrl.training.loop import check_device  # torch: when a pipeline is configured, not with the CLI

        check_device(self.device, "PipelineConfig.device")
        if self.policy is not None and self.policy != self.recipe().policy:
            check_policy(self.policy)
        if self.budget not in BUDGETS:
            raise ValueError(f"PipelineConfig.budget: expected one of {list(BUDGETS)}, got {self.budget!r}")
        if self.bc_channels is not None:
            self.bc_channels = tuple(self.bc_channels)
            if not self.bc_channels or min(self.bc_channels) < 1:
                raise ValueError(f"PipelineConfig.bc_channels: expected > 0, got {self.bc_channels}")
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
        if self.threads < 1:
            raise ValueError(f"PipelineConfig.threads: expected >= 1, got {self.threads}")
        if self.resume and self.run_dir is None:
            raise ValueError("PipelineConfig.resume: needs run_dir (the pipeline to continue)")
        if self.resume and self.overwrite:
            raise ValueError("PipelineConfig.overwrite: expected either --resume or --overwrite, got both")
        if self.run_dir is not None:
            self.run_dir = Path(self.run_dir)
        if self.config is not None:
            self.config = Path(self.config)
        settings = self.settings()  # a bad override or recipe ends here, in one line, before anything runs
        if isinstance(settings, PpoSettings):
            ppo_config(self, settings, Path("runs"))

    def overrides(self) -> dict[str, Any]:
        """The settings given on top of the recipe (or the config file)."""
        return {k: v for k in RECIPE_OPTIONS if (v := getattr(self, k)) is not None}

    def settings(self) -> AnySettings:
        """The stages' settings: the config file's or the task's recipe for the budget, with the overrides."""
        if self.config is not None:
            base = RunFile.read(self.config).settings
        else:
            recipe = self.recipe()
            base = recipe.settings(self.budget)
            if self.policy is not None and self.policy != recipe.policy:  # the recipe's policy fields are not its
                if not isinstance(base, Settings):
                    raise RecipeError(
                        f"PipelineConfig.policy: {recipe.path.name} trains {recipe.policy} by PPO, from no demos; "
                        f"expected {recipe.policy}, got {self.policy}"
                    )
                base = dataclasses.replace(base, bc_policy={})
        over = self.overrides()
        chain = {f.name for f in dataclasses.fields(base)} | ({"bc_channels"} if isinstance(base, Settings) else set())
        for name in over.keys() - chain:
            raise RecipeError(
                f"PipelineConfig.{name}: the settings run here ({' -> '.join(stages_of(base))}) have no {name}; "
                f"expected none, got {over[name]}"
            )
        if "bc_channels" in over and isinstance(base, Settings):
            over["bc_policy"] = {**base.bc_policy, "channels": over.pop("bc_channels")}
        try:
            return dataclasses.replace(base, **over)
        except RecipeError as e:
            raise RecipeError(str(e).replace("Settings.", "PipelineConfig.", 1)) from None

    def recipe(self) -> Recipe:
        return recipe_for(self.task, self.policy)


@dataclass(frozen=True)
class RunFile:
    """A run's config.yaml: what ran (RUN_FIELDS) and every setting it ran with."""

    run: dict[str, Any]
    settings: AnySettings

    @classmethod
    def of(cls, config: PipelineConfig) -> RunFile:
        run = {k: getattr(config, k) for k in RUN_FIELDS}
        return cls({**run, "policy": policy_kind(config)}, config.settings())

    def text(self) -> str:
        import yaml

        return yaml.safe_dump({**self.run, "settings": self.settings.to_dict()}, sort_keys=False)

    @classmethod
    def read(cls, path: Path) -> RunFile:
        data = read_yaml(path)
        unknown = sorted(set(data) - {*RUN_FIELDS, "settings"})
        if unknown or not isinstance(data.get("settings"), dict):
            raise RecipeError(
                f"{path}: expected a run's config.yaml ({', '.join(RUN_FIELDS)}, settings), got the keys {sorted(data)}"
            )
        run = {k: data[k] for k in RUN_FIELDS if k in data}
        kind = settings_class(str(run.get("policy")))
        return cls(run, settings_from(data["settings"], f"{path}: settings", kind))


def from_file(config: PipelineConfig) -> PipelineConfig:
    """`config` with what its config file ran (task, policy, budget, seed, ...) where `config` leaves the default:
    options given on the command line override the file's."""
    if config.config is None:
        return config
    defaults = PipelineConfig.__dataclass_fields__
    taken = {k: v for k, v in RunFile.read(config.config).run.items() if getattr(config, k) == defaults[k].default}
    return dataclasses.replace(config, **taken)


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


def stage_demos(config: PipelineConfig, settings: Settings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
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
        else {"noise": demo_noise(config, settings), "render_images": policy_kind(config) != STATE_POLICY}
    )
    cap = settings.episode_steps
    if cap is not None and not is_outside(config.task) and cap < spec_of(config.task).episode_steps:
        source["episode_steps"] = cap  # the task is built only for a budget that caps its episodes (smoke)
    store = record_expert(
        out,
        config.task,
        settings.demo_episodes,
        num_envs=min(8, settings.demo_episodes),
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


def bc_options(config: PipelineConfig, settings: Settings) -> dict[str, Any]:
    """BCConfig's batch, lr and policy config of the BC stage: the settings' `bc_policy` fields on the policy's own
    registered config."""
    from robotrl.policies.base import config_from_dict, policy_config

    policy = policy_config(policy_kind(config))
    merged = {**dataclasses.asdict(policy), **settings.bc_policy}
    return {
        "batch_size": settings.bc_batch_size,
        "lr": settings.bc_lr,
        "policy": config_from_dict(type(policy), merged, "Settings.bc_policy"),
    }


def bc_config(config: PipelineConfig, settings: Settings, run_dir: Path) -> BCConfig:
    """The BC stage's `robotrl train bc` config: on run_dir's demos, into run_dir/bc."""
    from robotrl.stages.bc import BCConfig

    return BCConfig(
        store=run_dir / "demos.zarr",
        steps=settings.bc_steps,
        **bc_options(config, settings),
        execute=settings.execute,
        success_tail=settings.success_tail,
        warmup=min(500, settings.bc_steps // 10),
        eval_episodes=0,
        run_dir=run_dir / "bc",
        seed=config.seed,
        threads=config.threads,
        device=config.device,
        progress=config.progress,
        checkpoint_every=max(1, settings.bc_steps // 4),
    )


def stage_bc(config: PipelineConfig, settings: Settings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.stages.bc import train

    result = train(bc_config(config, settings, run_dir))
    return result.checkpoint, 0, {"final_loss": result.final_loss}


def stage_offline(config: PipelineConfig, settings: Settings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.datasets import EpisodeStore
    from robotrl.flowrl.offline import OfflineFlowConfig, train

    extraction: dict[str, Any] = {"policy_updates": settings.offline_policy_updates}
    if settings.offline_extraction == "awr":
        extraction = {
            "extraction": "awr",
            "lr": 3e-4,
            "policy_updates": 1,
            "epochs": settings.offline_awr_steps,
            "windows": settings.bc_batch_size,
        }
    result = train(
        OfflineFlowConfig(
            policy=run_dir / "bc" / "policy",
            store=run_dir / "demos.zarr",
            iterations=settings.offline_iterations,
            critic_steps=settings.offline_critic_steps,
            rollout_episodes=settings.offline_rollout_episodes,
            rollout_envs=min(10, settings.offline_rollout_episodes),
            gate_episodes=settings.offline_gate_episodes,
            eval_envs=settings.eval_envs,
            execute=settings.execute,
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


def stage_online(config: PipelineConfig, settings: Settings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.training.evaluate import training_seed

    # with online_eval_every, the run evaluates on training seeds (not the gate's, not the held-out ones) and keeps
    # its best weights: PickPlace's online curve dips and climbs (bench/RESULTS.md, "PickPlace with the state flow
    # policy")
    selection = (
        {
            "eval_every": settings.online_eval_every,
            "eval_episodes": settings.online_gate_episodes,
            "eval_seed": training_seed(config.seed, 8_000),
            "eval_sampler_steps": settings.online_sampler_steps,
        }
        if settings.online_eval_every
        else {}
    )
    common: dict[str, Any] = {
        "policy": run_dir / "offline" / "policy",
        "num_envs": settings.online_num_envs,
        "total_steps": settings.online_total_steps,
        "rollout_steps": settings.online_rollout_steps,
        "execute": settings.execute,
        "eval_episodes": 0,
        "run_dir": run_dir / "online",
        "seed": config.seed,
        "threads": config.threads,
        "device": config.device,
        "progress": config.progress,
        "lr": settings.online_lr,
        "bc_coef": settings.online_bc_coef,
        "ema": settings.online_ema,
        **selection,
        **({"minibatch_size": settings.online_minibatch_size} if settings.online_minibatch_size else {}),
    }
    extra: dict[str, Any] = {}
    result: RLResult  # the HIL run's is a HilResult, with its intervention rates
    if settings.interventions:
        from robotrl.flowrl.hil import HilConfig, train as train_hil

        # the operator's stretches seed from the demos and are recorded to online/hil.zarr, the demos left as they are
        result = train_hil(
            HilConfig(
                operator=config.demonstrator or "expert",
                demos=run_dir / "demos.zarr",
                criterion=settings.online_criterion,
                operator_fraction=settings.online_operator_fraction,
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
    return run_dir / "online" / "policy", result.steps, {**extra, "gate": accept_online(config, settings, run_dir)}


def hand_on_best(best: Path, online: Path, record: dict[str, float] | None) -> dict[str, Any]:
    """online/policy becomes the best evaluated weights; the last ones move to online/last_policy."""
    last = online / "last_policy"
    shutil.rmtree(last, ignore_errors=True)
    (online / "policy").rename(last)
    shutil.copytree(best, online / "policy")
    return {**(record or {}), "last_policy": str(last)}


def accept_online(config: PipelineConfig, settings: Settings, run_dir: Path) -> dict[str, Any]:
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
        policy.config.steps = settings.online_sampler_steps or policy.config.steps
    ok, online_rate, start_rate = not_worse(
        policies[0], policies[1], settings.online_gate_episodes, settings.eval_envs, seed, settings.execute
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


def stage_distill(config: PipelineConfig, settings: Settings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    """On the online stage's own store where it has one (the teacher's rollouts and the operator's take-overs, on
    which PickPlace's student beat the one distilled on the demos; bench/RESULTS.md, "PickPlace with the state flow
    policy"), plus DAgger rounds on the student's own windows."""
    from robotrl.stages.distill import DistillConfig, train

    store = distill_store(run_dir)
    result = train(
        DistillConfig(
            teacher=run_dir / "online" / "policy",
            store=store,
            steps=settings.distill_steps,
            warmup=min(200, settings.distill_steps // 10),
            batch_size=settings.distill_batch_size,
            dagger_rounds=settings.distill_dagger_rounds,
            dagger_episodes=settings.distill_dagger_episodes,
            gate_episodes=settings.distill_gate_episodes,
            solve_weight=settings.distill_solve_weight,
            eval_episodes=0,
            eval_envs=settings.eval_envs,
            execute=settings.one_step_execute,
            success_tail=settings.success_tail,
            run_dir=run_dir / "distill",
            seed=config.seed,
            threads=config.threads,
            device=config.device,
            progress=config.progress,
            checkpoint_every=max(1, settings.distill_steps // 2),
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


def ppo_config(config: PipelineConfig, settings: PpoSettings, run_dir: Path) -> PpoConfig:
    """The ppo stage's `robotrl train ppo` config: the settings' PPO options, into run_dir/ppo."""
    import typing

    from robotrl.rl.ppo import PpoConfig
    from robotrl.stages.recipes import conformed

    options: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.ppo.items()}
    unknown = sorted(options.keys() - PpoConfig.__dataclass_fields__.keys())
    if unknown:
        raise RecipeError(f"Settings.ppo: unknown option(s) {unknown}; expected PpoConfig's fields")
    options = conformed(options, typing.get_type_hints(PpoConfig), "Settings.ppo")  # before PpoConfig compares them
    return PpoConfig(
        task=config.task,
        num_envs=settings.ppo_num_envs,
        total_steps=settings.ppo_total_steps,
        **options,
        eval_episodes=0,
        run_dir=run_dir / "ppo",
        seed=config.seed,
        threads=config.threads,
        progress=config.progress,
    )


def stage_ppo(config: PipelineConfig, settings: PpoSettings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    from robotrl.rl.ppo import train

    result = train(ppo_config(config, settings, run_dir))
    return result.weights, result.steps, {}


def stage_export(config: PipelineConfig, settings: AnySettings, run_dir: Path) -> tuple[Path, int, dict[str, Any]]:
    """The chain's last policy (the student, or PPO's) as ONNX: the deterministic mean action of a Gaussian one. The
    student's export records the actions per chunk it was chosen at (`one_step_execute`): a robot runs it so."""
    from robotrl.policies.export import export

    source = run_dir / stages_of(settings)[-2] / "policy"
    execute = settings.one_step_execute if isinstance(settings, Settings) else None
    out = export(source, run_dir / "export", "onnx", execute=execute)
    return out, 0, {"format": "onnx", "source": str(source), "execute": execute}


RUNNERS: dict[str, Callable[[PipelineConfig, Any, Path], tuple[Path, int, dict[str, Any]]]] = {
    "demos": stage_demos,
    "bc": stage_bc,
    "offline": stage_offline,
    "online": stage_online,
    "distill": stage_distill,
    "ppo": stage_ppo,
    "export": stage_export,
}


def stages_of(settings: AnySettings) -> tuple[str, ...]:
    """The stages the settings run: the imitation chain, or the PPO chain."""
    return PPO_STAGES if isinstance(settings, PpoSettings) else STAGES


def demo_noise(config: PipelineConfig, settings: Settings) -> float:
    """The settings' noise, else the task's stand-in for a human capped at 0.5 (BC learns PushT from noise-0.5 demos
    and barely from noise-1.0 ones; bench/RESULTS.md, "Sim-to-real twins over ROS 2")."""
    if settings.demo_noise is not None:
        return settings.demo_noise
    from robotrl.envs import make_task

    return min(0.5, make_task(config.task).demo_noise)


def policy_kind(config: PipelineConfig) -> str:
    """The BC policy's registry name: the config's, else its task's recipe's; an outside env's: vla where it gives a
    language instruction, else the state policy."""
    if config.policy is not None:
        return config.policy
    from robotrl.envs import is_outside, spec_of

    if not is_outside(config.task):
        return config.recipe().policy

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


def stage_execute(settings: AnySettings, stage: str) -> int:
    """Actions a stage's policy executes per chunk in its evaluation: the one-step policy's `deploy_execute`, the
    chain's `execute` (1 for the PPO chain's single actions)."""
    if not isinstance(settings, Settings):
        return 1
    return settings.one_step_execute if stage in ("distill", "export") else settings.execute


def same_evaluation(output: Path, stage: str, before: StageRow | None, settings: AnySettings) -> bool:
    """Whether the stage before's evaluation is this stage's: its gate handed on the very files of the policy before
    (an offline update undone, an online stage rejected), evaluated the same way on the same seeds. A PushT offline
    stage's undone update would otherwise spend one more held-out evaluation on BC's weights."""
    if before is None or before.success_rate is None or before.stage == "demos":
        return False
    if stage_execute(settings, before.stage) != stage_execute(settings, stage):
        return False
    mine, theirs = Path(output), Path(before.output)
    if not (mine.is_dir() and theirs.is_dir()):
        return False
    names = sorted(p.name for p in mine.iterdir())
    if names != sorted(p.name for p in theirs.iterdir()):
        return False
    equal, _, _ = filecmp.cmpfiles(mine, theirs, names, shallow=False)  # sizes first, then contents
    return len(equal) == len(names)


def evaluate_stage(
    path: Path, config: PipelineConfig, settings: AnySettings, stage: str = ""
) -> tuple[EpisodeStats, float, dict[str, float]]:
    """(the held-out episodes' outcomes, latency p50 in ms, the task's own measures) of the policy at `path`, on the
    pipeline's seeds; the one-step policy (`stage` distill or export) executing `deploy_execute` actions a chunk."""
    from robotrl.envs import is_outside, make_task
    from robotrl.policies.timing import latency, torch_threads
    from robotrl.training.evaluate import evaluate_policy, load_any

    policy = load_any(path, threads=1)  # an exported folder through the runtime, as a robot loads it
    execute = stage_execute(settings, stage)
    with torch_threads(1):  # small batches: a second thread only spins; and deployed inference runs on one
        stats = evaluate_policy(policy, settings.eval_episodes, settings.eval_envs, execute=execute)
        measures = None if is_outside(config.task) else make_task(config.task).measures(stats)
        window = one_window(policy, config.seed)
        ms, _ = latency(lambda: policy.act(window), calls=200, warmup=5, max_seconds=5.0)
    return stats, float(np.percentile(ms, 50)), measures or {}


def outcomes(stats: EpisodeStats, settings: AnySettings) -> dict[str, Any]:
    """A stage's held-out episodes as its row keeps them: each episode's success ("1"/"0") in the evaluation's order
    and the env count that order depends on (`run_episodes`: episode k is env k % envs of wave k // envs)."""
    envs = min(settings.eval_envs, settings.eval_episodes)
    return {"envs": envs, "success": "".join("1" if s else "0" for s in stats.success)}


def paired_gain(after: StageRow, before: StageRow) -> tuple[float, float] | None:
    """The success `after` gained over `before` and its standard error, from their outcomes on the same held-out
    episodes: the mean and the standard error of the per-episode differences. The stages meet the very same
    episodes (same seeds, same starts), so what made one episode hard for both cancels, which the standard error of
    two independent rates would count twice. None where either row has no outcomes or their episodes differ."""
    a, b = after.extra.get("outcomes"), before.extra.get("outcomes")
    if not a or not b or a["envs"] != b["envs"] or len(a["success"]) != len(b["success"]):
        return None
    from robotrl.training.evaluate import paired_difference

    return paired_difference([int(x) for x in a["success"]], [int(y) for y in b["success"]])


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


def table(rows: list[StageRow], config: PipelineConfig, settings: AnySettings) -> str:
    # a run with settings given on top of its recipe (or config file) is not the recipe's: the header names them
    changed = ", ".join(
        f"{k}={' '.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in config.overrides().items()
    )
    source = f"config {config.config}" if config.config is not None else f"budget {config.budget}"
    measured = list(dict.fromkeys(m for r in rows for m in r.extra.get("measures", {})))  # Task.measures
    lines = [
        f"robotrl run: {config.task} ({policy_kind(config)}), {source}{f' ({changed})' if changed else ''}, "
        f"success over {settings.eval_episodes} held-out episodes",
        "",
        f"| stage | success | 95% CI | gain ± SE (points) | {''.join(f'{m} | ' for m in measured)}env steps "
        "| wall-clock (s) | latency p50 (ms) | output |",
        "| --- " * (8 + len(measured)) + "|",
    ]
    for i, r in enumerate(rows):
        before = rows[i - 1] if i else None
        success = f"{r.success_rate:.1%}" if r.success_rate is not None else "-"
        ci = f"{r.success_ci95[0]:.1%}-{r.success_ci95[1]:.1%}" if r.success_ci95 else "-"
        paired = paired_gain(r, before) if before is not None else None  # over the policy the stage started from
        gain = f"{100 * paired[0]:+.1f} ± {100 * paired[1]:.1f}" if paired is not None else "-"
        shown = "".join(f"{show(r.extra.get('measures', {}).get(m))} | " for m in measured)
        lat = f"{r.latency_ms:.2f}" if r.latency_ms is not None else "-"
        output = f"skipped: {r.extra['skipped']}" if "skipped" in r.extra else r.output
        lines.append(
            f"| {r.stage} | {success} | {ci} | {gain} | {shown}{r.env_steps:,} | {r.seconds:.0f} | {lat} | {output} |"
        )
    return "\n".join(lines)


def show(value: float | None) -> str:
    """A task's measure in a table cell, to three figures."""
    return "-" if value is None else f"{value:.3g}"


def resolved(config: PipelineConfig) -> PipelineConfig:
    """What runs: a resumed run with its own config.yaml's settings (unless another file is given), and a config
    file's task, policy, budget, seed, ... where the options leave them at their defaults."""
    own = None if config.run_dir is None else Path(config.run_dir) / CONFIG_FILE
    if config.resume and config.config is None and own is not None and own.exists():
        config = dataclasses.replace(config, config=own)
    return from_file(config)


def hand_on(before: StageRow, stage: str, setting: str, run_dir: Path) -> StageRow:
    """A stage the settings leave out (`setting` is 0): the stage before's policy, copied to where the stages after
    read this one's, with the stage before's figures (the same weights on the same seeds)."""
    shutil.copytree(Path(before.output), run_dir / stage / "policy")
    extra = {"skipped": f"{setting} is 0: the {before.stage} stage's policy handed on"}
    if "outcomes" in before.extra:
        extra["outcomes"] = before.extra["outcomes"]
    return dataclasses.replace(
        before, stage=stage, output=str(run_dir / stage / "policy"), env_steps=0, seconds=0.0, extra=extra
    )


def run(config: PipelineConfig) -> list[StageRow]:
    import torch

    from robotrl.training.loop import jsonable

    config = resolved(config)
    torch.set_num_threads(config.threads)
    settings = config.settings()
    run_dir = Path(config.run_dir or default_run_dir("pipeline", config.task))
    rows_path = run_dir / "stages.jsonl"
    held = [p for p in (run_dir / CONFIG_FILE, rows_path) if p.exists()]
    if held and not config.resume and not config.overwrite:
        raise FileExistsError(
            f"PipelineConfig.run_dir: {run_dir} already holds a pipeline ({held[-1]}); resume it (--resume), "
            "replace it (--overwrite) or pick another run_dir"
        )
    if config.resume and not (run_dir / CONFIG_FILE).exists():
        raise ValueError(
            f"PipelineConfig.resume: expected a run_dir holding a pipeline ({CONFIG_FILE}), got {run_dir} without "
            "one; leave out --resume to start a new pipeline there"
        )
    claim_run_dir(run_dir, clear=bool(held) and config.overwrite)  # a second `robotrl run` here is refused
    ran = RunFile.of(config)
    if not (run_dir / CONFIG_FILE).exists():
        (run_dir / CONFIG_FILE).write_text(ran.text())
    else:  # the stages still to run may run with other settings: each resumption's are kept beside the first
        with (run_dir / "resumed.jsonl").open("a") as f:
            f.write(json.dumps(jsonable({**ran.run, "settings": ran.settings.to_dict()})) + "\n")
    rows = read_rows(rows_path)
    done = {r.stage for r in rows}
    for stage in stages_of(settings):
        if stage in done:
            continue
        # a stage killed part-way starts over from nothing: its train state, best record or partial store would
        # otherwise refuse the fresh start (online) or be appended to (demos)
        shutil.rmtree(run_dir / ("demos.zarr" if stage == "demos" else stage), ignore_errors=True)
        if stage in SKIPPED_BY and getattr(settings, SKIPPED_BY[stage]) == 0:
            row = hand_on(rows[-1], stage, SKIPPED_BY[stage], run_dir)
            with rows_path.open("a") as f:
                f.write(json.dumps(jsonable(row)) + "\n")
            rows.append(row)
            continue
        began = time.perf_counter()
        output, env_steps, extra = RUNNERS[stage](config, settings, run_dir)
        seconds = time.perf_counter() - began
        success, ci, latency_ms = None, None, None
        if stage == "demos":
            success = extra.get("demo_success_rate")
        elif same_evaluation(Path(output), stage, rows[-1] if rows else None, settings):
            before = rows[-1]
            success, ci, latency_ms = before.success_rate, before.success_ci95, before.latency_ms
            extra["evaluation"] = f"the {before.stage} stage's: the same policy files"
            extra.update({k: before.extra[k] for k in ("measures", "outcomes") if k in before.extra})
        else:
            t0 = time.perf_counter()
            stats, latency_ms, measures = evaluate_stage(Path(output), config, settings, stage)
            success, ci = stats.success_rate, stats.success_ci95()
            extra["eval_seconds"] = round(time.perf_counter() - t0, 1)
            extra["outcomes"] = outcomes(stats, settings)
            if measures:
                extra["measures"] = measures
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
            print(table(rows, config, settings).splitlines()[-1], flush=True)
    (run_dir / "summary.md").write_text(table(rows, config, settings) + "\n")
    release_run_dir(run_dir)
    return rows


def run_pipeline(config: PipelineConfig) -> list[StageRow]:
    """`robotrl run`: the pipeline and its table, or (--print-config) the settings it would run."""
    if config.print_config:
        print(RunFile.of(resolved(config)).text(), end="")
        return []
    rows = run(config)
    config = resolved(config)
    print(table(rows, config, config.settings()))
    return rows
