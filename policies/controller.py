"""Running a chunk policy step by step in a vector env: per-env observation history and receding-horizon
execution of action chunks (predict H actions, execute the first `execute`, predict again).

It needs nothing but an `act(obs_history) -> (B, H, A)` callable, so a torch policy and an exported runtime
policy run through the very same loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


class ChunkController:
    """Callable on batched observations (one step, all envs) -> actions (n, A); call `reset_env(i)` when env i
    starts a new episode (its history restarts from the next observation, and its chunk is dropped)."""

    def __init__(
        self,
        act: Callable[[dict[str, Any]], np.ndarray],
        obs_keys: tuple[str, ...],
        obs_horizon: int,
        execute: int,
        text_keys: tuple[str, ...] = (),
    ) -> None:
        if execute < 1:
            raise ValueError(f"execute: expected >= 1 actions per chunk, got {execute}")
        self.act, self.obs_keys, self.obs_horizon, self.execute = act, obs_keys, obs_horizon, execute
        self.text_keys = text_keys
        self.history: dict[str, np.ndarray] = {}
        self.chunk: np.ndarray | None = None
        self.cursor = np.zeros(0, dtype=np.int64)
        self.fresh = np.zeros(0, dtype=bool)

    def reset(self, num_envs: int) -> None:
        self.history, self.chunk = {}, None
        self.cursor = np.full(num_envs, self.execute, dtype=np.int64)  # every env needs a new chunk
        self.fresh = np.ones(num_envs, dtype=bool)

    def reset_env(self, i: int) -> None:
        if len(self.cursor) > i:
            self.cursor[i] = self.execute
            self.fresh[i] = True

    def _push(self, obs: Mapping[str, Any]) -> None:
        for k in self.obs_keys:
            x = np.asarray(obs[k])
            if k not in self.history:
                self.history[k] = np.repeat(x[:, None], self.obs_horizon, axis=1)
            else:
                h = self.history[k]
                h[:, :-1] = h[:, 1:]
                h[:, -1] = x
            # an env that just started repeats its first frame, as training pads the start of an episode
            self.history[k][self.fresh] = x[self.fresh, None]
        self.fresh[:] = False

    def __call__(self, obs: Mapping[str, Any]) -> np.ndarray:
        n = len(np.asarray(obs[self.obs_keys[0]]))
        if len(self.cursor) != n:
            self.reset(n)
        self._push(obs)
        need = self.cursor >= self.execute
        if need.any():
            window = {k: v for k, v in self.history.items()}
            window.update({k: np.asarray(obs[k]) for k in self.text_keys})
            chunk = np.asarray(self.act(window))
            if self.chunk is None:
                self.chunk = chunk
            else:
                self.chunk[need] = chunk[need]
            self.cursor[need] = 0
        assert self.chunk is not None
        actions = self.chunk[np.arange(n), self.cursor]
        self.cursor += 1
        return actions
