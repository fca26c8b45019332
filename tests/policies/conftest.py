"""Fixtures the policy tests share: one torch thread for small models (PushT demonstrations: ../conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small models are per-op overhead: one thread is as fast, and two threads slow down many times over when
    other processes share the two cores of the CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
