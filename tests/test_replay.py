"""The replay buffer on the episode store: transitions are true (obs, next obs) pairs of real env rollouts, a
time-limit cut is never bootstrapped through the next episode's first observation, and a buffer is rebuilt
exactly from its store and train state."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.envs import make
from robotrl.rl.replay import DemoTransitions, ReplayBuffer


def rollout(
    buffer: ReplayBuffer,
    env: object,
    obs: dict,
    steps: int,
    rng: np.random.Generator,
    pairs: dict[bytes, tuple[np.ndarray, bool, bool]],
) -> dict:
    """Random actions; `pairs` maps each obs to (its true successor, terminated, truncated)."""
    for _ in range(steps):
        action = rng.uniform(-1, 1, (env.num_envs, 3)).astype(np.float32)  # type: ignore[attr-defined]
        nxt, reward, term, trunc, info = env.step(action)  # type: ignore[attr-defined]
        buffer.add(obs, action, reward, term, trunc, info["success"])
        for i in range(env.num_envs):  # type: ignore[attr-defined]
            true_next = info["final_obs"]["state"][i] if (term[i] or trunc[i]) else nxt["state"][i]
            pairs[obs["state"][i].astype(np.float32).tobytes()] = (
                true_next.astype(np.float32),
                bool(term[i]),
                bool(trunc[i]),
            )
        obs = nxt
    return obs


def test_samples_are_true_transitions_and_skip_time_limit_cuts(tmp_path: Path) -> None:
    env = make("Reach", num_envs=3, seed=0, episode_steps=7)
    store = EpisodeStore.create(tmp_path / "replay.zarr", env.task_spec)
    buffer = ReplayBuffer(env.task_spec, ("state",), 3, 100, store)
    rng, pairs = np.random.default_rng(0), {}
    obs, _ = env.reset(seed=0)
    rollout(buffer, env, obs, 40, rng, pairs)
    batch = buffer.sample(4000, rng)
    truncated_seen = 0
    for o, n, done in zip(batch["obs"].numpy(), batch["next_obs"].numpy(), batch["done"].numpy()):
        true_next, term, trunc = pairs[o.tobytes()]
        assert not trunc, "a step cut by the time limit has no stored successor and must not be sampled"
        np.testing.assert_array_equal(n, true_next)
        assert done == float(term)
    truncated_seen = sum(t for _, _, t in pairs.values())
    assert truncated_seen >= 3 * 5  # 40 steps of 7-step episodes: the rule was exercised
    assert store.num_episodes == 3 * (40 // 7) and {e["env"] for e in store.episodes} == {0, 1, 2}
    env.close()


def test_rebuilt_from_store_and_state_exactly(tmp_path: Path) -> None:
    env = make("Reach", num_envs=2, seed=1, episode_steps=9)
    store = EpisodeStore.create(tmp_path / "replay.zarr", env.task_spec)
    buffer = ReplayBuffer(env.task_spec, ("state",), 2, 100, store)
    rng = np.random.default_rng(1)
    obs, _ = env.reset(seed=1)
    obs = rollout(buffer, env, obs, 31, rng, {})
    state = buffer.state()
    snapshot = {
        k: getattr(buffer, k)[:, : buffer.steps].copy() for k in ("obs", "action", "reward", "terminated", "truncated")
    }
    rollout(buffer, env, obs, 30, rng, {})  # the run goes on past its checkpoint, then dies
    assert store.num_episodes > state["episodes"]
    store.close()
    store = EpisodeStore.open(tmp_path / "replay.zarr", mode="a")
    rebuilt = ReplayBuffer.restore(env.task_spec, ("state",), 2, 100, store, state)
    assert rebuilt.steps == 31 and store.num_episodes == state["episodes"]
    for k, want in snapshot.items():
        np.testing.assert_array_equal(getattr(rebuilt, k)[:, :31], want, err_msg=k)
    assert [len(w) for w in rebuilt.writers] == [31 % 9, 31 % 9]  # the unfinished episodes are back in the writers
    store.close()
    env.close()


def test_demo_transitions_stop_at_episode_ends(tmp_path: Path) -> None:
    store = record_expert(tmp_path / "demos.zarr", "Reach", episodes=4, num_envs=4, progress=False, episode_steps=10)
    store.close()
    spec = EpisodeStore.open(tmp_path / "demos.zarr").spec
    demos = DemoTransitions(tmp_path / "demos.zarr", spec, ("state",))
    data = EpisodeStore.open(tmp_path / "demos.zarr").load(["state"])["state"]
    batch = demos.sample(500, np.random.default_rng(0))
    index = {row.tobytes(): k for k, row in enumerate(data.astype(np.float32))}
    for o, n in zip(batch["obs"].numpy(), batch["next_obs"].numpy()):
        k = index[o.tobytes()]
        assert k % 10 != 9, "the last step of a time-limited demo has no successor"
        np.testing.assert_array_equal(n, data[k + 1])
