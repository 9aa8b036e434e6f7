"""Cache primitives: cache_read, cache_write, storage_align.

A cache is a new buffer `<name>_<scope>` allocated at the top of the function, of the cached
buffer's shape, filled (cache_read) or drained (cache_write) by an ordinary copy block that
compute_at / reverse_compute_at can move under a tile loop. `compact_buffers`
(hexir/schedule/compact.py) then sinks each allocation to the loop that holds all its uses and
shrinks it to the region one iteration touches: a full-size cache becomes a register tile or a
shared panel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from hexir.ir.names import unique_name
from hexir.ir.tir import (
    SCOPES,
    Allocate,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Expr,
    For,
    IntImm,
    IterVar,
    PrimFunc,
    Range,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import map_stmt, walk
from hexir.schedule.common import (
    all_blocks,
    find_path,
    is_block,
    replace_at,
    schedule_error,
    sub_stmts,
    taken_names,
)
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.trace import BlockRV

ALIGN_KEY = "storage_align"


class CachePrimitives(ScheduleBase):
    @primitive
    def cache_read(
        self,
        block: BlockRV,
        read_buffer_index: int,
        storage_scope: str,
        axes: tuple[int, ...] | None = None,
    ) -> BlockRV:
        """Read `block`'s `read_buffer_index`-th read buffer through a new `<name>_<scope>` copy.

        `sch.cache_read(matmul, 0, "shared")` returns the copy block @A_shared:

            alloc %A_shared: buffer<64x32xf32, shared>
            for %ax0 in 0..64 serial {
              for %ax1 in 0..32 serial {
                block @A_shared(v0 = spatial(64) %ax0, v1 = spatial(32) %ax1)
                    reads(%A[v0, v1]) writes(%A_shared[v0, v1]) {
                  %A_shared[v0, v1] = %A[v0, v1]
            for %i in 0..64 serial {
              ...
                block @matmul(...) reads(%A_shared[vi, vk], %B[vk, vj]) ...
                  %C[vi, vj] = %C[vi, vj] + %A_shared[vi, vk] * %B[vk, vj]

        The copy goes right before the consumer's outermost loop; `compute_at` moves it.

        `axes` lays the copy out in another order: its axis d holds the buffer's axis
        `axes[d]`. `sch.cache_read(dense, 1, "global", axes=(1, 0))` packs the weight of
        `%Y[vi, vj] += %X[vi, vk] * %W[vj, vk]` transposed, as `%W_global[vk, vj]`, so a loop
        over vj vectorized reads it contiguously.
        """
        node = self._block(block, "cache_read")
        func, name = add_cache_read(self.func, node, read_buffer_index, storage_scope, axes)
        attrs = (("read_buffer_index", read_buffer_index), ("storage_scope", storage_scope))
        if axes is not None:
            attrs += (("axes", tuple(axes)),)
        (rv,) = self._commit("cache_read", (("block", block),), attrs, func, [(BlockRV, name)])
        return rv  # type: ignore[return-value]

    @primitive
    def cache_write(
        self,
        block: BlockRV,
        write_buffer_index: int,
        storage_scope: str,
        axes: tuple[int, ...] | None = None,
    ) -> BlockRV:
        """Make `block` write a new `<name>_<scope>` buffer, copied back by a new block.

        `sch.cache_write(matmul, 0, "local")` returns the write-back block @C_local:

            alloc %C_local: buffer<64x48xf32, local>
            for %i in 0..64 serial {
              ...
                block @matmul(...) reads(%A[vi, vk], %B[vk, vj]) writes(%C_local[vi, vj]) {
                  init { %C_local[vi, vj] = 0.0 }
                  %C_local[vi, vj] = %C_local[vi, vj] + %A[vi, vk] * %B[vk, vj]
            for %ax0 in 0..64 serial {
              for %ax1 in 0..48 serial {
                block @C_local(v0 = spatial(64) %ax0, v1 = spatial(48) %ax1)
                    reads(%C_local[v0, v1]) writes(%C[v0, v1]) {
                  %C[v0, v1] = %C_local[v0, v1]

        The write-back goes right after the block's outermost loop; `reverse_compute_at`
        moves it under a tile loop (then `compact_buffers` makes the cache a tile).

        `axes` lays the cache out in another order, as in `cache_read`: an accumulator
        vectorized along conv2d's output channels keeps them last with `axes=(0, 2, 3, 1)`.
        The write-back then walks the cache in its own order.
        """
        node = self._block(block, "cache_write")
        func, name = add_cache_write(self.func, node, write_buffer_index, storage_scope, axes)
        attrs = (("write_buffer_index", write_buffer_index), ("storage_scope", storage_scope))
        if axes is not None:
            attrs += (("axes", tuple(axes)),)
        (rv,) = self._commit("cache_write", (("block", block),), attrs, func, [(BlockRV, name)])
        return rv  # type: ignore[return-value]

    @primitive
    def storage_align(
        self, block: BlockRV, buffer_index: int, axis: int, factor: int, offset: int
    ) -> None:
        """Pad the rows of the buffer `block` writes so the stride of `axis` is
        `offset` modulo `factor` (shared-memory bank conflicts).

        `sch.storage_align(A_shared, 0, axis=0, factor=32, offset=1)`:

            alloc %A_shared: buffer<64x32xf32, shared>
            block @A_shared(...) reads(...) writes(%A_shared[v0, v1]) {
        ->
            alloc %A_shared: buffer<64x33xf32, shared>
            block @A_shared(...) reads(...) writes(%A_shared[v0, v1])
                attributes {storage_align = (0, 0, 32, 1)} {

        The shape of axis + 1 grows (the padding is never touched), so every backend honours it;
        the annotation lets `compact_buffers` pad again after it shrinks the buffer.
        """
        node = self._block(block, "storage_align")
        args = (buffer_index, axis, factor, offset)
        func = align_storage(self.func, node, *args)
        attrs = tuple(zip(("buffer_index", "axis", "factor", "offset"), args, strict=True))
        self._commit("storage_align", (("block", block),), attrs, func)


# ---------------------------------------------------------------------------------------------
# cache_read


def add_cache_read(
    func: PrimFunc, block: Block, index: int, scope: str, axes: tuple[int, ...] | None = None
) -> tuple[PrimFunc, str]:
    """`func` with `block`'s `index`-th read buffer read through a new cache (laid out in the
    order `axes` when given); the copy's name."""
    buf = _buffer_arg("cache_read", func, block, block.reads, index, scope)
    axes = _permutation("cache_read", func, block, buf, axes)
    path = find_path(func.body, lambda s: s is block) or []
    anchor = _anchor(path)
    if writes_buffer(block, buf):
        raise _fail("cache_read", func, block, f"it also writes %{buf.name}, the buffer it reads")
    if writes_buffer(anchor, buf):
        raise _fail(
            "cache_read",
            func,
            block,
            f"%{buf.name} is written inside the consumer's outermost loop: a copy placed before "
            "that loop would read it before it is written",
        )
    taken = taken_names(func)
    shape = tuple(buf.shape[a] for a in axes)
    cache = replace(buf, name=unique_name(f"{buf.name}_{scope}", taken), scope=scope, shape=shape)
    name = _block_name(func, cache.name)
    copy = copy_nest(name, buf, cache, taken, axes)
    consumer = replace_buffer(block, buf, cache, writes=False, permute=axes)
    new_anchor = replace_at(anchor, lambda s: s is block, lambda _: consumer)
    body = replace_at(func.body, lambda s: s is anchor, lambda _: seq(copy, new_anchor))
    return replace(func, body=allocate_at_top(body, cache)), name


# ---------------------------------------------------------------------------------------------
# cache_write


def add_cache_write(
    func: PrimFunc, block: Block, index: int, scope: str, axes: tuple[int, ...] | None = None
) -> tuple[PrimFunc, str]:
    """`func` with `block` writing its `index`-th write buffer into a new cache (laid out in
    the order `axes` when given), copied back right after the block's outermost loop; the
    write-back block's name."""
    buf = _buffer_arg("cache_write", func, block, block.writes, index, scope)
    axes = _permutation("cache_write", func, block, buf, axes)
    path = find_path(func.body, lambda s: s is block) or []
    _check_sole_writer(func, block, buf, path)
    _check_writes_whole(func, block, buf)
    anchor = _anchor(path)
    for other in all_blocks(anchor):
        if other is not block and reads_buffer(other, buf):
            raise _fail(
                "cache_write",
                func,
                block,
                f"block @{other.name} reads %{buf.name} inside the writer's outermost loop, "
                "before the write-back would run",
            )
    taken = taken_names(func)
    shape = tuple(buf.shape[a] for a in axes)
    cache = replace(buf, name=unique_name(f"{buf.name}_{scope}", taken), scope=scope, shape=shape)
    name = _block_name(func, cache.name)
    writeback = copy_nest(name, cache, buf, taken, axes, walk_src=True)
    writer = replace_buffer(block, buf, cache, permute=axes)
    new_anchor = replace_at(anchor, lambda s: s is block, lambda _: writer)
    body = replace_at(func.body, lambda s: s is anchor, lambda _: seq(new_anchor, writeback))
    return replace(func, body=allocate_at_top(body, cache)), name


def _permutation(
    primitive: str, func: PrimFunc, block: Block, buf: Buffer, axes: tuple[int, ...] | None
) -> tuple[int, ...]:
    rank = len(buf.shape)
    if axes is None:
        return tuple(range(rank))
    if sorted(axes) != list(range(rank)) or not all(type(a) is int for a in axes):
        reason = f"axes {axes!r} is not a permutation of the {rank} axes of %{buf.name}"
        raise _fail(primitive, func, block, reason)
    return tuple(axes)


def _check_sole_writer(func: PrimFunc, block: Block, buf: Buffer, path: list[Stmt]) -> None:
    enclosing = {id(s) for s in path}
    others = [
        b.name
        for b in all_blocks(func.body)
        if b is not block and id(b) not in enclosing and writes_buffer(b, buf)
    ]
    raw = any(isinstance(s, BufferStore) and s.buffer == buf for s in _unblocked(func.body))
    if others or raw:
        who = ", ".join(f"@{n}" for n in others) or "a store outside any block"
        raise _fail(
            "cache_write", func, block, f"%{buf.name} is also written by {who}: one writer only"
        )


def _check_writes_whole(func: PrimFunc, block: Block, buf: Buffer) -> None:
    """The write-back copies the whole cache, so the block must write every element of `buf`
    (each axis indexed by its own spatial iter var of the axis's extent) and read none of
    `buf` that it has not first set in its init."""
    doms = {iv.var: iv for iv in block.iter_vars}
    points = [w.region for w in block.writes if w.buffer == buf]
    points += [n.indices for n in walk(block) if isinstance(n, BufferStore) and n.buffer == buf]
    loads = [n.indices for n in walk(block) if isinstance(n, BufferLoad) and n.buffer == buf]
    idx = points[0]
    whole = len(set(idx)) == len(idx) and all(
        isinstance(e, Var) and e in doms and doms[e].kind == "spatial" and doms[e].dom == n
        for e, n in zip(idx, buf.shape, strict=True)
    )
    if not whole or any(p != idx for p in points + loads):
        reason = (
            f"it does not write each element of %{buf.name} once, at its own spatial iter "
            "vars: the write-back would copy elements it never wrote"
        )
        raise _fail("cache_write", func, block, reason)
    if loads and block.init is None:
        reason = f"it reads %{buf.name} with no init: the cache would lack the values it updates"
        raise _fail("cache_write", func, block, reason)


def _unblocked(stmt: Stmt) -> list[Stmt]:
    """The statements under `stmt` that are outside any block."""
    if isinstance(stmt, Block):
        return []
    return [stmt, *(s for child in sub_stmts(stmt) for s in _unblocked(child))]


# ---------------------------------------------------------------------------------------------
# storage_align


def align_storage(
    func: PrimFunc, block: Block, buffer_index: int, axis: int, factor: int, offset: int
) -> PrimFunc:
    """`func` with the buffer `block` writes padded on `axis + 1` (stride of `axis` equal to
    `offset` modulo `factor`), and the request recorded as `block`'s annotation."""
    buf = _buffer_arg("storage_align", func, block, block.writes, buffer_index, None)

    def fail(reason: str) -> Exception:
        return _fail("storage_align", func, block, reason)

    if any(p.name == buf.name for p in func.params):
        raise fail(f"%{buf.name} is a parameter: only an allocated buffer can be padded")
    if not _allocated(func.body, buf):
        raise fail(f"%{buf.name} is not allocated in this function")
    for name, v in (("axis", axis), ("factor", factor), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise fail(f"{name} must be an int, got {v!r}")
    if not 0 <= axis < len(buf.shape) - 1:
        raise fail(f"axis {axis} has no outer stride to pad in rank-{len(buf.shape)} %{buf.name}")
    if factor < 1 or not 0 <= offset < factor:
        raise fail(f"need factor >= 1 and 0 <= offset < factor, got {factor}, {offset}")
    padded = padded_shape(buf.shape, axis, factor, offset)
    if padded is None:
        raise fail(f"no padding of axis {axis + 1} of {buf.shape} gives that stride")
    quad = (buffer_index, axis, factor, offset)
    # A second request for the same buffer and axis replaces the first.
    kept = [q for q in quads(dict(block.annotations).get(ALIGN_KEY)) if q[:2] != quad[:2]]
    ann = dict(block.annotations) | {ALIGN_KEY: tuple(x for q in [*kept, quad] for x in q)}
    annotated = replace(block, annotations=tuple(sorted(ann.items())))
    body = replace_at(func.body, is_block(block.name), lambda _: annotated)
    new = replace(buf, shape=padded)
    return replace(func, body=replace_buffer(body, buf, new))


def padded_shape(
    shape: tuple[int, ...], axis: int, factor: int, offset: int
) -> tuple[int, ...] | None:
    """`shape` with axis + 1 grown the least so the row-major stride of `axis` is `offset`
    modulo `factor`; None when no extent gives it."""
    inner = math.prod(shape[axis + 2 :])
    n = shape[axis + 1]
    for extent in range(n, n + factor):  # the stride modulo factor cycles within factor steps
        if (extent * inner) % factor == offset:
            return shape[: axis + 1] + (extent,) + shape[axis + 2 :]
    return None


def quads(value: object) -> list[tuple[int, ...]]:
    flat = tuple(value) if isinstance(value, tuple) else ()
    return [flat[n : n + 4] for n in range(0, len(flat) - 3, 4)]


def _allocated(stmt: Stmt, buf: Buffer) -> bool:
    return any(isinstance(n, Allocate) and n.buffer == buf for n in walk(stmt))


# ---------------------------------------------------------------------------------------------
# Shared pieces


def copy_nest(
    name: str,
    src: Buffer,
    dst: Buffer,
    taken: set[str],
    axes: tuple[int, ...] | None = None,
    *,
    walk_src: bool = False,
) -> Stmt:
    """Loops `ax0..` around a block `name` that copies `src` into `dst`. With `axes`, the
    cache side is laid out in another order: `dst`'s axis d is `src`'s axis `axes[d]`, or
    (`walk_src`, a write-back out of a cache) `src`'s axis d is `dst`'s axis `axes[d]`. The
    loops walk the cache's order: `dst`'s shape, or `src`'s with `walk_src`."""
    rank = len(src.shape)
    order = tuple(range(rank)) if axes is None else axes
    walked = src if walk_src else dst
    loops = [Var(unique_name(f"ax{d}", taken)) for d in range(rank)]
    ivs = [Var(unique_name(f"v{d}", taken)) for d in range(rank)]
    # The other side's index along its axis a: the walked axis that holds it.
    other = tuple(ivs[order.index(a)] for a in range(rank))
    src_ivs, dst_ivs = (tuple(ivs), other) if walk_src else (other, tuple(ivs))
    block: Stmt = Block(
        name,
        tuple(
            IterVar(v, "spatial", n, lv) for v, n, lv in zip(ivs, walked.shape, loops, strict=True)
        ),
        reads=(BufferRegion(src, src_ivs),),
        writes=(BufferRegion(dst, dst_ivs),),
        body=BufferStore(dst, dst_ivs, BufferLoad(src, src_ivs)),
    )
    for var, extent in reversed(list(zip(loops, walked.shape, strict=True))):
        block = For(var, extent, "serial", block)
    return block


def replace_buffer(
    stmt: Stmt,
    old: Buffer,
    new: Buffer,
    *,
    reads: bool = True,
    writes: bool = True,
    index: Callable[[int, Expr], Expr] | None = None,
    permute: tuple[int, ...] | None = None,
) -> Stmt:
    """`stmt` with `old` replaced by `new` in loads and read regions (`reads`) and in stores,
    write regions and allocations (`writes`); `index(axis, e)` maps each index when given;
    `new`'s axis d is `old`'s axis `permute[d]` when that is given."""

    def order(items: tuple) -> tuple:  # type: ignore[type-arg]
        return items if permute is None else tuple(items[a] for a in permute)

    def at(indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        indices = order(indices)
        return indices if index is None else tuple(index(d, e) for d, e in enumerate(indices))

    def region(r: BufferRegion) -> BufferRegion:
        if r.buffer != old:
            return r
        if index is None:
            return BufferRegion(new, order(r.region))
        # A range's image under a modulus is no range: it becomes the whole new axis.
        axes = tuple(
            Range(IntImm(0), IntImm(new.shape[d])) if isinstance(e, Range) else index(d, e)
            for d, e in enumerate(order(r.region))
        )
        return BufferRegion(new, axes)

    def ex(e: Expr) -> Expr:
        if reads and isinstance(e, BufferLoad) and e.buffer == old:
            return BufferLoad(new, at(e.indices))
        return e

    def st(s: Stmt) -> Stmt:
        match s:
            case BufferStore(buffer, indices, value) if writes and buffer == old:
                return BufferStore(new, at(indices), value)
            case Allocate(buffer) if writes and buffer == old:
                return Allocate(new)
            case Block():
                rd = tuple(map(region, s.reads)) if reads else s.reads
                wr = tuple(map(region, s.writes)) if writes else s.writes
                return replace(s, reads=rd, writes=wr)
        return s

    return map_stmt(stmt, expr_fn=ex, stmt_fn=st)


def allocate_at_top(body: Stmt, buf: Buffer) -> Stmt:
    """`body` with `buf` allocated after the Allocates it starts with."""
    stmts = list(body.stmts) if isinstance(body, Seq) else [body]
    n = next((i for i, s in enumerate(stmts) if not isinstance(s, Allocate)), len(stmts))
    return seq(*stmts[:n], Allocate(buf), *stmts[n:])


def _anchor(path: list[Stmt]) -> Stmt:
    """The outermost statement holding the block at the end of `path` within its scope (the
    innermost enclosing block, or the function body)."""
    start = max((n + 1 for n, s in enumerate(path[:-1]) if isinstance(s, Block)), default=0)
    return next(s for s in path[start:] if not isinstance(s, Seq))


def _buffer_arg(
    primitive: str,
    func: PrimFunc,
    block: Block,
    regions: tuple[BufferRegion, ...],
    index: object,
    scope: str | None,
) -> Buffer:
    what = "read" if regions is block.reads else "write"
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(regions):
        raise _fail(
            primitive, func, block, f"{what} buffer index {index!r} out of range: block "
            f"@{block.name} has {len(regions)} {what} regions"
        )  # fmt: skip
    if scope is not None and scope not in SCOPES:
        raise _fail(primitive, func, block, f"unknown storage scope {scope!r}; one of {SCOPES}")
    return regions[index].buffer


def _block_name(func: PrimFunc, base: str) -> str:
    return unique_name(base, {b.name for b in all_blocks(func.body)})


def writes_buffer(stmt: Stmt, buf: Buffer) -> bool:
    for n in walk(stmt):
        match n:
            case BufferStore(buffer) if buffer == buf:
                return True
            case Block(writes=writes) if any(w.buffer == buf for w in writes):
                return True
    return False


def reads_buffer(block: Block, buf: Buffer) -> bool:
    loads = (n for n in walk(block) if isinstance(n, BufferLoad))
    return any(r.buffer == buf for r in block.reads) or any(n.buffer == buf for n in loads)


def _fail(primitive: str, func: PrimFunc, block: Block, reason: str) -> Exception:
    return schedule_error(primitive, f"block @{block.name}: {reason}", func, block=block.name)


__all__ = [
    "CachePrimitives",
    "add_cache_read",
    "add_cache_write",
    "align_storage",
    "copy_nest",
    "padded_shape",
    "quads",
    "reads_buffer",
    "replace_buffer",
    "writes_buffer",
]
