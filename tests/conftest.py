"""Suite-wide settings and fixtures."""

import os
from pathlib import Path

import jax
import pytest

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert

# MJX tests are dominated by XLA compilation on a 2-core machine; a persistent cache outside the checkout
# makes every run after the first on the same machine much faster (a clean clone still compiles once).
_cache = Path(os.environ.get("ROBOTRL_JAX_CACHE", Path.home() / ".cache" / "robotrl" / "jax"))
_cache.mkdir(parents=True, exist_ok=True)
jax.config.update("jax_compilation_cache_dir", str(_cache))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(scope="session")
def pusht_demos(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    """Four real PushT episodes of the noisy scripted expert (40 steps each), recorded once per test process."""
    return record_expert(tmp_path_factory.mktemp("demos") / "pusht.zarr", "PushT", episodes=4, num_envs=4,
                         episode_steps=40, progress=False)
