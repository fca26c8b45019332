"""The `robotrl` command line: `robotrl <group> <command> [--options]`.

Every command is a typed dataclass (parsed by tyro), and the same dataclass is the Python API: e.g.
`robotrl train sb3 --task Reach` is `robotrl.rl.sb3.train(Sb3Config(task="Reach"))`. `--help` works at
every level. Heavy imports (SB3, torch, MuJoCo) happen only once a command runs, so `--help` stays fast.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from robotrl.rl.sb3 import Sb3Config


@dataclass
class EnvsList:
    """List the tasks with a summary of their spec (observations, action, rate, episode length)."""

    json: bool = False
    """print one JSON object per task (the full spec) instead of a table"""


@dataclass
class EnvsCheck:
    """Run gymnasium's env checker (`gymnasium.utils.env_checker.check_env`) on a registered task."""

    task: str = "Reach"
    """task name, or 'all'"""
    render: bool = True
    """also check rendering (rgb_array)"""


@dataclass
class EnvsView:
    """Render one scripted-expert episode of a task to an mp4."""

    task: str = "Reach"
    out: Path = Path("expert.mp4")
    seed: int = 0
    noise: float = 0.0
    """teleop-like noise of the expert (0 = perfect)"""
    camera: str | None = None
    """MJCF camera name (default: the task's first camera, else the free camera)"""
    width: int = 640
    height: int = 480


@dataclass
class _Group:
    """Placeholder for the top-level help; a group's own commands are parsed by `main`."""


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
        print(f"{name:<11} obs: {obs}; action: {spec.action_mode} {spec.action.shape} of {modes}; "
              f"{spec.control_hz:g} Hz, {spec.episode_steps} steps")


def run_check(config: EnvsCheck) -> None:
    import warnings

    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from robotrl.envs import list_tasks
    from robotrl.envs.registration import env_id

    names = list_tasks() if config.task == "all" else [config.task]
    for name in names:
        env = gym.make(env_id(name), render_mode="rgb_array" if config.render else None, width=160, height=120)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=not config.render)
        env.close()
        notes = sorted({str(w.message).replace("\x1b[33m", "").replace("\x1b[0m", "") for w in caught})
        print(f"{env_id(name)}: check_env passed" + "".join(f"\n  note: {n}" for n in notes))


def run_view(config: EnvsView) -> None:
    from robotrl.envs.video import record_expert_episode

    video = record_expert_episode(config.task, config.out, seed=config.seed, noise=config.noise,
                                  camera=config.camera, size=(config.height, config.width))
    print(json.dumps({"path": str(video.path), "frames": video.frames, "success": video.success,
                      "instruction": video.instruction}))


def run_sb3(config: Sb3Config) -> None:
    from robotrl.rl.sb3 import train

    result = train(config)
    lo, hi = result.success_ci95
    print(f"{config.task} {config.algo.upper()}: success rate {result.success_rate:.1%} "
          f"(95% CI {lo:.1%}-{hi:.1%}) over {result.episodes} episodes after {result.timesteps} steps "
          f"({result.train_seconds:.0f} s of training); run dir {result.run_dir}")


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


def load_bench() -> Any:
    """`bench/envs.py` of the source checkout (benchmarks live next to the package, not inside it)."""
    path = Path(__file__).resolve().parents[1] / "bench" / "envs.py"
    if not path.exists():
        raise SystemExit(f"robotrl envs bench: expected the benchmark at {path} (a source checkout), not found")
    spec = importlib.util.spec_from_file_location("robotrl_bench_envs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


Commands = dict[str, tuple[type, Callable[[Any], Any]]]


TRAIN_HELP = ("Training: behaviour cloning (flow, diffusion, mean-flow, VLA), offline / online (PPO, DSRL-SAC) / HIL RL of flow policies, "
              "a success classifier, SAC / RLPD / WSRL, IQL, Cal-QL, PPO, and Stable-Baselines3.")


def _groups() -> dict[str, tuple[str, Callable[[], Commands]]]:
    def envs() -> Commands:
        bench = load_bench()
        return {"list": (EnvsList, run_list), "check": (EnvsCheck, run_check), "view": (EnvsView, run_view),
                "bench": (bench.BenchConfig, bench.main)}

    def train() -> Commands:
        from robotrl.flowrl.classifier import ClassifierConfig, run_train_classifier
        from robotrl.flowrl.dsrl import DsrlConfig, run_train_dsrl
        from robotrl.flowrl.hil import HilConfig, run_train_hil
        from robotrl.flowrl.offline import OfflineFlowConfig, run_train_offline
        from robotrl.flowrl.online import OnlineConfig, run_train_online
        from robotrl.rl.actor_learner import ActorLearnerConfig, run_train_sac_distributed
        from robotrl.rl.calql import CalqlConfig, run_train_calql
        from robotrl.rl.iql import IqlConfig, run_train_iql
        from robotrl.rl.ppo import PpoConfig
        from robotrl.rl.sac import SacConfig, run_train_sac
        from robotrl.rl.sb3 import Sb3PpoConfig, Sb3SacConfig, Sb3Td3Config
        from robotrl.stages.bc import BCConfig, run_train_bc

        return {"bc": (BCConfig, run_train_bc), "offline": (OfflineFlowConfig, run_train_offline),
                "online": (OnlineConfig, run_train_online), "dsrl": (DsrlConfig, run_train_dsrl),
                "hil": (HilConfig, run_train_hil),
                "classifier": (ClassifierConfig, run_train_classifier), "sac": (SacConfig, run_train_sac),
                "sac-distributed": (ActorLearnerConfig, run_train_sac_distributed), "iql": (IqlConfig, run_train_iql),
                "calql": (CalqlConfig, run_train_calql), "ppo": (PpoConfig, run_ppo), "sb3": (Sb3Config, run_sb3),
                "sb3:SAC": (Sb3SacConfig, run_sb3), "sb3:PPO": (Sb3PpoConfig, run_sb3), "sb3:TD3": (Sb3Td3Config, run_sb3)}

    def data() -> Commands:
        from robotrl.datasets import ops, record

        return {"info": (ops.DataInfo, ops.info), "validate": (ops.DataValidate, ops.check),
                "stats": (ops.DataStats, ops.stats), "merge": (ops.DataMerge, ops.merge),
                "split": (ops.DataSplit, ops.split), "record": (record.DataRecord, record.run_record),
                "export": (ops.DataExport, ops.export), "import": (ops.DataImport, ops.import_)}

    return {"envs": ("Task suite: list, check, view and benchmark the environments.", envs),
            "data": ("Episode stores: inspect, validate, merge, split, record demos, convert.", data),
            "train": (TRAIN_HELP, train)}


def _commands() -> dict[str, tuple[str, Callable[[], tuple[type, Callable[[Any], Any]]]]]:
    """Top-level commands that take options directly (`robotrl collect --task PushT ...`)."""

    def collect() -> tuple[type, Callable[[Any], Any]]:
        from robotrl.datasets.collect import CollectConfig, run_collect

        return CollectConfig, run_collect

    def evaluate() -> tuple[type, Callable[[Any], Any]]:
        from robotrl.training.evaluate import EvalConfig, run_eval

        return EvalConfig, run_eval

    def distill() -> tuple[type, Callable[[Any], Any]]:
        from robotrl.stages.distill import DistillConfig, run_distill

        return DistillConfig, run_distill

    def export() -> tuple[type, Callable[[Any], Any]]:
        from robotrl.policies.export import ExportConfig, run_export

        return ExportConfig, run_export

    def pipeline() -> tuple[type, Callable[[Any], Any]]:
        from robotrl.stages.pipeline import PipelineConfig, run_pipeline

        return PipelineConfig, run_pipeline

    run = "The whole pipeline on a task: demos, BC, offline RL, online RL with interventions, one-step distillation."
    return {"run": (run, pipeline),
            "collect": ("Teleoperate (or script) a task and record episodes into a store.", collect),
            "distill": ("Distill a flow / diffusion teacher into a one-step consistency student.", distill),
            "export": ("Export a policy checkpoint to ONNX or TorchScript (+ manifest) for the runtime.", export),
            "eval": ("Success rate of a policy over held-out seeds, with a 95% interval and videos.", evaluate)}


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    groups, commands_ = _groups(), _commands()
    if args and args[0] in commands_:
        cls, fn = commands_[args[0]][1]()
        _run(fn, tyro.cli(cls, prog=f"robotrl {args[0]}", args=args[1:]), f"robotrl {args[0]}")
        return
    if not args or args[0] not in groups:
        docs = {**{n: d for n, (d, _) in groups.items()}, **{n: d for n, (d, _) in commands_.items()}}
        placeholders = {name: type(name, (_Group,), {"__doc__": doc}) for name, doc in docs.items()}
        tyro.extras.subcommand_cli_from_dict({k: dataclass(v) for k, v in placeholders.items()}, prog="robotrl", args=args)
        raise SystemExit(f"robotrl: expected one of the groups {sorted(groups)}, got {args}")
    commands = groups[args[0]][1]()
    config = tyro.extras.subcommand_cli_from_dict({k: cls for k, (cls, _) in commands.items()},
                                                  prog=f"robotrl {args[0]}", args=args[1:])
    name, run = next((name, fn) for name, (cls, fn) in commands.items() if type(config) is cls)
    _run(run, config, f"robotrl {args[0]} {name}")


def _run(fn: Callable[[Any], Any], config: Any, prog: str) -> None:
    """Run a command; bad input (files, specs, values) ends in one line naming the problem, not a traceback.
    ROBOTRL_TRACEBACK=1 shows the traceback."""
    import os

    from robotrl.datasets.store import StoreError

    try:
        fn(config)
    except (ValueError, StoreError, FileNotFoundError, FileExistsError) as e:
        if os.environ.get("ROBOTRL_TRACEBACK"):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
