"""Training windows from an episode store: observation history + action chunk, gathered a batch at a time.

A sample is anchored at step ``t`` of an episode (every step of every episode is an anchor):

    obs     rows t-To+1 .. t      (To = obs_horizon)
    action  rows t .. t+H-1       (H = action_horizon)

Rows outside the episode repeat the episode's first or last row (the edge padding diffusion-policy and
LeRobot train with) and are flagged in ``obs_is_pad`` / ``action_is_pad``, so a loss can mask them.
A string observation (the language instruction) is constant within an episode and stored in its metadata;
each window carries its episode's string under the same key, ``batch["obs"]["instruction"]`` (B,).
A whole batch is one vectorized fancy-index per key, which is what keeps sampling off the critical path:
in memory for data that fits (the default), or through `ChunkCache` straight from the zarr chunks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch.utils.data

from robotrl.core.spec import STRING, SpecMismatchError
from robotrl.datasets.store import EpisodeStore, string_keys


class Rows(Protocol):
    """An array that can be indexed by an integer array along axis 0 (numpy array, `ChunkCache`)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...

    def __getitem__(self, index: np.ndarray) -> np.ndarray: ...


class ChunkCache:
    """Row gathers from a chunked zarr array that decode each needed chunk once (LRU of `max_chunks`).

    Reading rows one by one from a compressed store decodes a whole chunk per row; grouping a batch's rows by
    chunk and caching decoded chunks makes random windows from disk cheap enough for image training.
    """

    def __init__(self, array: Any, rows: int, max_chunks: int = 256) -> None:
        self.array, self.rows = array, int(rows)
        self.chunk = int(array.chunks[0])
        self.shape = (self.rows, *array.shape[1:])
        self.dtype = array.dtype
        self.max_chunks = max_chunks
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return self.rows

    def _chunk(self, c: int) -> np.ndarray:
        got = self._cache.get(c)
        if got is None:
            got = np.asarray(self.array[c * self.chunk : min((c + 1) * self.chunk, self.rows)])
            self._cache[c] = got
            if len(self._cache) > self.max_chunks:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(c)
        return got

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index)
        flat = index.reshape(-1)
        out = np.empty((len(flat), *self.shape[1:]), dtype=self.dtype)
        chunks = flat // self.chunk
        for c in np.unique(chunks):
            sel = chunks == c
            out[sel] = self._chunk(int(c))[flat[sel] - c * self.chunk]
        return out.reshape(*index.shape, *self.shape[1:])

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers start with an empty cache
        return {**self.__dict__, "_cache": OrderedDict()}


@dataclass
class SequenceConfig:
    """How windows are cut from episodes."""

    obs_horizon: int = 2
    """To: observation history length (current step included)"""
    action_horizon: int = 16
    """H: action chunk length, starting at the current step"""
    obs_keys: tuple[str, ...] | None = None
    """observation keys to return (default: every numeric observation of the spec)"""
    in_memory: bool = True
    """load every needed key into RAM (fast); False reads zarr chunks through an LRU cache"""
    extra_keys: tuple[str, ...] = ()
    """per-step keys returned at the anchor step only (e.g. 'reward', 'intervention')"""
    success_tail: int | None = None
    """anchor windows only up to this many steps after each episode's first success (None: at every step;
    episodes that never succeed keep every step). Success counts at any step of an episode, and what a
    demonstration does after it (holds, drifts) is not what reaching it takes: where demonstrations run on long
    after success, those steps are most windows (the windows still read the actions there, as data)"""

    def __post_init__(self) -> None:
        for name in ("obs_horizon", "action_horizon"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"SequenceConfig.{name}: expected an integer >= 1, got {value!r}")
        tail = self.success_tail
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, (int, np.integer)) or tail < 0):
            raise ValueError(f"SequenceConfig.success_tail: expected None or an integer >= 0, got {tail!r}")


class SequenceSampler:
    """Windows over the episodes of one store (or of in-memory arrays with episode ends)."""

    def __init__(
        self,
        data: Mapping[str, Rows],
        episode_ends: np.ndarray,
        obs_keys: Sequence[str],
        config: SequenceConfig | None = None,
        episodes: Sequence[int] | None = None,
        text: Mapping[str, Sequence[str]] | None = None,
        anchor_ends: np.ndarray | None = None,
    ) -> None:
        """`anchor_ends`: per episode (all of them), the row before which its windows' anchors end (default: the
        episode's end); the windows still read the rows after it."""
        self.config = config or SequenceConfig()
        self.data = dict(data)
        self.obs_keys = tuple(obs_keys)
        self.text = {k: np.asarray(v, dtype=object) for k, v in (text or {}).items()}
        """string observation key -> one string per episode (all episodes, not only the chosen ones)"""
        missing = [k for k in (*self.obs_keys, "action", *self.config.extra_keys) if k not in self.data]
        if missing:
            raise KeyError(f"SequenceSampler: key(s) {missing} not in the data; have {sorted(self.data)}")
        ends = np.asarray(episode_ends, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        chosen = np.arange(len(ends)) if episodes is None else np.asarray(episodes, dtype=np.int64)
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= len(ends)):
            raise IndexError(f"episodes: expected indices in [0, {len(ends)}), got {chosen.min()}..{chosen.max()}")
        for k, v in self.text.items():
            if v.shape != (len(ends),):
                raise ValueError(
                    f"SequenceSampler.text[{k!r}]: expected one string per episode ({len(ends)}), got shape {v.shape}"
                )
        last = ends if anchor_ends is None else np.asarray(anchor_ends, dtype=np.int64)
        if last.shape != ends.shape or np.any(last <= starts) or np.any(last > ends):
            raise ValueError(f"SequenceSampler.anchor_ends: expected one row in (start, end] per episode, got {last}")
        lengths = last[chosen] - starts[chosen]
        # one anchor per step of every chosen episode (up to its anchor end), with its episode's bounds
        self.anchor = (
            np.concatenate([np.arange(starts[e], last[e]) for e in chosen]) if len(chosen) else np.zeros(0, np.int64)
        )
        self.ep_index = np.repeat(chosen, lengths)
        self.ep_start = np.repeat(starts[chosen], lengths)
        self.ep_end = np.repeat(ends[chosen], lengths)
        self._obs_offsets = np.arange(-self.config.obs_horizon + 1, 1)
        self._act_offsets = np.arange(self.config.action_horizon)

    @classmethod
    def from_store(
        cls, store: EpisodeStore, config: SequenceConfig | None = None, episodes: Sequence[int] | None = None
    ) -> SequenceSampler:
        config = config or SequenceConfig()
        numeric = [k for k, v in store.spec.observations.items() if v.dtype != STRING]
        obs_keys = list(config.obs_keys) if config.obs_keys is not None else numeric
        unknown = [k for k in obs_keys if k not in numeric]
        if unknown:
            raise SpecMismatchError(
                f"SequenceConfig.obs_keys: {unknown} not in store {store.path.name}'s numeric observations {numeric}"
            )
        keys = [*obs_keys, "action", *config.extra_keys]
        if config.in_memory:
            data: Mapping[str, Rows] = store.load(keys)
        else:
            data = {k: ChunkCache(store.array(k), store.num_steps) for k in keys}
        text = {k: [meta.get("instruction") or "" for meta in store.episodes] for k in string_keys(store.spec)}
        anchor_ends = None
        if config.success_tail is not None:
            success = np.asarray(store.load(["success"])["success"])
            anchor_ends = success_ends(success, store.episode_ends, config.success_tail)
        return cls(data, store.episode_ends, obs_keys, config, episodes, text, anchor_ends)

    def __len__(self) -> int:
        return len(self.anchor)

    def get(self, index: np.ndarray) -> dict[str, Any]:
        """The windows of anchors `index` (positions in 0..len-1), stacked: obs (B, To, ...), action (B, H, A)."""
        index = np.asarray(index, dtype=np.int64)
        t, lo, hi = self.anchor[index, None], self.ep_start[index, None], self.ep_end[index, None] - 1
        obs_rows = t + self._obs_offsets
        act_rows = t + self._act_offsets
        episode = self.ep_index[index]
        out: dict[str, Any] = {
            "obs": {
                **{k: self.data[k][np.clip(obs_rows, lo, hi)] for k in self.obs_keys},
                **{k: v[episode] for k, v in self.text.items()},
            },
            "action": self.data["action"][np.clip(act_rows, lo, hi)],
            "obs_is_pad": obs_rows < lo,
            "action_is_pad": act_rows > hi,
            "episode": episode,
            "t": (t - lo)[:, 0],
        }
        for k in self.config.extra_keys:
            out[k] = self.data[k][t[:, 0]]
        return out

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        if len(self) == 0:
            raise ValueError("sample: the sampler has no steps (empty store or no episodes selected)")
        return self.get(rng.integers(0, len(self), size=batch_size))


def success_ends(success: np.ndarray, episode_ends: np.ndarray, tail: int) -> np.ndarray:
    """Per episode, the row before which its anchors end: `tail` steps past its first success, within the episode
    (its end where it never succeeds)."""
    ends = np.asarray(episode_ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    out = ends.copy()
    for i, (a, b) in enumerate(zip(starts, ends)):
        hits = np.flatnonzero(success[a:b])
        if len(hits):
            out[i] = min(a + hits[0] + 1 + tail, b)
    return out


class MixedSampler:
    """Batches drawn from several samplers in fixed proportions (e.g. 50/50 demos and online data, as RLPD and
    HIL-SERL train). Each batch holds exactly round(ratio * batch) rows of each source; `source` says which."""

    def __init__(self, samplers: Sequence[SequenceSampler], ratios: Sequence[float]) -> None:
        if len(samplers) != len(ratios) or not samplers:
            raise ValueError(
                f"MixedSampler: expected one ratio per sampler, got {len(samplers)} samplers and {len(ratios)} ratios"
            )
        r = np.asarray(ratios, dtype=np.float64)
        if np.any(r < 0) or r.sum() <= 0:
            raise ValueError(
                f"MixedSampler.ratios: expected non-negative values with a positive sum, got {list(ratios)}"
            )
        first = samplers[0]
        for i, s in enumerate(samplers[1:], 1):
            if (
                s.obs_keys != first.obs_keys
                or s.config.obs_horizon != first.config.obs_horizon
                or s.config.action_horizon != first.config.action_horizon
            ):
                raise SpecMismatchError(
                    f"MixedSampler: sampler {i} windows ({s.obs_keys}, To={s.config.obs_horizon}, "
                    f"H={s.config.action_horizon}) differ from sampler 0's ({first.obs_keys}, "
                    f"To={first.config.obs_horizon}, H={first.config.action_horizon})"
                )
            if sorted(s.text) != sorted(first.text):
                raise SpecMismatchError(
                    f"MixedSampler: sampler {i} has string observations {sorted(s.text)}, sampler 0 "
                    f"has {sorted(first.text)}"
                )
            for k in (*first.obs_keys, "action"):
                a, b = first.data[k], s.data[k]
                if tuple(a.shape[1:]) != tuple(b.shape[1:]) or np.dtype(a.dtype) != np.dtype(b.dtype):
                    raise SpecMismatchError(
                        f"MixedSampler: key {k!r} is {tuple(b.shape[1:])} {b.dtype} in sampler {i} "
                        f"but {tuple(a.shape[1:])} {a.dtype} in sampler 0"
                    )
        self.samplers = list(samplers)
        self.ratios = r / r.sum()

    def counts(self, batch_size: int) -> np.ndarray:
        """Rows per source: largest-remainder rounding, so the counts always sum to `batch_size`."""
        exact = self.ratios * batch_size
        counts = np.floor(exact).astype(np.int64)
        counts[np.argsort(counts - exact)[: batch_size - counts.sum()]] += 1
        return counts

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        parts = [
            (i, s.sample(int(n), rng)) for i, (s, n) in enumerate(zip(self.samplers, self.counts(batch_size))) if n
        ]
        out = concat_batches([p for _, p in parts])
        out["source"] = np.concatenate([np.full(len(p["action"]), i) for i, p in parts])
        return out


def concat_batches(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in batches[0].items():
        if isinstance(value, Mapping):
            out[key] = concat_batches([b[key] for b in batches])
        else:
            out[key] = np.concatenate([b[key] for b in batches])
    return out


# ---------------------------------------------------------------------------------------------------
# torch path
# ---------------------------------------------------------------------------------------------------
class SequenceDataset(torch.utils.data.Dataset):
    """A map-style dataset whose item is a whole batch: indexed with a list of anchors (as a BatchSampler
    yields), each worker does one vectorized gather per batch instead of one Python call per sample."""

    def __init__(self, sampler: SequenceSampler) -> None:
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        return self.sampler.get(np.atleast_1d(np.asarray(index, dtype=np.int64)))


def dataloader(
    sampler: SequenceSampler,
    batch_size: int,
    num_workers: int = 0,
    seed: int = 0,
    drop_last: bool = True,
    **kwargs: Any,
) -> torch.utils.data.DataLoader:
    """A torch DataLoader of shuffled batches (dicts of tensors) over `sampler`'s windows."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    generator = torch.Generator().manual_seed(seed)
    batches = BatchSampler(RandomSampler(range(len(sampler)), generator=generator), batch_size, drop_last)
    return DataLoader(
        SequenceDataset(sampler),
        batch_size=None,
        sampler=batches,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        **kwargs,
    )
