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


def _kill_after_first_train_state(args: list[str], state: Path, timeout: float = 120.0) -> int:
    """Start a training command, SIGKILL it as soon as it has written its first train state, and return the
    step that state holds (what a resume test continues from)."""
    import signal
    import subprocess
    import time

    import torch

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return int(torch.load(state, weights_only=True)["step"])


@pytest.fixture
def kill_after_first_train_state():
    return _kill_after_first_train_state
