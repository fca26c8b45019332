"""robotrl.policies: policies that map observation histories to action chunks, their checkpoints and runtime.

`load(path)` rebuilds any saved policy; `POLICIES` maps registry names to classes.
"""

from robotrl.policies.base import POLICIES, CheckpointError, Policy, PolicyConfig, load
from robotrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from robotrl.policies.flow import FlowConfig, FlowPolicy

__all__ = ["POLICIES", "CheckpointError", "DiffusionConfig", "DiffusionPolicy", "FlowConfig", "FlowPolicy", "Policy",
           "PolicyConfig", "load"]
