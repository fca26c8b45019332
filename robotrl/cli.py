"""The `robotrl` command line: `robotrl <group> <command> [--options]`, and `robotrl run`.

    robotrl envs   list | check | view | bench
    robotrl data   info | validate | stats | merge | split | record | collect | import | export
    robotrl train  bc | offline | online | hil | dsrl | classifier | sac | sac-distributed | iql | calql | ppo
                   | sb3-sac | sb3-ppo | sb3-td3
    robotrl policy eval | export | distill
    robotrl run

Every command is a typed dataclass (parsed by tyro), and the same dataclass is the Python API: e.g.
`robotrl train sac --task Reach` is `robotrl.rl.sac.train(SacConfig(task="Reach"))`; a field `total_steps` is the
flag `--total-steps`. `--help` works at every level: a command lists its common options first and the rest under
"advanced options" (`Command.common`; the flags stay flat: `--lr`, never `--advanced.lr`). `train bc` takes any
registered policy with every field of its own config: `policy:<name> --policy.<field> ...`.

Bad input (a value, a task, a missing file) ends in one line naming the field and exit status 2, never a
traceback (ROBOTRL_TRACEBACK=1 shows it). Heavy imports (torch, MuJoCo, SB3) happen only once a command is
parsed, so the group listings stay fast.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import importlib
import inspect
import io
import itertools
import json
import os
import re
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import tyro

from robotrl.core.options import check_numbers
from robotrl.envs.tasks import DEFAULT_TASK


# ---------------------------------------------------------------------------------------------------
# the envs commands' configs (the other commands' live with their code)
# ---------------------------------------------------------------------------------------------------
@dataclass
class EnvsList:
    """List the tasks with a summary of their spec (observations, action, rate, episode length)."""

    json: bool = False
    """print one JSON object per task (the full spec) instead of a table"""


@dataclass
class EnvsCheck:
    """Run gymnasium's env checker (`gymnasium.utils.env_checker.check_env`) on a registered task, or on an outside env
    (then also print the spec robotrl derives from it)."""

    task: str = DEFAULT_TASK
    """task name, 'all', or an outside env (gym:<id>, <module>:<callable>)"""
    render: bool = True
    """also check rendering (rgb_array)"""


@dataclass
class EnvsView:
    """Render one scripted-expert episode of a task to an mp4."""

    task: str = DEFAULT_TASK
    out: Path = Path("expert.mp4")
    seed: int = 0
    noise: float = 0.0
    """teleop-like noise of the expert (0 = perfect)"""
    camera: str | None = None
    """MJCF camera name (default: the task's first camera, else the free camera)"""
    width: int = 640
    height: int = 480


def run_list(config: EnvsList) -> None:
    from robotrl.envs import list_tasks, make_task

    for name in list_tasks():
        task = make_task(name)
        spec = task.spec()
        if config.json:
            print(json.dumps({**spec.to_dict(), "action_modes": list(task.action_modes)}))
            continue
        obs = ", ".join(f"{k} {'str' if v.dtype == 'str' else tuple(v.shape)}" for k, v in spec.observations.items())
        modes = "|".join(task.action_modes)
        print(
            f"{name:<11} obs: {obs}; action: {spec.action_mode} {spec.action.shape} of {modes}; "
            f"{spec.control_hz:g} Hz, {spec.episode_steps} steps"
        )


def run_check(config: EnvsCheck) -> None:
    import warnings

    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from robotrl.envs import is_outside, list_tasks, spec_of
    from robotrl.envs.outside import parse
    from robotrl.envs.registration import env_id

    names = list_tasks() if config.task == "all" else [config.task]
    for name in names:
        render = {"render_mode": "rgb_array"} if config.render else {}
        if is_outside(name):  # the env as its author made it (rendering where gymnasium.make can ask for it)
            ref = parse(name)
            env, label = ref.factory(**(render if ref.is_gym else {}))(), name
        else:
            env, label = (
                gym.make(env_id(name), render_mode=render.get("render_mode"), width=160, height=120),
                env_id(name),
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=not config.render or env.render_mode is None)
        env.close()
        notes = sorted({str(w.message).replace("\x1b[33m", "").replace("\x1b[0m", "") for w in caught})
        print(f"{label}: check_env passed" + "".join(f"\n  note: {n}" for n in notes))
        if is_outside(name):
            spec = spec_of(name)
            obs = ", ".join(f"{k} {v.shape}" for k, v in spec.observations.items())
            print(
                f"  robotrl spec: {obs} -> action {spec.action.shape}, {spec.control_hz:g} Hz, {spec.episode_steps} "
                f"steps; success reported: {'yes' if spec.metadata['success'] else 'no (judged by return)'}; "
                f"seeding: {spec.metadata['seeding']}"
            )


def run_view(config: EnvsView) -> None:
    from robotrl.envs.video import record_expert_episode

    video = record_expert_episode(
        config.task,
        config.out,
        seed=config.seed,
        noise=config.noise,
        camera=config.camera,
        size=(config.height, config.width),
    )
    print(
        json.dumps(
            {
                "path": str(video.path),
                "frames": video.frames,
                "success": video.success,
                "instruction": video.instruction,
            }
        )
    )


def run_sb3(config: Any) -> Any:
    from robotrl.rl.sb3 import train

    result = train(config)
    score = f"mean return {result.mean_return:.1f} (the env reports no success)"
    if result.success_rate is not None and result.success_ci95 is not None:
        lo, hi = result.success_ci95
        score = f"success rate {result.success_rate:.1%} (95% CI {lo:.1%}-{hi:.1%})"
    print(
        f"{config.task} {config.algo.upper()}: {score} over {result.episodes} episodes after {result.timesteps} "
        f"steps ({result.train_seconds:.0f} s of training); run dir {result.run_dir}"
    )
    return result


def run_ppo(config: Any) -> Any:
    """`train ppo`: the torch learner on the CPU backend, or the JAX one with its rollout and update on the
    accelerator (`--backend mjx`), which builds on the torch one's agent and config."""
    if config.backend == "mjx":
        from robotrl.rl.ppo_mjx import train
    else:
        from robotrl.rl.ppo import train
    result = train(config)
    print(result.summary(f"ppo {config.task}", config.eval_episodes, "env steps"))
    return result


# ---------------------------------------------------------------------------------------------------
# the command table
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """One command: its config class and the function that runs it (both "module:name", imported when the command
    is parsed), its line in the group's listing, and which of its config's fields `--help` lists first."""

    summary: str
    config: str
    run: str
    common: tuple[str, ...] | None = None
    """the options most runs set, listed first (with the run options of `RUN_COMMON` it has); None: all of them"""
    fixed: tuple[str, ...] = ()
    """config fields the command itself sets (its class's defaults), not options"""
    policy: str | None = None
    """the field that takes any registered policy's config (`policy:<name> --policy.<field> ...`)"""
    unset: tuple[str, str] | None = None
    """what the options named by "module:NAME" (a tuple of field names) mean when left at None, shown as their
    default (`robotrl run`: the recipe's value)"""

    def config_class(self) -> type:
        return _load(self.config)

    def runner(self) -> Callable[[Any], Any]:
        return _load(self.run)


#: run options every training command lists among its common ones (where its config has them)
RUN_COMMON = ("device", "eval_episodes", "run_dir", "resume", "seed")

GROUPS: dict[str, str] = {
    "envs": "Task suite: list, check, view and benchmark the environments.",
    "data": "Episode stores: record demos, collect by teleop, inspect, validate, merge, split, import and export.",
    "train": "Training: behaviour cloning of any registered policy, offline / online / HIL RL of flow policies, "
    "DSRL, a success classifier, SAC / RLPD / WSRL, IQL, Cal-QL, PPO and Stable-Baselines3.",
    "policy": "Policies: evaluate, export for the runtime, distill into a one-step student, convert an earlier run's.",
    "robot": "Robots: write a robot file (joints, limits, interface) from a URDF or MJCF description.",
}

SB3_COMMON = ("task", "obs_keys", "total_steps", "num_envs", "lr")
SAC_COMMON = ("task", "obs_keys", "num_envs", "total_steps", "demos", "init", "utd", "critics", "lr")

COMMANDS: dict[str, dict[str, Command]] = {
    "envs": {
        "list": Command("List the tasks and their specs.", "robotrl.cli:EnvsList", "robotrl.cli:run_list"),
        "check": Command("Run gymnasium's env checker on a task.", "robotrl.cli:EnvsCheck", "robotrl.cli:run_check"),
        "view": Command("Render a scripted-expert episode to an mp4.", "robotrl.cli:EnvsView", "robotrl.cli:run_view"),
        "bench": Command(
            "Env throughput: CPU backend vs AsyncVectorEnv vs mujoco.rollout (JSON lines).",
            "robotrl.envs.benchmark:BenchConfig",
            "robotrl.envs.benchmark:main",
        ),
    },
    "data": {
        "info": Command("Summarize a store.", "robotrl.datasets.ops:DataInfo", "robotrl.datasets.ops:info"),
        "validate": Command(
            "Check a store's spec, commit record and checksums.",
            "robotrl.datasets.ops:DataValidate",
            "robotrl.datasets.ops:check",
        ),
        "stats": Command(
            "Per-key normalization statistics.", "robotrl.datasets.ops:DataStats", "robotrl.datasets.ops:stats"
        ),
        "merge": Command(
            "Concatenate stores with the same spec.", "robotrl.datasets.ops:DataMerge", "robotrl.datasets.ops:merge"
        ),
        "split": Command(
            "Split a store's episodes into two stores.", "robotrl.datasets.ops:DataSplit", "robotrl.datasets.ops:split"
        ),
        "record": Command(
            "Record a task's scripted expert (or a --demonstrator) across a vector env.",
            "robotrl.datasets.record:DataRecord",
            "robotrl.datasets.record:run_record",
        ),
        "collect": Command(
            "Teleoperate (or script) a task and keep or discard each episode.",
            "robotrl.datasets.collect:CollectConfig",
            "robotrl.datasets.collect:run_collect",
            common=("task", "device", "out", "episodes", "noise", "seed", "view"),
        ),
        "import": Command(
            "Convert a LeRobot v3 dataset or a ROS 2 MCAP recording into a store.",
            "robotrl.datasets.ops:DataImport",
            "robotrl.datasets.ops:import_",
        ),
        "export": Command(
            "Convert a store to a LeRobot v3 dataset or a ROS 2 MCAP recording.",
            "robotrl.datasets.ops:DataExport",
            "robotrl.datasets.ops:export",
        ),
    },
    "train": {
        "bc": Command(
            "Behaviour cloning of any registered policy on a store.",
            "robotrl.stages.bc:BCConfig",
            "robotrl.stages.bc:run_train_bc",
            policy="policy",
            common=("store", "steps", "batch_size", "lr", "execute", "success_only"),
        ),
        "offline": Command(
            "Offline RL of a flow policy (RL-100): critic, gated chain updates, rollouts.",
            "robotrl.flowrl.offline:OfflineFlowConfig",
            "robotrl.flowrl.offline:run_train_offline",
            common=("policy", "store", "iterations", "extraction", "method", "lr"),
        ),
        "online": Command(
            "Online PPO of a flow policy over its denoising chain.",
            "robotrl.flowrl.online:OnlineConfig",
            "robotrl.flowrl.online:run_train_online",
            common=("policy", "method", "num_envs", "total_steps", "lr", "bc_coef"),
        ),
        "hil": Command(
            "Online RL of a flow policy with an operator who takes over (HIL).",
            "robotrl.flowrl.hil:HilConfig",
            "robotrl.flowrl.hil:run_train_hil",
            common=("policy", "operator", "demos", "num_envs", "total_steps", "lr"),
        ),
        "dsrl": Command(
            "Steer a frozen flow policy's initial noise with SAC (DSRL).",
            "robotrl.flowrl.dsrl:DsrlConfig",
            "robotrl.flowrl.dsrl:run_train_dsrl",
            common=("policy", "num_envs", "total_steps", "lr", "target_kl"),
        ),
        "classifier": Command(
            "A success classifier on a store's camera frames (a reward).",
            "robotrl.flowrl.classifier:ClassifierConfig",
            "robotrl.flowrl.classifier:run_train_classifier",
            common=("store", "camera", "proprio", "steps", "batch_size", "lr", "target_precision"),
        ),
        "sac": Command(
            "SAC, RLPD (--demos) and WSRL (--init) on a task's vector env.",
            "robotrl.rl.sac:SacConfig",
            "robotrl.rl.sac:run_train_sac",
            common=SAC_COMMON,
        ),
        "sac-distributed": Command(
            "SAC with rollout actors and a learner (threads or Ray).",
            "robotrl.rl.actor_learner:ActorLearnerConfig",
            "robotrl.rl.actor_learner:run_train_sac_distributed",
            common=("task", "obs_keys", "num_envs", "total_steps", "workers", "transport", "utd", "lr"),
        ),
        "iql": Command(
            "IQL from a store, offline.",
            "robotrl.rl.iql:IqlConfig",
            "robotrl.rl.iql:run_train_iql",
            common=("store", "obs_keys", "steps", "lr", "expectile", "beta"),
        ),
        "calql": Command(
            "Cal-QL from a store, offline.",
            "robotrl.rl.calql:CalqlConfig",
            "robotrl.rl.calql:run_train_calql",
            common=("store", "obs_keys", "steps", "lr", "cql_alpha", "calibrate"),
        ),
        "ppo": Command(
            "PPO on a task's vector env (CPU, or MJX on an accelerator).",
            "robotrl.rl.ppo:PpoConfig",
            "robotrl.cli:run_ppo",
            common=("task", "backend", "obs_keys", "num_envs", "total_steps", "rollout_steps", "lr"),
        ),
        "sb3-sac": Command(
            "Stable-Baselines3's SAC on a task.",
            "robotrl.rl.sb3:Sb3SacConfig",
            "robotrl.cli:run_sb3",
            common=SB3_COMMON,
            fixed=("algo",),
        ),
        "sb3-ppo": Command(
            "Stable-Baselines3's PPO on a task.",
            "robotrl.rl.sb3:Sb3PpoConfig",
            "robotrl.cli:run_sb3",
            common=SB3_COMMON,
            fixed=("algo",),
        ),
        "sb3-td3": Command(
            "Stable-Baselines3's TD3 on a task.",
            "robotrl.rl.sb3:Sb3Td3Config",
            "robotrl.cli:run_sb3",
            common=SB3_COMMON,
            fixed=("algo",),
        ),
    },
    "policy": {
        "eval": Command(
            "Success rate over held-out seeds, with a 95% interval and videos.",
            "robotrl.training.evaluate:EvalConfig",
            "robotrl.training.evaluate:run_eval",
        ),
        "export": Command(
            "Export a checkpoint to ONNX or TorchScript (+ manifest) for the runtime.",
            "robotrl.policies.export:ExportConfig",
            "robotrl.policies.export:run_export",
        ),
        "convert": Command(
            "Convert an earlier actor-critic run's actor.pt / agent.pt into a registered policy.",
            "robotrl.rl.convert:ConvertConfig",
            "robotrl.rl.convert:run_convert",
        ),
        "distill": Command(
            "Distill a teacher into its one-step student.",
            "robotrl.stages.distill:DistillConfig",
            "robotrl.stages.distill:run_distill",
            common=("teacher", "store", "steps", "batch_size", "lr", "dagger_rounds"),
        ),
    },
    "robot": {
        "init": Command(
            "Write a robot file from a robot's description (joints and limits read from it).",
            "robotrl.hardware.robot_file:RobotInit",
            "robotrl.hardware.robot_file:run_init",
        ),
    },
}

#: `robotrl run`: the one command outside the groups
RUN = Command(
    "The whole pipeline on a task: demos, BC, offline RL, online RL with interventions, one-step distillation, export.",
    "robotrl.stages.pipeline:PipelineConfig",
    "robotrl.stages.pipeline:run_pipeline",
    common=("task", "budget", "policy", "config", "print_config", "resume", "run_dir", "threads"),
    unset=("the recipe's", "robotrl.stages.pipeline:RECIPE_OPTIONS"),
)


def every_command() -> Iterator[tuple[tuple[str, ...], Command]]:
    """(the words after `robotrl`, the command) for every command in the table."""
    yield ("run",), RUN
    for group, commands in COMMANDS.items():
        for name, command in commands.items():
            yield (group, name), command


def _load(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------------------------
# the parser: a view of the config with its advanced options in a group whose flags stay flat
# ---------------------------------------------------------------------------------------------------
class UsageError(Exception):
    """Bad input, reported as one line: `<prog>: error: <message>`."""


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass's fields (the string literal under each), its bases' first."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def policy_choices(default: Any) -> tuple[Any, Any]:
    """The type of a field that takes any registered policy that learns from data, as tyro subcommands
    `policy:<name>` (their fields `--policy.<field>`), and its default as one of them."""
    from robotrl.policies.base import policy_config, register_all

    options = [
        Annotated[cls.config_cls, tyro.conf.subcommand(name)]
        for name, cls in register_all().items()
        if cls.learns_from_data
    ]
    # a union built at run time from the registry: `X | Y` needs its members written out
    return Union[tuple(options)], policy_config(default) if isinstance(default, str) else default  # noqa: UP007


def _constant(value: Any) -> Callable[[], Any]:
    """A default_factory that gives `value` itself (not a copy)."""
    return lambda: value


def parser_view(cls: type, command: Command) -> type:
    """A dataclass with `cls`'s options for tyro: the common ones at the top, the others in a nested `advanced`
    group whose flags keep their plain names, the fixed ones left out; `values` maps a parsed view back."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in command.fixed]
    wanted = set(command.common or [f.name for f in fields]) | set(RUN_COMMON) | {command.policy}
    common = [f for f in fields if f.name in wanted or _default(f) is dataclasses.MISSING]
    advanced = [f for f in fields if f not in common]
    unset_hint, unset = (command.unset[0], set(_load(command.unset[1]))) if command.unset else ("", set())

    def spec(f: dataclasses.Field) -> tuple[Any, ...]:
        kind, default = hints[f.name], _default(f)
        if f.name == command.policy:
            kind, default = policy_choices(default)
        hint = f"(default: {unset_hint})" if f.name in unset else None
        kind = Annotated[kind, tyro.conf.arg(help=docs.get(f.name, ""), help_behavior_hint=hint)]
        if default is dataclasses.MISSING:
            return (f.name, kind)
        return (f.name, kind, dataclasses.field(default_factory=_constant(default)))

    first = [*(command.common or ()), *RUN_COMMON]
    order = sorted(common, key=lambda f: first.index(f.name) if f.name in first else -1)  # required ones first
    specs = [spec(f) for f in order if f.name != command.policy]
    if advanced:
        group = dataclasses.make_dataclass("advanced", [spec(f) for f in advanced])
        group.__doc__ = "Options most runs leave at their defaults."
        specs.append(
            ("advanced", Annotated[group, tyro.conf.OmitArgPrefixes], dataclasses.field(default_factory=group))
        )
    specs += [spec(f) for f in order if f.name == command.policy]
    view = dataclasses.make_dataclass(cls.__name__, specs)
    view.__doc__ = inspect.getdoc(cls)
    return view


def view_values(parsed: Any) -> dict[str, Any]:
    values = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed) if f.name != "advanced"}
    if hasattr(parsed, "advanced"):
        values.update({f.name: getattr(parsed.advanced, f.name) for f in dataclasses.fields(parsed.advanced)})
    return values


BOX = re.compile(r"[\u2500-\u257f]")
RULE = re.compile(r"[-\s\u2500-\u257f]*-[-\s]*|[\s\u2500-\u257f]+")


def one_line(tyro_error: str) -> str:
    """tyro's boxed error as one line: its message (the box's first section), and for an unrecognized option the
    nearest valid one. The box is drawn in UTF-8 or, where stdout is not UTF-8, in ASCII (a title line, then
    dashes); its title is left out."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", raw) for raw in tyro_error.splitlines()]
    utf8 = any(raw.lstrip().startswith("\u256d") for raw in lines)
    sections: list[list[str]] = [[]]
    titled = utf8
    for raw in lines:
        if not raw.strip() or raw.lstrip().startswith("\u256d"):  # the UTF-8 top border carries the title
            continue
        if not titled:  # the ASCII title line
            titled = True
            continue
        if RULE.fullmatch(raw):  # a rule between sections, or a bottom border
            sections.append([])
        else:
            sections[-1].append(BOX.sub(" ", raw).strip())
    sections = [s for s in sections if s]
    if not sections:
        return "invalid arguments"
    message = " ".join(sections[0])
    message = re.sub(r"^Error parsing [\w.]+: (?=\w+\.\w+: )", "", message)  # a config's own error names its field
    hints = [s for s in sections[1:] if s[0].startswith("Perhaps you meant")]
    if hints and len(hints[0]) > 1:
        message += f" (did you mean {hints[0][1].split()[0]}?)"
    return message


def parse(prog: str, command: Command, args: Sequence[str]) -> Any:
    """The config for `args`: tyro parses a view of it, then the config class itself is built (its checks run
    here, so a bad value is reported before anything runs). `--help` prints and exits 0."""
    cls = command.config_class()
    view = parser_view(cls, command)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parsed: Any = tyro.cli(view, args=list(args), prog=prog, config=(tyro.conf.CascadeSubcommandArgs,))
    except SystemExit as stop:
        if stop.code in (0, None):
            raise
        raise UsageError(one_line(errors.getvalue())) from None
    values = view_values(parsed)
    for name in ("task", "tasks"):
        if name in values:
            values[name] = check_tasks(name, values[name])
    return cls(**values)


def check_tasks(field: str, value: Any) -> Any:
    """A task field's value names registered tasks ('all' where a command takes every task) or outside envs
    (`gym:<id>`, `<module>:<callable>`: checked to exist, and put in their canonical form, which is returned)."""
    from robotrl.envs.outside import check_name, is_outside
    from robotrl.envs.tasks import TASKS

    names = [value] if isinstance(value, str) else list(value or ())
    for i, name in enumerate(names):
        if is_outside(name):
            names[i] = check_name(name)
        elif "?" in name and name.partition("?")[0] in TASKS:  # a task with options: built once to check them
            from robotrl.envs import make_task

            make_task(name)
        elif name != "all" and name not in TASKS:
            close = difflib.get_close_matches(name, list(TASKS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{field}: unknown task {name!r}; expected one of {sorted(TASKS)}, gym:<id> or "
                f"<module>:<callable>{hint}"
            )
    if isinstance(value, str):
        return names[0]
    return value if value is None else type(value)(names)


# ---------------------------------------------------------------------------------------------------
# errors: one line naming the field
# ---------------------------------------------------------------------------------------------------
def user_error(error: BaseException) -> bool:
    """An error bad input causes (a value, a file, a spec, a device), as opposed to a bug."""
    from robotrl.datasets.store import StoreError
    from robotrl.datasets.teleop import TeleopError

    return isinstance(error, (ValueError, OSError, StoreError, TeleopError))


def name_the_field(message: str, config: Any, error: BaseException) -> str:
    """`message`, led by the config field it is about where it does not name one: the field whose path the
    error's file is (or lies on), else the field whose value it quotes."""
    if config is None or not dataclasses.is_dataclass(config):
        return message
    names = [f.name for f in dataclasses.fields(config)]
    if any(
        re.search(rf"(?<![\w-])(?:\w+\.)?{re.escape(n)}:|--{re.escape(n.replace('_', '-'))}(?![\w-])", message)
        for n in names
    ):  # `Config.field: ...`, `field: ...` or `--field`
        return message
    filename = getattr(error, "filename", None)
    for n in names:
        value = getattr(config, n)
        paths = [p for p in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(p, (str, Path))]
        for p in paths:
            if not str(p):
                continue
            on_path = {Path(p), *Path(p).parents} - {Path("."), Path("/")}
            if filename is not None and (Path(filename) in on_path or Path(p) in Path(filename).parents):
                return f"{n}: {message}"
            if isinstance(p, Path) and str(p) in message:
                return f"{n}: {message}"
    return message


def fail(prog: str, message: str) -> None:
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(2)


def run(prog: str, command: Command, args: Sequence[str]) -> Any:
    """Parse and run one command; bad input ends in one line on stderr and exit status 2."""
    config = None
    try:
        config = parse(prog, command, args)
        check_numbers(config)
        return command.runner()(config)
    except UsageError as e:
        fail(prog, str(e))
    except Exception as e:
        if os.environ.get("ROBOTRL_TRACEBACK") or not user_error(e):
            raise
        fail(prog, name_the_field(os_message(e, config) or type(e).__name__, config, e))


def os_message(error: BaseException, config: Any) -> str:
    """An OS error as "<cause>: <path>". A failed write names no file (a full disk mid-write): then the
    command's output, the field `out` or `run_dir`, is the path it was writing under."""
    if not isinstance(error, OSError) or error.errno is None:
        return str(error)
    if error.filename:
        return f"{error.strerror}: {error.filename}"
    fields = ("out", "run_dir")
    outputs = [f"{n}: {error.strerror} while writing {v}" for n in fields if (v := getattr(config, n, None))]
    return outputs[0] if outputs else str(error)


# ---------------------------------------------------------------------------------------------------
# listings and dispatch
# ---------------------------------------------------------------------------------------------------
def listing(prog: str, description: str, title: str, rows: dict[str, str], usage: str) -> str:
    width = max(len(name) for name in rows) + 2
    lines = [f"usage: {prog} {usage}", "", description, "", f"{title}:"]
    for name, text in rows.items():
        wrapped = textwrap.wrap(text, 100 - width, break_on_hyphens=False) or [""]
        lines += [f"  {name:<{width}}{wrapped[0]}"] + [f"  {'':<{width}}{more}" for more in wrapped[1:]]
    return "\n".join(lines)


def top_help() -> str:
    rows = {**GROUPS, "run": RUN.summary}
    text = listing(
        "robotrl",
        "Robot learning from demonstrations and parallel simulation to a distilled one-step policy on ROS 2.",
        "commands",
        rows,
        "{envs,data,train,policy} <command> [--options] | run [--options]",
    )
    return text + (
        "\n\n`robotrl <group> --help` lists a group's commands, `robotrl <group> <command> --help` its options."
    )


def group_help(group: str) -> str:
    rows = {name: command.summary for name, command in COMMANDS[group].items()}
    return listing(f"robotrl {group}", GROUPS[group], "commands", rows, "<command> [--options]")


def unknown(prog: str, what: str, word: str, choices: Sequence[str]) -> None:
    close = difflib.get_close_matches(word, list(choices), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    fail(prog, f"unknown {what} {word!r}; expected one of {', '.join(choices)}{hint}")


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: runs one command (its result is printed, not returned: the script's exit status is 0)."""
    args = list(sys.argv[1:] if argv is None else argv)
    asks_help = not args or args[0] in ("-h", "--help")
    if asks_help:
        print(top_help(), file=sys.stdout if args else sys.stderr)
        raise SystemExit(0 if args else 2)
    word, rest = args[0], args[1:]
    if word == "run":
        run("robotrl run", RUN, rest)
        return
    if word not in COMMANDS:
        unknown("robotrl", "command", word, [*COMMANDS, "run"])
    if not rest or rest[0] in ("-h", "--help"):
        print(group_help(word), file=sys.stdout if rest else sys.stderr)
        raise SystemExit(0 if rest else 2)
    name = rest[0]
    if name not in COMMANDS[word]:
        unknown(f"robotrl {word}", "command", name, list(COMMANDS[word]))
    run(f"robotrl {word} {name}", COMMANDS[word][name], rest[1:])


if __name__ == "__main__":
    main()
