"""Replay for off-policy RL, kept on the dataset store: every transition a run collects is on disk, in the same
episode format as demonstrations, and a killed run rebuilds its buffer exactly from the store.

Layout. The online buffer holds one row per env, one column per vector step: env i's step t is (obs, action,
reward, terminated, truncated) at [i, t], and its successor observation is [i, t + 1]. Because every env steps
at every vector step, env i's episodes laid end to end on disk *are* row i, so the buffer is rebuilt from the
store (episodes tagged with their env) plus the few steps of each env's unfinished episode (kept in the train
state). Envs of asynchronous rollout workers step at their own rates (`add(..., rows=...)`): each row then
fills on its own, and row i is still env i's steps in order. Sampling is uniform over transitions with a known
successor:

- a step that ended its episode by termination needs none (no bootstrap);
- a step cut by the time limit would need the final observation, which auto-reset replaces with the next
  episode's first one: it is skipped, in memory as on reload, so the run learns from exactly what is on disk;
- the newest column has no successor yet.

Demonstrations (RLPD) are the same transitions over a store's episodes (`DemoTransitions`), sampled alongside.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robotrl.core.spec import Spec, flatten_obs
from robotrl.datasets import EpisodeStore

STEP_KEYS = ("action", "reward", "terminated", "truncated")


def split_obs_keys(
    spec: Spec, keys: Sequence[str], where: str, images: bool = True
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(numeric keys, image keys) of the observations an actor-critic reads; anything else (and image keys
    where `images` is False) is an error naming `where` (the config field)."""
    numeric = [k for k, v in spec.observations.items() if not v.is_image and v.dtype != "string"]
    allowed = numeric + ([k for k, v in spec.observations.items() if v.is_image] if images else [])
    bad = [k for k in keys if k not in allowed]
    if bad or not keys:
        kind = "numeric or image" if images else "numeric state"
        raise ValueError(
            f"{where}: {bad or list(keys)} are not {kind} observations of {spec.task}; expected some of {allowed}"
        )
    return tuple(k for k in keys if k in numeric), tuple(k for k in keys if k not in numeric)


def batch_tensors(
    obs: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
    done: np.ndarray,
    next_obs: np.ndarray,
    images: Mapping[str, np.ndarray] | None = None,
    next_images: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """A batch of transitions as tensors; image observations stay uint8 (`images`, `next_images`: key -> (B, H,
    W, 3)) until the learner's encoder."""
    out: dict[str, Any] = {
        "obs": torch.from_numpy(obs),
        "action": torch.from_numpy(action.astype(np.float32)),
        "reward": torch.from_numpy(reward.astype(np.float32)),
        "done": torch.from_numpy(done.astype(np.float32)),
        "next_obs": torch.from_numpy(next_obs),
    }
    if images:
        out["images"] = {k: torch.from_numpy(v) for k, v in images.items()}
        out["next_images"] = {k: torch.from_numpy(v) for k, v in (next_images or {}).items()}
    return out


def _sample_valid(valid_count: int, draw: Any, is_valid: Any, batch: int) -> np.ndarray:
    """Uniform over valid indices by rejection (invalid ones are one step in an episode's length)."""
    if valid_count == 0:
        raise RuntimeError("replay: no transition to sample yet")
    out = np.empty(0, dtype=np.int64)
    while len(out) < batch:
        k = draw(batch)
        out = np.concatenate([out, k[is_valid(k)]])
    return out[:batch]


class ReplayBuffer:
    """Online transitions of `num_envs` envs, kept in memory for sampling and written to an episode store."""

    def __init__(
        self,
        spec: Spec,
        obs_keys: Sequence[str],
        num_envs: int,
        capacity_steps: int,
        store: EpisodeStore | None = None,
        row_meta: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """`row_meta`: each env's episode metadata on the store (default `{"env": i}`; "env" is the row). Image
        keys among `obs_keys` are kept as uint8 frames beside the flattened numeric ones."""
        self.obs_keys, self.num_envs, self.capacity = tuple(obs_keys), num_envs, capacity_steps
        self.vector_keys, self.image_keys = split_obs_keys(spec, obs_keys, "replay obs_keys")
        dim = sum(int(np.prod(spec.observations[k].shape)) for k in self.vector_keys)
        n, t = num_envs, capacity_steps
        self.obs = np.zeros((n, t, dim), np.float32)
        self.images = {k: np.zeros((n, t, *spec.observations[k].shape), np.uint8) for k in self.image_keys}
        self.action = np.zeros((n, t, *spec.action.shape), np.float32)
        self.reward = np.zeros((n, t), np.float32)
        self.terminated = np.zeros((n, t), bool)
        self.truncated = np.zeros((n, t), bool)
        self.filled = np.zeros(n, np.int64)  # steps held per row
        self.store = store
        meta = list(row_meta) if row_meta is not None else [{"env": i} for i in range(n)]
        if len(meta) != n:
            raise ValueError(f"replay: expected episode metadata for {n} envs, got {len(meta)}")
        self.writers = [store.writer(source="policy", **m) for m in meta] if store is not None else []
        self.tags: list[dict[str, list[Any]]] = [{} for _ in range(n)]  # per-step tags of each unfinished episode

    @property
    def steps(self) -> int:
        """Columns filled in every row (all of them when the envs step together)."""
        return int(self.filled.min())

    def __len__(self) -> int:
        return int(self.filled.sum())

    def add(
        self,
        obs: Mapping[str, Any],
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        success: np.ndarray,
        rows: np.ndarray | None = None,
        tags: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """One vector step of the envs in `rows` (default: all; the arrays hold those envs in that order): `obs`
        is what `action` was chosen from (before any auto-reset of this step). `tags` are per-env values kept
        per step in each episode's metadata on the store (e.g. the policy version that chose the action)."""
        rows = np.arange(self.num_envs) if rows is None else np.asarray(rows, np.int64)
        t = self.filled[rows]
        if (t >= self.capacity).any():
            raise RuntimeError(f"replay: capacity of {self.capacity} steps per env reached")
        self.obs[rows, t] = flatten_obs(obs, self.vector_keys, len(rows))
        for k, frames in self.images.items():
            frames[rows, t] = obs[k]
        self.action[rows, t] = action
        self.reward[rows, t], self.terminated[rows, t], self.truncated[rows, t] = reward, terminated, truncated
        self.filled[rows] += 1
        for j, i in enumerate(rows.tolist()):
            for key, values in (tags or {}).items():
                self.tags[i].setdefault(key, []).append(np.asarray(values[j]).item())
            done = bool(terminated[j] or truncated[j])
            if self.writers:
                w = self.writers[i]
                w.add(
                    {k: np.asarray(obs[k][j]) for k in w.store.spec.observations},
                    np.asarray(action[j]),
                    float(reward[j]),
                    bool(terminated[j]),
                    bool(truncated[j]),
                    bool(success[j]),
                )
                if done:
                    w.finalize(**self.tags[i])
            if done:
                self.tags[i] = {}

    def _valid(self, flat: np.ndarray) -> np.ndarray:
        i, t = flat % self.num_envs, flat // self.num_envs
        return (t < self.filled[i] - 1) & ~(self.truncated[i, t] & ~self.terminated[i, t])

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """`batch` transitions uniformly from those with a known successor."""
        rows_full = self.num_envs * int(self.filled.max())  # candidates (i, t) of the longest row; the rest rejected
        k = _sample_valid(
            int(np.maximum(self.filled - 1, 0).sum()), lambda b: rng.integers(0, rows_full, b), self._valid, batch
        )
        i, t = k % self.num_envs, k // self.num_envs
        return batch_tensors(
            self.obs[i, t],
            self.action[i, t],
            self.reward[i, t],
            self.terminated[i, t],
            self.obs[i, t + 1],
            {k: v[i, t] for k, v in self.images.items()},
            {k: v[i, t + 1] for k, v in self.images.items()},
        )

    # --- resume -------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What the train state keeps besides the store: the step counts, how many episodes the store had, and
        each env's unfinished episode with its tags (tensors: no pickle)."""
        assert self.store is not None, "replay: a buffer without a store cannot be resumed"
        return {
            "steps": self.steps,
            "filled": torch.from_numpy(self.filled.copy()),
            "episodes": self.store.num_episodes,
            "unfinished": [
                {
                    k: torch.from_numpy(np.ascontiguousarray(v))
                    for k, v in w.unfinished().items()
                    if k in self._resume_keys
                }
                for w in self.writers
            ],
            "tags": [{k: torch.tensor(v) for k, v in t.items()} for t in self.tags],
        }

    @property
    def _resume_keys(self) -> tuple[str, ...]:
        assert self.store is not None
        return (*self.store.spec.observations, *STEP_KEYS, "success")

    @classmethod
    def restore(
        cls,
        spec: Spec,
        obs_keys: Sequence[str],
        num_envs: int,
        capacity_steps: int,
        store: EpisodeStore,
        state: Mapping[str, Any],
        row_meta: Sequence[Mapping[str, Any]] | None = None,
    ) -> ReplayBuffer:
        """The buffer of a killed run, from its store and `state()`: episodes the store got after that state was
        saved are dropped (the resumed run records them again), env i's episodes in order fill row i, and the
        unfinished steps go back into row i and into env i's writer."""
        unfinished = state["unfinished"]
        if len(unfinished) != num_envs:
            raise ValueError(f"replay restore: expected {num_envs} envs' unfinished episodes, got {len(unfinished)}")
        filled = state["filled"].numpy() if "filled" in state else np.full(num_envs, int(state["steps"]))
        store.truncate(int(state["episodes"]))
        buf = cls(spec, obs_keys, num_envs, capacity_steps, store, row_meta)
        buf.tags = [{k: v.tolist() for k, v in t.items()} for t in state.get("tags", buf.tags)]
        cols = [0] * num_envs
        for index, meta in enumerate(store.episodes):
            i = int(meta["env"])
            buf._fill(i, cols[i], store.episode(index, [*obs_keys, *STEP_KEYS]).data)
            cols[i] += int(meta["length"])
        for i, tail in enumerate(unfinished):
            tail = {k: v.numpy() for k, v in tail.items()}
            buf._fill(i, cols[i], tail)
            if cols[i] + len(tail["action"]) != filled[i]:
                raise ValueError(
                    f"replay restore: env {i} has {cols[i]} stored + {len(tail['action'])} unfinished "
                    f"steps, expected {filled[i]} (is {store.path} this run's store?)"
                )
            for s in range(len(tail["action"])):
                buf.writers[i].add(
                    {k: tail[k][s] for k in store.spec.observations},
                    tail["action"][s],
                    float(tail["reward"][s]),
                    bool(tail["terminated"][s]),
                    bool(tail["truncated"][s]),
                    bool(tail["success"][s]),
                )
        buf.filled[:] = filled
        return buf

    def _fill(self, i: int, col: int, data: Mapping[str, np.ndarray]) -> None:
        n = len(data["action"])
        if n == 0:
            return
        self.obs[i, col : col + n] = flatten_obs({k: data[k] for k in self.vector_keys}, self.vector_keys, n)
        for k, frames in self.images.items():
            frames[i, col : col + n] = data[k]
        self.action[i, col : col + n] = data["action"]
        self.reward[i, col : col + n] = data["reward"]
        self.terminated[i, col : col + n] = data["terminated"]
        self.truncated[i, col : col + n] = data["truncated"]


def returns_to_go(reward: np.ndarray, last: np.ndarray, gamma: float) -> np.ndarray:
    """Monte-Carlo discounted return from every step to the end of its episode (`last` marks episode ends), with
    nothing bootstrapped past an end: the episode's true return where it terminated, and where the time limit
    cut it the return over its remaining steps (truncated, as Cal-QL's reference code does)."""
    out = np.empty(len(reward), np.float64)
    g = 0.0
    for t in range(len(reward) - 1, -1, -1):
        g = float(reward[t]) + (0.0 if last[t] else gamma * g)
        out[t] = g
    return out.astype(np.float32)


class DemoTransitions:
    """Transitions of a store's episodes (demonstrations), sampled alongside the online buffer (RLPD). With
    `mc_gamma`, every transition also carries its Monte-Carlo return-to-go (`batch["mc_return"]`, Cal-QL)."""

    def __init__(self, path: Path | str, spec: Spec, obs_keys: Sequence[str], mc_gamma: float | None = None) -> None:
        store = EpisodeStore.open(path)
        store.check_spec(spec, "the task's spec")
        data = store.load([*obs_keys, *STEP_KEYS])
        vector_keys, image_keys = split_obs_keys(spec, obs_keys, "demos obs_keys")
        self.obs = flatten_obs({k: data[k] for k in vector_keys}, vector_keys, len(data["action"]))
        self.images = {k: np.asarray(data[k], np.uint8) for k in image_keys}
        self.action = data["action"].astype(np.float32)
        self.reward = data["reward"].astype(np.float32)
        self.terminated = data["terminated"].astype(bool)
        last = np.zeros(len(self.action), bool)
        last[np.asarray(store.episode_ends) - 1] = True
        self.valid = ~last | self.terminated  # an episode's last step has a successor only if it terminated
        self.mc_return = returns_to_go(self.reward, last, mc_gamma) if mc_gamma is not None else None
        self.episodes = store.num_episodes
        store.close()

    def __len__(self) -> int:
        return len(self.action)

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        k = _sample_valid(
            int(self.valid.sum()), lambda b: rng.integers(0, len(self), b), lambda k: self.valid[k], batch
        )
        nxt = np.minimum(k + 1, len(self) - 1)
        out = batch_tensors(
            self.obs[k],
            self.action[k],
            self.reward[k],
            self.terminated[k],
            self.obs[nxt],
            {key: v[k] for key, v in self.images.items()},
            {key: v[nxt] for key, v in self.images.items()},
        )
        if self.mc_return is not None:
            out["mc_return"] = torch.from_numpy(self.mc_return[k])
        return out
