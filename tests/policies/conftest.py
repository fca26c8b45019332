"""Fixtures the policy tests share: one torch thread for small models, and PushT demonstrations on disk."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small models are per-op overhead: one thread is as fast, and two threads slow down many times over when
    other processes share the two cores of the CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def pusht_demos(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    """Four real PushT episodes of the noisy scripted expert (40 steps each), recorded once per test process."""
    return record_expert(tmp_path_factory.mktemp("demos") / "pusht.zarr", "PushT", episodes=4, num_envs=4,
                         episode_steps=40, progress=False)
