"""Default schedules: what a kernel runs with when the tuning database has nothing for it.

    sch = default_schedule(func, Target("cpu"))     # a Schedule: sch.func, sch.trace

They are simple and never fail: a primitive that raises `ScheduleError` leaves the schedule as
it was, and the default does less.

- CPU, an `attention` kernel: its stages per job of query rows, the two contractions in
  register tiles (hexir/schedule/handwritten_attention.py).
- CPU, a kernel with a contraction to tile (matmul, dense, conv2d and their fused
  epilogues): the search's CPU sketch (hexir/search/sketch_cpu.py) with its fixed choices
  instead of draws: panels of the vector loop in parallel with the operand it reads strided
  packed transposed per panel, a register tile of rows by up to four vectors, the whole
  reduction inside.
- CPU, a chain of row-wise stages (softmax, layer_norm: every stage over the same rows with
  one loop along the row): the rows in parallel, every stage computed per row, reductions
  accumulated in vector lanes (rfactor), the other stages vectorized.
- CPU, any other kernel, per block: where legal, the innermost spatial loop moves inside the
  reduction loops and is vectorized (elementwise ops: the last axis); the spatial loops
  outside it are fused and run in parallel (OpenMP). A window reduction runs per output row:
  the outer loops in parallel, each output (an NHWC pool's: each pixel's vector of
  channels) accumulated in registers over its window, unrolled. A copy whose innermost loop
  reads with a stride (a transpose) runs in unrolled tiles instead (8 x 8, or by the largest
  divisors up to 8: 8 x 7 for ResNet-50's NHWC -> NCHW at 7 x 7 and 14 x 14; ViT's 197 by 8
  and a guarded last tile). A block whose
  value is a case split on some of its indices (Winograd's transforms, hexir/ops/winograd.py:
  those indices appear only in select conditions, `case_vars`) has those loops unrolled
  inside the others, around one vector of the innermost loop, so every case folds to
  straight-line code with constant coefficients. A kernel of fewer
  than MIN_PARALLEL_ITERATIONS iterations in all (here and of row stages) runs on one core.
- GPU, an `attention` or `paged_attention` kernel: the flash nest (hexir/schedule/flash.py):
  a thread block per tile of query rows (a decode step: per sequence and head), online
  softmax over tiles of keys and values in shared memory.
- GPU: the hand-written reference schedule (hexir/schedule/handwritten.py: tiled
  contractions with shared-memory operands, one thread block per row of a row reduction,
  flat elementwise kernels) where it applies and passes the GPU verifier; otherwise
  elementwise blocks that write no output are inlined into their consumers; then, of
  the leading spatial loops that every remaining stage has with the same extents, the last
  stage's are fused, split by `GPU_THREADS` and bound to `blockIdx.x` / `threadIdx.x`, and
  every earlier stage is computed at the thread loop (each thread makes what it reads:
  softmax's row statistics per row, a matmul's element before its epilogue). A kernel whose
  stages share no such loops, or that the GPU verifier refuses, runs on one thread: correct,
  slow, and a task for the search.
"""

from __future__ import annotations

import functools
import math

from hexir.codegen.c import MIN_PARALLEL_ITERATIONS
from hexir.codegen.c_prefetch import PREFETCH
from hexir.errors import HexirError, ScheduleError
from hexir.ir.dtype import itemsize
from hexir.ir.symbolic import Sym, SymbolicError
from hexir.ir.tir import Block, BufferStore, Expr, PrimFunc, Select, Var
from hexir.ir.visit import children, free_vars
from hexir.runtime.target import Target
from hexir.schedule import LoopRV, Schedule
from hexir.schedule.common import all_blocks, attempt, index_vars, loop_extent

__all__ = ["GPU_THREADS", "default_schedule"]

GPU_THREADS = 128


def default_schedule(func: PrimFunc, target: Target | str = "cpu") -> Schedule:
    """A simple schedule of `func` for `target` (see the module docstring)."""
    from hexir.schedule.handwritten_attention import attention_schedule, paged_attention_schedule

    target = Target.of(target)
    if target.kind == "cpu" and func.symbols:
        return _cpu_symbolic(func, target)
    if target.kind == "cpu":
        return (
            attention_schedule(func, target)
            or paged_attention_schedule(func, target)
            or _cpu_dots(func, target)
            or _cpu_tiled(func, target)
            or _cpu_rows(func, target)
            or _cpu_simple(func, target)
        )
    return _gpu_schedule(func, target)


def _cpu_symbolic(func: PrimFunc, target: Target) -> Schedule:
    """A kernel with symbolic extents: the row chains' schedule or the per-block one, each
    step that needs a number where a symbol stands left out (the rows, of a size known only
    at run time, are assumed many); unscheduled where neither applies."""
    for schedule in (_cpu_rows, _cpu_simple):
        try:
            sch = schedule(func, target)
        except SymbolicError:
            continue
        if sch is not None:
            return sch
    return Schedule(func)


def _loops(sch: Schedule, name: str) -> tuple[list[LoopRV], list[str], Block]:
    """The loops around block `name`, the kind of the iter var each binds ("" when a loop is
    not bound alone to one iter var), and the block."""
    rv = sch.get_block(name)
    block = sch.get(rv)
    assert isinstance(block, Block)
    loops = sch.get_loops(rv)
    kinds = {iv.binding: iv.kind for iv in block.iter_vars if isinstance(iv.binding, Var)}
    return loops, [kinds.get(sch.get(lp).var, "") for lp in loops], block  # type: ignore[union-attr]


def _leading_spatial(loops: list[LoopRV], kinds: list[str]) -> list[LoopRV]:
    outer = []
    for loop, kind in zip(loops, kinds, strict=True):
        if kind != "spatial":
            break
        outer.append(loop)
    return outer


# -- CPU --------------------------------------------------------------------------------------


def _cpu_tiled(func: PrimFunc, target: Target) -> Schedule | None:
    """The search's CPU sketch with its fixed choices, for a kernel with a contraction to
    tile (None otherwise, or where the sketch refuses it)."""
    from hexir.search.analysis import has_reuse, is_tileable
    from hexir.search.sketch_cpu import cpu_sketch

    if not any(has_reuse(b) and is_tileable(func, b) for b in all_blocks(func.body)):
        return None
    sch = Schedule(func, target=target)
    try:
        cpu_sketch(sch, target, fixed=True)
    except ScheduleError:
        return None
    return sch


# A contraction whose rows are fewer than this streams its other operand once: tiles would
# reuse nothing (a decode step's q·kᵀ against a key cache read in place).
DOT_ROWS = 4


def _cpu_dots(func: PrimFunc, target: Target) -> Schedule | None:
    """Dot products: a contraction whose every operand runs along the reduction, contiguous
    (a batch_matmul reading its b transposed, a dense of a computed weight), with fewer than
    DOT_ROWS rows, so that each output is the dot product of two rows read in place: the
    outputs in parallel, each accumulated in vector lanes along the reduction
    (`reduce_in_lanes`), its epilogues computed where it is. The tile sketch would vectorize
    along the outputs and read across the rows, one element a row. None where the kernel is
    not of that shape."""
    blocks = list(all_blocks(func.body))
    main = [b for b in blocks if any(iv.kind == "reduce" for iv in b.iter_vars)]
    if len(main) != 1 or main[0] is not blocks[0] or not _dot_reads(main[0]):
        return None
    sch = Schedule(func)
    name, share = main[0].name, _worth_sharing(sch, [b.name for b in blocks])
    try:
        loops = sch.get_loops(sch.get_block(name))
        outputs = sch.fuse(*loops[:-1])
        for block in blocks[1:]:
            sch.reverse_compute_at(sch.get_block(block.name), outputs)
        reduce_in_lanes(sch, name, target.vector_width)
    except ScheduleError:
        return None
    if share:
        attempt(lambda: sch.parallel(outputs))
    return sch


def _dot_reads(block: Block) -> bool:
    """Whether `block` (one reduction var, innermost in its loops) reads two or more buffers
    (a contraction, not a row reduction), each along that var, its last index, and some
    buffer it reads is used by fewer than DOT_ROWS of the outputs' other indices (so nothing
    would be reused from a register tile)."""
    reduce = [iv.var for iv in block.iter_vars if iv.kind == "reduce"]
    if len(reduce) != 1 or block.iter_vars[-1].var != reduce[0] or len(block.reads) < 2:
        return False
    spatial = {iv.var: iv.dom for iv in block.iter_vars if iv.kind == "spatial"}
    streamed = False
    for region in block.reads:
        last = region.region[-1]
        if index_vars(last) != {reduce[0]}:
            return False
        if any(reduce[0] in index_vars(r) for r in region.region[:-1]):
            return False
        used = set().union(*(index_vars(r) for r in region.region))
        streamed |= math.prod(dom for var, dom in spatial.items() if var not in used) < DOT_ROWS
    return streamed


def _cpu_rows(func: PrimFunc, target: Target) -> Schedule | None:
    """A chain of stages over the same rows, each with one loop along the row (softmax's max,
    exp, sum and norm; layer_norm's mean, variance and norm; a reduce_sum over the last axis
    alone): the rows in parallel (where `_worth_sharing`), every stage computed per row (so
    a row stays in L1 and the stages share one parallel region), each reduction's partial
    sums in vector lanes (rfactor), each other stage vectorized. None when the stages do not
    have that shape or a primitive refuses."""
    names = [b.name for b in all_blocks(func.body)]
    sch = Schedule(func)
    shared = _shared_prefix(sch, names)
    if shared == 0 or any(len(_loops(sch, n)[0]) != shared + 1 for n in names):
        return None
    if len(names) == 1 and _loops(sch, names[0])[1][-1] != "reduce":
        return None  # one elementwise stage: _cpu_simple's
    share = _worth_sharing(sch, names)
    try:
        rows = sch.get_loops(sch.get_block(names[-1]))[:shared]
        outer = sch.fuse(*rows) if len(rows) > 1 else rows[0]
        if share:
            sch.parallel(outer)
        if _row_bytes(sch, names) >= PREFETCH_MIN_ROW_BYTES:
            sch.annotate(outer, PREFETCH, PREFETCH_ROWS)
        for name in reversed(names[:-1]):
            sch.compute_at(sch.get_block(name), outer)
    except ScheduleError:
        return None
    lanes = target.vector_width
    for n, name in enumerate(names):
        _, kinds, _ = _loops(sch, name)
        if kinds[-1] != "reduce":
            attempt(functools.partial(vectorize_last, sch, name))
            continue
        merged = sch.copy()  # the partial sums in the loop of the stage they sum, or as before
        after = names[n - 1] if n else None
        if after and attempt(functools.partial(reduce_in_lanes, merged, name, lanes, after)):
            sch = merged
        else:
            attempt(functools.partial(reduce_in_lanes, sch, name, lanes))
    return sch


def vectorize_last(sch: Schedule, name: str) -> None:
    """Block `name`'s innermost loop vectorized."""
    sch.vectorize(sch.get_loops(sch.get_block(name))[-1])


# Rows of at least this many bytes (of the widest input read along them) have the next row
# prefetched while one runs (hexir/codegen/c_prefetch.py): a row of a page or more starts
# where the hardware prefetcher stopped.
PREFETCH_MIN_ROW_BYTES = 2048
PREFETCH_ROWS = 1  # how far ahead


def _row_bytes(sch: Schedule, names: list[str]) -> int:
    """The bytes of the widest row a stage of the chain reads along its last loop."""
    widest = 0
    for name in names:
        loops, _, block = _loops(sch, name)
        extent = loop_extent(sch, loops[-1])
        for read in block.reads:
            widest = max(widest, extent * itemsize(read.buffer.dtype))
    return widest


# Vectors of partial sums a row reduction keeps in flight (an addition's latency over its
# issue interval on the cores we run on).
CHAINS = 4


def reduce_in_lanes(sch: Schedule, name: str, lanes: int, after: str | None = None) -> None:
    """The block's innermost reduction loop split by the vector lanes, the inner part
    rfactored into vectors of partial results, which a vectorized reduction loop then
    combines in a tree (vector by vector, then the lanes by halves). A row of at least 4 x
    CHAINS vectors keeps CHAINS vectors of partials, added in turn, so that CHAINS additions
    are in flight rather than one chain the length of the row. An extent the lanes do not
    divide (ViT's rows of 197) leaves a guarded last step, which the C backend's loop
    partitioning runs after the vectorized ones.

    `after`: the vectorized stage right before, whose loop runs along the row this one
    reduces (softmax's exp before its sum): its loop split as the reduction's is, and the
    partial sums of each stretch accumulated in the same iteration (`merge`), as the stretch
    is computed, not in a pass of their own."""
    inner = sch.get_loops(sch.get_block(name))[-1]
    extent = loop_extent(sch, inner)
    if extent < 2 * lanes:
        raise ScheduleError(f"a reduction of {extent} does not fill the lanes", "reduce_in_lanes")
    chains = CHAINS if extent >= 4 * CHAINS * lanes else 1
    step, lane = sch.split(inner, [None, chains * lanes])
    partial = sch.rfactor(lane, -1)
    loops, kinds, _ = _loops(sch, sch.get(partial).name)  # type: ignore[union-attr]
    if after is not None:
        stretch, vector = sch.split(sch.get_loops(sch.get_block(after))[-1], [None, chains * lanes])
        sch.merge(stretch, loops[-2])
        sch.vectorize(vector)
        loops, kinds, _ = _loops(sch, sch.get(partial).name)  # type: ignore[union-attr]
    sch.vectorize(loops[-1])
    # zeroed once before the reduction's loops (not where a ragged row's guard refuses it)
    first = kinds.index("reduce") if "reduce" in kinds else len(loops) - 2
    attempt(lambda: sch.decompose_reduction(partial, loops[first]))
    vectorize_last(sch, name)  # the partials, in a tree


def _cpu_simple(func: PrimFunc, target: Target) -> Schedule:
    sch = Schedule(func)
    _inline_into_spatial(sch)
    names = [b.name for b in all_blocks(sch.func.body)]
    share = _worth_sharing(sch, names)
    for name in names:
        sch = _cpu_block(sch, name, target, share)
    return sch


def _inline_into_spatial(sch: Schedule) -> None:
    """Every block whose readers are all spatial (no reduction: an elementwise chain, a
    transpose or a transform and its epilogues), or whose one reader reduces to one element,
    computed inside them, where compute_inline allows: one pass over the data, not one a
    stage."""
    blocks = list(all_blocks(sch.func.body))
    for block in blocks[:-1]:
        readers = [b for b in blocks if any(r.buffer == block.writes[0].buffer for r in b.reads)]
        spatial = all(iv.kind == "spatial" for b in readers for iv in b.iter_vars)
        # A reduction to one element reads each element once: min(x) as -max(-x) in one pass.
        whole = len(readers) == 1 and all(iv.kind == "reduce" for iv in readers[0].iter_vars)
        if readers and (spatial or whole):
            attempt(functools.partial(_inline, sch, block.name))


def _worth_sharing(sch: Schedule, names: list[str]) -> bool:
    """Whether the blocks `names` make enough iterations together to run in parallel."""
    total = sum(
        math.prod(loop_extent(sch, lp) for lp in sch.get_loops(sch.get_block(name)))
        for name in names
    )
    return isinstance(total, Sym) or total >= MIN_PARALLEL_ITERATIONS


def _cpu_block(sch: Schedule, name: str, target: Target, share: bool) -> Schedule:
    loops, kinds, _ = _loops(sch, name)
    if loops and set(kinds) == {"reduce"}:  # to one element: its loops as one row
        for fused in (True, False) if len(loops) > 1 else (False,):
            whole = sch.copy()
            if attempt(lambda: _reduce_whole(whole, name, loops, fused, target)):  # noqa: B023
                return whole
        return sch
    if not loops or "" in kinds or "spatial" not in kinds:
        return sch
    spatial = [lp for lp, k in zip(loops, kinds, strict=True) if k == "spatial"]
    reduce = [lp for lp, k in zip(loops, kinds, strict=True) if k == "reduce"]
    # On copies, so that a refused step also undoes the reorders made for it.
    cased, trial = sch.copy(), sch.copy()
    cases: list[LoopRV] = []

    def vectorize_innermost() -> None:
        if kinds[-1] == "reduce":
            trial.reorder(*spatial[:-1], *reduce, spatial[-1])
        trial.vectorize(spatial[-1])

    window = sch.copy()  # a window reduction along a vector of its innermost spatial loop
    if not reduce and attempt(lambda: cases.extend(_case_loops(cased, name, spatial, target))):
        sch, outer = cased, _enough_jobs(cased, cases, target)
    elif len(reduce) > 1 and attempt(
        lambda: _vector_window(window, name, spatial, reduce, target, share)
    ):
        return window
    elif attempt(vectorize_innermost):
        sch, outer = trial, spatial[:-1]
    else:
        if len(reduce) > 1 and kinds[-len(reduce) :] == ["reduce"] * len(reduce):
            rows = sch.copy()  # a window reduction, on a copy: a refusal leaves sch as it was
            if attempt(lambda: _window_rows(rows, name, spatial, reduce, target, share)):
                return rows
        leading = _leading_spatial(loops, kinds)
        if not reduce:
            tiled = sch.copy()  # a transposing copy, on a copy likewise
            tiles: list[LoopRV] = []
            if attempt(lambda: tiles.extend(_transpose_tiles(tiled, name, spatial))):
                sch, leading = tiled, tiles  # the loops outside the tiles, all spatial
        outer = _enough_jobs(sch, leading, target)
    if outer and share:
        attempt(lambda: sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0]))
    return sch


def _reduce_whole(
    sch: Schedule, name: str, loops: list[LoopRV], fused: bool, target: Target
) -> None:
    """A reduction of a whole tensor to one element (DynamicQuantizeLinear's range) with its
    partial results in lanes (`reduce_in_lanes`) over its loops fused into one row, or (where
    the lanes do not divide that row) over its innermost loop."""
    if fused:
        sch.fuse(*loops)
    reduce_in_lanes(sch, name, target.vector_width)


def case_vars(block: Block) -> set[Var]:
    """The iter vars that `block`'s stored value reads only in the conditions of selects
    (the position in a Winograd tile: `select(u == 0, .., select(u == 1, .., ..))`)."""
    if not isinstance(block.body, BufferStore):
        return set()
    in_conditions: set[Var] = set()
    elsewhere: set[Var] = set()

    def visit(e: Expr) -> None:
        if isinstance(e, Select):
            in_conditions.update(free_vars(e.cond))
            visit(e.then)
            visit(e.else_)
        elif isinstance(e, Var):
            elsewhere.add(e)
        else:
            for child in children(e):
                visit(child)  # type: ignore[arg-type]

    visit(block.body.value)
    return {iv.var for iv in block.iter_vars if iv.var in in_conditions - elsewhere}


def _case_loops(sch: Schedule, name: str, spatial: list[LoopRV], target: Target) -> list[LoopRV]:
    """The block's case loops (`case_vars`) unrolled inside its other loops, around one vector
    of the innermost loop (split by the lanes where they divide it), which is vectorized. The
    loops outside the cases, outermost first."""
    block = sch.get(sch.get_block(name))
    assert isinstance(block, Block)
    cases = case_vars(block)
    loop_of = {iv.var: lp for iv, lp in zip(block.iter_vars, spatial, strict=False)}
    case_loops = [loop_of[v] for v in loop_of if v in cases]
    inner = spatial[-1]
    if not case_loops or inner in case_loops:
        raise ScheduleError("no case split outside the innermost loop", "case_loops")
    others = [lp for lp in spatial[:-1] if lp not in case_loops]
    lanes = target.vector_width
    if loop_extent(sch, inner) % lanes == 0 and loop_extent(sch, inner) > lanes:
        chunks, inner = sch.split(inner, [None, lanes])
        others.append(chunks)
    sch.reorder(*others, *case_loops, inner)
    for loop in case_loops:
        sch.unroll(loop)
    sch.vectorize(inner)
    return others


TRANSPOSE_TILE = 8


def _transpose_tiles(sch: Schedule, name: str, spatial: list[LoopRV]) -> list[LoopRV]:
    """A copy whose innermost loop reads with a stride (a transpose that moves the last
    axis), tiled over that loop and the one its read is unit-stride in, each by its largest
    divisor up to TRANSPOSE_TILE (at least half of it; `_tile_side`), both tiles unrolled:
    straight-line code in which GCC transposes the tile in registers (gpt2-decode's
    12x128x64 -> 12x64x128, one core: 51 -> 24 us; ResNet-50's 7x7x2048 -> 2048x7x7 by
    8 x 7: 116 -> 29 us). The loops outside the tile, outermost first."""
    block = sch.get(sch.get_block(name))
    assert isinstance(block, Block)
    if len(spatial) < 2:
        raise ScheduleError("not a copy of one buffer", "transpose_tiles")
    loop_of = {sch.get(lp).var: lp for lp in spatial}  # type: ignore[union-attr]
    bound = {iv.var: loop_of.get(iv.binding) for iv in block.iter_vars}  # type: ignore[arg-type]
    inner = spatial[-1]
    # The reads of the output's rank along other loops than the innermost: the transposed
    # operand, one alone (its fused epilogues' operands read along the output, or less).
    across = []
    for read in block.reads:
        if len(read.region) != len(spatial):
            continue  # a scalar, or a bias along one axis
        along = [bound[v] for v in index_vars(read.region[-1]) if bound.get(v)]
        if along != [inner]:
            across.append(along)
    read_along = across[0][0] if len(across) == 1 and len(across[0]) == 1 else None
    if read_along is None:
        raise ScheduleError("not a copy of one transposed buffer", "transpose_tiles")
    a, b = (_tile_side(loop_extent(sch, lp)) for lp in (read_along, inner))
    if min(a, b) < TRANSPOSE_TILE // 2:
        raise ScheduleError("extents without a divisor to tile by", "transpose_tiles")
    a0, a1 = sch.split(read_along, [None, a])
    b0, b1 = sch.split(inner, [None, b])
    others = [lp for lp in spatial if lp not in (read_along, inner)]
    sch.reorder(*others, a0, b0, a1, b1)
    sch.unroll(a1)
    sch.unroll(b1)
    return [*others, a0, b0]


def _tile_side(extent: int) -> int:
    """The largest divisor of `extent` up to TRANSPOSE_TILE (7 of 7, 14 and 28); a long
    extent without one (197) takes TRANSPOSE_TILE, its last tile guarded (the C backend
    splits it off)."""
    side = max(d for d in range(1, TRANSPOSE_TILE + 1) if extent % d == 0)
    return TRANSPOSE_TILE if side < TRANSPOSE_TILE // 2 and extent >= 4 * TRANSPOSE_TILE else side


def _enough_jobs(sch: Schedule, loops: list[LoopRV], target: Target) -> list[LoopRV]:
    """The fewest outer `loops` whose iterations give every core several jobs (all of them
    if none do): the loops inside stay nested, their indices free of the fused index's
    divisions (gpt2-decode's transpose 12x128x64 -> 12x64x128 fused whole: 177 us in place;
    per batch: 55 us)."""
    from hexir.search.sketch_cpu import DEFAULT_JOBS_PER_CORE

    want, jobs = DEFAULT_JOBS_PER_CORE * target.num_cores, 1
    for n, loop in enumerate(loops):
        jobs *= loop_extent(sch, loop)
        if isinstance(jobs, Sym) or jobs >= want:  # a symbolic size is taken as many
            return loops[: n + 1]
    return loops


MAX_UNROLLED_WINDOW = 16


def _vector_window(
    sch: Schedule,
    name: str,
    spatial: list[LoopRV],
    reduce: list[LoopRV],
    target: Target,
    share: bool,
) -> None:
    """A window reduction whose innermost spatial loop reads and writes with unit stride (an
    NHWC pool, along its channels): each output pixel's vector of them accumulated in
    registers (a local cache at the pixel, its init split off) over the window, unrolled
    when small, the vector loop inside it; the pixels' rows in parallel (when `share`), each
    row's pixels a serial loop, free of the divisions of a fused index. Vectorized whole
    instead, the accumulator was the output in memory and every window element redid those
    divisions (a 3x3 max pool of stride 2 on 112x112x64: 0.059 -> 0.033 ms; in NCHW, where
    its stride keeps it from vectorizing, 0.156)."""
    if len(spatial) < 2:
        raise ScheduleError("no pixel loop outside the vector loop", "vector_window")
    block = sch.get_block(name)
    acc = sch.cache_write(block, 0, "local")
    sch.reorder(*spatial[:-1], *reduce, spatial[-1])
    sch.vectorize(spatial[-1])
    sch.reverse_compute_at(acc, spatial[-2])
    sch.decompose_reduction(block, reduce[0])  # its init keeps the vector loop's kind
    sch.vectorize(sch.get_loops(acc)[-1])
    _unroll_small_window(sch, reduce)
    outer = _enough_jobs(sch, spatial[:-2], target) if share else []
    if outer:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def _unroll_small_window(sch: Schedule, reduce: list[LoopRV]) -> None:
    """A window's loops unrolled where it has at most MAX_UNROLLED_WINDOW elements."""
    if math.prod(loop_extent(sch, lp) for lp in reduce) <= MAX_UNROLLED_WINDOW:
        for loop in reduce:
            sch.unroll(loop)


def _window_rows(
    sch: Schedule,
    name: str,
    spatial: list[LoopRV],
    reduce: list[LoopRV],
    target: Target,
    share: bool,
) -> None:
    """A window reduction (a pool): the outer spatial loops in parallel (when `share`), each
    output of a row accumulated in a register (a local cache, its init split off) over the
    window, unrolled when small. Fused whole into one parallel loop, every window element
    would redo the divisions of the fused index and load and store the output."""
    from hexir.search.sketch_cpu import DEFAULT_JOBS_PER_CORE

    outer = spatial[:-1]
    jobs = math.prod(loop_extent(sch, lp) for lp in outer)
    if share and jobs < DEFAULT_JOBS_PER_CORE * target.num_cores:
        raise ScheduleError("too few rows to share among the cores", "window_rows")
    block = sch.get_block(name)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, spatial[-1])
    sch.decompose_reduction(block, reduce[0])
    _unroll_small_window(sch, reduce)
    if share:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


# -- GPU --------------------------------------------------------------------------------------


def _gpu_schedule(func: PrimFunc, target: Target) -> Schedule:
    from hexir.codegen.gpu_verify import verify_gpu
    from hexir.schedule.compact import compact_buffers
    from hexir.schedule.handwritten import gpu_schedule
    from hexir.schedule.handwritten_attention import flash_schedule

    flash = flash_schedule(func, target)  # an attention kernel: online softmax, key tiles
    if flash is not None:
        try:
            verify_gpu(compact_buffers(flash.func), target)
            return flash
        except HexirError:
            pass
    # The hand-written reference schedule, where it applies and fits the target; not for
    # convolutions: its tiles (channels x one image row) ran ResNet-18 at 5.45 ms on an H200
    # where the plain binding below ran it at 2.0 ms (ResNet-50 10.3 against 3.6; MobileNetV2
    # 1.23 against 1.48 ms: its depthwise and wide 1x1 convs gain, the rest lose).
    if not _convolution(func):
        try:
            reference = gpu_schedule(func)
            verify_gpu(compact_buffers(reference.func), target)
            return reference
        except HexirError:
            pass
    sch = Schedule(func)
    outputs = {b.name for b in func.outputs}
    for block in list(all_blocks(func.body)):
        if not any(w.buffer.name in outputs for w in block.writes):
            attempt(functools.partial(_inline, sch, block.name))
    stages = [b.name for b in all_blocks(sch.func.body)]
    shared = _shared_prefix(sch, stages)
    if shared == 0:
        return sch
    bound = sch.copy()
    if not attempt(lambda: _bind_under_last(bound, stages, shared)):
        return sch
    try:
        verify_gpu(compact_buffers(bound.func), target)
    except HexirError:
        return sch
    return bound


def _convolution(func: PrimFunc) -> bool:
    """A reduction over four or more spatial axes: batch, channels and an image's rows and
    columns."""
    return any(
        any(iv.kind == "reduce" for iv in b.iter_vars)
        and sum(iv.kind == "spatial" for iv in b.iter_vars) >= 4
        for b in all_blocks(func.body)
    )


def _inline(sch: Schedule, name: str) -> None:
    sch.compute_inline(sch.get_block(name))


def _bind_under_last(sch: Schedule, stages: list[str], shared: int) -> None:
    """Bind the last stage's first `shared` loops to blocks and threads, and compute every
    earlier stage under its thread loop, so that each thread makes what it reads."""
    loops, _, _ = _loops(sch, stages[-1])
    outer = loops[:shared]
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    block_loop, thread_loop = sch.split(fused, [None, GPU_THREADS])
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    for name in reversed(stages[:-1]):
        sch.compute_at(sch.get_block(name), thread_loop)


def _shared_prefix(sch: Schedule, stages: list[str]) -> int:
    """How many leading spatial loops all stages have, with the same extents."""
    extents = []
    for name in stages:
        loops, kinds, _ = _loops(sch, name)
        extents.append([loop_extent(sch, lp) for lp in _leading_spatial(loops, kinds)])
    n = min((len(e) for e in extents), default=0)
    while n and any(e[:n] != extents[0][:n] for e in extents):
        n -= 1
    return n
