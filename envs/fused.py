"""The CPU backend's step with its code beside each env's physics: one call on MuJoCo's thread pool per control step.

`mjb_apply` (robotrl/envs/native_batch.py) runs a C function of ours on every simulation on the batch's threads, with
the simulation's state loaded in the thread's `mjData`. `FusedStep` compiles that function (a numba `cfunc`) per task:
for its env it runs the step's `before` kernel (robotrl/envs/compiled.py, lowered at one row), writes the controls,
calls `mj_step` for the control step's substeps, reads the new state's integration row and sensors and runs the
`after` kernel, each result written to the env's row of an output array. Where the task's reset is compiled, an
episode starts in the same function right where its last step ended it (`resets_in_step`, as EnvPool's workers do):
the model's defaults (`mj_resetData`), the task's start state from the uniform draws the backend holds for the env's
next episode, `mj_forward` for its sensors and the `after` kernel for its first observation, into rows of its own
(the step's results stay those the episode ended with); a second function does the same for the envs a call names
(a reset the backend asks for). The caller is left the action checks, the next draws and the outputs; the step's
code runs on every core, on data its env's physics has just touched. Results equal the unfused step's bit for bit
(tests/envs/test_fused.py).

The function reads mjData's fields through its C layout, built by ctypes from the declarations MuJoCo ships
(`mujoco.introspect`) and checked against an `MjData`'s own arrays; the caller's arrays through a table of their
addresses (`arg`), so that one compiled function serves every env of a task and is cached on disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from typing import Any

import llvmlite.binding as llvm
import mujoco
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from robotrl.envs.compiled import IntoKernel, into_kernel, load_generated, lower_reset
from robotrl.envs.lowering import lower
from robotrl.envs.native_batch import LIBRARY, NativeBatch
from robotrl.envs.step import After, Before, after_rows, before_rows
from robotrl.envs.task import ResetState, Task

# MuJoCo's functions by symbol, resolved when numba links the step (a compiled step that holds no address is cached)
llvm.load_library_permanently(LIBRARY)
mj_step = types.ExternalFunction("mj_step", types.void(types.voidptr, types.voidptr))
mj_get_state = types.ExternalFunction(
    "mj_getState", types.void(types.voidptr, types.voidptr, types.CPointer(types.float64), types.int32)
)
# the thread's mjData stack holds the kernels' temporaries for one env's step
mark_stack = types.ExternalFunction("mj_markStack", types.void(types.voidptr))
free_stack = types.ExternalFunction("mj_freeStack", types.void(types.voidptr))
stack_bytes = types.ExternalFunction("mj_stackAllocByte", types.voidptr(types.voidptr, types.uintp, types.uintp))
mj_forward = types.ExternalFunction("mj_forward", types.void(types.voidptr, types.voidptr))
mj_reset_data = types.ExternalFunction("mj_resetData", types.void(types.voidptr, types.voidptr))
INTEGRATION = int(mujoco.mjtState.mjSTATE_INTEGRATION)


@intrinsic
def address(typingctx: Any, p: Any) -> Any:
    """A pointer's address as an int64."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.ptrtoint(args[0], context.get_value_type(types.int64))

    return types.int64(p), codegen


@intrinsic
def pointer(typingctx: Any, addr: Any, dtype: Any) -> Any:
    """The int64 address `addr` as a pointer to `dtype` (a numba scalar type)."""
    signature = types.CPointer(dtype.dtype)(addr, dtype)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return signature, codegen


_PRIMITIVE = {
    "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint,
    "size_t": ctypes.c_size_t,
    "uintptr_t": ctypes.c_size_t,
    "mjtNum": ctypes.c_double,
    "double": ctypes.c_double,
    "float": ctypes.c_float,
    "mjtByte": ctypes.c_ubyte,
    "unsigned char": ctypes.c_ubyte,
    "char": ctypes.c_char,
    "mjtBool": ctypes.c_ubyte,
    "mjtSize": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64,
}


def _ctype(t: Any) -> Any:
    from mujoco.introspect import ast_nodes, enums, structs

    if isinstance(t, ast_nodes.PointerType):
        return ctypes.c_void_p
    if isinstance(t, ast_nodes.ArrayType):
        inner = _ctype(t.inner_type)
        for extent in reversed(t.extents):
            inner = inner * extent
        return inner
    if t.name in _PRIMITIVE:
        return _PRIMITIVE[t.name]
    if t.name in enums.ENUMS:
        return ctypes.c_int
    if t.name in structs.STRUCTS:
        return c_struct(t.name)
    raise TypeError(f"mujoco.introspect: no C type for {t.name!r}")


@functools.cache
def c_struct(name: str) -> type[ctypes.Structure]:
    """MuJoCo's struct `name` (e.g. "mjData") as a ctypes structure, from the declarations MuJoCo ships."""
    from mujoco.introspect import structs

    fields = [(f.name, _ctype(f.type)) for f in structs.STRUCTS[name].fields]
    return type(name, (ctypes.Structure,), {"_fields_": fields})


#: the mjData fields the fused step reads: arrays through their pointers, and the warning counters in place
POINTER_FIELDS = ("qpos", "qvel", "ctrl", "sensordata")


@functools.cache
def data_offsets() -> dict[str, int]:
    """Byte offsets in mjData of `POINTER_FIELDS` and of `warning`, checked on an MjData's own arrays."""
    layout = c_struct("mjData")
    offsets = {name: getattr(layout, name).offset for name in (*POINTER_FIELDS, "warning")}
    model = mujoco.MjModel.from_xml_string(
        '<mujoco><worldbody><body><joint name="j"/><geom size=".1"/></body></worldbody>'
        '<actuator><motor joint="j"/></actuator><sensor><jointpos joint="j"/></sensor></mujoco>'
    )
    data = mujoco.MjData(model)
    view = layout.from_address(data._address)
    for name in POINTER_FIELDS:
        if getattr(view, name) != getattr(data, name).ctypes.data:
            raise RuntimeError(f"mjData's layout from mujoco.introspect does not match MjData.{name}")
    return offsets


class FusedStep:
    """The step's code and physics of `n` envs in one `mjb_apply`: `run(action)` steps every env and returns the
    step's `After` (copies), as `CompiledStep.after` after `CompiledStep.before` and the batch's step would; where the
    task's reset is compiled too (`resets`), `run` can start the episodes it ends (`resets_in_step`) and
    `reset(ids)` starts those envs' episodes in one more call, each from its row of `draws`."""

    def __init__(
        self,
        task: Task,
        reward_type: str,
        bounds: tuple[np.ndarray, np.ndarray],
        batch: NativeBatch,
        arrays: dict[str, np.ndarray],
    ) -> None:
        import jax
        import jax.numpy as jnp

        self.batch = batch
        sens, goal, steps, draws = arrays["sensordata"], arrays["goal"], arrays["steps"], arrays["draws"]
        n, m = batch.nsim, task.model
        self.action = np.zeros((n, *task.action_spec().shape))
        one = lambda x: np.ascontiguousarray(x[:1])  # noqa: E731
        frame = (one(batch.bind("qpos")), one(batch.bind("qvel")), one(sens), one(goal))
        warning, rows, counts = one(batch.warning), one(batch.state), np.zeros(1, np.int64)
        before_example = (*frame, one(self.action), warning)
        after_example = (*frame, one(self.action), rows, warning, counts, counts)
        lowered_before = lower(functools.partial(before_rows, jnp, task, bounds), *before_example)
        lowered_after = lower(functools.partial(after_rows, jnp, task, reward_type), *after_example)
        before_kernel, after_kernel = into_kernel(lowered_before, 1), into_kernel(lowered_after, 1)
        lowered_reset = lower_reset(task, 1)  # None: the backend resets on the calling thread
        reset_kernel = into_kernel(lowered_reset, 1) if lowered_reset is not None else None
        self.resets = reset_kernel is not None
        self._tree = lowered_after.treedef
        # where the after kernel's results sit among its outputs: the observation's arrays, and the step's own
        at = self._tree.unflatten(list(range(after_kernel.results)))
        self._numeric_at = {key: int(i) for key, i in at.numeric.items()}
        # the after kernel's results: one array (n, ...) each, written row by row; the rest lives on mjData's stack
        self._outs = [np.zeros((n, *shape[1:]), dtype) for shape, dtype in after_kernel.arrays[: after_kernel.results]]
        # the before kernel's results the after kernel reads: rows of their own, since MuJoCo may reset the thread's
        # mjData, its stack included, within mj_step (a blow-up)
        fields = Before._fields
        kept = [fields.index("action"), fields.index("blowups")]
        carried = [np.zeros((n, *before_kernel.arrays[i][0][1:]), before_kernel.arrays[i][1]) for i in kept]
        # `draws`: the uniform draws each env's next episode starts from (the backend's, a row per env); and zeros for
        # what an observation leaves unread of the after kernel's inputs (as `CompiledStep.observe` gives it)
        unread = [np.zeros((n, *x.shape[1:]), x.dtype) for x in after_example[4:]]
        #: 1 where an env whose episode ends in a step starts its next one in the same call (`resets_in_step`)
        self.auto = np.zeros(n, np.int64)
        # the after kernel's results at an episode's start, beside the step's (which keep how the episode ended)
        self._starts = [np.zeros_like(x) for x in self._outs]
        table = [self.action, sens, goal, steps, batch.state, *self._outs, *carried, draws, *unread]
        table += [self.auto, *self._starts]
        for x in table:
            if not x.flags.c_contiguous or x.shape[0] != n:
                raise ValueError("FusedStep: every array it reads or writes is C-contiguous with a row per env")
        self._table = np.array([x.ctypes.data for x in table], np.int64)
        self._keep = table  # the addresses stay valid while these live
        outs = [f"out{i}" for i in range(len(self._outs))]
        names = ["action", "sens", "goal", "steps", "row", *outs, "clipped", "blowups", "draws"]
        names += ["no_action", "no_row", "no_warning", "no_blowups", "no_steps", "auto"]
        starts = [f"start{i}" for i in range(len(self._starts))]
        names += starts
        source = _Source(m, table, names)
        source.imports.append(f"from {before_kernel.module.__name__} import kernel_into as before")
        source.imports.append(f"from {after_kernel.module.__name__} import kernel_into as after")
        if reset_kernel is not None:
            source.imports.append(f"from {reset_kernel.module.__name__} import kernel_into as start_state")
        # the step: the controls straight into the thread's mjData, the rest of the before kernel's arrays on its
        # stack, freed before the physics; the after kernel's results into the env's rows
        source.function("step")
        source.line("mark_stack(d)")
        b = source.on_stack(
            "b", before_kernel.arrays, {fields.index("ctrl"): "ctrl", kept[0]: "clipped", kept[1]: "blowups"}
        )
        source.line(f"before(qpos, qvel, sens, goal, action, warning, {', '.join(b)})")
        source.line("free_stack(d)")
        source.line(f"for _ in range({task.n_substeps}):")
        source.line("    mj_step(m, d)")
        source.line(f"mj_get_state(m, d, pointer(table[4] + sim * {batch.nstate * 8}, numba.float64), {INTEGRATION})")
        source.sensors()
        source.after(after_kernel, outs, "qpos, qvel, sensordata, goal, clipped, row, warning, blowups, steps")
        if reset_kernel is not None:
            # an episode that ended starts again here where `auto` says so (the step's results stay as it ended)
            source.line(f"if auto[0] != 0 and (out{int(at.terminated)}[0] or out{int(at.truncated)}[0]):")
            with source.indented():
                self._start_episode(source, reset_kernel, after_kernel, starts)
            source.function("reset")
            self._start_episode(source, reset_kernel, after_kernel, starts)
        self.source = source.text()
        module = load_generated(self.source, "fused")
        self._step = int(module.step.address)
        self._reset = int(module.reset.address) if reset_kernel is not None else 0
        self._arg = int(self._table.ctypes.data)
        self._jax_tree = jax.tree

    @staticmethod
    def _start_episode(source: _Source, reset_kernel: IntoKernel, after_kernel: IntoKernel, outs: list[str]) -> None:
        """An episode's start: the model's defaults (at rest, time 0, cold solver), the task's start state from the
        env's draws, the sensors of it and its observation (the after kernel's, its other inputs unread)."""
        source.line("mj_reset_data(m, d)")
        source.line("mark_stack(d)")
        # (the start state's fields straight into the thread's mjData and the env's goal row, of the same names)
        r = source.on_stack("r", reset_kernel.arrays, dict(enumerate(ResetState._fields)))
        source.line(f"start_state(draws, {', '.join(r)})")
        source.line("free_stack(d)")
        source.line("mj_forward(m, d)")
        source.sensors()
        inputs = "qpos, qvel, sens, goal, no_action, no_row, no_warning, no_blowups, no_steps"
        source.after(after_kernel, outs, inputs)

    @property
    def resets_in_step(self) -> bool:
        """Whether an env whose episode ends in `run` starts its next one in the same call (from its row of
        `draws`; its first observation for `started`, `run`'s results are how the episode ended); off unless set, and
        only where `resets`."""
        return bool(self.auto[0])  # (every row alike)

    @resets_in_step.setter
    def resets_in_step(self, on: bool) -> None:
        if on and not self.resets:
            raise ValueError("FusedStep.resets_in_step: the task's reset is not compiled")
        self.auto[:] = int(on)

    def run(self, action: np.ndarray) -> After:
        """Step every env by one control step of `action` (finite: the caller checks) and return its results."""
        self.action[:] = action
        self.batch.apply(self._step, self._arg)
        return self._jax_tree.unflatten(self._tree, [x.copy() for x in self._outs])

    def started(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The numeric observations envs `idx` started their episodes with, in the last `run` or `reset`."""
        return {key: self._starts[i][idx] for key, i in self._numeric_at.items()}

    def reset(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Start the episodes of envs `ids` from their rows of `draws`: their simulations, goals and sensors, as the
        unfused reset leaves them; return their numeric observations."""
        self.batch.apply(self._reset, self._arg, ids=ids)
        return self.started(ids)


class _Source:
    """The generated module of a task's fused functions, each `f(m, d, sim, arg)`: its preamble names the thread's
    mjData fields (`POINTER_FIELDS`, `warning`) and the env's row of each array of the table at `arg`."""

    def __init__(self, model: mujoco.MjModel, table: list[np.ndarray], names: list[str]) -> None:
        self.imports = [
            "# generated by robotrl.envs.fused: do not edit (the file name is its hash)",
            "import numba",
            "from numba import carray, types",
            "from robotrl.envs.fused import address, pointer, mj_step, mj_forward, mj_reset_data, mj_get_state, "
            "mark_stack, free_stack, stack_bytes",
        ]
        offsets = data_offsets()
        self.preamble = [
            f"table = carray(pointer(address(arg), numba.int64), ({len(table)},))",
            "base = address(d)",
        ]
        for name, width in zip(POINTER_FIELDS, (model.nq, model.nv, model.nu, model.nsensordata)):
            at = f"carray(pointer(base + {offsets[name]}, numba.int64), (1,))[0]"
            self.preamble.append(f"{name} = carray(pointer({at}, numba.float64), (1, {width}))")
        nwarning = int(mujoco.mjtWarning.mjNWARNING)
        self.preamble.append(f"warning = carray(pointer(base + {offsets['warning']}, numba.int32), (1, {nwarning}, 2))")
        for i, (name, x) in enumerate(zip(names, table, strict=True)):
            row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.itemsize
            self.preamble.append(
                f"{name} = carray(pointer(table[{i}] + sim * {row_bytes}, {_numba_type(x.dtype)}), {(1, *x.shape[1:])})"
            )
        self.body: list[str] = []
        self.nsensordata = model.nsensordata
        self._depth = 1

    @contextlib.contextmanager
    def indented(self) -> Iterator[None]:
        """The lines written inside it are a block one level deeper."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def function(self, name: str) -> None:
        self.body += [
            "",
            "",
            "@numba.cfunc(types.void(types.voidptr, types.voidptr, types.int32, types.voidptr), nogil=True,",
            "             cache=True, error_model='numpy')",
            f"def {name}(m, d, sim, arg):",
            *(f"    {line}" for line in self.preamble),
        ]

    def line(self, text: str) -> None:
        self.body.append("    " * self._depth + text)

    def on_stack(self, prefix: str, arrays: list[tuple[tuple[int, ...], np.dtype]], given: dict[int, str]) -> list[str]:
        """The arrays' names, each allocated on the thread's mjData stack but those `given` (index: name)."""
        for i, (shape, dtype) in enumerate(arrays):
            if i not in given:
                size = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)
                self.line(
                    f"{prefix}{i} = carray(pointer(address(stack_bytes(d, {size}, 8)), {_numba_type(dtype)}), {shape})"
                )
        return [given.get(i, f"{prefix}{i}") for i in range(len(arrays))]

    def sensors(self) -> None:
        """The thread's sensors into the env's row (`mjb_apply` copies no bound field out)."""
        self.line(f"for i in range({self.nsensordata}):")
        self.line("    sens[0, i] = sensordata[0, i]")

    def after(self, kernel: IntoKernel, outs: list[str], inputs: str) -> None:
        """The after kernel on `inputs`, its results into the env's rows, its temporaries on the stack."""
        self.line("mark_stack(d)")
        temporaries = self.on_stack("t", kernel.arrays[kernel.results :], {})
        self.line(f"after({inputs}, {', '.join(outs + temporaries)})")
        self.line("free_stack(d)")

    def text(self) -> str:
        return "\n".join([*self.imports, *self.body]) + "\n"


def _numba_type(dtype: np.dtype) -> str:
    return f"numba.{numba.from_dtype(np.dtype(dtype))}"
