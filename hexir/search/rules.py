"""Sketch rules shared by the CPU and GPU spaces: auto-inline, and sampling helpers.

A rule takes a Schedule (whose `rng` draws every decision), finds the blocks it applies to by
their properties (hexir/search/analysis.py), and applies primitives. A primitive that refuses
leaves the schedule as it was (DESIGN.md §3), so an optional step is tried and skipped; a step
the sketch cannot do without lets the ScheduleError through, and the space drops the sketch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from hexir.codegen.c_lower import MAX_REGISTER_VECTORS
from hexir.errors import ScheduleError
from hexir.ir.tir import (
    AUTO_UNROLL_KEY,
    Binary,
    Block,
    BufferLoad,
    BufferStore,
    For,
    PrimFunc,
    Select,
)
from hexir.ir.visit import free_vars
from hexir.runtime.target import Target
from hexir.runtime.tiling import MAX_UNROLLED_ROWS
from hexir.schedule import INLINE, ROOT, BlockRV, LoopRV, Schedule
from hexir.schedule.common import index_vars
from hexir.search.analysis import (
    block_named,
    consumers,
    has_reuse,
    is_elementwise,
    leaf_blocks,
    producers,
    writes_intermediate,
)

UNROLL_STEPS = (0, 16, 64, 512)


def attempt(fn: Callable[..., object], *args: object) -> bool:
    """Apply one optional primitive; False (and nothing changed) where it is refused."""
    try:
        fn(*args)
    except ScheduleError:
        return False
    return True


def auto_inline(sch: Schedule, keep_padding: bool = False, keep: Collection[str] = ()) -> None:
    """Inline every elementwise producer of an intermediate into its consumers, then fold
    every elementwise consumer into an elementwise producer, until neither applies. With
    `keep_padding` (the CPU), a zero border feeding a contraction stays a stage of its own
    (conv2d's `conv2d_pad`): inlined, its guard would run at every multiply-add (and a copy
    split by phase would be read with a stride again). The blocks named in `keep` stay (a
    tensor-core contraction's shared operand tiles, which its fragments need)."""
    while _inline_one(sch, keep_padding, keep):
        pass


def _inline_one(sch: Schedule, keep_padding: bool, keep: Collection[str]) -> bool:
    """One inline step, if any applies (the block list is stale after it)."""
    func = sch.func
    for block in leaf_blocks(func):
        if keep_padding and _pads_a_contraction(func, block):
            continue
        if block.name in keep:
            continue
        if is_elementwise(func, block) and writes_intermediate(func, block):
            if attempt(sch.compute_inline, sch.get_block(block.name)):
                return True
    for block in leaf_blocks(func):
        feeders = producers(func, block)
        if is_elementwise(func, block) and len(feeders) == 1:
            if is_elementwise(func, feeders[0]):
                if attempt(sch.reverse_compute_inline, sch.get_block(block.name)):
                    return True
    return False


def _pads_a_contraction(func: PrimFunc, block: Block) -> bool:
    """A guarded copy (a select of a load, as padding stores), a copy into more axes than it
    reads (a depthwise conv's columns split by phase) or of every s-th element (a strided 1x1
    conv's pixels), read by a block with reuse."""
    body = block.body
    if not isinstance(body, BufferStore):
        return False
    load = body.value
    relaid = isinstance(load, BufferLoad) and (
        len(load.indices) < len(body.indices)
        or any(isinstance(i, Binary) and i.op == "*" for i in load.indices)
    )
    if not isinstance(load, Select) and not relaid:
        return False
    return any(has_reuse(c) for c in consumers(func, block))


def inline_epilogue(sch: Schedule, writer: BlockRV) -> None:
    """Fold the elementwise consumers of what `writer` stores into it (bias, activation)."""
    while True:
        name = sch.describe(writer)
        block = block_named(sch.func, name)
        out = {w.buffer for w in block.writes}
        folded = False
        for other in leaf_blocks(sch.func):
            if other.name != name and is_elementwise(sch.func, other):
                if out & {r.buffer for r in other.reads}:
                    folded = attempt(sch.reverse_compute_inline, sch.get_block(other.name))
                    if folded:
                        break
        if not folded:
            return


def sample_location(
    sch: Schedule, block: BlockRV, within: Collection[LoopRV] | None = None, inline: bool = True
) -> None:
    """Move `block` to a sampled compute location among those where `compute_at` is legal:
    ROOT, INLINE (unless `inline` is False), or a loop (one of `within`, when given)."""
    from hexir.schedule import compute_location_candidates

    node = sch.get(block)
    assert isinstance(node, Block)
    candidates = compute_location_candidates(sch.func, node)
    loops = None if within is None else {loop_of(sch, lp).var for lp in within}
    order = [
        n
        for n, where in enumerate(candidates)
        if (loops is None or is_location(where) or where in loops)
        and (inline or where is not INLINE)
    ]
    sch.rng.shuffle(order)
    # Trying candidates in random order until one is legal draws uniformly among the legal
    # ones, at the cost of a trial or two rather than one per candidate.
    for n in order:
        if _legal_location(sch, block, n):
            sch.compute_at(block, sch.sample_compute_location(block, decision=n))
            return
    raise ScheduleError(f"no legal compute location for @{node.name}", "sample_location")


def _legal_location(sch: Schedule, block: BlockRV, index: int) -> bool:
    trial = sch.copy()
    try:
        trial.compute_at(block, trial.sample_compute_location(block, decision=index))
    except ScheduleError:
        return False
    return True


def annotate_unroll(sch: Schedule, loop: LoopRV) -> None:
    """A sampled `pragma_auto_unroll_max_step` on `loop`: how far code inside may unroll."""
    step = sch.sample_categorical(list(UNROLL_STEPS), [1.0] * len(UNROLL_STEPS))
    sch.annotate(loop, AUTO_UNROLL_KEY, step)


def split_all(
    sch: Schedule,
    loops: Sequence[LoopRV],
    levels: int,
    inner: Sequence[int],
    decisions: Sequence[Sequence[int]] | None = None,
) -> list[list[LoopRV]]:
    """Each loop split into `levels` loops by a sampled perfect tile (or the given one); a
    loop of extent 1 is left whole (a list of itself)."""
    out = []
    for n, (loop, limit) in enumerate(zip(loops, inner, strict=True)):
        if loop_of(sch, loop).extent == 1:
            out.append([loop])
            continue
        decision = None if decisions is None else decisions[n]
        factors = sch.sample_perfect_tile(
            loop, n=levels, max_innermost_factor=limit, decision=decision
        )
        out.append(sch.split(loop, factors))
    return out


def split_inner(sch: Schedule, loop: LoopRV, low: int, high: int) -> tuple[LoopRV, LoopRV] | None:
    """Split `loop` in two with a sampled inner extent in [low, high] that divides it (the
    decision is drawn here, so that it is one the rule can use); None if none divides it."""
    from hexir.schedule.sampling import divisors

    extent = loop_of(sch, loop).extent
    choices = [d for d in divisors(extent) if low <= d <= high]
    if not choices:
        return None
    inner = sch.rng.choice(choices)
    factors = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=high,
                                      decision=[extent // inner, inner])  # fmt: skip
    outer_loop, inner_loop = sch.split(loop, factors)
    return outer_loop, inner_loop


def fuse_or_one(sch: Schedule, loops: Sequence[LoopRV]) -> LoopRV:
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def is_location(value: object) -> bool:
    return value is ROOT or value is INLINE


def loop_of(sch: Schedule, rv: LoopRV) -> For:
    node = sch.get(rv)
    assert isinstance(node, For)
    return node


def writeback_tile(sch: Schedule, writeback: BlockRV, loops: list[LoopRV], target: Target) -> None:
    """The write-back of the accumulator: as a register tile when it stores along its last
    loop; otherwise (the accumulator is transposed, so the store is strided) its outer loops
    unrolled when small, so that the accumulator's rows are read at constant offsets, and its
    last loop, along which the accumulator is contiguous, kept a loop: unrolled whole, a
    fused epilogue (bias, relu) made 8 x 32 statements that GCC compiled slowly (ResNet-50's
    stem with its bias and relu 1.44 -> 0.96 ms, the bare conv's time; its 3x3 convs with
    theirs 0.95-0.94x; the bare convs unchanged)."""
    if not loops:
        return
    node = sch.get(writeback)
    assert isinstance(node, Block)
    bindings = {iv.var: free_vars(iv.binding) for iv in node.iter_vars}
    last = set().union(*(bindings.get(v, {v}) for v in index_vars(node.writes[0].region[-1])))
    if loop_of(sch, loops[-1]).var in last:
        register_tile_loops(sch, loops, limit=16)
        return
    extents = [loop_of(sch, lp).extent for lp in loops]
    # Larger than the register file, the accumulator stays in memory: unrolling buys nothing.
    if math.prod(extents) <= MAX_REGISTER_VECTORS * target.vector_width:
        for loop, extent in zip(loops[:-1], extents[:-1], strict=True):
            if extent > 1:
                attempt(sch.unroll, loop)


def register_tile_loops(sch: Schedule, loops: list[LoopRV], limit: int = MAX_UNROLLED_ROWS) -> None:
    """Columns vectorized, rows unrolled: the tile then lives in vector registers."""
    if not loops:
        return
    attempt(sch.vectorize, loops[-1])
    for loop in loops[:-1]:
        if 1 < loop_of(sch, loop).extent <= limit:
            attempt(sch.unroll, loop)
