"""PPO with the rollout and the update on the accelerator: env-steps/s and wall-clock to a stated return.

Two benchmarks, in one process, one JSON line each (plus one "curve" line per evaluation):

* `quadruped`: our JAX PPO (robotrl/rl/ppo_mjx.py) on the MJX `Quadruped` task.
* `ant`: our PPO against Brax's own (`brax.training.agents.ppo.train`) on Brax's `ant`, with the same settings:
  num_envs, unroll length (`--rollout-steps`), batch (one unroll of every env per update: Brax's
  batch_size x num_minibatches = num_envs), epochs (num_updates_per_batch), minibatches, the same MLP sizes
  and tanh activations for policy and value, a Normal policy with a state-independent log-std, observation
  normalization, advantage normalization, the same loss coefficients, no reward scaling and a constant learning
  rate (Brax has no linear annealing). Time limits differ in kind: ours bootstraps a cut from its final
  observation's value; Brax's `bootstrap_on_timeout` needs an env that sets info["time_out"] (ant does not), so
  Brax masks truncated steps out of GAE (its default), which the bench leaves as it is.

Definitions. steps/s: env steps per second of training between evaluations (Brax's `training/sps`; ours timed
the same way, one host sync per iteration as `robotrl train ppo --backend mjx` does), median over the
evaluation intervals after the first (which holds the compile). Return: mean return of `--eval-envs` episodes
of `--episode-length` steps with the deterministic policy (Brax: `deterministic_eval=True`; ours: the same
protocol in `ppo_mjx.make_evaluator`). Seconds to the target: training wall-clock (compile included,
evaluations excluded) at the first evaluation whose return reaches `--target-return`; null if none did.

    python bench/ppo_mjx.py                                     # a GPU: 4096 envs, 20M steps each
    XLA_FLAGS=--xla_disable_hlo_passes=fusion python bench/ppo_mjx.py --num-envs 8 --rollout-steps 8 \\
        --minibatches 2 --total-steps 2048 --evals 2 --eval-envs 4 --episode-length 20 --hidden 32 32  # CPU smoke

Brax 0.14.2's PPO calls `jax.device_put_replicated`, which JAX 0.10 removed: `install_brax_shim` puts back an
equivalent (see there). Needs the `brax` extra (`pip install -e ".[brax]"`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from robotrl.rl import ppo_mjx
from robotrl.rl.ppo import PpoConfig


def device_put_replicated(x: Any, devices: list[Any]) -> Any:
    """What `jax.device_put_replicated` did before JAX removed it: every leaf stacked once per device along a new
    leading axis, that axis sharded over `devices` (the layout `jax.pmap` takes)."""
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("d",)), jax.sharding.PartitionSpec("d"))
    return jax.tree.map(lambda a: jax.device_put(jnp.stack([jnp.asarray(a)] * len(devices)), sharding), x)


def install_brax_shim() -> None:
    """Brax 0.14.2's PPO (train.py, pmap.py) calls the removed function; put it back if it is missing."""
    if not hasattr(jax, "device_put_replicated"):
        jax.device_put_replicated = device_put_replicated  # type: ignore[attr-defined]


def ppo_config(args: argparse.Namespace) -> PpoConfig:
    return PpoConfig(
        num_envs=args.num_envs,
        rollout_steps=args.rollout_steps,
        minibatches=args.minibatches,
        epochs=args.epochs,
        hidden=tuple(args.hidden),
        lr=args.lr,
        anneal_lr=False,
        entropy_coef=args.entropy_coef,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        clip=args.clip,
        value_clip=args.value_clip,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        total_steps=args.total_steps,
        progress=False,
    )


def summarize(curve: list[dict[str, float]], target: float) -> dict[str, Any]:
    rates = [c["steps_per_s"] for c in curve[1:]] or [c["steps_per_s"] for c in curve]
    hit = next((c for c in curve if c["return"] >= target), None)
    return {
        "steps_per_s": float(np.median(rates)),
        "final_return": curve[-1]["return"],
        "best_return": max(c["return"] for c in curve),
        "target_return": target,
        "seconds_to_target": hit["train_seconds"] if hit else None,
        "steps_to_target": hit["step"] if hit else None,
        "train_seconds": curve[-1]["train_seconds"],
        "steps": curve[-1]["step"],
    }


def run_ours(
    name: str,
    env: ppo_mjx.FunctionalEnv,
    eval_env: ppo_mjx.FunctionalEnv,
    config: PpoConfig,
    evals: int,
    episode_length: int,
) -> list[dict[str, float]]:
    """Our learner's jitted pieces in the host loop `train` runs: one iteration per call, metrics fetched each."""
    torch.manual_seed(config.seed)
    per_iteration = config.num_envs * config.rollout_steps
    iterations = math.ceil(config.total_steps / per_iteration)
    every = max(1, math.ceil(iterations / evals))
    evaluate = jax.jit(ppo_mjx.make_evaluator(eval_env, config.normalize_obs, episode_length))
    began = time.perf_counter()
    state = jax.jit(functools.partial(ppo_mjx.init_state, env, config))(
        jax.random.PRNGKey(config.seed), ppo_mjx.init_agent(env.obs_dim, env.action_dim, config)
    )
    iteration = jax.jit(ppo_mjx.make_iteration(env, config))
    lr = jnp.float32(config.lr)
    curve: list[dict[str, float]] = []
    trained, interval_start, interval_steps = 0.0, time.perf_counter(), 0
    for it in range(iterations):
        state, metrics = iteration(state, lr)
        if not bool(jax.device_get(metrics["finite"])):
            raise RuntimeError(f"{name}: ours diverged at iteration {it}")
        interval_steps += per_iteration
        if (it + 1) % every == 0 or it + 1 == iterations:
            interval = time.perf_counter() - interval_start
            trained += interval if curve else time.perf_counter() - began  # the first interval holds the compile
            result = jax.device_get(evaluate(state.params, state.norm, jax.random.PRNGKey(10_000 + it)))
            curve.append(
                {
                    "step": (it + 1) * per_iteration,
                    "return": float(result["return"]),
                    "train_seconds": trained,
                    "steps_per_s": interval_steps / interval,
                }
            )
            print(json.dumps({"bench": "ppo_mjx_curve", "env": name, "learner": "robotrl", **curve[-1]}), flush=True)
            interval_start, interval_steps = time.perf_counter(), 0
    return curve


def run_brax(env: Any, config: PpoConfig, evals: int, episode_length: int, eval_envs: int) -> list[dict[str, float]]:
    """Brax's own PPO with `config`'s settings (see the module docstring)."""
    install_brax_shim()
    from brax.training.agents.ppo import networks as brax_networks, train as brax_ppo

    factory = functools.partial(
        brax_networks.make_ppo_networks,
        policy_hidden_layer_sizes=config.hidden,
        value_hidden_layer_sizes=config.hidden,
        activation=jnp.tanh,
        distribution_type="normal",
        noise_std_type="log",
        init_noise_std=math.exp(config.init_log_std),
    )
    curve: list[dict[str, float]] = []
    last = {"walltime": 0.0, "step": 0}

    def progress(step: int, metrics: dict[str, Any]) -> None:
        if step == 0:
            return  # the initial evaluation, before any training
        walltime = float(metrics["training/walltime"])
        curve.append(
            {
                "step": int(step),
                "return": float(metrics["eval/episode_reward"]),
                "train_seconds": walltime,
                "steps_per_s": float(metrics["training/sps"]),
            }
        )
        print(json.dumps({"bench": "ppo_mjx_curve", "env": "ant", "learner": "brax", **curve[-1]}), flush=True)
        last.update(walltime=walltime, step=step)

    brax_ppo.train(
        environment=env,
        num_timesteps=config.total_steps,
        num_envs=config.num_envs,
        episode_length=episode_length,
        unroll_length=config.rollout_steps,
        batch_size=config.num_envs // config.minibatches,
        num_minibatches=config.minibatches,
        num_updates_per_batch=config.epochs,
        learning_rate=config.lr,
        entropy_cost=config.entropy_coef,
        discounting=config.gamma,
        gae_lambda=config.gae_lambda,
        clipping_epsilon=config.clip,
        clipping_epsilon_value=config.value_clip,
        max_grad_norm=config.max_grad_norm,
        normalize_observations=config.normalize_obs,
        normalize_advantage=config.normalize_advantages,
        vf_loss_coefficient=config.value_coef,
        reward_scaling=1.0,
        network_factory=factory,
        seed=config.seed,
        num_evals=evals + 1,
        num_eval_envs=eval_envs,
        deterministic_eval=True,
        progress_fn=progress,
    )
    return curve


def bench_quadruped(args: argparse.Namespace, row: dict[str, Any]) -> dict[str, Any]:
    from robotrl.envs import make

    config = ppo_config(args)
    steps = args.episode_length or 500

    def env(n: int) -> ppo_mjx.MjxTaskEnv:
        return ppo_mjx.MjxTaskEnv(
            make("Quadruped", num_envs=n, backend="mjx", seed=args.seed, output="jax", episode_steps=steps), ("state",)
        )

    curve = run_ours("Quadruped", env(args.num_envs), env(args.eval_envs), config, args.evals, steps)
    return {**row, "env": "mjx:Quadruped", "episode_length": steps, **summarize(curve, args.quadruped_target)}


def bench_ant(args: argparse.Namespace, row: dict[str, Any]) -> dict[str, Any]:
    try:
        from brax import envs as brax_envs
    except ImportError:
        return {
            **row,
            "env": "brax:ant",
            "status": "skipped",
            "error": "brax is not installed: pip install -e '.[brax]' (brax==0.14.2)",
        }
    config = ppo_config(args)
    steps = args.episode_length or 1000
    ant = brax_envs.get_environment("ant")
    # Brax first: a run cut short by a time limit still has the baseline, and ours' curve lines up to the cut.
    theirs = summarize(run_brax(ant, config, args.evals, steps, args.eval_envs), args.ant_target)
    ours = summarize(
        run_ours(
            "ant",
            ppo_mjx.BraxEnv(ant, args.num_envs, steps),
            ppo_mjx.BraxEnv(ant, args.eval_envs, steps),
            config,
            args.evals,
            steps,
        ),
        args.ant_target,
    )
    return {
        **row,
        "env": "brax:ant",
        "episode_length": steps,
        **ours,
        "baseline": "brax.training.agents.ppo",
        **{f"baseline_{k}": v for k, v in theirs.items()},
        "ratio": ours["steps_per_s"] / theirs["steps_per_s"],
        "return_ratio": ours["final_return"] / theirs["final_return"] if theirs["final_return"] else None,
    }


BENCHES: dict[str, Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = {
    "quadruped": bench_quadruped,
    "ant": bench_ant,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--benches", nargs="+", default=list(BENCHES), choices=list(BENCHES))
    p.add_argument("--num-envs", type=int, default=4096)
    p.add_argument("--rollout-steps", type=int, default=20, help="per env per iteration (Brax: unroll_length)")
    p.add_argument("--minibatches", type=int, default=32)
    p.add_argument("--epochs", type=int, default=4, help="Brax: num_updates_per_batch")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="policy and value MLPs")
    p.add_argument("--total-steps", type=int, default=20_000_000)
    p.add_argument("--evals", type=int, default=10, help="evaluations during training")
    p.add_argument("--eval-envs", type=int, default=128)
    p.add_argument("--episode-length", type=int, default=None, help="default: Quadruped 500, ant 1000")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--entropy-coef", type=float, default=1e-2)
    p.add_argument("--gamma", type=float, default=0.97)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=0.3)
    p.add_argument("--value-clip", type=float, default=None)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--quadruped-target", type=float, default=300.0, help="return to time to (500-step episodes)")
    p.add_argument("--ant-target", type=float, default=3000.0, help="return to time to (1000-step episodes)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.num_envs % args.minibatches:
        sys.exit(f"--minibatches: expected a divisor of --num-envs ({args.num_envs}), got {args.minibatches}")
    torch.set_num_threads(1)
    device = jax.devices()[0]
    row = {
        "bench": "ppo_mjx",
        "device": f"{device.platform}:{device.device_kind}",
        "num_envs": args.num_envs,
        "rollout_steps": args.rollout_steps,
        "minibatches": args.minibatches,
        "epochs": args.epochs,
        "hidden": args.hidden,
        "total_steps": args.total_steps,
    }
    for name in args.benches:
        print(json.dumps(BENCHES[name](args, row)), flush=True)


if __name__ == "__main__":
    main()
