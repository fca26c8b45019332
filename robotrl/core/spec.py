"""The task spec: the one object every stage (env, dataset, checkpoint, exported policy, ROS node) agrees on.

It is saved as JSON next to every artifact and checked at every boundary, so that a policy trained on one
observation layout can never be fed another one by a silent reshape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

#: dtype name used for the language instruction key (a Python string per env, not a numeric array).
STRING = "str"


class SpecMismatchError(ValueError):
    """Two specs (or a spec and an array) disagree; the message names the field and both values."""


@dataclass(frozen=True)
class ArraySpec:
    """Shape, dtype and (optional) elementwise bounds of one array, per env (no batch dimension)."""

    shape: tuple[int, ...]
    dtype: str
    #: elementwise bounds: anything that broadcasts to `shape` (a scalar, a flat list, an array); kept as a flat tuple
    low: ArrayLike | None = None
    high: ArrayLike | None = None
    #: named consecutive slices of a flat vector, e.g. (("joint_pos", 7), ("joint_vel", 7), ...): how a ROS
    #: node or a recording importer finds the robot's joints inside a task's "state" observation
    fields: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "fields", tuple((str(n), int(k)) for n, k in self.fields))
        if self.fields and (len(self.shape) != 1 or sum(k for _, k in self.fields) != self.shape[0]):
            raise SpecMismatchError(
                f"ArraySpec.fields: expected sizes summing to a flat shape, "
                f"got {list(self.fields)} for shape {self.shape}"
            )
        if self.dtype != STRING:
            np.dtype(self.dtype)  # raises TypeError on an unknown dtype name
        for name in ("low", "high"):
            bound = getattr(self, name)
            if bound is None:
                continue
            arr = np.asarray(bound, dtype=np.float64)
            if arr.size == self.size and arr.size > 1:
                arr = arr.reshape(self.shape)  # a flat list as read back from JSON
            bound = tuple(float(b) for b in np.broadcast_to(arr, self.shape).ravel())
            object.__setattr__(self, name, bound)

    @property
    def is_image(self) -> bool:
        return self.dtype == "uint8" and len(self.shape) == 3 and self.shape[-1] == 3

    def low_array(self) -> np.ndarray:
        return np.asarray(self.low if self.low is not None else [-np.inf] * self.size, np.float64).reshape(self.shape)

    def high_array(self) -> np.ndarray:
        return np.asarray(self.high if self.high is not None else [np.inf] * self.size, np.float64).reshape(self.shape)

    def middle(self) -> np.ndarray:
        """The middle of the bounds elementwise, 0 on an axis unbounded on either side (clipped into its bound):
        a neutral action to start from or to probe an env with."""
        low, high = self.low_array(), self.high_array()
        bounded = np.isfinite(low) & np.isfinite(high)
        mid = np.where(bounded, 0.5 * (np.where(bounded, low, 0.0) + np.where(bounded, high, 0.0)), 0.0)
        return np.clip(mid, low, high)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def field_slices(self) -> dict[str, slice]:
        """Name -> slice of each named field (empty when the array has no fields)."""
        out, start = {}, 0
        for name, k in self.fields:
            out[name] = slice(start, start + k)
            start += k
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        for name in ("low", "high"):
            bound = getattr(self, name)
            if bound is not None:  # a uniform bound is stored once, not once per element
                d[name] = _finite_or_str(bound[0]) if len(set(bound)) == 1 else [_finite_or_str(v) for v in bound]
        if self.fields:
            d["fields"] = [[n, k] for n, k in self.fields]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArraySpec:
        low, high = d.get("low"), d.get("high")
        return cls(
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            low=None if low is None else np.asarray(low, dtype=np.float64),
            high=None if high is None else np.asarray(high, dtype=np.float64),
            fields=tuple(tuple(f) for f in d.get("fields", ())),
        )

    def validate(self, value: Any, where: str, batched: bool = True) -> None:
        """Raise a `SpecMismatchError` naming `where` if `value` does not have this shape and dtype."""
        if self.dtype == STRING:
            return
        arr_shape = tuple(getattr(value, "shape", np.shape(value)))
        expected = self.shape
        got = arr_shape[1:] if batched else arr_shape
        if got != expected:
            prefix = "(num_envs, " if batched else "("
            raise SpecMismatchError(
                f"{where}: expected shape {prefix}{', '.join(map(str, expected))}"
                f"{',' if len(expected) == 1 and not batched else ''}), "
                f"got {arr_shape}"
            )
        kind = np.dtype(value.dtype).kind if isinstance(value, np.ndarray) else np.asarray(value).dtype.kind
        want = np.dtype(self.dtype).kind
        if (want == "f" and kind not in "fiu") or (want in "iu" and kind not in "iu"):
            raise SpecMismatchError(f"{where}: expected dtype {self.dtype}, got {np.asarray(value).dtype}")


def _finite_or_str(v: float) -> float | str:
    # JSON has no inf/nan; keep the file valid JSON for every other language that reads it.
    return v if math.isfinite(v) else str(v)


@dataclass(frozen=True)
class Spec:
    """Everything a stage must agree on about a task: observation keys, action, rate and the robot's joints."""

    task: str
    observations: dict[str, ArraySpec]
    action: ArraySpec
    action_mode: str
    control_hz: float
    joint_names: tuple[str, ...] = ()
    joint_limits: tuple[tuple[float, float], ...] = ()
    episode_steps: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "joint_names", tuple(self.joint_names))
        object.__setattr__(self, "joint_limits", tuple((float(a), float(b)) for a, b in self.joint_limits))
        if self.joint_limits and len(self.joint_limits) != len(self.joint_names):
            raise SpecMismatchError(
                f"Spec.joint_limits: expected one (low, high) pair per joint ({len(self.joint_names)}), "
                f"got {len(self.joint_limits)}"
            )
        if self.action.low is None or self.action.high is None:
            raise SpecMismatchError("Spec.action: expected finite low/high bounds, got None")

    # --- serialization -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "observations": {k: v.to_dict() for k, v in self.observations.items()},
            "action": self.action.to_dict(),
            "action_mode": self.action_mode,
            "control_hz": self.control_hz,
            "joint_names": list(self.joint_names),
            "joint_limits": [list(lim) for lim in self.joint_limits],
            "episode_steps": self.episode_steps,
            "metadata": self.metadata,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Spec:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise SpecMismatchError(f"Spec: unknown field(s) {sorted(unknown)}; expected a subset of {sorted(known)}")
        return cls(
            task=d["task"],
            observations={k: ArraySpec.from_dict(v) for k, v in d["observations"].items()},
            action=ArraySpec.from_dict(d["action"]),
            action_mode=d["action_mode"],
            control_hz=float(d["control_hz"]),
            joint_names=tuple(d.get("joint_names", ())),
            joint_limits=tuple(tuple(x) for x in d.get("joint_limits", ())),
            episode_steps=int(d.get("episode_steps", 0)),
            metadata=dict(d.get("metadata", {})),
        )

    @classmethod
    def from_json(cls, text: str) -> Spec:
        return cls.from_dict(json.loads(text))

    # --- checking ------------------------------------------------------------------------------------
    def check(self, other: Spec, this: str = "this spec", that: str = "other spec") -> None:
        """Raise `SpecMismatchError` naming the first field that differs, with both values."""
        a, b = self.to_dict(), other.to_dict()
        a["metadata"] = b["metadata"] = None  # free-form notes never make two specs incompatible
        path = _first_difference(a, b, "spec")
        if path is not None:
            where, va, vb = path
            raise SpecMismatchError(f"{where}: {this} has {va!r}, {that} has {vb!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spec):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.to_json(indent=None))


def _first_difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a:
                return f"{where}.{k}", "<missing>", b[k]
            if k not in b:
                return f"{where}.{k}", a[k], "<missing>"
            d = _first_difference(a[k], b[k], f"{where}.{k}")
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}", a, b
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{where}[{i}]")
            if d is not None:
                return (where, a, b) if not isinstance(x, (dict, list)) else d
        return None
    return None if a == b else (where, a, b)


def flatten_obs(obs: Mapping[str, Any], keys: Sequence[str], n: int | None = None) -> np.ndarray:
    """The numeric observation keys an actor-critic sees, flattened and concatenated per env: (N, D) float32
    (D = 0 without keys: then `n` gives N)."""
    if not keys:
        return np.zeros((n if n is not None else len(next(iter(obs.values()))), 0), np.float32)
    return np.concatenate([np.asarray(obs[k], np.float32).reshape(len(np.asarray(obs[k])), -1) for k in keys], axis=1)
