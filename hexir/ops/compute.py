"""A small tensor-expression DSL: one call builds the loop nest and Block of one stage.

    k = Kernel(reserved=["A", "B", "C"])
    k.reduce("matmul", C, (K,), lambda s, r: A[s[0], r[0]] * B[r[0], s[1]])
    k.body()    # for %i0, for %i1, for %k0 { block @matmul(vi0 = spatial %i0, ...) { ... } }

Every stage is a `serial` loop nest over the output shape (reduce loops innermost) around one
Block whose iter vars are bound one-to-one to the loops; its reads and writes are the point
accesses found in its body. Names are deterministic: loops `i<n>` (spatial) and `k<n>`
(reduce) numbered across the whole function, iter vars `v` + their loop's name, block names
as given with `_1`, `_2`, ... on repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hexir.ir.dtype import is_float, numpy_dtype
from hexir.ir.graph import Op
from hexir.ir.names import unique_name
from hexir.ir.narrow import NARROW_FLOATS, in_float32
from hexir.ir.symbolic import Dim, Sym
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Cast,
    Expr,
    For,
    IntImm,
    IterVar,
    Select,
    Stmt,
    Var,
    as_expr,
    const,
    seq,
)
from hexir.ir.visit import walk

Indices = tuple[Expr, ...]
SpatialFn = Callable[[Indices], Expr]
ReduceFn = Callable[[Indices, Indices], Expr]


class Kernel:
    """Collects the allocations and stages of one PrimFunc body and hands out unique names."""

    def __init__(self, reserved: Iterable[str] = ()):
        self._names: set[str] = set(reserved)  # every %name: params, buffers, loops, iter vars
        self._blocks: set[str] = set()
        self._counters = {"i": 0, "k": 0}
        self.domains: dict[Var, int] = {}  # iter var -> fixed extent, for `bound`
        self.allocs: list[Buffer] = []
        self.stages: list[Stmt] = []

    def fresh(self, base: str) -> str:
        """`base`, or `base_1`, `base_2`, ... whichever is still free among the % names."""
        return unique_name(base, self._names)

    def alloc(self, name: str, shape: Sequence[int], dtype: str) -> Buffer:
        """A global intermediate buffer, declared at the top of the body."""
        buf = Buffer(self.fresh(name), tuple(shape), dtype)
        self.allocs.append(buf)
        return buf

    def compute(self, name: str, out: Buffer, fn: SpatialFn) -> None:
        """`out[v...] = fn(v...)` for every index of `out`."""
        spatial = self._iter_vars("i", "spatial", out.shape)
        ivs = tuple(iv.var for iv in spatial)
        value = _checked(fn(ivs), out, name)
        body = BufferStore(out, ivs, value)
        self._stage(name, spatial, _regions(value), out, body, None)

    def reduce(
        self,
        name: str,
        out: Buffer,
        extents: Sequence[int],
        fn: ReduceFn,
        combine: str = "+",
        init: Expr | None = None,
    ) -> None:
        """`out[s...] = init; out[s...] = combine(out[s...], fn(s, r))` over reduce axes `r`.

        `combine` is a binary operator ("+", "max", "min"); `init` defaults to 0 of out's dtype.
        """
        if out.dtype in NARROW_FLOATS and combine == "+" and init is None:
            # A sum of narrow floats accumulates in float32 and rounds once, as the numpy
            # reference sums in float64: no rounding of each partial sum to 8 or 11 bits.
            acc = self.alloc(f"{out.name}_f32", out.shape, "float32")
            self.reduce(name, acc, extents, lambda s, r: in_float32(fn(s, r), rounded=False))
            self.compute(f"{name}_round", out, lambda s: Cast(out.dtype, BufferLoad(acc, s)))
            return
        init = const(0, out.dtype) if init is None else init
        if 0 in extents:  # a reduction of no elements is its identity (its init never runs)
            self.compute(name, out, lambda s: init)
            return
        spatial = self._iter_vars("i", "spatial", out.shape)
        reduce = self._iter_vars("k", "reduce", extents)
        s = tuple(iv.var for iv in spatial)
        value = _checked(fn(s, tuple(iv.var for iv in reduce)), out, name)
        body = BufferStore(out, s, Binary(combine, BufferLoad(out, s), value))
        # The accumulator's own read is implied by the write: reads list the operands only.
        reads = _regions(value)
        self._stage(name, spatial + reduce, reads, out, body, BufferStore(out, s, init))

    def bound(self, expr: Expr) -> tuple[int, int] | None:
        """The interval of an integer index expression over the iter var domains, if known."""
        return bound(expr, self.domains)

    def body(self) -> Stmt:
        return seq(*(Allocate(b) for b in self.allocs), *self.stages)

    def _iter_vars(self, prefix: str, kind: str, extents: Sequence[int]) -> tuple[IterVar, ...]:
        result = []
        for extent in extents:
            while f"{prefix}{self._counters[prefix]}" in self._names:
                self._counters[prefix] += 1
            loop = Var(self.fresh(f"{prefix}{self._counters[prefix]}"))
            var = Var(self.fresh(f"v{loop.name}"))
            if isinstance(extent, int):  # a symbolic extent bounds nothing
                self.domains[var] = extent
            result.append(IterVar(var, kind, extent, loop))
        return tuple(result)

    def _stage(
        self,
        name: str,
        iter_vars: tuple[IterVar, ...],
        reads: tuple[BufferRegion, ...],
        out: Buffer,
        body: Stmt,
        init: Stmt | None,
    ) -> None:
        spatial = tuple(iv.var for iv in iter_vars if iv.kind == "spatial")
        writes = (BufferRegion(out, spatial),)
        stmt: Stmt = Block(unique_name(name, self._blocks), iter_vars, reads, writes, body, init)
        for iv in reversed(iter_vars):
            assert isinstance(iv.binding, Var)
            stmt = For(iv.binding, iv.dom, "serial", stmt)
        self.stages.append(stmt)


def _checked(value: Expr, out: Buffer, name: str) -> Expr:
    # A dtype mismatch here is a lowering bug; catching it now beats a C compiler warning later.
    if value.dtype != out.dtype:
        raise TypeError(f"block @{name}: value of dtype {value.dtype} stored to {out.dtype} buffer")
    return value


def _regions(value: Expr) -> tuple[BufferRegion, ...]:
    """The distinct point accesses of `value`, in order of first appearance."""
    seen: dict[BufferRegion, None] = {}
    for node in walk(value):
        if isinstance(node, BufferLoad):
            seen.setdefault(BufferRegion(node.buffer, node.indices), None)
    return tuple(seen)


# ---------------------------------------------------------------------------------------------
# Index arithmetic that folds the trivial cases, so the unscheduled IR reads like hand-written.


def add(a: Expr, b: Expr | Dim) -> Expr:
    if isinstance(b, Sym):  # a symbolic size: its value, an argument of the kernel
        b = as_expr(b)
    if isinstance(b, int):
        if b == 0:
            return a
        return Binary("-", a, IntImm(-b)) if b < 0 else Binary("+", a, IntImm(b))
    if a == IntImm(0):
        return b
    return a if b == IntImm(0) else Binary("+", a, b)


def mul(a: Expr, c: int) -> Expr:
    if c == 0:
        return IntImm(0)
    return a if c == 1 else Binary("*", a, IntImm(c))


def floordiv(a: Expr, c: int) -> Expr:
    return a if c == 1 else Binary("floordiv", a, IntImm(c))


def affine(terms: Iterable[tuple[Expr, int]], offset: int = 0) -> Expr:
    """sum(var * coef) + offset: positive terms first, then the negative ones subtracted
    (`4 - vi1`, not `vi1 * -1 + 4`); zero coefficients dropped."""
    terms = [(v, c) for v, c in terms if c]
    result: Expr = IntImm(0)
    if not any(c > 0 for _, c in terms):
        result, offset = IntImm(offset), 0
    for v, c in terms:
        if c > 0:
            result = add(result, mul(v, c))
    for v, c in terms:
        if c < 0:
            result = Binary("-", result, mul(v, -c))
    return add(result, offset)


def bound(expr: Expr, domains: dict[Var, int]) -> tuple[int, int] | None:
    """Interval arithmetic over `+ - * floordiv floormod min max` of vars with known extents;
    a clamp `max(min(e, hi), lo)` is bounded by its constants even where `e` is not (an index
    loaded at run time, as gather's)."""
    match expr:
        case IntImm(value, _):
            return value, value
        case Var():
            return (0, domains[expr] - 1) if expr in domains else None
        case Binary(op, a, b):
            ba, bb = bound(a, domains), bound(b, domains)
            if (ba is None or bb is None) and op not in ("min", "max"):
                return None  # a var of unknown extent (a symbolic one)
            if ba is None or bb is None:
                lo, hi = _half_bound(expr, domains)
                return None if lo is None or hi is None else (lo, hi)
            return _bound_binary(op, ba, bb)
    return None


def _half_bound(expr: Expr, domains: dict[Var, int]) -> tuple[int | None, int | None]:
    """(lowest, highest) of `expr` where either is known: min and max keep the known side."""
    whole = None if not isinstance(expr, Binary) or expr.op not in ("min", "max") else expr
    if whole is None:
        b = bound(expr, domains)
        return (None, None) if b is None else b
    (alo, ahi), (blo, bhi) = _half_bound(whole.a, domains), _half_bound(whole.b, domains)
    if whole.op == "min":  # below both highs, and as low as the lower of the lows
        highs = [h for h in (ahi, bhi) if h is not None]
        lo = None if alo is None or blo is None else min(alo, blo)
        return lo, min(highs) if highs else None
    lows = [x for x in (alo, blo) if x is not None]  # max: above both lows
    hi = None if ahi is None or bhi is None else max(ahi, bhi)
    return max(lows) if lows else None, hi


def _bound_binary(op: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    match op:
        case "+":
            return a[0] + b[0], a[1] + b[1]
        case "-":
            return a[0] - b[1], a[1] - b[0]
        case "*":
            corners = [x * y for x in a for y in b]
            return min(corners), max(corners)
        case "min":
            return min(a[0], b[0]), min(a[1], b[1])
        case "max":
            return max(a[0], b[0]), max(a[1], b[1])
        case "floordiv" if b[0] == b[1] and b[0] > 0:
            return a[0] // b[0], a[1] // b[0]
        case "floormod" if b[0] == b[1] and b[0] > 0:
            return (a[0], a[1]) if 0 <= a[0] and a[1] < b[0] else (0, b[0] - 1)
    return None


def in_range(k: Kernel, index: Expr, extent: int) -> list[Expr]:
    """The conditions of `0 <= index < extent`, without the halves that always hold."""
    lo, hi = k.bound(index) or (-1, extent)
    conds: list[Expr] = []
    if lo < 0:
        conds.append(Binary("<=", IntImm(0), index))
    if hi >= extent:
        conds.append(Binary("<", index, IntImm(extent)))
    return conds


def clamp(k: Kernel, index: Expr, extent: Dim) -> Expr:
    """`index` clamped into [0, extent): a guarded load stays in bounds even when evaluated
    eagerly (Select evaluates both branches, and vectorized code does)."""
    return limit(k, index, 0, extent - 1)


def limit(k: Kernel, e: Expr, lo: int, hi: Dim) -> Expr:
    """`max(min(e, hi), lo)`, leaving out the halves that the bounds of `e` make moot (a
    symbolic `hi` is always kept)."""
    if isinstance(hi, Sym):
        below = k.bound(e)
        e = Binary("min", e, as_expr(hi))
        return e if below is not None and below[0] >= lo else Binary("max", e, IntImm(lo))
    e_lo, e_hi = k.bound(e) or (lo - 1, hi + 1)
    if e_hi > hi:
        e = Binary("min", e, IntImm(hi))
    if e_lo < lo:
        e = Binary("max", e, IntImm(lo))
    return e


def guarded_load(k: Kernel, buf: Buffer, indices: Sequence[Expr]) -> tuple[Expr | None, Expr]:
    """(in-bounds condition or None, a load of `buf` at the clamped indices)."""
    cond = conjunction(
        c for i, n in zip(indices, buf.shape, strict=True) for c in in_range(k, i, n)
    )
    if cond is None:
        return None, buf[tuple(indices)]
    return cond, buf[tuple(clamp(k, i, n) for i, n in zip(indices, buf.shape, strict=True))]


def guarded_value(k: Kernel, buf: Buffer, indices: Sequence[Expr], fill: Expr) -> Expr:
    """`buf` at `indices` where they are in bounds, `fill` elsewhere (padding): a select
    around a load at clamped indices (`guarded_load`), or the plain load when always in."""
    cond, load = guarded_load(k, buf, indices)
    return load if cond is None else Select(cond, load, fill)


def conjunction(conds: Iterable[Expr | None]) -> Expr | None:
    result: Expr | None = None
    for c in conds:
        if c is not None:
            result = c if result is None else Binary("&&", result, c)
    return result


def broadcast(buf: Buffer, ivs: Indices, out_shape: Sequence[int]) -> BufferLoad:
    """`buf` read at the output index `ivs` under numpy broadcasting: a size-1 dim that is
    broadcast reads 0; one the output shares reads its iter var, so that equal-shaped operands
    stay elementwise accesses (which compute_inline and reverse_compute_at rely on)."""
    skip = len(ivs) - len(buf.shape)
    ivs, out_shape = ivs[skip:], tuple(out_shape)[skip:]
    return buf[
        tuple(
            IntImm(0) if n == 1 != m else v
            for n, m, v in zip(buf.shape, out_shape, ivs, strict=True)
        )
    ]


def mean(
    k: Kernel,
    name: str,
    out: Buffer,
    extents: Sequence[Dim],
    term: ReduceFn,
    count: Dim | Callable[[Indices], Expr],
) -> None:
    """`out[s] = sum(term(s, r)) / count(s)`: one block for floats (each term pre-scaled, so no
    divide stage), and for ints a `<name>_sum` block then a `<name>_div` block, because an
    integer mean truncates the quotient of the whole sum toward zero (C division)."""
    dt = out.dtype
    fixed = count if isinstance(count, (int, Sym)) else None  # a Sym: a count known at run time
    counter = (lambda s: as_expr(fixed)) if fixed is not None else count
    if is_float(dt) and isinstance(count, int):
        scale = const(1 / count, dt)
        k.reduce(name, out, extents, lambda s, r: term(s, r) * scale)
    elif is_float(dt):
        k.reduce(name, out, extents, lambda s, r: term(s, r) / Cast(dt, counter(s)))
    else:
        total = k.alloc(f"{name}_sum", out.shape, dt)
        k.reduce(f"{name}_sum", total, extents, term)
        k.compute(f"{name}_div", out, lambda i: total[i] / _as_dtype(counter(i), dt))


def _as_dtype(index: Expr, dtype: str) -> Expr:
    if isinstance(index, IntImm):
        return const(index.value, dtype)
    return index if index.dtype == dtype else Cast(dtype, index)


def attr_ints(op: Op, key: str) -> tuple[int, ...]:
    """A tuple-of-ints attribute (normalized by the builder, so present)."""
    value = op.attr(key)
    assert isinstance(value, tuple), f"{op.name}: attribute {key} is {value!r}"
    return value


def attr_int(op: Op, key: str) -> int:
    value = op.attr(key)
    assert isinstance(value, int), f"{op.name}: attribute {key} is {value!r}"
    return value


def attr_float(op: Op, key: str) -> float:
    value = op.attr(key)
    assert isinstance(value, float | int), f"{op.name}: attribute {key} is {value!r}"
    return float(value)


def lowest(dtype: str) -> Expr:
    """The identity of max: -inf for floats, the smallest value for ints, False for bool."""
    return _extreme(dtype, largest=False)


def highest(dtype: str) -> Expr:
    """The identity of min: inf for floats, the largest value for ints, True for bool."""
    return _extreme(dtype, largest=True)


def _extreme(dtype: str, largest: bool) -> Expr:
    if is_float(dtype):
        return const(float("inf") if largest else float("-inf"), dtype)
    if dtype == "bool":
        return const(int(largest), dtype)
    info = np.iinfo(numpy_dtype(dtype))
    return const(int(info.max if largest else info.min), dtype)
