"""A function written against an array namespace, traced by JAX and lowered to Python loop nests for numba.

The task code is written once, against `xp` (numpy on the CPU backend, jax.numpy on MJX). At the batch sizes of a CPU
backend (tens of envs) numpy spends most of a step in the fixed cost of each of its calls, not in arithmetic
(bench/RESULTS.md, "The task code compiled by numba from its jaxpr"). Here
the same code is traced once by JAX at fixed shapes (float64) into a jaxpr, and every equation of it is written out
as explicit loops over its output: the source of one function that numba compiles to machine code, with no call
into numpy left per array operation.

How the jaxpr maps to loops:
- all shapes are static, so every loop bound and index is a literal; the first dim of every argument and result is
  the batch (envs), traced at one block of rows and run over any number of rows block by block (`lower`);
- slices, transposes, broadcasts and squeezes are affine maps from an output index to the index of the array they
  read (no copy); a reshape that moves data is a copy, then a numpy view;
- elementwise results are expressions, fused into the loop of whoever reads them, unless read more than once, read
  through a broadcast (a value computed once per env is not recomputed per joint), or too long: then they are
  written to an array first;
- equations whose inputs are all constants are evaluated here by numpy (`fold`: iota, index arithmetic, tables; JAX's
  runtime never starts), and a gather from constant indices becomes one table of flat positions;
- `jnp.linalg.solve` (traced as a named jit) becomes a batched Gaussian elimination with partial pivoting
  (`solve_batched`), where JAX's own lowering would sort pivots and gather through them.
A primitive outside this set raises `Unsupported`, naming it; the caller keeps the numpy code.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: bumped whenever the generated code changes meaning: part of every compiled kernel's cache key
VERSION = 1
#: an elementwise expression longer than this (characters) is written to an array rather than fused further
MAX_EXPR = 1200

BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "max": "np.maximum({0}, {1})",
    "min": "np.minimum({0}, {1})",
    "atan2": "np.arctan2({0}, {1})",
    "pow": "np.power({0}, {1})",
    "rem": "np.fmod({0}, {1})",
    "nextafter": "np.nextafter({0}, {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "and": "({0} & {1})",
    "or": "({0} | {1})",
    "xor": "({0} ^ {1})",
}
UNARY = {
    "neg": "(-{0})",
    "abs": "np.abs({0})",
    "sign": "np.sign({0})",
    "floor": "np.floor({0})",
    "ceil": "np.ceil({0})",
    "round": "np.round({0})",
    "sqrt": "np.sqrt({0})",
    "rsqrt": "(1.0 / np.sqrt({0}))",
    "exp": "np.exp({0})",
    "exp2": "np.exp2({0})",
    "log": "np.log({0})",
    "log1p": "np.log1p({0})",
    "expm1": "np.expm1({0})",
    "sin": "np.sin({0})",
    "cos": "np.cos({0})",
    "tan": "np.tan({0})",
    "asin": "np.arcsin({0})",
    "acos": "np.arccos({0})",
    "atan": "np.arctan({0})",
    "sinh": "np.sinh({0})",
    "cosh": "np.cosh({0})",
    "tanh": "np.tanh({0})",
    "logistic": "(1.0 / (1.0 + np.exp(-{0})))",
    "square": "({0} * {0})",
    "is_finite": "np.isfinite({0})",
    "stop_gradient": "{0}",
    "reduce_precision": "{0}",
}
#: (accumulate, identity) per reduction; the identity of max/min is filled in per dtype
REDUCE = {
    "reduce_sum": ("({a} + {x})", "0"),
    "reduce_prod": ("({a} * {x})", "1"),
    "reduce_max": ("np.maximum({a}, {x})", "lowest"),
    "reduce_min": ("np.minimum({a}, {x})", "highest"),
    "reduce_or": ("({a} | {x})", "False"),
    "reduce_and": ("({a} & {x})", "True"),
}
#: primitives that call a sub-jaxpr: inlined
CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")


class Unsupported(Exception):
    """The traced function uses a primitive (or a form of one) this lowering does not write as loops."""


@dataclass
class Val:
    """A value of the program, read elementwise by `read(index)` (one index expression per dim of `shape`).

    kind: "const" (a numpy array known here), "array" (an array of the generated code, `name`, read through the
    affine map base_index = off + linear @ index), "expr" (a fused elementwise expression), "scalar" (a variable).
    """

    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype
    read: Callable[[list[str]], str]
    name: str = ""
    value: np.ndarray | None = None
    off: tuple[int, ...] = ()
    base: tuple[int, ...] = ()  # the shape of the array `name`
    linear: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    length: int = 0  # an expression's length, for MAX_EXPR
    contiguous: bool = True  # False: an argument, whose strides are the caller's

    @property
    def plain(self) -> bool:
        """An array of the generated code read as it is (C order, no view): what a helper call can take."""
        return (
            self.kind == "array"
            and self.contiguous
            and self.base == self.shape
            and self.linear.shape == (len(self.shape), len(self.shape))
            and bool(np.array_equal(self.linear, np.eye(len(self.shape), dtype=np.int64)))
            and not any(self.off)
        )


@dataclass
class Lowered:
    """The generated source of `def kernel(a0, a1, ...)`, the constant arrays it reads as globals, and the pytree
    structure its flat tuple of results is rebuilt into."""

    source: str
    consts: dict[str, np.ndarray]
    treedef: Any
    rows: int  # the rows of one block: the kernel takes n >= rows


def _index(off: int, terms: list[tuple[int, str]]) -> str:
    parts = [str(off)] if off else []
    for c, var in terms:
        if c:
            var = var if _IDENTIFIER.match(var) else f"({var})"
            parts.append(var if c == 1 else f"{c} * {var}")
    return " + ".join(parts) if parts else "0"


def _broadcast(src: tuple[int, ...], shape: tuple[int, ...], idx: list[str]) -> list[str]:
    """The index into an operand of shape `src` that jaxpr broadcasts (size-1 dims, or a scalar) to `shape`."""
    if not src:
        return []
    return [i if s == n else "0" for s, n, i in zip(src, shape, idx, strict=True)]


def _literal(value: Any) -> str:
    value = np.asarray(value)
    if value.dtype == np.bool_:
        return repr(bool(value))
    if value.dtype.kind == "f":
        v = float(value)
        return repr(v) if np.isfinite(v) else f"np.{value.dtype.name}({str(v)!r})"
    return repr(int(value))


def _np_dtype(dtype: np.dtype) -> str:
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


def _cast(expr: str, dtype: np.dtype) -> str:
    return f"({expr} != 0)" if dtype == np.bool_ else f"{_np_dtype(dtype)}({expr})"


def _extreme(dtype: np.dtype, which: str) -> str:
    if dtype == np.bool_:
        return "False" if which == "lowest" else "True"
    if dtype.kind == "f":
        return "-np.inf" if which == "lowest" else "np.inf"
    info = np.iinfo(dtype)
    return str(info.min if which == "lowest" else info.max)


class _Writer:
    """Writes one jaxpr (and the jaxprs it calls, inlined) as the body of the kernel."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.allocations: list[str] = []
        self.consts: dict[str, np.ndarray] = {}
        self.counter = itertools.count()
        self.depth = 1

    # --- code -------------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.counter)}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """An array of the block's code, allocated once before the loop over blocks and overwritten by each."""
        self.allocations.append(f"    {name} = np.empty({shape}, {_np_dtype(dtype)})")

    def open_loops(self, shape: tuple[int, ...]) -> list[str]:
        idx = [self.fresh("i") for _ in shape]
        for i, n in zip(idx, shape, strict=True):
            self.emit(f"for {i} in range({n}):")
            self.depth += 1
        return idx

    def close_loops(self, shape: tuple[int, ...]) -> None:
        self.depth -= len(shape)

    def const_name(self, value: np.ndarray) -> str:
        for name, known in self.consts.items():
            if known.shape == value.shape and known.dtype == value.dtype and np.array_equal(known, value):
                return name
        name = self.fresh("K")
        self.consts[name] = np.ascontiguousarray(value)
        return name

    # --- values -----------------------------------------------------------------------------------
    def const(self, value: Any) -> Val:
        value = np.asarray(value)
        if value.size and np.unique(value, equal_nan=True).size == 1:  # one value (NaN included): a literal
            text = _literal(value.reshape(-1)[0])
            return Val("const", value.shape, value.dtype, lambda idx: text, value=value)
        name = self.const_name(value)
        return Val("const", value.shape, value.dtype, lambda idx: f"{name}[{', '.join(idx)}]", value=value)

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> Val:
        rank = len(shape)
        return self.affine(name, shape, np.dtype(dtype), (0,) * rank, np.eye(rank, dtype=np.int64), shape)

    def affine(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        off: tuple[int, ...],
        linear: np.ndarray,
        base: tuple[int, ...],
    ) -> Val:
        def read(idx: list[str]) -> str:
            subs = [_index(o, list(zip(row.tolist(), idx, strict=True))) for o, row in zip(off, linear, strict=True)]
            return f"{name}[{', '.join(subs)}]"

        return Val("array", shape, dtype, read, name=name, off=off, linear=linear, base=base)

    def scalar(self, expr: str, dtype: np.dtype) -> Val:
        name = self.fresh("s")
        self.emit(f"{name} = {expr}")
        return Val("scalar", (), dtype, lambda idx: name, name=name)

    def materialize(self, v: Val) -> Val:
        """v as an array of the generated code (or a scalar variable): the value computed once, read many times."""
        if v.kind in ("array", "scalar") or (v.kind == "const" and v.shape):
            return v
        if not v.shape:
            return self.scalar(v.read([]), v.dtype)
        return self.array(self.copy(v), v.shape, v.dtype)

    def plain(self, v: Val) -> str:
        """The name of a C-ordered array holding v (a copy unless v is one already)."""
        if v.kind == "const":
            return self.const_name(np.asarray(v.value))
        return v.name if v.plain else self.copy(v)

    def copy(self, v: Val) -> str:
        """A new C-ordered array of the block's code written with v, element by element: its name."""
        name = self.fresh("v")
        self.allocate(name, v.shape, v.dtype)
        idx = self.open_loops(v.shape)
        self.emit(f"{name}[{', '.join(idx)}] = {v.read(idx)}")
        self.close_loops(v.shape)
        return name

    def expr(self, shape: tuple[int, ...], dtype: np.dtype, fmt: str, ins: list[Val]) -> Val:
        """An elementwise result, fused: `fmt` formatted with the inputs read at the index."""
        ins = [
            self.materialize(v) if v.kind == "expr" and any(a < b for a, b in zip(v.shape, shape, strict=True)) else v
            for v in ins
        ]  # an input broadcast over a dim is computed once, not once per element it meets

        def read(idx: list[str]) -> str:
            return fmt.format(*(v.read(_broadcast(v.shape, shape, idx)) for v in ins))

        length = len(fmt) + sum(v.length or 12 for v in ins)
        out = Val("expr", shape, dtype, read, length=length)
        if not shape:
            return self.scalar(read([]), dtype)
        return self.materialize(out) if length > MAX_EXPR else out

    def view(self, v: Val, shape: tuple[int, ...], off: list[int], mapping: np.ndarray) -> Val:
        """v read at its index off + mapping @ index, for an index of `shape` (mapping: v's rank x len(shape))."""
        broadcasts = any(n > 1 and not mapping[:, d].any() for d, n in enumerate(shape))
        if v.kind == "expr" and broadcasts:
            v = self.materialize(v)  # computed once, not once per broadcast element
        if v.kind == "scalar":
            return v if not shape else Val("expr", shape, v.dtype, v.read, length=len(v.name))
        if v.kind == "array":
            new_off = tuple(int(x) for x in np.asarray(v.off) + v.linear @ np.asarray(off, dtype=np.int64))
            out = self.affine(v.name, shape, v.dtype, new_off, v.linear @ mapping, v.base)
            return self.scalar(out.read([]), v.dtype) if not shape else out
        inner = v

        def read(idx: list[str]) -> str:
            return inner.read(
                [_index(o, list(zip(row.tolist(), idx, strict=True))) for o, row in zip(off, mapping, strict=True)]
            )

        out = Val("expr", shape, v.dtype, read, length=inner.length + 8 * len(shape))
        return self.scalar(read([]), v.dtype) if not shape else out

    # --- the program ------------------------------------------------------------------------------
    def run(self, jaxpr: Any, consts: list[Any], args: list[Val]) -> list[Val]:
        from jax.extend import core as jcore

        uses: Counter = Counter()
        for eqn in jaxpr.eqns:
            uses.update(a for a in eqn.invars if not isinstance(a, jcore.Literal))
        uses.update(a for a in jaxpr.outvars if not isinstance(a, jcore.Literal))
        env: dict[Any, Val] = {}
        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[var] = self.const(np.asarray(c))
        for var, a in zip(jaxpr.invars, args, strict=True):
            env[var] = self.materialize(a) if a.kind == "expr" and uses[var] > 1 else a

        def get(atom: Any) -> Val:
            return self.const(np.asarray(atom.val)) if isinstance(atom, jcore.Literal) else env[atom]

        for eqn in jaxpr.eqns:
            for var, out in zip(eqn.outvars, self.equation(eqn, [get(a) for a in eqn.invars]), strict=True):
                env[var] = self.materialize(out) if out.kind == "expr" and uses[var] > 1 else out
        return [get(a) for a in jaxpr.outvars]

    def equation(self, eqn: Any, ins: list[Val]) -> list[Val]:
        prim, p = eqn.primitive.name, eqn.params
        if prim in CALLS:
            if p.get("name") == "solve" and len(ins) == 2:
                return [self.solve(eqn, ins[0], ins[1])]
            closed = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
            if closed is None:
                raise Unsupported(f"{prim} without a jaxpr")
            if hasattr(closed, "consts"):
                return self.run(closed.jaxpr, list(closed.consts), ins)
            return self.run(closed, [], ins)
        if all(v.kind == "const" for v in ins):  # evaluated here, once
            return [self.const(out) for out in fold(eqn, [np.asarray(v.value) for v in ins])]
        aval = eqn.outvars[0].aval
        shape, dtype = tuple(int(d) for d in aval.shape), np.dtype(aval.dtype)
        if prim in BINARY:
            return [self.expr(shape, dtype, BINARY[prim], ins)]
        if prim in UNARY:
            return [self.expr(shape, dtype, UNARY[prim], ins)]
        if prim == "not":
            return [self.expr(shape, dtype, "(not {0})" if dtype == np.bool_ else "(~{0})", ins)]
        if prim == "integer_pow":
            y = int(p["y"])
            fmt = "(" + " * ".join(["{0}"] * y) + ")" if 1 <= y <= 4 else f"np.power({{0}}, {float(y)!r})"
            return [self.expr(shape, dtype, fmt, ins)]
        if prim == "clamp":
            return [self.expr(shape, dtype, "np.minimum(np.maximum({1}, {0}), {2})", ins)]
        if prim == "select_n":
            if len(ins) != 3:
                raise Unsupported("select_n with more than two cases")
            return [self.expr(shape, dtype, "({2} if {0} else {1})", ins)]
        if prim == "convert_element_type":
            if ins[0].dtype == dtype:
                return ins
            return [self.expr(shape, dtype, _cast("{0}", dtype), ins)]
        if prim in ("copy", "copy_p", "optimization_barrier"):
            return ins
        if prim in ("concatenate", "stack"):
            return [self.concatenate(shape, dtype, int(p["dimension" if prim == "concatenate" else "axis"]), prim, ins)]
        if prim == "dot_general":
            return [self.dot(p["dimension_numbers"], shape, dtype, ins[0], ins[1])]
        if prim in REDUCE:
            return [self.reduce(prim, [int(a) for a in p["axes"]], shape, dtype, ins[0])]
        if prim == "gather":
            return [self.gather(eqn, shape, dtype, ins[0], ins[1])]
        x = ins[0]
        if x.kind == "const":
            raise Unsupported(f"{prim} of a constant with a traced operand")
        return [self.reshaping(prim, p, shape, x)]

    def reshaping(self, prim: str, p: Any, shape: tuple[int, ...], x: Val) -> Val:
        rank_in, rank_out = len(x.shape), len(shape)
        mapping = np.zeros((rank_in, rank_out), dtype=np.int64)
        off = [0] * rank_in
        if prim == "broadcast_in_dim":
            for j, d in enumerate(p["broadcast_dimensions"]):
                mapping[j, int(d)] = int(x.shape[j] == shape[int(d)])
        elif prim in ("reshape", "squeeze", "expand_dims"):
            kept_in = [j for j in range(rank_in) if x.shape[j] != 1]
            kept_out = [d for d in range(rank_out) if shape[d] != 1]
            if [x.shape[j] for j in kept_in] != [shape[d] for d in kept_out]:  # data moves: a copy, then a view
                name = self.fresh("v")
                self.emit(f"{name} = {self.plain(x)}.reshape({shape})")
                return self.array(name, shape, x.dtype)
            for j, d in zip(kept_in, kept_out, strict=True):
                mapping[j, d] = 1
        elif prim == "slice":
            strides = p["strides"] or (1,) * rank_in
            off = [int(s) for s in p["start_indices"]]
            for j in range(rank_in):
                mapping[j, j] = int(strides[j])
        elif prim == "transpose":
            for d, j in enumerate(p["permutation"]):
                mapping[int(j), d] = 1
        else:
            raise Unsupported(prim)
        return self.view(x, shape, off, mapping)

    def concatenate(self, shape: tuple[int, ...], dtype: np.dtype, axis: int, prim: str, ins: list[Val]) -> Val:
        name = self.fresh("v")
        self.allocate(name, shape, dtype)
        start = 0
        for v in ins:
            size = 1 if prim == "stack" else v.shape[axis]
            part = shape[:axis] + (size,) + shape[axis + 1 :]
            idx = self.open_loops(part)
            write = list(idx)
            write[axis] = f"{start} + {idx[axis]}" if start else idx[axis]
            read = idx[:axis] + idx[axis + 1 :] if prim == "stack" else idx
            src = v.shape if prim != "stack" else shape[:axis] + shape[axis + 1 :]
            self.emit(f"{name}[{', '.join(write)}] = {v.read(_broadcast(v.shape, src, read))}")
            self.close_loops(part)
            start += size
        return self.array(name, shape, dtype)

    def reduce(self, prim: str, axes: list[int], shape: tuple[int, ...], dtype: np.dtype, x: Val) -> Val:
        step, identity = REDUCE[prim]
        if identity in ("lowest", "highest"):
            identity = _extreme(dtype, identity)
        elif dtype.kind == "f" and identity in ("0", "1"):
            identity += ".0"
        keep = [d for d in range(len(x.shape)) if d not in axes]
        out = self.fresh("v") if shape else ""
        if shape:
            self.allocate(out, shape, dtype)
        idx = self.open_loops(shape)
        inner = [self.fresh("j") for _ in axes]
        full = [""] * len(x.shape)
        for d, i in zip(keep, idx, strict=True):
            full[d] = i
        for d, j in zip(axes, inner, strict=True):
            full[d] = j
        loops = [(j, x.shape[d]) for d, j in zip(axes, inner, strict=True)]
        acc = self.accumulate(identity, loops, step.replace("{x}", x.read(full)))
        if shape:
            self.emit(f"{out}[{', '.join(idx)}] = {acc}")
        self.close_loops(shape)
        if shape:
            return self.array(out, shape, dtype)
        return Val("scalar", (), dtype, lambda _: acc, name=acc)

    def accumulate(self, init: str, loops: list[tuple[str, int]], update: str) -> str:
        """A scalar variable set to `init`, then to `update` (its "{a}" the variable) in nested loops (name, size)."""
        acc = self.fresh("s")
        self.emit(f"{acc} = {init}")
        for var, size in loops:
            self.emit(f"for {var} in range({size}):")
            self.depth += 1
        self.emit(f"{acc} = {update.replace('{a}', acc)}")
        self.depth -= len(loops)
        return acc

    def dot(self, dims: Any, shape: tuple[int, ...], dtype: np.dtype, a: Val, b: Val) -> Val:
        (lc, rc), (lb, rb) = dims
        lc, rc, lb, rb = ([int(x) for x in t] for t in (lc, rc, lb, rb))
        a, b = self.materialize(a), self.materialize(b)  # each element is read once per output it meets
        free_a = [d for d in range(len(a.shape)) if d not in lc and d not in lb]
        free_b = [d for d in range(len(b.shape)) if d not in rc and d not in rb]
        name = self.fresh("v")
        self.allocate(name, shape, dtype)
        idx = self.open_loops(shape)
        ia, ib = [""] * len(a.shape), [""] * len(b.shape)
        for k, (da, db) in enumerate(zip(lb, rb, strict=True)):
            ia[da] = ib[db] = idx[k]
        for k, d in enumerate(free_a):
            ia[d] = idx[len(lb) + k]
        for k, d in enumerate(free_b):
            ib[d] = idx[len(lb) + len(free_a) + k]
        inner = [self.fresh("k") for _ in lc]
        for da, db, j in zip(lc, rc, inner, strict=True):
            ia[da] = ib[db] = j
        loops = [(j, a.shape[d]) for d, j in zip(lc, inner, strict=True)]
        acc = self.accumulate("0.0" if dtype.kind == "f" else "0", loops, f"({{a}} + {a.read(ia)} * {b.read(ib)})")
        self.emit(f"{name}[{', '.join(idx)}] = {acc}")
        self.close_loops(shape)
        return self.array(name, shape, dtype)

    def gather(self, eqn: Any, shape: tuple[int, ...], dtype: np.dtype, x: Val, indices: Val) -> Val:
        """A gather from constant indices: a table of the flat position each output element reads."""
        if indices.kind != "const":
            raise Unsupported("gather with traced indices")
        positions = np.arange(int(np.prod(x.shape)), dtype=np.int64).reshape(x.shape)
        table = gather_numpy(positions, np.asarray(indices.value), eqn.params, shape, fill=-1)
        if (table < 0).any():
            raise Unsupported("gather out of bounds")
        flat = self.fresh("v")
        self.emit(f"{flat} = {self.plain(x)}.reshape(-1)")
        if not shape:
            return self.scalar(f"{flat}[{int(table)}]", dtype)
        key = self.const_name(table)
        return Val("expr", shape, dtype, lambda idx: f"{flat}[{key}[{', '.join(idx)}]]", length=24)

    def solve(self, eqn: Any, a: Val, b: Val) -> Val:
        shapes = [tuple(int(d) for d in v.aval.shape) for v in (*eqn.invars, *eqn.outvars)]
        if any(len(shape) != 3 for shape in shapes):
            raise Unsupported(f"solve of shapes {shapes[0]}, {shapes[1]}")
        name = self.fresh("v")
        self.emit(f"{name} = solve_batched({self.plain(a)}, {self.plain(b)})")
        return self.array(name, shapes[2], np.dtype(np.float64))


#: constant equations evaluated by numpy (JAX's own evaluation would start its runtime and its threads in a process
#: that only traces, and warn at every later fork): numpy's function of the inputs and the equation's parameters
FOLD: dict[str, Callable[..., np.ndarray]] = {
    "add": lambda p, a, b: a + b,
    "sub": lambda p, a, b: a - b,
    "mul": lambda p, a, b: a * b,
    "neg": lambda p, a: -a,
    "max": lambda p, a, b: np.maximum(a, b),
    "min": lambda p, a, b: np.minimum(a, b),
    "lt": lambda p, a, b: a < b,
    "le": lambda p, a, b: a <= b,
    "gt": lambda p, a, b: a > b,
    "ge": lambda p, a, b: a >= b,
    "eq": lambda p, a, b: a == b,
    "ne": lambda p, a, b: a != b,
    "and": lambda p, a, b: a & b,
    "or": lambda p, a, b: a | b,
    "not": lambda p, a: ~a,
    "abs": lambda p, a: np.abs(a),
    "integer_pow": lambda p, a: a ** int(p["y"]),
    "select_n": lambda p, which, *cases: np.choose(which.astype(np.int64), cases),
    "convert_element_type": lambda p, a: a.astype(p["new_dtype"]),
    "iota": lambda p: np.broadcast_to(
        np.arange(p["shape"][p["dimension"]]).reshape(
            [-1 if d == p["dimension"] else 1 for d in range(len(p["shape"]))]
        ),
        p["shape"],
    ).astype(p["dtype"]),
    "broadcast_in_dim": lambda p, a: np.broadcast_to(
        a.reshape(
            [
                a.shape[list(p["broadcast_dimensions"]).index(d)] if d in p["broadcast_dimensions"] else 1
                for d in range(len(p["shape"]))
            ]
        ),
        p["shape"],
    ),
    "reshape": lambda p, a: a.reshape(p["new_sizes"]),
    "squeeze": lambda p, a: np.squeeze(a, axis=tuple(p["dimensions"])),
    "expand_dims": lambda p, a: np.expand_dims(a, tuple(p["dimensions"])),
    "transpose": lambda p, a: np.transpose(a, tuple(p["permutation"])),
    "slice": lambda p, a: a[
        tuple(
            slice(b, e, s)
            for b, e, s in zip(p["start_indices"], p["limit_indices"], p["strides"] or [1] * a.ndim, strict=True)
        )
    ],
    "concatenate": lambda p, *a: np.concatenate(a, axis=p["dimension"]),
    "stack": lambda p, *a: np.stack(a, axis=p["axis"]),
    "reduce_sum": lambda p, a: np.sum(a, axis=tuple(p["axes"])),
    "reduce_max": lambda p, a: np.max(a, axis=tuple(p["axes"])),
    "reduce_min": lambda p, a: np.min(a, axis=tuple(p["axes"])),
    "reduce_or": lambda p, a: np.any(a, axis=tuple(p["axes"])),
    "reduce_and": lambda p, a: np.all(a, axis=tuple(p["axes"])),
}


def fold(eqn: Any, values: list[np.ndarray]) -> list[np.ndarray]:
    """An equation of constants evaluated here, as numpy arrays of the dtypes and shapes the jaxpr gives them."""
    name = eqn.primitive.name
    if name == "gather":
        out = eqn.outvars[0].aval
        return [gather_numpy(values[0], values[1], eqn.params, tuple(out.shape), eqn.params.get("fill_value"))]
    if name not in FOLD:
        outs = eqn.primitive.bind(*values, **eqn.params)  # rare: JAX evaluates it
        return [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else [outs])]
    result = np.asarray(FOLD[name](eqn.params, *values))
    aval = eqn.outvars[0].aval
    return [np.array(np.broadcast_to(result, tuple(aval.shape)), dtype=np.dtype(aval.dtype))]  # 0-d stays 0-d


def gather_numpy(
    operand: np.ndarray, indices: np.ndarray, params: Any, shape: tuple[int, ...], fill: Any
) -> np.ndarray:
    """XLA's gather (JAX's `gather` primitive, the index vector on the last axis of `indices`) in numpy, element by
    element: for constant tables, where the arrays are small. Out-of-bounds starts are clamped, or give `fill` in
    FILL_OR_DROP mode."""
    dims = params["dimension_numbers"]
    offset_dims = [int(d) for d in dims.offset_dims]
    collapsed = {int(d) for d in dims.collapsed_slice_dims}
    start_map = [int(d) for d in dims.start_index_map]
    operand_batching = [int(d) for d in getattr(dims, "operand_batching_dims", ())]
    indices_batching = [int(d) for d in getattr(dims, "start_indices_batching_dims", ())]
    slice_sizes = [int(s) for s in params["slice_sizes"]]
    window = [d for d in range(operand.ndim) if d not in collapsed and d not in operand_batching]
    filling = "FILL" in str(params.get("mode", ""))
    out = np.empty(shape, dtype=operand.dtype)
    for index in np.ndindex(*shape):
        batch = [index[d] for d in range(len(shape)) if d not in offset_dims]
        vector = indices[tuple(batch)] if indices.ndim > 1 else indices
        start = [0] * operand.ndim
        for k, d in enumerate(start_map):
            start[d] = int(np.reshape(vector, -1)[k])
        for od, idd in zip(operand_batching, indices_batching, strict=True):
            start[od] = batch[idd]
        limit = [operand.shape[d] - slice_sizes[d] for d in range(operand.ndim)]
        if any(not 0 <= start[d] <= limit[d] for d in range(operand.ndim)):
            if filling:
                out[index] = fill
                continue
            start = [min(max(start[d], 0), limit[d]) for d in range(operand.ndim)]
        position = list(start)
        for k, d in enumerate(window):
            position[d] += index[offset_dims[k]]
        out[index] = operand[tuple(position)]
    return out


def lower(fn: Callable[..., Any], *example: np.ndarray) -> Lowered:
    """`fn(*arrays)` (written against jax.numpy; every argument and result a batch of rows along its first dim,
    each row computed from the same row of the arguments alone) traced in float64 at the shapes of `example`, whose
    rows make one block, and written as the source of `kernel(a0, a1, ...)`: it takes arguments of any number of rows
    n >= the block's, runs the traced code on consecutive blocks of rows (the last one overlapping the one before
    where n is not a multiple: rows are independent, so recomputing some is harmless), and returns the results'
    leaves as a tuple."""
    import jax

    rows = int(np.shape(example[0])[0])
    if any(np.ndim(x) == 0 or np.shape(x)[0] != rows for x in example):
        raise Unsupported(f"arguments of different numbers of rows: {[np.shape(x) for x in example]}")
    with jax.enable_x64(True):
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*example)
    specs = jax.tree.leaves(out_shape)
    if any(len(spec.shape) == 0 or int(spec.shape[0]) != rows for spec in specs):
        raise Unsupported(f"results that are not one row per argument row: {[tuple(x.shape) for x in specs]}")
    writer = _Writer()
    writer.depth = 2
    args = [writer.array(f"x{i}", tuple(np.shape(x)), np.asarray(x).dtype) for i, x in enumerate(example)]
    for arg in args:
        arg.contiguous = False
    with jax.enable_x64(True):
        outs = writer.run(closed.jaxpr, list(closed.consts), args)
    results = []
    for out, spec in zip(outs, specs, strict=True):
        shape = tuple(int(d) for d in spec.shape)
        if out.kind == "const":
            results.append(writer.const_name(np.ascontiguousarray(np.broadcast_to(np.asarray(out.value), shape))))
        else:
            results.append(writer.plain(out))
    params = [f"a{i}" for i in range(len(example))]
    head = ["    n = a0.shape[0]"]
    for k, spec in enumerate(specs):
        row = ", ".join(str(int(d)) for d in spec.shape[1:])
        head.append(f"    out{k} = np.empty((n, {row}), {_np_dtype(np.dtype(spec.dtype))})")
    head.extend(writer.allocations)
    head.append(f"    for block in range((n + {rows - 1}) // {rows}):")
    head.append(f"        r = min(block * {rows}, n - {rows})")
    head.extend(f"        x{i} = a{i}[r : r + {rows}]" for i in range(len(example)))
    tail = [f"        out{k}[r : r + {rows}] = {name}" for k, name in enumerate(results)]
    outputs = ", ".join(f"out{k}" for k in range(len(specs)))
    source = "\n".join([f"def kernel({', '.join(params)}):", *head, *writer.lines, *tail, f"    return ({outputs},)"])
    return Lowered(source + "\n", writer.consts, jax.tree.structure(out_shape), rows)
