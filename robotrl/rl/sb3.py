"""Stable-Baselines3 on a robotrl task: train SAC, PPO or TD3, then measure the success rate on the CPU backend.

This is the smallest end-to-end check that the task suite is learnable with an off-the-shelf library and no
changes to it: SB3 sees the registered gymnasium env (`robotrl/<Task>-v0`) with the chosen observation keys
flattened into one vector; evaluation runs the trained policy in the batched CPU env over seeded episodes.

    from robotrl.rl.sb3 import Sb3SacConfig, train
    result = train(Sb3SacConfig(task="Reach"))        # the same dataclass is `robotrl train sb3-sac --task Reach`
    print(result.success_rate)
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from robotrl.core.files import default_run_dir
from robotrl.envs.rollouts import EpisodeStats
from robotrl.envs.tasks import DEFAULT_TASK

ALGOS = ("sac", "ppo", "td3")
OFF_POLICY = ("sac", "td3")


@dataclass
class Sb3Config:
    """Train an SB3 agent on a robotrl task and report its success rate over seeded evaluation episodes. The
    fields are named as robotrl's own runs name them (SB3's: total_timesteps, n_envs, learning_rate, net_arch)."""

    task: str = DEFAULT_TASK
    """task name (see `robotrl envs list`), or an outside env: gym:<id> or <module>:<callable>"""
    algo: Literal["sac", "ppo", "td3"] = "sac"
    """SAC (sample-efficient, the default), PPO or TD3"""
    action_mode: str | None = None
    """the task's action mode (default: its own; 'native' for an outside env)"""
    reward_type: Literal["dense", "sparse"] = "dense"
    total_steps: int = 12_000
    """environment steps of training (all envs together)"""
    num_envs: int = 1
    """parallel training envs (SAC: 1 is enough; PPO wants 8 or more)"""
    obs_keys: tuple[str, ...] = ("state",)
    """observation keys given to the policy, flattened in this order (images and text are not supported)"""
    hidden: tuple[int, ...] = (256, 256)
    """hidden widths of the policy and value networks"""
    lr: float = 1e-3
    batch_size: int = 256
    gamma: float = 0.95
    """short horizon: Reach episodes are 60 steps and the reward is dense"""
    learning_starts: int = 1_000
    """SAC: random-action steps before the first update"""
    eval_episodes: int = 100
    """held-out episodes of the final evaluation"""
    eval_envs: int = 20
    """parallel envs of the evaluation"""
    eval_every: int = 0
    """evaluate every N env steps as well (0: only at the end): `eval/*` rows in metrics.jsonl with the training
    seconds so far, evaluation time excluded (a return or success curve against env steps and seconds)"""
    seed: int = 0
    run_dir: Path | None = None
    """where the model, TensorBoard events and metrics.jsonl go (default: runs/sb3-<algo>-<task>-<time>)"""
    checkpoint_every: int = 5_000
    """save a checkpoint (model + SAC replay buffer) every this many steps; 0 disables"""
    resume: bool = False
    """continue the run in run_dir from its last checkpoint (checkpoints/model_<steps>_steps.zip, with its replay
    buffer) up to total_steps"""
    progress: bool = True
    """show a progress bar"""
    threads: int = 1
    """torch CPU threads; 1 is fastest for these small networks on a shared machine"""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.algo not in ALGOS:
            raise ValueError(f"{name}.algo: expected one of {ALGOS}, got {self.algo!r}")
        for field in ("total_steps", "num_envs", "eval_episodes", "eval_envs", "batch_size", "threads"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{name}.{field}: expected a positive integer, got {getattr(self, field)}")
        for field in ("checkpoint_every", "eval_every"):
            if getattr(self, field) < 0:
                raise ValueError(f"{name}.{field}: expected >= 0 (0: off), got {getattr(self, field)}")
        if not self.obs_keys:
            raise ValueError(f"{name}.obs_keys: expected at least one observation key, got ()")
        if self.resume and self.run_dir is None:
            raise ValueError(f"{name}.resume: needs run_dir (the run to continue)")


@dataclass(frozen=True)
class Sb3Result:
    success_rate: float | None
    """None where the env reports no success (judge it by `mean_return`)"""
    success_ci95: tuple[float, float] | None
    mean_return: float
    episodes: int
    timesteps: int
    train_seconds: float
    run_dir: Path
    model_path: Path

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))


@dataclass
class Sb3SacConfig(Sb3Config):
    """Stable-Baselines3's SAC on a robotrl task: the baseline of our SAC / RLPD."""

    algo: Literal["sac", "ppo", "td3"] = "sac"


@dataclass
class Sb3PpoConfig(Sb3Config):
    """Stable-Baselines3's PPO on a robotrl task."""

    algo: Literal["sac", "ppo", "td3"] = "ppo"
    num_envs: int = 8


@dataclass
class Sb3Td3Config(Sb3Config):
    """Stable-Baselines3's TD3 on a robotrl task."""

    algo: Literal["sac", "ppo", "td3"] = "td3"


def make_sb3_env(config: Sb3Config, seed: int | None = None) -> gym.Env:
    """The single env, restricted to `obs_keys` and flattened to a Box (what SB3's MlpPolicy takes): a robotrl
    task's registered id, or the outside env itself (its Box observation is the key 'state')."""
    from robotrl.envs import is_outside

    if is_outside(config.task):
        from robotrl.envs.adapter import STATE_KEY, outside_options
        from robotrl.envs.outside import parse

        outside_options(config.task, action_mode=config.action_mode, reward_type=config.reward_type)
        env = parse(config.task).factory()()
        if not isinstance(env.observation_space, gym.spaces.Dict):
            if tuple(config.obs_keys) != (STATE_KEY,):
                raise ValueError(f"obs_keys: {config.task} has keys ['{STATE_KEY}']; got {list(config.obs_keys)}")
            env.reset(seed=seed)
            return env
    else:
        import robotrl.envs  # noqa: F401  (registers the ids)
        from robotrl.envs.registration import env_id

        env = gym.make(
            env_id(config.task), action_mode=config.action_mode, reward_type=config.reward_type, render_images=False
        )
    space = env.observation_space
    assert isinstance(space, gym.spaces.Dict)
    missing = [k for k in config.obs_keys if k not in space.spaces]
    bad = [k for k in config.obs_keys if k in space.spaces and not isinstance(space[k], gym.spaces.Box)]
    if missing or bad:
        raise ValueError(
            f"obs_keys: {config.task} has keys {list(space.spaces)}; got {list(config.obs_keys)} "
            f"({'missing ' + str(missing) if missing else 'not numeric: ' + str(bad)})"
        )
    env = gym.wrappers.FilterObservation(env, list(config.obs_keys))
    env = gym.wrappers.FlattenObservation(env)
    env.reset(seed=seed)
    return env


def flatten_batch(obs: dict[str, Any], keys: tuple[str, ...]) -> np.ndarray:
    """Batched vector-env observations in the layout `make_sb3_env` gives SB3 (keys in the filtered order)."""
    n = len(np.asarray(obs[keys[0]]))
    return np.concatenate([np.asarray(obs[k], dtype=np.float32).reshape(n, -1) for k in keys], axis=1)


def evaluate(model: Any, config: Sb3Config, keys: tuple[str, ...]) -> EpisodeStats:
    """Success of the deterministic policy over `eval_episodes` held-out seeded episodes of the batched CPU env:
    the seeds and env every robotrl learner is evaluated on."""
    from robotrl.training.evaluate import evaluate_actor

    return evaluate_actor(
        lambda obs: model.predict(flatten_batch(obs, keys), deterministic=True)[0],
        config.task,
        config.eval_episodes,
        config.eval_envs,
        action_mode=config.action_mode,
        reward_type=config.reward_type,
        render_images=False,
    )


def eval_callback(config: Sb3Config, keys: tuple[str, ...], began: float) -> Any:
    """Every `eval_every` env steps but the last: the held-out evaluation, logged with the training seconds since
    `began` (evaluations excluded; the callback's `eval_seconds` is their sum)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EvalEvery(BaseCallback):
        eval_seconds = 0.0

        def _on_step(self) -> bool:
            now, n = self.num_timesteps, self.training_env.num_envs
            crossed = config.eval_every and now // config.eval_every != (now - n) // config.eval_every
            if crossed and now < config.total_steps:  # not on the last step: the final evaluation follows
                t0 = time.perf_counter()
                stats = evaluate(self.model, config, keys)
                for key, value in {
                    "step": now,
                    **stats.metrics(),
                    "time/train_seconds": t0 - began - self.eval_seconds,
                }.items():
                    self.logger.record(key, value)
                self.logger.dump(now)
                self.eval_seconds += time.perf_counter() - t0
            return True

    return EvalEvery()


def train(config: Sb3Config) -> Sb3Result:
    """Train, save `model.zip`, evaluate, write `result.json`; metrics go to TensorBoard and `metrics.jsonl`."""
    import torch
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from stable_baselines3.common.logger import JSONOutputFormat, Logger, TensorBoardOutputFormat
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    torch.set_num_threads(config.threads)
    run_dir = Path(config.run_dir or default_run_dir("sb3", config.algo, config.task))
    run_dir.mkdir(parents=True, exist_ok=True)
    last = last_checkpoint(run_dir) if config.resume else None
    if not config.resume:
        (run_dir / "config.json").write_text(json.dumps(_jsonable(dataclasses.asdict(config)), indent=2))

    from robotrl.envs import is_outside

    venv = VecMonitor(
        DummyVecEnv([partial(make_sb3_env, config, config.seed + i) for i in range(config.num_envs)]),
        info_keywords=() if is_outside(config.task) else ("success",),
    )
    space = venv.envs[0].env.observation_space  # FlattenObservation(FilterObservation): its key order
    keys = tuple(space.spaces) if isinstance(space, gym.spaces.Dict) else tuple(config.obs_keys)
    algo_cls: Any = {"sac": SAC, "ppo": PPO, "td3": TD3}[config.algo]
    if last is not None:
        model = algo_cls.load(last, env=venv, device="cpu")
        if config.algo in OFF_POLICY and replay_buffer_path(last).exists():
            model.load_replay_buffer(replay_buffer_path(last))
    else:
        model = algo_cls("MlpPolicy", venv, seed=config.seed, device="cpu", verbose=0, **_algo_kwargs(config))
    model.set_logger(
        Logger(
            str(run_dir),
            [JSONOutputFormat(str(run_dir / "metrics.jsonl")), TensorBoardOutputFormat(str(run_dir / "tb"))],
        )
    )

    remaining = max(config.total_steps - model.num_timesteps, 0)
    callbacks: list[Any] = [progress_bar(remaining, config.progress)]
    if config.checkpoint_every > 0:
        callbacks.append(
            CheckpointCallback(
                max(config.checkpoint_every // config.num_envs, 1),
                str(run_dir / "checkpoints"),
                name_prefix="model",
                save_replay_buffer=config.algo in OFF_POLICY,
            )
        )
    start = time.perf_counter()
    evals = eval_callback(config, keys, start)
    model.learn(
        remaining,
        callback=CallbackList([*callbacks, evals]),
        reset_num_timesteps=last is None,
        log_interval=10 if config.algo in OFF_POLICY else 1,
    )
    seconds = time.perf_counter() - start - evals.eval_seconds
    model_path = run_dir / "model.zip"
    model.save(model_path)
    venv.close()

    stats = evaluate(model, config, keys)
    result = Sb3Result(
        stats.success_rate if stats.reports_success else None,
        stats.success_ci95() if stats.reports_success else None,
        float(np.mean(stats.returns)),
        len(stats.success),
        int(model.num_timesteps),
        seconds,
        run_dir,
        model_path,
    )
    for key, value in (
        ("step", model.num_timesteps),
        ("eval/success_rate", result.success_rate),
        ("eval/mean_return", result.mean_return),
        ("time/train_seconds", seconds),
    ):
        if value is not None:
            model.logger.record(key, value)
    model.logger.dump(model.num_timesteps)
    model.logger.close()
    (run_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2))
    return result


def _algo_kwargs(config: Sb3Config) -> dict[str, Any]:
    common = {
        "learning_rate": config.lr,
        "batch_size": config.batch_size,
        "gamma": config.gamma,
        "policy_kwargs": {"net_arch": list(config.hidden)},
    }
    if config.algo in OFF_POLICY:
        return {**common, "learning_starts": config.learning_starts, "buffer_size": max(config.total_steps, 1)}
    return {**common, "n_steps": max(2048 // config.num_envs, 8)}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def progress_bar(total: int, enabled: bool = True) -> Any:
    """A tqdm bar over training steps as an SB3 callback (SB3's own bar needs `rich`, not a robotrl dependency)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from tqdm import tqdm

    class ProgressBar(BaseCallback):
        def _on_training_start(self) -> None:
            self.bar = tqdm(total=total, desc="train", unit="step", disable=not enabled, dynamic_ncols=True)

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return ProgressBar()


def last_checkpoint(run_dir: Path) -> Path:
    """The checkpoint with the most steps in run_dir/checkpoints (what `resume` continues from)."""
    found = {
        int(m[1]): p
        for p in (run_dir / "checkpoints").glob("model_*_steps.zip")
        if (m := re.fullmatch(r"model_(\d+)_steps\.zip", p.name))
    }
    if not found:
        raise FileNotFoundError(
            f"Sb3Config.resume: no checkpoint in {run_dir / 'checkpoints'} "
            "(model_<steps>_steps.zip; was checkpoint_every 0?)"
        )
    return found[max(found)]


def replay_buffer_path(checkpoint: Path) -> Path:
    """Where SB3's CheckpointCallback put the replay buffer saved with `checkpoint` (`<prefix>_<n>_steps.zip`)."""
    match = re.fullmatch(r"(.*)_(\d+)_steps\.zip", checkpoint.name)
    if match is None:
        raise ValueError(f"resume: expected a checkpoint named <prefix>_<steps>_steps.zip, got {checkpoint.name!r}")
    return checkpoint.with_name(f"{match[1]}_replay_buffer_{match[2]}_steps.pkl")
