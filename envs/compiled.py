"""The CPU backend's per-step code compiled: the task's functions and the step's bookkeeping, written once against
`xp` (robotrl/envs/step.py), lowered to loops (robotrl/envs/lowering.py) and compiled by numba into one native call
on each side of the physics call.

`CompiledStep` holds the two kernels, for any number of envs: `before` (actions -> clipped actions and actuator
controls) and `after` (the observation, reward, success, termination, blow-up and time limit at the new state), and
a third for the task's `reset` (uniform draws -> start states), which an auto-reset calls (where the lowering does
not cover a task's reset, e.g. PickPlace's argsort, it stays numpy).
Their results equal the numpy code's (`NumpyStep`) to float rounding (tests/envs/test_compiled.py).

Compiling a kernel takes seconds; each is cached on disk by the hash of its source and constants, under
`ROBOTRL_CACHE_DIR` (default `$XDG_CACHE_HOME/robotrl`, else `~/.cache/robotrl`), so a task compiles once per
machine. A task whose code the lowering cannot write as loops keeps its numpy code, with one warning.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from robotrl.envs.lowering import VERSION, Lowered, Unsupported, lower
from robotrl.envs.step import NumpyStep, after_rows, before_rows
from robotrl.envs.task import Frame, Task

#: the environment variable that turns the CPU backend's compiled task code off ("0") for a process
ENV_SWITCH = "ROBOTRL_COMPILE_TASK"


def enabled_by_default() -> bool:
    """Whether a CPU backend compiles its task code unless told: yes, unless ROBOTRL_COMPILE_TASK=0."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("ROBOTRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "robotrl"
    )
    return Path(root) / "task-kernels"


def solve_batched(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x with a[i] @ x[i] = b[i] for each i (a (B, n, n), b (B, n, k)): Gaussian elimination with partial pivoting,
    the generated kernels' `jnp.linalg.solve`. Compiled by numba on first use (this Python body is its source)."""
    batch, n, _ = a.shape
    k = b.shape[2]
    out = np.empty((batch, n, k))
    m = np.empty((n, n))
    r = np.empty((n, k))
    for i in range(batch):
        m[:, :] = a[i]
        r[:, :] = b[i]
        for c in range(n):
            pivot, best = c, abs(m[c, c])
            for row in range(c + 1, n):
                if abs(m[row, c]) > best:
                    pivot, best = row, abs(m[row, c])
            if pivot != c:
                for j in range(n):
                    m[c, j], m[pivot, j] = m[pivot, j], m[c, j]
                for j in range(k):
                    r[c, j], r[pivot, j] = r[pivot, j], r[c, j]
            for row in range(c + 1, n):
                f = m[row, c] / m[c, c]
                for j in range(c, n):
                    m[row, j] -= f * m[c, j]
                for j in range(k):
                    r[row, j] -= f * r[c, j]
        for c in range(n - 1, -1, -1):
            for j in range(k):
                s = r[c, j]
                for cc in range(c + 1, n):
                    s -= m[c, cc] * out[i, cc, j]
                out[i, c, j] = s / m[c, c]
    return out


@functools.cache
def _solve_kernel() -> Any:
    """`solve_batched` compiled by numba, once per process (and from numba's disk cache once per machine)."""
    import numba

    return numba.njit(cache=True, nogil=True, error_model="numpy")(solve_batched)


def load_generated(text: str, prefix: str, consts: dict[str, np.ndarray] | None = None) -> ModuleType:
    """The module of generated source `text` (and the constant arrays it loads from its .npz), written once to the
    disk cache under its hash and imported by that name, so that numba's own cache (`cache=True`) finds what it
    compiled there on the next run."""
    import numba

    digest = hashlib.sha256(f"{VERSION}:{numba.__version__}:{np.__version__}\n{text}".encode())
    for name, value in sorted((consts or {}).items()):
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        digest.update(value.tobytes())
    key = f"{prefix}_{digest.hexdigest()[:24]}"
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.py"
    if not path.exists():
        if consts is not None:
            np.savez(folder / f"{key}.{os.getpid()}.npz", allow_pickle=False, **consts)
            os.replace(folder / f"{key}.{os.getpid()}.npz", folder / f"{key}.npz")
        tmp = folder / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)  # whole or absent, when processes compile the same kernel at once
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # numba's cache finds a kernel's module by name
        try:
            spec.loader.exec_module(module)  # numba compiles (or loads) the kernel here
        except BaseException:
            del sys.modules[key]
            raise
    return module


def kernel_module(lowered: Lowered, example: tuple[np.ndarray, ...]) -> ModuleType:
    """The module whose `kernel` is the generated source compiled by numba for arrays of the example's dtypes and
    ranks (any rows, any strides), from the disk cache when this machine compiled it before."""
    types = ", ".join(f"numba.types.Array(numba.from_dtype(np.dtype({x.dtype.str!r})), {x.ndim}, 'A')" for x in example)
    return load_generated(_module_source(lowered, f"({types},), ", lowered.source), "kernel", lowered.consts)


def _module_source(lowered: Lowered, signature: str, body: str) -> str:
    """A generated kernel's module: its constants loaded, then `body` compiled by numba for `signature` (or, where it
    is "", for the types of its first call)."""
    header = [
        "# generated by robotrl.envs.compiled from a task's jaxpr: do not edit (the file name is its hash)",
        "import numpy as np",
        "import numba",
        "from robotrl.envs.compiled import _solve_kernel",
        "",
        "solve_batched = _solve_kernel()",
        "_consts = np.load(__file__[:-3] + '.npz')",
        *(f"{name} = _consts[{name!r}]" for name in lowered.consts),
        "",
        "",
        # IEEE arithmetic as numpy's (no fast-math: NaN, inf and signed zeros, e.g. at atan2's branch cut, as there)
        f"@numba.njit({signature}cache=True, nogil=True, error_model='numpy')",
    ]
    return "\n".join(header) + "\n" + body


#: an array the generated kernel allocates on every call: its results (rows n) and temporaries (a block's rows)
_ALLOCATION = re.compile(r"^    ((?:out|v)\d+) = np\.empty\((.*)\)$")
_SHAPE_DTYPE = re.compile(r"(\(.*\)), np\.(\w+)")


class IntoKernel(NamedTuple):
    """A generated kernel that allocates nothing on a call: `kernel_into(*inputs, *arrays)` writes its results into
    the first `results` of `arrays` and keeps its temporaries in the rest, (shape, dtype) each as `arrays` lists at
    n = the inputs' rows."""

    module: ModuleType
    results: int
    arrays: list[tuple[tuple[int, ...], np.dtype]]


def into_kernel(lowered: Lowered, rows: int) -> IntoKernel:
    """The lowered kernel with its allocations made parameters (for inputs of `rows` rows), so that a caller that runs
    it often on few rows (robotrl/envs/fused.py, one row per env) provides them once."""
    lines, names, arrays = [], [], []
    for line in lowered.source.splitlines():
        match = _ALLOCATION.match(line)
        if match is None:
            lines.append(line)
            continue
        names.append(match.group(1))
        shape, dtype = _SHAPE_DTYPE.fullmatch(match.group(2)).groups()  # type: ignore[union-attr]
        arrays.append((ast.literal_eval(re.sub(r"\bn\b", str(rows), shape)), np.dtype(dtype)))
    source = "\n".join(lines).replace("def kernel(", "def kernel_into(", 1)
    head, rest = source.split("):", 1)
    source = f"{head}, {', '.join(names)}):{rest}"
    module = load_generated(_module_source(lowered, "", source), "into", lowered.consts)
    results = sum(name.startswith("out") for name in names)
    return IntoKernel(module, results, arrays)


def compile_kernel(lowered: Lowered, example: tuple[np.ndarray, ...]) -> Callable[..., Any]:
    """`kernel_module`'s kernel as a function of such arrays that returns the traced function's pytree. An array of
    fewer rows than a block is padded with copies of its last row; the outputs keep the first array's rows (the
    envs')."""
    import jax

    module = kernel_module(lowered, example)
    kernel, treedef, rows = module.kernel, lowered.treedef, lowered.rows

    def call(*arrays: np.ndarray) -> Any:
        n = arrays[0].shape[0]
        if n >= rows:
            return jax.tree.unflatten(treedef, kernel(*arrays))
        index = _padding(rows, n)  # arrays of a block's rows already (e.g. unread zeros) go as they are
        padded = (x if len(x) >= rows else x.take(index, axis=0) for x in arrays)
        return jax.tree.unflatten(treedef, [out[:n] for out in kernel(*padded)])

    return call


@functools.cache
def _padding(rows: int, n: int) -> np.ndarray:
    """The rows that pad n < rows to a block of rows: theirs, then the last one repeated."""
    return np.minimum(np.arange(rows), n - 1)


#: rows (envs) of the block a task kernel is traced at: it runs any number of envs in blocks of these
BLOCK = 8


class CompiledStep(NumpyStep):
    """The CPU backend's step code (robotrl/envs/step.py: the task's control, observation, reward and termination
    with the step's bookkeeping) compiled into two kernels, `before` and `after` the physics call, for any number of
    envs. `example` holds a batch of the arrays the step passes them: the frame, the actions, the state rows and the
    warning counters."""

    def __init__(self, task: Task, reward_type: str, example: StepArrays) -> None:
        import jax.numpy as jnp

        super().__init__(task, reward_type)
        frame = tuple(_zeros(x, BLOCK) for x in example.frame)
        action, rows, warning = (_zeros(x, BLOCK) for x in example[1:])
        counts = np.zeros(BLOCK, np.int64)
        before = functools.partial(before_rows, jnp, task, self.bounds)
        after = functools.partial(after_rows, jnp, task, reward_type)
        self._before = compile_kernel(lower(before, *frame, action, warning), (*frame, action, warning))
        example_after = (*frame, action, rows, warning, counts, counts)
        self._after = compile_kernel(lower(after, *example_after), example_after)
        lowered_reset = lower_reset(task, BLOCK)  # resets are rarer than steps: where it is None, numpy runs it
        if lowered_reset is not None:
            self._reset = compile_kernel(lowered_reset, (np.zeros((BLOCK, task.reset_dims)),))
        #: zeros for the after kernel's inputs that `observe` leaves unread, by rows (at least a block's)
        self._unread = {BLOCK: example_after[4:]}

    def observe(self, frame: Frame) -> dict[str, np.ndarray]:
        """The numeric observations, as the numpy code's `observe` (the step's, with the rest left unread)."""
        size = max(frame.qpos.shape[0], BLOCK)  # fewer envs than a block: the kernel pads the frame alone
        if size not in self._unread:
            self._unread[size] = tuple(_zeros(x, size) for x in self._unread[BLOCK])
        return self._after(*frame, *self._unread[size]).numeric


def lower_reset(task: Task, rows: int) -> Lowered | None:
    """The task's reset (uniform draws -> start states) lowered at `rows` rows, or None where it draws nothing (no rows
    for a kernel to run over) or the lowering does not cover it (e.g. PickPlace's argsort): numpy runs those."""
    import jax.numpy as jnp

    if task.reset_dims == 0:
        return None
    try:
        return lower(functools.partial(task.reset, jnp), np.zeros((rows, task.reset_dims)))
    except Unsupported:
        return None


class StepArrays(NamedTuple):
    """A batch of the arrays a step reads: what the step code is compiled for (their dtypes and trailing shapes)."""

    frame: Frame
    action: np.ndarray  # float64
    rows: np.ndarray  # the simulations' state rows
    warning: np.ndarray  # the simulations' warning counters


def _zeros(x: np.ndarray, rows: int) -> np.ndarray:
    """Zeros of `rows` rows of x's dtype and trailing shape (at a block's rows: the shapes a kernel is traced at)."""
    return np.zeros((rows, *np.shape(x)[1:]), np.asarray(x).dtype)


def differences(code: CompiledStep, reference: NumpyStep, example: StepArrays) -> list[str]:
    """The outputs of `code` that differ from the numpy code's at these arrays (beyond float rounding, or in shape
    or dtype): empty when the compiled code computes what the numpy code does."""
    frame, action, rows, warning = example
    action = np.asarray(action, dtype=np.float64)
    n = len(action)
    # envs one, two and three steps from the time limit, and every other one blown up: both sides of each branch
    steps = (reference.task.config.episode_steps - 1 - np.arange(n) % 3).astype(np.int64)
    draws = np.random.default_rng(0).random((n, reference.task.reset_dims))
    results = []
    for step in (reference, code):
        before = step.before(frame, action, warning)
        after = step.after(frame, before.action, rows, warning, before.blowups - np.arange(n) % 2, steps)
        start = step.reset(draws)
        results.append(
            {
                **before._asdict(),
                **{f"observation {k!r}": v for k, v in after.numeric.items()},
                **{name: value for name, value in after._asdict().items() if name != "numeric"},
                **{f"reset {name}": value for name, value in start._asdict().items()},
            }
        )
    expected, actual = results
    bad = sorted(set(expected) ^ set(actual))
    for name in sorted(set(expected) & set(actual)):
        want, got = np.asarray(expected[name]), np.asarray(actual[name])
        if want.shape != got.shape or want.dtype != got.dtype:
            same = False
        elif want.dtype.kind in "fc":
            same = np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            same = np.array_equal(got, want)
        if not same:
            bad.append(name)
    return bad


def compile_task(task: Task, reward_type: str, example: StepArrays) -> CompiledStep | None:
    """The step code of `task` compiled and checked against its numpy code at `example` (a batch of the arrays a step
    reads), or None, with one warning naming why, where the lowering does not cover the code, numba is missing or a
    result differs: the caller keeps the numpy code."""
    try:
        code = CompiledStep(task, reward_type, example)
        bad = differences(code, NumpyStep(task, reward_type), example)
    except Exception as err:  # noqa: BLE001  # a compiler failure of any kind leaves the env on its numpy code
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        warnings.warn(
            f"{task.name}: task code not compiled ({type(err).__name__}: {reason}); stepping its numpy code",
            stacklevel=2,
        )
        return None
    if bad:
        warnings.warn(
            f"{task.name}: compiled task code unused, its {', '.join(bad)} differ(s) from the numpy code's; "
            "stepping the numpy code",
            stacklevel=2,
        )
        return None
    return code
