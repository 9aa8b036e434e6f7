"""The GPU sketch: every block under one `blockIdx` loop nest, thread-bound stages inside it.

An attention or paged_attention kernel (hexir/ops/attention.py) is the flash nest, its
query, key and lane tiles drawn (hexir/schedule/handwritten_attention.py).

A reduction with reuse (matmul, conv2d, dense) is tiled five ways in space and three in the
reduction ("SSSRRSRS"), with the outer reduction tiles hoisted above the thread loops so that
each shared-memory fetch is a stage of its own (DESIGN.md §3: a thread-bound loop nest is one
stage between barriers):

    for S0 (fused)  blockIdx.x
      init of the local accumulator: vthread / threadIdx.x / S3 / S4 copies
      for R0 (reduction: outer)
        fetch of each reused operand into `shared`: copy loops fused, split by the thread
        tiles, the thread part bound to threadIdx.x (cooperative fetch)
        for S1 (fused)  vthread
          for S2 (fused)  threadIdx.x
            for R1, S3, R2, S4: each thread's tile, accumulated in `local`
      write-back of the accumulator with its epilogue (bias, activation), split by the same
      tiles and bound the same way, so each thread writes back what it accumulated

Every other block is bound consumer first: an output block's row loops (those that index what
a reduction produced) or all its loops go to blockIdx.x, the rest to threadIdx.x; a producer
moves under its consumer's blockIdx loop (`compute_at`), and its reduction loop is split and
bound to threadIdx.x: a cross-thread reduction. One kernel therefore handles softmax,
layer_norm or a row reduction, one block of threads per row.
"""

from __future__ import annotations

import itertools
import math
import random

from hexir.errors import ScheduleError
from hexir.ir.arith import affine_coefficients
from hexir.ir.dtype import itemsize
from hexir.ir.tir import Block, Range, Var
from hexir.ir.visit import free_vars, substitute
from hexir.runtime.target import STATIC_SHARED_BYTES, Target
from hexir.schedule import BlockRV, ExprRV, LoopRV, Schedule
from hexir.schedule.common import index_vars, region_vars
from hexir.schedule.handwritten_attention import flash, is_attention
from hexir.schedule.handwritten_mma import Tiles, mma_operands, tile_tensor_cores
from hexir.schedule.sampling import divisors
from hexir.search.analysis import (
    consumers,
    has_kind,
    has_reuse,
    is_tileable,
    leaf_blocks,
    loop_roles,
    loops_around,
    output_buffers,
    producers,
    reused_reads,
)
from hexir.search.rules import (
    annotate_unroll,
    attempt,
    auto_inline,
    fuse_or_one,
    inline_epilogue,
    loop_of,
)

S_LEVELS = 5
R_LEVELS = 3
MAX_VTHREAD = 8
MAX_THREAD_ELEMENTS = 64  # accumulator elements per thread: they live in registers
MAX_INNER_REDUCE = 32
# A block's tile of one spatial axis: with MAX_INNER_REDUCE, a matmul's two shared operand
# tiles then take at most (128 + 128) x 32 floats, 32 KB of the 48 KB a block may hold.
MAX_BLOCK_TILE = 128
THREAD_COUNTS = (32, 64, 128, 256, 512, 1024)
CROSS_THREAD_PROBABILITY = 0.75  # else one thread per output, reducing serially
TILE_TRIES = 64
FETCH_WIDTHS = (1, 2, 4)  # adjacent elements a thread copies at a time into `shared`
MAX_THREADS_Z = 64


def gpu_sketch(sch: Schedule, target: Target) -> None:
    """Schedule every block of `sch.func` for the GPU, drawing from `sch.rng`."""
    if is_attention(sch.func):  # the flash nest, its three tiles drawn
        flash(sch)
        return
    # A convolution's padding stays a stage until the tiling has made its shared fetch, then
    # goes into that fetch: the fetch copies a tile of the padded image, which the conv reads
    # at h + r. Inlined into the conv first, the image's clamped indices would make the
    # fetched tile the whole image (hundreds of KB of shared memory).
    auto_inline(sch, keep_padding=True)
    tiled = [
        b.name
        for b in leaf_blocks(sch.func)
        if has_reuse(b) and is_tileable(sch.func, b) and not _feeds_a_wider_stage(sch, b)
    ]
    done, fetches = set(tiled), set()
    for name in tiled:
        before = {b.name for b in leaf_blocks(sch.func)}
        block = sch.get_block(name)
        if _has_tensor_cores(target) and mma_operands(sch.get(block)) is not None:  # type: ignore[arg-type]
            tile_mma(sch, block)
        else:
            tile_gpu(sch, block, target)
        made = {b.name for b in leaf_blocks(sch.func)} - before
        done |= made
        fetches |= made  # its shared tiles are copies, which inlining would undo
    auto_inline(sch, keep=fetches)
    threads: dict[str, ExprRV] = {}  # per blockIdx loop: the threads every stage under it uses
    for block in reversed(leaf_blocks(sch.func)):
        if block.name not in done:
            bind_block(sch, block, target, threads)


def _feeds_a_wider_stage(sch: Schedule, block: Block) -> bool:
    """Whether a stage of more spatial iterations reads what `block` computes (scatter_nd's
    last update per row, which every element of the row reads): that stage cannot be the
    block's epilogue, so a tiled block would launch a grid of its own beside the stage's.
    Such a block is computed under the stage's blockIdx loop instead (`bind_block`), as the
    default schedule does."""

    def points(b: Block) -> int:
        return math.prod(iv.dom for iv in b.iter_vars if iv.kind == "spatial")

    return any(points(c) > points(block) for c in consumers(sch.func, block))


# ---------------------------------------------------------------------------------------------
# Multi-level tiling


def tile_gpu(sch: Schedule, block: BlockRV, target: Target) -> None:
    """Tile one reduction with reuse (see the module docstring)."""
    roles = [r.role for r in loop_roles(sch.func, sch.get(block))]  # type: ignore[arg-type]
    try:
        writeback: BlockRV | None = sch.cache_write(block, 0, "local")
    except ScheduleError:
        writeback = None
    loops = sch.get_loops(block)
    extents = [loop_of(sch, lp).extent for lp in loops]
    # Loops of extent 1 are not split: they join the outermost level.
    unit = [lp for lp, e in zip(loops, extents, strict=True) if e == 1]
    spatial = [n for n, role in enumerate(roles) if role != "reduce" and extents[n] > 1]
    reduce_ = [n for n, role in enumerate(roles) if role == "reduce" and extents[n] > 1]
    s_dec, r_dec = _draw_tiles(sch, block, target, extents, spatial, reduce_)
    s_split = [_split(sch, loops[n], d) for n, d in zip(spatial, s_dec, strict=True)]
    r = [_split(sch, loops[n], d)[1] for n, d in zip(reduce_, r_dec, strict=True)]
    tiles = [rvs for rvs, _ in s_split]
    s = [lps for _, lps in s_split]
    if not r:
        raise ScheduleError("no reduction loop longer than 1 to tile", "tile_gpu")
    sch.reorder(*unit, *_at(s, 0), *_at(r, 0), *_at(s, 1), *_at(s, 2), *_at(r, 1), *_at(s, 3),
                *_at(r, 2), *_at(s, 4))  # fmt: skip
    bx = fuse_or_one(sch, [*unit, *_at(s, 0)])
    sch.bind(bx, "blockIdx.x")
    # Regions are exact over unfused tile loops: move the write-back and the fetches first.
    if writeback is not None:
        sch.reverse_compute_at(writeback, bx, True)
        inline_epilogue(sch, writeback)
    fetches = _fetch_shared(sch, block, _at(r, 0)[-1])
    sch.bind(fuse_or_one(sch, [t[1] for t in s]), "vthread")
    axes = thread_axes(s_dec)
    for d, axis in axes:
        sch.bind(s[d][2], axis)
    sch.decompose_reduction(block, _at(r, 0)[0])
    if writeback is not None:
        _bind_writeback(sch, writeback, [n in spatial for n in _spatial_axes(roles)], tiles, axes)
    for copy in fetches:
        _cooperative_fetch(sch, copy, _at(r, 0)[-1], [(tiles[d][2], axis) for d, axis in axes])
    annotate_unroll(sch, bx)


# ---------------------------------------------------------------------------------------------
# Tensor cores: a float16/bfloat16 contraction in warps of mma.sync (handwritten_mma.py), its
# tiles drawn among those that keep a block within MAX_MMA_WARPS warps, a thread within
# MAX_MMA_ACCUMULATORS float32 accumulators and the two padded shared tiles within 48 KB.

MMA_TILE_CHOICES = (1, 2, 4)  # warps per block side, 16-row tiles a warp, chunks a step
MMA_COLUMN_TILES = (1, 2, 4, 8)  # 8-column tiles a warp
MAX_MMA_WARPS = 8
MIN_MMA_WARPS = 2
MAX_MMA_ACCUMULATORS = 128
MMA_SHARED_BYTES = 48 * 1024


def _has_tensor_cores(target: Target) -> bool:
    return target.kind == "cuda" and int((target.arch or "sm_0").removeprefix("sm_")) >= 80


def tile_mma(sch: Schedule, block: BlockRV) -> None:
    """Tile a float16/bfloat16 contraction for tensor cores with sampled tiles."""
    c_local = sch.cache_write(block, 0, "local")
    inline_epilogue(sch, c_local)
    tile_tensor_cores(sch, block, c_local, lambda i, j, k: _mma_tiles(sch, i, j, k))


def _mma_tiles(sch: Schedule, rows: LoopRV, cols: LoopRV, depth: LoopRV) -> Tiles:
    r, c, d = (loop_of(sch, lp).extent for lp in (rows, cols, depth))
    shapes = [
        (wy, mi, wx, nj, s)
        for wy, mi, wx, s in itertools.product(MMA_TILE_CHOICES, repeat=4)
        for nj in MMA_COLUMN_TILES
        if r % (wy * mi) == 0 and c % (wx * nj) == 0 and d % s == 0
        and MIN_MMA_WARPS <= wy * wx <= MAX_MMA_WARPS and mi * nj * 4 <= MAX_MMA_ACCUMULATORS
        and _mma_shared_bytes(wy * mi * 16, wx * nj * 8, s * 16) <= MMA_SHARED_BYTES
    ]  # fmt: skip
    if not shapes:
        raise ScheduleError("no tensor-core tiling fits the contraction", "tile_mma")
    wy, mi, wx, nj, s = sch.rng.choice(shapes)
    row_rvs = sch.sample_perfect_tile(rows, 3, 4, decision=[r // (wy * mi), wy, mi])
    col_rvs = sch.sample_perfect_tile(cols, 3, 8, decision=[c // (wx * nj), wx, nj])
    step_rvs = sch.sample_perfect_tile(depth, 2, 4, decision=[d // s, s])
    return row_rvs[1:], col_rvs[1:], step_rvs[1]


def _mma_shared_bytes(rows: int, cols: int, depth: int) -> int:
    """A's [rows][depth] and B's [depth][cols] tiles of 16-bit elements, rows padded by 8."""
    return 2 * (rows * (depth + 8) + depth * (cols + 8))


def thread_axes(tiles: list[list[int]]) -> list[tuple[int, str]]:
    """(spatial axis, thread axis) for each axis with more than one thread, innermost on
    threadIdx.x: each thread index then appears alone (affinely) in every index, which the
    CUDA code generator needs to give each thread its own accumulator."""
    used = [d for d, t in enumerate(tiles) if t[2] > 1]
    return [(d, f"threadIdx.{'xyz'[n]}") for n, d in enumerate(reversed(used))][::-1]


def _draw_tiles(
    sch: Schedule,
    block: BlockRV,
    target: Target,
    extents: list[int],
    spatial: list[int],
    reduce_: list[int],
) -> tuple[list[list[int]], list[list[int]]]:
    """Tiles of the spatial and the reduction loops (by position among the block's loops)
    whose step fits the target's shared memory: the reused reads' tiles of one step (each
    read's footprint over the block's tile of every loop) within its static limit, drawn up
    to TILE_TRIES times, else the last draw (which the build then refuses). A batched or
    convolved operand's tile grows with more loops than a matmul's two, so the per-axis
    budgets alone overflowed it (14 of 32 batch_matmul draws; the conv's image tile with
    its halo)."""
    node = sch.get(block)
    assert isinstance(node, Block)
    loop_vars = [loop_of(sch, lp).var for lp in sch.get_loops(block)]
    limit = target.max_shared_memory_per_block or STATIC_SHARED_BYTES
    for _ in range(TILE_TRIES):
        s_dec = _spatial_tiles(sch.rng, [extents[n] for n in spatial], target)
        r_dec = _reduce_tiles(sch.rng, [extents[n] for n in reduce_])
        tile = {loop_vars[n]: math.prod(d[1:]) for n, d in zip(spatial, s_dec, strict=True)}
        tile |= {loop_vars[n]: math.prod(d[1:]) for n, d in zip(reduce_, r_dec, strict=True)}
        if _step_bytes(node, tile) <= limit:
            break
    return s_dec, r_dec


def _step_bytes(node: Block, tile: dict[Var, int]) -> int:
    """Bytes of the reused reads' tiles for one step: each index's extent over the loops'
    tiles (affine: the sum of |coefficient| x (tile - 1), plus 1; an index it cannot read
    counts 1)."""
    bindings = {iv.var: iv.binding for iv in node.iter_vars}
    total = 0
    for n in reused_reads(node):
        read = node.reads[n]
        size = itemsize(read.buffer.dtype)
        for index in read.region:
            start = index.start if isinstance(index, Range) else index
            coeffs = affine_coefficients(substitute(start, bindings), tile)
            if coeffs is not None:
                size *= 1 + sum(abs(c) * (tile[v] - 1) for v, c in coeffs.items() if v is not None)
        total += size
    return total


def _spatial_tiles(rng: random.Random, extents: list[int], target: Target) -> list[list[int]]:
    """Five-level tiles of the spatial loops within the target's thread, vthread and register
    limits: drawn until one fits (decisions given to sample_perfect_tile, so they replay)."""
    limit = target.max_threads_per_block or 1024
    want = min(target.warp_size or 32, math.prod(extents))
    best: list[list[int]] | None = None
    for _ in range(TILE_TRIES):
        tiles = _draw_within(rng, extents, limit)  # within the thread and register budgets
        bound = [tiles[d][2] for d, _ in thread_axes(tiles)]
        if len(bound) <= 3 and (len(bound) < 3 or bound[0] <= MAX_THREADS_Z):
            best = tiles
            if math.prod(t[2] for t in tiles) >= want:
                return tiles
    if best is None:
        raise ScheduleError("no spatial tiling within the thread limits", "tile_gpu")
    return best


def _draw_within(rng: random.Random, extents: list[int], limit: int) -> list[list[int]]:
    """Five-level tiles [block, vthread, thread, inner, innermost] of each extent, each level's
    factor drawn among the divisors that keep the block's budgets: `limit` threads, MAX_VTHREAD
    vthreads, MAX_THREAD_ELEMENTS accumulator elements per thread, and MAX_BLOCK_TILE of each
    axis per block. The axes draw in a random order, so that none always takes the threads
    first. (Drawing every factor uniformly and keeping the tilings that fit gave 0 to 3 valid
    kernels in 50 draws at model sizes: matmul 4096^3, BERT's dense, a ResNet conv.)"""
    threads, vthreads, elements = limit, MAX_VTHREAD, MAX_THREAD_ELEMENTS
    tiles: list[list[int]] = [[] for _ in extents]
    for d in rng.sample(range(len(extents)), len(extents)):
        rest, block = extents[d], MAX_BLOCK_TILE

        def take(cap: int) -> int:
            nonlocal rest, block
            f = rng.choice([f for f in divisors(rest) if f <= min(cap, block)])
            rest, block = rest // f, block // f
            return f

        t2 = take(threads)
        t1 = take(min(vthreads, elements))
        t4 = take(elements // t1)
        t3 = take(elements // (t1 * t4))
        threads, vthreads, elements = threads // t2, vthreads // t1, elements // (t1 * t3 * t4)
        tiles[d] = [rest, t1, t2, t3, t4]
    return tiles


def _reduce_tiles(rng: random.Random, extents: list[int]) -> list[list[int]]:
    """Three-level tiles of the reduction loops whose inner levels together (the depth of one
    shared step: a conv's channels x window) stay within MAX_INNER_REDUCE."""
    for _ in range(TILE_TRIES):
        tiles = [_draw(rng, extent, R_LEVELS) for extent in extents]
        if math.prod(t[1] * t[2] for t in tiles) <= MAX_INNER_REDUCE:
            return tiles
    return [[extent, 1, 1] for extent in extents]


def _draw(rng: random.Random, extent: int, n: int) -> list[int]:
    """A random perfect tile of `extent` in `n` factors, innermost drawn first."""
    inner = []
    rest = extent
    for _ in range(n - 1):
        f = rng.choice(divisors(rest))
        inner.append(f)
        rest //= f
    return [rest, *reversed(inner)]


def _split(sch: Schedule, loop: LoopRV, decision: list[int]) -> tuple[list[ExprRV], list[LoopRV]]:
    rvs = sch.sample_perfect_tile(loop, n=len(decision), max_innermost_factor=0,
                                  decision=decision)  # fmt: skip
    return rvs, sch.split(loop, rvs)


def _at(tiles: list[list[LoopRV]], n: int) -> list[LoopRV]:
    return [t[n] for t in tiles]


def _spatial_axes(roles: list[str | None]) -> list[int]:
    return [n for n, role in enumerate(roles) if role != "reduce"]


def _bind_writeback(
    sch: Schedule,
    writeback: BlockRV,
    tiled: list[bool],
    tiles: list[list[ExprRV]],
    axes: list[tuple[int, str]],
) -> None:
    """The write-back's loops (one per spatial axis: `tiled` says which were split) split and
    bound like the compute's, so that each thread copies out the accumulator it owns."""
    loops = [lp for lp, t in zip(sch.get_loops(writeback)[-len(tiled) :], tiled, strict=True) if t]
    parts = [sch.split(lp, list(t[1:])) for lp, t in zip(loops, tiles, strict=True)]
    sch.reorder(*_at(parts, 0), *_at(parts, 1), *_at(parts, 2), *_at(parts, 3))
    sch.bind(fuse_or_one(sch, _at(parts, 0)), "vthread")
    for d, axis in axes:
        sch.bind(parts[d][1], axis)


def _fetch_shared(sch: Schedule, block: BlockRV, r0: LoopRV) -> list[BlockRV]:
    """Each operand with reuse read through `shared`, fetched at every outer reduction step."""
    node = sch.get(block)
    assert isinstance(node, Block)
    copies = []
    for index in reused_reads(node):
        try:
            copy = sch.cache_read(block, index, "shared")
        except ScheduleError:
            continue
        sch.compute_at(copy, r0)
        copies.append(copy)
    return copies


def _cooperative_fetch(
    sch: Schedule, copy: BlockRV, r0: LoopRV, threads: list[tuple[ExprRV, str]]
) -> None:
    """The copy's loops fused and split by the block's thread extents, each part bound to its
    thread axis: all the block's threads fetch together, each `width` adjacent elements at a
    time, a drawn width (`sample_categorical` among FETCH_WIDTHS, where the copy's rows and
    the threads divide) vectorized: float2/float4 loads and stores where the CUDA printer
    finds them contiguous and aligned, else an unrolled loop."""
    loops = _loops_below(sch, copy, r0)
    if not loops:  # one element per step: nothing to share out
        return
    row = _row(sch, copy, loops[-1])
    fused = fuse_or_one(sch, loops)
    extent = loop_of(sch, fused).extent
    lanes = math.prod(sch.get(t) for t, _ in threads)  # type: ignore[misc]
    widths = [w for w in FETCH_WIDTHS if row % w == 0 and extent % (lanes * w) == 0]
    if len(widths) > 1:
        width = sch.sample_categorical(widths, [1.0] * len(widths))
        parts = sch.split(fused, [None, *(t for t, _ in threads), width])
        sch.vectorize(parts[-1])
        parts = parts[:-1]
    else:
        parts = sch.split(fused, [None, *(t for t, _ in threads)])
    for loop, (_, axis) in zip(parts[1:], threads, strict=True):
        sch.bind(loop, axis)


def _row(sch: Schedule, copy: BlockRV, inner: LoopRV) -> int:
    """The extent of the copy's innermost loop where it walks the last axis of the tile it
    writes (adjacent elements), else 1."""
    node = sch.get(copy)
    assert isinstance(node, Block)
    last = index_vars(node.writes[0].region[-1])
    loop = loop_of(sch, inner)
    walks = any(loop.var in free_vars(iv.binding) for iv in node.iter_vars if iv.var in last)
    return loop.extent if walks else 1


def _loops_below(sch: Schedule, block: BlockRV, loop: LoopRV) -> list[LoopRV]:
    loops = sch.get_loops(block)
    at = [loop_of(sch, lp).var for lp in loops].index(loop_of(sch, loop).var)
    return loops[at + 1 :]


# ---------------------------------------------------------------------------------------------
# Binding the other blocks


def bind_block(sch: Schedule, block: Block, target: Target, threads: dict[str, ExprRV]) -> None:
    """Put `block` under a blockIdx loop: its consumer's if it has one (then bind its own
    loops there to threadIdx.x), or one of its own."""
    rv = sch.get_block(block.name)
    bx = _consumer_block_loop(sch, block)
    count = None if bx is None else threads.get(loop_of(sch, bx).var.name)
    if bx is not None and count is not None and attempt(sch.compute_at, rv, bx):
        _bind_inside(sch, rv, bx, count)
        return
    _bind_root(sch, rv, target, threads)


def _consumer_block_loop(sch: Schedule, block: Block) -> LoopRV | None:
    for c in consumers(sch.func, block):
        for loop, rv in zip(
            loops_around(sch.func, c), sch.get_loops(sch.get_block(c.name)), strict=True
        ):
            if loop.kind == "blockIdx.x":
                return rv
    return None


def _bind_inside(sch: Schedule, rv: BlockRV, bx: LoopRV, threads: ExprRV) -> None:
    node = sch.get(rv)
    assert isinstance(node, Block)
    roles = loop_roles(sch.func, node)
    below = _loops_below(sch, rv, bx)
    inner = list(zip(below, roles[len(roles) - len(below) :], strict=True))
    reduce_ = [lp for lp, r in inner if r.role == "reduce"]
    if reduce_:
        _cross_thread(sch, reduce_, threads)
    elif inner:
        _, tx = sch.split(fuse_or_one(sch, [lp for lp, _ in inner]), [None, threads])
        sch.bind(tx, "threadIdx.x")


def _cross_thread(sch: Schedule, reduce_: list[LoopRV], threads: ExprRV) -> None:
    """The reduction loops fused and split, the inner part bound to threadIdx.x."""
    _, tx = sch.split(fuse_or_one(sch, reduce_), [None, threads])
    sch.bind(tx, "threadIdx.x")


def _bind_root(sch: Schedule, rv: BlockRV, target: Target, threads: dict[str, ExprRV]) -> None:
    node = sch.get(rv)
    assert isinstance(node, Block)
    roles = loop_roles(sch.func, node)
    loops = sch.get_loops(rv)
    spatial = [lp for lp, r in zip(loops, roles, strict=True) if r.role != "reduce"]
    reduce_ = [lp for lp, r in zip(loops, roles, strict=True) if r.role == "reduce"]
    if not spatial:  # one value: one block of threads
        if reduce_:
            extent = math.prod(loop_of(sch, lp).extent for lp in reduce_)
            _cross_thread(sch, reduce_, _thread_count(sch, target, extent))
        return
    if reduce_ and sch.rng.random() < CROSS_THREAD_PROBABILITY:
        count = _thread_count(sch, target, math.prod(loop_of(sch, lp).extent for lp in reduce_))
        bx = fuse_or_one(sch, spatial)
        sch.bind(bx, "blockIdx.x")
        _cross_thread(sch, reduce_, count)
    else:
        rows = _row_loops(sch, node, loops, roles) if not reduce_ else []
        rest = spatial[len(rows) :]
        if not rows or not rest:
            rows, rest = [], spatial
        extent = math.prod(loop_of(sch, lp).extent for lp in rest)
        count = _thread_count(sch, target, extent)
        if rows:
            bx = fuse_or_one(sch, rows)
            _, tx = sch.split(fuse_or_one(sch, rest), [None, count])
        else:
            bx, tx = sch.split(fuse_or_one(sch, rest), [None, count])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    threads[loop_of(sch, bx).var.name] = count
    annotate_unroll(sch, bx)


def _row_loops(sch: Schedule, node: Block, loops: list[LoopRV], roles: list) -> list[LoopRV]:
    """The leading loops whose iter vars index what a reduction produced (a row's statistics):
    one block of threads per row then computes them and uses them."""
    reduced = {
        b for p in producers(sch.func, node) if has_kind(p, "reduce") for b in output_buffers(p)
    }
    used: set[Var] = set()
    for region in node.reads:
        if region.buffer in reduced:
            used |= region_vars(region)
    bound = {iv.var: free_vars(iv.binding) for iv in node.iter_vars}
    row_vars = set().union(*(bound[v] for v in used if v in bound)) if used else set()
    rows = []
    for lp in loops:
        if loop_of(sch, lp).var not in row_vars:
            break
        rows.append(lp)
    return rows


def _thread_count(sch: Schedule, target: Target, extent: int) -> ExprRV:
    limit = target.max_threads_per_block or 1024
    cap = max(THREAD_COUNTS[0], 1 << max(extent - 1, 0).bit_length())
    counts = [c for c in THREAD_COUNTS if c <= min(limit, cap)]
    return sch.sample_categorical(counts, [1.0] * len(counts))


__all__ = ["bind_block", "gpu_sketch", "thread_axes", "tile_gpu"]
