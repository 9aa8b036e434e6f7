"""Rewrites that make a GPU-scheduled body easy to print as CUDA C.

    body = lower_for_cuda(func.body, launch)

1. `vthread` loops become `unrolled` ones (a virtual thread is an unrolled copy of the work).
2. Reductions over a threadIdx.x loop become block-level reductions (cuda_reduce.py).
3. `lower_for_c`: blocks flattened, small unrolled loops expanded (c_lower.py).
4. Buffers placed (`place_buffers`): an allocation outside the thread loops is one per block,
   so a `global` one moves to shared memory, while a `local` one is per thread: each thread
   owns the elements whose index carries its thread (and block) indices, so the buffer
   shrinks to one thread's share, indexed by what remains (constants, once unrolled:
   registers). `C_local[ty * 8 + i, tx * 4 + j]` becomes `C_local[i, j]` of shape 8x4.
5. `__syncthreads()` inserted between stages that pass data (cuda_sync.py).
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hexir.codegen.c_lower import lower_for_c
from hexir.codegen.cuda_reduce import lower_cross_thread
from hexir.codegen.cuda_sync import insert_syncs
from hexir.codegen.gpu_verify import BLOCK_AXES, THREAD_AXES, Launch, placement
from hexir.errors import ScheduleError
from hexir.ir.arith import affine_coefficients, bound, simplify
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    IntImm,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import free_vars, map_expr, map_stmt, substitute
from hexir.schedule.cache import replace_buffer

Indices = tuple[Expr, ...]
# A set of integers as base + sum of c * x over digits (c, e), x in 0..e-1, each value once.
Digits = tuple[int, tuple[tuple[int, int], ...]]
# A per-thread index this many values wide or less is checked value by value when compacted.
COMPACT_CHECK_MAX = 4096
# The bound loops around a point (var -> axis) and every loop's extent.
Env = tuple[dict[Var, str], dict[Var, int]]


def lower_for_cuda(body: Stmt, launch: Launch) -> Stmt:
    """`body` rewritten as above, ready for the CUDA printer."""
    body = map_stmt(body, stmt_fn=_vthread_to_unrolled)
    body = lower_cross_thread(body)
    body = lower_for_c(body)
    body = place_buffers(body, launch)
    return insert_syncs(body)


def _vthread_to_unrolled(stmt: Stmt) -> Stmt:
    if isinstance(stmt, For) and stmt.kind == "vthread":
        return replace(stmt, kind="unrolled")
    return stmt


# ---------------------------------------------------------------------------------------------
# Placement


def place_buffers(body: Stmt, launch: Launch) -> Stmt:
    """`body` with block-level `global` allocations in shared memory and block-level `local`
    ones shrunk to one thread's share."""
    return _place(body, ({}, {}), launch)


def _place(stmt: Stmt, env: Env, launch: Launch) -> Stmt:
    bound_vars, ranges = env
    match stmt:
        case Seq(stmts):
            return _place_seq(list(stmts), env, launch)
        case For(var, extent, kind, body):
            axes = {var: kind} if kind in THREAD_AXES or kind in BLOCK_AXES else {}
            inner = ({**bound_vars, **axes}, {**ranges, var: extent})
            return replace(stmt, body=_place(body, inner, launch))
        case Block(body=body):
            return replace(stmt, body=_place(body, env, launch))
        case IfThenElse(cond, then, else_):
            other = None if else_ is None else _place(else_, env, launch)
            return IfThenElse(cond, _place(then, env, launch), other)
    return stmt


def _place_seq(stmts: list[Stmt], env: Env, launch: Launch) -> Stmt:
    in_threads = any(axis in THREAD_AXES for axis in env[0].values())
    for n, s in enumerate(stmts):
        if not isinstance(s, Allocate):
            continue
        old = s.buffer
        where = placement(old, in_threads)
        if where == "shared" and in_threads:
            raise ScheduleError(
                f"shared buffer %{old.name} is allocated inside a thread-bound loop: shared "
                "memory belongs to the whole block; allocate it outside the thread loops",
                "generate_cuda",
            )
        rest = seq(*stmts[n + 1 :]) if n + 1 < len(stmts) else None
        if where == "shared" and old.scope != "shared":
            new = replace(old, scope="shared")
            stmts[n:] = [replace_buffer(x, old, new) for x in stmts[n:]]
        elif where == "local" and not in_threads and rest is not None:
            # Only the bound loops inside the allocation tell its instances' elements apart.
            inner: Env = ({}, env[1])
            new, project = _thread_share(old, rest, inner, launch)
            stmts[n] = Allocate(new)
            stmts[n + 1 :] = [_map_accesses(x, old, new, project, inner) for x in stmts[n + 1 :]]
    return seq(*(_place(s, env, launch) for s in stmts))


@dataclass
class _Axis:
    """One buffer axis as the accesses index it: the bound axes' coefficients, and the extent
    of what remains."""

    terms: tuple[tuple[str, int], ...] | None = None
    extent: int = 1
    rests: set[int] = field(default_factory=set)  # every value the remaining index takes
    indices: list[tuple[Expr, dict[Var, int]]] = field(default_factory=list)  # the rests
    digits: Digits | None = None  # the rests as a lattice, where every access's compacts


def _thread_share(
    buf: Buffer, scope: Stmt, env: Env, launch: Launch
) -> tuple[Buffer, Callable[[Indices, Env], Indices]]:
    """`buf` shrunk to one thread's share, and the map of an access's indices into it."""
    axes = [_Axis() for _ in buf.shape]

    def fail(reason: str) -> ScheduleError:
        return ScheduleError(
            f"local buffer %{buf.name} is allocated outside the thread loops, so each thread "
            f"must own its own elements, but {reason}: allocate it inside the thread loops, "
            "or give it scope shared",
            "generate_cuda",
        )

    def visit(indices: Indices, at: Env) -> Indices:
        parts = [_split_index(e, at) for e in indices]
        if any(p is None for p in parts):
            raise fail("an index is not affine in the thread indices")
        used: set[str] = set()
        for axis, (terms, rest) in zip(axes, parts, strict=True):  # type: ignore[misc]
            if axis.terms is None:
                axis.terms = terms
            elif axis.terms != terms:
                raise fail("two accesses index it by different thread indices")
            used.update(a for a, _ in terms)
            span = bound(rest, at[1])
            if span.lo is None or span.hi is None or span.lo < 0:
                raise fail(f"the index part {rest} is not provably non-negative")
            axis.extent = max(axis.extent, int(span.hi) + 1)
            axis.rests.update(_values(rest, at[1]) or range(int(span.lo), int(span.hi) + 1))
            axis.indices.append((rest, at[1]))
        shared_by = [
            a for v, a in at[0].items() if launch.dim(a) > 1 and not _covered(a, used, launch)
        ]
        if shared_by:
            raise fail(f"threads differing only in {shared_by[0]} touch the same elements")
        return indices

    _map_accesses(scope, buf, buf, visit, env)
    _check_disjoint(axes, launch, fail)
    for axis in axes:
        axis.digits = _compactable(axis)
    new = replace(buf, shape=tuple(len(a.rests) if a.digits else a.extent for a in axes))

    def project(indices: Indices, at: Env) -> Indices:
        rests = (p[1] for p in (_split_index(e, at) for e in indices))  # type: ignore[index]
        return tuple(
            _compacted(r, a.digits, at[1]) or r if a.digits else r  # type: ignore[misc]
            for r, a in zip(rests, axes, strict=True)
        )

    return new, project


def _split_index(e: Expr, at: Env) -> tuple[tuple[tuple[str, int], ...], Expr] | None:
    """`e` as (bound axis -> coefficient, the rest), or None where not affine in them. A
    bound index divided or taken modulo a constant (a lane fused from a row and a column:
    `tx / 4`, `tx % 4`) is an axis of its own, named `threadIdx.x/4`, `threadIdx.x%4`."""
    e, at = _digit_axes(simplify(e, at[1]), at)
    bound_vars, ranges = at
    coeffs = affine_coefficients(e, list(bound_vars), ranges)
    if coeffs is None:
        return None
    rest = e
    terms = []
    for v, c in coeffs.items():
        if v is not None and c:
            rest = rest - v * IntImm(c, e.dtype)
            terms.append((bound_vars[v], c))
    return tuple(sorted(terms)), simplify(rest, ranges)


# ---------------------------------------------------------------------------------------------
# A thread's share without holes: C_local[8 * nj + cj] (nj < 4, cj < 2: an mma accumulator's
# columns) takes 8 elements, not 26, as C_local[2 * nj + cj].


def _values(rest: Expr, ranges: dict[Var, int]) -> set[int] | None:
    """Every value `rest` takes over its loops, where affine and at most COMPACT_CHECK_MAX."""
    vars = sorted(free_vars(rest), key=lambda v: v.name)
    coeffs = affine_coefficients(rest, vars, ranges)
    if coeffs is None or any(v not in ranges for v in vars):
        return None
    if math.prod(ranges[v] for v in vars) > COMPACT_CHECK_MAX:
        return None
    values = {coeffs[None]}
    for v in vars:
        values = {x + coeffs[v] * n for x in values for n in range(ranges[v])}
    return values


def _digits(values: set[int]) -> Digits | None:
    """`values` as a lattice of digits (the smallest value not yet spanned starts the next
    digit, as many steps as stay inside `values`), or None where they are not one."""
    base = min(values)
    rel = {v - base for v in values}
    span, digits = {0}, []
    while len(span) < len(rel):
        c = min(rel - span)
        e = 1
        while all(s + c * e in rel for s in span):
            e += 1
        if e == 1:  # the next value does not start a whole copy of the span
            return None
        grown = {s + c * k for s in span for k in range(e)}
        if len(grown) != len(span) * e:
            return None
        span = grown
        digits.append((c, e))
    return (base, tuple(digits)) if span == rel else None


def _rank(value: int, digits: Digits) -> int | None:
    """`value`'s place in the lattice: its digits, highest first, in mixed radix."""
    base, ds = digits
    rest, place, scale = value - base, 0, 1
    xs = []
    for c, e in reversed(ds):
        x = min(rest // c, e - 1)
        rest -= x * c
        xs.append(x)
    if rest:
        return None
    for (_, e), x in zip(ds, reversed(xs), strict=True):
        place += x * scale
        scale *= e
    return place


def _compacted(rest: Expr, digits: Digits, ranges: dict[Var, int]) -> Expr | None:
    """`rest` as its rank in the lattice: each term's coefficient c over the digit (c_i, e_i)
    it is a multiple of becomes c / c_i times the digit's place value (_compactable checked
    that this is the rank at every point)."""
    vars = sorted(free_vars(rest), key=lambda v: v.name)
    coeffs = affine_coefficients(rest, vars, ranges) or {None: 0}
    out: Expr = IntImm(_rank(coeffs[None], digits) or 0, rest.dtype)
    places = list(itertools.accumulate((e for _, e in digits[1]), operator.mul, initial=1))
    for v in vars:
        c = coeffs[v]
        over = [n for n, (ci, _) in enumerate(digits[1]) if 0 < ci <= c and c % ci == 0]
        if c and not over:
            return None
        if c:
            out = out + v * IntImm(c // digits[1][over[-1]][0] * places[over[-1]], rest.dtype)
    return simplify(out, ranges)


def _compactable(axis: _Axis) -> Digits | None:
    """The lattice of the axis's values where it has holes and every access's index compacts
    to its rank at every point; None to keep the axis as it is."""
    if not axis.rests or len(axis.rests) == axis.extent:
        return None
    digits = _digits(axis.rests)
    if digits is None or any(not _compacts(r, digits, at) for r, at in axis.indices):
        return None
    return digits


def _compacts(rest: Expr, digits: Digits, ranges: dict[Var, int]) -> bool:
    vars = sorted(free_vars(rest), key=lambda v: v.name)
    if _values(rest, ranges) is None:
        return False
    compact = _compacted(rest, digits, ranges)
    if compact is None:
        return False
    for point in itertools.product(*(range(ranges[v]) for v in vars)):
        at = {v: IntImm(n, v.dtype) for v, n in zip(vars, point, strict=True)}
        value, place = (simplify(substitute(e, at)) for e in (rest, compact))
        if not isinstance(value, IntImm) or not isinstance(place, IntImm):
            return False
        if _rank(value.value, digits) != place.value:
            return False
    return True


def _digit_axes(e: Expr, at: Env) -> tuple[Expr, Env]:
    bound_vars, ranges = at
    found: dict[Var, tuple[str, int]] = {}

    def digit(n: Expr) -> Expr:
        match n:
            case Binary(("floordiv" | "floormod") as op, Var() as v, IntImm(value=c)) if (
                v in bound_vars and c > 0
            ):
                name = f"{bound_vars[v]}{'/' if op == 'floordiv' else '%'}{c}"
                extent = -(-ranges[v] // c) if op == "floordiv" else min(c, ranges[v])
                found[Var(name, v.dtype)] = (name, extent)
                return Var(name, v.dtype)
        return n

    e = map_expr(e, digit)
    if not found:
        return e, at
    names = {v: name for v, (name, _) in found.items()}
    extents = {v: extent for v, (_, extent) in found.items()}
    return e, ({**bound_vars, **names}, {**ranges, **extents})


def _dim(axis: str, launch: Launch) -> int:
    """The threads along `axis`, or a digit axis's values (`threadIdx.x/4`: 8 of 32)."""
    for sep in "/%":
        if sep in axis:
            base, c = axis.split(sep)
            dim = launch.dim(base)
            return -(-dim // int(c)) if sep == "/" else min(int(c), dim)
    return launch.dim(axis)


def _covered(axis: str, used: set[str], launch: Launch) -> bool:
    """Whether the axes in `used` tell apart every two threads along `axis`: it, or its
    quotient and remainder by one constant, or a remainder by at least its extent."""
    if axis in used:
        return True
    for name in used:
        base, sep, c = name.partition("%")
        if base == axis and sep and (int(c) >= launch.dim(axis) or f"{axis}/{c}" in used):
            return True
    return False


def _check_disjoint(axes: list[_Axis], launch: Launch, fail: Callable) -> None:
    """Each thread's share is its own: along every axis, no two threads' indices (the bound
    part) plus the remaining index's values meet (counted: at most a block's threads times
    the buffer's extent)."""
    seen: set[str] = set()
    split_by: dict[str, set[str]] = {}  # a thread axis -> how its indices are taken apart
    for axis in axes:
        starts = {0}
        for name, coeff in axis.terms or ():
            if name in seen:
                raise fail(f"{name} indexes two of its axes")
            seen.add(name)
            base, divisor = re.split("[/%]", name)[0], re.split("[/%]", name)[1:]
            split_by.setdefault(base, set()).update(divisor or ["whole"])
            if len(split_by[base]) > 1:  # tx with tx / 4, or tx / 4 with tx % 8: dependent
                raise fail(f"{base} indexes it in two ways")
            starts = {s + coeff * t for s in starts for t in range(_dim(name, launch))}
        hit = {s + r for s in starts for r in axis.rests}
        if len(hit) != len(starts) * len(axis.rests):
            raise fail("the shares of two threads overlap")


def _map_accesses(
    stmt: Stmt,
    old: Buffer,
    new: Buffer,
    fn: Callable[[Indices, Env], Indices],
    env: Env,
) -> Stmt:
    """`stmt` with every access to `old` made an access to `new` at `fn(indices, env)`, `env`
    describing the loops around the access."""
    bound_vars, ranges = env

    def ex(e: Expr) -> Expr:
        def load(n: Expr) -> Expr:
            if isinstance(n, BufferLoad) and n.buffer == old:
                return BufferLoad(new, fn(n.indices, env))
            return n

        return map_expr(e, load)

    match stmt:
        case For(var, extent, kind, body):
            axes = {var: kind} if kind in THREAD_AXES or kind in BLOCK_AXES else {}
            inner = ({**bound_vars, **axes}, {**ranges, var: extent})
            return replace(stmt, body=_map_accesses(body, old, new, fn, inner))
        case Seq(stmts):
            return seq(*(_map_accesses(s, old, new, fn, env) for s in stmts))
        case Block(body=body):
            return replace(stmt, body=_map_accesses(body, old, new, fn, env))
        case IfThenElse(cond, then, else_):
            other = None if else_ is None else _map_accesses(else_, old, new, fn, env)
            return IfThenElse(ex(cond), _map_accesses(then, old, new, fn, env), other)
        case BufferStore(buffer, indices, value):
            indices = tuple(ex(i) for i in indices)
            if buffer == old:
                return BufferStore(new, fn(indices, env), ex(value))
            return BufferStore(buffer, indices, ex(value))
    return stmt


__all__ = ["lower_for_cuda", "place_buffers"]
