"""Fixtures the policy tests share: one torch thread for small models, and a noise prior and a chunk residual
moved away from their start (PushT demonstrations: ../conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from robotrl.policies.timing import torch_threads


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small models are per-op overhead: one thread is as fast, and two threads slow down many times over when
    other processes share the two cores of the CI machine."""
    with torch_threads(1):
        yield


def _add_moved_heads(policy, seed: int = 3):  # type: ignore[no-untyped-def]
    """`policy` with a noise prior and a chunk residual (16 hidden each) moved away from their start (N(0, I),
    zero), as online RL's `latent` and `residual` methods leave them."""
    policy.add_noise_prior((16,), 1.5)
    policy.add_action_residual((16,), 0.3, 0.1)
    with torch.no_grad():
        torch.manual_seed(seed)
        policy.prior.net[-1].weight.normal_(std=0.3)
        policy.prior.log_std.fill_(-0.7)
        policy.residual.net[-1].weight.normal_(std=0.3)
    return policy


@pytest.fixture
def add_moved_heads() -> Callable:
    return _add_moved_heads
