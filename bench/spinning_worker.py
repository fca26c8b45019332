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
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tyro
from mujoco.batch import Batch
from numba import njit

from robotrl.envs.native_batch import LIBRARY, NativeBatch


@dataclass
class SpinningWorkerConfig:
    tasks: tuple[str, ...] = ("PushT", "Quadruped")
    num_envs: tuple[int, ...] = (8,)
    gaps_us: tuple[int, ...] = (0, 100)
    steps: int = 300
    repeats: int = 5
    seed: int = 0


_lib = ctypes.CDLL(LIBRARY)
_u64 = ctypes.c_uint64
_mjb_step = _lib.mjb_step  # (mjBatch*, const int* ids, int nid, int nstep, int stage): pointers as 64-bit integers
_mjb_step.argtypes, _mjb_step.restype = [_u64, _u64, ctypes.c_int, ctypes.c_int, ctypes.c_int], ctypes.c_int
_memcpy = ctypes.CDLL(None).memcpy  # an opaque call: the flag is read from memory on every turn of a spin
_memcpy.argtypes, _memcpy.restype = [_u64, _u64, _u64], _u64


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


def measure(task: str, n: int, gap_us: int, config: SpinningWorkerConfig) -> dict[str, Any]:
    from physics_call import best_of, busy, record, replayed

    from robotrl.envs import make

    qpos, qvel, controls, nsub = replayed(task, n, config.steps, config.seed)
    model = make(task, num_envs=1, seed=config.seed, render_images=False).task.model
    half, gap = n // 2, 1e-6 * gap_us
    pool = Batch(model, n, nthread=2)
    caller = Batch(model, half, nthread=1)
    other = NativeBatch(model, n - half, 1)  # the C API's batch, whose address the spinning thread steps
    for b in (pool, caller):
        b.bind("sensordata")  # as the backend: an output copied after every call
    qpos_o, qvel_o, ctrl_o = other.bind("qpos"), other.bind("qvel"), other.bind("ctrl")
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
        worker = threading.Thread(target=_serve, args=(flag, other.address, nsub), daemon=True)
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
