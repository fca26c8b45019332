"""Chunk execution on one robot: receding horizon is the simulator's ChunkController on a batch of one, temporal
ensembling averages overlapping chunks with ACT's weights, and asynchronous inference never stalls the control
loop and aligns each chunk with the state it was predicted for."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from robotrl.hardware.execution import ChunkExecutor, ExecutionConfig, resample_chunk
from robotrl.policies.controller import ChunkController

H, A = 6, 2


class Policy:
    """Chunk (1, H, A): action i of a chunk is (newest observation x + i, number of this call)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls, self.delay, self.seen = 0, delay, []
        self.thread_ids: set[int] = set()

    def __call__(self, window: dict[str, Any]) -> np.ndarray:
        time.sleep(self.delay)
        self.thread_ids.add(threading.get_ident())
        x = float(window["x"][0, -1, 0])
        self.seen.append(window["x"][0].copy())
        chunk = np.stack([np.full(H, x) + np.arange(H), np.full(H, self.calls, dtype=float)], -1)
        self.calls += 1
        return chunk[None]


def test_receding_horizon_is_the_simulators_controller() -> None:
    ours, theirs = Policy(), Policy()
    ex = ChunkExecutor(ours, ("x",), 2, ExecutionConfig(execute=4))
    sim = ChunkController(theirs, ("x",), 2, 4)
    sim.reset(1)
    for t in range(20):
        obs = {"x": np.array([float(t * t)])}
        np.testing.assert_array_equal(ex.step(obs), sim({"x": obs["x"][None]})[0])
    assert ours.calls == theirs.calls == 5
    np.testing.assert_array_equal(ours.seen[1], [[9.0], [16.0]])  # the two newest frames at step 4


def test_temporal_ensembling_weights_older_chunks_first() -> None:
    policy, m = Policy(), 0.5
    ex = ChunkExecutor(policy, ("x",), 1, ExecutionConfig(ensemble_decay=m))
    for t in range(10):
        action = ex.step({"x": np.array([0.0])})
        assert action is not None
        covering = np.arange(max(0, t - H + 1), t + 1)  # calls made at steps t-H+1..t each cover step t
        w = np.exp(-m * np.arange(len(covering)))
        assert action[1] == pytest.approx((w * covering).sum() / w.sum(), rel=1e-6)
        assert action[0] == pytest.approx((w * (t - covering)).sum() / w.sum(), rel=1e-6)
    assert policy.calls == 10


def test_asynchronous_inference_never_stalls_the_loop_and_aligns_chunks() -> None:
    period, delay_steps = 0.01, 3
    policy = Policy(delay=0.06)  # six periods of inference: a step that waited for one would take tens of ms
    rolled: list[np.ndarray] = []

    def roll(history: dict[str, np.ndarray], planned: np.ndarray) -> dict[str, np.ndarray]:
        rolled.append(planned.copy())
        return {"x": history["x"] + planned[:, 0].sum()}

    ex = ChunkExecutor(
        policy, ("x",), 1, ExecutionConfig(execute=4, asynchronous=True, delay_steps=delay_steps), roll_forward=roll
    )
    actions, worst = [], 0.0
    requests: list[tuple[int, int]] = []  # (request step, start step) of every inference, in call order
    for t in range(40):
        t0 = time.perf_counter()
        actions.append(ex.step({"x": np.array([100.0 * t])}))
        worst = max(worst, time.perf_counter() - t0)
        if ex.pending is not None and (not requests or requests[-1][1] != ex.pending[0]):
            requests.append((t, ex.pending[0]))
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))
    ex.close()
    assert worst < 0.03, f"a control step waited {worst * 1e3:.1f} ms for inference"  # scheduling jitter is less
    assert threading.get_ident() not in policy.thread_ids
    assert actions[0] is None  # nothing to execute until the first chunk arrives
    assert_aligned(actions, requests, policy, delay_steps)
    assert len({int(a[1]) for a in actions if a is not None}) >= 4
    assert rolled and all(len(p) == delay_steps for p in rolled)  # the roll ran through the steps up to each start


def assert_aligned(actions: list, requests: list[tuple[int, int]], policy: Policy, delay: int) -> None:
    """Every executed action is action t - start of the chunk that started `delay` steps after its request, and every
    chunk after the first was predicted for the rolled-forward state: the request step's observation (100 t) plus the
    actions executed from the request until the chunk's start (what the roll was told would run)."""
    assert all(start == request + delay for request, start in requests)
    for t, a in enumerate(actions):
        if a is None:
            continue
        call = int(a[1])
        start = requests[call][1]
        assert 0 <= t - start < H and a[0] == policy.seen[call][-1, 0] + (t - start), (t, a, requests[call])
    for call, (request, start) in enumerate(requests[1:], 1):
        if start > len(actions) or call >= len(policy.seen):  # asked for near the end: not started, or not run
            continue
        planned = [actions[s] for s in range(request, start)]
        rolled = sum(a[0] for a in planned) if all(a is not None for a in planned) else 0.0  # no roll through a hold
        assert policy.seen[call][-1, 0] == 100.0 * request + rolled, (call, request, planned)


def test_asynchronous_chunks_start_exactly_delay_steps_after_their_request() -> None:
    """Inference done within each step (the worker waited for), so every request and start is fixed: with execute 4
    and delay 3 the k-th chunk is asked for at step 4k, starts at 4k + 3, and is predicted for x(4k) rolled through
    the three actions of chunk k - 1 that run meanwhile."""
    policy = Policy()
    roll = lambda history, planned: {"x": history["x"] + planned[:, 0].sum()}  # noqa: E731
    ex = ChunkExecutor(
        policy, ("x",), 1, ExecutionConfig(execute=4, asynchronous=True, delay_steps=3), roll_forward=roll
    )
    actions, requests = [], []
    for t in range(30):
        actions.append(ex.step({"x": np.array([100.0 * t])}))
        if ex.pending is not None:
            requests.append((t, ex.pending[0]))
            ex.pending[1].result()  # done before the next step
    ex.close()
    assert requests == [(4 * k, 4 * k + 3) for k in range(len(requests))] and len(requests) == 8
    assert actions[:3] == [None, None, None] and all(a is not None for a in actions[3:])
    assert_aligned(actions, requests, policy, 3)


def test_the_first_action_of_an_aligned_chunk_runs_at_its_start_step() -> None:
    policy = Policy()
    ex = ChunkExecutor(policy, ("x",), 1, ExecutionConfig(execute=4, asynchronous=True, delay_steps=2))
    out = []
    for t in range(12):
        out.append(ex.step({"x": np.array([10.0 * t])}))
        time.sleep(0.005)  # the worker finishes well within a step
    ex.close()
    # request at step 0 -> chunk starts at step 2 with its action 0 (x = 0 + 0): steps 0, 1 hold
    assert out[0] is None and out[1] is None
    np.testing.assert_array_equal(out[2], [0.0, 0.0])
    np.testing.assert_array_equal(out[3], [1.0, 0.0])


def test_reset_starts_over() -> None:
    policy = Policy()
    ex = ChunkExecutor(policy, ("x",), 2, ExecutionConfig(execute=3))
    for _ in range(5):
        ex.step({"x": np.array([1.0])})
    ex.reset()
    ex.step({"x": np.array([7.0])})
    np.testing.assert_array_equal(policy.seen[-1], [[7.0], [7.0]])  # the new episode's first frame, repeated
    with pytest.raises(ValueError, match="execute: expected >= 1"):
        ExecutionConfig(execute=0)


def test_a_chunk_resampled_in_time_keeps_positions_on_the_policys_steps_and_spreads_its_motion() -> None:
    """At 10x the rate: a position at each policy step is the policy's, linear between; a per-step displacement is
    divided among the 10 robot steps of its policy step, so the chunk moves as far. At 0.5x: every other step."""
    chunk = np.array([[0.0, 1.0, 0.5], [1.0, 2.0, 0.5], [3.0, 4.0, -0.5]], dtype=np.float32)
    deltas = np.array([False, True, False])  # a position, a displacement, a gripper
    fast = resample_chunk(chunk, 10.0, deltas)
    assert fast.shape == (30, 3)
    np.testing.assert_allclose(fast[::10, 0], chunk[:, 0])
    np.testing.assert_allclose(fast[5, 0], 0.5)
    np.testing.assert_allclose(fast[:10, 1], 0.1)  # the first step's displacement, a tenth per robot step
    np.testing.assert_allclose(fast[:, 1].sum(), chunk[:, 1].sum(), rtol=1e-6)  # the chunk moves as far
    np.testing.assert_allclose(fast[::10, 2], chunk[:, 2])  # the gripper is a position
    slow = resample_chunk(chunk, 0.5, deltas)
    np.testing.assert_allclose(slow, [[0.0, 3.0, 0.5], [3.0, 4.0, -0.5]])  # two policy steps' motion in one


def test_frames_are_kept_as_far_apart_as_the_policy_saw_them() -> None:
    seen: list[np.ndarray] = []

    def act(window: dict) -> np.ndarray:
        seen.append(window["x"][0, :, 0].copy())
        return np.zeros((1, 4, 1), np.float32)

    executor = ChunkExecutor(act, ("x",), 2, ExecutionConfig(execute=4, frame_stride=3))
    for k in range(9):
        executor.step({"x": np.array([float(k)])})
    assert [list(s) for s in seen] == [[0.0, 0.0], [1.0, 4.0], [5.0, 8.0]]  # the first frame repeated, then 3 apart
