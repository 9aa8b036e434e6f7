"""Sketch rules for a matmul whose weight is laid out for a dot-product instruction
(`weight_kgroup`, hexir/graph/layout.py): AMX's tile multiplies where the CPU has them
(`amx_tile`), else VNNI's or AVX512_BF16's dot products in vector registers (`dot_tile`).

    for i0_j0 (rows x panels of 16 columns: the jobs)  parallel
      init of the accumulator
      [AMX: for i1, j1, j2, k0, k1 -- tensorized whole: tiles held over the reduction]
      [dot: for k0 / j1 / i1 / j2 (tensorized) / k1 -- one instruction per row and panel]
      write-back of the accumulator, with the elementwise consumers folded into it

`cpu_sketch` (hexir/search/sketch_cpu.py) tries them first on every tiled block; each
schedules nothing and returns False for any other block or target.
"""

from __future__ import annotations

from hexir.ir.dtype import itemsize
from hexir.ir.tir import Block
from hexir.runtime.target import Target
from hexir.runtime.tiling import largest_divisor
from hexir.schedule import BlockRV, Schedule
from hexir.schedule.tensorize import (
    AMX_BF16,
    MAX_TILE_PANELS,
    MAX_TILE_ROWS,
    TILE_DEPTH,
    TILE_LANES,
    Intrinsic,
    dot_intrinsic,
    tile_intrinsic,
)
from hexir.search.rules import inline_epilogue, loop_of, register_tile_loops, writeback_tile

# AMX tiles take a matmul of at least this many rows (fewer: the dot products' register
# tile, and a single row the matrix-vector schedule).
AMX_MIN_ROWS = 4
# The jobs run a block of the weight's columns of at most this many bytes (half of L2, kept
# there while every row tile passes over it) before the next: weight-major, rows inside
# (2048^3 int8: 7.1 ms row-major, 5.2 ms in blocks).
AMX_WEIGHT_BLOCK_BYTES = 1024 * 1024


def amx_tile(sch: Schedule, block: BlockRV, target: Target) -> bool:
    """A matmul whose weight is in the dot intrinsic's groups tiled for AMX: jobs of up to 32
    rows x 2 panels of 16 columns (4 accumulator tiles), each job's whole reduction one
    tensorized nest (hexir/schedule/tensorize_tile.py), which holds the accumulators in tile
    registers over it. False, scheduling nothing, where the CPU has no AMX for the operands,
    for fewer than AMX_MIN_ROWS rows, or a reduction not in whole tile steps."""
    node = sch.get(block)
    assert isinstance(node, Block)
    dot = dot_reads(node)
    if dot is None or target.kind != "cpu":
        return False
    a, b = (r.buffer.dtype for r in node.reads)
    tile = tile_intrinsic(a, b)
    if tile is None or not (target.amx_bf16 if tile == AMX_BF16 else target.amx_int8):
        return False
    loops = sch.get_loops(block)
    if len(loops) != 3:
        return False
    i, j, k = loops
    m, n, depth = (loop_of(sch, lp).extent for lp in loops)
    if m < AMX_MIN_ROWS or (depth // tile.group) % TILE_DEPTH:
        return False
    writeback = sch.cache_write(block, 0, "local")
    inline_epilogue(sch, writeback)
    i0, i1 = sch.split(i, [None, min(m, MAX_TILE_ROWS)])  # a ragged last tile: fewer rows
    panels = largest_divisor(n // TILE_LANES, MAX_TILE_PANELS)
    blocks = n // (TILE_LANES * panels)
    weight_bytes = depth * TILE_LANES * panels * itemsize(b)  # of one job's columns
    per_block = largest_divisor(blocks, max(1, AMX_WEIGHT_BLOCK_BYTES // weight_bytes))
    jo, ji, j1, j2 = sch.split(j, [None, per_block, panels, TILE_LANES])
    k0, k1 = sch.split(k, [None, tile.group])
    sch.reorder(jo, i0, ji, i1, j1, j2, k0, k1)
    outer = sch.fuse(jo, i0, ji)
    sch.parallel(outer)
    sch.reverse_compute_at(writeback, outer, True)
    init = sch.decompose_reduction(block, i1)
    register_tile_loops(sch, sch.get_loops(init)[1:])
    sch.tensorize(i1, tile.name)
    writeback_tile(sch, writeback, sch.get_loops(writeback)[1:], target)
    return True


# The register tile of an 8-bit matmul on VNNI: this many rows times up to this many panels of
# 16 int32 accumulators, 24 of the 32 vector registers; per step of 4 products, each panel's
# 64 bytes are loaded once and each row's 4 bytes broadcast (the rows innermost). On the
# 2-core AVX-512 host, 128x768x768: 6 rows 0.170 ms (890 GOP/s), 4 rows 0.210, 5 and 7 rows
# as fast at 128 rows but 0.7-0.8x at 1024^3, 8 rows 0.495 (32 accumulators spill); with the
# rows outside the panels each panel was reloaded per row: 0.21 ms at 4 rows, 0.33 at 6.
DOT_ROWS = 6
DOT_MAX_PANELS = 4


def dot_tile(sch: Schedule, block: BlockRV, target: Target) -> bool:
    """A matmul whose weight is in a dot intrinsic's groups (`weight_kgroup`,
    hexir/graph/layout.py: VNNI's for 8-bit operands, AVX512_BF16's for bfloat16 ones) tiled
    for it: rows x panels of 16 columns in registers, K in steps of the group outside them,
    each (row, panel, group of products) one instruction, panels outer and rows inner; the
    (rows, panels) tiles are the parallel jobs. False, scheduling nothing, for any other
    block or target."""
    node = sch.get(block)
    assert isinstance(node, Block)
    dot = dot_reads(node)
    if target.kind != "cpu" or dot is None or target.vector_width != dot.lanes:
        return False
    loops = sch.get_loops(block)
    if len(loops) != 3:
        return False
    i, j, k = loops
    m, n = loop_of(sch, i).extent, loop_of(sch, j).extent
    rows = min(m, DOT_ROWS)  # a ragged last row tile runs under a guard
    panels = largest_divisor(n // dot.lanes, DOT_MAX_PANELS)
    writeback = sch.cache_write(block, 0, "local")
    inline_epilogue(sch, writeback)
    i0, i1 = sch.split(i, [None, rows])
    j0, j1, j2 = sch.split(j, [None, panels, dot.lanes])
    k0, k1 = sch.split(k, [None, dot.group])
    sch.reorder(i0, j0, k0, j1, i1, j2, k1)
    outer = sch.fuse(i0, j0)
    sch.parallel(outer)
    sch.reverse_compute_at(writeback, outer, True)
    init = sch.decompose_reduction(block, k0)
    register_tile_loops(sch, sch.get_loops(init)[1:])
    for loop in (j1, i1):
        if loop_of(sch, loop).extent > 1:
            sch.unroll(loop)
    sch.tensorize(j2, dot.name)
    writeback_tile(sch, writeback, sch.get_loops(writeback)[1:], target)
    return True


def dot_reads(block: Block) -> Intrinsic | None:
    """The dot intrinsic of a matmul's reads of an [M, K] and a weight in its groups, [N/16,
    K/group, 16, group], into its accumulator's dtype; None for any other block."""
    if len(block.reads) != 2:
        return None
    a, b = (r.buffer for r in block.reads)
    dot = dot_intrinsic(a.dtype, b.dtype)
    if dot is None or block.writes[0].buffer.dtype != dot.acc or len(a.shape) != 2:
        return None
    return dot if b.shape[2:] == (dot.lanes, dot.group) else None
