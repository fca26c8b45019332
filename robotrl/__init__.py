"""robotrl: one pipeline from demonstrations and parallel simulation to a one-step policy on ROS 2."""

from robotrl.core.spec import ArraySpec, Spec, SpecMismatchError

__all__ = ["ArraySpec", "Spec", "SpecMismatchError"]
__version__ = "0.1.0"
