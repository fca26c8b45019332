"""robotrl.policies: policies that map observation histories to action chunks, their checkpoints and runtime.

`load(path)` rebuilds any saved policy; `POLICIES` maps registry names to classes. Names are imported lazily,
so that `robotrl.policies.runtime` (what a robot runs) never pulls in torch training code.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> defining module
_EXPORTS = {
    "POLICIES": "base",
    "CheckpointError": "base",
    "Policy": "base",
    "PolicyConfig": "base",
    "load": "base",
    "register_all": "base",
    "policy_class": "base",
    "policy_config": "base",
    "DiffusionConfig": "diffusion",
    "DiffusionPolicy": "diffusion",
    "FlowConfig": "flow",
    "FlowPolicy": "flow",
    "VLAConfig": "vla",
    "VLAPolicy": "vla",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'robotrl.policies' has no attribute {name!r}")
    module = importlib.import_module(f"robotrl.policies.{_EXPORTS[name]}")
    if name == "POLICIES":
        module.register_all()
    return getattr(module, name)
