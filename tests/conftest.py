"""Suite-wide settings."""

import os
from pathlib import Path

import jax

# MJX tests are dominated by XLA compilation on a 2-core machine; a persistent cache outside the checkout
# makes every run after the first on the same machine much faster (a clean clone still compiles once).
_cache = Path(os.environ.get("ROBOTRL_JAX_CACHE", Path.home() / ".cache" / "robotrl" / "jax"))
_cache.mkdir(parents=True, exist_ok=True)
jax.config.update("jax_compilation_cache_dir", str(_cache))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
