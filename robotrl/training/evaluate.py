"""Success rate of a policy in the parallel vector env, over held-out seeds, with a Wilson interval and videos.

    robotrl policy eval --policy runs/bc-flow/policy --eval-episodes 200
    robotrl policy eval --policy runs/online/policy --baseline runs/bc-flow/policy --eval-episodes 2000

With `--baseline` both policies meet the very same episodes (seeds, starts and sampling noise), and the result adds
the paired gain: the mean of the per-episode differences and its standard error, which is what a comparison of two
checkpoints near the top of the scale needs (two independent rates' errors would count each hard episode twice).

On tasks with language instructions (PickPlace) the result also has the success rate per instruction and the
wrong-object rate: episodes in which a cube other than the named one was put in the bin.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robotrl.core.spec import STRING, Spec, flatten_obs
from robotrl.policies.runtime import DEFAULT_EXECUTE

if TYPE_CHECKING:
    from robotrl.envs.cpu import CpuVectorEnv
    from robotrl.envs.rollouts import EpisodeStats
    from robotrl.policies.controller import ChunkController

#: evaluation seeds start here: demonstrations are recorded from seed 0 upwards, so these are held out
HELD_OUT_SEED = 1_000_000
#: episodes a run draws while it trains (DAgger rounds, acceptance gates) start here: above the demos' seeds,
#: below the held-out ones, so a gate's choice never sees the episodes that report it
ROLLOUT_SEED = 500_000


def training_seed(run_seed: int, offset: int) -> int:
    """First seed of a run's training-seed episodes: 10,000 of them per run seed from ROLLOUT_SEED, `offset` into
    them (distill: its DAgger rounds at their step, its gate at its step count; the pipeline's online stage: its
    best-checkpoint choice at 8,000, its gate at 9,000)."""
    return ROLLOUT_SEED + 10_000 * run_seed + offset


@dataclass
class EvalConfig:
    """Evaluate a policy checkpoint (or an exported policy) on its task in the CPU vector env."""

    policy: Path
    """checkpoint directory (`robotrl train bc` output) or an exported policy directory"""
    eval_episodes: int = 50
    """held-out episodes"""
    eval_envs: int = 10
    """parallel envs"""
    eval_seed: int = HELD_OUT_SEED
    """first seed of the episodes (the held-out ones by default)"""
    execute: int | None = None
    """actions executed from each predicted chunk before predicting again (None: an exported policy's own, the
    `execute` its export recorded, else 8)"""
    sampler_steps: int | None = None
    """override the sampler's step count (flow / DDIM) of `policy` at evaluation (a baseline runs as saved)"""
    videos: int = 0
    """also write this many single-env episode videos next to the checkpoint (eval_<i>.mp4)"""
    video_dir: Path | None = None
    baseline: Path | None = None
    """a second policy evaluated on the same episodes (each at its own `execute` unless one is given): the result
    adds its success and the paired gain of `policy` over it with its standard error"""
    threads: int = 1
    """the policy's inference threads (torch's, or the runtime's for an exported policy). An evaluation's batches
    are small: a second thread mostly spin-waits, and beside another job it stalls the evaluation
    (bench/eval_threads.py; bench/RESULTS.md, "An evaluation's inference threads")"""

    def __post_init__(self) -> None:
        for name in ("eval_episodes", "eval_envs", "execute", "threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"EvalConfig.{name}: expected >= 1, got {getattr(self, name)}")


def evaluate_actor(
    actor: Callable[[dict[str, Any]], np.ndarray], task: str, episodes: int, num_envs: int, **options: Any
) -> EpisodeStats:
    """Held-out success of an actor over the env's batched observations (a dict, images included) -> actions."""
    from robotrl.envs import make
    from robotrl.envs.rollouts import run_episodes

    env = make(task, num_envs=min(num_envs, episodes), seed=HELD_OUT_SEED, **options)
    try:
        return run_episodes(env, actor, episodes, seed=HELD_OUT_SEED)
    finally:
        env.close()


def evaluate_state_actor(
    actor: Callable[[np.ndarray], np.ndarray],
    task: str,
    obs_keys: Sequence[str],
    episodes: int,
    num_envs: int,
    **options: Any,
) -> EpisodeStats:
    """Held-out success of an actor-critic's actor: flattened state observations (N, D) -> actions (N, A)."""
    return evaluate_actor(lambda obs: actor(flatten_obs(obs, obs_keys)), task, episodes, num_envs, **options)


def spec_for(spec: Spec, keys: tuple[str, ...]) -> Spec:
    """`spec` restricted to the observations a policy reads (and the instruction): what an env must match."""
    obs = {k: v for k, v in spec.observations.items() if k in keys or v.dtype == STRING}
    return dataclasses.replace(spec, observations=obs)


def make_eval_env(spec: Spec, obs_keys: tuple[str, ...], num_envs: int, seed: int, **options: Any) -> CpuVectorEnv:
    """The vector env of the policy's task, configured as the data it learned from, checked against its spec."""
    from robotrl.envs import make

    images = [k for k in obs_keys if spec.observations[k].is_image]
    task_opts: dict[str, Any] = {
        "action_mode": spec.action_mode,
        "episode_steps": spec.episode_steps,
        **spec.metadata.get("task_options", {}),
    }
    render = bool(images) or bool(
        options.pop("render_images", False)
    )  # cameras the policy does not read: a reward model's
    env = make(spec.task, num_envs=num_envs, seed=seed, render_images=render, **task_opts, **options)
    spec_for(spec, obs_keys).check(spec_for(env.task_spec, obs_keys), this="policy", that=f"env {spec.task}")
    return env


def controller_for(policy: Any, execute: int, act: Any = None) -> ChunkController:
    """The chunk controller that runs `policy` (through `act` instead of `policy.act` where given: a wrapper that
    also records or relabels what the policy sees)."""
    from robotrl.policies.controller import ChunkController

    text = tuple(k for k, v in policy.spec.observations.items() if v.dtype == STRING)
    return ChunkController(
        act or policy.act,
        tuple(policy.obs_keys),
        policy.obs_horizon,
        min(execute, policy.action_horizon),
        text_keys=text,
    )


def evaluate_policy(
    policy: Any, episodes: int, num_envs: int = 10, seed: int = HELD_OUT_SEED, execute: int = 8
) -> EpisodeStats:
    """`EpisodeStats` of `policy` over `episodes` episodes from held-out seeds. The policy's sampling noise is
    seeded from `seed` as well, so an evaluation repeats exactly and two policies compared on the same seeds
    also start from the same noise stream (without it, the same policy's success moved from run to run;
    bench/RESULTS.md, "Imitation")."""
    return rollout(policy, episodes, num_envs, seed, execute)[0]


def rollout(
    policy: Any,
    episodes: int,
    num_envs: int,
    seed: int,
    execute: int,
    act: Callable[[dict[str, Any]], np.ndarray] | None = None,
) -> tuple[EpisodeStats, int]:
    """Evaluation's seeded episodes (`EpisodeStats`) and the env steps they took, every env of the last wave counted
    until its end: what a stage that drives the policy for data (distill's DAgger rounds) reports as its cost. `act`
    replaces the policy's call on each observation window (`controller_for`); a torch policy runs in eval mode."""
    from robotrl.envs.rollouts import run_episodes

    env = make_eval_env(policy.spec, tuple(policy.obs_keys), min(num_envs, episodes), seed)
    controller = controller_for(policy, execute, act)
    controller.reset(env.num_envs)
    steps = 0

    def drive(obs: dict[str, Any]) -> np.ndarray:
        nonlocal steps
        steps += env.num_envs
        return controller(obs)

    was_training = getattr(policy, "training", None)
    if was_training is not None:
        policy.eval()
    try:
        with seeded_sampling(policy, seed):
            stats = run_episodes(env, drive, episodes, seed=seed, on_episode_start=controller.reset_env)
    finally:
        env.close()
        if was_training is not None:
            policy.train(was_training)
    return stats, steps


def not_worse(new: Any, start: Any, episodes: int, num_envs: int, seed: int, execute: int) -> tuple[bool, float, float]:
    """An acceptance gate: whether `new` succeeds at least as often as `start` on the same seeded episodes (and
    sampling noise), with both success rates (new's, start's)."""
    new_rate, start_rate = (
        evaluate_policy(p, episodes, num_envs, seed=seed, execute=execute).success_rate for p in (new, start)
    )
    return new_rate >= start_rate, new_rate, start_rate


def paired_difference(after: Sequence[float], before: Sequence[float]) -> tuple[float, float]:
    """The mean of the per-episode differences `after - before` of two evaluations on the same episodes, and its
    standard error: what made an episode hard for both cancels (nan error for a single episode)."""
    d = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")


def success_gain(new_rate: float, start_rate: float, episodes: int, z: float) -> tuple[float, float]:
    """The gain in success of `new` over `start`, each a success rate over `episodes` episodes, and its lower bound:
    the Agresti-Caffo difference (one success and one failure added to each side) minus `z` of its standard errors.
    A gate on the bound keeps a change only when the gain is outside the evaluation's noise: near the top of the
    scale a 10-episode gate cannot tell a 1-point loss from a 10-point gain (10/10 against 9/10: bound < 0 at
    z = 1); z = 0 keeps any gain."""
    n = episodes + 2
    p_new, p_start = ((rate * episodes + 1) / n for rate in (new_rate, start_rate))
    gain = p_new - p_start
    se = math.sqrt((p_new * (1 - p_new) + p_start * (1 - p_start)) / n)
    return gain, gain - z * se


@contextmanager
def seeded_sampling(policy: Any, seed: int) -> Iterator[None]:
    """A runtime policy's numpy noise generator reset to `seed`; for a torch policy, torch's generator seeded
    inside a fork that is restored afterwards (a training loop's random stream is left as it was)."""
    if isinstance(getattr(policy, "rng", None), np.random.Generator):
        policy.rng = np.random.default_rng(seed)
        yield
        return
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def record_videos(policy: Any, out_dir: Path, count: int, seed: int, execute: int) -> list[Path]:
    from robotrl.envs.video import write_mp4

    paths = []
    for i in range(count):
        env = make_eval_env(policy.spec, tuple(policy.obs_keys), 1, seed + i, autoreset=False)
        controller = controller_for(policy, execute)
        controller.reset(1)
        cam = env.task.cameras[0] if env.task.cameras else None
        obs, _ = env.reset(seed=seed + i)
        frames = [env.render_env(0, cam, (240, 320))]
        for _ in range(policy.spec.episode_steps):
            obs, _, terminated, truncated, _ = env.step(controller(obs))
            frames.append(env.render_env(0, cam, (240, 320)))
            if terminated[0] or truncated[0]:
                break
        env.close()
        paths.append(write_mp4(out_dir / f"eval_{i}.mp4", frames, fps=policy.spec.control_hz))
    return paths


def load_any(path: Path, threads: int | None = None) -> Any:
    """A training checkpoint (torch) or an exported policy (runtime, on `threads` inference threads), by what the
    directory holds."""
    from robotrl.policies.base import read_manifest

    manifest = read_manifest(path) if (path / "manifest.json").exists() else {}
    if "export" in manifest:
        from robotrl.policies.runtime import load as load_runtime

        return load_runtime(path, threads=threads)
    from robotrl.policies import load

    return load(path)


def load_for_eval(config: EvalConfig, path: Path, sampler_steps: int | None = None) -> tuple[Any, int]:
    """The policy at `path` on the evaluation's threads, its sampler's step count set where given, and the actions
    it executes per chunk (the config's, else an export's recorded `execute`, else 8)."""
    policy = load_any(path, threads=config.threads)
    if sampler_steps is not None:
        if not hasattr(getattr(policy, "config", None), "steps"):
            raise ValueError(
                f"EvalConfig.sampler_steps: {path} has no sampler step count to override "
                "(an exported policy fixes it at export: robotrl policy export --sampler-steps)"
            )
        policy.config.steps = sampler_steps
    return policy, config.execute or int(getattr(policy, "execute", DEFAULT_EXECUTE))  # a torch checkpoint: none


def summary(path: Path, stats: EpisodeStats, execute: int) -> dict[str, Any]:
    """One evaluation as `robotrl policy eval` prints it."""
    result: dict[str, Any] = {
        "policy": str(path),
        "episodes": len(stats.success),
        # null where the env reports no success (an outside env judged by its return)
        "success_rate": stats.success_rate if stats.reports_success else None,
        "ci95": list(stats.success_ci95()) if stats.reports_success else None,
        "mean_return": stats.mean_return,
        "execute": execute,
    }
    if stats.wrong_object is not None:
        result["wrong_object_rate"] = float(np.mean(stats.wrong_object))
    if stats.instruction is not None:
        result["by_instruction"] = stats.by_instruction()
    return result


def run_eval(config: EvalConfig) -> dict[str, Any]:
    from robotrl.policies.timing import torch_threads

    with torch_threads(config.threads):
        policy, execute = load_for_eval(config, config.policy, config.sampler_steps)
        baseline = None if config.baseline is None else (config.baseline, *load_for_eval(config, config.baseline))
        if baseline is not None and baseline[1].spec.task != policy.spec.task:
            raise ValueError(
                f"EvalConfig.baseline: expected a policy of {policy.spec.task}, got one of {baseline[1].spec.task} "
                f"({config.baseline})"
            )
        stats = evaluate_policy(policy, config.eval_episodes, config.eval_envs, config.eval_seed, execute)
        result = {**summary(config.policy, stats, execute), "task": policy.spec.task, "seed": config.eval_seed}
        if baseline is not None:
            base_path, base_policy, base_execute = baseline
            base = evaluate_policy(base_policy, config.eval_episodes, config.eval_envs, config.eval_seed, base_execute)
            score = "success" if stats.reports_success else "returns"  # an outside env without success: its return
            gain, se = paired_difference(getattr(stats, score), getattr(base, score))
            result["baseline"] = summary(base_path, base, base_execute)
            result["paired_gain"] = {"of": stats.by, "gain": gain, "se": se}
        if config.videos:
            result["videos"] = [
                str(p)
                for p in record_videos(
                    policy, config.video_dir or config.policy, config.videos, config.eval_seed, execute
                )
            ]
        print(json.dumps(result))
        return result
