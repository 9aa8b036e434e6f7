"""What compute_at, reverse_compute_at and the inlines share: region inference over loop nests,
regenerating a block's loops over a region, and block-level dependence facts.

A region is one `Span` per buffer axis: a start expression in the loop vars at or above the
compute location (symbolic) and a constant extent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hexir.ir import arith
from hexir.ir.names import unique_name
from hexir.ir.symbolic import Dim, Sym, SymbolicError
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    IntImm,
    IterVar,
    PrimFunc,
    Seq,
    Stmt,
    Unary,
    Var,
    seq,
)
from hexir.ir.visit import free_vars, substitute, walk
from hexir.schedule.common import all_blocks, conjoin, is_loop, replace_body


@dataclass(frozen=True, slots=True)
class Span:
    """The indices start, start + 1, ..., start + extent - 1 of one buffer axis."""

    start: Expr
    extent: int


# ---------------------------------------------------------------------------------------------
# Region inference


def access_span(index: Expr, inner: Mapping[Var, int], ranges: Mapping[Var, int]) -> Span | None:
    """The indices `index` takes while the `inner` loops run over their whole extents and the
    other loop vars stay fixed; None when no useful bound is known (the whole axis)."""
    if any(isinstance(n, BufferLoad) for n in walk(index)):
        return None  # an indirect index: nothing to say about it
    coeffs = arith.affine_coefficients(index, list(inner))
    if coeffs is None:
        # Not affine in the inner loops (a clamp, a div): the hull of the terms that use them
        # (a fused thread index taken apart: floordiv(t, 2) * 64 + floormod(t, 4)) after the
        # rest, where no term mixes them with outer loops; else a constant hull over all.
        return _separable_span(index, inner, ranges) or _constant_span(index, ranges)
    low = {v: IntImm(0 if coeffs[v] >= 0 else ext - 1) for v, ext in inner.items()}
    start = arith.simplify(substitute(index, low), ranges)  # type: ignore[arg-type]
    extent = 1 + sum(abs(coeffs[v]) * (ext - 1) for v, ext in inner.items())
    return Span(start, extent)  # type: ignore[arg-type]


def _separable_span(
    index: Expr, inner: Mapping[Var, int], ranges: Mapping[Var, int]
) -> Span | None:
    terms = _summands(arith.simplify(index, ranges))
    mixed = [t for t in terms if free_vars(t) & inner.keys()]
    if not mixed or any(free_vars(t) - inner.keys() for t in mixed):
        return None
    b = arith.bound(_sum(mixed), inner)
    if b.lo is None or b.hi is None:
        return None
    rest = [t for t in terms if not free_vars(t) & inner.keys()]
    start = arith.simplify(_sum([*rest, IntImm(int(b.lo), index.dtype)]), ranges)
    return Span(start, int(b.hi - b.lo) + 1)


def _summands(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "+":
        return [*_summands(e.a), *_summands(e.b)]
    return [e]


def _sum(terms: list[Expr]) -> Expr:
    total = terms[0]
    for t in terms[1:]:
        total = Binary("+", total, t)
    return total


def _constant_span(index: Expr, ranges: Mapping[Var, int]) -> Span | None:
    b = arith.bound(index, ranges)
    if b.lo is None or b.hi is None:
        return None
    return Span(IntImm(b.lo), b.hi - b.lo + 1)


def union_span(a: Span | None, b: Span | None, ranges: Mapping[Var, int]) -> Span | None:
    """The smallest span holding both; exact when the starts differ by a constant."""
    if a is None or b is None:
        return None
    d = arith.simplify(b.start - a.start, ranges)
    if isinstance(d, IntImm):
        lo, hi = min(0, d.value), max(a.extent, d.value + b.extent)
        return Span(arith.simplify(a.start + lo, ranges), hi - lo)
    ha, hb = _hull(a, ranges), _hull(b, ranges)
    if ha is None or hb is None:
        return None
    lo, hi = min(ha[0], hb[0]), max(ha[1], hb[1])
    return Span(IntImm(lo), hi - lo + 1)


def _hull(s: Span, ranges: Mapping[Var, int]) -> tuple[int, int] | None:
    b = arith.bound(s.start, ranges)
    if b.lo is None or b.hi is None:
        return None
    return b.lo, b.hi + s.extent - 1


def clip_span(span: Span | None, dom: Dim) -> Span:
    """`span` cut to the domain [0, dom) where that is known statically (a symbolic domain
    cuts nothing)."""
    if span is None:
        return Span(IntImm(0), dom)
    if isinstance(dom, Sym):
        return span
    if isinstance(span.start, IntImm):
        lo, hi = max(0, span.start.value), min(dom, span.start.value + span.extent)
        return Span(IntImm(lo), max(hi - lo, 1))
    return Span(IntImm(0), dom) if span.extent >= dom else span


def region_of(
    indices: Sequence[Expr], inner: Mapping[Var, int], ranges: Mapping[Var, int]
) -> list[Span | None]:
    return [access_span(i, inner, ranges) for i in indices]


def union_region(
    a: list[Span | None] | None, b: list[Span | None], ranges: Mapping[Var, int]
) -> list[Span | None]:
    if a is None:
        return b
    return [union_span(x, y, ranges) for x, y in zip(a, b, strict=True)]


# ---------------------------------------------------------------------------------------------
# Regenerating a block's loops


def regenerate(
    block: Block,
    spans: Mapping[Var, Span],
    ranges: Mapping[Var, int],
    taken: set[str],
    preserve_unit_loops: bool,
    symbolic: Mapping[Var, Sym] | None = None,
) -> Stmt:
    """`block` under new serial loops, one per iter var that covers more than one index (or
    every one, with `preserve_unit_loops`), each iter var bound to its span's start plus its
    loop var; guarded by a predicate where the span may leave the iter var's domain.
    `symbolic`: the enclosing loops of symbolic extents; an iter var of a symbolic domain
    needs no guard bound to such a loop of that extent, and any other binding raises
    SymbolicError (its guard would compare with a size known at run time)."""
    loops: list[tuple[Var, Dim]] = []
    inner = dict(ranges)
    ivs: list[IterVar] = []
    conds: list[Expr] = []
    for iv in block.iter_vars:
        span = spans[iv.var]
        binding = span.start
        if isinstance(span.extent, Sym) or span.extent > 1 or preserve_unit_loops:
            var = Var(unique_name(_loop_name(iv.binding, iv.var), taken))
            loops.append((var, span.extent))
            if isinstance(span.extent, int):
                inner[var] = span.extent
            else:
                symbolic = {**(symbolic or {}), var: span.extent}
            binding = arith.simplify(span.start + var, inner)
        ivs.append(replace(iv, binding=binding))
        if isinstance(iv.dom, Sym):
            if not (isinstance(binding, Var) and (symbolic or {}).get(binding) == iv.dom):
                raise SymbolicError(f"@{block.name}'s {iv.var.name} needs a guard by {{{iv.dom}}}")
            continue
        # Guards over the loop vars, as split writes them (DESIGN: TVM-style predicates).
        for op, bound in ((">=", 0), ("<", iv.dom)):
            cond = arith.simplify(Binary(op, binding, IntImm(bound)), inner)
            if cond != arith.TRUE:
                conds.append(cond)
    new = refresh_regions(replace(block, iter_vars=tuple(ivs), predicate=_predicate(block, conds)))
    stmt: Stmt = new
    for var, extent in reversed(loops):
        stmt = For(var, extent, "serial", stmt)
    return stmt


def _loop_name(binding: Expr, iv_var: Var) -> str:
    # The old loop's name when the iter var was bound to one loop; else the iter var's name
    # without its `v`, so `vi0 = %i0_0 * 4 + %i0_1` comes back under a loop `%i0`.
    if isinstance(binding, Var):
        return binding.name
    name = iv_var.name
    return name[1:] if name.startswith("v") and len(name) > 1 else f"{name}_l"


def _predicate(block: Block, conds: list[Expr]) -> Expr | None:
    # An old predicate over loop vars guarded the old loops' domain (split tails); the new
    # guard replaces it. One over the iter vars alone is a real condition and stays.
    own = {iv.var for iv in block.iter_vars}
    old = block.predicate
    parts = [old] if old is not None and free_vars(old) <= own else []
    return conjoin([*parts, *conds])


def insert_in_loop(
    func: PrimFunc, loop: Var, stmt: Stmt, position: Callable[[list[Stmt]], int]
) -> PrimFunc:
    """`func` with `stmt` put among the statements of `loop`'s body at `position(them)`."""

    def fn(node: Stmt) -> Stmt:
        assert isinstance(node, For)
        items: list[Stmt] = list(node.body.stmts) if isinstance(node.body, Seq) else [node.body]
        items.insert(position(items), stmt)
        return replace(node, body=seq(*items))

    return replace_body(func, is_loop(loop), fn)


def holds_block(stmt: Stmt, names: Iterable[str]) -> bool:
    wanted = set(names)
    return any(b.name in wanted for b in all_blocks(stmt))


# ---------------------------------------------------------------------------------------------
# Blocks: stores, loads, regions, removal


def own_stores(block: Block) -> list[BufferStore]:
    """The stores in `block`'s body and init (init first), in program order."""
    parts = [p for p in (block.init, block.body) if p is not None]
    return [n for p in parts for n in walk(p) if isinstance(n, BufferStore)]


def loaded(stmt: Stmt) -> set[Buffer]:
    return {n.buffer for n in walk(stmt) if isinstance(n, BufferLoad)}


def stored(stmt: Stmt) -> set[Buffer]:
    return {n.buffer for n in walk(stmt) if isinstance(n, BufferStore)}


def accessed(stmt: Stmt) -> tuple[set[Buffer], set[Buffer]]:
    """`loaded(stmt)` and `stored(stmt)` in one walk."""
    loads: set[Buffer] = set()
    stores: set[Buffer] = set()
    for n in walk(stmt):
        if isinstance(n, BufferLoad):
            loads.add(n.buffer)
        elif isinstance(n, BufferStore):
            stores.add(n.buffer)
    return loads, stores


def block_inputs(block: Block) -> set[Buffer]:
    """The buffers `block` reads other than those it writes (an accumulator is not an input)."""
    return loaded(block) - stored(block)


def refresh_regions(block: Block) -> Block:
    """`block` with reads and writes recomputed from its body, as lowering writes them: point
    accesses in order of first appearance, reads without the block's own written buffers."""
    stores = own_stores(block)
    written = {s.buffer for s in stores}
    writes = dict.fromkeys(BufferRegion(s.buffer, s.indices) for s in stores)
    parts = [p for p in (block.body, block.init) if p is not None]
    loads = [n for p in parts for n in walk(p) if isinstance(n, BufferLoad)]
    reads = dict.fromkeys(BufferRegion(n.buffer, n.indices) for n in loads)
    kept = tuple(r for r in reads if r.buffer not in written)
    return replace(block, reads=kept, writes=tuple(writes))


def remove_block(stmt: Stmt, name: str) -> Stmt | None:
    """`stmt` without block `name` and the loops (and ifs) that held nothing else."""
    match stmt:
        case Block(name=n) if n == name:
            return None
        case For():
            body = remove_block(stmt.body, name)
            return None if body is None else replace(stmt, body=body)
        case Seq(stmts):
            kept = [s for s in (remove_block(s, name) for s in stmts) if s is not None]
            return seq(*kept) if kept else None
        case IfThenElse(cond, then, else_):
            new_then = remove_block(then, name)
            new_else = None if else_ is None else remove_block(else_, name)
            if new_then is None:
                return None if new_else is None else IfThenElse(Unary("!", cond), new_else)
            return IfThenElse(cond, new_then, new_else)
    return stmt


def without_block(func: PrimFunc, name: str) -> PrimFunc:
    body = remove_block(func.body, name)
    assert body is not None, "a function's outputs are stored by some block"
    return replace(func, body=body)


def drop_unused_alloc(func: PrimFunc, buffer: Buffer) -> PrimFunc:
    """`func` without the Allocate of `buffer` once nothing loads or stores it."""
    accesses = (n for n in walk(func.body) if isinstance(n, (BufferLoad, BufferStore)))
    if any(n.buffer == buffer for n in accesses):
        return func

    def strip(stmt: Stmt) -> Stmt:
        match stmt:
            case Seq(stmts):
                kept = [strip(s) for s in stmts if not _allocates(s, buffer)]
                return seq(*kept)
            case For():
                return replace(stmt, body=strip(stmt.body))
        return stmt

    return replace(func, body=strip(func.body))


def _allocates(stmt: Stmt, buffer: Buffer) -> bool:
    return isinstance(stmt, Allocate) and stmt.buffer == buffer
