"""Compute-location primitives: compute_at, reverse_compute_at, compute_inline,
reverse_compute_inline.

Each Schedule method resolves its handles, calls the pure rewrite (PrimFunc in, PrimFunc out,
ScheduleError on an illegal use; the inlines live in `compute_inline.py`), and records one
instruction. A moved block gets new serial loops over exactly the region it must compute per
iteration of the target loop (see `compute_region.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hexir.ir import arith
from hexir.ir.tir import Block, Buffer, BufferLoad, Expr, For, IntImm, PrimFunc, Stmt, Var
from hexir.ir.visit import free_vars, substitute, walk
from hexir.schedule.common import (
    all_blocks,
    find_path,
    is_block,
    loop_ranges,
    loops_of,
    schedule_error,
    symbolic_loops,
    taken_names,
)
from hexir.schedule.compute_inline import (
    compute_inline_block,
    reverse_compute_inline_block,
    stored_axes,
)
from hexir.schedule.compute_region import (
    Span,
    block_inputs,
    clip_span,
    holds_block,
    insert_in_loop,
    loaded,
    own_stores,
    regenerate,
    region_of,
    stored,
    union_region,
    without_block,
)
from hexir.schedule.state import INLINE, ROOT, ScheduleBase, primitive
from hexir.schedule.trace import BlockRV, LoopRV

Region = list[Span | None]


class ComputeLocationPrimitives(ScheduleBase):
    @primitive
    def compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False) -> None:
        """Move producer `block` under `loop` (around all its consumers), computing per
        iteration only the region those consumers read there.

            for %i1 in 0..4 { for %i2 in 0..8 {          for %i3 in 0..4 serial {
              block @exp(vi1 = spatial(4) %i1, ...)        for %i2 in 0..8 serial {
            } }                                      ->      block @exp(vi1 = spatial(4) %i3,
            for %i3 in 0..4 { for %k1 in 0..8 {                         vi2 = spatial(8) %i2)
              block @sum(vi3 = spatial(4) %i3, ...)        }
            } }                                            for %k1 in 0..8 { block @sum(...) }

        Reduce loops come along whole; a region of one index gets no loop unless
        `preserve_unit_loops`. `loop` may be a `sample_compute_location` result: ROOT leaves
        the block where it is, INLINE inlines it (`compute_inline`).
        """
        node = self._block(block, "compute_at")
        where = self._symbol(loop, "compute_at")
        if where == ROOT:
            func = self.func
        elif where == INLINE:
            func = compute_inline_block(self.func, node)
        else:
            target = self._loop(loop, "compute_at")
            func = compute_at_block(self.func, node, target, preserve_unit_loops)
        inputs = (("block", block), ("loop", loop))
        self._commit("compute_at", inputs, (("preserve_unit_loops", preserve_unit_loops),), func)

    @primitive
    def reverse_compute_at(
        self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False
    ) -> None:
        """Move consumer `block` under `loop` (around all its producers), after them, computing
        per iteration the region they write there.

            for %i0 in 0..8 { for %i1 in 0..16 {         for %i0 in 0..8 serial {
              for %k0 in 0..32 { block @dense(...) }       for %i1 in 0..16 serial {
            } }                                              for %k0 in 0..32 { block @dense }
            for %i2 in 0..8 { for %i3 in 0..16 {     ->    }
              block @relu(vi2 = spatial(8) %i2,            for %i3 in 0..16 serial {
                          vi3 = spatial(16) %i3)             block @relu(vi2 = spatial(8) %i0,
            } }                                                          vi3 = spatial(16) %i3)

        `loop` must not run a reduction of a producer (the consumer would read partial
        results). A sampled ROOT or INLINE location means no move, or `reverse_compute_inline`.
        """
        node = self._block(block, "reverse_compute_at")
        where = self._symbol(loop, "reverse_compute_at")
        if where == ROOT:
            func = self.func
        elif where == INLINE:
            func = reverse_compute_inline_block(self.func, node)
        else:
            target = self._loop(loop, "reverse_compute_at")
            func = reverse_compute_at_block(self.func, node, target, preserve_unit_loops)
        inputs = (("block", block), ("loop", loop))
        attrs = (("preserve_unit_loops", preserve_unit_loops),)
        self._commit("reverse_compute_at", inputs, attrs, func)

    @primitive
    def compute_inline(self, block: BlockRV) -> None:
        """Substitute an elementwise producer's value into its consumers and remove it, with
        its loops and (once unused) its buffer's allocation.

            block @bias_add(...) { %bias_add[vi2, vi3] = %dense[vi2, vi3] + %bias[vi3] }
            block @relu(...) { %Y[vi4, vi5] = max(%bias_add[vi4, vi5], 0.0) }
          ->
            block @relu(...) { %Y[vi4, vi5] = max(%dense[vi4, vi5] + %bias[vi5], 0.0) }
        """
        func = compute_inline_block(self.func, self._block(block, "compute_inline"))
        self._commit("compute_inline", (("block", block),), (), func)

    @primitive
    def reverse_compute_inline(self, block: BlockRV) -> None:
        """Fold an elementwise consumer into its (spatial) producer's store and remove it.

            block @bias_add(...) { %bias_add[vi2, vi3] = %dense[vi2, vi3] + %bias[vi3] }
            block @relu(...) { %Y[vi4, vi5] = max(%bias_add[vi4, vi5], 0.0) }
          ->
            block @bias_add(...) { %Y[vi2, vi3] = max(%dense[vi2, vi3] + %bias[vi3], 0.0) }

        A reduction producer is refused: its epilogue would have to run once, after the last
        reduction step, which no substitution into its update expresses.
        """
        node = self._block(block, "reverse_compute_inline")
        func = reverse_compute_inline_block(self.func, node)
        self._commit("reverse_compute_inline", (("block", block),), (), func)


# ---------------------------------------------------------------------------------------------
# compute_at


def compute_at_block(
    func: PrimFunc, block: Block, loop: For, preserve_unit_loops: bool = False
) -> PrimFunc:
    """`func` with producer `block` moved under `loop`, before its first consumer there."""
    buffer, axes = stored_axes("compute_at", func, block)
    if buffer in func.outputs:
        raise schedule_error(
            "compute_at",
            f"block @{block.name} writes the output %{buffer.name}: moved, it would compute "
            "only what other blocks read of it",
            func,
            block=block.name,
        )
    consumers = [b for b in all_blocks(func.body) if b is not block and buffer in loaded(b)]
    if not consumers:
        raise schedule_error(
            "compute_at", f"no block reads %{buffer.name}, written by @{block.name}", func
        )
    _check_rerunnable("compute_at", func, block)
    _check_location("compute_at", func, block, loop, consumers, "consumer")
    _check_later("compute_at", func, block, loop, block_inputs(block) | {buffer})
    ranges = loop_ranges(func)
    region: Region | None = None
    for c in consumers:
        inner = _inner_loops(func, c, loop)
        for idx in _indices_in_loops(c, buffer):
            region = union_region(region, region_of(idx, inner, ranges), ranges)
    assert region is not None
    doms = {iv.var: iv.dom for iv in block.iter_vars}
    spans = {iv.var: Span(IntImm(0), iv.dom) for iv in block.iter_vars}
    spans |= {var: clip_span(span, doms[var]) for var, span in zip(axes, region, strict=True)}
    names = {c.name for c in consumers}
    return _move(func, block, loop, spans, preserve_unit_loops, lambda items: _first(items, names))


def _first(items: list[Stmt], names: set[str]) -> int:
    return next(n for n, s in enumerate(items) if holds_block(s, names))


def _move(
    func: PrimFunc,
    block: Block,
    loop: For,
    spans: dict[Var, Span],
    preserve_unit_loops: bool,
    position: Callable[[list[Stmt]], int],
) -> PrimFunc:
    """`func` with `block` taken out of its nest and put, under new loops, in `loop`."""
    rest = without_block(func, block.name)
    taken = taken_names(rest) | {iv.var.name for iv in block.iter_vars}
    nest = regenerate(
        block, spans, loop_ranges(func), taken, preserve_unit_loops, symbolic_loops(func)
    )
    return insert_in_loop(rest, loop.var, nest, position)


def _indices_in_loops(block: Block, buffer: Buffer) -> list[tuple[Expr, ...]]:
    """The index tuples of `block`'s loads of `buffer`, in terms of the loop vars."""
    env = {iv.var: iv.binding for iv in block.iter_vars}
    found = (tuple(substitute(i, env) for i in idx) for idx in _load_indices(block, buffer))
    return list(dict.fromkeys(found))  # type: ignore[arg-type]


def _load_indices(block: Block, buffer: Buffer) -> list[tuple[Expr, ...]]:
    parts = [p for p in (block.init, block.body) if p is not None]
    loads = [n for p in parts for n in walk(p) if isinstance(n, BufferLoad)]
    return [n.indices for n in loads if n.buffer == buffer]


# ---------------------------------------------------------------------------------------------
# reverse_compute_at


def reverse_compute_at_block(
    func: PrimFunc, block: Block, loop: For, preserve_unit_loops: bool = False
) -> PrimFunc:
    """`func` with consumer `block` moved under `loop`, after its last producer there."""
    inputs = block_inputs(block)
    producers = [b for b in all_blocks(func.body) if b is not block and stored(b) & inputs]
    if not producers:
        raise schedule_error(
            "reverse_compute_at",
            f"no block writes what @{block.name} reads",
            func,
            block=block.name,
        )
    _check_rerunnable("reverse_compute_at", func, block)
    _check_not_around("reverse_compute_at", func, block, loop)
    producers = _producers_under(func, block, loop, producers)
    _check_location("reverse_compute_at", func, block, loop, producers, "producer")
    _check_complete(func, block, loop, producers)
    _check_earlier(func, block, loop)
    ranges = loop_ranges(func)
    regions: dict[Buffer, Region] = {}
    for p in producers:
        inner = _inner_loops(func, p, loop)
        env = {iv.var: iv.binding for iv in p.iter_vars}
        for s in own_stores(p):
            if s.buffer in inputs:
                idx = [substitute(i, env) for i in s.indices]
                new = region_of(idx, inner, ranges)  # type: ignore[arg-type]
                regions[s.buffer] = union_region(regions.get(s.buffer), new, ranges)
    spans = _consumer_spans(func, block, loop, regions, ranges)
    names = {p.name for p in producers}

    def after_last(items: list[Stmt]) -> int:
        return max(n for n, s in enumerate(items) if holds_block(s, names)) + 1

    return _move(func, block, loop, spans, preserve_unit_loops, after_last)


def _producers_under(
    func: PrimFunc, block: Block, loop: For, producers: list[Block]
) -> list[Block]:
    """The producers under `loop`; the others must be done before it starts (their output is
    then whole wherever the consumer goes)."""
    order, first, _ = _order(func, loop)
    inside = {b.name for b in all_blocks(loop)}
    for p in producers:
        if p.name not in inside and _position(order, p) > first:
            raise schedule_error(
                "reverse_compute_at",
                f"producer @{p.name} of @{block.name} runs after loop %{loop.var.name} starts "
                "and is not under it",
                func,
                block=p.name,
            )
    under = [p for p in producers if p.name in inside]
    if not under:
        raise schedule_error(
            "reverse_compute_at",
            f"no producer of @{block.name} is under loop %{loop.var.name}",
            func,
            loop=loop.var,
        )
    return under


def _consumer_spans(
    func: PrimFunc,
    block: Block,
    loop: For,
    regions: dict[Buffer, Region],
    ranges: dict[Var, int],
) -> dict[Var, Span]:
    """The range of each iter var of `block` whose reads fall in the produced `regions`."""
    found: dict[Var, Span | None] = {}
    for buffer, region in regions.items():
        for idx in dict.fromkeys(_load_indices(block, buffer)):
            for axis, (index, span) in enumerate(zip(idx, region, strict=True)):
                var, offset = _unit_offset(func, block, buffer, index)
                if var is None:
                    _check_fixed_index(func, block, buffer, axis, span)
                    continue
                moved = None
                if span is not None:
                    moved = Span(arith.simplify(span.start - offset, ranges), span.extent)
                if var in found and found[var] != moved:
                    raise schedule_error(
                        "reverse_compute_at",
                        f"block @{block.name} reads the produced %{buffer.name} at several "
                        f"offsets along {var.name}: no single range of it per iteration",
                        func,
                        block=block.name,
                    )
                found[var] = moved
    spans = {}
    for iv in block.iter_vars:
        span = clip_span(found.get(iv.var), iv.dom) if iv.var in found else None
        spans[iv.var] = span or Span(IntImm(0), iv.dom)
        whole = spans[iv.var] == Span(IntImm(0), iv.dom)
        if iv.kind == "reduce" and not whole:
            raise schedule_error(
                "reverse_compute_at",
                f"reduce iter var {iv.var.name} of @{block.name} would cover only part of its "
                f"domain per iteration of loop %{loop.var.name}",
                func,
                loop=loop.var,
            )
    return spans


def _check_fixed_index(
    func: PrimFunc, block: Block, buffer: Buffer, axis: int, span: Span | None
) -> None:
    # A fixed index along an axis the loop tiles may name an element of a later iteration:
    # the consumer points computed before it is produced would never be computed again.
    dom = buffer.shape[axis]
    if clip_span(span, dom) != Span(IntImm(0), dom):
        raise schedule_error(
            "reverse_compute_at",
            f"block @{block.name} reads %{buffer.name} at a fixed index along axis {axis}, "
            "which the loop produces piece by piece",
            func,
            block=block.name,
        )


def _unit_offset(
    func: PrimFunc, block: Block, buffer: Buffer, index: Expr
) -> tuple[Var | None, int]:
    """`index` as `iter var + constant` (or a constant: no var); ScheduleError otherwise."""
    ivs = [iv.var for iv in block.iter_vars]
    coeffs = arith.affine_coefficients(index, ivs)
    used = [v for v in ivs if coeffs is not None and coeffs[v] != 0]
    offset = arith.simplify(index - used[0]) if len(used) == 1 else None
    if coeffs is not None and not used:
        return None, 0
    if len(used) != 1 or coeffs[used[0]] != 1 or not isinstance(offset, IntImm):  # type: ignore
        raise schedule_error(
            "reverse_compute_at",
            f"block @{block.name} reads %{buffer.name} at index {index}: only an iter var "
            "plus a constant maps a produced region back to the consumer",
            func,
            block=block.name,
        )
    return used[0], offset.value


# ---------------------------------------------------------------------------------------------
# Legality


def _block_path(func: PrimFunc, block: Block) -> list[Stmt]:
    return find_path(func.body, is_block(block.name)) or []


def _inner_loops(func: PrimFunc, block: Block, loop: For) -> dict[Var, int]:
    """The loops between `loop` (excluded) and `block`, with their extents."""
    loops = loops_of(_block_path(func, block))
    at = [f.var for f in loops].index(loop.var)
    return {f.var: f.extent for f in loops[at + 1 :]}


def _check_location(
    primitive: str, func: PrimFunc, block: Block, loop: For, others: Sequence[Block], role: str
) -> None:
    def fail(reason: str) -> Exception:
        return schedule_error(primitive, reason, func, loop=loop.var)

    for b in (block, *others):
        path = _block_path(func, b)
        if any(isinstance(s, Block) for s in path[:-1]):
            raise fail(f"block @{b.name} is nested in another block: not supported")
    _check_not_around(primitive, func, block, loop)
    for b in others:
        if loop.var not in {f.var for f in loops_of(_block_path(func, b))}:
            raise fail(
                f"loop %{loop.var.name} is not around @{b.name}, a {role} of @{block.name}: "
                f"the loop must hold every {role}"
            )


def _check_rerunnable(primitive: str, func: PrimFunc, block: Block) -> None:
    """A moved block may run twice on one element where regions overlap: fine for a store or
    a reduction with its init, wrong for an update that accumulates without one."""
    if block.init is None and stored(block) & loaded(block):
        raise schedule_error(
            primitive,
            f"block @{block.name} updates what it writes without an init: run twice on one "
            "element (overlapping regions), it would accumulate twice",
            func,
            block=block.name,
        )


def _check_not_around(primitive: str, func: PrimFunc, block: Block, loop: For) -> None:
    if loop.var in {f.var for f in loops_of(_block_path(func, block))}:
        raise schedule_error(
            primitive,
            f"loop %{loop.var.name} is around @{block.name} itself",
            func,
            loop=loop.var,
        )


def _order(func: PrimFunc, loop: For) -> tuple[list[Block], int, int]:
    """Every block in program order, and the positions of the first and last under `loop`."""
    order = list(all_blocks(func.body))
    inside = {b.name for b in all_blocks(loop)}
    where = [n for n, b in enumerate(order) if b.name in inside]
    return order, where[0], where[-1]


def _position(order: list[Block], block: Block) -> int:
    return next(n for n, b in enumerate(order) if b.name == block.name)


def _check_later(primitive: str, func: PrimFunc, block: Block, loop: For, touched: set) -> None:
    """Moving `block` later, into `loop`: nothing it passes or meets there may write what it
    reads or writes."""
    order, first, _ = _order(func, loop)
    me = _position(order, block)
    if me > first:
        raise schedule_error(
            primitive,
            f"block @{block.name} comes after loop %{loop.var.name}: a producer moves later, "
            "into its consumers' loop, never earlier",
            func,
            loop=loop.var,
        )
    for b in order[me + 1 : first] + list(all_blocks(loop)):
        clash = stored(b) & touched
        if clash:
            raise schedule_error(
                primitive,
                f"block @{b.name} writes %{min(x.name for x in clash)}, which @{block.name} "
                f"uses, between @{block.name}'s place and loop %{loop.var.name}",
                func,
                block=b.name,
            )


def _check_earlier(func: PrimFunc, block: Block, loop: For) -> None:
    """Moving consumer `block` earlier, into `loop`: nothing it passes or meets there may read
    or write what it writes."""
    order, _, last = _order(func, loop)
    me = _position(order, block)
    if me < last:
        raise schedule_error(
            "reverse_compute_at",
            f"block @{block.name} comes before the end of loop %{loop.var.name}",
            func,
            loop=loop.var,
        )
    outs = stored(block)
    for b in list(all_blocks(loop)) + order[last + 1 : me]:
        clash = (loaded(b) | stored(b)) & outs
        if clash:
            raise schedule_error(
                "reverse_compute_at",
                f"block @{b.name} uses %{min(x.name for x in clash)}, which @{block.name} "
                f"writes, between loop %{loop.var.name} and @{block.name}'s place",
                func,
                block=b.name,
            )


def _check_complete(func: PrimFunc, block: Block, loop: For, producers: Sequence[Block]) -> None:
    """A producer's values are final per iteration of `loop` only if no loop at or above it
    runs one of the producer's reductions."""
    for p in producers:
        loops = [f.var for f in loops_of(_block_path(func, p))]
        above = set(loops[: loops.index(loop.var) + 1])
        for iv in p.iter_vars:
            if iv.kind == "reduce" and free_vars(iv.binding) & above:
                raise schedule_error(
                    "reverse_compute_at",
                    f"loop %{loop.var.name} (or one around it) runs reduce iter var "
                    f"{iv.var.name} of @{p.name}: @{block.name} would read partial results",
                    func,
                    loop=loop.var,
                )
