"""A control for `robotrl train online`: the same run with each rollout's advantages shuffled across its decisions
before the PPO update, so the policy moves by noise of the update's own size and no signal (the value targets are
untouched). Compared with the real run on the same settings, it tells how much of a fall in success is the
update's noise and how much its direction (bench/RESULTS.md, PushT).

    .venv/bin/python bench/ppo_shuffled.py train online --policy runs/bc/policy [the real run's options]
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import robotrl.flowrl.online as online
from robotrl.cli import main

real_update = online.ppo_update
generator = torch.Generator().manual_seed(0)


def shuffled_update(agent: Any, data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    data = {**data, "adv": data["adv"][torch.randperm(len(data["adv"]), generator=generator)]}
    return real_update(agent, data, *args, **kwargs)


if __name__ == "__main__":
    online.ppo_update = shuffled_update  # train() looks it up in the module at call time
    sys.exit(main(sys.argv[1:]))
