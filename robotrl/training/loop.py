"""What every training loop shares: EMA weights, the warm-up + cosine learning-rate schedule, a run directory
with TensorBoard events and metrics.jsonl, and exact resume (model, EMA, optimizer, schedule, RNG states)."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar

import numpy as np
import torch
from torch import nn

from robotrl.core.files import claim_run_dir, default_run_dir, release_run_dir, write_atomically
from robotrl.core.options import check_numbers
from robotrl.envs.tasks import DEFAULT_TASK
from robotrl.training import state_file

#: what a diverged run's message advises
LOWER_LR = "resume with --resume-changes lr and a lower --lr"


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


def optimizer_step(
    loss: torch.Tensor,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    where: str,
    max_grad_norm: float = 1.0,
) -> tuple[float, float]:
    """One clipped gradient step; a NaN/inf loss raises `TrainingDiverged` (naming `where`) before any weight
    changes. Returns (loss, gradient norm)."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingDiverged(f"{where}: loss is {value}; the last good checkpoint is kept ({LOWER_LR})")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    schedule.step()
    return value, grad_norm


def gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, where: str) -> None:
    """One unclipped step of an actor-critic loss; a NaN/inf loss raises `TrainingDiverged` (naming `where`)
    before any weight changes, so the last train state on disk stays good."""
    value = loss.item()
    if not math.isfinite(value):
        raise TrainingDiverged(f"{where} loss is {value}; the last good train state is kept ({LOWER_LR})")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def check_finite_weights(module: nn.Module, where: str) -> None:
    """After an update: a finite loss can still take an infinite step; raise `TrainingDiverged` (naming `where`)
    so that the last good train state on disk is what is kept."""
    if not all(torch.isfinite(p).all() for p in module.parameters()):
        raise TrainingDiverged(
            f"{where}: weights are not finite after the update; the last good train state is kept ({LOWER_LR})"
        )


M = TypeVar("M", bound=nn.Module)


class EMA(Generic[M]):
    """Exponential moving average of a module's weights, with diffusion policy's warm-up (the decay grows with
    the step count, so early averages do not drag in random initial weights). `warmup=False` averages at the full
    decay from the first update: a fine-tuning run's starting weights are already good, and are the average's start."""

    def __init__(self, model: M, decay: float = 0.999, power: float = 0.75, warmup: bool = True) -> None:
        self.model: M = copy.deepcopy(model).eval().requires_grad_(False)
        self.max_decay, self.power, self.step, self.warmup = decay, power, 0, warmup

    def decay(self) -> float:
        if not self.warmup:
            return self.max_decay
        return min(self.max_decay, 1 - (1 + self.step) ** -self.power) if self.step > 0 else 0.0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        d = self.decay()
        averages: list[torch.Tensor] = list(self.model.parameters())
        weights = [p.detach() for p in model.parameters()]
        torch._foreach_mul_(averages, d)  # one fused kernel per dtype and device, not two per tensor (GPU runs)
        torch._foreach_add_(averages, weights, alpha=1 - d)
        for ema_b, b in zip(self.model.buffers(), model.buffers()):
            ema_b.copy_(b)
        self.step += 1

    def state(self, name: str = "ema") -> dict[str, Any]:
        """The average and its step for a train state, under `name` and `{name}_step`."""
        return {name: self.model.state_dict(), f"{name}_step": self.step}

    def load(self, state: dict[str, Any], name: str = "ema") -> None:
        """Back to what `state(name)` saved."""
        self.model.load_state_dict(state[name])
        self.step = int(state[f"{name}_step"])


def cosine_lr(step: int, total: int, warmup: int) -> float:
    """Multiplier of the base learning rate: linear warm-up, then a cosine decay to zero at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


class RunLog:
    """metrics.jsonl (one JSON object per `log` call) and TensorBoard events in the run directory."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(self.run_dir / "metrics.jsonl", "a")  # noqa: SIM115 -- open for the run, closed by close()
        self.tb = SummaryWriter(str(self.run_dir / "tb"))
        self.start = time.perf_counter()

    def log(self, step: int, **metrics: float | torch.Tensor) -> None:
        row = {
            "step": step,
            "wall_s": round(time.perf_counter() - self.start, 3),
            **{k: float(v) for k, v in metrics.items()},
        }
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        for k, v in metrics.items():
            self.tb.add_scalar(k, float(v), step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()
        release_run_dir(self.run_dir)


@dataclass
class TaskOptions:
    """The task an online RL run acts in (its config's first fields)."""

    task: str = DEFAULT_TASK
    """task name (`robotrl envs list`), or an outside env: gym:<id> or <module>:<callable>"""
    action_mode: str | None = None
    """the task's action mode (default: its own; 'native' for an outside env)"""
    reward_type: Literal["dense", "sparse"] = "dense"
    obs_keys: tuple[str, ...] = ("state",)
    """numeric, non-image observation keys, flattened in this order"""


@dataclass
class RunOptions:
    """The run directory, its train states, logging, seed and threads: what every training run's config shares
    (BC, distillation, the classifier and every RL run); `start_run` sets a run up from them."""

    #: settings a resumption may change: they do not alter what the run computes
    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = (
        "run_dir",
        "resume",
        "resume_changes",
        "overwrite",
        "progress",
        "threads",
        "device",
        "log_every",
        "checkpoint_every",
        "eval_every",
    )

    run_dir: Path | None = None
    """default: runs/<algorithm>-<task>-<time>"""
    resume: bool = False
    """continue the run in run_dir exactly from its last train state; settings that would alter the run (its
    data, sizes, learning rate, schedule) must be as recorded in run_dir/config.json"""
    overwrite: bool = False
    """start afresh in a run_dir that holds a run, deleting what it holds (without it such a run_dir is refused)"""
    resume_changes: tuple[str, ...] = ()
    """settings a resumption may change although they alter the run (e.g. `lr` after a divergence); each such
    resumption is kept in run_dir/resumed.jsonl"""
    seed: int = 0
    threads: int = 1
    """torch CPU threads"""
    progress: bool = True
    """show a progress bar"""
    checkpoint_every: int = 5_000
    """steps between train states"""
    log_every: int = 1_000
    """steps between metrics rows"""
    eval_every: int = 0
    """evaluate every N steps (0: only at the end)"""

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("checkpoint_every", "log_every", "threads"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field}: expected >= 1, got {getattr(self, field)}")
        if self.eval_every < 0:
            raise ValueError(f"{name}.eval_every: expected >= 0, got {self.eval_every}")
        if self.resume and self.run_dir is None:
            raise ValueError(f"{name}.resume: needs run_dir (the run to continue)")
        if self.resume and self.overwrite:
            raise ValueError(f"{name}.overwrite: expected either --resume or --overwrite, got both")
        self.resume_changes = tuple(self.resume_changes)
        names = {f.name for f in fields(self)}
        if unknown := [f for f in self.resume_changes if f not in names]:
            raise ValueError(f"{name}.resume_changes: expected names of {name}'s settings, got {unknown}")
        if self.run_dir is not None:
            self.run_dir = Path(self.run_dir)


@dataclass
class PolicyRunOptions(RunOptions):
    """`RunOptions` of a run that ends with a policy evaluated on held-out episodes in the vector env."""

    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = (
        *RunOptions.RESUME_MAY_CHANGE,
        "eval_episodes",
        "eval_envs",
        "execute",
    )  # evaluations draw from their own generators: they never move the run's random streams

    eval_episodes: int = 50
    """held-out episodes of the final evaluation (0: none)"""
    eval_envs: int = 25
    """parallel envs of the evaluations"""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.eval_envs < 1:
            raise ValueError(f"{name}.eval_envs: expected >= 1, got {self.eval_envs}")
        if self.eval_episodes < 0:
            raise ValueError(f"{name}.eval_episodes: expected >= 0, got {self.eval_episodes}")


def check_resumable(config: RunOptions, run_dir: Path) -> None:
    """Refuse a resumption whose settings differ from the run's recorded ones where that would alter the run
    (outside `RESUME_MAY_CHANGE` and the config's `resume_changes`), naming each field and both values; a path
    counts as the same however it is spelled. An allowed change of an altering setting is logged."""
    file = run_dir / "config.json"
    if not file.exists():
        return
    recorded = json.loads(file.read_text())
    now = json.loads(json.dumps(jsonable(config)))
    free = set(type(config).RESUME_MAY_CHANGE)
    changed = {}
    for key, value in now.items():
        old = recorded.get(key, value)
        if key in free or old == value:
            continue
        if isinstance(old, str) and isinstance(value, str) and Path(old).resolve() == Path(value).resolve():
            continue
        changed[key] = (old, value)
    refused = {k: v for k, v in changed.items() if k not in config.resume_changes}
    if refused:
        detail = "; ".join(f"{k}: run has {old!r}, given {new!r}" for k, (old, new) in refused.items())
        raise ValueError(
            f"{type(config).__name__}.resume: {file} records other settings ({detail}); a resumption may change "
            f"{', '.join(sorted(free - {'resume', 'resume_changes'}))}, and what --resume-changes names"
        )
    if changed:
        with (run_dir / "resumed.jsonl").open("a") as f:
            row = {"changed": {k: {"run": old, "given": new} for k, (old, new) in changed.items()}}
            f.write(json.dumps(row) + "\n")


#: the file in a run directory that a resume continues from (robotrl/training/state_file.py), and the pickled one
#: that earlier versions wrote in its place
TRAIN_STATE, PICKLED_TRAIN_STATE = "train_state.safetensors", "train_state.pt"


def start_run(
    config: RunOptions, algorithm: str, task: str, holds: str | None = None
) -> tuple[Path, Path, np.random.Generator]:
    """Threads, seeds, the run directory (its config.json on a fresh start; its train state must exist to resume):
    (run_dir, train state path, the run's numpy generator). A fresh start is refused where run_dir already holds a
    run (its config.json, or the `holds` file: a train state or replay) unless `overwrite` clears it first."""
    check_numbers(config)
    run_dir = Path(config.run_dir or default_run_dir(algorithm, task))
    held = [m for m in ("config.json", holds) if m is not None and (run_dir / m).exists()]
    if held and not config.resume and not config.overwrite:
        raise FileExistsError(
            f"{type(config).__name__}.run_dir: {run_dir} already holds a run ({held[-1]}); resume it (--resume), "
            "replace it (--overwrite) or pick another run_dir"
        )
    torch.set_num_threads(config.threads)
    claim_run_dir(run_dir, clear=bool(held) and config.overwrite)  # locked until the run's log closes
    state_path = run_dir / TRAIN_STATE
    if config.resume and not state_path.exists() and (run_dir / PICKLED_TRAIN_STATE).exists():
        raise FileNotFoundError(
            f"resume: {run_dir / PICKLED_TRAIN_STATE} is an earlier robotrl's pickled train state, which this version "
            f"does not read ({TRAIN_STATE}: nothing unpickled); start the run again (--overwrite) or in another run_dir"
        )
    if config.resume and not state_path.exists():
        raise FileNotFoundError(f"resume: {state_path} does not exist (no train state was written in {run_dir})")
    if config.resume:
        check_resumable(config, run_dir)
    if not config.resume:
        write_atomically(run_dir / "config.json", json.dumps(jsonable(config), indent=2))
    torch.manual_seed(config.seed)
    return run_dir, state_path, np.random.default_rng(config.seed)


@dataclass
class RLResult:
    """What an actor-critic run (SAC, IQL, PPO) ends with; also its run directory's result.json."""

    weights: Path
    """the actor's (PPO: the agent's) state dict"""
    steps: int
    train_seconds: float
    """training alone, evaluation excluded"""
    success_rate: float | None
    success_ci95: tuple[float, float] | None
    run_dir: Path
    steps_per_second: float | None = None
    best_weights: Path | None = None
    """the best evaluated weights (flow-policy runs with evaluations: `BestCheckpoint`)"""
    best: dict[str, float] | None = None
    """their {"step", "success_rate"} (or "mean_return" where the env reports no success) on the run's evaluation
    seeds"""
    mean_return: float | None = None
    """the final evaluation's mean return (what an env without success is judged by)"""

    def save(self) -> Self:
        (self.run_dir / "result.json").write_text(json.dumps(jsonable(self), indent=2))
        return self

    def summary(self, name: str, episodes: int, unit: str = "env steps") -> str:
        ci = f" (95% CI {self.success_ci95[0]:.1%}-{self.success_ci95[1]:.1%})" if self.success_ci95 else ""
        success = (
            f"success {self.success_rate:.1%}{ci} over {episodes} held-out episodes; "
            if self.success_rate is not None
            else f"mean return {self.mean_return:.2f} over {episodes} held-out episodes (no success reported); "
            if self.mean_return is not None
            else ""
        )
        rate = f" ({self.steps_per_second:,.0f} steps/s)" if self.steps_per_second else ""
        kept = ""
        if self.best and self.best_weights:
            best = self.best
            score = (
                f"{best['success_rate']:.1%}" if "success_rate" in best else f"mean return {best['mean_return']:.2f}"
            )
            kept = f"; best evaluated {score} at {int(best['step'])} {unit}: {self.best_weights}"
        return f"{name}: {success}{self.steps} {unit} in {self.train_seconds:.0f} s{rate}; weights {self.weights}{kept}"


def recent_episodes(
    returns: Sequence[float], success: Sequence[bool], window: int, reports_success: bool = True
) -> dict[str, float]:
    """An online run's training metrics over its last `window` finished episodes: the mean return and, where the
    env reports success, the success rate ({} before any episode ends)."""
    if not returns:
        return {}
    out = {"train/return": float(np.mean(returns[-window:]))}
    if reports_success:
        out["train/success_rate"] = float(np.mean(success[-window:]))
    return out


def postfix(metrics: Mapping[str, float]) -> dict[str, str]:
    """A progress bar's postfix from `recent_episodes`: the success rate, else the return."""
    if "train/success_rate" in metrics:
        return {"success": f"{metrics['train/success_rate']:.2f}"}
    return {"return": f"{metrics['train/return']:.1f}"} if metrics else {"success": "-"}


class BestCheckpoint:
    """A run's best evaluated weights, kept beside its last ones: online RL of a flow policy does not climb
    monotonically (PickPlace's dips and climbs again; bench/RESULTS.md, "PickPlace with the state flow policy"), so
    the last checkpoint can be a dip. Chosen on the run's own evaluation seeds, so its success there is biased
    upwards: report it on other seeds. The record is on disk, so a resumed run compares against what the killed one
    kept."""

    def __init__(self, run_dir: Path, save: Callable[[Path], Any], name: str = "best_policy") -> None:
        self.path, self.record, self.save = run_dir / name, run_dir / f"{name}.json", save

    def best(self) -> dict[str, float] | None:
        """{"step", "success_rate"} of the kept weights ({"step", "mean_return"} in an env that reports no
        success); None before any evaluation."""
        return json.loads(self.record.read_text()) if self.record.exists() else None

    def offer(self, step: int, score: float, by: str = "success_rate") -> bool:
        """Keep the current weights if their `score` (`by`: "success_rate" or "mean_return", `EpisodeStats.by`)
        beats the kept ones' (a tie keeps the earlier)."""
        kept = self.best()
        if kept is not None and by in kept and score <= kept[by]:
            return False
        self.save(self.path)
        write_atomically(self.record, json.dumps({"step": step, by: score}))  # names weights already whole
        return True


class TrainClock:
    """A run's training wall-clock with its held-out evaluations kept out of it, and those periodic evaluations."""

    def __init__(self) -> None:
        self.began, self.eval_seconds = time.perf_counter(), 0.0

    def trained(self) -> float:
        """Seconds of training so far, evaluation excluded."""
        return time.perf_counter() - self.began - self.eval_seconds

    def evaluate_every(
        self,
        config: PolicyRunOptions,
        log: RunLog,
        evaluate: Any,
        now: int,
        before: int,
        last: bool,
        best: BestCheckpoint | None = None,
    ) -> None:
        """Evaluate and log when the step count went past a multiple of `eval_every` between `before` and `now`
        (not on the `last` step: the final evaluation follows); offer the weights to `best`."""
        if not config.eval_every or last or now // config.eval_every == before // config.eval_every:
            return
        t0 = time.perf_counter()
        trained = t0 - self.began - self.eval_seconds
        stats = evaluate()
        log.log(now, **stats.metrics(), **{"time/train_seconds": trained})
        if best is not None:
            best.offer(now, stats.score, stats.by)
        self.eval_seconds += time.perf_counter() - t0


def finish_run(
    config: PolicyRunOptions,
    log: RunLog,
    evaluate: Any,
    weights: Path,
    steps: int,
    seconds: float,
    run_dir: Path,
    steps_per_second: float | None = None,
    best: BestCheckpoint | None = None,
) -> RLResult:
    """An RL run's end: the final held-out evaluation (if `eval_episodes`), logged at `steps` with the training
    seconds and offered to `best`, the log closed, and the result saved in the run directory."""
    success, ci, mean_return = None, None, None
    if config.eval_episodes > 0:
        final = evaluate()
        mean_return = final.mean_return
        if final.reports_success:
            success, ci = final.success_rate, final.success_ci95()
        log.log(steps, **final.metrics(), **{"time/train_seconds": seconds})
        if best is not None:
            best.offer(steps, final.score, final.by)
    log.close()
    kept = best.best() if best is not None else None
    return RLResult(
        weights,
        steps,
        seconds,
        success,
        ci,
        run_dir,
        steps_per_second,
        best_weights=best.path if best is not None and kept else None,
        best=kept,
        mean_return=mean_return,
    ).save()


def finish_iterations(
    config: PolicyRunOptions,
    log: RunLog,
    evaluate: Any,
    weights: Path,
    clock: TrainClock,
    run_dir: Path,
    iterations: int,
    start: int,
    per_iteration: int,
    best: BestCheckpoint | None = None,
) -> RLResult:
    """`finish_run` for an on-policy run of `iterations` rollouts of `per_iteration` env steps, resumed after
    `start` of them: its env steps per training second count only the steps this process took."""
    seconds, steps = clock.trained(), iterations * per_iteration
    return finish_run(
        config,
        log,
        evaluate,
        weights,
        steps,
        seconds,
        run_dir,
        steps_per_second=(steps - start * per_iteration) / max(seconds, 1e-9),
        best=best,
    )


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """The torch and numpy-generator states a run draws from (plain ints and tensors: no pickle needed); with
    the GPUs' generators where a run on a GPU drew from them."""
    state = {"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], rng: np.random.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    rng.bit_generator.state = state["numpy"]


def check_device(device: str, field: str) -> None:
    """A config's torch device, refused at construction (not hours into a run) where this machine has none."""
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"{field}: expected a torch device such as 'cpu' or 'cuda', got {device!r}") from error
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{field}: expected a device this machine has, got {device!r} (torch sees no CUDA GPU: "
            f"a CPU build of torch, or no driver)"
        )
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"{field}: expected a GPU index below {torch.cuda.device_count()}, got {device!r}")


def save_train_state(path: Path, **state: Any) -> None:
    """Everything needed to continue a run exactly (model, EMA and optimizer tensors, step, RNG states);
    atomic, so a kill mid-save keeps the previous state."""
    write_atomically(path, state_file.encode(state))  # a full disk is one OSError naming `path`, the old state kept


class TrainStateError(ValueError):
    """A train state that cannot be read back (truncated, damaged, or not one); the message names the file."""


def load_train_state(path: Path) -> dict[str, Any]:
    """The train state at `path` (robotrl/training/state_file.py: nothing is unpickled), onto the CPU whatever
    device wrote them (a GPU run resumes on a machine without one; load_state_dict moves each tensor to its module's
    device). A file that is not a whole train state is a `TrainStateError` naming it, not a traceback."""
    try:
        state = state_file.decode(path)
    except OSError:
        raise  # missing, not readable: one line naming the file already
    except ValueError as cause:  # truncated, damaged, or another kind of file
        raise TrainStateError(
            f"{path}: not a whole train state ({cause}); the run cannot be resumed from it: start it again "
            "(--overwrite) or from another copy"
        ) from cause
    if not isinstance(state, dict) or "step" not in state:
        raise TrainStateError(f"{path}: expected a train state (a mapping with its step), got {type(state).__name__}")
    return state


def save_run_state(
    path: Path,
    step: int,
    agent: nn.Module,
    optimizers: Mapping[str, torch.optim.Optimizer],
    rng: np.random.Generator,
    env: Any = None,
    **extra: Any,
) -> None:
    """An RL run's train state: weights, optimizers, RNGs and, for an online run, the vector env mid-episode
    (physics, step counters and the stream that draws reset states), so that a resume continues exactly."""
    state = {
        "step": step,
        "agent": agent.state_dict(),
        "opt": {k: o.state_dict() for k, o in optimizers.items()},
        "rng": rng_state(rng),
        **extra,
    }
    if env is not None:
        state["env"] = {k: torch.from_numpy(np.asarray(v)) for k, v in env.get_state().items()}
        state["env_rng"] = env.get_rng_state()
    save_train_state(path, **state)


def load_run_state(
    path: Path,
    agent: nn.Module,
    optimizers: Mapping[str, torch.optim.Optimizer],
    rng: np.random.Generator,
    env: Any = None,
) -> dict[str, Any]:
    """Restore what `save_run_state` saved into the live objects; returns the state for the run's own extras."""
    state = load_train_state(path)
    agent.load_state_dict(state["agent"])
    for k, o in optimizers.items():
        o.load_state_dict(state["opt"][k])
    set_rng_state(state["rng"], rng)
    if env is not None:
        env.set_state({k: v.numpy() for k, v in state["env"].items()})
        env.set_rng_state(state["env_rng"])
    return state


def polyak(net: nn.Module, target: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau net, parameter by parameter."""
    with torch.no_grad():
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.lerp_(p, tau)
