"""Executing action chunks on one robot, one control step at a time: receding horizon or temporal ensembling,
with inference either in the control loop or in a worker thread that the loop never waits for.

    executor = ChunkExecutor(policy.act, policy.obs_keys, policy.obs_horizon, ExecutionConfig(execute=8))
    action = executor.step(obs)      # every control period; None: no chunk covers this step yet (hold)

Receding horizon (the default, as the policy was evaluated in simulation): predict H actions, execute the first
`execute`, predict again. Temporal ensembling (ACT, `ensemble_decay`): predict every step and execute the
weighted mean of every chunk's action for this step, weights exp(-decay * i) with i = 0 the oldest chunk --
smoother motion at the price of one inference per step.

Asynchronous inference (`asynchronous`): a slow policy (a 10-step teacher, a VLA) must not stall the control
loop, so inference runs in a worker thread and the robot keeps executing the current chunk meanwhile. The new
chunk is requested `delay_steps` before the current one runs out and is aligned in time (VLASH): it is
predicted for the state the robot will be in when it starts -- the last observation rolled forward through the
actions still to be executed before then (`roll_forward`, supplied by the task adapter) -- and its first action
is executed at that step, not at the step the request was made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np


def resample_chunk(chunk: np.ndarray, ratio: float, deltas: np.ndarray) -> np.ndarray:
    """A chunk (H, A) of a policy trained at one control rate, for a robot at `ratio` times that rate: one action
    per robot period over the chunk's span. Positions are linearly interpolated between the policy's steps; the
    elements that are per-step displacements (`deltas`, (A,) bool: an ee_delta action's motion) are the motion the
    policy's steps make within each robot period (a policy step's displacement spread evenly over its time), so the
    chunk moves as far at any rate."""
    chunk = np.asarray(chunk, dtype=np.float32)
    horizon, steps = len(chunk), max(1, round(len(chunk) * ratio))
    at = np.minimum(np.arange(steps) / ratio, horizon - 1)  # each robot step's time, in policy steps
    low = np.floor(at).astype(np.int64)
    high = np.minimum(low + 1, horizon - 1)
    frac = (at - low)[:, None].astype(np.float32)
    out = (1.0 - frac) * chunk[low] + frac * chunk[high]
    if deltas.any():
        moves = chunk[:, deltas].astype(np.float64)
        done = np.vstack([np.zeros((1, moves.shape[1])), np.cumsum(moves, axis=0)])  # motion before each step

        def travelled(t: np.ndarray) -> np.ndarray:  # the motion made by time t (policy steps), within the chunk
            t = np.clip(t, 0.0, horizon)
            k = np.minimum(np.floor(t).astype(np.int64), horizon - 1)
            return done[k] + (t - k)[:, None] * moves[k]

        edges = np.arange(steps + 1) / ratio
        out[:, deltas] = (travelled(edges[1:]) - travelled(edges[:-1])).astype(np.float32)
    return out


#: history (To frames per key) and the actions (d, A) still to run before the predicted chunk starts -> the
#: history as it will be then
RollForward = Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]]


@dataclass
class ExecutionConfig:
    execute: int = 8
    """receding horizon: actions executed from each chunk before the next one takes over"""
    ensemble_decay: float | None = None
    """temporal ensembling with this decay (ACT uses 0.01); None: receding horizon"""
    asynchronous: bool = False
    """run inference in a worker thread; the control loop never waits for it"""
    delay_steps: int = 1
    """asynchronous: control steps an inference is expected to take; the chunk is predicted for the state that
    many steps ahead and starts there"""
    frame_stride: int = 1
    """control steps between the observation frames the policy sees (a policy trained at a rate this many times
    slower than the robot's sees its frames as far apart as in training)"""

    def __post_init__(self) -> None:
        if self.execute < 1:
            raise ValueError(f"ExecutionConfig.execute: expected >= 1, got {self.execute}")
        if self.ensemble_decay is not None and not (self.ensemble_decay >= 0 and np.isfinite(self.ensemble_decay)):
            raise ValueError(f"ExecutionConfig.ensemble_decay: expected a finite decay >= 0, got {self.ensemble_decay}")
        if self.delay_steps < 0:
            raise ValueError(f"ExecutionConfig.delay_steps: expected >= 0, got {self.delay_steps}")
        if self.frame_stride < 1:
            raise ValueError(f"ExecutionConfig.frame_stride: expected >= 1, got {self.frame_stride}")


class ChunkExecutor:
    """One robot: unbatched observations in (one frame per key), one action (A,) out per control step."""

    def __init__(
        self,
        act: Callable[[dict[str, Any]], np.ndarray],
        obs_keys: tuple[str, ...],
        obs_horizon: int,
        config: ExecutionConfig | None = None,
        roll_forward: RollForward | None = None,
        text_keys: tuple[str, ...] = (),
    ) -> None:
        self.act, self.obs_keys, self.obs_horizon = act, tuple(obs_keys), obs_horizon
        self.config = config or ExecutionConfig()
        self.roll_forward, self.text_keys = roll_forward, tuple(text_keys)
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference") if self.config.asynchronous else None
        )
        self.reset()

    def reset(self) -> None:
        """A new episode: history, chunks and the step counter start over (an inference in flight is dropped)."""
        self.t = 0
        self.history: dict[str, np.ndarray] = {}
        self.frames: dict[str, np.ndarray] = {}  # the newest frames, stride apart in what `history` keeps
        self.chunks: list[tuple[int, np.ndarray]] = []  # (step of the chunk's first action, chunk (H, A)), oldest first
        self.pending: tuple[int, Future[np.ndarray]] | None = None
        self.inferences = 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the control step ----------------------------------------------------------------------------
    def step(self, obs: Mapping[str, Any]) -> np.ndarray | None:
        """The action for this control step from the newest observation, or None when no chunk covers it yet
        (the first asynchronous inference is still running): the caller holds position."""
        self._push(obs)
        text = {k: obs[k] for k in self.text_keys}
        if self.pending is not None and self.pending[1].done():
            start, future = self.pending
            self.pending = None
            self._add(start, future.result()[0])  # an inference error surfaces here, in the control loop
        if self._needs_chunk():
            if self._pool is None:
                self._add(self.t, self._infer(self.history, text)[0])
            elif self.pending is None:
                start = self.t + self.config.delay_steps
                window = self._rolled(start)
                self.pending = (start, self._pool.submit(self._infer, window, text))
        action = self._action()
        self.t += 1
        return action

    def ahead(self) -> np.ndarray:
        """The actions (k, A) planned for the steps after the one `step` just returned, as far as the newest chunk
        is executed (receding horizon: until `execute` of its actions have run; ensembling plans no further than
        this step): what a trajectory controller is sent ahead of time."""
        if self.config.ensemble_decay is not None or not self.chunks:
            return np.zeros((0, 0), dtype=np.float32)
        start, chunk = self.chunks[-1]
        end = start + min(self.config.execute, len(chunk))
        return np.asarray(
            chunk[max(self.t - start, 0) : max(end - start, 0)] if self.t >= start else chunk[:0], np.float32
        )

    # --- internals ----------------------------------------------------------------------------------
    def _push(self, obs: Mapping[str, Any]) -> None:
        span = (self.obs_horizon - 1) * self.config.frame_stride + 1  # the frames kept; the policy sees every stride-th
        for k in self.obs_keys:
            x = np.asarray(obs[k])
            if k not in self.frames:  # the first frame of an episode is repeated, as training pads episodes
                self.frames[k] = np.repeat(x[None], span, axis=0)
            else:
                self.frames[k] = np.concatenate([self.frames[k][1:], x[None]])
            self.history[k] = self.frames[k][:: self.config.frame_stride]

    def _needs_chunk(self) -> bool:
        if self.config.ensemble_decay is not None:
            return True
        if not self.chunks:
            return True
        start, chunk = self.chunks[-1]
        lead = self.config.delay_steps if self._pool is not None else 0
        return self.t + lead >= start + min(self.config.execute, len(chunk))

    def _infer(self, history: dict[str, np.ndarray], text: dict[str, Any]) -> np.ndarray:
        window: dict[str, Any] = {k: v[None] for k, v in history.items()}
        window.update({k: np.asarray([v], dtype=object) if isinstance(v, str) else v for k, v in text.items()})
        self.inferences += 1
        return np.asarray(self.act(window))

    def _rolled(self, start: int) -> dict[str, np.ndarray]:
        """The history as it will be at step `start`: rolled through the actions planned until then."""
        history = {k: v.copy() for k, v in self.history.items()}
        if self.roll_forward is None or start <= self.t:
            return history
        planned = [self._planned(s) for s in range(self.t, start)]
        if any(a is None for a in planned):
            return history
        return self.roll_forward(history, np.stack(planned))  # type: ignore[arg-type]

    def _add(self, start: int, chunk: np.ndarray) -> None:
        self.chunks.append((start, chunk))
        # keep what still covers a step from now on (the newest chunk always, as receding horizon's fallback)
        self.chunks = [(s, c) for s, c in self.chunks[:-1] if s + len(c) > self.t] + [self.chunks[-1]]

    def _planned(self, step: int) -> np.ndarray | None:
        covering = [(s, c) for s, c in self.chunks if s <= step < s + len(c)]
        if not covering:
            return None
        if self.config.ensemble_decay is None:
            s, c = covering[-1]  # the newest chunk that has started
            return c[step - s]
        weights = np.exp(-self.config.ensemble_decay * np.arange(len(covering)))
        actions = np.stack([c[step - s] for s, c in covering])
        return (weights[:, None] * actions).sum(0) / weights.sum()

    def _action(self) -> np.ndarray | None:
        action = self._planned(self.t)
        return None if action is None else np.asarray(action, dtype=np.float32)
