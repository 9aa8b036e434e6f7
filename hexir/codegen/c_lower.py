"""Rewrites that make a scheduled body easy to print as C, before any C is printed.

    body = lower_for_c(func.body)

- Blocks become named wrappers: their iter vars are replaced by their bindings, the predicate
  becomes an `IfThenElse`, and `init` runs under `if (every reduce binding == 0)`. Indices are
  then expressions of loop vars alone, which the vectorizer and the register promotion of local
  buffers read directly (a wrapper keeps the block's name for the comment in the C).
- `unrolled` loops small enough (`UNROLL_MAX_EXTENT`, `UNROLL_MAX_NODES`) are expanded into a
  sequence of copies of their body with the loop var replaced by each constant, so the printed
  indices fold to constants and a local accumulator tile reads at constant indices only.
- A serial loop whose body is guarded by bounds on its var (a ragged tile's `io*6 + 2 < 128`,
  a padded copy's `0 <= i - 1 && i - 1 < 7`, in an `if` or a select) is partitioned: the
  iterations where every such guard holds run without them (and with the loads' clamps
  simplified away under the loop's range), the others before and after, with the guards they
  still need, decided where an iteration stands alone. No guard is then evaluated in the
  main tiles' inner loops (a conv2d with 14-pixel rows in tiles of 6 ran at 0.56x 7 x 1 with
  its guards in its reduction loops), and a zero-bordered copy is a plain copy inside its
  border (conv2d_pad of 64x56x56: 163 -> 18 us). A loop of a few iterations
  (`PEEL_MAX_EXTENT`) whose var the guards of inner loops read but that splits no span off (the
  phase q of a phase-split copy's `0 <= j*2 + q - 1`) is peeled instead, each iteration
  inlined, so that the inner loops' guards bound their own vars alone and partition; so is a
  partitioned loop's guarded edge of a few iterations. A parallel loop of a few jobs whose
  var the inner guards read (a ragged matrix-vector product's last job) stays parallel, with
  a copy of its body per job under an `if` on the job, each partitioned alone.
- Where the caller takes at most `max_lines` of C (the search), partitioning stops with
  SourceTooLong once the bodies it would copy pass `PIECE_NODES_PER_LINE` nodes a line: the
  C of such a kernel is too long, and most of its cost was the lowering before the printer
  stopped at the limit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from hexir.codegen.c_inplace import intermediates_in_outputs
from hexir.codegen.c_narrow import lower_narrow_floats
from hexir.codegen.cuda_reduce import AllReduce
from hexir.ir.arith import affine_coefficients, simplify
from hexir.ir.dtype import itemsize
from hexir.ir.symbolic import Sym
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
    Select,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import children, free_vars, map_stmt, substitute, walk
from hexir.schedule.cache import replace_buffer
from hexir.schedule.common import conjoin, conjuncts
from hexir.schedule.tensorize import INTRINSICS, TENSORIZE, TileIntrinsic

UNROLL_MAX_EXTENT = 64
# Nodes in the unrolled result: beyond this the source (and GCC's compile time) balloons.
UNROLL_MAX_NODES = 8192
# The copies a search's unroll annotation (`pragma_auto_unroll_max_step`) may make of a nest,
# in nodes: its largest step (512) at 8192 nodes took GCC 7.4 s on average per conv2d candidate
# (one 43 s) against 1.3-2.7 s for the smaller steps; at 2048, 2.6 s (40 random candidates
# of ResNet-18's 3x3 conv on AVX-512). A default schedule carries no such annotation.
AUTO_UNROLL_MAX_NODES = 2048
# A body may shrink this many times when folded per copy (`_small`).
UNROLL_FOLD_SLACK = 64
# A partitioned loop's body is copied up to three times: only a body up to this size is.
PARTITION_MAX_NODES = 8192
# A loop up to this extent is peeled where the guards of inner loops read its var.
PEEL_MAX_EXTENT = 4
# Where the C may be at most `max_lines` long, partitioning may copy at most this many nodes
# per line into its pieces (each body counted before it is copied, so a piece copied again by
# an outer loop's partitioning counts again): past that the C is taken to be too long and
# lowering stops. Of 200 random samples of a 1x64x56x56 3x3 conv2d (its limit 412 lines), the
# 63 that fit copied at most 4504 nodes (10.9 a line), the 137 that did not up to 56k; at 20 a
# line those 137 took 45 s to lower and print as far as the limit, 100 s without, and no
# fitting one was refused. Nothing partitions in 40 samples of matmul 1024^3 or of dense.
PIECE_NODES_PER_LINE = 20

TRUE = IntImm(1, "bool")
FALSE = IntImm(0, "bool")


class SourceTooLong(Exception):
    """The C being printed passed the `max_lines` it was given, or its lowering copied more
    than PIECE_NODES_PER_LINE times as many nodes (not a HexirError: the kernel is fine, only
    longer than its caller will take)."""


class _Copies:
    """The nodes partitioning has copied into pieces, against the most it may (None: any)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.made = 0

    def count(self, body: Stmt) -> None:
        """`body` about to be copied into a piece, counted: SourceTooLong where that passes
        the limit (raised before the copy is made)."""
        if self.limit is not None:
            self.made += nodes(body)
            if self.made > self.limit:
                raise SourceTooLong(f"partitioning copied more than {self.limit} nodes")


def lower_for_c(
    body: Stmt, may_alias: set[tuple[Buffer, Buffer]] | None = None, max_lines: int | None = None
) -> Stmt:
    """`body` with blocks flattened into named wrappers, small unrolled loops expanded,
    loops under bound guards partitioned, a job's intermediate kept in the output it ends in
    where `may_alias` (the CPU printer's in-place candidates) is given (c_inplace.py) and
    bfloat16/float16 computed in float (c_narrow.py). `max_lines`: the most lines of C the
    caller takes; SourceTooLong where partitioning would copy more than PIECE_NODES_PER_LINE
    nodes a line of it."""
    flat = map_stmt(map_stmt(body, stmt_fn=_flatten_block), stmt_fn=_unroll)
    if may_alias is not None:  # the CPU's: outputs the plan may run over an input excepted
        flat = intermediates_in_outputs(flat, {out for out, _ in may_alias})
    copies = _Copies(None if max_lines is None else PIECE_NODES_PER_LINE * max_lines)
    return lower_narrow_floats(map_stmt(flat, stmt_fn=lambda s: _partition(s, copies)))


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
    size = sum(nodes(c) for c in copies)
    # A case split on the var folds to one case a copy: the copies are no larger than the
    # loop was, and may then go up to twice the limit (Winograd's 36 cases: ~9500 nodes).
    folds = size <= nodes(stmt.body) * 21 // 20
    if size > UNROLL_MAX_NODES and not (folds and size <= 2 * UNROLL_MAX_NODES):
        return stmt
    # A copy that declares a buffer keeps its own C scope, so the names do not clash.
    return seq(*(_scoped(c) for c in copies))  # type: ignore[arg-type]


def _fold(stmt: Stmt) -> Stmt:
    """A store with its constants folded (`(float)(2 + 1)` -> `3.0f`); float arithmetic is
    folded only between constants, never reassociated, so values are unchanged."""
    if isinstance(stmt, BufferStore):
        indices = tuple(simplify(i) for i in stmt.indices)
        return BufferStore(stmt.buffer, indices, simplify(stmt.value))
    return stmt


def _partition(stmt: Stmt, copies: _Copies) -> Stmt:
    """A serial loop split where its bound guards start and stop holding (see the module
    docstring): [0, lo) and [hi, extent) keep them, [lo, hi) runs without. A loop of a
    symbolic extent stays whole. Each piece's body is counted in `copies` before it is copied."""
    if isinstance(stmt, For) and isinstance(stmt.extent, Sym):
        return stmt
    if isinstance(stmt, For) and stmt.kind == "parallel":
        return _peel_jobs(stmt, copies)
    if not isinstance(stmt, For) or stmt.kind not in ("serial", "vectorized") or stmt.extent < 2:
        return stmt
    if isinstance(INTRINSICS.get(dict(stmt.annotations).get(TENSORIZE)), TileIntrinsic):
        return stmt  # its rows guard is the tile's rows count (hexir/codegen/c_amx.py)
    surveyed = _survey(stmt.body)
    if surveyed is None:
        return stmt
    guards, inner = surveyed
    spans = {part: span for part in guards if (span := _holds(part, stmt.var, inner))}
    lo = max((a for a, _ in spans.values()), default=0)
    hi = min((b for _, b in spans.values()), default=stmt.extent)
    lo, hi = max(lo, 0), min(hi, stmt.extent)
    held = {part for part, (a, b) in spans.items() if a <= lo and b >= hi}
    if hi - lo < 1 or not held:
        if stmt.extent <= PEEL_MAX_EXTENT and _bounds_with(guards, stmt.var, inner):
            peeled = [_piece(stmt, stmt.body, i, i + 1, inner, {}, copies)
                      for i in range(stmt.extent)]  # fmt: skip
            return seq(*_own_locals(peeled))
        return stmt
    middle = map_stmt(stmt.body, expr_fn=lambda e: _assume_expr(e, held),
                      stmt_fn=lambda s: _assume(s, held))  # fmt: skip
    # Where each guard holds at some inner iteration: outside, it is false throughout.
    somewhere = {part: _holds(part, stmt.var, inner, every=False) for part in spans}
    parts = [_piece(stmt, middle, lo, hi, inner, somewhere, copies)]
    if lo > 0:
        before = _piece(stmt, stmt.body, 0, lo, inner, somewhere, copies)
        parts.insert(0, _edge(before, copies))
    if hi < stmt.extent:
        after = _piece(stmt, stmt.body, hi, stmt.extent, inner, somewhere, copies)
        parts.append(_edge(after, copies))
    return seq(*_own_locals(parts))


def _edge(piece: Stmt, copies: _Copies) -> Stmt:
    """An edge of a partitioned loop, which keeps its guards: where it is a few iterations
    (a job's last two panels, the first of them partly past a ragged edge), partitioned or
    peeled again, so that the inner loops' guards bound their own vars alone (the partial
    panel's lanes then run as vectors up to the edge, not as a guarded scalar loop)."""
    if isinstance(piece, For) and piece.extent <= PEEL_MAX_EXTENT:
        return _partition(piece, copies)
    return piece


def _peel_jobs(loop: For, copies: _Copies) -> For:
    """A parallel loop of a few jobs whose var the guards of inner loops read with their own
    (a matrix-vector product's ragged columns, one stretch of panels per job, the last job's
    last panel guarded): still parallel, each job's body its own copy under an `if` on the
    job, in which the inner loops' guards bound their own vars alone and partition."""
    surveyed = _survey(loop.body) if 1 < loop.extent <= PEEL_MAX_EXTENT else None
    if surveyed is None or not _bounds_with(surveyed[0], loop.var, surveyed[1]):
        return loop
    inner = surveyed[1]
    jobs = [_piece(loop, loop.body, i, i + 1, inner, {}, copies) for i in range(loop.extent)]
    jobs = _own_locals(jobs)
    chain = jobs[-1]
    for i in reversed(range(loop.extent - 1)):
        chain = IfThenElse(Binary("==", loop.var, IntImm(i, loop.var.dtype)), jobs[i], chain)
    return For(loop.var, loop.extent, loop.kind, chain, loop.annotations)


def _own_locals(parts: list[Stmt]) -> list[Stmt]:
    """The pieces of a partitioned loop with the local buffers each allocates renamed apart
    (`C_local`, `C_local_p1`, ...): one piece's guarded accesses (a ragged panel's scalar
    tail) then do not keep the others' register tiles in memory (`register_buffers` decides
    per buffer; a ragged matmul of 196 columns ran at 0.4x one of 192)."""
    owned = [parts[0]]
    for n, part in enumerate(parts[1:], 1):
        for node in list(walk(part)):
            if isinstance(node, Allocate) and node.buffer.scope == "local":
                fresh = replace(node.buffer, name=f"{node.buffer.name}_p{n}")
                part = replace_buffer(part, node.buffer, fresh)
                part = _renamed_reductions(part, node.buffer, fresh)
        owned.append(part)
    return owned


def _renamed_reductions(stmt: Stmt, old: Buffer, new: Buffer) -> Stmt:
    """`stmt` with the cross-thread reductions of `old` (cuda_reduce.py) combining `new`:
    a renamed piece's partial is the one its all-reduce must read."""

    def rename(s: Stmt) -> Stmt:
        return replace(s, buffer=new) if isinstance(s, AllReduce) and s.buffer == old else s

    return map_stmt(stmt, stmt_fn=rename)


def _bounds_with(guards: list[Expr], var: Var, inner: dict[Var, int]) -> bool:
    """Whether a guard bounds `var` together with an inner loop's var (`j*2 + q - 1 < 56`)."""
    for g in guards:
        used = free_vars(g)
        if isinstance(g, Binary) and g.op in ("<", "<=") and var in used and used & inner.keys():
            return True
    return False


def _piece(
    loop: For,
    body: Stmt,
    start: int,
    stop: int,
    inner: dict[Var, int],
    somewhere: dict[Expr, tuple[int, int] | None],
    copies: _Copies,
) -> Stmt:
    """`loop` over [start, stop) with `body`: the guards that never hold there decided false
    (a vectorized loop's lanes past a ragged panel's edge), then one iteration inlined with
    its guards decided and its indices simplified, or a loop of its own (its var shifted by
    `start`). The copy of `body` is counted in `copies` first."""
    copies.count(body)
    never = {p for p, span in somewhere.items() if span and (stop <= span[0] or start >= span[1])}
    if never:
        body = map_stmt(body, expr_fn=lambda e: _refute_expr(e, never),
                        stmt_fn=lambda s: _refute(s, never))  # fmt: skip
    if stop - start == 1:
        one = _substitute(body, {loop.var: IntImm(start)})
        one = map_stmt(one, expr_fn=lambda e: _tighten(e, inner), stmt_fn=_decide)
        # With the var a constant, the inner loops' guards may bound their own vars alone.
        return _scoped(map_stmt(one, stmt_fn=lambda s: _partition(s, copies)))
    var = loop.var if start == 0 else Var(f"{loop.var.name}_{start}", loop.var.dtype)
    shifted = body if start == 0 else _substitute(body, {loop.var: Binary("+", var, IntImm(start))})
    ranges = {**inner, var: stop - start}
    shifted = map_stmt(shifted, expr_fn=lambda e: _tighten(e, ranges), stmt_fn=_decide)
    return For(var, stop - start, loop.kind, shifted, loop.annotations)


def _tighten(e: Expr, ranges: dict[Var, int]) -> Expr:
    """A load's indices simplified under the loops' ranges (a clamp `max(min(v - 1, 6), 0)`
    where 1 <= v <= 7 is `v - 1`)."""
    if isinstance(e, BufferLoad):
        return BufferLoad(e.buffer, tuple(simplify(i, ranges) for i in e.indices))
    return e


def _survey(body: Stmt) -> tuple[list[Expr], dict[Var, int]] | None:
    """What partitioning a loop of `body` needs, in one walk: the conjuncts of the conditions
    of its if-without-else statements and selects (its guards), and the extent of each loop
    inside; None when it has no guard or more than PARTITION_MAX_NODES nodes. (Every loop of
    a kernel is surveyed, its whole body each time: one walk that stops early, not three.)"""
    guards: list[Expr] = []
    inner: dict[Var, int] = {}
    for count, node in enumerate(walk(body)):
        if count >= PARTITION_MAX_NODES:
            return None
        if isinstance(node, IfThenElse) and node.else_ is None or isinstance(node, Select):
            guards.extend(conjuncts(node.cond))
        elif isinstance(node, For) and isinstance(node.extent, int):
            inner[node.var] = node.extent
    return (guards, inner) if guards else None


def _holds(
    cond: Expr, var: Var, inner: dict[Var, int], every: bool = True
) -> tuple[int, int] | None:
    """(lo, hi) when `cond`, an affine bound `a*var + sum(c*u) + b < 0` (a != 0; each u a
    loop var inside the partitioned loop, of known extent), holds at every inner iteration
    (or, not `every`, at some) exactly for lo <= var < hi (one end unbounded: -2^31 or
    2^31); None for any other condition."""
    if not isinstance(cond, Binary) or cond.op not in ("<", "<="):
        return None
    used = free_vars(cond)
    if var not in used or not used <= {var, *inner}:
        return None
    others = sorted(used - {var}, key=lambda v: v.name)
    coeffs = affine_coefficients(Binary("-", cond.a, cond.b), [var, *others])
    if coeffs is None or coeffs[var] == 0:
        return None
    a, b = coeffs[var], coeffs[None]
    pick = max if every else min  # the inner loops' worst case, or their best
    b += sum(pick(coeffs[u] * (inner[u] - 1), 0) for u in others)
    if cond.op == "<=":  # a*v + b <= 0  <=>  a*v + b - 1 < 0
        b -= 1
    if a > 0:  # holds below the least v with a*v + b >= 0
        return -(2**31), -(b // a)
    return b // -a + 1, 2**31  # a*v + b < 0  <=>  v > b / -a


def _assume(stmt: Stmt, held: set[Expr]) -> Stmt:
    """`stmt` with the conjuncts in `held` taken as true."""
    if not isinstance(stmt, IfThenElse) or stmt.else_ is not None:
        return stmt
    cond = _without(stmt.cond, held)
    return stmt.then if cond is None else IfThenElse(cond, stmt.then)


def _assume_expr(e: Expr, held: set[Expr]) -> Expr:
    if not isinstance(e, Select):
        return e
    cond = _without(e.cond, held)
    return e.then if cond is None else Select(cond, e.then, e.else_)


def _refute(stmt: Stmt, never: set[Expr]) -> Stmt:
    """An if whose condition has a conjunct in `never` decided false."""
    if isinstance(stmt, IfThenElse) and any(p in never for p in conjuncts(stmt.cond)):
        return stmt.else_ if stmt.else_ is not None else IfThenElse(FALSE, stmt.then)
    return stmt


def _refute_expr(e: Expr, never: set[Expr]) -> Expr:
    if isinstance(e, Select) and any(p in never for p in conjuncts(e.cond)):
        return e.else_
    return e


def _without(cond: Expr, held: set[Expr]) -> Expr | None:
    """`cond` without its conjuncts in `held`; None when none is left."""
    return conjoin([part for part in conjuncts(cond) if part not in held])


def _decide(stmt: Stmt) -> Stmt:
    """Constant guards folded: a true one's body kept, a false one's dropped from its
    sequence; stores with their constants folded (a select of a constant condition too)."""
    if isinstance(stmt, IfThenElse):
        cond = simplify(stmt.cond)
        if cond == TRUE:
            return stmt.then
        if cond == FALSE and stmt.else_ is not None:
            return stmt.else_
        return IfThenElse(cond, stmt.then, stmt.else_)
    if isinstance(stmt, Seq):
        live = [s for s in stmt.stmts if not _dead(s)]
        return seq(*live) if live else stmt
    return _fold(stmt)


def _dead(stmt: Stmt) -> bool:
    """A guard decided false, alone or as the whole body of a block's named wrapper."""
    if isinstance(stmt, Block) and not stmt.iter_vars:
        return _dead(stmt.body)
    return isinstance(stmt, IfThenElse) and stmt.cond == FALSE and stmt.else_ is None


def _small(loop: For) -> bool:
    """Whether the loop may be small enough to expand: the copies, folded, are counted
    after (a case split on the loop var folds to one case a copy: Winograd's transforms)."""
    if isinstance(loop.extent, Sym) or not 0 < loop.extent <= UNROLL_MAX_EXTENT:
        return False
    return loop.extent * nodes(loop.body) <= UNROLL_FOLD_SLACK * UNROLL_MAX_NODES


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
    if isinstance(loop.extent, Sym):
        return None  # a size known at run time: a scalar `omp simd` loop
    widest = max((itemsize(d) for d in value_dtypes(loop.body, loop.var)), default=4)
    return chunk_lanes(loop.extent, widest, vector_bytes)


def chunk_lanes(extent: int, widest: int, vector_bytes: int) -> int | None:
    """`loop_lanes` of a loop of `extent` iterations whose widest element is `widest` bytes."""
    lanes = vector_bytes // widest
    while lanes > extent and lanes * widest > 16:
        lanes //= 2
    return lanes if 2 <= lanes <= extent else None


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
    if isinstance(node, For) and isinstance(node.extent, int):
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
