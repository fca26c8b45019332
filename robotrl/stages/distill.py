"""Distillation: a flow, diffusion or VLA teacher checkpoint -> a one-step consistency student checkpoint.

    robotrl policy distill --teacher runs/bc-flow/policy --store data/pusht.zarr --steps 5000
    student = robotrl.stages.distill.distill(DistillConfig(teacher=Path("runs/bc-flow/policy"),
                                                    store=Path("data/pusht.zarr")))   # the same dataclass

Reads top to bottom: teacher -> data (the store's spec must equal the teacher's) -> student (the teacher's
architecture and weights, or a narrower fresh U-Net: `student_for`) -> optimizer, LR
schedule, the EMA target network and the EMA of the saved weights -> (resume) -> the loop (sample a window
batch, consistency-distillation loss, step, both EMAs, log, checkpoint, evaluate) -> the final EMA student,
evaluated and saved.

Besides the loss, the run logs `distill/teacher_gap`: the mean squared distance (normalized action units)
between the student's one-step chunk and the teacher's multi-step chunk from the same noise, on a fixed batch
of training observations -- what distillation drives down. A run killed at any point resumes exactly
(`--resume`): the same batches, noise and weights as a run that was never stopped.

`--dagger-rounds K` adds DAgger's data: K times in the run the student as it is drives `dagger_episodes` episodes
in the vector env, the teacher labels every window the student acted on with its own chunk, and those pairs make
up `dagger_fraction` of every batch from then on (`TeacherLabels`). Demos only show the expert's states; a one-step
student's small errors take it to states no demo holds, where it was never taught the teacher's answer.

`--solve-weight W` adds to the consistency loss, with weight W, the direct regression of the student's one call from
pure noise onto the teacher's whole ODE solve from the same noise (`ConsistencyHead.distill_loss`): the deployed
point trained on every row of a batch rather than reached through a chain of one-step targets, for N teacher calls
a step (bench/RESULTS.md, "PushT standard, the student's direct term").

`--gate-episodes N` accepts the distilled student only if it beats its own starting point on N fresh training-seed
episodes, and saves the start otherwise. A same-width student starts as the teacher's one-step Euler sampler,
which outputs about the teacher's mean chunk rather than a sample of it; on a task where precision beats
diversity that start can be the better policy (PickPlace's RL'd teacher scored higher at one Euler step than at
ten and than its distilled student; bench/RESULTS.md, "PickPlace's one-step policy"), and distillation, which
matches the ten-step samples, would give it away.
"""

from __future__ import annotations

import copy
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm import tqdm

from robotrl.core.files import write_atomically
from robotrl.datasets import EpisodeStore
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.envs.rollouts import EpisodeStats
from robotrl.policies import Policy, load
from robotrl.policies.consistency import ConsistencyPolicy, VLAConsistencyPolicy, student_for, teachers
from robotrl.training.evaluate import not_worse, rollout, training_seed
from robotrl.training.loop import (
    EMA,
    TRAIN_STATE,
    PolicyRunOptions,
    RunLog,
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
class DistillConfig(PolicyRunOptions):
    """Distill a flow, diffusion or VLA policy into a one-step consistency policy on the teacher's training data
    (the teacher is evaluated on the student's held-out episodes too)."""

    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = (*PolicyRunOptions.RESUME_MAY_CHANGE, "stop_after")

    teacher: Path = Path("runs/bc-flow/policy")
    """the teacher's checkpoint directory (`robotrl train bc` output)"""
    store: Path = Path("data/pusht.zarr")
    """episode store of the teacher's task (its spec must equal the teacher's); usually its training data"""
    steps: int = 5_000
    batch_size: int = 256
    lr: float = 1e-4
    weight_decay: float = 1e-6
    warmup: int = 200
    ema: float = 0.999
    """EMA decay of the weights that are evaluated and saved (0 turns it off)"""
    target_ema: float = 0.95
    """EMA decay of the target network the student is regressed onto (0: the student itself, stop-gradient)"""
    teacher_steps: int | None = None
    """N: teacher ODE steps the student learns to skip (default: the teacher's own sampler steps)"""
    channels: tuple[int, ...] | None = None
    """student U-Net widths (default: the teacher's, starting from its weights); narrower ones (same number of
    levels) give a faster student whose U-Net starts fresh and needs more steps (U-Net teachers only)"""
    gap_batch: int = 64
    """training windows on which the student-teacher gap is logged"""
    execute: int = 8
    """actions executed per predicted chunk at evaluation"""
    success_tail: int | None = None
    """distill on the store's episodes up to this many steps after their first success (None: every step;
    `train bc --success-tail`)"""
    solve_weight: float = 0.0
    """weight of the direct term: the student's one call from pure noise regressed onto the teacher's whole ODE
    solve from that noise, beside the consistency loss (0: consistency distillation alone). It trains the one point
    the deployed student uses on every row of a batch, for N teacher calls a batch"""
    dagger_rounds: int = 0
    """times the student drives and the teacher labels its windows (DAgger), spread evenly over the run (0: off)"""
    dagger_episodes: int = 50
    """episodes the student drives per round (in `eval_envs` parallel envs, on training seeds)"""
    dagger_fraction: float = 0.5
    """share of every batch drawn from the teacher-labelled windows once there are any"""
    gate_episodes: int = 0
    """fresh training-seed episodes on which the distilled student must beat its starting point (for a same-width
    student, the teacher's one-step Euler sampler) to be saved as the policy; else the start is (0: no gate)"""
    stop_after: int | None = None
    """end this invocation after this many steps in all (the LR schedule still spans `steps`); resume later"""
    device: str = "cpu"
    """torch device of the teacher and the student ("cuda"): the student, like its teacher, learns from the samples
    it sees, which a GPU's large batches give in minutes; evaluation and the saved weights are the same either way"""
    checkpoint_every: int = 1000
    """gradient steps between train states"""
    log_every: int = 50
    """gradient steps between metrics rows"""
    threads: int = 2
    """torch CPU threads (a U-Net's convolutions use a second core)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_device(self.device, "DistillConfig.device")
        for name in ("steps", "batch_size", "gap_batch", "dagger_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistillConfig.{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("ema", "target_ema"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"DistillConfig.{name}: expected a decay in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.solve_weight < float("inf"):
            raise ValueError(f"DistillConfig.solve_weight: expected a finite weight >= 0, got {self.solve_weight}")
        if self.gate_episodes < 0:
            raise ValueError(f"DistillConfig.gate_episodes: expected >= 0, got {self.gate_episodes}")
        if self.dagger_rounds < 0:
            raise ValueError(f"DistillConfig.dagger_rounds: expected >= 0, got {self.dagger_rounds}")
        if not 0.0 < self.dagger_fraction < 1.0:
            raise ValueError(f"DistillConfig.dagger_fraction: expected a share in (0, 1), got {self.dagger_fraction}")
        if self.teacher_steps is not None and self.teacher_steps < 1:
            raise ValueError(f"DistillConfig.teacher_steps: expected >= 1, got {self.teacher_steps}")
        if self.stop_after is not None and self.stop_after < 1:
            raise ValueError(f"DistillConfig.stop_after: expected >= 1, got {self.stop_after}")
        self.teacher, self.store = Path(self.teacher), Path(self.store)


@dataclass
class DistillResult:
    checkpoint: Path
    """the student checkpoint (`policy/` when finished, the last `checkpoint/` when stopped by stop_after)"""
    steps: int
    finished: bool
    train_seconds: float
    final_loss: float
    teacher_gap: float
    """mean squared student-teacher distance on the fixed batch, normalized units (teacher_gap_init at step 0)"""
    teacher_gap_init: float
    success_rate: float | None
    success_ci95: tuple[float, float] | None
    teacher_success_rate: float | None
    run_dir: Path
    dagger_pairs: int = 0
    """teacher-labelled windows of the student's own rollouts it trained on (`dagger_rounds`)"""
    dagger_env_steps: int = 0
    """env steps the student drove to collect them"""
    gate: dict[str, Any] | None = None
    """`gate_episodes`: the start's and the distilled student's success on the gate's episodes, which was kept"""


def load_teacher(path: Path, device: str = "cpu") -> Policy:
    teacher = load(path, device=device)
    if teacher.student is None:
        raise ValueError(
            f"DistillConfig.teacher: {path} is a {teacher.name!r} policy, which names no student; "
            f"expected a checkpoint of one of {teachers()}"
        )
    return teacher.requires_grad_(False).eval()


class TeacherGap:
    """Student one-step vs teacher multi-step chunks from the same noise on a fixed batch of training windows.
    Drawn from its own generators, so measuring it never moves the run's random streams (exact resume)."""

    def __init__(
        self,
        student: ConsistencyPolicy | VLAConsistencyPolicy,
        teacher: Policy,
        sampler: SequenceSampler,
        batch: int,
        seed: int,
    ) -> None:
        windows = sampler.sample(batch, np.random.default_rng(seed + 1))
        self.obs = student.normalize_obs(windows["obs"])
        generator = torch.Generator().manual_seed(seed + 1)
        self.noise = torch.randn(batch, student.noise_rows, student.action_dim, generator=generator).to(
            next(student.parameters()).device
        )
        self.reference = student.teacher_chunk(teacher, self.noise, self.obs)

    @torch.no_grad()
    def __call__(self, student: ConsistencyPolicy | VLAConsistencyPolicy) -> float:
        was_training = student.training
        chunk = student.eval().sample_from_noise(self.obs, self.noise)
        student.train(was_training)
        return float(((chunk - self.reference) ** 2).mean())


class TeacherLabels:
    """DAgger's data for a one-step student: windows the student meets when it drives, each labelled with the
    teacher's chunk there. Kept in run_dir/dagger.npz; each row carries the step of the round that collected it,
    so a resume keeps exactly the rows collected before its step (and collects the later rounds again, alike)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.obs: dict[str, np.ndarray] = {}
        self.action = np.zeros((0, 0, 0), np.float32)
        self.round = np.zeros(0, np.int64)
        self.env_steps = np.zeros((0, 2), np.int64)
        """(round step, env steps the student drove in it) per round"""

    def __len__(self) -> int:
        return len(self.round)

    @property
    def total_env_steps(self) -> int:
        return int(self.env_steps[:, 1].sum())

    @classmethod
    def load(cls, path: Path, before: int) -> TeacherLabels:
        labels = cls(path)
        if path.exists():
            with np.load(path, allow_pickle=False) as saved:
                keep = saved["round"] < before
                labels.round, labels.action = saved["round"][keep], saved["action"][keep]
                labels.obs = {k[len("obs.") :]: saved[k][keep] for k in saved.files if k.startswith("obs.")}
                labels.env_steps = saved["env_steps"][saved["env_steps"][:, 0] < before]
        return labels

    def collect(self, student: Policy, teacher: Policy, config: DistillConfig, step: int) -> float:
        """The student drives `config.dagger_episodes` episodes; every window it acts on is kept with the
        teacher's chunk for it. The student's success on them."""
        windows: list[dict[str, np.ndarray]] = []
        chunks: list[np.ndarray] = []

        def act(window: dict[str, Any]) -> np.ndarray:
            windows.append(
                {k: np.array(v, dtype=str if np.asarray(v).dtype == object else None) for k, v in window.items()}
            )
            chunks.append(np.asarray(teacher.act(window), dtype=np.float32))
            return student.act(window)

        seed = training_seed(config.seed, step)
        stats, steps = rollout(student, config.dagger_episodes, config.eval_envs, seed, config.execute, act)
        new = {k: np.concatenate([w[k] for w in windows]) for k in windows[0]}
        action = np.concatenate(chunks)
        self.obs = {k: np.concatenate([self.obs[k], v]) if self.obs else v for k, v in new.items()}
        self.action = np.concatenate([self.action, action]) if len(self) else action
        self.round = np.concatenate([self.round, np.full(len(action), step, np.int64)])
        self.env_steps = np.concatenate([self.env_steps, [[step, steps]]])
        arrays: dict[str, Any] = {
            "action": self.action,
            "round": self.round,
            "env_steps": self.env_steps,
            **{f"obs.{k}": v for k, v in self.obs.items()},
        }
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_atomically(self.path, buffer.getvalue())
        return stats.success_rate

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        i = rng.integers(0, len(self), size=batch_size)
        return {
            "obs": {k: v[i] for k, v in self.obs.items()},
            "action": self.action[i],
            "action_is_pad": np.zeros(self.action.shape[:2], dtype=bool)[i],
        }


def mixed_batch(
    sampler: SequenceSampler, labels: TeacherLabels, config: DistillConfig, rng: np.random.Generator
) -> dict[str, Any]:
    """A training batch: `dagger_fraction` of it teacher-labelled student windows once there are any."""
    if not len(labels):
        return sampler.sample(config.batch_size, rng)
    k = max(1, round(config.batch_size * config.dagger_fraction))
    data, own = sampler.sample(config.batch_size - k, rng), labels.sample(k, rng)
    return {
        "obs": {key: np.concatenate([data["obs"][key], own["obs"][key]]) for key in own["obs"]},
        "action": np.concatenate([data["action"], own["action"]]),
        "action_is_pad": np.concatenate([data["action_is_pad"], own["action_is_pad"]]),
    }


def gate(student: Policy, start: Policy, config: DistillConfig) -> tuple[Policy, dict[str, Any]]:
    """The distilled student if it beats (or ties) its start on `gate_episodes` fresh training-seed episodes,
    else the start; with both success rates."""
    seed = training_seed(config.seed, config.steps)  # after every DAgger round's
    ok, student_rate, start_rate = not_worse(
        student, start, config.gate_episodes, config.eval_envs, seed, config.execute
    )
    return (student if ok else start), {
        "start_success": start_rate,
        "student_success": student_rate,
        "kept": "student" if ok else "start",
    }


def evaluate(policy: Policy, config: DistillConfig) -> EpisodeStats:
    from robotrl.training.evaluate import evaluate_policy

    return evaluate_policy(policy, config.eval_episodes, config.eval_envs, execute=config.execute)


def distill(config: DistillConfig) -> Path:
    """Run (or continue) the distillation; the student checkpoint's directory."""
    return train(config).checkpoint


def train(config: DistillConfig) -> DistillResult:
    """`distill` with everything it recorded (also written to run_dir/result.json)."""

    # teacher and data
    teacher = load_teacher(config.teacher, config.device)
    store = EpisodeStore.open(config.store)
    store.check_spec(teacher.spec, that=f"teacher {config.teacher}")
    tc = teacher.config
    windows = SequenceConfig(
        tc.obs_horizon, tc.action_horizon, tuple(teacher.obs_keys), success_tail=config.success_tail
    )
    sampler = SequenceSampler.from_store(store, windows)

    run_dir, state_path, rng = start_run(config, f"distill-{teacher.name}", store.spec.task, holds=TRAIN_STATE)
    # student (the teacher's architecture and weights), optimizer, schedule, target network, EMA
    student = student_for(teacher, config.teacher_steps, channels=config.channels).to(config.device)
    start_policy = copy.deepcopy(student).eval() if config.gate_episodes else None
    gap = TeacherGap(student, teacher, sampler, config.gap_batch, config.seed)
    optimizer = torch.optim.AdamW(student.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr(s, config.steps, config.warmup))
    target = EMA(student, config.target_ema)
    ema = EMA(student, config.ema) if config.ema > 0 else None
    gap_init = gap(student)

    start = 0
    if config.resume:
        state = load_train_state(state_path)
        student.load_state_dict(state["policy"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        target.load(state, "target")
        if ema is not None:
            ema.load(state)
        set_rng_state(state["rng"], rng)
        start, gap_init = state["step"], state["gap_init"]

    def checkpoint(step: int) -> None:
        save_train_state(
            state_path,
            step=step,
            policy=student.state_dict(),
            optimizer=optimizer.state_dict(),
            schedule=schedule.state_dict(),
            **target.state("target"),
            **(ema.state() if ema else {}),
            rng=rng_state(rng),
            gap_init=gap_init,
        )
        (ema.model if ema else student).save(run_dir / "checkpoint")

    labels = TeacherLabels.load(run_dir / "dagger.npz", before=start)
    rounds = {config.steps * (r + 1) // (config.dagger_rounds + 1) for r in range(config.dagger_rounds)}
    log = RunLog(run_dir)
    if start == 0:
        log.log(0, **{"distill/teacher_gap": gap_init})
    end = min(config.steps, config.stop_after or config.steps)
    bar = tqdm(
        total=config.steps,
        initial=start,
        desc=f"distill {teacher.name}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    began = time.perf_counter()
    loss_value, gap_value = float("nan"), gap_init
    student.train()
    for step in range(start, end):
        if step in rounds:
            student_success = labels.collect(ema.model if ema else student, teacher, config, step)
            log.log(
                step,
                **{
                    "dagger/student_success": student_success,
                    "dagger/pairs": len(labels),
                    "dagger/env_steps": labels.total_env_steps,
                },
            )
        loss = student.compute_distill_loss(
            mixed_batch(sampler, labels, config, rng), teacher, target.model, config.solve_weight
        )
        loss_value, grad_norm = optimizer_step(
            loss, student, optimizer, schedule, f"distill step {step} (last checkpoint: {run_dir / 'checkpoint'})"
        )
        target.update(student)
        if ema is not None:
            ema.update(student)
        done = step + 1
        bar.update(1)
        if done % config.log_every == 0 or done == end:
            gap_value = gap(ema.model if ema else student)
            log.log(
                done,
                **{
                    "distill/loss": loss_value,
                    "distill/teacher_gap": gap_value,
                    "distill/grad_norm": grad_norm,
                    "distill/lr": schedule.get_last_lr()[0],
                },
            )
            bar.set_postfix(loss=f"{loss_value:.4f}", gap=f"{gap_value:.4f}")
        if done % config.checkpoint_every == 0 or done == end:
            checkpoint(done)
        if config.eval_every and config.eval_episodes and done % config.eval_every == 0 and done != config.steps:
            stats = evaluate(ema.model if ema else student, config)
            log.log(done, **{"eval/success_rate": stats.success_rate})
    bar.close()
    seconds = time.perf_counter() - began

    finished = end == config.steps
    final = (ema.model if ema else student).eval()
    success, ci, teacher_success, kept = None, None, None, None
    if not finished:
        path = run_dir / "checkpoint"
    else:
        if start_policy is not None:
            final, kept = gate(final, start_policy, config)
            log.log(
                config.steps,
                **{"gate/start_success": kept["start_success"], "gate/student_success": kept["student_success"]},
            )
        path = final.save(run_dir / "policy")
        if config.eval_episodes > 0:
            stats = evaluate(final, config)
            success, ci = stats.success_rate, stats.success_ci95()
            teacher_success = evaluate(teacher, config).success_rate
            log.log(config.steps, **{"eval/success_rate": success, "eval/teacher_success_rate": teacher_success})
    log.close()
    result = DistillResult(
        path,
        end,
        finished,
        seconds,
        loss_value,
        gap_value,
        gap_init,
        success,
        ci,
        teacher_success,
        run_dir,
        len(labels),
        labels.total_env_steps,
        kept,
    )
    (run_dir / "result.json").write_text(json.dumps(jsonable(result), indent=2))
    return result


def run_distill(config: DistillConfig) -> DistillResult:
    result = train(config)
    if not result.finished:
        print(
            f"distill: stopped after {result.steps}/{config.steps} steps; continue with --resume --run-dir "
            f"{result.run_dir}"
        )
        return result
    success = ""
    if result.success_rate is not None and result.success_ci95 is not None:
        lo, hi = result.success_ci95
        success = (
            f"student success {result.success_rate:.1%} (95% CI {lo:.1%}-{hi:.1%}), teacher "
            f"{result.teacher_success_rate:.1%}, over {config.eval_episodes} held-out episodes; "
        )
    gated = ""
    if result.gate is not None:
        gated = (
            f"gate: start {result.gate['start_success']:.1%}, distilled {result.gate['student_success']:.1%} "
            f"over {config.gate_episodes} training-seed episodes, kept the {result.gate['kept']}; "
        )
    print(
        f"distill: {success}{gated}teacher gap {result.teacher_gap_init:.4f} -> {result.teacher_gap:.4f}; "
        f"{result.steps} steps in {result.train_seconds:.0f} s; one-step policy {result.checkpoint}"
    )
    return result
