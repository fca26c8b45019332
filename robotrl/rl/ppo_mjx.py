"""PPO with the rollout and the update on the accelerator, for thousands of MJX envs (the Brax regime).

    robotrl train ppo --backend mjx --task Quadruped --num-envs 4096 --rollout-steps 16 --total-steps 50000000
    result = robotrl.rl.ppo_mjx.train(PpoConfig(task="Quadruped", backend="mjx", num_envs=4096))   # the same dataclass

The algorithm and its options are robotrl/rl/ppo.py's (the torch PPO on the threaded CPU backend), option for
option: running observation normalization, GAE(lambda), a time-limit cut bootstrapped from the value of its
final observation, advantage normalization, optional value clipping, an entropy bonus, grad-norm clipping, a
linearly annealed learning rate. What differs is where it runs: one jitted `iteration` holds the rollout (a
`lax.scan` of `rollout_steps` over the env's functional core), GAE and `epochs` x `minibatches` of clipped
surrogate updates, so nothing crosses to the host per step; the host loop only logs, evaluates and checkpoints.

Brax-style small pure functions: the networks are plain parameter pytrees, the loss is a function of (params,
batch), an iteration is a function of the train state. The learner is generic over `FunctionalEnv` (reset(key),
step(state, action) with same-step auto-reset and the final observation); `MjxTaskEnv` adapts a robotrl task on
the MJX backend, `BraxEnv` a Brax env (for benchmarking against Brax's own PPO).

The agent is the torch `PpoAgent` (same layers, same initialization, drawn by torch from the run's seed); its actor
is saved as the CPU PPO saves it (the registered `gaussian` policy, `policy/`), so evaluation on the CPU backend
and everything downstream read it as they read the torch PPO's. A killed run resumes exactly: the whole train state
(parameters, Adam moments, normalizer, env state mid-episode, PRNG keys) is saved as tensors (no pickle).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from tqdm import tqdm

from robotrl.rl.ppo import PpoAgent, PpoConfig, actor_policy_of
from robotrl.training.evaluate import evaluate_state_actor
from robotrl.training.loop import (
    LOWER_LR,
    RLResult,
    RunLog,
    TrainClock,
    TrainingDiverged,
    finish_run,
    load_train_state,
    save_train_state,
    start_run,
)

NORM_CLIP = 10.0  # RunningNorm's clip of normalized observations
LOG_2PI = math.log(2 * math.pi)
#: XLA_FLAGS for MJX on a CPU: XLA's CPU fusion pass turns MJX's kinematics into kernels that recompute their
#: inputs, orders of magnitude slower (bench/RESULTS.md, "Measurements behind the code's design"). Set before
#: JAX starts; never on a GPU.
CPU_XLA_FLAGS = "--xla_disable_hlo_passes=fusion"


# --- the env protocol and its adapters ---------------------------------------------------------------
class EnvStep(NamedTuple):
    """What one batched step returns to the learner; all (num_envs, ...) arrays."""

    obs: jax.Array  # (n, obs_dim) after any auto-reset: what the policy acts on next
    reward: jax.Array  # (n,)
    terminated: jax.Array  # (n,) bool: the episode failed or finished (no bootstrap)
    truncated: jax.Array  # (n,) bool: cut by the time limit (bootstrapped from final_obs)
    final_obs: jax.Array  # (n, obs_dim) the observation the step reached, before any reset
    success: jax.Array  # (n,) bool (all False for envs without a success signal)


class FunctionalEnv(Protocol):
    """A batch of envs as pure, jit-able functions; episodes auto-reset inside `step`."""

    num_envs: int
    obs_dim: int
    action_dim: int

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        """(env state pytree, flat observations (n, obs_dim))."""
        ...

    def step(self, state: Any, action: jax.Array) -> tuple[Any, EnvStep]: ...


class MjxTaskEnv:
    """A robotrl task on the MJX backend (`MjxVectorEnv`'s functional core) with observations flattened in
    `obs_keys` order, as the CPU PPO's `flatten_obs` does."""

    def __init__(self, env: Any, obs_keys: tuple[str, ...]) -> None:
        if not env.autoreset:
            raise ValueError("MjxTaskEnv: expected an env with autoreset=True (PPO relies on same-step resets)")
        spec = env.task_spec
        numeric = [k for k, v in spec.observations.items() if not v.is_image and v.dtype != "string"]
        bad = [k for k in obs_keys if k not in numeric]
        if bad:
            raise ValueError(
                f"PpoConfig.obs_keys: {bad} are not numeric state observations of {env.task.name} on "
                f"the MJX backend; expected some of {numeric}"
            )
        self.env, self.obs_keys, self.num_envs = env, tuple(obs_keys), env.num_envs
        self.obs_dim = int(sum(np.prod(spec.observations[k].shape) for k in obs_keys))
        self.action_dim = int(np.prod(spec.action.shape))

    def flat(self, obs: dict[str, jax.Array]) -> jax.Array:
        return jnp.concatenate([obs[k].reshape(self.num_envs, -1).astype(jnp.float32) for k in self.obs_keys], 1)

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        state = self.env.init(key)
        return state, self.flat(state.obs)

    def step(self, state: Any, action: jax.Array) -> tuple[Any, EnvStep]:
        state, obs, reward, terminated, truncated, info = self.env.step_fn(state, action)
        return state, EnvStep(
            self.flat(obs),
            reward.astype(jnp.float32),
            terminated,
            truncated,
            self.flat(info["final_obs"]),
            info["success"],
        )


class BraxEnv:
    """A Brax env (e.g. `brax.envs.get_environment("ant")`) under Brax's own vmap and episode (time limit)
    wrappers. Done envs restart from their first state, as Brax's `AutoResetWrapper` does, but the observation
    the step reached is kept for the time-limit bootstrap. Needs the `brax` extra."""

    def __init__(self, env: Any, num_envs: int, episode_length: int = 1000) -> None:
        from brax.envs.wrappers.training import EpisodeWrapper, VmapWrapper

        self.env = EpisodeWrapper(VmapWrapper(env), episode_length, action_repeat=1)
        self.num_envs, self.obs_dim, self.action_dim = num_envs, int(env.observation_size), int(env.action_size)

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        first = self.env.reset(jax.random.split(key, self.num_envs))
        return (first, first), first.obs

    def step(self, state: Any, action: jax.Array) -> tuple[Any, EnvStep]:
        current, first = state
        reached = self.env.step(current, action)
        done = reached.done > 0
        truncated = reached.info["truncation"] > 0

        def restart(a: jax.Array, b: jax.Array) -> jax.Array:
            return jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b)

        info = {**reached.info, "steps": jnp.where(done, 0, reached.info["steps"])}
        after = reached.replace(
            pipeline_state=jax.tree.map(restart, first.pipeline_state, reached.pipeline_state),
            obs=restart(first.obs, reached.obs),
            done=jnp.zeros_like(reached.done),
            info=info,
        )
        return (after, first), EnvStep(
            after.obs,
            reached.reward.astype(jnp.float32),
            done & ~truncated,
            truncated,
            reached.obs,
            jnp.zeros_like(done),
        )


# --- the agent: PpoAgent's networks as parameter pytrees ---------------------------------------------
Params = dict[str, Any]  # {"actor": [(w (in, out), b), ...], "critic": [...], "log_std": (A,)}


class Norm(NamedTuple):
    """RunningNorm's running mean / variance / count of observations."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls


def agent_to_jax(state: dict[str, torch.Tensor]) -> tuple[Params, Norm]:
    """A `PpoAgent` state dict as (params, normalizer)."""

    def layers(prefix: str) -> list[tuple[jax.Array, jax.Array]]:
        idx = sorted(int(k.split(".")[1]) for k in state if k.startswith(prefix + ".") and k.endswith(".weight"))
        return [
            (jnp.asarray(state[f"{prefix}.{i}.weight"].T.numpy()), jnp.asarray(state[f"{prefix}.{i}.bias"].numpy()))
            for i in idx
        ]

    params = {"actor": layers("actor"), "critic": layers("critic"), "log_std": jnp.asarray(state["log_std"].numpy())}
    norm = Norm(*(jnp.asarray(state[f"norm.{k}"].numpy(), jnp.float32) for k in ("mean", "var", "count")))
    return params, norm


def agent_from_jax(params: Params, norm: Norm) -> dict[str, torch.Tensor]:
    """(params, normalizer) as a `PpoAgent` state dict (nn.Sequential numbers its Linear layers 0, 2, 4, ...)."""
    host = jax.device_get((params, norm))
    out: dict[str, torch.Tensor] = {
        f"norm.{k}": torch.tensor(np.asarray(v), dtype=torch.float64) for k, v in zip(Norm._fields, host[1])
    }
    for net in ("actor", "critic"):
        for i, (w, b) in enumerate(host[0][net]):
            out[f"{net}.{2 * i}.weight"] = torch.from_numpy(np.array(w).T.copy())
            out[f"{net}.{2 * i}.bias"] = torch.from_numpy(np.array(b))
    out["log_std"] = torch.from_numpy(np.array(host[0]["log_std"]))
    return out


def init_agent(obs_dim: int, action_dim: int, config: PpoConfig) -> tuple[Params, Norm]:
    """PpoAgent's initialization (drawn by torch from its current seed), as parameters."""
    return agent_to_jax(PpoAgent(obs_dim, action_dim, config).state_dict())


def mlp(layers: list[tuple[jax.Array, jax.Array]], x: jax.Array) -> jax.Array:
    for w, b in layers[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = layers[-1]
    return x @ w + b


def update_norm(norm: Norm, x: jax.Array) -> Norm:
    """RunningNorm.update: the parallel-variance merge of one batch (N, D)."""
    n = x.shape[0]
    mean, var = x.mean(0), x.var(0)
    total = norm.count + n
    delta = mean - norm.mean
    return Norm(
        norm.mean + delta * n / total,
        (norm.var * norm.count + var * n + delta**2 * norm.count * n / total) / total,
        total,
    )


def features(norm: Norm, obs: jax.Array, normalize: bool) -> jax.Array:
    if not normalize:
        return obs
    return jnp.clip((obs - norm.mean) / jnp.sqrt(norm.var + 1e-8), -NORM_CLIP, NORM_CLIP)


def actor_mean(params: Params, x: jax.Array) -> jax.Array:
    return mlp(params["actor"], x)


def value(params: Params, x: jax.Array) -> jax.Array:
    return mlp(params["critic"], x)[..., 0]


def log_prob(mean: jax.Array, log_std: jax.Array, action: jax.Array) -> jax.Array:
    return (-0.5 * ((action - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * LOG_2PI).sum(-1)


def act(params: Params, norm: Norm, obs: jax.Array, normalize: bool) -> jax.Array:
    """The deterministic action (the mean): evaluation and deployment; `PpoAgent.act` in JAX."""
    return actor_mean(params, features(norm, obs, normalize))


# --- the algorithm --------------------------------------------------------------------------------
GaeCarry = tuple[jax.Array, jax.Array]  # gae's scan carry: (running advantage, value of the next step)


def gae(
    reward: jax.Array, value_: jax.Array, done: jax.Array, last_value: jax.Array, gamma: float, lam: float
) -> jax.Array:
    """GAE(lambda) over a (T, N) rollout, as robotrl.rl.ppo.gae: `done` cuts the recursion at episode ends."""

    def back(carry: GaeCarry, t: tuple[jax.Array, ...]) -> tuple[GaeCarry, jax.Array]:
        running, next_value = carry
        r, v, d = t
        keep = 1.0 - d
        running = r + gamma * next_value * keep - v + gamma * lam * keep * running
        return (running, v), running

    _, adv = jax.lax.scan(back, (jnp.zeros_like(last_value), last_value), (reward, value_, done), reverse=True)
    return adv


def ppo_loss(params: Params, norm: Norm, batch: dict[str, jax.Array], config: PpoConfig) -> tuple[jax.Array, dict]:
    """Clipped surrogate + (clipped) value regression - entropy bonus on one minibatch (robotrl.rl.ppo.ppo_loss)."""
    x = features(norm, batch["obs"], config.normalize_obs)
    logp = log_prob(actor_mean(params, x), params["log_std"], batch["action"])
    ratio = jnp.exp(logp - batch["logp"])
    adv = batch["adv"]
    if config.normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    policy_loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - config.clip, 1 + config.clip)).mean()
    v = value(params, x)
    value_loss = (v - batch["ret"]) ** 2
    if config.value_clip is not None:
        clipped = batch["value"] + jnp.clip(v - batch["value"], -config.value_clip, config.value_clip)
        value_loss = jnp.maximum(value_loss, (clipped - batch["ret"]) ** 2)
    value_loss = 0.5 * value_loss.mean()
    entropy = (0.5 + 0.5 * LOG_2PI + params["log_std"]).sum()
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    stats = {
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "entropy": entropy,
        "approx_kl": ((ratio - 1) - (logp - batch["logp"])).mean(),
        "clip_frac": (jnp.abs(ratio - 1) > config.clip).mean(),
    }
    return loss, jax.lax.stop_gradient(stats)


def optimizer(config: PpoConfig) -> optax.GradientTransformation:
    """Clipped Adam direction (torch.optim.Adam's with eps=1e-5); the iteration scales it by -lr, so the learning
    rate is an argument of the compiled program rather than baked into it."""
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.scale_by_adam(eps=1e-5))


class TrainState(NamedTuple):
    """Everything an iteration reads and writes; saved whole for an exact resume."""

    params: Params
    opt_state: Any
    norm: Norm
    env_state: Any
    obs: jax.Array  # (n, obs_dim) observations the next rollout starts from
    key: jax.Array
    ep_return: jax.Array  # (n,) return of each env's episode so far (training statistics)
    ep_success: jax.Array  # (n,) bool


def init_state(env: FunctionalEnv, config: PpoConfig, key: jax.Array, agent: tuple[Params, Norm]) -> TrainState:
    """A fresh train state around an initial agent (`init_agent`); jit it with `env` and `config` bound."""
    params, norm = agent
    k_env, key = jax.random.split(key)
    env_state, obs = env.reset(k_env)
    n = env.num_envs
    return TrainState(
        params, optimizer(config).init(params), norm, env_state, obs, key, jnp.zeros(n, jnp.float32), jnp.zeros(n, bool)
    )


def make_iteration(env: FunctionalEnv, config: PpoConfig) -> Callable[[TrainState, jax.Array], tuple[TrainState, dict]]:
    """One PPO iteration as a pure function of (train state, learning rate): rollout, GAE, updates. jit it."""
    n, horizon, gamma, normalize = env.num_envs, config.rollout_steps, config.gamma, config.normalize_obs
    size = n * horizon // config.minibatches
    opt = optimizer(config)

    def rollout_step(s: TrainState, _: None) -> tuple[TrainState, tuple[dict[str, jax.Array], jax.Array]]:
        key, k_act = jax.random.split(s.key)
        norm = update_norm(s.norm, s.obs) if normalize else s.norm
        x = features(norm, s.obs, normalize)
        mean = actor_mean(s.params, x)
        action = mean + jnp.exp(s.params["log_std"]) * jax.random.normal(k_act, mean.shape)
        env_state, out = env.step(s.env_state, action)
        cut = out.truncated & ~out.terminated  # bootstrap a time-limit cut from its final observation's value
        bootstrap = gamma * value(s.params, features(norm, out.final_obs, normalize))
        done = out.terminated | out.truncated
        ep_return, ep_success = s.ep_return + out.reward, s.ep_success | out.success
        ended = jnp.stack([done.sum(), jnp.where(done, ep_return, 0.0).sum(), (done & ep_success).sum()])
        step = {
            "obs": s.obs,
            "action": action,
            "logp": log_prob(mean, s.params["log_std"], action),
            "value": value(s.params, x),
            "reward": out.reward + jnp.where(cut, bootstrap, 0.0),
            "done": done.astype(jnp.float32),
        }
        s = s._replace(
            norm=norm,
            env_state=env_state,
            obs=out.obs,
            key=key,
            ep_return=jnp.where(done, 0.0, ep_return),
            ep_success=ep_success & ~done,
        )
        return s, (step, ended)

    def minibatch_step(
        carry: tuple[Params, Any], mb: dict[str, jax.Array], norm: Norm, lr: jax.Array
    ) -> tuple[tuple[Params, Any], dict[str, jax.Array]]:
        params, opt_state = carry
        (loss, stats), grads = jax.value_and_grad(ppo_loss, has_aux=True)(params, norm, mb, config)
        direction, opt_state = opt.update(grads, opt_state, params)
        params = jax.tree.map(lambda p, d: p - lr * d, params, direction)
        return (params, opt_state), {**stats, "loss": loss}

    def iteration(s: TrainState, lr: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        s, (traj, ended) = jax.lax.scan(rollout_step, s, None, length=horizon)
        last_value = value(s.params, features(s.norm, s.obs, normalize))
        adv = gae(traj["reward"], traj["value"], traj["done"], last_value, gamma, config.gae_lambda)
        flat = {
            k: v.reshape(n * horizon, *v.shape[2:])
            for k, v in {**traj, "adv": adv, "ret": adv + traj["value"]}.items()
            if k not in ("reward", "done")
        }
        key, k_perm = jax.random.split(s.key)

        def epoch(carry: tuple[Params, Any], k: jax.Array) -> tuple[tuple[Params, Any], dict[str, jax.Array]]:
            order = jax.random.permutation(k, n * horizon).reshape(config.minibatches, size)
            return jax.lax.scan(
                lambda c, idx: minibatch_step(c, jax.tree.map(lambda v: v[idx], flat), s.norm, lr), carry, order
            )

        (params, opt_state), stats = jax.lax.scan(
            epoch, (s.params, s.opt_state), jax.random.split(k_perm, config.epochs)
        )
        finite = jnp.isfinite(stats["loss"]).all() & jnp.all(
            jnp.stack([jnp.isfinite(p).all() for p in jax.tree.leaves(params)])
        )
        episodes = ended.sum(0)
        metrics = {
            **jax.tree.map(jnp.mean, stats),
            "finite": finite,
            "episodes": episodes[0],
            "return_sum": episodes[1],
            "successes": episodes[2],
        }
        return s._replace(params=params, opt_state=opt_state, key=key), metrics

    return iteration


def make_evaluator(
    env: FunctionalEnv, normalize: bool, steps: int
) -> Callable[[Params, Norm, jax.Array], dict[str, jax.Array]]:
    """Return and success of each env's first episode (deterministic actions) within `steps` steps, all on the
    device: for envs the CPU backend cannot run (Brax's) and for benchmarks. jit it."""

    def evaluate(params: Params, norm: Norm, key: jax.Array) -> dict[str, jax.Array]:
        env_state, obs = env.reset(key)

        def body(carry: tuple, _: None) -> tuple[tuple, None]:
            env_state, obs, ret, success, alive = carry
            env_state, out = env.step(env_state, act(params, norm, obs, normalize))
            ret = ret + jnp.where(alive, out.reward, 0.0)
            success = success | (out.success & alive)
            return (env_state, out.obs, ret, success, alive & ~(out.terminated | out.truncated)), None

        n = env.num_envs
        init = (env_state, obs, jnp.zeros(n), jnp.zeros(n, bool), jnp.ones(n, bool))
        (_, _, ret, success, alive), _ = jax.lax.scan(body, init, None, length=steps)
        return {"return": ret.mean(), "success_rate": success.mean(), "finished": 1.0 - alive.mean()}

    return evaluate


# --- train state on disk -------------------------------------------------------------------------------
def state_tensors(state: TrainState) -> dict[str, torch.Tensor]:
    """The train state as named host tensors (saved as safetensors: no pickle)."""
    leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
    return {jax.tree_util.keystr(path): torch.from_numpy(np.array(x)) for path, x in leaves}


def state_from_tensors(template: TrainState, saved: dict[str, torch.Tensor]) -> TrainState:
    """`saved` poured into the structure of `template`; a missing leaf or one of another shape or dtype (a run
    saved with another config) is an error naming it."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = []
    for path, like in paths:
        name = jax.tree_util.keystr(path)
        if name not in saved:
            raise ValueError(f"train state: {name} missing from the saved state (saved with another config?)")
        arr = saved[name].numpy()
        if arr.shape != np.shape(like) or arr.dtype != np.dtype(like.dtype):
            raise ValueError(
                f"train state: {name} expected {np.shape(like)} {np.dtype(like.dtype)}, got "
                f"{arr.shape} {arr.dtype} (saved with another config?)"
            )
        leaves.append(arr)
    # uncommitted, like init's state: a state committed to a device would compile another iteration program
    return jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves))


# --- the run ---------------------------------------------------------------------------------------
#: fields of PpoConfig that shape the compiled program (the learning rate, the seed and the budget do not)
PROGRAM_FIELDS = (
    "task",
    "action_mode",
    "reward_type",
    "obs_keys",
    "num_envs",
    "rollout_steps",
    "epochs",
    "minibatches",
    "gamma",
    "gae_lambda",
    "clip",
    "value_clip",
    "value_coef",
    "entropy_coef",
    "max_grad_norm",
    "normalize_obs",
    "normalize_advantages",
    "hidden",
)


@dataclass
class Program:
    env: MjxTaskEnv
    init: Callable[[jax.Array, tuple[Params, Norm]], TrainState]
    iteration: Callable[[TrainState, jax.Array], tuple[TrainState, dict]]


_PROGRAMS: dict[tuple, Program] = {}


def program_for(config: PpoConfig) -> Program:
    """The env adapter and the jitted functions for a config; runs whose configs differ only in the learning
    rate, seed, budget or bookkeeping share them (compiling MJX takes tens of seconds on a CPU)."""
    from robotrl.envs import make

    key = tuple(getattr(config, f) for f in PROGRAM_FIELDS)
    if key not in _PROGRAMS:
        vec = make(
            config.task,
            num_envs=config.num_envs,
            backend="mjx",
            seed=config.seed,
            output="jax",
            action_mode=config.action_mode,
            reward_type=config.reward_type,
        )
        env = MjxTaskEnv(vec, config.obs_keys)
        _PROGRAMS[key] = Program(env, jax.jit(partial(init_state, env, config)), jax.jit(make_iteration(env, config)))
    return _PROGRAMS[key]


def train(config: PpoConfig) -> RLResult:
    """PPO on the MJX backend; `robotrl train ppo` runs it for `backend="mjx"`."""
    run_dir, state_path, _ = start_run(config, "ppo-mjx", config.task)
    if jax.default_backend() == "cpu" and CPU_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
        warnings.warn(
            f"ppo (mjx) on the CPU: MJX runs orders of magnitude slower under XLA's CPU fusion; start the "
            f"process with XLA_FLAGS={CPU_XLA_FLAGS}",
            stacklevel=2,
        )
    program = program_for(config)
    env, n, horizon = program.env, config.num_envs, config.rollout_steps
    iterations = math.ceil(config.total_steps / (n * horizon))

    state = program.init(jax.random.PRNGKey(config.seed), init_agent(env.obs_dim, env.action_dim, config))
    start = 0
    if config.resume:
        saved = load_train_state(state_path)
        state, start = state_from_tensors(state, saved["state"]), int(saved["step"])

    def agent() -> PpoAgent:
        torch_agent = PpoAgent(env.obs_dim, env.action_dim, config)
        torch_agent.load_state_dict(agent_from_jax(state.params, state.norm))
        return torch_agent

    def save_policy() -> None:
        """The registered policy the CPU PPO saves (a Brax env, benchmarked only, has no task spec to save with)."""
        if isinstance(env, MjxTaskEnv):
            actor_policy_of(agent(), env.env.task_spec, config).save(run_dir / "policy")

    def evaluate() -> Any:
        return evaluate_state_actor(
            agent().act,
            config.task,
            config.obs_keys,
            config.eval_episodes,
            config.eval_envs,
            action_mode=config.action_mode,
            reward_type=config.reward_type,
        )

    log = RunLog(run_dir)
    bar = tqdm(
        total=iterations * n * horizon,
        initial=start * n * horizon,
        desc=f"ppo (mjx) {config.task}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    clock, first_call_s = TrainClock(), 0.0
    try:
        for it in range(start, iterations):
            lr = config.lr * (1 - it / iterations) if config.anneal_lr else config.lr
            t0 = time.perf_counter()
            new_state, metrics = program.iteration(state, jnp.float32(lr))
            m = jax.device_get(metrics)  # the one host sync per iteration
            if it == start:
                first_call_s = time.perf_counter() - t0  # compile (or a cache load) + the first iteration
            if not m.pop("finite"):
                raise TrainingDiverged(
                    f"ppo (mjx) iteration {it}: loss or weights are not finite (loss "
                    f"{float(m['loss'])}); the last good train state is kept ({state_path}); "
                    f"{LOWER_LR}"
                )
            state = new_state

            # log, evaluate, checkpoint
            now, before = (it + 1) * n * horizon, it * n * horizon
            bar.update(n * horizon)
            trained_s = clock.trained()
            episodes = int(m.pop("episodes"))
            ret, succ = float(m.pop("return_sum")), float(m.pop("successes"))
            log.log(
                now,
                **{k: float(v) for k, v in m.items()},
                **{
                    "time/train_seconds": trained_s,
                    "time/steps_per_second": now / max(trained_s, 1e-9),
                    "time/first_call_seconds": first_call_s,
                },
                **(
                    {"train/return": ret / episodes, "train/success_rate": succ / episodes, "train/episodes": episodes}
                    if episodes
                    else {}
                ),
            )
            if episodes:
                bar.set_postfix(ret=f"{ret / episodes:.2f}", success=f"{succ / episodes:.2f}")
            clock.evaluate_every(config, log, evaluate, now, before, last=it + 1 == iterations)
            if now // config.checkpoint_every != before // config.checkpoint_every or it + 1 == iterations:
                save_train_state(state_path, step=it + 1, state=state_tensors(state))
                save_policy()
    finally:
        bar.close()
    seconds = clock.trained()
    steps = iterations * n * horizon
    timed = (steps - (start + 1) * n * horizon) / max(seconds - first_call_s, 1e-9) if iterations - start > 1 else None
    return finish_run(config, log, evaluate, run_dir / "policy", steps, seconds, run_dir, steps_per_second=timed)
