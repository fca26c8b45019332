"""Checks every command's options get before any work starts."""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any


def check_numbers(config: Any, where: str | None = None) -> None:
    """Refuse, before anything is written, a NaN in any float option (nested policy configs too) and a learning
    rate (`lr`, `*_lr`) that is not a finite positive number: torch would take the first silently and fail on the
    second only once the run directory exists."""
    if not is_dataclass(config) or isinstance(config, type):
        return
    where = where or type(config).__name__
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value) and not isinstance(value, type):
            check_numbers(value, f"{where}.{f.name}")
        elif isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{where}.{f.name}: expected a number, got nan")
        elif (
            (f.name == "lr" or f.name.endswith("_lr"))
            and isinstance(value, (int, float))
            and not (math.isfinite(value) and value > 0)
        ):
            raise ValueError(f"{where}.{f.name}: expected a finite learning rate > 0, got {value}")
