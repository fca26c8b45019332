"""SAC / RLPD split into rollout workers and a learner (SERL's actor/learner split), asynchronous with a bounded
policy staleness (as AReaL decouples rollout from training), in this process or on a Ray cluster.

    robotrl train sac-distributed --task Reach --workers 2 --num-envs 4                       # in process (default)
    robotrl train sac-distributed --task Reach --workers 4 --transport ray --max-staleness 2  # one process per worker
    result = robotrl.rl.actor_learner.train(ActorLearnerConfig(task="Reach", workers=2))        # the same dataclass

A worker owns a CPU vector env and a copy of the actor; a call steps its envs `rollout_steps` times with the
newest weights it was sent and returns the transitions. The learner adds them to the replay (one row per env of
every worker, kept on the episode store with each episode tagged by worker and env, and each step by the policy
version that acted, 0 being the initial weights and the random warm-up), runs sac.py's RLPD `update` `utd` times
per transition received, and publishes the actor's weights as the next version. Two transports run the same
loop: `local` (workers are objects in this process; Ray is never imported) and `ray` (one Ray actor process per
worker, weights through the object store; the learner stays in the driver process, next to its accelerator).

Bounded staleness. The learner publishes version V+1 only once every worker still acting holds a version of at
least V+1-`max_staleness` (it first waits for those that would fall further behind), and every call gets the
newest version: no transition is acted with weights more than `max_staleness` versions older than the learner's
newest. `max_staleness=0` is the synchronous schedule: all workers collect, the learner takes their results in
worker order and updates; it is deterministic and the same, to the bit, on both transports.

Resume. Train states are taken at a barrier (no call in flight; the learner stops handing out calls until the
ones in flight are back): the learner (networks, optimizers, RNGs, version), the replay (store and unfinished
episodes) and every worker's envs mid-episode and RNGs. A resumed run continues from exactly that state and
records again what came after it (the store is truncated). Where the schedule is deterministic
(`max_staleness=0`, or the local transport, whose calls come back first in, first out) the resumed run ends
identical to one never stopped; with Ray and `max_staleness > 0` which worker comes back first depends on timing,
in the first run as in the resumed one, so the resumed run is a valid continuation from the same state, not the
same bits.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm import tqdm

from robotrl.core.spec import Spec, flatten_obs
from robotrl.datasets import EpisodeStore
from robotrl.envs import make, make_task
from robotrl.policies.gaussian import TanhGaussianActor
from robotrl.rl.replay import DemoTransitions, ReplayBuffer, split_obs_keys
from robotrl.rl.sac import (
    Agent,
    SacConfig,
    actor_policy_of,
    env_options,
    evaluate,
    load_pretrained,
    sample,
    task_options,
    update,
)
from robotrl.training.loop import RLResult, RunLog, TrainClock, finish_run, load_run_state, save_run_state, start_run

WORKER_START_TIMEOUT_S = 300.0
"""how long Ray may take to place and start every worker before the run gives up (not a hang)"""


@dataclass
class ActorLearnerConfig(SacConfig):
    """Train SAC / RLPD with rollout workers and a learner, in this process or on a Ray cluster."""

    num_envs: int = 1
    """envs of each worker's vector env (the run steps workers x num_envs envs)"""
    workers: int = 2
    """rollout workers"""
    rollout_steps: int = 1
    """vector steps a worker takes per call, all with the same weights"""
    max_staleness: int = 0
    """a worker never acts with weights more than this many versions older than the learner's newest (0: the
    synchronous, deterministic schedule)"""
    transport: Literal["local", "ray"] = "local"
    """local: workers are objects in this process (no Ray); ray: one Ray actor process per worker"""
    ray_address: str | None = None
    """the Ray cluster to join (e.g. 127.0.0.1:6379); default: a local cluster started for the run, or this
    process's if it already called ray.init"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("workers", "rollout_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"ActorLearnerConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.max_staleness < 0:
            raise ValueError(f"ActorLearnerConfig.max_staleness: expected >= 0, got {self.max_staleness}")
        if self.transport not in ("local", "ray"):
            raise ValueError(f"ActorLearnerConfig.transport: expected 'local' or 'ray', got {self.transport!r}")
        if self.ray_address is not None and self.transport != "ray":
            raise ValueError(
                f"ActorLearnerConfig.ray_address: only used with transport='ray', got "
                f"{self.ray_address!r} with transport={self.transport!r}"
            )


class WorkerDied(RuntimeError):
    """A rollout worker's process ended; the run stops (its last train state is kept) instead of waiting forever."""


def actor_dims(spec: Spec, config: ActorLearnerConfig) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(obs_dim, action_dim, low, high) of the actor a task's spec calls for, after checking the obs keys."""
    split_obs_keys(spec, config.obs_keys, "ActorLearnerConfig.obs_keys", images=False)  # pixels: `train sac`
    obs_dim = sum(int(np.prod(spec.observations[k].shape)) for k in config.obs_keys)
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in (spec.action.low_array(), spec.action.high_array()))
    return obs_dim, int(np.prod(spec.action.shape)), low, high


def as_tensors(arrays: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}


class RolloutWorker:
    """A CPU vector env and a copy of the actor; the same class runs in process and as a Ray actor. Its random
    streams (reset states, exploration, the actor's sampling noise) are its own, drawn from the run's seed and its
    index, and never touch the process's global torch RNG: in process, the learner's draws are unchanged."""

    def __init__(self, config: ActorLearnerConfig, index: int) -> None:
        torch.set_num_threads(config.threads)
        self.config, self.index = config, index
        seeds = np.random.SeedSequence(config.seed).spawn(config.workers)[index]
        env_seed, torch_seed = (int(x) for x in seeds.generate_state(2))
        self.env = make(config.task, num_envs=config.num_envs, seed=env_seed, **env_options(config))
        self.spec: Spec = self.env.task_spec
        self.obs, _ = self.env.reset(seed=env_seed)
        self.rng = np.random.default_rng(seeds)
        obs_dim, action_dim, low, high = actor_dims(self.spec, config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch_seed)
            self.actor = TanhGaussianActor(obs_dim, action_dim, config.hidden, low, high)
            self.torch_rng = torch.get_rng_state()
        self.version = -1

    def pid(self) -> int:
        return os.getpid()

    def collect(self, weights: dict[str, torch.Tensor], version: int, steps: int, explore: bool) -> dict[str, Any]:
        """`steps` vector steps: uniform random actions while `explore` (before learning starts), else actions
        sampled from the actor with `weights` (version `version`). Arrays are (steps, num_envs, ...)."""
        if version != self.version:
            self.actor.load_state_dict(weights)
            self.version = version
        n, action = self.config.num_envs, self.spec.action
        out: dict[str, list[Any]] = {k: [] for k in ("obs", "action", "reward", "terminated", "truncated", "success")}
        for _ in range(steps):
            if explore:
                act = self.rng.uniform(action.low_array(), action.high_array(), (n, *action.shape)).astype(np.float32)
            else:
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    torch.set_rng_state(self.torch_rng)
                    act = self.actor(torch.from_numpy(flatten_obs(self.obs, self.config.obs_keys)))[0].numpy()
                    self.torch_rng = torch.get_rng_state()
            next_obs, reward, terminated, truncated, info = self.env.step(act)
            for key, value in (
                ("obs", {k: np.array(v) for k, v in self.obs.items()}),
                ("action", act),
                ("reward", reward),
                ("terminated", terminated),
                ("truncated", truncated),
                ("success", info["success"]),
            ):
                out[key].append(value)
            self.obs = next_obs
        batch = {k: np.stack(v) for k, v in out.items() if k != "obs"}
        return {**batch, "obs": {k: np.stack([o[k] for o in out["obs"]]) for k in self.obs}, "version": version}

    def state(self) -> dict[str, Any]:
        """The envs mid-episode, the observation the next action is chosen from, and the random streams."""
        return {
            "env": as_tensors(self.env.get_state()),
            "env_rng": self.env.get_rng_state(),
            "obs": as_tensors(self.obs),
            "rng": self.rng.bit_generator.state,
            "torch_rng": self.torch_rng,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.set_state({k: v.numpy() for k, v in state["env"].items()})
        self.env.set_rng_state(state["env_rng"])
        self.obs = {k: v.numpy() for k, v in state["obs"].items()}
        self.rng.bit_generator.state = state["rng"]
        self.torch_rng = state["torch_rng"]

    def close(self) -> None:
        self.env.close()


class LocalWorkers:
    """Workers as objects in this process: a call runs when it is submitted, results come back first in, first
    out (a deterministic schedule at any staleness)."""

    def __init__(self, config: ActorLearnerConfig, where: str) -> None:
        self.workers = [RolloutWorker(config, w) for w in range(config.workers)]
        self.done: dict[int, dict[str, Any]] = {}
        self.pids = [os.getpid()] * config.workers

    def publish(self, weights: dict[str, torch.Tensor]) -> Any:
        return weights

    def submit(self, w: int, weights: Any, version: int, steps: int, explore: bool) -> None:
        self.done[w] = self.workers[w].collect(weights, version, steps, explore)

    def wait(self, need: list[int]) -> list[int]:
        """All of `need` if any, else the worker whose call came first."""
        return need or [next(iter(self.done))]

    def result(self, w: int) -> dict[str, Any]:
        return self.done.pop(w)

    def states(self) -> list[dict[str, Any]]:
        return [w.state() for w in self.workers]

    def set_states(self, states: list[dict[str, Any]]) -> None:
        for w, s in zip(self.workers, states):
            w.set_state(s)

    def close(self) -> None:
        for w in self.workers:
            w.close()


class RayWorkers:
    """One Ray actor process per worker (1 CPU each); each version of the weights goes into the object store once.
    A worker process that dies surfaces as `WorkerDied` from the call waiting on it."""

    def __init__(self, config: ActorLearnerConfig, where: str) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError(
                "ActorLearnerConfig.transport: 'ray' needs Ray, expected it installed (pip install "
                "'robotrl[distributed]'), got no module named ray"
            ) from None
        self.ray, self.where = ray, where
        self.owns_cluster = not ray.is_initialized()
        if self.owns_cluster:
            local: dict[str, Any] = {
                "num_cpus": max(config.workers, os.cpu_count() or 1),
                "_node_ip_address": "127.0.0.1",
            }
            # ray.init takes a logging level's name as well as its number
            ray.init(
                address=config.ray_address,
                include_dashboard=False,
                logging_level="warning",  # type: ignore[arg-type]
                **({} if config.ray_address else local),
            )
        remote = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.actors: list[Any] = [remote.remote(config, w) for w in range(config.workers)]  # Ray actor handles
        self.refs: dict[int, Any] = {}
        try:
            self.pids: list[int] = ray.get([a.pid.remote() for a in self.actors], timeout=WORKER_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(
                f"actor_learner: {config.workers} rollout workers (1 CPU each) did not all start within "
                f"{WORKER_START_TIMEOUT_S:.0f} s; the Ray cluster has {ray.cluster_resources()}"
            ) from None

    def publish(self, weights: dict[str, torch.Tensor]) -> Any:
        return self.ray.put(weights)

    def submit(self, w: int, weights: Any, version: int, steps: int, explore: bool) -> None:
        self.refs[w] = self.actors[w].collect.remote(weights, version, steps, explore)

    def wait(self, need: list[int]) -> list[int]:
        """All of `need` if any, else the first worker whose call is back (a dead worker's call is back too)."""
        if need:
            self.ray.wait([self.refs[w] for w in need], num_returns=len(need))
            return need
        ready, _ = self.ray.wait(list(self.refs.values()), num_returns=1)
        return [w for w, ref in self.refs.items() if ref in ready]

    def result(self, w: int) -> dict[str, Any]:
        return self._get(self.refs.pop(w), w)

    def states(self) -> list[dict[str, Any]]:
        return [self._get(a.state.remote(), w) for w, a in enumerate(self.actors)]

    def set_states(self, states: list[dict[str, Any]]) -> None:
        for w, (a, s) in enumerate(zip(self.actors, states)):
            self._get(a.set_state.remote(s), w)

    def _get(self, ref: Any, w: int) -> Any:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:
            raise WorkerDied(
                f"rollout worker {w} (Ray actor, pid {self.pids[w]}) died ({type(e).__name__}); {self.where}"
            ) from e

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        if self.owns_cluster:
            self.ray.shutdown()


def train(config: ActorLearnerConfig) -> RLResult:
    run_dir, state_path, rng = start_run(config, "sac-distributed", config.task, holds="replay.zarr")
    where = f"continue from the last train state in {state_path} with --resume"

    # the learner: networks, replay rows (worker w's env j is row w * num_envs + j), demonstrations
    spec = make_task(config.task, **task_options(config)).spec()
    obs_dim, action_dim, low, high = actor_dims(spec, config)
    target_entropy = config.target_entropy if config.target_entropy is not None else -action_dim / 2
    agent = Agent(obs_dim, action_dim, low, high, config)
    if config.init is not None and not config.resume:
        load_pretrained(agent, Path(config.init))
    opt = agent.optimizers(config.lr)
    demos = DemoTransitions(config.demos, spec, config.obs_keys) if config.demos is not None else None
    per_worker, chunk = config.num_envs, config.rollout_steps
    n = config.workers * per_worker
    row_meta = [
        {"env": w * per_worker + j, "worker": w, "worker_env": j}
        for w in range(config.workers)
        for j in range(per_worker)
    ]
    capacity = math.ceil(config.total_steps / per_worker) + chunk + 1  # enough for one worker doing all the work

    transport = (RayWorkers if config.transport == "ray" else LocalWorkers)(config, where)
    (run_dir / "workers.json").write_text(json.dumps([{"worker": w, "pid": p} for w, p in enumerate(transport.pids)]))
    store: EpisodeStore | None = None
    try:
        if config.resume:
            state = load_run_state(state_path, agent, opt, rng)
            if len(state["workers"]) != config.workers:
                raise ValueError(
                    f"ActorLearnerConfig.workers: the run in {run_dir} has {len(state['workers'])} "
                    f"workers, got {config.workers}"
                )
            store = EpisodeStore.open(run_dir / "replay.zarr", mode="a")
            replay = ReplayBuffer.restore(spec, config.obs_keys, n, capacity, store, state["replay"], row_meta)
            transport.set_states(state["workers"])
            collected, version, episodes = int(state["step"]), int(state["version"]), state["episodes"]
            ret, succ = state["running"]["ret"].numpy().copy(), state["running"]["succ"].numpy().copy()
        else:
            store = EpisodeStore.create(run_dir / "replay.zarr", spec)
            replay = ReplayBuffer(spec, config.obs_keys, n, capacity, store, row_meta)
            collected, version, episodes = 0, 0, {"returns": [], "success": []}
            ret, succ = np.zeros(n), np.zeros(n, bool)
        result = learn(
            config,
            spec,
            transport,
            agent,
            opt,
            rng,
            replay,
            demos,
            target_entropy,
            state_path,
            run_dir,
            collected,
            version,
            episodes,
            ret,
            succ,
        )
    finally:
        transport.close()
        if store is not None:
            store.close()
    return result


def learn(
    config: ActorLearnerConfig,
    spec: Spec,
    transport: Any,
    agent: Agent,
    opt: Mapping[str, torch.optim.Optimizer],
    rng: np.random.Generator,
    replay: ReplayBuffer,
    demos: DemoTransitions | None,
    target_entropy: float,
    state_path: Path,
    run_dir: Path,
    collected: int,
    version: int,
    episodes: dict[str, list[Any]],
    ret: np.ndarray,
    succ: np.ndarray,
) -> RLResult:
    """The learner's loop from a barrier (no call in flight) at `collected` transitions and weights `version`."""
    per_worker, chunk = config.num_envs, config.rollout_steps

    def checkpoint() -> None:
        save_run_state(
            state_path,
            collected,
            agent,
            opt,
            rng,
            replay=replay.state(),
            episodes=episodes,
            version=version,
            workers=transport.states(),
            running={"ret": torch.from_numpy(ret.copy()), "succ": torch.from_numpy(succ.copy())},
        )
        actor_policy_of(agent, spec, config).save(run_dir / "policy")

    log = RunLog(run_dir)
    bar = tqdm(
        total=config.total_steps,
        initial=collected,
        desc=f"sac-distributed {config.task}",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    clock = TrainClock()
    stats: dict[str, float] = {}
    weights = transport.publish(actor_weights(agent))
    launched, idle, acting = collected, list(range(config.workers)), {}  # acting: worker -> its weights' version
    barrier, saved_at, staleness = False, -1, []
    try:
        while True:
            while idle and not barrier and launched < config.total_steps:
                w = idle.pop(0)
                explore = launched < config.learning_starts and config.init is None
                transport.submit(w, weights, version, chunk, explore)
                acting[w], launched = version, launched + chunk * per_worker
            if not acting:
                break
            # the gate: before publishing version + 1, every worker acting with an older version than
            # version + 1 - max_staleness is waited for (at max_staleness 0: all of them, the synchronous schedule)
            stale = sorted(w for w, v in acting.items() if v < version + 1 - config.max_staleness)
            before = collected
            for w in sorted(transport.wait(stale)):
                batch, acted = transport.result(w), acting.pop(w)
                rows = np.arange(w * per_worker, (w + 1) * per_worker)
                tags = {"policy_version": np.full(per_worker, acted), "staleness": np.full(per_worker, version - acted)}
                for t in range(chunk):
                    replay.add(
                        {k: v[t] for k, v in batch["obs"].items()},
                        batch["action"][t],
                        batch["reward"][t],
                        batch["terminated"][t],
                        batch["truncated"][t],
                        batch["success"][t],
                        rows,
                        tags,
                    )
                    ret[rows] += batch["reward"][t]
                    succ[rows] |= batch["success"][t]
                    for i in rows[batch["terminated"][t] | batch["truncated"][t]]:
                        episodes["returns"].append(float(ret[i]))
                        episodes["success"].append(bool(succ[i]))
                        ret[i], succ[i] = 0.0, False
                collected += chunk * per_worker
                staleness.append(version - acted)
                idle.append(w)
            idle.sort()
            if collected >= config.learning_starts and (replay.filled >= 2).any():
                for _ in range(config.utd * (collected - before)):
                    stats = update(
                        agent,
                        opt,
                        sample(replay, demos, config, rng),
                        config,
                        target_entropy,
                        f"sac-distributed step {collected} (last train state: {state_path})",
                    )
                version += 1
                weights = transport.publish(actor_weights(agent))
            bar.update(collected - before)
            if collected // config.log_every != before // config.log_every:
                recent = episodes["success"][-20:]
                log.log(
                    collected,
                    **stats,
                    version=version,
                    **{"staleness/max": max(staleness)},
                    **(
                        {
                            "train/success_rate": float(np.mean(recent)),
                            "train/return": float(np.mean(episodes["returns"][-20:])),
                        }
                        if recent
                        else {}
                    ),
                )
                bar.set_postfix(success=f"{np.mean(recent):.2f}" if recent else "-", version=version)
                staleness = []
            clock.evaluate_every(
                config, log, lambda: evaluate(agent, config), collected, before, last=collected >= config.total_steps
            )
            barrier |= collected // config.checkpoint_every != before // config.checkpoint_every
            if barrier and not acting:  # every call is back: the workers' states match the learner's
                checkpoint()
                barrier, saved_at = False, collected
        if saved_at != collected:
            checkpoint()
    finally:
        bar.close()
    seconds = clock.trained()
    return finish_run(
        config,
        log,
        lambda: evaluate(agent, config),
        run_dir / "policy",
        collected,
        seconds,
        run_dir,
        steps_per_second=collected / seconds if seconds > 0 else None,
    )


def actor_weights(agent: Agent) -> dict[str, torch.Tensor]:
    """A copy of the actor's weights: what one version publishes (the learner goes on changing its own)."""
    return {k: v.detach().clone() for k, v in agent.actor.state_dict().items()}


def run_train_sac_distributed(config: ActorLearnerConfig) -> RLResult:
    try:
        result = train(config)
    except WorkerDied as e:
        raise SystemExit(f"robotrl train sac-distributed: error: {e}") from None
    print(
        result.summary(
            f"sac-distributed {config.task} ({config.workers} workers, {config.transport})",
            config.eval_episodes,
            "env steps",
        )
    )
    return result
