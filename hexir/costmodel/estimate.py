"""An analytic estimate of a kernel's time on the CPU: what the trees cannot work out from
loop and access counts alone, given to them as features (features.py) and as the prior
XGBModel starts from.

    ctx = context(kernel, target)                  # kernel = walk_kernel(func)
    est = store_estimate(store, cache_traffic(store), ctx)
    est.cycles, est.lanes, est.accumulators        # one store; kernel_times pools them

Per store it follows what the C backend and GCC make of the loops, innermost first:
- its vector loop: the vectorized loop printed as SIMD (`loop_lanes` lanes, the rest a scalar
  tail), or, where there is none, the loop GCC vectorizes itself (before it unrolls): the
  innermost loop when every access is unit-stride or invariant along it, or the loop around
  it where that is a reduction loop it holds alone (outer-loop vectorization); not where the
  output is a heap buffer GCC cannot tell from the inputs (ALIAS_CHECKS);
- the straight-line body: unit loops, `unrolled` loops, the vector loop, and the serial loops
  GCC unrolls completely (a few iterations of a small body) or the search's unroll annotation
  covers;
- the instructions per run of the body (vector arithmetic, one load per distinct vector or
  scalar it reads, the accumulator's loads and stores unless it stays in registers), issued
  on FMA_PIPES arithmetic and LOAD_PORTS load pipes; a reduction's dependent updates wait
  FMA_LATENCY each in registers, MEMORY_LATENCY through memory, runs of the body overlapping
  as far as the reorder window reaches unless the loop around carries the sums;
- the bytes it moves into each cache level (locality.cache_traffic) over that level's
  bandwidth, and the outermost parallel loop's iterations shared over the cores.

The store's time is the largest of those bounds. A kernel's is the sum over its stores plus
FORK_CYCLES per parallel region entered, and `kernel_times` divides each part by the kernel's
ideal time (its float operations at peak, or its parameters' bytes at memory bandwidth), so
that the features read as efficiencies and carry over between workloads of any size. The
constants are the development machines' (PERFORMANCE.md) and GCC's; the estimate only has to
order schedules, and the trees learn what it misses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from hexir.codegen.c import CPrinter
from hexir.codegen.c_lower import (
    AUTO_UNROLL_MAX_NODES,
    MAX_REGISTER_VECTORS,
    chunk_lanes,
    loop_lanes,
)
from hexir.costmodel.locality import CACHE_LEVELS, flat_step, shared_depth, window
from hexir.costmodel.walk import OP_KINDS, Access, KernelWalk, Store
from hexir.ir.dtype import itemsize
from hexir.ir.tir import Buffer, For
from hexir.runtime.target import Target

# One core of the development machines (PERFORMANCE.md, Zen 5): vector instructions issued
# per cycle on the FMA pipes, loads and stores per cycle, instructions per cycle in all, the
# latency of a dependent FMA in registers and through a store and a load.
FMA_PIPES = 2
LOAD_PORTS = 2
STORE_PORTS = 1
ISSUE_WIDTH = 4
FMA_LATENCY = 4
MEMORY_LATENCY = 10
# Bytes per cycle into each level of locality.CACHE_LEVELS (registers from L1, L1 from L2,
# L2 from L3, L3 from DRAM) per core; DRAM's is shared: both cores draw DRAM_SHARED times one.
LEVEL_BANDWIDTH = (128.0, 64.0, 32.0, 8.0)
DRAM_SHARED = 1.5
# Starting and joining the threads of a parallel region (OpenMP, threads waiting warm).
FORK_CYCLES = 2000
# GCC -O3 unrolls an innermost loop of at most this many iterations and instructions
# completely (its max-completely-peel-times and max-completely-peeled-insns).
COMPLETE_UNROLL_TIMES = 16
COMPLETE_UNROLL_INSNS = 200
# A loop GCC vectorizes on its own runs at least this many iterations.
AUTO_VECTOR_MIN_EXTENT = 8
# Accumulator vectors GCC keeps in registers across a reduction loop (of 32, a few stay free
# for the loaded operands).
ACCUMULATOR_REGISTERS = MAX_REGISTER_VECTORS - 4
# Where a store writes a heap buffer, GCC vectorizes only if it can check at run time that it
# overlaps no buffer it reads: at most this many pairs (its vect-max-version-for-alias-checks).
ALIAS_CHECKS = 10
# Instructions in flight (Zen 5's reorder buffer): independent runs of a body overlap so far.
REORDER_WINDOW = 448
# IR nodes of one access index and one operation, to size a body against the auto-unroll
# limit (c_lower.AUTO_UNROLL_MAX_NODES).
NODES_PER_INDEX = 3
NODES_PER_OP = 2

# Vector instructions per evaluation: an FMA is counted in float_mul (its product) alone.
_VECTOR_OPS = [
    OP_KINDS.index(k) for k in ("float_add", "float_mul", "float_minmax", "compare_select", "cast")
]
_MATH, _DIV = OP_KINDS.index("float_math"), OP_KINDS.index("float_div")
_CAST = OP_KINDS.index("cast")
# Instructions of one vector math call (exp, tanh: a polynomial, c_math.py) and one division.
MATH_INSTRUCTIONS = 10
DIV_INSTRUCTIONS = 4

# The kernel columns `kernel_times` returns, each cycles over the kernel's ideal cycles: the
# stores' issue, chain and loop bounds, their bytes into each cache level (`time.l1`: from L2
# into L1) over its bandwidth, starting parallel regions, and the estimate of the whole.
_LEVELS = tuple(name for name, _ in CACHE_LEVELS)
TIME_COLUMNS = tuple(f"time.{n}" for n in ("issue", "chain", "loop", *_LEVELS, "fork", "total"))
# The store columns: iterations per instruction of the vector loop (its lanes, less for a
# scalar tail; 1: scalar); whether it is the printed SIMD or GCC's; iterations of the
# straight-line body; vectors of output the body updates and whether they stay in registers;
# loads per vector arithmetic instruction; the store's share of the kernel's time.
STORE_COLUMNS = (
    "est.lanes", "est.simd.explicit", "est.simd.compiler", "est.body", "est.accumulators",
    "est.in_registers", "est.loads_per_op", "est.share",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Context:
    """What a store's estimate needs of its kernel: the target's lanes and cores, the local
    buffers codegen keeps in registers and the allocations it puts on the heap (pointers GCC
    cannot tell apart from the others; a stack array or a `restrict` parameter it can), and
    whether every buffer holds 4-byte elements (then a store without casts computes in 4-byte
    values, and its loop's lanes need no walk of the loop's body)."""

    vector_bytes: int
    lanes: int
    cores: int
    registers: frozenset[Buffer]
    heap: frozenset[Buffer]
    narrow: bool


class StoreEstimate(NamedTuple):
    """Cycles of one store by bound (issue, chain, loop; bytes per cache level over its
    bandwidth; all shared over the cores) and what they were worked out from."""

    issue: float
    chain: float
    loop: float
    memory: tuple[float, ...]
    lanes: float
    explicit: bool
    compiler: bool
    body: float
    accumulators: float
    in_registers: bool
    loads_per_op: float
    fork: For | None  # the parallel loop it runs under (None: serial)
    entries: float  # times that parallel region starts

    @property
    def cycles(self) -> float:
        return max(self.issue, self.chain, *self.memory)


def context(kernel: KernelWalk, target: Target) -> Context:
    """The Context of one walked kernel: each allocation sized as compact_buffers will (its
    window under the loops all its uses share) and placed as the C printer places it."""
    lanes = max(target.vector_width, 1)
    registers, heap = set(), set()
    for buf in kernel.allocations:
        uses = [(s, a) for s in kernel.stores for a in s.accesses if a.buffer == buf]
        if not uses:
            continue
        shared = shared_depth([s for s, _ in uses])
        size = max(window(a, s.extents, shared) for s, a in uses)
        limit = CPrinter.small_global_bytes if buf.scope == "global" else CPrinter.stack_limit_bytes
        if size * itemsize(buf.dtype) > limit:
            heap.add(buf)
        inner = all(
            s.loops[d].kind in ("unrolled", "vectorized") for s, a in uses for d in a.moves
            if d >= shared
        )  # fmt: skip
        if buf.scope == "local" and inner and size <= MAX_REGISTER_VECTORS * lanes:
            registers.add(buf)
    cores = max(target.num_cores, 1)
    buffers = [*kernel.allocations, *(a.buffer for s in kernel.stores for a in s.accesses)]
    narrow = all(itemsize(b.dtype) == 4 for b in buffers)
    return Context(4 * lanes, lanes, cores, frozenset(registers), frozenset(heap), narrow)


def store_estimate(store: Store, traffic: list[float], ctx: Context) -> StoreEstimate:
    """The estimate of one store, `traffic` its locality.cache_traffic."""
    ext = store.extents
    ops = store.ops
    vector_ops = sum(ops[i] for i in _VECTOR_OPS)
    vector_ops += MATH_INSTRUCTIONS * ops[_MATH] + DIV_INSTRUCTIONS * ops[_DIV]
    vec, lanes = _explicit_simd(store, ctx)
    explicit = vec is not None
    if vec is None:
        vec = _compiler_simd(store, ctx)
        lanes = (_lanes(store, vec, ctx) or 1) if vec is not None else 1
    start = _body_start(store, vec, lanes, vector_ops)
    full = _lane_efficiency(ext[vec], lanes) if vec is not None else 1.0
    inside = vec if vec is not None and vec >= start else None  # the vector loop in the body
    body = math.prod(ext[start:])
    runs = store.trips / body / (1.0 if inside is not None else full)  # runs of the body
    arithmetic = body / (full if inside is not None else 1.0) * max(vector_ops, 0.5)
    out = store.accesses[0].buffer  # its reads are the accumulator's (_accumulator)
    reads = [a for a in store.accesses[1:] if a.buffer != out]
    loads = sum(_loads(a, ext, start, inside, lanes) for a in reads)
    acc = _accumulator(store, start, inside, lanes, ctx)
    loads, stores = loads + acc.loads, acc.stores
    issue = runs * (_issue(arithmetic, loads, stores) + 1.0)  # + the loop's own instructions
    chain = runs * acc.chain / _in_flight(store, start, acc, arithmetic + loads + stores)
    memory = [t / bw for t, bw in zip(traffic, LEVEL_BANDWIDTH, strict=True)]
    fork, speedup, entries = _parallel(store, ctx.cores)
    memory = [m / speedup for m in memory[:-1]] + [memory[-1] / min(speedup, DRAM_SHARED)]
    return StoreEstimate(
        issue / speedup, chain / speedup, runs / speedup, tuple(memory),
        full, explicit, vec is not None and not explicit, float(body), acc.vectors,
        acc.kept, loads / max(arithmetic, 1e-9), fork, entries,
    )  # fmt: skip


class _Accumulator(NamedTuple):
    vectors: float  # of output one run of the body updates
    kept: bool  # in registers across the updates
    carried: bool  # the loop around the body is a reduction loop
    loads: float  # of the output, per run of the body
    stores: float
    chain: float  # cycles of dependent updates per run of the body


def _accumulator(
    store: Store, start: int, vec: int | None, lanes: int, ctx: Context
) -> _Accumulator:
    """How one run of the body updates its output. A reduction keeps its sums in registers
    when they fit and GCC can tell the output from the inputs (not a heap buffer); then it
    loads and stores them once a run, or never where the loop around is a reduction loop too.
    Otherwise every update goes through memory."""
    out = store.accesses[0]
    vectors = _loads(out, store.extents, start, vec, lanes)
    if not store.in_reduction or store.in_init:
        return _Accumulator(vectors, False, False, 0.0, vectors, 0.0)
    ext = store.extents
    updates = math.prod(ext[d] for d in range(start, len(ext)) if d not in out.moves)
    carried = _carried(out, ext, start)
    fits = out.buffer not in ctx.heap and vectors <= ACCUMULATOR_REGISTERS
    if out.buffer in ctx.registers or fits:
        moved = 0.0 if carried or out.buffer in ctx.registers else vectors
        return _Accumulator(vectors, True, carried, moved, moved, updates * FMA_LATENCY)
    moved = vectors * updates
    return _Accumulator(vectors, False, carried, moved, moved, updates * MEMORY_LATENCY)


def _in_flight(store: Store, start: int, acc: _Accumulator, instructions: float) -> float:
    """Runs of the body whose dependent updates overlap: one where the loop around carries
    the sums, else as many as the reorder window holds (at most that loop's iterations)."""
    if acc.carried or acc.chain == 0.0:
        return 1.0
    around = next((d for d in range(start - 1, -1, -1) if store.extents[d] > 1), None)
    limit = store.extents[around] if around is not None else 1
    return float(min(limit, max(1.0, REORDER_WINDOW / max(instructions, 1.0))))


def _explicit_simd(store: Store, ctx: Context) -> tuple[int | None, int]:
    """The vectorized loop the C printer emits as SIMD (its depth and lanes): the innermost
    loop of extent > 1, or one with only unrolled loops inside, whose store is unit-stride."""
    loops = store.loops
    for d in range(len(loops) - 1, -1, -1):
        if loops[d].extent == 1:
            continue
        if loops[d].kind == "vectorized":
            lanes = _lanes(store, d, ctx)
            if lanes is None or flat_step(store.accesses[0], d) not in (0.0, 1.0):
                return None, 1
            return d, lanes
        if loops[d].kind != "unrolled":
            return None, 1
    return None, 1


def _lanes(store: Store, d: int, ctx: Context) -> int | None:
    """codegen's `loop_lanes` of the loop at depth `d`."""
    if ctx.narrow and store.ops[_CAST] == 0:
        return chunk_lanes(store.extents[d], 4, ctx.vector_bytes)
    return loop_lanes(store.nodes[d], ctx.vector_bytes)


def _body_start(store: Store, vec: int | None, lanes: int, vector_ops: float) -> int:
    """The depth where the straight-line body starts (see the module docstring)."""
    loops, ext = store.loops, store.extents
    step = max((lp.unroll_step for lp in loops), default=0)
    insns = max(vector_ops, 1.0) + len(store.accesses)
    index_nodes = sum(len(a.coefs) for a in store.accesses) * NODES_PER_INDEX
    nodes = index_nodes + NODES_PER_OP * vector_ops + len(store.accesses)
    start, body, nest = len(loops), 1.0, 1.0
    for d in range(len(loops) - 1, -1, -1):
        kind, e = loops[d].kind, ext[d]
        if not (e == 1 or kind == "unrolled" or d == vec):
            copies = body * e / lanes
            complete = e <= COMPLETE_UNROLL_TIMES and insns * copies <= COMPLETE_UNROLL_INSNS
            annotated = nest * e <= step and nodes * body * e <= AUTO_UNROLL_MAX_NODES
            # A vectorized loop that does not print as SIMD is a scalar `omp simd` loop.
            if kind not in ("serial", "vectorized") or not (complete or annotated):
                break
        start, body = d, body * e
        if kind != "unrolled":
            nest *= e
    return start


def _compiler_simd(store: Store, ctx: Context) -> int | None:
    """The loop GCC vectorizes where no vectorized loop prints as SIMD (it vectorizes before
    it unrolls): the innermost loop, or the loop around it where that is a reduction loop it
    holds alone (outer-loop vectorization); only where it can tell the output from the inputs
    (see ALIAS_CHECKS)."""
    loops, ext, out = store.loops, store.extents, store.accesses[0]
    inner = [d for d in range(len(loops)) if ext[d] > 1 and loops[d].kind != "unrolled"]
    if not inner:
        return None
    copies = math.prod(lp.extent for lp in loops[inner[-1] :] if lp.kind == "unrolled")
    if out.buffer in ctx.heap and copies * (len(store.accesses) - 1) > ALIAS_CHECKS:
        return None
    if _vectorizable(store, inner[-1]):
        return inner[-1]
    if (
        len(inner) >= 2
        and store.in_reduction
        and inner[-1] not in out.moves
        and _nested(store.nodes[inner[-2]], store.nodes[inner[-1]])
        and _vectorizable(store, inner[-2])
    ):
        return inner[-2]
    return None


def _nested(outer: For, inner: For) -> bool:
    """Whether `inner` is all that `outer` holds (through loops of one iteration)."""
    body = outer.body
    while body is not inner:
        if not isinstance(body, For):
            return False
        body = body.body
    return True


def _vectorizable(store: Store, d: int) -> bool:
    if store.loops[d].kind not in ("serial", "vectorized"):
        return False
    if store.extents[d] < AUTO_VECTOR_MIN_EXTENT:
        return False
    steps = [flat_step(a, d) for a in store.accesses]
    return steps[0] == 1.0 and all(s in (0.0, 1.0) for s in steps[1:])


def _lane_efficiency(extent: int, lanes: int) -> float:
    """Iterations per instruction of a vector loop: whole vectors, then a scalar tail."""
    return extent / (extent // lanes + extent % lanes) if lanes > 1 else 1.0


def _loads(acc: Access, ext: list[int], start: int, vec: int | None, lanes: int) -> float:
    """Distinct loads of `acc` in one run of the body: vectors along the vector loop, else
    one per element (a broadcast, a scalar or a gather's lane)."""
    distinct = window(acc, ext, start)
    return distinct / lanes if vec is not None and flat_step(acc, vec) == 1.0 else distinct


def _carried(out: Access, ext: list[int], start: int) -> bool:
    """Whether the loop around the body is a reduction loop: one run of the body waits for
    the previous one's sums."""
    d = start - 1
    while d >= 0 and ext[d] == 1:
        d -= 1
    return d >= 0 and d not in out.moves


def _issue(arithmetic: float, loads: float, stores: float) -> float:
    return max(
        arithmetic / FMA_PIPES,
        loads / LOAD_PORTS,
        stores / STORE_PORTS,
        (arithmetic + loads + stores) / ISSUE_WIDTH,
    )


def _parallel(store: Store, cores: int) -> tuple[For | None, float, float]:
    """The outermost parallel loop (nested ones run serially), how much faster its
    iterations run shared over the cores, and how many times its region starts."""
    for d, lp in enumerate(store.loops):
        if lp.kind == "parallel" and lp.extent > 1:
            p = lp.extent
            return store.nodes[d], p / math.ceil(p / cores), math.prod(store.extents[:d])
    return None, 1.0, 0.0


def kernel_times(
    estimates: list[StoreEstimate], flops: float, param_bytes: float, ctx: Context
) -> tuple[list[float], list[float]]:
    """The TIME_COLUMNS of a kernel (raw ratios), and each store's share of its time."""
    peak = 2 * FMA_PIPES * ctx.lanes * ctx.cores  # float operations per cycle (an FMA is two)
    ideal = max(flops / peak, param_bytes / LEVEL_BANDWIDTH[-1], 1.0)
    regions = {id(e.fork): e.entries for e in estimates if e.fork is not None}
    fork = sum(regions.values()) * FORK_CYCLES
    per_store = [e.cycles for e in estimates]
    total = sum(per_store) + fork
    sums = [
        sum(e.issue for e in estimates),
        sum(e.chain for e in estimates),
        sum(e.loop for e in estimates),
        *(sum(e.memory[i] for e in estimates) for i in range(len(CACHE_LEVELS))),
    ]
    columns = [x / ideal for x in (*sums, fork, total)]
    return columns, [c / total if total else 0.0 for c in per_store]


def store_columns(est: StoreEstimate, share: float) -> list[float]:
    """The STORE_COLUMNS of one store (raw)."""
    return [
        est.lanes, float(est.explicit), float(est.compiler), est.body, est.accumulators,
        float(est.in_registers), est.loads_per_op, share,
    ]  # fmt: skip
