"""The actor/learner split (robotrl train sac-distributed) on real MuJoCo envs, a real episode store and a real Ray
cluster on loopback with two worker processes: the synchronous schedule is the same to the bit in process and on
Ray, asynchronous workers never act with weights more than `max_staleness` versions old and still learn Reach,
every transition is on the store tagged with its worker and env, a dead worker process stops the run with a clear
error, and killed runs resume exactly."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robotrl.datasets import EpisodeStore
from robotrl.envs import make
from robotrl.policies import load
from robotrl.rl.actor_learner import ActorLearnerConfig, WorkerDied, train
from robotrl.rl.replay import ReplayBuffer
from robotrl.rl.sac import Agent, evaluate
from robotrl.training.loop import TRAIN_STATE, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """One local cluster for the module (start-up takes seconds here): 2 CPUs, one per worker process."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="warning")
    yield ray
    ray.shutdown()


def small(run_dir: Path, **overrides: Any) -> ActorLearnerConfig:
    """2 workers x 2 envs, 2 vector steps per call: 480 steps are 120 per env, two whole 60-step episodes each."""
    base = ActorLearnerConfig(
        task="Reach",
        workers=2,
        num_envs=2,
        rollout_steps=2,
        total_steps=480,
        learning_starts=96,
        hidden=(64, 64),
        lr=1e-3,
        eval_episodes=2,
        eval_envs=2,
        checkpoint_every=96,
        log_every=96,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


def curve(run_dir: Path) -> list[dict[str, float]]:
    """metrics.jsonl without the wall-clock columns."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("wall_s", "time/train_seconds")} for row in rows]


def assert_same_run(a: Path, b: Path) -> None:
    """The same final weights and the same transitions on the store, to the bit."""
    wa, wb = (load(d / "policy").state_dict() for d in (a, b))
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)
    sa, sb = EpisodeStore.open(a / "replay.zarr"), EpisodeStore.open(b / "replay.zarr")
    assert sa.num_episodes == sb.num_episodes > 0
    for key in ("state", "action", "reward"):
        np.testing.assert_array_equal(sa.load([key])[key], sb.load([key])[key], err_msg=key)
    assert [e["policy_version"] for e in sa.episodes] == [e["policy_version"] for e in sb.episodes]


def test_synchronous_schedule_is_the_same_in_process_and_on_ray(ray_cluster: Any, tmp_path: Path) -> None:
    """max_staleness=0: the Ray run (two worker processes) and the in-process run give the same learning curve
    with tolerance zero: every logged loss and return, the final weights and every stored transition."""
    local = train(small(tmp_path / "local"))
    remote = train(small(tmp_path / "ray", transport="ray"))
    pids = {w["pid"] for w in json.loads((tmp_path / "ray" / "workers.json").read_text())}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, neither of them the learner
    assert local.steps == remote.steps == 480
    assert curve(tmp_path / "local") == curve(tmp_path / "ray")
    logged = [row for row in curve(tmp_path / "ray") if "version" in row]  # and a final evaluation row
    assert [row["step"] for row in logged] == [96, 192, 288, 384, 480]
    assert logged[-1]["version"] == (480 - 96) // 8 + 1  # one version per round of 2 x 2 x 2 transitions from step 96
    assert_same_run(tmp_path / "local", tmp_path / "ray")

    # every transition is on the store, tagged with its worker and env; synchronous: never a stale one
    store = EpisodeStore.open(tmp_path / "ray" / "replay.zarr")
    assert store.num_steps == 480 and store.num_episodes == 8
    tags = sorted((e["worker"], e["worker_env"], e["env"]) for e in store.episodes)
    assert tags == [(0, 0, 0), (0, 0, 0), (0, 1, 1), (0, 1, 1), (1, 0, 2), (1, 0, 2), (1, 1, 3), (1, 1, 3)]
    assert all(
        len(e["policy_version"]) == len(e["staleness"]) == 60 and set(e["staleness"]) == {0} for e in store.episodes
    )
    states = {e["env"]: store.episode(e["index"], ["state"]).data["state"] for e in store.episodes}
    assert len({s.tobytes() for s in states.values()}) == 4  # four distinct envs, not copies of one


@pytest.mark.learning
def test_asynchronous_workers_stay_within_the_staleness_bound_and_learn(
    ray_cluster: Any, reach_demos: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """max_staleness=2 on Ray: every stored transition's policy version is at most 2 behind the learner's newest
    when it reached the learner (an upper bound on its staleness when acted), some are behind (the workers do
    run ahead of the learner), and RLPD still takes Reach from the untrained actor to >= 40% in 2,000 env steps
    with 20 noisy demonstrations, as the one-process run does (bench/RESULTS.md, "Learning tests: thresholds
    against their spread over seeds"). Each worker steps 2 envs 4 times a call: 250 calls and weight versions, not
    2,000."""
    cfg = ActorLearnerConfig(
        task="Reach",
        workers=2,
        num_envs=2,
        rollout_steps=4,
        max_staleness=2,
        transport="ray",
        total_steps=2000,
        learning_starts=200,
        demos=reach_demos,
        eval_episodes=40,
        eval_envs=20,
        run_dir=tmp_path / "async",
        progress=False,
        seed=learning_seed,
    )
    torch.manual_seed(learning_seed)
    start = evaluate(Agent(23, 3, -torch.ones(3), torch.ones(3), cfg), cfg).success_rate
    result = train(cfg)
    store = EpisodeStore.open(tmp_path / "async" / "replay.zarr")
    staleness = np.concatenate([e["staleness"] for e in store.episodes])
    filled = load_train_state(tmp_path / "async" / TRAIN_STATE)["replay"]["filled"].numpy()
    assert filled.sum() == 2000 and len(staleness) == store.num_steps == (filled // 60 * 60).sum()  # all but unfinished
    assert staleness.max() <= 2 and (staleness > 0).mean() > 0.1, np.bincount(staleness)
    for env in (0, 2):  # a worker's weights never go back to an older version (an env of each worker)
        versions = np.concatenate([e["policy_version"] for e in store.episodes if e["env"] == env])
        assert (np.diff(versions) >= 0).all() and versions[-1] > 100
    assert result.success_rate is not None
    claim("asynchronous RLPD success", result.success_rate, lower=0.4, start=start)
    claim("asynchronous RLPD gain", result.success_rate - start, lower=0.3)


def test_a_dead_worker_process_is_a_clear_error_and_the_run_resumes_exactly(ray_cluster: Any, tmp_path: Path) -> None:
    """A Ray worker SIGKILLed mid-run stops the run with WorkerDied naming the worker and the train state (not a
    hang); resumed on fresh worker processes, the synchronous run ends identical to one never stopped."""
    cfg = small(tmp_path / "died", transport="ray")
    killed: list[int] = []

    def kill_worker_after_first_train_state() -> None:
        deadline = time.monotonic() + 120
        while not (cfg.run_dir / TRAIN_STATE).exists() and time.monotonic() < deadline:  # type: ignore[operator]
            time.sleep(0.01)
        pid = json.loads((cfg.run_dir / "workers.json").read_text())[1]["pid"]  # type: ignore[operator]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_worker_after_first_train_state)
    killer.start()
    with pytest.raises(
        WorkerDied, match=r"rollout worker 1 \(Ray actor, pid \d+\) died .*train_state.safetensors.*--resume"
    ):
        train(cfg)
    killer.join()
    assert killed and load_train_state(tmp_path / "died" / TRAIN_STATE)["step"] < 480
    train(replace(cfg, resume=True))
    train(small(tmp_path / "straight"))  # in process: the synchronous schedule is the same on both transports
    assert_same_run(tmp_path / "straight", tmp_path / "died")
    assert curve(tmp_path / "straight")[-1] == curve(tmp_path / "died")[-1]


def test_killed_asynchronous_run_resumes_exactly(tmp_path: Path, kill_after_first_train_state: Any) -> None:
    """`robotrl train sac-distributed` (in process, max_staleness=1: results first in, first out, a deterministic
    schedule) is SIGKILLed after its first train state; --resume ends with the weights and store of a run never
    stopped. Train states are taken at a barrier, so the workers' envs and RNGs match the learner's."""
    cfg = small(tmp_path / "killed", max_staleness=1)
    args = [
        str(ROBOTRL),
        "train",
        "sac-distributed",
        "--task",
        "Reach",
        "--workers",
        "2",
        "--num-envs",
        "2",
        "--rollout-steps",
        "2",
        "--max-staleness",
        "1",
        "--total-steps",
        "480",
        "--learning-starts",
        "96",
        "--hidden",
        "64",
        "64",
        "--lr",
        "1e-3",
        "--eval-episodes",
        "2",
        "--eval-envs",
        "2",
        "--checkpoint-every",
        "96",
        "--log-every",
        "96",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
    assert 96 <= step < 480, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed")
    staleness = np.concatenate(
        [e["staleness"] for e in EpisodeStore.open(tmp_path / "killed" / "replay.zarr").episodes]
    )
    assert set(staleness) == {0, 1}  # asynchronous: workers acted one version behind, never two


def test_replay_rows_fill_at_their_own_rates_with_tags_and_rebuild_exactly(tmp_path: Path) -> None:
    """The learner's replay: two envs stepped at different rates (as asynchronous workers deliver) each fill their
    own row, samples are true (obs, next obs) pairs of one env, per-step tags reach each episode's metadata, and
    the buffer is rebuilt exactly from its store and state, unfinished steps and tags included."""
    envs = [make("Reach", num_envs=1, seed=i, episode_steps=5) for i in range(2)]
    store = EpisodeStore.create(tmp_path / "replay.zarr", envs[0].task_spec)
    meta = [{"env": i, "worker": i, "worker_env": 0} for i in range(2)]
    buffer = ReplayBuffer(envs[0].task_spec, ("state",), 2, 40, store, meta)
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    rng, successor = np.random.default_rng(0), {}

    def step(i: int, version: int) -> None:
        action = rng.uniform(-1, 1, (1, 3)).astype(np.float32)
        nxt, reward, term, trunc, info = envs[i].step(action)
        buffer.add(obs[i], action, reward, term, trunc, info["success"], rows=[i], tags={"policy_version": [version]})
        if not trunc[0]:
            successor[obs[i]["state"][0].astype(np.float32).tobytes()] = nxt["state"][0].astype(np.float32)
        obs[i] = nxt

    for it in range(13):  # env 0 steps every time, env 1 every other time
        for i in (0, 1) if it % 2 == 0 else (0,):
            step(i, it)
    assert buffer.filled.tolist() == [13, 7] and len(buffer) == 20 and buffer.steps == 7
    batch = buffer.sample(500, rng)
    for o, n in zip(batch["obs"].numpy(), batch["next_obs"].numpy()):
        np.testing.assert_array_equal(n, successor[o.tobytes()])
    assert [(e["env"], e["policy_version"]) for e in store.episodes] == [
        (0, [0, 1, 2, 3, 4]),
        (1, [0, 2, 4, 6, 8]),
        (0, [5, 6, 7, 8, 9]),
    ]
    state = buffer.state()
    snapshot = {k: getattr(buffer, k).copy() for k in ("obs", "action", "reward", "terminated", "truncated")}
    for it in range(13, 20):
        step(0, it)  # goes on past the state, then dies
    store.close()
    store = EpisodeStore.open(tmp_path / "replay.zarr", mode="a")
    rebuilt = ReplayBuffer.restore(envs[0].task_spec, ("state",), 2, 40, store, state, meta)
    assert rebuilt.filled.tolist() == [13, 7] and store.num_episodes == 3
    for k, want in snapshot.items():
        np.testing.assert_array_equal(getattr(rebuilt, k)[0, :13], want[0, :13], err_msg=k)
        np.testing.assert_array_equal(getattr(rebuilt, k)[1, :7], want[1, :7], err_msg=k)
    assert rebuilt.tags == [{"policy_version": [10, 11, 12]}, {"policy_version": [10, 12]}]
    assert [len(w) for w in rebuilt.writers] == [3, 2] and rebuilt.writers[1].meta["worker"] == 1
    store.close()


def test_bad_configs_name_the_field(tmp_path: Path) -> None:
    for field, value, expected in (
        ("workers", 0, r"expected >= 1, got 0"),
        ("rollout_steps", 0, r"expected >= 1"),
        ("max_staleness", -1, r"expected >= 0, got -1"),
        ("transport", "tcp", r"expected 'local' or 'ray', got 'tcp'"),
        ("ray_address", "127.0.0.1:6379", r"only used with transport='ray'"),
    ):
        with pytest.raises(ValueError, match=rf"ActorLearnerConfig\.{field}: {expected}"):
            small(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=r"ActorLearnerConfig.obs_keys: \['nope'\] are not numeric state observations"):
        train(small(tmp_path / "keys", obs_keys=("nope",)))
    train(small(tmp_path / "once", total_steps=16, learning_starts=8, checkpoint_every=8))
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(small(tmp_path / "once", total_steps=16))
    with pytest.raises(
        ValueError,
        match=r"ActorLearnerConfig.resume: .*config.json records other settings \(.*"
        r"workers: run has 2, given 3\)",
    ):
        train(small(tmp_path / "once", total_steps=16, workers=3, resume=True))
    with pytest.raises(ValueError, match=r"ActorLearnerConfig.workers: the run in .* has 2 workers, got 3"):
        train(
            small(
                tmp_path / "once",
                total_steps=16,
                learning_starts=8,
                workers=3,
                resume=True,
                resume_changes=("workers",),
            )
        )  # allowed to differ, yet a replay per worker cannot be remade
