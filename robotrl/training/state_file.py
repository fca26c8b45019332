"""A train state on disk without pickle: its tensors in one safetensors file, the containers around them as JSON in
that file's header.

A run's train state (model, EMA and optimizer tensors, step, RNG states, an env mid-episode, a replay buffer) is a
tree of dicts (string or integer keys: an optimizer's state is keyed by parameter index), lists, tuples, numbers,
strings and None, with tensors and numpy arrays as its leaves. `encode` writes each leaf as one safetensors entry
named by its position in the tree and the tree itself as JSON that names them; `decode` rebuilds the same tree,
the same Python types and the same tensors bit for bit. Reading it back runs no unpickler at all (the checkpoint
rule of DESIGN.md: nothing is read back through pickle).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_tensors

#: the header key that holds the tree, and the format's version
TREE, VERSION = "robotrl.train_state", "1"


def encode(state: Mapping[str, Any]) -> bytes:
    """`state` as one safetensors file's bytes; a value of another type is a TypeError naming its place."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[tuple[str, int]] = set()

    def leaf(value: torch.Tensor, kind: str) -> dict[str, str]:
        name = str(len(tensors))
        tensor = value.detach()
        where = (tensor.device.type, tensor.untyped_storage().data_ptr())
        if where in storages and tensor.numel() > 0:  # safetensors refuses two entries over one storage
            tensor = tensor.clone()
        storages.add(where)
        tensors[name] = tensor.contiguous()
        return {kind: name}

    def tree(value: Any, at: str) -> Any:
        if isinstance(value, torch.Tensor):
            return leaf(value, "tensor")
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":
                raise TypeError(f"train state {at}: expected a numeric array, got dtype {value.dtype}")
            return leaf(torch.from_numpy(np.ascontiguousarray(value)), "array")
        if isinstance(value, Mapping):
            for key in value:
                if not isinstance(key, str | int) or isinstance(key, bool):
                    raise TypeError(f"train state {at}: expected str or int keys, got {type(key).__name__} {key!r}")
            return {"dict": [[key, tree(v, f"{at}[{key!r}]")] for key, v in value.items()]}
        if isinstance(value, list | tuple):
            items = [tree(v, f"{at}[{i}]") for i, v in enumerate(value)]
            return {"tuple" if isinstance(value, tuple) else "list": items}
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"train state {at}: expected tensors, arrays, containers or plain values, got {type(value)}")

    header = tree(dict(state), "")
    return save_tensors(tensors, metadata={TREE: json.dumps(header), "version": VERSION})


def decode(path: Path) -> Any:
    """The tree `encode` wrote into the file at `path`, tensors on the CPU. A file that is not one (truncated,
    damaged, another format) raises ValueError with the reason; a missing one, OSError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if TREE not in meta:
                raise ValueError("a safetensors file without a train state's tree")
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        header = json.loads(meta[TREE])
    except (SafetensorError, json.JSONDecodeError) as e:
        raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from e

    def tree(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        (kind, inner), *_ = value.items()
        if kind == "tensor":
            return tensors[inner]
        if kind == "array":
            return tensors[inner].numpy()
        if kind == "dict":
            return {key: tree(v) for key, v in inner}
        items = [tree(v) for v in inner]
        return tuple(items) if kind == "tuple" else items

    return tree(header)
