"""Observation images rendered on every core: a `BatchRenderer` in this process and one in each of `workers` child
processes, each env's images drawn by one of them.

One software-GL context (Mesa's llvmpipe, what a headless machine without a GPU has) draws on one core, and MuJoCo's
GL calls hold the GIL, so threads in one process would draw one at a time: the parallel renderers are processes. A
worker is a plain child process (`python -m robotrl.envs.render_pool`, never a re-import of the caller's script, so
it works from any script, a Ray actor or a daemonic process) that reads requests on its stdin and writes images to
its stdout; it exits when this process goes away. Every worker draws with the same model, camera jitter and light
as the calling process would, so its images are the ones `BatchRenderer` gives for those envs. Nothing crosses as a
pickle: the model goes as MuJoCo's binary MJB, arrays as their raw bytes after a JSON header of dtypes and shapes.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import json
import os
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any

import mujoco
import numpy as np

from robotrl.envs.render import BatchRenderer, gl_backend

#: a reply's names: each camera's images under IMAGE + its name, or the worker's exception (its type and message)
IMAGE, ERROR, ERROR_MESSAGE = "image:", "error:type", "error:message"


def model_bytes(model: mujoco.MjModel) -> np.ndarray:
    """A model as MuJoCo's binary MJB, in memory (uint8)."""
    buf = np.empty(mujoco.mj_sizeModel(model), np.uint8)
    mujoco.mj_saveModel(model, None, buf)
    return buf


def model_from_bytes(buf: np.ndarray) -> mujoco.MjModel:
    return mujoco.MjModel.from_binary_path("model.mjb", {"model.mjb": buf.tobytes()})


def pack(**arrays: Any) -> bytes:
    """Named arrays as bytes: the length of a JSON header of each one's dtype and shape, the header, then each one's
    raw bytes (numbers and strings only: nothing is pickled)."""
    arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}
    for name, value in arrays.items():
        if value.dtype.hasobject:
            raise TypeError(f"pack: {name!r} holds Python objects; expected numbers or strings")
    header = json.dumps({k: [v.dtype.str, list(v.shape)] for k, v in arrays.items()}).encode()
    return b"".join([len(header).to_bytes(8, "little"), header, *(v.tobytes() for v in arrays.values())])


def unpack(data: bytes) -> dict[str, np.ndarray]:
    """`pack`'s arrays back (read-only views of `data`)."""
    length = int.from_bytes(data[:8], "little")
    offset, out = 8 + length, {}
    for name, (dtype, shape) in json.loads(data[8:offset]).items():
        count = int(np.prod(shape))
        out[name] = np.frombuffer(data, np.dtype(dtype), count, offset).reshape(shape)
        offset += count * np.dtype(dtype).itemsize
    return out


def default_workers(num_envs: int) -> int:
    """Worker processes for `num_envs` envs: one per core beyond this process's, when each renderer gets at least
    two envs (below that a worker's start and hand-off cost more than it saves)."""
    return max(0, min((os.cpu_count() or 1) - 1, num_envs // 2 - 1))


class RenderPool:
    """`BatchRenderer.render` over `workers` child processes and this one; `workers=0` renders here only."""

    def __init__(self, model: mujoco.MjModel, size: int, workers: int, shadows: bool = False) -> None:
        if workers < 0:
            raise ValueError(f"render workers: expected >= 0, got {workers}")
        gl_backend()  # decided here, once: the workers inherit the choice through the environment
        self._local = BatchRenderer(model, size, shadows)
        self._workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._workers.append(_Worker(model, size, shadows))
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> int:
        return len(self._workers)

    def render(
        self,
        states: np.ndarray,
        mocap: tuple[np.ndarray, np.ndarray] | None,
        cameras: tuple[str, ...],
        camera_jitter: np.ndarray,
        light_scale: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Images (n, size, size, 3) uint8 per camera for n env states (FULLPHYSICS rows), as `BatchRenderer`."""
        n = len(states)
        bounds = np.linspace(0, n, min(len(self._workers), max(n - 1, 0)) + 2).round().astype(int)
        chunks = list(itertools.pairwise(bounds))

        def args(lo: int, hi: int) -> tuple:
            part = None if mocap is None else (mocap[0][lo:hi], mocap[1][lo:hi])
            return states[lo:hi], part, cameras, camera_jitter[lo:hi], light_scale[lo:hi]

        busy = [(worker, lo, hi) for worker, (lo, hi) in zip(self._workers, chunks[1:]) if hi > lo]
        for worker, lo, hi in busy:
            worker.send(args(lo, hi))
        try:
            mine: dict[str, np.ndarray] | BaseException = self._local.render(*args(*chunks[0]))
        except Exception as error:  # noqa: BLE001 -- raised below, once the workers' answers are read
            mine = error
        replies = [worker.reply() for worker, _, _ in busy]  # every worker's answer is read, whatever happened here
        for reply in (mine, *replies):
            if isinstance(reply, BaseException):
                raise reply
        size = self._local.size
        out = {cam: np.empty((n, size, size, 3), np.uint8) for cam in cameras}
        parts = [(*chunks[0], mine)] + [(lo, hi, reply) for (_, lo, hi), reply in zip(busy, replies)]
        for lo, hi, images in parts:
            for cam in cameras:
                out[cam][lo:hi] = images[cam]
        return out

    def close(self) -> None:
        for worker in self._workers:
            worker.close()
        self._workers = []
        self._local.close()


class _Worker:
    """One child process with its own GL context and `BatchRenderer`, spoken to over its stdin and stdout."""

    def __init__(self, model: mujoco.MjModel, size: int, shadows: bool) -> None:
        self._proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-m", "robotrl.envs.render_pool"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None  # both are pipes
        self._out = Connection(self._proc.stdin.fileno(), readable=False)
        self._in = Connection(self._proc.stdout.fileno(), writable=False)
        self._out.send_bytes(pack(model=model_bytes(model), size=np.array(size), shadows=np.array(shadows)))
        started = self.reply()  # the worker's renderer is up, or the error it met
        if isinstance(started, BaseException):
            self.close()
            raise started

    def send(self, request: tuple) -> None:
        """A `BatchRenderer.render` call's arguments."""
        states, mocap, cameras, jitter, light = request
        arrays = {"states": states, "cameras": np.array(cameras, dtype=str), "jitter": jitter, "light": light}
        if mocap is not None:
            arrays.update(mocap_pos=mocap[0], mocap_quat=mocap[1])
        self._out.send_bytes(pack(**arrays))

    def reply(self) -> Any:
        """The answer to the last request: images by camera, or the exception the worker met."""
        try:
            reply = unpack(self._in.recv_bytes())
        except EOFError:
            raise RuntimeError("render worker: the process exited (see its error above)") from None
        if ERROR in reply:
            kind = getattr(builtins, str(reply[ERROR]), None)
            kind = kind if isinstance(kind, type) and issubclass(kind, Exception) else RuntimeError
            return kind(str(reply[ERROR_MESSAGE]))
        return {name.removeprefix(IMAGE): images for name, images in reply.items()}

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):  # already gone
            self._out.close()  # the worker's stdin ends: it exits
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._in.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()


def _serve() -> None:
    """The worker's loop: a renderer from the first message, then images for each request until stdin ends."""
    stdout_fd = os.dup(1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    requests, replies = Connection(0, writable=False), Connection(stdout_fd, readable=False)
    renderer = None
    try:
        while True:
            try:
                m = unpack(requests.recv_bytes())
            except EOFError:
                return
            try:
                if renderer is None:
                    renderer = BatchRenderer(model_from_bytes(m["model"]), int(m["size"]), bool(m["shadows"]))
                    reply: dict[str, np.ndarray] = {}  # the renderer is up: nothing else to say
                else:
                    mocap = (m["mocap_pos"], m["mocap_quat"]) if "mocap_pos" in m else None
                    cameras = tuple(str(c) for c in m["cameras"])
                    images = renderer.render(m["states"], mocap, cameras, m["jitter"], m["light"])
                    reply = {IMAGE + cam: value for cam, value in images.items()}
            except Exception as error:  # noqa: BLE001 -- sent back: the caller raises it
                reply = {ERROR: np.array(type(error).__name__), ERROR_MESSAGE: np.array(str(error))}
            replies.send_bytes(pack(**reply))
    finally:
        if renderer is not None:
            renderer.close()


if __name__ == "__main__":
    _serve()
