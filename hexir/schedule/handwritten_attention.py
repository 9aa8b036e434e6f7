"""The schedules of an `attention` op's kernel (hexir/ops/attention.py). On the CPU its stages
computed per job of query rows, so the scores of those rows against every key stay in cache
and no kernel writes the scores of all queries; on the GPU the flash nest (`flash_schedule`,
below, for paged_attention too): online softmax over tiles of keys in shared memory, no
scores of all keys at all.

    sch = attention_schedule(lower_op(attention_op), Target("cpu"))    # None: not attention
    sch = flash_schedule(lower_op(attention_op), Target("cuda"))       # None: not attention

A job is JOB_ROWS query rows of one batch (fewer where there are fewer; all jobs in
parallel). Within it:
- the scores q·kt as register tiles of TILE_ROWS rows by PANEL columns (vectors) over the whole
  head dimension, each column panel of kt copied once per job into a contiguous buffer (kt's
  rows are a whole sequence apart);
- the row max and the row sum of exp accumulated in vector lanes (the row reductions of the
  default schedule), the exp vectorized;
- the probabilities times v as register tiles of TILE_ROWS rows by PANEL columns over all
  keys; then the division by the row sum.
Scores and probabilities take JOB_ROWS x T floats each (32 x 1024: 128 KB), per thread (the C
printer puts buffers that large in a thread's heap scratch, not on its stack).
On this Intel Xeon (2 cores, AVX-512), 12 heads of causal attention with GPT-2's mask, against the
batch_matmul, add, softmax and batch_matmul kernels (`python benchmarks/attention_cpu.py`):
0.86 against 0.81 ms at 256 x 256, 12.8 against 17.4 at 1024, 58 against 75 at 2048. The two
contractions run at those kernels' speed; what the one kernel saves is the passes over the
scores. Causal attention computes every score and then hides half (loop extents are
numbers, so a job cannot stop at its diagonal), where a flash kernel skips the hidden half.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hexir.errors import ScheduleError
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target
from hexir.schedule.common import all_blocks, attempt, loop_extent
from hexir.schedule.flash_match import BLOCKS, PAGED, PAGED_NEW, match
from hexir.schedule.flash_nest import Attention, Tiles, shared_bytes
from hexir.schedule.schedule import Schedule
from hexir.schedule.trace import ExprRV

__all__ = [
    "attention_schedule",
    "FlashChoices",
    "flash",
    "flash_choices",
    "flash_schedule",
    "flash_tiles",
    "is_attention",
    "paged_attention_schedule",
]

JOB_ROWS = 32
TILE_ROWS = 8

PANEL = 32  # columns: two 16-lane vectors; TILE_ROWS x PANEL accumulators in 16 registers

# The stages hexir/ops/attention.py lowers to, last first (the order compute_at takes them).
STAGES = ("values", "sum", "exp", "max", "scores")


def attention_schedule(func: PrimFunc, target: Target) -> Schedule | None:
    """The schedule of the module docstring for an attention kernel (its elementwise
    producers, fused into it, inlined where they are read); None for another kernel or where
    a primitive refuses (the default schedule then takes it as any kernel)."""
    names = [b.name for b in all_blocks(func.body)]
    stages = {f"attention_{s}" for s in (*STAGES, "out")}
    if not stages <= set(names):
        return None
    sch = Schedule(func, target=target)
    try:
        for name in names:  # elementwise producers fused into the kernel: into their readers
            if name not in stages:
                sch.compute_inline(sch.get_block(name))
        _schedule(sch, target)
    except ScheduleError:
        return None
    return sch


def _schedule(sch: Schedule, target: Target) -> None:
    from hexir.runtime.default_schedule import reduce_in_lanes, vectorize_last

    for name in ("attention_scores", "attention_values"):
        sch.cache_write(sch.get_block(name), 0, "local")  # the register tiles
    batch, rows, _ = sch.get_loops(sch.get_block("attention_out"))
    outer, _ = sch.split(rows, [None, min(JOB_ROWS, loop_extent(sch, rows))])
    job = sch.fuse(batch, outer)
    sch.parallel(job)
    for stage in STAGES:
        if stage in ("values", "scores"):
            sch.compute_at(sch.get_block(f"attention_{stage}_local"), job)
        sch.compute_at(sch.get_block(f"attention_{stage}"), job)
    # Each stage's speed-ups on their own: one a ragged tail refuses leaves the stage plainer
    # (a primitive that raises changes nothing), the others still apply.
    attempt(lambda: _register_tiles(sch, "attention_scores", panel_first=True))
    attempt(lambda: _register_tiles(sch, "attention_values", panel_first=False))
    for name in ("attention_max", "attention_sum"):
        attempt(lambda name=name: reduce_in_lanes(sch, name, target.vector_width))
    for name in ("attention_exp", "attention_out"):
        attempt(functools.partial(vectorize_last, sch, name))


def _register_tiles(sch: Schedule, name: str, panel_first: bool) -> None:
    """Block `name` (rows, columns, reduction, under the job) as TILE_ROWS x PANEL tiles
    accumulated in registers over the whole reduction. `panel_first`: the column panels
    outside the row tiles, each panel of the second operand copied once for all of them."""
    block = sch.get_block(name)
    loops = sch.get_loops(block)
    if len(loops) < 3:  # one query row: its loop is gone
        raise ScheduleError("no loops of rows, columns and reduction to tile", name)
    rows, cols, red = loops[-3:]
    if loop_extent(sch, cols) % PANEL:
        raise ScheduleError(f"{loop_extent(sch, cols)} columns are not panels of {PANEL}", name)
    row_tile, row = sch.split(rows, [None, min(TILE_ROWS, loop_extent(sch, rows))])
    panel, col = sch.split(cols, [None, PANEL])
    if panel_first:
        sch.reorder(panel, row_tile, red, row, col)
        copy = sch.cache_read(block, 1, "global")
        sch.compute_at(copy, panel)
        sch.vectorize(sch.get_loops(copy)[-1])
    else:
        sch.reorder(row_tile, panel, red, row, col)
    write_back = sch.get_block(f"{name}_local")
    sch.reverse_compute_at(write_back, row_tile if panel_first else panel)
    init = sch.decompose_reduction(block, red)
    sch.unroll(row)
    sch.vectorize(col)
    for stage in (init, write_back):
        tile_rows, tile_cols = sch.get_loops(stage)[-2:]
        sch.unroll(tile_rows)
        sch.vectorize(tile_cols)


# The stages of a paged_attention kernel (hexir/ops/attention.py), last first; the current
# token's (new_score, max_new, new_exp) where it has one.
PAGED_STAGES = ("values", "sum", "exp", "new_exp", "max_new", "new_score", "max", "scores")


def paged_attention_schedule(func: PrimFunc, target: Target) -> Schedule | None:
    """A paged_attention kernel's CPU schedule: one job per (sequence, head), all in
    parallel, every stage computed in it over the sequence's table row: each score a dot
    product in vector lanes along head_dim (a key's row is contiguous in its page), the exps
    vectorized along a page's slots (the row max and sum stay plain loops: a few thousand
    elements at most), and the values
    accumulated in vectors along head_dim, slot by slot (a value's row is contiguous too).
    None for another kernel or where a primitive refuses."""
    names = [b.name for b in all_blocks(func.body)]
    if not {"paged_scores", "paged_values", "paged_out"} <= set(names):
        return None
    stages = [s for s in PAGED_STAGES if f"paged_{s}" in names]
    sch = Schedule(func, target=target)
    try:
        for name in names:  # elementwise producers fused into the kernel: into their readers
            if name.removeprefix("paged_") not in (*stages, "out"):
                sch.compute_inline(sch.get_block(name))
        _paged(sch, stages, target)
    except ScheduleError:
        return None
    return sch


def _paged(sch: Schedule, stages: list[str], target: Target) -> None:
    from hexir.runtime.default_schedule import reduce_in_lanes, vectorize_last

    lanes = target.vector_width
    batch, heads, _ = sch.get_loops(sch.get_block("paged_out"))
    job = sch.fuse(batch, heads)
    sch.parallel(job)
    for stage in stages:
        sch.compute_at(sch.get_block(f"paged_{stage}"), job)
    # values: the slots outside, head_dim inside in vectors
    width, pages, slots = sch.get_loops(sch.get_block("paged_values"))[-3:]
    sch.reorder(pages, slots, width)
    init = sch.decompose_reduction(sch.get_block("paged_values"), pages)
    sch.vectorize(width)
    sch.vectorize(sch.get_loops(init)[-1])
    for name in ("paged_scores", "paged_new_score"):
        if name.removeprefix("paged_") in stages:
            attempt(lambda name=name: reduce_in_lanes(sch, name, lanes))
    for name in ("paged_exp", "paged_out"):
        attempt(functools.partial(vectorize_last, sch, name))


# --- GPU: the flash nest (hexir/schedule/flash.py) ------------------------------------------


@dataclass(frozen=True)
class FlashChoices:
    """The tiles a trace chooses from (sample_categorical): query rows a thread block, keys
    a shared tile, threads (lanes) a query row."""

    queries: tuple[int, ...]
    keys: tuple[int, ...]
    lanes: tuple[int, ...]


# Attention of many queries. The default for a head dimension of 64 is 64 x 64 with 2 lanes:
# 128 threads, keys and values 33 KB of shared memory (rows padded), each lane 32 scores and
# 64 accumulators in registers.
ROWS = FlashChoices((16, 32, 64, 128), (16, 32, 64, 128), (1, 2, 4, 8))
# One query a batch (a paged_attention decode step, an attention of one query): a block is
# one row of lanes; the default 64 keys over 32 lanes, one warp (its reductions shuffles).
ONE_ROW = FlashChoices((1,), (16, 32, 64, 128), (8, 16, 32, 64))
BANKS = 32
STATIC_SHARED = 48 * 1024
VALUES = ("attention_values", "paged_values")  # the block flash_attention is given


def is_attention(func: PrimFunc) -> bool:
    """Whether `func` is an attention or paged_attention op's kernel that the flash nest
    takes: the op's stages, and elementwise producers that inline into them."""
    names = {b.name for b in all_blocks(func.body)}
    if not (BLOCKS <= names or PAGED <= names):
        return False
    sch = Schedule(func)
    try:
        _inline_producers(sch)
        match(sch.func)
    except ScheduleError:
        return False
    return True


def flash_choices(a: Attention) -> FlashChoices:
    """The tiles a trace of attention `a` chooses from: one row for one query."""
    return ONE_ROW if a.queries == 1 else ROWS


def flash_tiles(a: Attention, target: Target) -> Tiles:
    """The default tiles of attention `a`: 64 query rows (fewer for fewer queries) of two
    lanes, or one row of 32 lanes; and the largest tile of at most 64 keys whose keys and
    values fit the target's static shared memory."""
    one = a.queries == 1
    queries = 1 if one else next(q for q in ROWS.queries if q >= min(a.queries, 64))
    lanes = 32 if one else 2
    limit = target.max_shared_memory_per_block or STATIC_SHARED
    fits = [
        k
        for k in flash_choices(a).keys
        if lanes <= k <= 64 and shared_bytes(a, Tiles(queries, k, lanes)) <= limit
    ]
    return Tiles(queries, max(fits, default=64), lanes)


def flash_schedule(func: PrimFunc, target: Target, tiles: Tiles | None = None) -> Schedule | None:
    """The flash schedule of an attention or paged_attention kernel with `tiles` (the
    default: `flash_tiles`); None for another kernel or where the tiles do not fit."""
    sch = Schedule(func, target=target)
    try:
        _inline_producers(sch)
        return flash(sch, tiles or flash_tiles(match(sch.func), target))
    except ScheduleError:
        return None


def _inline_producers(sch: Schedule) -> None:
    """Elementwise producers fused into the kernel (a scaled query): into their readers."""
    for block in list(all_blocks(sch.func.body)):
        if block.name not in BLOCKS | PAGED_NEW:
            sch.compute_inline(sch.get_block(block.name))


def flash(sch: Schedule, tiles: Tiles | None = None) -> Schedule:
    """`sch` (an attention or paged_attention kernel) scheduled as the flash nest, its
    elementwise producers inlined first, its tiles three draws of the trace (`flash_choices`):
    decided as `tiles`, or drawn from `sch.rng` (the search). The shared tiles' rows are
    padded to an odd stride, so the lanes of a row reading rows side by side (values; keys
    kept by row) read them in different banks."""
    _inline_producers(sch)
    choices = flash_choices(match(sch.func))

    def draw(what: str) -> ExprRV:
        candidates = getattr(choices, what)
        value = None if tiles is None else getattr(tiles, what)
        if value is not None and value not in candidates:
            raise ScheduleError(f"{what} {value} is not one of {candidates}", "flash")
        decision = None if value is None else candidates.index(value)
        probs = [1 / len(candidates)] * len(candidates)
        return sch.sample_categorical(list(candidates), probs, decision=decision)

    names = {b.name for b in all_blocks(sch.func.body)}
    block = sch.get_block(next(name for name in VALUES if name in names))
    queries, keys = draw("queries"), draw("keys")
    for fetch in sch.flash_attention(block, queries, keys, draw("lanes")):
        sch.storage_align(fetch, 0, axis=0, factor=BANKS, offset=1)
    return sch
