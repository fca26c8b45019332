"""A probe of the lever left to issue 45, JSON lines: the physics call with its second thread kept awake between steps,
against `mujoco.batch.Batch`'s pool, whose worker sleeps between calls and wakes late (bench/physics_call.py: the
longer the calling thread is busy between two calls, the dearer the next).

Both step the same envs with the same controls, the calling thread busy for `--gap-us` between steps as the backend's
step code keeps it:
  pool_us      one `Batch(nthread=2)` of the N envs: `Batch.step` per control step (the backend's physics call)
  spinning_us  the first half of the envs in a `Batch(nthread=1)` stepped by the caller, the second half in a batch of
               MuJoCo's C API (`mjb_makeBatch`, through ctypes) stepped by a thread of our own that waits for each
               step spinning on a flag (numba, GIL released), so that it starts at once
  ratio        spinning_us / pool_us
microseconds per control step, the physics call only, the best of `--repeats` rounds taken in turn. The spinning
thread burns its core while it waits: this measures what a pool that does so would gain, not a backend.

    .venv/bin/python bench/spinning_worker.py --tasks PushT Quadruped --num-envs 8 --gaps-us 0 100
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
import tyro
from mujoco.batch import Batch
from numba import njit


@dataclass
class SpinningWorkerConfig:
    tasks: tuple[str, ...] = ("PushT", "Quadruped")
    num_envs: tuple[int, ...] = (8,)
    gaps_us: tuple[int, ...] = (0, 100)
    steps: int = 300
    repeats: int = 5
    seed: int = 0


_lib = ctypes.CDLL(os.path.join(os.path.dirname(mujoco.__file__), f"libmujoco.so.{mujoco.__version__}"))
_u64 = ctypes.c_uint64
_mjb_step = _lib.mjb_step  # (mjBatch*, const int* ids, int nid, int nstep, int stage): pointers as 64-bit integers
_mjb_step.argtypes, _mjb_step.restype = [_u64, _u64, ctypes.c_int, ctypes.c_int, ctypes.c_int], ctypes.c_int
_memcpy = ctypes.CDLL(None).memcpy  # an opaque call: the flag is read from memory on every turn of a spin
_memcpy.argtypes, _memcpy.restype = [_u64, _u64, _u64], _u64


class _Config(ctypes.Structure):  # mjBatchConfig
    _fields_ = [("nthread", ctypes.c_int), ("persistent", ctypes.c_ubyte)]


# the C API's prototypes (mujoco/include/mujoco/mjbatch.h)
_lib.mjb_makeBatch.argtypes = [_u64, ctypes.c_int, ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_int]
_lib.mjb_makeBatch.restype = _lib.mjb_state.restype = _lib.mjb_stateComponent.restype = ctypes.c_void_p
_lib.mjb_state.argtypes = _lib.mjb_nstate.argtypes = _lib.mjb_deleteBatch.argtypes = [_u64]
_lib.mjb_stateComponent.argtypes = [_u64, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]


@njit(nogil=True)
def _load(flag: np.ndarray, local: np.ndarray) -> int:
    _memcpy(local.ctypes.data, flag.ctypes.data, 8)
    return local[0]


@njit(nogil=True)
def _serve(flag: np.ndarray, batch: int, nsub: int) -> None:
    """Spin until flag is 1 (step the batch, then 0) or 2 (return)."""
    local = np.zeros(1, np.int64)
    while True:
        f = _load(flag, local)
        if f == 1:
            _mjb_step(batch, 0, 0, nsub, 0)
            flag[0] = 0
        elif f == 2:
            return


@njit(nogil=True)
def _wait(flag: np.ndarray) -> None:
    local = np.zeros(1, np.int64)
    while _load(flag, local) != 0:
        pass


class CBatch:
    """A batch of MuJoCo's C API with one thread (the caller's): its state rows and a state component's view."""

    def __init__(self, model: mujoco.MjModel, n: int) -> None:
        self.model = model  # the batch copied it; kept for its lifetime all the same
        self.ptr = int(_lib.mjb_makeBatch(model._address, n, ctypes.byref(_Config(1, 0)), None, 0))
        rows = ctypes.cast(_lib.mjb_state(self.ptr), ctypes.POINTER(ctypes.c_double))
        self.state = np.ctypeslib.as_array(rows, (n, _lib.mjb_nstate(self.ptr)))

    def component(self, spec: mujoco.mjtState) -> np.ndarray:
        size = ctypes.c_int()
        start = (_lib.mjb_stateComponent(self.ptr, int(spec), ctypes.byref(size)) - self.state.ctypes.data) // 8
        return self.state[:, start : start + size.value]

    def close(self) -> None:
        _lib.mjb_deleteBatch(self.ptr)


def measure(task: str, n: int, gap_us: int, config: SpinningWorkerConfig) -> dict[str, Any]:
    from physics_call import best_of, busy, record, replayed

    from robotrl.envs import make

    qpos, qvel, controls, nsub = replayed(task, n, config.steps, config.seed)
    model = make(task, num_envs=1, seed=config.seed, render_images=False).task.model
    half, gap = n // 2, 1e-6 * gap_us
    pool = Batch(model, n, nthread=2)
    caller = Batch(model, half, nthread=1)
    other = CBatch(model, n - half)
    for b in (pool, caller):
        b.bind("sensordata")  # as the backend: an output copied after every call
    qpos_o, qvel_o = other.component(mujoco.mjtState.mjSTATE_QPOS), other.component(mujoco.mjtState.mjSTATE_QVEL)
    ctrl_o = other.component(mujoco.mjtState.mjSTATE_CTRL)
    flag = np.zeros(1, np.int64)
    default = pool.state[0].copy()  # a row as a new batch holds it: the model's defaults (the same layout in all three)

    def pooled() -> float:
        pool.state[:] = default
        pool.qpos[:], pool.qvel[:] = qpos, qvel
        seconds = 0.0
        for u in controls:
            pool.ctrl[:] = u
            begin = time.perf_counter()
            pool.step(nstep=nsub)
            seconds += time.perf_counter() - begin
            busy(gap)
        return seconds

    def spinning() -> float:
        caller.state[:], other.state[:] = default, default
        caller.qpos[:], caller.qvel[:], qpos_o[:], qvel_o[:] = qpos[:half], qvel[:half], qpos[half:], qvel[half:]
        flag[0] = 0
        worker = threading.Thread(target=_serve, args=(flag, other.ptr, nsub), daemon=True)
        worker.start()
        seconds = 0.0
        for u in controls:
            caller.ctrl[:], ctrl_o[:] = u[:half], u[half:]
            begin = time.perf_counter()
            flag[0] = 1
            caller.step(nstep=nsub)
            _wait(flag)
            seconds += time.perf_counter() - begin
            busy(gap)
        flag[0] = 2  # the worker returns: it spins no more while the pool is timed
        worker.join()
        return seconds

    best = best_of({"pool": pooled, "spinning": spinning}, config.repeats)
    other.close()
    per_step = 1e6 / len(controls)
    return record(
        "spinning_worker",
        task,
        n,
        gap_us=gap_us,
        pool_us=round(best["pool"] * per_step, 1),
        spinning_us=round(best["spinning"] * per_step, 1),
        ratio=round(best["spinning"] / best["pool"], 3),
    )


def main(config: SpinningWorkerConfig) -> None:
    _serve(np.array([2], np.int64), 0, 0)  # compiled before any timing
    _wait(np.zeros(1, np.int64))
    for task in config.tasks:
        for n in config.num_envs:
            for gap in config.gaps_us:
                print(json.dumps(measure(task, n, gap, config)), flush=True)


if __name__ == "__main__":
    main(tyro.cli(SpinningWorkerConfig))
