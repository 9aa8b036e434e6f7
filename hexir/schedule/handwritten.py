"""Hand-written reference schedules: the proof that the primitives reach fast GPU code, and
the defaults until the search (a later issue) finds better ones.

    sch = gpu_schedule(hexir.workload("matmul", M=1024, N=1024, K=1024))
    kernel = hexir.build(sch.func, "cuda")      # or "cpu": GPU loops run serially there
    print(sch.trace)                            # the schedule, as Python

A schedule is chosen by the kinds of the blocks' iter vars, not their names:
- a contraction of float16 or bfloat16 operands into float32 whose shape divides a tiling
  (multiples of 32 x 64 x 32) gets warps of tensor-core instructions (handwritten_mma.py);
- any other reduction of two operands with two or more spatial iter vars (matmul,
  batch_matmul, dense, conv2d) gets block/thread tiling: the output tile of a thread block in
  a `local` accumulator (cache_write), a thread's columns in runs of four (one float4 read of
  B's tile each, the runs tx * 4 apart, so a warp's reads are conflict-free), each operand's
  tile for a step of the reduction in `shared` memory (cache_read), fetched cooperatively
  (the copy's loops fused and bound to the threads, innermost four lanes vectorized where
  the rows allow float4), elementwise
  consumers inlined into the write-back; its tiles are drawn decisions where they divide the
  loops, so the search steps from this schedule one tile factor at a time;
- a one-row contraction (a decode step's matrix-vector product) gets a few columns per block,
  each column's depth shared by the block's threads and their partials summed in shared
  memory (`_split_reduction`), or, where its columns or depth do not divide, a thread per
  column (VECTOR_TILING);
- other reductions (softmax, layer_norm, reduce_sum: rows) get one thread block per row, each
  reduction a cross-thread one over threadIdx.x (rfactor first where the reduction is the
  whole function), elementwise stages inlined or bound to the same threads;
- anything else is fused, split and bound to blocks and threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hexir.errors import ScheduleError
from hexir.ir.tir import Block, PrimFunc, Var
from hexir.runtime.target import STATIC_SHARED_BYTES
from hexir.schedule.common import all_blocks, index_vars, region_vars
from hexir.schedule.handwritten_mma import mma_schedule, mma_tiling
from hexir.schedule.schedule import Schedule
from hexir.schedule.trace import BlockRV, ExprRV, LoopRV

BANKS = 32  # shared memory banks of 4 bytes
RUN = 4  # a thread's adjacent columns read as one float4 of B (more go in runs, tx * RUN apart)
ROW_THREADS = 128  # threads per row of a row reduction
VECTOR_MIN_COLUMNS = 256  # a one-row contraction this wide is tiled over its columns
FLAT_THREADS = 256  # threads per block of an elementwise kernel
# A contraction's grid: at least this many thread blocks where its size allows (about two per
# multiprocessor of a 132-SM H100/H200), each of at least MIN_THREADS threads.
MIN_BLOCKS = 256
MIN_THREADS = 64


@dataclass(frozen=True)
class Tiling:
    """A contraction's tiles: threads per block (ty, tx), outputs per thread (mi, nj) and
    the reduction step held in shared memory (bk, shortened by the schedule until both tiles
    fit 48 KB). The default: 8 x 32 threads of 8 x 8 outputs, a thread's columns in two runs
    of four 128 apart (each run one conflict-free float4 read of B, A's eight reads broadcast
    to the warp): 64 FMAs a warp per 16 shared wavefronts, which the static analyzer reads as
    100% of FP32 peak; a 64 x 256 output tile, stepped 32 deep (40 KB). Not yet timed on a
    GPU: the tile it replaced (8 x 4 outputs a thread, 64 deep: 8 FMA clocks per 12
    wavefronts, 67%) ran float32 4096^3 at 0.76x cuBLAS on an H200 and an H100, the fastest
    of 20 tilings swept then (`benchmarks/matmul_gpu.py --also 8,32,8,4,64` times both)."""

    ty: int = 8
    tx: int = 32
    mi: int = 8
    nj: int = 8
    bk: int = 64


# ... with one row per block, a thread per column and a deep reduction step: as many blocks
# as the columns allow, each step's weight tile fetched by all threads at once. (The fallback
# of a matrix-vector product whose columns or depth `_split_reduction` cannot divide.)
VECTOR_TILING = Tiling(ty=1, tx=64, mi=1, nj=1, bk=64)
# A matrix-vector product's block (`_split_reduction`): GEMV_THREADS threads, a few columns
# each shared by many threads along the reduction, each thread summing GEMV_MIN_STEPS products
# or more. A warp reads whole 32-byte sectors of the weight: 8 adjacent columns ([K][N]) or
# 32 adjacent depths ([N][K]).
GEMV_THREADS = 256
GEMV_MIN_STEPS = 8
GEMV_COLUMNS = (32, 16, 8)


def gpu_schedule(func: PrimFunc, tiling: Tiling | None = None) -> Schedule:
    """A hand-written GPU schedule of `func` (see the module docstring)."""
    blocks = list(all_blocks(func.body))
    if tiling is None and mma_tiling(func) is not None:  # float16/bfloat16: tensor cores
        try:
            return mma_schedule(func)
        except ScheduleError:  # a stage it cannot fold (a producer fused before the product)
            pass
    contraction = [b for b in blocks if _reduces(b) and _spatial(b) >= 2 and _operands(b) >= 2]
    if contraction:
        return _tiled(func, contraction[0], tiling)
    vector = [b for b in blocks if _matrix_vector(b)]
    if vector:
        split = _split_reduction(func, vector[0]) if tiling is None else None
        return split or _tiled(func, vector[0], tiling, VECTOR_TILING)
    if any(_reduces(b) for b in blocks):
        return _rows(func)
    return _flat(func)


def _matrix_vector(block: Block) -> bool:
    """A contraction with one output row (a matmul or dense of M = 1: GPT-2's decode step),
    which a row reduction would run as one thread block looping over every column: two
    operands indexed by the reduction, a row axis of 1 and a wide column axis."""
    if not _reduces(block) or _spatial(block) != 1:
        return False
    spatial = [iv for iv in block.iter_vars if iv.kind == "spatial"]
    return len(spatial) >= 2 and spatial[-1].dom >= VECTOR_MIN_COLUMNS and _operands(block) >= 2


def _operands(block: Block) -> int:
    """How many of the block's reads the reduction indexes: two for a contraction (a matmul's
    A and B), one for a row reduction (softmax's max over the rows of a 3-D tensor)."""
    reduce = {iv.var for iv in block.iter_vars if iv.kind == "reduce"}
    return sum(1 for r in block.reads if reduce & region_vars(r))


def _reduces(block: Block) -> bool:
    return any(iv.kind == "reduce" for iv in block.iter_vars)


def _spatial(block: Block) -> int:
    return sum(1 for iv in block.iter_vars if iv.kind == "spatial" and iv.dom > 1)


# ---------------------------------------------------------------------------------------------
# Contractions: block and thread tiling, shared operand tiles, a local accumulator


def _tiled(
    func: PrimFunc, block: Block, tiling: Tiling | None, base: Tiling = Tiling()
) -> Schedule:
    sch = Schedule(func)
    # A producer the contraction reads directly (a convolution's padding) is inlined into the
    # shared fetch of what it makes, not into the contraction: the fetch then copies a tile of
    # the padded image, which the contraction indexes affinely (h + r), where the image's own
    # clamped indices would make the tile the whole image.
    operands = {r.buffer for r in block.reads}
    feeding = [b.name for b in all_blocks(func.body) if any(w.buffer in operands for w in b.writes)]
    _inline_elementwise(sch, func, keep={block.name, *feeding})
    mm = sch.get_block(block.name)
    c_local = sch.cache_write(mm, 0, "local")
    _inline_consumers(sch, func, block.name)
    reads = len(sch.get(mm).reads)  # type: ignore[union-attr]
    fetches = [sch.cache_read(mm, n, "shared") for n in range(reads)]
    for name in feeding:
        sch.compute_inline(sch.get_block(name))
    loops = sch.get_loops(mm)
    ivs = sch.get(mm).iter_vars  # type: ignore[union-attr]
    spatial = [lp for lp, iv in zip(loops, ivs, strict=True) if iv.kind == "spatial"]
    reduce = [lp for lp, iv in zip(loops, ivs, strict=True) if iv.kind == "reduce"]
    column = ivs[loops.index(spatial[-1])].var if len(spatial) < 4 else None  # the output's
    outer, i, j = _output_axes(sch, spatial)
    extent = [sch.get(lp).extent for lp in (*outer, i, j)]  # type: ignore[union-attr]
    t = tiling or _fit(base, extent[-2], extent[-1], math.prod(extent[:-2]))
    node = sch.get(mm)
    across = [column is not None and _rows_across_lanes(node, n, column) for n in range(reads)]
    if any(across) and tiling is None:  # its padded rows take shared memory: a shorter step
        t = replace(t, bk=max(t.bk // 2, 1))
    while tiling is None and t.bk > 1 and _tile_bytes(t, any(across)) > STATIC_SHARED_BYTES:
        t = replace(t, bk=t.bk // 2)  # the deepest step whose tiles fit static shared memory
    (_, ty_n, _), (by, ty, ii) = _tiles(sch, i, [t.ty, t.mi])
    if any(across):  # a thread's columns tx, tx + t.tx, ...: a warp reads adjacent W rows
        (_, _, tx_n), (bx, ji, tx) = _tiles(sch, j, [t.nj, t.tx])
    elif t.nj > RUN:  # a thread's columns in runs of four, tx * 4 apart: a float4 of B each
        (_, groups, tx_n, _), (bx, jg, tx, ji) = _tiles(sch, j, [t.nj // RUN, t.tx, RUN])
    else:  # a thread's columns adjacent: its B reads merge into a vector load
        (_, tx_n, _), (bx, tx, ji) = _tiles(sch, j, [t.tx, t.nj])
    grouped = t.nj > RUN and not any(across)
    threads = (ty_n, tx_n)
    # A step of the reduction: bk of one reduce axis; a convolution's channels in steps of
    # about bk / (R * S) with its window (r, s) whole inside, so that a step's image tile is a
    # few channels of a few rows (fusing c, r and s first would make it the whole image).
    steps = [sch.get(lp).extent for lp in reduce[1:]]  # type: ignore[union-attr]
    _, (k0, k1) = _tiles(sch, reduce[0], [_pow2_at_most(max(t.bk // math.prod(steps), 1))])
    per_thread = [ii, jg, ji] if grouped else [ii, ji]
    sch.reorder(*outer, by, bx, k0, ty, tx, k1, *reduce[1:], *per_thread)
    if outer:
        sch.bind(outer[0], "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    for fetch, padded in zip(fetches, across, strict=True):
        sch.compute_at(fetch, k0)
        if padded:  # W[n][k] of a dense: each row padded by a word, fetched word by word
            rank = len(sch.get(fetch).writes[0].buffer.shape)  # type: ignore[union-attr]
            sch.storage_align(fetch, 0, rank - 2, BANKS, 1)
        _cooperative_fetch(sch, fetch, k0, t, threads, vector=not padded)
    for loop in per_thread:
        sch.unroll(loop)
    sch.decompose_reduction(mm, k0)  # the zeroing keeps the thread loops' kinds
    sch.reverse_compute_at(c_local, bx)
    loops = sch.get_loops(c_local)  # the write-back, thread by thread
    own = loops[[sch.get(lp) for lp in loops].index(sch.get(bx)) + 1 :]
    if any(across):
        c1, c0 = sch.split(own[-1], [None, tx_n])
        columns = [c1]
    elif grouped:
        cg, c0, c1 = sch.split(own[-1], [groups, tx_n, None])
        columns = [cg, c1]
    else:
        c0, c1 = sch.split(own[-1], [tx_n, None])
        columns = [c1]
    if len(own) >= 2:
        r0, r1 = sch.split(own[-2], [ty_n, None])
        sch.reorder(r0, c0, r1, *columns)
        sch.bind(r0, "threadIdx.y")
        sch.unroll(r1)
    elif grouped:  # one row per block (a matrix-vector product): its row loop has gone
        sch.reorder(c0, *columns)
    sch.bind(c0, "threadIdx.x")
    for loop in columns:
        sch.unroll(loop)
    return sch


# ---------------------------------------------------------------------------------------------
# Matrix-vector products: the reduction shared by a block's threads


def _split_reduction(func: PrimFunc, block: Block) -> Schedule | None:
    """A one-row contraction (GPT-2's decode step: 1 x 768 by 768 x 3072) with its reduction
    split across each block's threads: a block takes a few columns, its threads each sum a
    share of the depth into a shared partial (rfactor), and one thread per column adds the
    partials and writes the column with its epilogue. A thread per column over the whole
    depth (VECTOR_TILING) left most multiprocessors idle: 768 columns made 12 blocks of 64
    threads for an H100's 132 multiprocessors. Lanes run along the weight's contiguous axis:
    the columns of a [K][N] weight, the depth of an [N][K] one (a dense). None where the
    columns or the depth do not divide."""
    sch = Schedule(func)
    _inline_elementwise(sch, func, keep={block.name})
    mm = sch.get_block(block.name)
    c_local = sch.cache_write(mm, 0, "local")
    _inline_consumers(sch, func, block.name)
    loops = sch.get_loops(mm)
    node = sch.get(mm)
    assert isinstance(node, Block)
    spatial = [lp for lp, iv in zip(loops, node.iter_vars, strict=True) if iv.kind == "spatial"]
    reduce = [lp for lp, iv in zip(loops, node.iter_vars, strict=True) if iv.kind == "reduce"]
    if len(reduce) != 1:
        return None
    columns, depth = (sch.get(lp).extent for lp in (spatial[-1], reduce[0]))  # type: ignore[union-attr]
    column = node.iter_vars[loops.index(spatial[-1])].var
    across = any(_rows_across_lanes(node, n, column) for n in range(len(node.reads)))
    if across:  # W[n][k]: a warp's lanes along k, a few columns per block
        lanes = BANKS
        width = GEMV_THREADS // lanes
    else:  # W[k][n]: lanes along the columns, the most blocks the columns allow
        fits = [c for c in GEMV_COLUMNS if columns % c == 0]
        wide = [c for c in fits if columns // c >= MIN_BLOCKS]
        width = (wide or fits[-1:] or [0])[0]
        lanes = GEMV_THREADS // max(width, 1)
    while lanes > 1 and (depth % lanes or depth // lanes < GEMV_MIN_STEPS):
        lanes //= 2
    if not width or columns % width or lanes < 2:
        return None
    jo, jc = sch.split(spatial[-1], [None, width])
    if across:  # k = step * lanes + lane: adjacent lanes, adjacent depths
        kk, kt = sch.split(reduce[0], [None, lanes])
    else:  # k = lane * steps + step: each lane one stretch of rows
        kt, kk = sch.split(reduce[0], [lanes, None])
    sch.reorder(*spatial[:-1], jo, kt, jc, kk)
    # The partials, a per-block buffer (shared memory), with the lanes' axis innermost where
    # the lanes run along the depth and outermost where they run along the columns: a warp's
    # partials are adjacent words either way.
    sch.rfactor(kt, len(spatial) if across else 0)
    axes = ("threadIdx.y", "threadIdx.x") if across else ("threadIdx.x", "threadIdx.y")
    bx = sch.fuse(*spatial[:-1], jo) if spatial[:-1] else jo
    sch.bind(bx, "blockIdx.x")
    sch.bind(jc, axes[0])
    sch.bind(kt, axes[1])
    kw, jw = sch.get_loops(mm)[-2:]  # the sum of the partials: a thread per column
    sch.reorder(jw, kw)
    sch.bind(jw, axes[0])
    sch.reverse_compute_at(c_local, jw)
    return sch


def _tiles(
    sch: Schedule, loop: LoopRV, inner: list[int]
) -> tuple[list[ExprRV | int | None], list[LoopRV]]:
    """`loop` split into the rest of its extent and the `inner` factors. Where they divide
    the extent the factors are a drawn tile's decision (`sample_perfect_tile`), so that the
    search moves them: the schedule's neighbours are a tile factor away, and every use of a
    factor (the fetch's and the write-back's thread splits) moves with it; a ragged tile
    keeps plain factors."""
    extent = sch.get(loop).extent  # type: ignore[union-attr]
    if extent % math.prod(inner):
        return [None, *inner], sch.split(loop, [None, *inner])
    decision = [extent // math.prod(inner), *inner]
    factors = sch.sample_perfect_tile(loop, n=len(decision), max_innermost_factor=0,
                                      decision=decision)  # fmt: skip
    return list(factors), sch.split(loop, factors)


def _tile_bytes(t: Tiling, padded: bool) -> int:
    """Shared memory of a step's two operand tiles (ty * mi rows and tx * nj columns of bk
    float32 elements, an upper bound for narrower types; padded: the columns' rows a word
    longer)."""
    return 4 * (t.ty * t.mi * t.bk + t.tx * t.nj * (t.bk + padded))


def _fit(t: Tiling, rows: int, cols: int, outer: int = 1) -> Tiling:
    """`t` shrunk (powers of two) until a block's tile fits the output, so that small problems
    still get several threads per row and column; then, while the grid has fewer than
    MIN_BLOCKS blocks, the outputs per thread (down to 4) and then the threads per block (down
    to MIN_THREADS) are halved where that adds blocks: a 128 x 768 matmul in 128 x 128 tiles
    would occupy 6 of an H200's 132 multiprocessors."""
    ty, mi, tx, nj = t.ty, t.mi, t.tx, t.nj
    while ty * mi > rows and (ty > 1 or mi > 1):
        ty, mi = (ty // 2, mi) if ty >= mi else (ty, mi // 2)
    while tx * nj > cols and (tx > 1 or nj > 1):  # runs of four columns go first
        tx, nj = (tx, nj // 2) if nj > RUN or tx < nj else (tx // 2, nj)
    ty, mi, tx, nj = max(ty, 1), max(mi, 1), max(tx, 1), max(nj, 1)
    while ty * tx < t.ty * t.tx and 2 * ty * mi <= rows:  # narrow columns (a 7-wide image):
        ty *= 2  # the threads they cannot take go to the rows (the channels)

    def blocks(ty: int, mi: int, tx: int, nj: int) -> int:
        return outer * -(-rows // (ty * mi)) * -(-cols // (tx * nj))

    while blocks(ty, mi, tx, nj) < MIN_BLOCKS:
        smaller = []
        if mi * nj > 4:  # fewer outputs per thread, the larger side first
            smaller += [(ty, mi // 2, tx, nj), (ty, mi, tx, nj // 2)][:: 1 if mi >= nj else -1]
        elif ty * tx > MIN_THREADS:  # then fewer threads
            smaller += [(ty // 2, mi, tx, nj), (ty, mi, tx // 2, nj)][:: 1 if ty >= tx else -1]
        more = [c for c in smaller if min(c) >= 1 and blocks(*c) > blocks(ty, mi, tx, nj)]
        if not more:
            break
        ty, mi, tx, nj = more[0]
    return Tiling(ty, tx, mi, nj, t.bk)


def _output_axes(sch: Schedule, spatial: list[LoopRV]) -> tuple[list[LoopRV], LoopRV, LoopRV]:
    """(loops fused onto blockIdx.z, the row axis, the column axis): the last two spatial
    loops, except with four or more (a convolution: batch, channel, height, width), where the
    rows are the channels, the columns the width, and batch and height go to blockIdx.z."""
    if len(spatial) >= 4:
        lead, i, j = [spatial[0], *spatial[2:-1]], spatial[1], spatial[-1]
        sch.reorder(*lead, i, j)
        return _fused(sch, lead), i, j
    lead, i, j = spatial[:-2], spatial[-2], spatial[-1]
    return _fused(sch, lead), i, j


def _fused(sch: Schedule, loops: list[LoopRV]) -> list[LoopRV]:
    if not loops:
        return []
    return [loops[0] if len(loops) == 1 else sch.fuse(*loops)]


def _rows_across_lanes(block: Block, n: int, column: Var) -> bool:
    """Whether the contraction's `n`th operand has the reduction on its last axis and the
    output column on another (a dense's W[n][k]): the warp's lanes, one column each, then
    read one word per row of the shared tile, all in one bank unless the rows are padded."""
    region = block.reads[n].region
    reduce = {iv.var for iv in block.iter_vars if iv.kind == "reduce"}
    last = index_vars(region[-1])
    return (
        bool(last & reduce)
        and column not in last
        and any(column in index_vars(x) for x in region[:-1])
    )


def _cooperative_fetch(
    sch: Schedule,
    fetch: BlockRV,
    at: LoopRV,
    t: Tiling,
    threads: tuple[ExprRV | int, ExprRV | int] | None = None,
    vector: bool = True,
) -> None:
    """The copy's loops (under `at`) fused, split over the block's threads (ty, tx: `t`'s,
    or `threads`, the drawn factors that are), the innermost four lanes vectorized when the
    copied rows allow float4 (and `vector`)."""
    ty, tx = threads or (t.ty, t.tx)
    loops = sch.get_loops(fetch)
    names = [sch.describe(lp) for lp in loops]
    loops = loops[names.index(sch.describe(at)) + 1 :]
    row = sch.get(loops[-1]).extent  # type: ignore[union-attr]
    rank = len(sch.get(fetch).writes[0].buffer.shape)  # type: ignore[union-attr]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = sch.get(fused).extent  # type: ignore[union-attr]
    # float4 where the innermost loop is the buffer's last axis (no unit axis dropped after it)
    whole = vector and row % 4 == 0 and len(loops) == rank
    lanes = 4 if whole and extent % (4 * t.ty * t.tx) == 0 else 1
    if lanes > 1:
        _, y, x, v = sch.split(fused, [None, ty, tx, lanes])
        sch.vectorize(v)
    else:
        _, y, x = sch.split(fused, [None, ty, tx])
    sch.bind(y, "threadIdx.y")
    sch.bind(x, "threadIdx.x")


def _inline_elementwise(sch: Schedule, func: PrimFunc, keep: set[str]) -> None:
    """Inline every elementwise block that feeds another block (bias_add into relu), but
    those in `keep`."""
    outputs = {b.name for b in func.outputs}
    for b in all_blocks(func.body):
        if b.name in keep or _reduces(b):
            continue
        if any(w.buffer.name in outputs for w in b.writes):
            continue
        sch.compute_inline(sch.get_block(b.name))


def _inline_consumers(sch: Schedule, func: PrimFunc, producer: str) -> None:
    """Fold the elementwise blocks after the contraction into its write-back."""
    for b in all_blocks(func.body):
        if b.name != producer and not _reduces(b):
            try:
                sch.reverse_compute_inline(sch.get_block(b.name))
            except Exception:  # noqa: BLE001 - inlined already, or not inlinable: leave it
                continue


# ---------------------------------------------------------------------------------------------
# Row reductions: a block per row, cross-thread reductions


def _rows(func: PrimFunc) -> Schedule:
    sch = Schedule(func)
    blocks = list(all_blocks(func.body))
    last = blocks[-1]
    if len(blocks) == 1:
        return _rfactor_rows(sch, last)
    for b in blocks[:-1]:
        if not _reduces(b):
            sch.compute_inline(sch.get_block(b.name))
    final = sch.get_block(last.name)
    rows, inner = _split_rows(sch, sch.get_loops(final), last)
    sch.bind(rows, "blockIdx.x")
    for b in reversed(blocks[:-1]):  # consumers first: each producer lands before them
        if _reduces(b):
            rv = sch.get_block(b.name)
            sch.compute_at(rv, rows)
            _thread_reduce(sch, sch.get_loops(rv)[-1])
    if inner is not None:
        threads = min(ROW_THREADS, _pow2_at_least(sch.get(inner).extent))  # type: ignore[union-attr]
        outer, lanes = sch.split(inner, [None, threads])
        sch.reorder(lanes, outer)
        sch.bind(lanes, "threadIdx.x")
    return sch


def _split_rows(sch: Schedule, loops: list[LoopRV], block: Block) -> tuple[LoopRV, LoopRV | None]:
    """(the fused row loops, the last spatial loop) of the final block."""
    spatial = [lp for lp, iv in zip(loops, block.iter_vars, strict=True) if iv.kind == "spatial"]
    if _reduces(block) or len(spatial) == 1:
        return (spatial[0] if len(spatial) == 1 else sch.fuse(*spatial)), None
    rows = spatial[:-1]
    return (rows[0] if len(rows) == 1 else sch.fuse(*rows)), spatial[-1]


def _thread_reduce(sch: Schedule, k: LoopRV) -> LoopRV:
    """`k` split so its inner part runs over threadIdx.x, each thread reducing its share
    serially first: a cross-thread reduction."""
    threads = min(ROW_THREADS, _pow2_at_least(sch.get(k).extent))  # type: ignore[union-attr]
    k0, k1 = sch.split(k, [None, threads])
    sch.reorder(k1, k0)
    sch.bind(k1, "threadIdx.x")
    return k1


def _rfactor_rows(sch: Schedule, block: Block) -> Schedule:
    """A lone reduction: each thread's partial in a per-block buffer (rfactor), combined by
    a cross-thread reduction over the same threads."""
    rv = sch.get_block(block.name)
    rows, _ = _split_rows(sch, sch.get_loops(rv), block)
    k = sch.get_loops(rv)[-1]
    threads = min(ROW_THREADS, _pow2_at_least(sch.get(k).extent))  # type: ignore[union-attr]
    k0, k1 = sch.split(k, [None, threads])
    sch.reorder(k1, k0)
    sch.rfactor(k1, -1)
    sch.bind(rows, "blockIdx.x")
    sch.bind(k1, "threadIdx.x")
    (wb,) = [lp for lp in sch.get_loops(rv) if sch.describe(lp).endswith("_wb")]
    sch.bind(wb, "threadIdx.x")
    return sch


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _pow2_at_most(n: int) -> int:
    return 1 << max(0, int(math.log2(max(n, 1))))


# ---------------------------------------------------------------------------------------------
# Everything else


def _flat(func: PrimFunc) -> Schedule:
    """Each block's loops fused and split over blocks of FLAT_THREADS threads."""
    sch = Schedule(func)
    blocks = list(all_blocks(func.body))
    for b in blocks[:-1]:
        sch.compute_inline(sch.get_block(b.name))
    rv = sch.get_block(blocks[-1].name)
    loops = sch.get_loops(rv)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, FLAT_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch


# ---------------------------------------------------------------------------------------------
# The CPU


def cpu_schedule(func: PrimFunc, mr: int = 4, nr: int = 64) -> Schedule:
    """A CPU schedule of a matmul-like contraction (benchmarks/matmul_cpu.py): B packed per
    `nr`-column panel (a `global` cache computed at the panel loop), an `mr` x `nr`
    accumulator tile in vector registers (a `local` cache written back per row tile), the
    reduction outside the unrolled rows and the vectorized columns, the panel loop parallel."""
    (block,) = [b for b in all_blocks(func.body) if _reduces(b) and _spatial(b) >= 2][:1]
    sch = Schedule(func)
    mm = sch.get_block(block.name)
    c_local = sch.cache_write(mm, 0, "local")  # the accumulator tile
    b_panel = sch.cache_read(mm, 1, "global")  # B packed per column panel
    *_, i, j, k = sch.get_loops(mm)
    i_tile, i_reg = sch.split(i, [None, mr])
    j_panel, j_reg = sch.split(j, [None, nr])
    sch.reorder(j_panel, i_tile, k, i_reg, j_reg)
    sch.compute_at(b_panel, j_panel)
    sch.reverse_compute_at(c_local, i_tile)
    init = sch.decompose_reduction(mm, k)
    sch.parallel(j_panel)
    sch.unroll(i_reg)
    sch.vectorize(j_reg)
    for stage in (init, c_local):  # zeroing and writing back the tile: rows x vectors
        *_, rows, cols = sch.get_loops(stage)
        sch.unroll(rows)
        sch.vectorize(cols)
    *_, pack_cols = sch.get_loops(b_panel)
    sch.vectorize(pack_cols)
    return sch


__all__ = ["Tiling", "cpu_schedule", "gpu_schedule"]
