"""Wall-clock latency of a policy call, as the benchmarks and `robotrl run` report it (batch 1, after warm-up),
and the torch thread count a call runs on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def latency(fn: Callable[[], Any], calls: int, warmup: int, max_seconds: float) -> tuple[np.ndarray, int]:
    """Milliseconds per call of `fn` over up to `calls` calls after `warmup` untimed ones, stopping after
    `max_seconds` (but never before 10 calls, so that a slow policy still gets a p50); (times, calls made)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < calls and (time.perf_counter() - start < max_seconds or len(times) < 10):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return np.asarray(times) * 1e3, len(times)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set for a block and restored after it (a caller's training keeps its own). Small
    batches are per-op overhead: one thread is as fast, and a second spin-waits when other jobs share the cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
