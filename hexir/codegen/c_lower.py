"""Rewrites that make a scheduled body easy to print as C, before any C is printed.

    body = lower_for_c(func.body)

- Blocks become named wrappers: their iter vars are replaced by their bindings, the predicate
  becomes an `IfThenElse`, and `init` runs under `if (every reduce binding == 0)`. Indices are
  then expressions of loop vars alone, which the vectorizer and the register promotion of local
  buffers read directly (a wrapper keeps the block's name for the comment in the C).
- `unrolled` loops small enough (`UNROLL_MAX_EXTENT`, `UNROLL_MAX_NODES`) are expanded into a
  sequence of copies of their body with the loop var replaced by each constant, so the printed
  indices fold to constants and a local accumulator tile reads at constant indices only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from hexir.ir.arith import affine_coefficients, simplify
from hexir.ir.dtype import itemsize
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Cast,
    Expr,
    For,
    IfThenElse,
    IntImm,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import children, free_vars, map_stmt, substitute, walk

UNROLL_MAX_EXTENT = 64
# Nodes in the unrolled result: beyond this the source (and GCC's compile time) balloons.
UNROLL_MAX_NODES = 8192

TRUE = IntImm(1, "bool")
FALSE = IntImm(0, "bool")


def lower_for_c(body: Stmt) -> Stmt:
    """`body` with blocks flattened into named wrappers and small unrolled loops expanded."""
    return map_stmt(map_stmt(body, stmt_fn=_flatten_block), stmt_fn=_unroll)


def _flatten_block(stmt: Stmt) -> Stmt:
    if not isinstance(stmt, Block) or not (stmt.iter_vars or stmt.init or stmt.predicate):
        return stmt
    bindings = {iv.var: iv.binding for iv in stmt.iter_vars}
    parts: list[Stmt] = []
    if stmt.init is not None:
        first = _all_zero([iv.binding for iv in stmt.iter_vars if iv.kind == "reduce"])
        init = _substitute(stmt.init, bindings)
        parts.append(init if first == TRUE else IfThenElse(first, init))
    parts.append(_substitute(stmt.body, bindings))
    inner = seq(*parts)
    if stmt.predicate is not None:
        predicate = simplify(substitute(stmt.predicate, bindings))  # type: ignore[arg-type]
        inner = inner if predicate == TRUE else IfThenElse(predicate, inner)
    return replace(stmt, iter_vars=(), reads=(), writes=(), body=inner, init=None, predicate=None)


def _substitute(stmt: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    return cast(Stmt, substitute(stmt, mapping))


def _all_zero(exprs: list[Expr]) -> Expr:
    """`e0 == 0 && e1 == 0 ...`, simplified (TRUE for no exprs)."""
    cond: Expr = TRUE
    for e in exprs:
        test = Binary("==", e, IntImm(0, e.dtype))
        cond = test if cond == TRUE else Binary("&&", cond, test)
    return simplify(cond)


def _unroll(stmt: Stmt) -> Stmt:
    # Bottom-up (map_stmt): an inner unrolled loop is already expanded when its parent is seen.
    if not isinstance(stmt, For) or stmt.kind != "unrolled" or not _small(stmt):
        return stmt
    copies = [
        map_stmt(_substitute(stmt.body, {stmt.var: IntImm(v)}), stmt_fn=_fold)
        for v in range(stmt.extent)
    ]
    # A copy that declares a buffer keeps its own C scope, so the names do not clash.
    return seq(*(_scoped(c) for c in copies))  # type: ignore[arg-type]


def _fold(stmt: Stmt) -> Stmt:
    """A store with its constants folded (`(float)(2 + 1)` -> `3.0f`); float arithmetic is
    folded only between constants, never reassociated, so values are unchanged."""
    if isinstance(stmt, BufferStore):
        indices = tuple(simplify(i) for i in stmt.indices)
        return BufferStore(stmt.buffer, indices, simplify(stmt.value))
    return stmt


def _small(loop: For) -> bool:
    if not 0 < loop.extent <= UNROLL_MAX_EXTENT:
        return False
    return loop.extent * nodes(loop.body) <= UNROLL_MAX_NODES


def nodes(stmt: Stmt) -> int:
    """The IR nodes of `stmt`: what one copy of an unrolled body costs (UNROLL_MAX_NODES)."""
    return sum(1 for _ in walk(stmt))


def unroll_factor(loop: For) -> int:
    """How far GCC may unroll an `unrolled` loop too large to expand in the source: as many
    iterations as keep the copies within UNROLL_MAX_NODES (a full `#pragma GCC unroll 960` of
    a 20-statement body took GCC 8 minutes)."""
    return max(1, min(loop.extent, UNROLL_MAX_NODES // max(1, nodes(loop.body)), 65534))


def _scoped(stmt: Stmt) -> Stmt:
    stmts = stmt.stmts if isinstance(stmt, Seq) else (stmt,)
    if any(isinstance(s, Allocate) for s in stmts):
        return Block("", (), (), (), stmt)
    return stmt


# ---------------------------------------------------------------------------------------------
# Lanes of a vectorized loop, and local buffers that can live in vector registers

MAX_STRAIGHT_CHUNKS = 8  # a vectorized loop of at most this many chunks prints without a loop
MAX_REGISTER_VECTORS = 32  # a local buffer larger than the register file stays in memory


def loop_lanes(loop: For, vector_bytes: int) -> int | None:
    """Lanes per chunk of a vectorized loop: a full vector of its widest element, halved for a
    loop shorter than that (down to 16 bytes); None when not even that fits the extent."""
    widest = max((itemsize(d) for d in value_dtypes(loop.body, loop.var)), default=4)
    lanes = vector_bytes // widest
    while lanes > loop.extent and lanes * widest > 16:
        lanes //= 2
    return lanes if 2 <= lanes <= loop.extent else None


def value_dtypes(stmt: Stmt, lane: Var) -> set[str]:
    """Element types the stored values compute in (indices excluded: they stay scalar)."""
    found: set[str] = set()

    def visit(e: Expr) -> None:
        if isinstance(e, BufferLoad):
            found.add(e.dtype)
            return
        found.add("int32" if e == lane else e.dtype)
        for child in children(e):
            visit(child)  # type: ignore[arg-type]

    for node in walk(stmt):
        if isinstance(node, BufferStore):
            found.add(node.buffer.dtype)
            visit(node.value)
    return found - {"bool"}


def register_buffers(body: Stmt, vector_bytes: int) -> dict[Buffer, int]:
    """Local buffers to declare as arrays of vectors (buffer -> lanes), which GCC keeps in
    registers: every access is at constant indices once unrolled, the last axis either
    constant or a whole chunk of a straight-line vectorized loop."""
    found: dict[Buffer, int] = {}
    for node in walk(body):
        if isinstance(node, Allocate) and node.buffer.scope == "local":
            lanes = _register_lanes(node.buffer, vector_bytes)
            if lanes:
                found[node.buffer] = lanes
    _drop_irregular(body, found, {}, {}, vector_bytes)
    return found


def _register_lanes(buffer: Buffer, vector_bytes: int) -> int | None:
    if buffer.dtype == "bool" or not buffer.shape:
        return None
    lanes = vector_bytes // itemsize(buffer.dtype)
    vectors = buffer.size // lanes
    fits = buffer.shape[-1] % lanes == 0 and vectors <= MAX_REGISTER_VECTORS
    return lanes if fits else None


def _drop_irregular(
    node: Stmt | Expr,
    found: dict[Buffer, int],
    chunked: dict[Var, int],
    ranges: dict[Var, int],
    vector_bytes: int,
) -> None:
    """Remove from `found` every buffer accessed where its index is not register-friendly;
    `chunked` maps the vectorized loop vars around `node` that print as straight chunks,
    `ranges` every loop var around it to its extent."""
    if not found:
        return
    if isinstance(node, For):
        ranges = {**ranges, node.var: node.extent}
        lanes = loop_lanes(node, vector_bytes) if node.kind == "vectorized" else None
        if lanes and node.extent % lanes == 0 and node.extent // lanes <= MAX_STRAIGHT_CHUNKS:
            chunked = {**chunked, node.var: lanes}
    if isinstance(node, (BufferLoad, BufferStore)) and node.buffer in found:
        if not _regular(node.indices, found[node.buffer], chunked, ranges):
            del found[node.buffer]
    for child in children(node):
        _drop_irregular(child, found, chunked, ranges, vector_bytes)


def _regular(
    indices: tuple[Expr, ...], lanes: int, chunked: dict[Var, int], ranges: dict[Var, int]
) -> bool:
    *outer, last = (simplify(i, ranges) for i in indices)
    if not all(isinstance(i, IntImm) for i in outer):
        return False
    if isinstance(last, IntImm):
        return True
    lane_vars = [v for v in free_vars(last) if chunked.get(v) == lanes]
    if len(lane_vars) != 1 or len(free_vars(last)) != 1:
        return False
    coeffs = affine_coefficients(last, lane_vars)
    return coeffs is not None and coeffs[lane_vars[0]] == 1 and coeffs[None] % lanes == 0


# ---------------------------------------------------------------------------------------------
# Flat offsets


def flat_index(
    buffer: Buffer, indices: tuple[Expr, ...], ranges: dict[Var, int] | None = None
) -> Expr:
    """The row-major offset of `indices` into `buffer` (int64 where int32 could overflow),
    simplified knowing each var of `ranges` lies in [0, extent)."""
    wide = buffer.size > 2**31 - 1
    index_dtype = "int64" if wide else "int32"
    flat: Expr | None = None
    for extent, index in zip(buffer.shape, indices, strict=True):
        if wide and index.dtype != "int64":
            index = Cast("int64", index)
        if flat is None:
            flat = index
        elif extent == 1:
            flat = _add(flat, index)  # (flat * 1) + index
        else:
            flat = _add(Binary("*", flat, IntImm(extent, index_dtype)), index)
    return simplify(flat if flat is not None else IntImm(0, index_dtype), ranges)


def _add(a: Expr, b: Expr) -> Expr:
    if isinstance(a, IntImm) and a.value == 0:
        return b
    if isinstance(b, IntImm) and b.value == 0:
        return a
    return Binary("+", a, b)
