"""The inlining rewrites behind `compute_inline` and `reverse_compute_inline` (the Schedule
methods are in `compute_location.py`).

Both work on elementwise blocks only: one store, at the block's spatial iter vars, no init,
no predicate. Everything else raises ScheduleError and leaves the function as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hexir.errors import ScheduleError
from hexir.ir import arith
from hexir.ir.tir import Block, Buffer, BufferLoad, BufferStore, Expr, PrimFunc, Var
from hexir.ir.visit import map_expr, map_stmt, substitute, walk
from hexir.schedule.common import all_blocks, is_block, replace_body, schedule_error
from hexir.schedule.compute_region import (
    accessed,
    block_inputs,
    drop_unused_alloc,
    own_stores,
    refresh_regions,
    stored,
    without_block,
)


def stored_axes(primitive: str, func: PrimFunc, block: Block) -> tuple[Buffer, list[Var]]:
    """The one buffer `block` stores to and, per axis, the spatial iter var indexing it."""
    stores = own_stores(block)
    spatial = [iv.var for iv in block.iter_vars if iv.kind == "spatial"]
    first = stores[0] if stores else None
    ok = first is not None and all(
        s.buffer == first.buffer and s.indices == first.indices for s in stores
    )
    if ok and first is not None:
        indices = list(first.indices)
        ok = all(isinstance(i, Var) for i in indices) and sorted(indices, key=str) == sorted(
            spatial, key=str
        )
    if not ok or first is None:
        raise schedule_error(
            primitive,
            f"block @{block.name} must store one buffer, at its spatial iter vars "
            f"({', '.join(v.name for v in spatial)}), in every store",
            func,
            block=block.name,
        )
    return first.buffer, list(first.indices)  # type: ignore[arg-type]


def _elementwise(primitive: str, func: PrimFunc, block: Block, role: str) -> BufferStore:
    """The single store of an elementwise `block`; ScheduleError naming what is not."""

    def fail(reason: str) -> ScheduleError:
        return schedule_error(primitive, f"{role} @{block.name} {reason}", func, block=block.name)

    if block.init is not None or any(iv.kind == "reduce" for iv in block.iter_vars):
        raise fail(
            "is a reduction: only a spatial block folds into a single expression"
            + (
                "; an epilogue would have to run once, after the last reduction step"
                if role == "producer"
                else ""
            )
        )
    if not isinstance(block.body, BufferStore):
        raise fail("holds more than a single store")
    if block.predicate is not None:
        raise fail("has a predicate: inline it before splitting its loops")
    stored_axes(primitive, func, block)
    return block.body


# ---------------------------------------------------------------------------------------------
# compute_inline


def compute_inline_block(func: PrimFunc, block: Block) -> PrimFunc:
    """`func` with elementwise `block`'s value substituted into every read of its buffer, and
    `block`, its loops and (now unused) its buffer's allocation removed."""

    def fail(reason: str) -> ScheduleError:
        return schedule_error("compute_inline", reason, func, block=block.name)

    store = _elementwise("compute_inline", func, block, "block")
    buffer = store.buffer
    if buffer in func.params:
        raise fail(f"block @{block.name} writes the param %{buffer.name}, not an intermediate")
    order = list(all_blocks(func.body))
    # Each block's loads and stores, walked once: a graph of many small blocks (an ONNX
    # function expanded) inlines each of them in turn.
    uses = [accessed(b) for b in order]
    me = next(n for n, b in enumerate(order) if b.name == block.name)
    if buffer in uses[me][0]:
        raise fail(f"block @{block.name} reads the %{buffer.name} it writes")
    others = [b for b, (_, s) in zip(order, uses, strict=True) if b is not block and buffer in s]
    if others:
        raise fail(f"%{buffer.name} is also written by @{others[0].name}")
    readers = [n for n, (loads, _) in enumerate(uses) if buffer in loads]
    if any(n < me for n in readers):
        raise fail(f"a block reads %{buffer.name} before @{block.name} writes it")
    inputs = uses[me][0] - uses[me][1]  # as block_inputs(block) makes them
    last = max(readers, default=me)
    for b, (_, stores) in list(zip(order, uses, strict=True))[me + 1 : last + 1]:
        if stores & inputs:
            raise fail(
                f"block @{b.name} writes an input of @{block.name} before the last read of "
                f"%{buffer.name}: the inlined value would change"
            )
    axes = [i for i in store.indices if isinstance(i, Var)]
    new = without_block(func, block.name)
    for n in readers:
        name = order[n].name
        new = replace_body(
            new, is_block(name), lambda s: refresh_regions(_inline_into(s, buffer, axes, store))
        )
    return drop_unused_alloc(new, buffer)


def _inline_into(consumer: Block, buffer: Buffer, axes: list[Var], store: BufferStore) -> Block:
    # Unit domains stay out: simplify would fold such an iter var to 0 in every index.
    doms = {iv.var: iv.dom for iv in consumer.iter_vars if iv.dom > 1}

    def fn(e: Expr) -> Expr:
        if not (isinstance(e, BufferLoad) and e.buffer == buffer):
            return e
        value = substitute(store.value, dict(zip(axes, e.indices, strict=True)))
        return map_expr(value, lambda n: _simplified_indices(n, doms))  # type: ignore[arg-type]

    out = map_stmt(consumer, expr_fn=fn)
    assert isinstance(out, Block)
    return out


def _simplified_indices(e: Expr, doms: Mapping[Var, int]) -> Expr:
    if isinstance(e, BufferLoad):
        return BufferLoad(e.buffer, tuple(arith.simplify(i, doms) for i in e.indices))
    return e


# ---------------------------------------------------------------------------------------------
# reverse_compute_inline


def reverse_compute_inline_block(func: PrimFunc, block: Block) -> PrimFunc:
    """`func` with elementwise consumer `block` folded into the store of the spatial block
    that produces what it reads; the consumer and the intermediate buffer are removed."""

    def fail(reason: str) -> ScheduleError:
        return schedule_error("reverse_compute_inline", reason, func, block=block.name)

    store = _elementwise("reverse_compute_inline", func, block, "consumer")
    order = list(all_blocks(func.body))
    uses = [accessed(b) for b in order]  # each block's loads and stores, walked once
    written = set().union(*(stores for _, stores in uses))
    produced = sorted((buf for buf in block_inputs(block) if buf in written), key=lambda b: b.name)
    if len(produced) != 1:
        what = "no" if not produced else f"{len(produced)}"
        raise fail(f"block @{block.name} reads {what} buffers written by a block; it needs one")
    buffer = produced[0]
    writers = [b for b, (_, stores) in zip(order, uses, strict=True) if buffer in stores]
    if len(writers) != 1 or buffer in func.params:
        raise fail(f"%{buffer.name} must be an intermediate written by one block")
    producer = writers[0]
    p_store = _elementwise("reverse_compute_inline", func, producer, "producer")
    readers = [
        b
        for b, (loads, _) in zip(order, uses, strict=True)
        if b is not producer and buffer in loads
    ]
    if [b.name for b in readers] != [block.name]:
        other = next(b for b in readers if b is not block)
        raise fail(f"%{buffer.name} is also read by @{other.name}; it cannot go away")
    _check_elementwise_read(func, block, producer, buffer, store)
    _check_between(func, order, uses, producer, block)
    mapping = dict(zip(store.indices, p_store.indices, strict=True))

    def fold(e: Expr) -> Expr:
        return p_store.value if isinstance(e, BufferLoad) and e.buffer == buffer else e

    value = map_expr(substitute(store.value, mapping), fold)  # type: ignore[arg-type]
    new_p = refresh_regions(
        replace(producer, body=BufferStore(store.buffer, p_store.indices, value))
    )
    new = without_block(func, block.name)
    new = replace_body(new, is_block(producer.name), lambda _: new_p)
    return drop_unused_alloc(new, buffer)


def _check_elementwise_read(
    func: PrimFunc, block: Block, producer: Block, buffer: Buffer, store: BufferStore
) -> None:
    bad = [n for n in walk(store.value) if isinstance(n, BufferLoad) and n.buffer == buffer]
    bad = [n for n in bad if n.indices != store.indices]
    if bad:
        raise schedule_error(
            "reverse_compute_inline",
            f"block @{block.name} reads {bad[0]} but writes at "
            f"[{', '.join(map(str, store.indices))}]: not an elementwise access",
            func,
            block=block.name,
        )
    c_doms = {iv.var: iv.dom for iv in block.iter_vars}
    p_doms = {iv.var: iv.dom for iv in producer.iter_vars}
    p_store = producer.body
    assert isinstance(p_store, BufferStore)
    for c, p in zip(store.indices, p_store.indices, strict=True):
        if c_doms[c] != p_doms[p]:  # type: ignore[index]
            raise schedule_error(
                "reverse_compute_inline",
                f"@{block.name} and @{producer.name} cover different index ranges",
                func,
                block=block.name,
            )


def _check_between(
    func: PrimFunc,
    order: list[Block],
    uses: list[tuple[set[Buffer], set[Buffer]]],
    producer: Block,
    block: Block,
) -> None:
    """The consumer's work moves up to the producer: nothing in between may use its output or
    write its other inputs (`uses`: each block of `order`'s loads and stores)."""
    names = [b.name for b in order]
    lo, hi = names.index(producer.name), names.index(block.name)
    if lo > hi:
        raise schedule_error(
            "reverse_compute_inline",
            f"block @{block.name} reads %{producer.body.buffer.name} before @{producer.name} "  # type: ignore[union-attr]
            "writes it",
            func,
            block=block.name,
        )
    outs, ins = stored(block), block_inputs(block)
    for b, (loads, stores) in list(zip(order, uses, strict=True))[lo + 1 : hi]:
        if (loads | stores) & outs or stores & ins:
            raise schedule_error(
                "reverse_compute_inline",
                f"block @{b.name}, between @{producer.name} and @{block.name}, uses what "
                f"@{block.name} writes or writes what it reads",
                func,
                block=b.name,
            )
