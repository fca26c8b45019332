"""Where a PushT demonstration store shows the block at a near-miss coverage, and what the demonstrator did there:
a policy that cannot tell whether the episode already succeeded imitates whatever dominates those states.

For each store, over the steps whose coverage lies in [low, success threshold): how many come before the
episode's first success and how many after it, and how many of each are slow (max |action| < `slow`, a hold).
Prints one JSON line per store.

    .venv/bin/python bench/pusht_demo_holds.py --stores data/pusht.zarr data/pusht_new.zarr
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from robotrl.datasets import EpisodeStore
from robotrl.envs.tasks.push_t import STATE_LAYOUT, PushTConfig


@dataclass
class DemoHoldsConfig:
    stores: tuple[Path, ...]
    low: float = 0.86
    slow: float = 0.5


def holds(path: Path, config: DemoHoldsConfig) -> dict[str, object]:
    threshold = PushTConfig.success_coverage
    with EpisodeStore.open(path) as store:
        if store.spec.task != "PushT":
            raise SystemExit(f"--stores: expected PushT stores, got {store.spec.task!r} at {path}")
        data = store.load(["state", "action"])
        bounds = list(zip(store.episode_starts, store.episode_ends))
    column = STATE_LAYOUT["coverage"][0]
    coverage, slow = data["state"][:, column], np.abs(data["action"]).max(1) < config.slow
    counts = {"before": 0, "after": 0, "before_slow": 0, "after_slow": 0, "after_any": 0}
    for start, end in bounds:
        cov = coverage[start:end]
        reached = cov >= threshold
        after = np.arange(end - start) >= (int(np.argmax(reached)) if reached.any() else end - start)
        band = (cov >= config.low) & (cov < threshold)
        for name, mask in (("before", ~after), ("after", after)):
            counts[name] += int(np.sum(band & mask))
            counts[f"{name}_slow"] += int(np.sum(band & mask & slow[start:end]))
        counts["after_any"] += int(after.sum())
    share = counts["after"] / max(counts["before"] + counts["after"], 1)
    return {
        "bench": "pusht_demo_holds",
        "store": str(path),
        "episodes": len(bounds),
        "band": [config.low, threshold],
        "steps_in_band_before_first_success": counts["before"],
        "steps_in_band_after": counts["after"],
        "slow_in_band_before": counts["before_slow"],
        "slow_in_band_after": counts["after_slow"],
        "steps_after_first_success": counts["after_any"],
        "share_of_band_after_success": round(share, 3),
    }


def main(config: DemoHoldsConfig) -> list[dict[str, object]]:
    rows = [holds(Path(p), config) for p in config.stores]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main(tyro.cli(DemoHoldsConfig))
