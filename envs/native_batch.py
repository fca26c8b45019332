"""MuJoCo's batched simulation through its C API (mujoco/include/mujoco/mjbatch.h), called by ctypes.

`mujoco.batch.Batch` wraps the same C API but keeps the batch's address to itself, and `mjb_apply`, which runs a
compiled function of ours on each simulation on the batch's own threads, needs it (robotrl/envs/fused.py runs the
step's code there, beside each env's physics). `NativeBatch` has the part of `Batch`'s interface the CPU backend
uses, with the same semantics: state rows, warning counters, bound fields, `step`, `forward`, `reset`, `set_models`,
and `apply`; a call in which MuJoCo raised in some simulations raises `mujoco.batch.SimulationError`.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np
from mujoco.batch import SimulationError

#: the MuJoCo library the `mujoco` package loaded
LIBRARY = os.path.join(os.path.dirname(mujoco.__file__), f"libmujoco.so.{mujoco.__version__}")
_lib = ctypes.CDLL(LIBRARY)
_p, _int = ctypes.c_void_p, ctypes.c_int


class _Config(ctypes.Structure):  # mjBatchConfig
    _fields_ = [("nthread", ctypes.c_int), ("persistent", ctypes.c_ubyte)]


def _prototype(name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(_lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


_make = _prototype("mjb_makeBatch", _p, _p, _int, ctypes.POINTER(_Config), ctypes.c_char_p, _int)
_delete = _prototype("mjb_deleteBatch", None, _p)
_nstate = _prototype("mjb_nstate", _int, _p)
_nthread = _prototype("mjb_nthread", _int, _p)
_state = _prototype("mjb_state", ctypes.POINTER(ctypes.c_double), _p)
_component = _prototype("mjb_stateComponent", ctypes.POINTER(ctypes.c_double), _p, _int, ctypes.POINTER(_int))
_warning = _prototype("mjb_warning", ctypes.POINTER(ctypes.c_int), _p)
_status = _prototype("mjb_status", ctypes.POINTER(ctypes.c_int), _p)
_error = _prototype("mjb_error", ctypes.c_char_p, _p, _int)
_output = _prototype("mjb_output", _p, _p, ctypes.c_char_p, ctypes.POINTER(_int), ctypes.POINTER(_int))
_step = _prototype("mjb_step", _int, _p, _p, _int, _int, _int)
_forward = _prototype("mjb_forward", _int, _p, _p, _int, _int)
_reset = _prototype("mjb_reset", _int, _p, _p, _int, _p, _int)
_set_models = _prototype("mjb_setModels", None, _p, _p)
_apply = _prototype("mjb_apply", _int, _p, _p, _int, _p, _p, _int)

#: the state components `bind` views in the rows, by MjData field
_STATE_FIELDS = {
    "qpos": mujoco.mjtState.mjSTATE_QPOS,
    "qvel": mujoco.mjtState.mjSTATE_QVEL,
    "act": mujoco.mjtState.mjSTATE_ACT,
    "ctrl": mujoco.mjtState.mjSTATE_CTRL,
    "qacc_warmstart": mujoco.mjtState.mjSTATE_WARMSTART,
    "qfrc_applied": mujoco.mjtState.mjSTATE_QFRC_APPLIED,
    "xfrc_applied": mujoco.mjtState.mjSTATE_XFRC_APPLIED,
    "mocap_pos": mujoco.mjtState.mjSTATE_MOCAP_POS,
    "mocap_quat": mujoco.mjtState.mjSTATE_MOCAP_QUAT,
}


class NativeBatch:
    """nsim simulations of a copy of `model` on `nthread` threads (the caller's included), one mjData per thread."""

    def __init__(self, model: mujoco.MjModel, nsim: int, nthread: int) -> None:
        message = ctypes.create_string_buffer(1000)
        address = _make(model._address, nsim, ctypes.byref(_Config(nthread, 0)), message, len(message))
        if not address:
            raise ValueError(f"mjb_makeBatch: {message.value.decode()}")
        self.address: int = address
        self.model, self.nsim = model, nsim
        self._models: list[mujoco.MjModel] | None = None  # the caller's models, kept alive while the batch runs them
        self._free = weakref.finalize(self, _delete, address)
        self.nstate: int = _nstate(address)
        self.nthread: int = _nthread(address)
        self.state = self._view(_state(address), (nsim, self.nstate), np.float64)
        self.warning = self._view(_warning(address), (nsim, int(mujoco.mjtWarning.mjNWARNING), 2), np.int32)
        self.status = self._view(_status(address), (nsim,), np.int32)
        self.status.flags.writeable = False
        self._template = mujoco.MjData(model)
        self._bound: dict[str, np.ndarray] = {}

    def _view(self, pointer: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A numpy view of the batch's memory that keeps the batch alive while it lives."""
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buffer = (ctypes.c_char * size).from_address(ctypes.cast(pointer, ctypes.c_void_p).value or 0)
        buffer._owner = self
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)

    def bind(self, name: str) -> np.ndarray:
        """A live (nsim, ...) array over an MjData field: a view of the state rows for a state component, else the
        field as copied out after every call (read-only), as `mujoco.batch.Batch.bind`."""
        if name in self._bound:
            return self._bound[name]
        template = np.asarray(getattr(self._template, name))
        if name in _STATE_FIELDS:
            size = _int()
            start = _component(self.address, int(_STATE_FIELDS[name]), ctypes.byref(size))
            offset = (ctypes.cast(start, ctypes.c_void_p).value or 0) - self.state.ctypes.data
            view = self.state[:, offset // 8 : offset // 8 + size.value].reshape(self.nsim, *template.shape)
        else:
            size, elemsize = _int(), _int()
            pointer = _output(self.address, name.encode(), ctypes.byref(size), ctypes.byref(elemsize))
            if not pointer or elemsize.value != template.dtype.itemsize:
                raise ValueError(f"NativeBatch.bind: {name!r} is not an MjData field a batch can output")
            view = self._view(pointer, (self.nsim, *template.shape), template.dtype)
            view.flags.writeable = False
        self._bound[name] = view
        return view

    def step(self, ids: Any = None, nstep: int = 1, stage: int = 0) -> None:
        """Advance the simulations (all, or `ids`) by `nstep` calls to mj_step."""
        sel, n = self._ids(ids)
        self._check(ids, _step(self.address, sel, n, nstep, stage))

    def forward(self, ids: Any = None, stage: int = int(mujoco.mjtStage.mjSTAGE_ACC)) -> None:
        sel, n = self._ids(ids)
        self._check(ids, _forward(self.address, sel, n, stage))

    def reset(self, ids: Any = None, stage: int = int(mujoco.mjtStage.mjSTAGE_ACC)) -> None:
        """Reset the simulations to the model's defaults, then compute the stages up to `stage`."""
        sel, n = self._ids(ids)
        self._check(ids, _reset(self.address, sel, n, None, stage))

    def set_models(self, models: Sequence[mujoco.MjModel]) -> None:
        """Run simulation i on models[i], which the batch reads (set them again after editing one)."""
        if len(models) != self.nsim:
            raise ValueError(f"NativeBatch.set_models: expected {self.nsim} models, got {len(models)}")
        self._models = list(models)
        table = (ctypes.c_void_p * self.nsim)(*(m._address for m in self._models))
        _set_models(self.address, table)

    def apply(self, function: int, arg: int, save: bool = True, ids: Any = None) -> None:
        """Run the C function at address `function`, `void f(const mjModel*, mjData*, int sim, void* arg)`, on each
        simulation (all, or `ids`) on the batch's threads, with its state loaded; save the state after it if `save`."""
        sel, n = self._ids(ids)
        self._check(ids, _apply(self.address, sel, n, function, arg, int(save)))

    def error(self, sim: int) -> str:
        return (_error(self.address, sim) or b"").decode()

    def _ids(self, ids: Any) -> tuple[Any, int]:
        """The ids (any integer sequence; None: all simulations) as the C API takes them."""
        if ids is None:
            return None, 0
        sel = np.ascontiguousarray(ids, dtype=np.int32)
        if sel.ndim != 1 or (len(sel) and (sel.min() < 0 or sel.max() >= self.nsim)):
            raise ValueError(f"NativeBatch: ids must be in [0, {self.nsim}), got {ids}")
        self._sel = sel  # alive through the call
        return sel.ctypes.data, len(sel)

    def _check(self, ids: Any, failed: int) -> None:
        if failed:
            sel = np.arange(self.nsim) if ids is None else np.asarray(ids)
            bad = sel[self.status[sel] != 0]
            raise SimulationError(bad, self.error(int(bad[0])), len(sel))
