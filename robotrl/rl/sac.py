"""Soft actor-critic with the RLPD recipe (Ball et al. 2023): sample-efficient off-policy RL for manipulation.

    robotrl train sac --task Reach --total-steps 20000
    robotrl train sac --task PushT --demos data/pusht.zarr --critics 10 --utd 10     # RLPD
    result = robotrl.rl.sac.train(SacConfig(task="Reach"))                               # the same dataclass

RLPD on top of SAC: symmetric sampling (half of every batch from demonstrations, half from online data, when
`demos` is given), an ensemble of LayerNorm critics whose TD target is the minimum over a random subset of them
(REDQ), and a high update-to-data ratio (`utd` gradient updates per collected transition). `critic_loss=hl_gauss`
swaps the MSE regression for a classification critic (HL-Gauss). Image observations (`--obs-keys state
image_top`) go through the policy library's image encoder, trained by the critic's loss only and fed to the actor
detached, with DrQ's per-sample random shifts on every batch (as SERL trains from pixels).

Reads top to bottom: envs, buffers, networks -> (resume) -> the loop: act (uniform at random before
`learning_starts`), step the vector env, add to replay (on disk as episodes, `robotrl.rl.replay`), update critics,
actor and temperature, log, evaluate, checkpoint. A killed run resumes exactly (`--resume`): networks, optimizers,
RNGs, the envs mid-episode and the replay rebuilt from its store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from robotrl.core.spec import Spec, flatten_obs
from robotrl.datasets import EpisodeStore
from robotrl.envs import make
from robotrl.envs.rollouts import EpisodeStats
from robotrl.policies.gaussian import (
    CriticEnsemble,
    GaussianConfig,
    GaussianPolicy,
    HLGauss,
    TanhGaussianActor,
    actor_policy,
)
from robotrl.policies.nets import ImageEncoder, random_shift
from robotrl.rl.replay import DemoTransitions, ReplayBuffer, split_obs_keys
from robotrl.training.evaluate import evaluate_actor
from robotrl.training.loop import (
    TRAIN_STATE,
    PolicyRunOptions,
    RLResult,
    RunLog,
    TaskOptions,
    TrainClock,
    finish_run,
    gradient_step,
    load_run_state,
    load_train_state,
    polyak,
    postfix,
    recent_episodes,
    save_run_state,
    start_run,
)


@dataclass
class SacConfig(PolicyRunOptions, TaskOptions):
    """Train a tanh-Gaussian actor and a critic ensemble online on a task's vector env (SAC / RLPD)."""

    # a constant learning rate: more env steps continue the run as it was
    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = (*PolicyRunOptions.RESUME_MAY_CHANGE, "total_steps")

    num_envs: int = 1
    total_steps: int = 20_000
    """environment steps (transitions, all envs together)"""
    demos: Path | None = None
    """RLPD: a store of demonstrations of the same task and reward (e.g. `robotrl data record`), sampled as
    `demo_ratio` of every batch"""
    demo_ratio: float = 0.5
    init: Path | None = None
    """WSRL: start from an offline-pretrained run (`robotrl train iql` or `sac` run directory: its actor and
    critics); the warm-up transitions then come from that actor, not from random actions, and without `demos`
    the offline data is not kept"""
    learning_starts: int = 1_000
    """transitions collected before the first update: uniform random actions (or the `init` actor: WSRL's
    warm-up)"""
    utd: int = 1
    """gradient updates per collected transition (RLPD: 10-20)"""
    batch_size: int = 256
    critics: int = 2
    """critic ensemble size (RLPD: 10)"""
    critic_subset: int = 2
    """critics whose minimum is the TD target, drawn at random each update (REDQ)"""
    critic_loss: Literal["mse", "hl_gauss"] = "mse"
    hl_bins: int = 101
    v_min: float = -10.0
    """HL-Gauss value range (returns are clamped into it)"""
    v_max: float = 60.0
    hidden: tuple[int, ...] = (256, 256)
    gamma: float = 0.95
    tau: float = 0.005
    lr: float = 3e-4
    init_temperature: float = 0.1
    target_entropy: float | None = None
    """default: -action_dim / 2 (RLPD)"""
    episode_steps: int | None = None
    """override the task's episode length"""
    image_size: int | None = None
    """camera image size in pixels when `obs_keys` has image keys (default: the task's)"""
    encoder_widths: tuple[int, ...] = (32, 64, 128)
    """the image encoder's ResNet stage widths (policy library's `ImageEncoder`)"""
    encoder_dim: int = 64
    """features per camera"""
    augment_pad: int = 4
    """DrQ random shift of up to this many pixels, per sample (0: none)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_envs", "total_steps", "utd", "batch_size", "critics", "critic_subset"):
            if getattr(self, name) < 1:
                raise ValueError(f"SacConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.critic_subset > self.critics:
            raise ValueError(f"SacConfig.critic_subset: expected <= critics ({self.critics}), got {self.critic_subset}")
        if not 0.0 < self.demo_ratio < 1.0:
            raise ValueError(f"SacConfig.demo_ratio: expected a fraction in (0, 1), got {self.demo_ratio}")
        if not (0.0 < self.gamma < 1.0 and 0.0 < self.tau <= 1.0):
            raise ValueError(
                f"SacConfig.gamma / tau: expected gamma in (0, 1) and tau in (0, 1], got {self.gamma}, {self.tau}"
            )


class Agent(torch.nn.Module):
    """Actor, critic ensemble, its target copy, the entropy temperature and, with cameras, one image encoder per
    camera: everything the update changes. The actor and critics see [numeric observations, image features]."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        low: torch.Tensor,
        high: torch.Tensor,
        config: SacConfig,
        image_sizes: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        self.hl = HLGauss(config.v_min, config.v_max, config.hl_bins) if config.critic_loss == "hl_gauss" else None
        outputs = config.hl_bins if self.hl is not None else 1
        self.encoder = torch.nn.ModuleDict(
            {
                k: ImageEncoder(size, config.encoder_dim, config.encoder_widths, crop=1.0)
                for k, size in (image_sizes or {}).items()
            }
        )
        self.augment_pad = config.augment_pad
        feature_dim = obs_dim + config.encoder_dim * len(self.encoder)
        self.actor = TanhGaussianActor(feature_dim, action_dim, config.hidden, low, high)
        self.critic = CriticEnsemble(feature_dim, action_dim, config.critics, config.hidden, outputs)
        self.target = CriticEnsemble(feature_dim, action_dim, config.critics, config.hidden, outputs)
        self.target.load_state_dict(self.critic.state_dict())
        self.target.requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(math.log(config.init_temperature)))

    def q(self, net: CriticEnsemble, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(E, B) Q-values of every member."""
        out = net(obs, action)
        return self.hl.value(out) if self.hl is not None else out.squeeze(-1)

    def features(self, obs: torch.Tensor, images: dict[str, torch.Tensor] | None, augment: bool) -> torch.Tensor:
        """Numeric observations (B, D) and uint8 frames (B, H, W, 3) per camera -> what the actor and critics
        read; without cameras, `obs` itself."""
        if not len(self.encoder):
            return obs
        parts = [obs]
        for key, encoder in self.encoder.items():
            x = images[key].float() / 255.0  # type: ignore[index]
            parts.append(encoder(random_shift(x, self.augment_pad) if augment else x))
        return torch.cat(parts, dim=-1)

    def optimizers(self, lr: float) -> dict[str, torch.optim.Optimizer]:
        """Adam for the actor, the critics (with the image encoders: DrQ trains them by the critic's loss alone)
        and the temperature."""
        return {
            "actor": torch.optim.Adam(self.actor.parameters(), lr=lr),
            "critic": torch.optim.Adam([*self.critic.parameters(), *self.encoder.parameters()], lr=lr),
            "alpha": torch.optim.Adam([self.log_alpha], lr=lr),
        }

    @torch.no_grad()
    def act(self, obs: dict[str, Any], vector_keys: tuple[str, ...], deterministic: bool = False) -> np.ndarray:
        """Actions (N, A) for a batch of env observations (numpy in and out): rollouts and evaluation."""
        vec = torch.from_numpy(flatten_obs(obs, vector_keys, len(next(iter(obs.values())))))
        images = {k: torch.from_numpy(np.asarray(obs[k])) for k in self.encoder}
        return self.actor(self.features(vec, images, augment=False), deterministic=deterministic)[0].numpy()


def update(
    agent: Agent,
    opt: Mapping[str, torch.optim.Optimizer],
    batch: dict[str, Any],
    config: SacConfig,
    target_entropy: float,
    where: str,
) -> dict[str, float]:
    """One RLPD update: critics on the TD target (min over a random subset of target critics, entropy bonus),
    then the actor on the ensemble's mean Q, then the temperature; target critics by Polyak averaging."""
    alpha = agent.log_alpha.exp().detach()
    obs = agent.features(batch["obs"], batch.get("images"), augment=True)  # the critic's loss trains the encoders
    with torch.no_grad():
        next_obs = agent.features(batch["next_obs"], batch.get("next_images"), augment=True)
        next_action, next_logp = agent.actor(next_obs)
        subset = torch.randperm(config.critics)[: config.critic_subset]
        next_q = agent.q(agent.target, next_obs, next_action)[subset].min(0).values
        target = batch["reward"] + config.gamma * (1 - batch["done"]) * (next_q - alpha * next_logp)
    out = agent.critic(obs, batch["action"])
    if agent.hl is not None:
        critic_loss = agent.hl.loss(out, target.expand(config.critics, -1)).mean(1).sum()
    else:
        critic_loss = F.mse_loss(out.squeeze(-1), target.expand(config.critics, -1), reduction="none").mean(1).sum()
    gradient_step(opt["critic"], critic_loss, f"{where}: critic")

    stats = actor_step(agent, opt, obs.detach(), alpha, target_entropy, where)
    polyak(agent.critic, agent.target, config.tau)
    return {"loss/critic": critic_loss.item(), "alpha": alpha.item(), **stats}


def actor_step(
    agent: Agent,
    opt: Mapping[str, torch.optim.Optimizer],
    obs: torch.Tensor,
    alpha: torch.Tensor,
    target_entropy: float,
    where: str,
) -> dict[str, float]:
    """SAC's actor update (the critics' mean Q less the entropy cost, reparameterized) and its temperature update
    (towards the target entropy)."""
    action, logp = agent.actor(obs)
    q = agent.q(agent.critic, obs, action).mean(0)
    actor_loss = (alpha * logp - q).mean()
    gradient_step(opt["actor"], actor_loss, f"{where}: actor")
    alpha_loss = -(agent.log_alpha * (logp.detach() + target_entropy)).mean()
    gradient_step(opt["alpha"], alpha_loss, f"{where}: temperature")
    return {"loss/actor": actor_loss.item(), "q/mean": q.mean().item(), "entropy": -logp.mean().item()}


def evaluate(agent: Agent, config: SacConfig) -> EpisodeStats:
    """Success of the deterministic actor (the squashed mean) over held-out seeded episodes."""
    vector_keys = tuple(k for k in config.obs_keys if k not in agent.encoder)
    return evaluate_actor(
        lambda obs: agent.act(obs, vector_keys, deterministic=True),
        config.task,
        config.eval_episodes,
        config.eval_envs,
        **env_options(config),
    )


def task_options(config: SacConfig) -> dict[str, Any]:
    """The task's options: the action mode, the episode length, and the cameras when an image key is read."""
    options: dict[str, Any] = {"action_mode": config.action_mode}
    if config.episode_steps is not None:
        options["episode_steps"] = config.episode_steps
    if any(k.startswith("image_") for k in config.obs_keys):
        from robotrl.envs import make_task

        if "images" in {f.name for f in fields(make_task(config.task).config)}:
            options["images"] = True  # tasks whose cameras are optional (PushT)
        if config.image_size is not None:
            options["image_size"] = config.image_size
    return options


def env_options(config: SacConfig) -> dict[str, Any]:
    """The vector env's options: the task's, the reward, and rendering only when an image key is read."""
    images = any(k.startswith("image_") for k in config.obs_keys)
    return {**task_options(config), "reward_type": config.reward_type, "render_images": images}


def build_agent(spec: Spec, config: SacConfig, where: str) -> tuple[Agent, tuple[str, ...]]:
    """The agent a task's spec calls for, after checking the observation keys: (agent, numeric keys)."""
    vector_keys, image_keys = split_obs_keys(spec, config.obs_keys, f"{where}.obs_keys")
    obs_dim = sum(int(np.prod(spec.observations[k].shape)) for k in vector_keys)
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in (spec.action.low_array(), spec.action.high_array()))
    sizes = {k: int(spec.observations[k].shape[0]) for k in image_keys}
    return Agent(obs_dim, int(np.prod(spec.action.shape)), low, high, config, sizes), vector_keys


def actor_policy_of(agent: Agent, spec: Spec, config: SacConfig) -> GaussianPolicy:
    """The agent's actor (with its cameras' encoders) as the registered `gaussian` policy: the run's `policy/`,
    which `policy eval`, `policy export`, the runtime and the deploy node load."""
    gaussian = GaussianConfig(
        obs_keys=tuple(config.obs_keys),
        hidden=tuple(config.hidden),
        encoder_dim=config.encoder_dim,
        encoder_widths=tuple(config.encoder_widths),
    )
    return actor_policy(spec, gaussian, {"actor": agent.actor, "encoder": agent.encoder})


def actor_fn(actor: TanhGaussianActor) -> Any:
    """The deterministic action of a tanh-Gaussian actor for a batch of flattened observations (numpy in and out)."""

    @torch.no_grad()
    def act(obs: np.ndarray) -> np.ndarray:
        return actor(torch.from_numpy(obs), deterministic=True)[0].numpy()

    return act


def train(config: SacConfig) -> RLResult:
    run_dir, state_path, rng = start_run(config, "sac", config.task, holds="replay.zarr")

    # envs and buffers
    env = make(config.task, num_envs=config.num_envs, seed=config.seed, **env_options(config))
    spec, n = env.task_spec, config.num_envs
    reports_success = getattr(env, "reports_success", True)
    capacity = math.ceil(config.total_steps / n) + 1
    action_dim = int(np.prod(spec.action.shape))
    target_entropy = config.target_entropy if config.target_entropy is not None else -action_dim / 2

    # networks
    agent, vector_keys = build_agent(spec, config, "SacConfig")
    demos = DemoTransitions(config.demos, spec, config.obs_keys) if config.demos is not None else None
    if config.init is not None and not config.resume:
        load_pretrained(agent, Path(config.init))
    opt = agent.optimizers(config.lr)

    # start or resume
    if config.resume:
        state = load_run_state(state_path, agent, opt, rng, env)
        obs = {k: v.numpy() for k, v in state["obs"].items()}
        store = EpisodeStore.open(run_dir / "replay.zarr", mode="a")
        replay = ReplayBuffer.restore(spec, config.obs_keys, n, capacity, store, state["replay"])
        start, episodes = int(state["step"]), state["episodes"]
        ret, succ = (
            state["running"]["ret"].numpy().copy(),
            state["running"]["succ"].numpy().copy(),
        )  # episodes in progress
    else:
        obs, _ = env.reset(seed=config.seed)
        store = EpisodeStore.create(run_dir / "replay.zarr", spec)
        replay = ReplayBuffer(spec, config.obs_keys, n, capacity, store)
        start, episodes = 0, {"returns": [], "success": []}
        ret, succ = np.zeros(n), np.zeros(n, bool)

    def checkpoint(step: int) -> None:
        save_run_state(
            state_path,
            step,
            agent,
            opt,
            rng,
            env,
            replay=replay.state(),
            episodes=episodes,
            obs={k: torch.from_numpy(np.asarray(v)) for k, v in obs.items()},
            running={"ret": torch.from_numpy(ret.copy()), "succ": torch.from_numpy(succ.copy())},
        )
        actor_policy_of(agent, spec, config).save(run_dir / "policy")

    log = RunLog(run_dir)
    vector_steps = math.ceil(config.total_steps / n)
    bar = tqdm(
        total=vector_steps * n,
        initial=start * n,
        desc=f"sac {config.task}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    clock = TrainClock()
    stats: dict[str, float] = {}
    try:
        for it in range(start, vector_steps):
            done_steps = it * n
            if done_steps < config.learning_starts and config.init is None:
                action = rng.uniform(spec.action.low_array(), spec.action.high_array(), (n, action_dim)).astype(
                    np.float32
                )
            else:
                action = agent.act(obs, vector_keys)
            next_obs, reward, terminated, truncated, info = env.step(action)
            replay.add(obs, action, reward, terminated, truncated, info["success"])
            ret += reward
            succ |= info["success"]
            for i in np.nonzero(terminated | truncated)[0]:
                episodes["returns"].append(float(ret[i]))
                episodes["success"].append(bool(succ[i]))
                ret[i], succ[i] = 0.0, False
            obs = next_obs
            now = (it + 1) * n
            if now >= config.learning_starts and replay.steps >= 2:
                for _ in range(config.utd * n):
                    stats = update(
                        agent,
                        opt,
                        sample(replay, demos, config, rng),
                        config,
                        target_entropy,
                        f"sac step {now} (last train state: {state_path})",
                    )
            bar.update(n)
            if now // config.log_every != done_steps // config.log_every:
                recent = recent_episodes(episodes["returns"], episodes["success"], 20, reports_success)
                log.log(now, **stats, **recent)
                bar.set_postfix(postfix(recent))
            clock.evaluate_every(
                config, log, lambda: evaluate(agent, config), now, done_steps, last=it + 1 == vector_steps
            )
            if now // config.checkpoint_every != done_steps // config.checkpoint_every or it + 1 == vector_steps:
                checkpoint(it + 1)
    finally:
        bar.close()
        env.close()
        store.close()
    seconds = clock.trained()
    return finish_run(
        config, log, lambda: evaluate(agent, config), run_dir / "policy", vector_steps * n, seconds, run_dir
    )


def load_pretrained(agent: Agent, run_dir: Path) -> None:
    """Actor, critics and target critics from an offline run's train state (IQL or SAC: the same modules)."""
    path = run_dir / TRAIN_STATE
    if not path.exists():
        raise FileNotFoundError(f"SacConfig.init: expected a run directory with {TRAIN_STATE}, got {run_dir}")
    weights = load_train_state(path)["agent"]
    own = agent.state_dict()
    for key, value in own.items():
        if not key.startswith(("actor.", "critic.", "target.")):
            continue
        if key not in weights or weights[key].shape != value.shape:
            got = tuple(weights[key].shape) if key in weights else "nothing"
            raise ValueError(
                f"SacConfig.init: {path} {key}: expected shape {tuple(value.shape)}, got {got} (same "
                "hidden sizes, critic count and critic loss as the offline run?)"
            )
        own[key] = weights[key]
    agent.load_state_dict(own)


def sample(
    replay: ReplayBuffer, demos: DemoTransitions | None, config: SacConfig, rng: np.random.Generator
) -> dict[str, Any]:
    """A batch: online transitions only, or RLPD's symmetric mix of demonstrations and online data."""
    if demos is None:
        return replay.sample(config.batch_size, rng)
    k = round(config.batch_size * config.demo_ratio)
    a, b = demos.sample(k, rng), replay.sample(config.batch_size - k, rng)
    return {
        key: {c: torch.cat([a[key][c], b[key][c]]) for c in a[key]}
        if isinstance(a[key], dict)
        else torch.cat([a[key], b[key]])
        for key in b
    }


def run_train_sac(config: SacConfig) -> RLResult:
    result = train(config)
    print(result.summary(f"sac {config.task}", config.eval_episodes, "env steps"))
    return result
