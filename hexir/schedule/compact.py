"""compact_buffers: sink each allocation to the loop that holds all its uses, and shrink it.

A cache made by cache_read / cache_write has the whole buffer's shape at the top of the
function; once compute_at / reverse_compute_at put its copy block under a tile loop, this pass
makes it the tile: a `local` accumulator becomes a register tile, a `shared` or `global` pack a
panel. It is a lowering pass (run on a scheduled function before code generation), not a
primitive: it records nothing in a trace.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import replace

from hexir.ir import arith
from hexir.ir.symbolic import Dim, Sym
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
    PrimFunc,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import free_vars, substitute, walk
from hexir.schedule.cache import (
    ALIGN_KEY,
    padded_shape,
    quads,
    reads_buffer,
    replace_buffer,
    writes_buffer,
)
from hexir.schedule.common import all_blocks, all_loops, child_blocks, conjuncts, guarded_accesses


def compact_buffers(func: PrimFunc) -> PrimFunc:
    """`func` with each allocation sunk to the loop holding all its uses and shrunk to the
    window one iteration of the loops around it touches.

        alloc %C_local: buffer<64x48xf32, local>      for %i_0 in 0..8 serial {
        for %i_0 in 0..8 serial {                       for %j_0 in 0..6 serial {
          for %j_0 in 0..6 serial {             ->        alloc %C_local: buffer<8x8xf32, local>
            ... %C_local[vi, vj] ...                      ... %C_local[floormod(vi, 8),
                                                                   floormod(vj, 8)] ...

    Inside a block only its iter vars are visible, so an index is rebased by a constant and,
    under loops, taken modulo the window: a modulus dividing the tile stride where one holds
    the window (the layout is then the tile's own), else the window's size (any window of at
    most that many elements maps one to one). `storage_align` paddings are applied again.
    """
    with _recent_lock:
        hit = _recent.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    compacted = replace(func, body=_place(func.body))
    with _recent_lock:
        if len(_recent) >= RECENT:
            del _recent[next(iter(_recent))]
        _recent[id(func)] = (func, compacted)
    return compacted


# The last few functions compacted, by identity (each held, so its id is not reused while it
# is here): a GPU candidate is compacted where its resources are checked, where the cost
# model reads it (the analyzer's columns), and where it is printed (by builder threads),
# about 10 ms each time.
RECENT = 256
_recent: dict[int, tuple[PrimFunc, PrimFunc]] = {}
_recent_lock = threading.Lock()


def _place(stmt: Stmt) -> Stmt:
    match stmt:
        case Seq(stmts):
            return _place_seq(list(stmts))
        case For():
            return replace(stmt, body=_place(stmt.body))
        case Block():
            init = None if stmt.init is None else _place(stmt.init)
            return replace(stmt, init=init, body=_place(stmt.body))
        case IfThenElse(cond, then, else_):
            return IfThenElse(cond, _place(then), None if else_ is None else _place(else_))
    return stmt


def _place_seq(stmts: list[Stmt]) -> Stmt:
    kept: list[int] = []
    for n, s in enumerate(stmts):
        if not isinstance(s, Allocate):
            continue
        users = [m for m in range(n + 1, len(stmts)) if _uses(stmts[m], s.buffer)]
        target = stmts[users[0]] if len(users) == 1 else None
        if isinstance(target, For) and _sinkable(target, s.buffer):
            stmts[users[0]] = replace(target, body=seq(s, target.body))
        else:
            kept.append(n)
    out = [s if isinstance(s, Allocate) else _place(s) for s in stmts]
    for n in kept:
        old = out[n].buffer  # type: ignore[union-attr]
        new, index = _compact(old, out[n + 1 :])
        if new != old:
            out[n:] = [replace_buffer(s, old, new, index=index) for s in out[n:]]
    return seq(*(s for n, s in enumerate(out) if n in kept or not isinstance(s, Allocate)))


def _sinkable(loop: For, buf: Buffer) -> bool:
    """A fresh `buf` per iteration of `loop` keeps the result: no reduction carries it across
    iterations, and the first block to touch it under the loop sets it."""
    if loop.kind == "vectorized" or (buf.scope == "shared" and loop.kind.startswith("threadIdx")):
        return False
    touching = [b for b in all_blocks(loop.body) if _uses(b, buf) and not child_blocks(b)]
    for b in touching:
        carried = any(
            iv.kind == "reduce" and loop.var in free_vars(iv.binding) for iv in b.iter_vars
        )
        if carried and writes_buffer(b, buf):
            return False
    first = touching[0] if touching else None
    return (
        first is not None
        and writes_buffer(first, buf)
        and (first.init is not None or not reads_buffer(first, buf))
    )


def _uses(stmt: Stmt, buf: Buffer) -> bool:
    for n in walk(stmt):
        match n:
            case BufferLoad(buffer) | BufferStore(buffer) if buffer == buf:
                return True
            case Block(reads=reads, writes=writes) if any(r.buffer == buf for r in reads + writes):
                return True
    return False


Window = tuple[int, int, int | None]  # (shift, size, modulus): index -> (index - shift) % modulus


def _compact(buf: Buffer, scope: list[Stmt]) -> tuple[Buffer, Callable[[int, Expr], Expr]]:
    """`buf` shrunk to the window `scope` touches, and the map of an axis's index into it."""
    inner = {
        loop.var: loop.extent
        for s in scope
        for loop in all_loops(s)
        if isinstance(loop.extent, int)
    }
    found = [
        (a.indices, _guarded_ranges(inner, guards))
        for s in scope
        for a, guards in guarded_accesses(s)
        if a.buffer == buf
    ]
    windows: list[Window] = [
        _window([(idx[d], ranges) for idx, ranges in found], n, inner)
        for d, n in enumerate(buf.shape)
    ]
    shape = tuple(size for _, size, _ in windows)
    for b in (b for s in scope for b in all_blocks(s)):
        for bi, axis, factor, offset in quads(dict(b.annotations).get(ALIGN_KEY)):
            if bi < len(b.writes) and b.writes[bi].buffer == buf:
                shape = padded_shape(shape, axis, factor, offset) or shape

    def index(d: int, e: Expr) -> Expr:
        shift, _, modulus = windows[d]
        e = e - shift if shift else e
        return arith.simplify(e % modulus if modulus else e)

    return replace(buf, shape=shape), index


def _guarded_ranges(inner: dict[Var, int], guards: tuple[Expr, ...]) -> dict[Var, int]:
    """The loop extents `inner` narrowed by the guards an access runs under: from a conjunct
    `sum(c * v) + c0 < 0` over loops of `inner` alone (all of them from 0), each v of c > 0 is
    below (-c0 - the others' least sum) / c. A split's cooperative fetch `f1 * 8 + f2 < 128`
    with f1 over 64 threads touches rows of f1 < 16 only, not the 64 its loop spans."""
    ranges = dict(inner)
    for cond in (c for g in guards for c in conjuncts(g)):
        if not (isinstance(cond, Binary) and cond.op in ("<", "<=")):
            continue
        diff = cond.a - cond.b if cond.op == "<" else cond.a - cond.b - IntImm(1, cond.a.dtype)
        used = free_vars(diff)
        if not used or not used <= ranges.keys():
            continue
        coeffs = arith.affine_coefficients(diff, list(used))
        if coeffs is None:
            continue
        least = {v: min(c * (ranges[v] - 1), 0) for v, c in coeffs.items() if v is not None}
        for v, c in coeffs.items():
            if v is not None and c > 0:
                room = -coeffs[None] - (sum(least.values()) - least[v])  # c * v < room
                ranges[v] = max(min(ranges[v], -(-room // c)), 1)
    return ranges


def _window(exprs: list[tuple[Expr, dict[Var, int]]], extent: Dim, inner: dict[Var, int]) -> Window:
    """The window of one axis over its accesses (each index with the loop extents it runs
    over: `inner`, narrowed by its guards); a symbolic extent (a size known at run time) is
    taken as more than any window the accesses span."""
    if not exprs:
        return (0, extent, None)
    exprs = [(arith.simplify(e, ranges), ranges) for e, ranges in exprs]
    zero: dict[Var, Expr] = {v: IntImm(0) for v in inner}
    ref = arith.simplify(substitute(exprs[0][0], zero))  # type: ignore[arg-type]
    spans = [arith.bound(arith.simplify(e - ref, ranges), ranges) for e, ranges in exprs]
    los = [s.lo for s in spans if s.lo is not None]
    his = [s.hi for s in spans if s.hi is not None]
    if len(los) < len(spans) or len(his) < len(spans):
        return (0, extent, None)
    lo, hi = min(los), max(his)
    outer = sorted(free_vars(ref), key=lambda v: v.name)
    if not outer:
        if not isinstance(ref, IntImm):
            return (0, extent, None)
        # Accesses outside the buffer are guarded (split predicates): clip them away.
        if isinstance(extent, Sym):
            return (max(lo + ref.value, 0), hi - max(lo, -ref.value) + 1, None)
        lo, hi = max(lo + ref.value, 0), min(hi + ref.value, extent - 1)
        return (0, extent, None) if hi - lo + 1 >= extent else (lo, hi - lo + 1, None)
    coeffs = arith.affine_coefficients(ref, outer)
    size = hi - lo + 1
    g = 0 if coeffs is None else math.gcd(*(abs(c) for v, c in coeffs.items() if v is not None))
    # The smallest divisor of the tile stride that holds the window keeps it unwrapped.
    modulus = next((m for m in range(size, g + 1) if g % m == 0), size)
    if isinstance(extent, int) and modulus >= extent:
        return (0, extent, None)
    shift = lo + (coeffs[None] if coeffs is not None else 0)
    return (shift, modulus, modulus)


__all__ = ["compact_buffers"]
