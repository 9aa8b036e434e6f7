"""The CPU sketch: multi-level tiling of reductions with reuse ("SSRSRS"), random compute
locations and rfactor for the other blocks, then parallel-vectorize-unroll.

A tiled block (matmul, conv2d, dense) comes out as

    for S0 (spatial tiles, fused)  parallel          <- the unroll annotation sits here
      [pack of a reused operand, at a sampled location: cache_read global + compute_at]
      for S1 (spatial: cache tiles)
        init of the local accumulator (decompose_reduction), rows unrolled, columns vectorized
        for R0 (reduction: outer)
          for S2 (spatial)
            for R1 (reduction: inner)
              for S3 (spatial: the register tile; rows unrolled, columns vectorized)
        write-back of the accumulator (cache_write local + reverse_compute_at S1), with the
        elementwise consumers (bias, activation) folded into it

which holds benchmarks/matmul_cpu.py's hand schedule (S2 = R0 = 1, B packed under S0).

The "columns" are the vector axis (`vector_iter_var`): a spatial axis that every operand
either skips or indexes with unit stride in one axis. An operand indexed along it in another
axis is always packed, transposed (`cache_read(..., axes=...)`) so that the vector loop reads
it contiguously, and the accumulator is laid out with the vector axis last (`cache_write(...,
axes=...)`): dense packs W[n, k] as [k, n]; conv2d, whose input is read through windows along
rows and columns, vectorizes output channels with W packed channels-last. A padded conv2d's
zero-bordered copy of its input (`conv2d_pad`) stays a stage of its own (auto-inline keeps
it), so that no multiply-add evaluates the border's guard. A depthwise conv reads its input
along its output channels in planes, one per channel: it vectorizes along its output columns
instead (a window axis, its copy split by phase under a column stride: hexir/ops/nn.py), its
panels serial within a job and the copy of the job's planes made at the parallel loop.

`cpu_sketch(sch, target, fixed=True)` draws nothing: the default schedule of a kernel the
database does not know (hexir/runtime/default_schedule.py).
"""

from __future__ import annotations

import math

from hexir.errors import ScheduleError
from hexir.ir.arith import affine_coefficients
from hexir.ir.tir import Binary, Block, BufferRegion, Expr, IntImm, Range, Var
from hexir.ir.visit import free_vars
from hexir.runtime.target import Target
from hexir.runtime.tiling import MAX_UNROLLED_ROWS, largest_divisor, register_tile
from hexir.schedule import BlockRV, LoopRV, Schedule
from hexir.schedule.common import index_vars, reduce_fed_by
from hexir.schedule.compute_region import stored
from hexir.search.analysis import (
    block_named,
    consumers,
    has_kind,
    has_reuse,
    is_tileable,
    leaf_blocks,
    loop_roles,
    loops_around,
    producers,
    reused_reads,
    root_nests,
)
from hexir.search.rules import (
    annotate_unroll,
    attempt,
    auto_inline,
    fuse_or_one,
    inline_epilogue,
    loop_of,
    register_tile_loops,
    sample_location,
    split_all,
    split_inner,
    writeback_tile,
)
from hexir.search.sketch_dot import amx_tile, dot_tile

MAX_UNROLLED_WINDOW = 7
# A windowed conv's reduction runs over blocks of this many input channels (`_channel_blocks`).
CONV_CHANNEL_BLOCK = 64
PACK_PROBABILITY = 0.5
RFACTOR_PROBABILITY = 0.5
MIN_RFACTOR_EXTENT = 32
PARALLEL_JOBS_PER_CORE = 16
DEFAULT_JOBS_PER_CORE = 4
# A matrix-vector product's reduction steps per pass over its accumulator (unrolled): four
# weight rows per load and store of each accumulator vector.
GEMV_REDUCE_STEPS = 4
# A matrix-vector product's jobs: the most work one core may take over the average.
GEMV_JOB_IMBALANCE = 1.1
# A matrix-vector product's narrowest column panel, in fp32 lanes: 16 bytes, the narrowest
# vector the C backend prints (`loop_lanes`).
GEMV_MIN_PANEL = 4


def cpu_sketch(sch: Schedule, target: Target, fixed: bool = False) -> None:
    """Schedule every block of `sch.func` for the CPU, drawing from `sch.rng`; or, `fixed`,
    with the rule's fixed choices and no draw at all (the default schedule of a kernel the
    database does not know): the tiles of `default_tiles`, a pack of each operand the vector
    loop reads at the parallel loop, no compute location drawn, no rfactor, no unroll
    annotation."""
    auto_inline(sch, keep_padding=True)
    tiled = [b.name for b in leaf_blocks(sch.func) if _wants_tiling(sch, b)]
    done = set(tiled)
    for name in tiled:
        before = _names(sch)
        rv = sch.get_block(name)
        if not (amx_tile(sch, rv, target) or dot_tile(sch, rv, target)):
            tile_cpu(sch, rv, target, fixed)
        done |= _names(sch) - before  # the init, write-back and packs it made
    if not fixed:
        for block in reversed(leaf_blocks(sch.func)):
            if block.name not in done:
                _place_other(sch, block)
    for nest in list(root_nests(sch.func)):
        if nest.kind == "serial":
            parallelize_nest(sch, nest.var.name, target, fixed)


def _wants_tiling(sch: Schedule, block: Block) -> bool:
    return has_reuse(block) and is_tileable(sch.func, block)


def _names(sch: Schedule) -> set[str]:
    return {b.name for b in leaf_blocks(sch.func)}


def tile_cpu(sch: Schedule, block: BlockRV, target: Target, fixed: bool = False) -> None:
    """Multi-level tiling of one reduction with reuse (see the module docstring); with the
    tiles of `default_tiles` and no draw when `fixed`."""
    node = sch.get(block)
    assert isinstance(node, Block)
    roles = [r.role for r in loop_roles(sch.func, node)]
    vector_var = vector_iter_var(node)
    writeback = _try_cache_write(sch, block, _vector_last(node.writes[0], vector_var))
    if writeback is not None:
        # Before any split: a ragged tile would put a predicate on the write-back, which then
        # takes no epilogue (bias, activation, residual add), leaving them a pass of their own.
        inline_epilogue(sch, writeback)
    loops = sch.get_loops(block)
    spatial = [lp for lp, role in zip(loops, roles, strict=True) if role != "reduce"]
    reduce_ = [lp for lp, role in zip(loops, roles, strict=True) if role == "reduce"]
    # The vector loop goes innermost of every level (it is the last spatial loop as lowered
    # unless another axis reads better).
    bound = [iv.var for iv in node.iter_vars if iv.kind != "reduce"]
    if vector_var in bound:
        n = bound.index(vector_var)
        spatial = [*spatial[:n], *spatial[n + 1 :], spatial[n]]
    # A read laid out in blocks along the vector loop (a conv's weight of weight_block=b)
    # is contiguous within a block only: a wider panel reads two blocks, which the C backend
    # cannot load as one vector, and ran scalar (AVX-512's 32-channel panel of a 16-blocked
    # 3x3 conv weight: 29 ms against 0.6 ms unblocked).
    weight_block = _vector_block(node, vector_var)
    vector = weight_block or 4 * target.vector_width
    limits = [MAX_UNROLLED_ROWS] * (len(spatial) - 1) + [vector]
    extents = [loop_of(sch, lp).extent for lp in spatial]
    reduce_extents = [loop_of(sch, lp).extent for lp in reduce_]
    fixed_reduce = None
    if fixed:
        # One reduction (matmul, dense, a 1x1 conv) may take a ragged row tile; under a window
        # (a 3x3 conv) the rows-first tile runs faster (`register_tile`).
        single = sum(loop_of(sch, lp).extent > 1 for lp in reduce_) == 1
        windowed = vector_var is not None and _windowed(node, vector_var)
        tiles = default_tiles(extents, target, ragged=single, windowed=windowed,
                              block=weight_block)  # fmt: skip
        if not single and not windowed and weight_block:
            fixed_reduce = _block_pair(tiles, reduce_extents, weight_block, target)
        in_channel_blocks = not single or _small_pointwise(extents, reduce_extents)
        if fixed_reduce is None and in_channel_blocks and not windowed:
            fixed_reduce = _channel_blocks(tiles, reduce_extents)
        if fixed_reduce is None:
            fixed_reduce = default_reduce_tiles(extents, reduce_extents, target)
        fixed_tiles = zip(spatial, tiles, limits, strict=True)
        s = [_split_fixed(sch, lp, tile, limit) for lp, tile, limit in fixed_tiles]
    else:
        s = split_all(sch, spatial, 4, limits)
    r = split_all(sch, reduce_, 2, [0] * len(reduce_), fixed_reduce)
    cache = _level(s, 1)
    # Ragged columns (no panel divides them): the panels run serially inside each job, first
    # of the cache level, so that the loop partitioning of the C backend can split off the
    # guarded last panel (it cannot split a parallel loop) and each panel's pack is reused by
    # all the job's row tiles.
    ragged_columns = fixed and extents[-1] % tiles[-1][-1] != 0 and len(s[-1]) > 1
    if ragged_columns:
        cache = [s[-1][1], *(lp for lp in cache if lp != s[-1][1])]
    sch.reorder(*_level(s, 0), *cache, *_level(r, 0), *_level(s, 2), *_level(r, 1),
                *_level(s, 3))  # fmt: skip
    outer = fuse_or_one(sch, _level(s, 0))
    sch.parallel(outer)
    if fixed:
        _copies_per_job(sch, block, outer)
    if writeback is not None:
        sch.reverse_compute_at(writeback, cache[-1], True)
    # A pack goes outside the inner tiles: packing per register tile would copy more than the
    # tile computes. It comes before the register tile, whose vector loop may read only what
    # the pack made contiguous.
    first = [cache[0]] if ragged_columns else [outer]
    within = first if fixed else [outer, *_level(s, 1), *_level(r, 0)]
    _pack_operands(sch, block, within, vector_var, fixed)
    register_tile_loops(sch, _level(s, 3))
    if fixed:
        for loop in _level(r, 1):
            if 1 < loop_of(sch, loop).extent <= MAX_UNROLLED_WINDOW:
                sch.unroll(loop)
        if windowed and tiles[-1][-1] < target.vector_width:
            # Rows narrower than a vector (7x7 images): the window unrolled runs its
            # part-vector multiply-adds side by side (dw 960x7x7: 0.094 -> 0.054 ms; on 14
            # columns it costs 1.3x).
            for loop in _level(r, 0):
                if 1 < loop_of(sch, loop).extent <= MAX_UNROLLED_WINDOW:
                    sch.unroll(loop)
    sch.decompose_reduction(block, _level(r, 0)[0])
    if writeback is not None:
        writeback_tile(sch, writeback, sch.get_loops(writeback)[-len(spatial) :], target)
    if not fixed:
        annotate_unroll(sch, outer)


# A 1x1 conv whose output has at most this many pixels also reduces over channel blocks: its
# weight panel would otherwise stream from L2 once per row tile (2048 -> 512 on 7x7: 0.72x
# the time, 512 -> 2048 with the residual add 0.65x, 1024 -> 2048 on 14x14 with stride 2
# 0.85x; on 14x14 with stride 1, 0.98-1.07x: not there).
POINTWISE_BLOCKS_MAX_PIXELS = 49


def _small_pointwise(extents: list[int], reduce_extents: list[int]) -> bool:
    """Whether the spatial `extents` (the vector loop last) and reduction extents are a 1x1
    conv's over at most POINTWISE_BLOCKS_MAX_PIXELS output pixels."""
    one_by_one = len(reduce_extents) == 3 and reduce_extents[1:] == [1, 1]
    return one_by_one and math.prod(extents[:-1]) <= POINTWISE_BLOCKS_MAX_PIXELS


def _channel_blocks(tiles: list[list[int]], reduce_extents: list[int]) -> list[list[int]] | None:
    """A windowed conv's reduction in blocks of CONV_CHANNEL_BLOCK input channels, the window
    inside each block, and its image rows moved from the cache level to between the blocks
    and the window (`tiles` changed in place): each job then sweeps every row of its output
    channels per block of input channels, so the block's input rows and weight panel stay in
    cache for all of them, the accumulators (rows x a register tile) in L1 between blocks.
    None (nothing changed) unless the reduction is channels x rows x columns of a window with
    more channels than a block, in whole blocks. 512x14x14 3x3 stride 2: 0.72x the time,
    256x14x14 stride 1 0.82x; ResNet-18 0.89x, ResNet-50 0.93x (in one process, runs
    alternating)."""
    if len(reduce_extents) != 3 or len(tiles) < 3:
        return None
    channels, rows, columns = reduce_extents
    if channels <= CONV_CHANNEL_BLOCK or channels % CONV_CHANNEL_BLOCK:
        return None
    outer, cached, inner, register = tiles[-3]  # the image rows (the vector loop is last)
    tiles[-3] = [outer, 1, cached * inner, register]
    return [[channels // CONV_CHANNEL_BLOCK, CONV_CHANNEL_BLOCK], [1, rows], [1, columns]]


def _block_pair(
    tiles: list[list[int]], reduce_extents: list[int], block: int, target: Target
) -> list[list[int]] | None:
    """A windowed conv whose register tile is one block of its blocked weight (`block`
    output channels, one whole vector) wide takes two blocks: the vector loop's tile goes from
    [panels, 1, 1, block] to [panels / 2, 1, 2, block] and the whole reduction outside both
    (`tiles` changed in place), so the two blocks at level 2 and the rows x block at level 3
    are one register tile of rows x 2 vectors, two weight vectors to a broadcast where one
    was (AVX-512, ResNet-18's 3x3 convs alone: 512x7x7 0.81 -> 0.63 ms, stride 2 from 14x14
    0.52 -> 0.28, 256x14x14 and 128x28x28 of stride 2 1.24x and 1.22x). None (nothing
    changed) where the registers do not hold the wider tile (AVX2's 16: 7 rows x 2 vectors
    need 17), the panels do not pair, or too few jobs would be left for the cores."""
    if len(tiles) < 2 or len(reduce_extents) != 3 or math.prod(reduce_extents[1:]) == 1:
        return None
    panels, cached, inner, panel = tiles[-1]
    rows = tiles[-2][-1]
    vectors = 2 * -(-panel // target.vector_width)
    fits = rows * vectors + vectors + 2 <= max(target.vector_registers, 16)
    whole = panel == block == target.vector_width  # measured on full vectors only
    if not whole or (cached, inner) != (1, 1) or panels % 2 or not fits:
        return None
    if panels // 2 * math.prod(t[0] for t in tiles[:-1]) < max(1, target.num_cores):
        return None
    tiles[-1] = [panels // 2, 1, 2, panel]
    return [[extent, 1] for extent in reduce_extents]


def _copies_per_job(sch: Schedule, block: BlockRV, outer: LoopRV) -> None:
    """A stage feeding the block (a padded copy of the image) that the parallel jobs split
    between them, an axis of it each, is made per job at the parallel loop (in cache when
    read) rather than in a pass of its own: a depthwise conv's planes, one per channel
    (dw 144x56x56: 0.17 -> 0.10 ms); in NHWC, the input rows of a job's output rows where
    the window strides by 2 or more (`_split_alone_or_strided`; MobileNetV2's dw convs of
    stride 2: 112x112x96 0.63 -> 0.21-0.28 ms, 56x56x144 0.13 -> 0.07, 28x28x192 0.053 ->
    0.029, 14x14x576 0.054 -> 0.032, in the model's profile). Of stride 1, a job's rows
    would copy two rows of halo, on 14x14 and 7x7 images as many as their own: 1.5-1.8x the
    time there, so their border stays a pass of its own."""
    node = sch.get(block)
    assert isinstance(node, Block)
    job = loop_of(sch, outer).var
    split = {iv.var for iv in node.iter_vars
             if iv.kind == "spatial" and job in free_vars(iv.binding)}  # fmt: skip
    wide = {iv.var for iv in node.iter_vars if iv.dom > 1}
    for producer in producers(sch.func, node):
        for region in node.reads:
            if region.buffer not in stored(producer):
                continue
            if any(_split_alone_or_strided(e, wide, split) for e in region.region):
                attempt(sch.compute_at, sch.get_block(producer.name), outer)


def _split_alone_or_strided(expr: Expr, wide: set[Var], split: set[Var]) -> bool:
    """Whether an index `expr` of a stage's read takes the jobs' split axis alone (each job
    reads its own slices: a depthwise conv's channel planes) or as a strided window over it
    (2 * oh + r: a job's output rows read its input rows and one row of halo in three)."""
    used = index_vars(expr) & wide
    if not used & split:
        return False
    if used <= split and len(used) == 1:
        return True
    coeffs = affine_coefficients(expr, sorted(used, key=lambda v: v.name))
    return coeffs is not None and all(abs(coeffs[v]) > 1 for v in used & split)


def default_tiles(
    extents: list[int],
    target: Target,
    ragged: bool = True,
    windowed: bool = False,
    block: int | None = None,
) -> list[list[int]]:
    """Fixed 4-level tiles of the spatial loops (the vector loop last), in the shape of
    benchmarks/matmul_cpu.py's hand schedule: the register tile of `register_tile` (a panel of
    the vector loop by rows of the innermost other loop; the panel loop outermost, where its
    pack goes), and enough of the outer loops in the parallel level to give every core several
    jobs; the rest in the cache level. With `ragged`, the row loop's tiles may cover more
    than its extent: the last row tile is then guarded; so may the columns' panels where no
    panel divides them, their loop then serial in the cache level (the jobs from the rows;
    a matrix-vector product, whose jobs are its panels, first takes narrower ones that divide
    its columns, `_matrix_vector_panel`, else one stretch of panels per core, the last one
    ragged). A vector loop that slides a window (`windowed`: a
    depthwise conv's output columns) keeps its panels in the cache level too: panels side by
    side read overlapping columns of the image, which one job then copies (pads) once. A
    vector loop reading an operand laid out in blocks of `block` takes panels of one block."""
    *others, vector = extents
    width = min(vector, block) if block else vector
    panel, rows = register_tile(width, others[-1] if others else 1, target, ragged)
    matrix_vector = _matrix_vector(extents, target, block)
    if matrix_vector:
        panel = block or _matrix_vector_panel(vector, target)
    ragged_columns = vector % panel != 0  # the last panel guarded; the jobs from the rows
    jobs = 1 if ragged_columns or windowed else vector // panel
    want = DEFAULT_JOBS_PER_CORE * max(1, target.num_cores)
    tiles = []
    for n, extent in enumerate(others):
        inner = rows if n == len(others) - 1 else 1
        rest = -(-extent // inner)
        enough = (d for d in range(1, rest + 1) if rest % d == 0 and jobs * d >= want)
        outer = 1 if jobs >= want else next(enough, rest)
        jobs *= outer
        tiles.append([outer, rest // outer, 1, inner])
    panels = vector // panel
    if matrix_vector and ragged_columns:
        # GPT-2's 50257 logits: no part of a vector divides them. One stretch of panels per
        # core all the same, the last job's last panel guarded (the C backend peels the
        # parallel loop so that each job's panel loop partitions alone): on one core, the
        # 147 MiB weight streamed at 30 GB/s.
        cores = max(1, target.num_cores)
        per_core = -(-math.ceil(vector / panel) // cores)
        return [*tiles, [cores, 1, per_core, panel]]
    if ragged_columns or windowed:
        return [*tiles, [1, -(-vector // panel), 1, panel]]
    if matrix_vector:
        # Each job's columns inside the reduction, so that every step of it reads one
        # contiguous stretch of the weight row, and one job per core: the longest stretches
        # (gpt2-decode's 768 x 3072 weight: 57 -> 75 GB/s against 8 jobs).
        cores = max(1, target.num_cores)
        # The fewest that the cores share evenly (within GEMV_JOB_IMBALANCE): 1000 columns are
        # 125 panels, whose 5 jobs ran 3 against 2 (1x1000x1280: 0.086 -> 0.064 ms with 25).
        divisors = [d for d in range(cores, panels + 1) if panels % d == 0]
        jobs = min(divisors, key=lambda d: (-(-d // cores) * cores / d > GEMV_JOB_IMBALANCE, d))
        if block:
            # A weight in panels ([N/b, K, b], `matrix_vector_block`): each panel whole, its
            # reduction inside, streams one contiguous stretch into a register tile.
            return [*tiles, [jobs, panels // jobs, 1, panel]]
        return [*tiles, [jobs, 1, panels // jobs, panel]]
    return [*tiles, [panels, 1, 1, panel]]


def default_reduce_tiles(
    extents: list[int], reduce_extents: list[int], target: Target
) -> list[list[int]]:
    """Fixed 2-level tiles of the reduction loops: whole (one level), except a matrix-vector
    product's last reduction, whose inner GEMV_REDUCE_STEPS steps are unrolled inside the
    column loop (75 -> 84 GB/s on gpt2-decode's 768 x 3072 weight)."""
    tiles = [[extent, 1] for extent in reduce_extents]
    if tiles and _matrix_vector(extents, target):
        steps = largest_divisor(reduce_extents[-1], GEMV_REDUCE_STEPS)
        tiles[-1] = [reduce_extents[-1] // steps, steps]
    return tiles


def _matrix_vector(extents: list[int], target: Target, block: int | None = None) -> bool:
    """Whether spatial loops of `extents` (the vector loop last) are a matrix-vector
    product's: a single row, with more column panels (`_matrix_vector_panel`, or the weight's
    `block`) than the cores."""
    *others, vector = extents
    panel = block or _matrix_vector_panel(vector, target)
    return math.prod(others) == 1 and vector // panel > max(1, target.num_cores)


def _matrix_vector_panel(vector: int, target: Target) -> int:
    """The column panel of a matrix-vector product of `vector` columns: its register tile's
    where that divides them; else the widest part of a vector, down to GEMV_MIN_PANEL lanes,
    that does (AVX-512's 16 lanes divide neither 200 nor 1000 columns: panels of 8); else the
    register tile's, ragged. Its panels are its only parallel work: whole part-vector panels
    split between the cores evenly, where ragged ones leave the last job a guarded panel."""
    panel, _ = register_tile(vector, 1, target)
    part = target.vector_width // 2
    while vector % panel and part >= GEMV_MIN_PANEL:
        if vector % part == 0:
            panel = part
        part //= 2
    return panel


def _split_fixed(sch: Schedule, loop: LoopRV, tile: list[int], limit: int) -> list[LoopRV]:
    """`loop` split by a fixed tile of `default_tiles`: a perfect tile, or a ragged one (the
    innermost factor split off first, the rest a perfect tile of what remains)."""
    extent = loop_of(sch, loop).extent
    if extent == 1:
        return [loop]
    if math.prod(tile) == extent:
        factors = sch.sample_perfect_tile(loop, n=len(tile), max_innermost_factor=limit,
                                          decision=tile)  # fmt: skip
        return sch.split(loop, factors)
    outer, inner = sch.split(loop, [None, tile[-1]])
    if math.prod(tile[:-1]) != loop_of(sch, outer).extent:  # ragged outer tiles too
        return [*sch.split(outer, [None, *tile[1:-1]]), inner]
    factors = sch.sample_perfect_tile(outer, n=len(tile) - 1, max_innermost_factor=0,
                                      decision=tile[:-1])  # fmt: skip
    return [*sch.split(outer, factors), inner]


def _level(tiles: list[list[LoopRV]], n: int) -> list[LoopRV]:
    """The loops of tiling level `n` (a loop of extent 1 is not split: it sits at level 0)."""
    return [t[n] for t in tiles if len(t) > n]


def _try_cache_write(sch: Schedule, block: BlockRV, axes: tuple[int, ...] | None) -> BlockRV | None:
    """The local accumulator, laid out with the vector axis last."""
    try:
        return sch.cache_write(block, 0, "local", axes)
    except ScheduleError:
        return None


def vector_iter_var(block: Block) -> Var | None:
    """The spatial iter var the register tile vectorizes: one that every read either skips
    or indexes with unit stride in one axis (a pack then makes it contiguous), preferring the
    innermost axis of the output, then the longest, and an axis no read slides a window
    along: conv2d reads its input at oh + rh and ow + rw (image widths of 7, 14 or 28 would
    not fill the vectors either), so it vectorizes along output channels, its weight packed
    with them innermost; dense and matmul along the columns. A depthwise conv reads its input
    at channel k + c (c its one-channel reduction) as at column ow + rw: both axes count as
    windowed, and the output's innermost, its columns, is taken."""
    spatial = [iv for iv in block.iter_vars if iv.kind == "spatial" and iv.dom > 1]
    clean = [iv for iv in spatial if all(_unit_stride(r, iv.var) for r in block.reads)]
    # A window axis (conv2d's output columns, read as x[ow + rw]) only where nothing else is.
    clean = [iv for iv in clean if not _windowed(block, iv.var)] or clean
    out = block.writes[0].region
    last = next((iv for iv in clean if out and iv.var in index_vars(out[-1])), None)
    if last is not None:
        return last.var
    if clean:
        return max(clean, key=lambda iv: iv.dom).var
    return spatial[-1].var if spatial else None


def _windowed(block: Block, var: Var) -> bool:
    """Whether a read indexes along `var` together with a reduction var in one axis."""
    reduce_vars = {iv.var for iv in block.iter_vars if iv.kind == "reduce"}
    return any(
        var in used and used & reduce_vars
        for region in block.reads
        for used in (index_vars(e) for e in region.region)
    )


def _unit_stride(region: BufferRegion, var: Var) -> bool:
    uses = [e for e in region.region if var in index_vars(e)]
    if not uses or blocked_along(region, var):
        return True
    if len(uses) > 1 or isinstance(uses[0], Range):
        return False
    # Not affine (None): a min/max clamp, a division, a product of vars.
    coeffs = affine_coefficients(uses[0], [var])
    return coeffs is not None and coeffs[var] == 1


def _vector_block(block: Block, var: Var | None) -> int | None:
    """The smallest block b of the reads laid out in blocks along the vector loop's `var`
    (`blocked_along`), or None."""
    blocks = [b for region in block.reads if var is not None and (b := blocked_along(region, var))]
    return min(blocks, default=None)


def blocked_along(region: BufferRegion, var: Var) -> int | None:
    """b when `region` reads along `var` in blocks of b: [.., var // b, .., var % b] with the
    remainder innermost (a conv2d's weight of weight_block=b); None otherwise. Read by a
    vector loop of b lanes (or a multiple of b per block), each block is contiguous."""
    uses = [(d, e) for d, e in enumerate(region.region) if var in index_vars(e)]
    if len(uses) != 2 or uses[1][0] != len(region.region) - 1:
        return None
    (_, high), (_, low) = uses
    match high, low:
        case (
            Binary("floordiv", a, IntImm(b)),
            Binary("floormod", c, IntImm(d)),
        ) if a == var and c == var and b == d:
            return b
    return None


def _vector_last(region: BufferRegion, var: Var | None) -> tuple[int, ...] | None:
    """The axis order that puts the axis indexed by `var` last, where it is not already (the
    layout of a transposing pack); None when the region reads along `var` contiguously or
    not at all."""
    axes = [d for d, e in enumerate(region.region) if var is not None and var in index_vars(e)]
    if len(axes) != 1 or axes[0] == len(region.region) - 1:
        return None
    rank = len(region.region)
    return tuple(a for a in range(rank) if a != axes[0]) + (axes[0],)


def _pack_operands(
    sch: Schedule, block: BlockRV, within: list[LoopRV], vector_var: Var | None, fixed: bool
) -> None:
    """Copy reused operands into compact buffers at a sampled loop (or not at all: INLINE).
    An operand the vector loop would read with a stride (dense's weight, W[n, k] under a loop
    over n) is always packed, transposed so that the vector loop reads it contiguously;
    `fixed`, every operand the vector loop reads is, at the first loop of `within` (a panel
    of the vector loop: matmul's B per column panel), unless it is contiguous already and
    read only once (the weight of a matrix-vector product)."""
    node = sch.get(block)
    assert isinstance(node, Block)
    for index in reused_reads(node):
        region = node.reads[index]
        axes = _vector_last(region, vector_var)
        if fixed:
            if not any(vector_var in index_vars(e) for e in region.region):
                continue
            if vector_var is not None and blocked_along(region, vector_var):
                continue  # laid out in panels already (at compile time): nothing to copy
            if axes is None and not _reread(node, region):
                continue  # read once (a matrix-vector product's weight): a copy buys nothing
        elif axes is None and sch.rng.random() >= PACK_PROBABILITY:
            continue
        try:
            pack = sch.cache_read(block, index, "global", axes)
        except ScheduleError:
            continue
        if fixed:
            attempt(sch.compute_at, pack, within[0])
        else:
            sample_location(sch, pack, within, inline=axes is None)
        if sch.describe(pack) in {b.name for b in leaf_blocks(sch.func)}:
            pack_loops = sch.get_loops(pack)
            if pack_loops:
                attempt(sch.vectorize, pack_loops[-1])


def _reread(block: Block, region: BufferRegion) -> bool:
    """Whether a spatial loop of more than one iteration reads the same elements again."""
    used = set().union(*(index_vars(e) for e in region.region))
    return any(iv.kind == "spatial" and iv.dom > 1 and iv.var not in used for iv in block.iter_vars)


def _place_other(sch: Schedule, block: Block) -> None:
    """A block the tiling rule left: a sampled compute location (if it feeds another block),
    then, for a long reduction, maybe rfactor so that its partial sums vectorize."""
    rv = sch.get_block(block.name)
    if consumers(sch.func, block) and not any(w.buffer in sch.func.params for w in block.writes):
        sample_location(sch, rv)
        if block.name not in _names(sch):  # inlined (conv2d's padding may be)
            return
    block = block_named(sch.func, block.name)
    if has_kind(block, "reduce") and sch.rng.random() < RFACTOR_PROBABILITY:
        _rfactor_inner(sch, rv, block)


def _rfactor_inner(sch: Schedule, rv: BlockRV, block: Block) -> None:
    """Split the innermost reduction loop and rfactor its inner part into vector lanes."""
    roles = loop_roles(sch.func, block)
    if not roles or roles[-1].role != "reduce" or roles[-1].loop.extent < MIN_RFACTOR_EXTENT:
        return
    halves = split_inner(sch, sch.get_loops(rv)[-1], 2, 64)
    if halves is None:
        return
    rf = sch.rfactor(halves[1], -1)
    rf_loops = sch.get_loops(rf)
    attempt(sch.vectorize, rf_loops[-1])


def parallelize_nest(sch: Schedule, loop_name: str, target: Target, fixed: bool = False) -> None:
    """Fuse the leading loops of a root nest that may run in parallel (enough of them for
    every core), mark the fused loop parallel, vectorize each block's innermost loop where
    legal, and sample the unroll step (unless `fixed`)."""
    nest = next(n for n in root_nests(sch.func) if n.var.name == loop_name)
    blocks = [b for b in leaf_blocks(sch.func) if nest in loops_around(sch.func, b)[:1]]
    first = sch.get_block(blocks[0].name)
    chain = _parallel_chain(sch, first, PARALLEL_JOBS_PER_CORE * max(1, target.num_cores))
    outer = sch.get_loops(first)[0]
    if chain:
        outer = fuse_or_one(sch, chain)
        attempt(sch.parallel, outer)
    for b in blocks:
        loops = sch.get_loops(sch.get_block(b.name))
        if loops and loops[-1] != outer:
            attempt(sch.vectorize, loops[-1])
    if not fixed:
        annotate_unroll(sch, outer)


def _parallel_chain(sch: Schedule, block: BlockRV, want: int) -> list[LoopRV]:
    """Leading perfectly nested loops feeding no reduction, up to enough parallel work; the
    innermost loop stays out (it is the vector loop)."""
    loops = sch.get_loops(block)
    nodes = [loop_of(sch, lp) for lp in loops]
    chain: list[LoopRV] = []
    work = 1
    for n, (rv, node) in enumerate(zip(loops[:-1], nodes[:-1], strict=True)):
        if node.kind != "serial" or reduce_fed_by(node.body, node.var) is not None:
            break
        if n > 0 and nodes[n - 1].body is not node:
            break
        chain.append(rv)
        work *= node.extent
        if work >= want:
            break
    return chain
