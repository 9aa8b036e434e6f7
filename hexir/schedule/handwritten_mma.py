"""The hand-written tensor-core schedule of a float16 or bfloat16 contraction (matmul, dense,
batch_matmul into float32): warps of `mma.sync.aligned.m16n8k16` (`hexir/schedule/tensorize.py`).

    sch = mma_schedule(hexir.workload("matmul", M=4096, N=4096, K=4096, dtype="float16"))
    kernel = hexir.build(sch.func, "cuda -arch=sm_90")   # or "cpu": the nests run as loops

A thread block computes a tile of rows x columns (MmaTiling.block) with its warps side by side
(each a warp tile of `warp` rows x columns), stepping the reduction `bk` at a time through
shared memory. Within a warp, output (i, j) of each 16 x 8 instruction tile belongs to lane
4 * (i % 8) + j % 8 / 2, so the rows split as [blocks, warps, tiles, 2, 8] and the columns as
[blocks, warps, tiles, 4, 2]: the lane is fused from the 8 and the 4, and the thread's nest
(2 rows, 2 columns, 16 of the reduction) is tensorized. The accumulators stay in registers for
the whole reduction (cache_write, local); the write-back splits its tile the same way, so each
thread stores what it holds. The shared tiles' rows are padded to an odd number of 16-byte
chunks, so ldmatrix's eight rows of a request fall in different banks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hexir.ir.tir import Block, PrimFunc
from hexir.schedule.common import all_blocks
from hexir.schedule.schedule import Schedule
from hexir.schedule.tensorize import MMA_COLS, MMA_DEPTH, MMA_ROWS, WARP, WarpMma, mma_intrinsic
from hexir.schedule.trace import BlockRV, ExprRV, LoopRV

LDSM_ROW = 8  # halves in a 16-byte ldmatrix row; padded rows hold an odd number of them


@dataclass(frozen=True)
class MmaTiling:
    """A thread block's output tile (rows, columns), each warp's, and the reduction step held
    in shared memory. The default: 128 x 128 in four warps of 64 x 64 (128 float32
    accumulators a thread), 64 deep (35 KB of shared memory: two blocks a multiprocessor)."""

    block: tuple[int, int] = (128, 128)
    warp: tuple[int, int] = (64, 64)
    bk: int = 64
    pad: bool = True  # the shared tiles' rows padded against ldmatrix's bank conflicts


def mma_operands(block: Block) -> WarpMma | None:
    """The tensor-core intrinsic of `block` where it is a contraction the tiling takes: two
    float16 or two bfloat16 operands summed into float32 over one reduce axis, with rows
    and columns (its last two spatial axes) and reduction divisible by the instruction's
    16 x 8 x 16; None elsewhere."""
    spatial = [iv.dom for iv in block.iter_vars if iv.kind == "spatial"]
    reduce = [iv.dom for iv in block.iter_vars if iv.kind == "reduce"]
    if block.writes[0].buffer.dtype != "float32" or len(spatial) < 2 or len(reduce) != 1:
        return None
    if spatial[-2] % MMA_ROWS or spatial[-1] % MMA_COLS or reduce[0] % MMA_DEPTH:
        return None
    written = {w.buffer for w in block.writes}
    dtypes = [r.buffer.dtype for r in block.reads if r.buffer not in written]
    return mma_intrinsic(*dtypes) if len(dtypes) == 2 else None


def mma_contraction(func: PrimFunc, tiling: MmaTiling = MmaTiling()) -> Block | None:
    """The contraction `mma_schedule` tiles: the one reducing block with `mma_operands`
    whose rows and columns divide the tiling's block and whose reduction divides its step;
    None where there is none."""
    found = [b for b in all_blocks(func.body) if any(iv.kind == "reduce" for iv in b.iter_vars)]
    if len(found) != 1 or mma_operands(found[0]) is None:
        return None
    block = found[0]
    rows, cols = [iv.dom for iv in block.iter_vars if iv.kind == "spatial"][-2:]
    (depth,) = [iv.dom for iv in block.iter_vars if iv.kind == "reduce"]
    divides = rows % tiling.block[0] == 0 and cols % tiling.block[1] == 0
    return block if divides and depth % tiling.bk == 0 else None


# The tilings `mma_tiling` tries, largest first: 4 warps each (64 x 64, 32 x 64, 32 x 32,
# 16 x 32 a warp), each with a 64-deep step, then a 32-deep one.
TILINGS = tuple(
    MmaTiling(block, warp, bk)
    for bk in (64, 32)
    for block, warp in (
        ((128, 128), (64, 64)),
        ((64, 128), (32, 64)),
        ((64, 64), (32, 32)),
        ((32, 64), (16, 32)),
    )
)
MIN_MMA_BLOCKS = 132  # a thread block per multiprocessor of an H100/H200, where shapes allow


def mma_tiling(func: PrimFunc) -> MmaTiling | None:
    """The tiling `mma_schedule` uses by default: the first of TILINGS whose tiles divide the
    contraction and whose grid has MIN_MMA_BLOCKS blocks (BERT's 128 x 3072 dense in 128 x
    128 tiles would occupy 24 of 132 multiprocessors), else the dividing one with the most
    blocks; None where no tiling divides it."""
    fits = [t for t in TILINGS if mma_contraction(func, t) is not None]
    if not fits:
        return None
    block = mma_contraction(func, fits[0])
    spatial = [iv.dom for iv in block.iter_vars if iv.kind == "spatial"]  # type: ignore[union-attr]

    def blocks(t: MmaTiling) -> int:
        return math.prod(spatial[:-2]) * spatial[-2] // t.block[0] * spatial[-1] // t.block[1]

    return next((t for t in fits if blocks(t) >= MIN_MMA_BLOCKS), max(fits, key=blocks))


def mma_schedule(func: PrimFunc, tiling: MmaTiling | None = None) -> Schedule:
    """A tensor-core schedule of `func` (see the module docstring) in `tiling` (default:
    `mma_tiling`'s); `func` must have an `mma_contraction` the tiling divides."""
    tiling = tiling or mma_tiling(func) or MmaTiling()
    block = mma_contraction(func, tiling)
    if block is None:
        raise ValueError(f"{func.name} has no float16/bfloat16 contraction the tiling divides")
    t = tiling
    sch = Schedule(func)
    mm = sch.get_block(block.name)
    c_local = sch.cache_write(mm, 0, "local")
    for b in all_blocks(func.body):  # the rounding (and any elementwise tail) into the write-back
        if b.name != block.name:
            sch.reverse_compute_inline(sch.get_block(b.name))
    rows = (t.block[0] // t.warp[0], t.warp[0] // MMA_ROWS)
    cols = (t.block[1] // t.warp[1], t.warp[1] // MMA_COLS)
    tile_tensor_cores(sch, mm, c_local, lambda *_: (rows, cols, t.bk // MMA_DEPTH), pad=t.pad)
    return sch


Factor = int | ExprRV
# (warps, 16-row tiles a warp), (warps, 8-column tiles a warp), 16-deep chunks a shared step
Tiles = tuple[Sequence[Factor], Sequence[Factor], Factor]


def tile_tensor_cores(
    sch: Schedule,
    mm: BlockRV,
    c_local: BlockRV,
    tiles: Callable[[LoopRV, LoopRV, LoopRV], Tiles],
    pad: bool = True,
) -> None:
    """Tile the contraction `mm` (its accumulator `c_local`, a local cache_write whose
    write-back holds the elementwise epilogue already) for tensor cores. `tiles(rows, cols,
    depth)` gives the factors of the loops over 16-row tiles, 8-column tiles and 16-deep
    chunks: (warps, tiles a warp) of the rows and of the columns per thread block, and the
    chunks per shared step; integers, or ExprRVs it samples (`hexir/search/sketch_gpu.py`)."""
    fetches = [sch.cache_read(mm, n, "shared") for n in range(2)]
    *outer, i, j, k = sch.get_loops(mm)
    i16, i_in = sch.split(i, [None, MMA_ROWS])
    j8, j_in = sch.split(j, [None, MMA_COLS])
    k16, kk = sch.split(k, [None, MMA_DEPTH])
    rows, cols, steps = tiles(i16, j8, k16)
    (by, wy, mi), (ri, q) = sch.split(i16, [None, *rows]), sch.split(i_in, [2, 8])
    (bx, wx, nj), (r, cj) = sch.split(j8, [None, *cols]), sch.split(j_in, [4, 2])
    k0, k1 = sch.split(k16, [None, steps])
    sch.reorder(*outer, by, bx, k0, wy, wx, q, r, k1, mi, nj, ri, cj, kk)
    # Before the fuses: the tile of the block's outputs is then an affine region.
    _write_back(sch, c_local, bx, rows, cols)
    _bind_warps(sch, outer, by, bx, sch.fuse(wy, wx), sch.fuse(q, r))
    for fetch in fetches:
        sch.compute_at(fetch, k0)
        rank = len(sch.get(fetch).writes[0].buffer.shape)  # type: ignore[union-attr]
        if pad:
            sch.storage_align(fetch, 0, rank - 2, 2 * LDSM_ROW, LDSM_ROW)
        _fetch(sch, fetch, k0, (rows[0], cols[0]))
    sch.unroll(mi)
    sch.unroll(nj)
    sch.decompose_reduction(mm, k0)
    intrinsic = mma_operands(sch.get(mm))  # type: ignore[arg-type]
    sch.tensorize(ri, intrinsic.name)  # type: ignore[union-attr]


def _bind_warps(
    sch: Schedule, outer: list[LoopRV], by: LoopRV, bx: LoopRV, ty: LoopRV, tx: LoopRV
) -> None:
    if outer:
        sch.bind(outer[0] if len(outer) == 1 else sch.fuse(*outer), "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _fetch(sch: Schedule, fetch: BlockRV, at: LoopRV, warps: tuple[Factor, Factor]) -> None:
    """The copy of one operand tile, its loops fused and dealt out to the block's warps and
    lanes, 8 halves (16 bytes) a thread at a time where the tile's rows and size allow."""
    loops = sch.get_loops(fetch)
    names = [sch.describe(lp) for lp in loops]
    loops = loops[names.index(sch.describe(at)) + 1 :]
    row = sch.get(loops[-1]).extent  # type: ignore[union-attr]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = sch.get(fused).extent  # type: ignore[union-attr]
    threads = math.prod(_value(sch, w) for w in warps) * WARP
    lanes = LDSM_ROW if row % LDSM_ROW == 0 and extent % (LDSM_ROW * threads) == 0 else 1
    _, wy, wx, x, v = sch.split(fused, [None, *warps, WARP, lanes])
    if lanes > 1:
        sch.vectorize(v)
    sch.bind(sch.fuse(wy, wx), "threadIdx.y")
    sch.bind(x, "threadIdx.x")


def _value(sch: Schedule, factor: Factor) -> int:
    return factor if isinstance(factor, int) else sch.get(factor)  # type: ignore[return-value]


def _write_back(
    sch: Schedule, c_local: BlockRV, bx: LoopRV, rows: Sequence[Factor], cols: Sequence[Factor]
) -> None:
    """The accumulators stored by the threads that hold them (the compute's split)."""
    sch.reverse_compute_at(c_local, bx)
    loops = sch.get_loops(c_local)
    own = loops[[sch.get(lp) for lp in loops].index(sch.get(bx)) + 1 :]
    wy, mi, ri, q = sch.split(own[-2], [*rows, 2, 8])
    wx, nj, r, cj = sch.split(own[-1], [*cols, 4, 2])
    sch.reorder(wy, wx, q, r, mi, nj, ri, cj)
    sch.bind(sch.fuse(wy, wx), "threadIdx.y")
    sch.bind(sch.fuse(q, r), "threadIdx.x")
    for loop in (mi, nj, ri, cj):
        sch.unroll(loop)


__all__ = [
    "MmaTiling",
    "Tiles",
    "mma_contraction",
    "mma_operands",
    "mma_schedule",
    "mma_tiling",
    "tile_tensor_cores",
]
