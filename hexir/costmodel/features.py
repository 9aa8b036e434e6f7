"""Features of a scheduled kernel: a fixed-length float vector for the cost model.

    vec = extract(sch.func, Target("cpu"))       # np.ndarray of len(FEATURE_NAMES)
    FEATURE_NAMES[i]                              # what column i means

In the spirit of Ansor's per-store features, every buffer store gets a vector (see
`store_vector`) describing its loops, its arithmetic and the memory it touches; the kernel's
vector pools them (see `extract`):

    main.*    the store doing the most float arithmetic (the compute store; ties: most trips)
    aux.*     of the others, the store moving the most bytes (a pack, a write-back, an init)
    total.*   the additive columns (arithmetic, bytes, trips) summed over every store
    kernel.*  allocations per scope, blocks, barriers, kernel-wide ratios, CUDA resources, and
              on the CPU an analytic estimate of the kernel's time (estimate.py), by bound,
              over its ideal time

Counts that span orders of magnitude (trips, operations, bytes, extents) are stored as
log2(1 + x), so trees split on ratios, not on absolute sizes, and a model trained on one
workload size carries over to another. The function is pure: one PrimFunc, one vector.
"""

from __future__ import annotations

import math

import numpy as np

from hexir.costmodel.estimate import (
    STORE_COLUMNS,
    TIME_COLUMNS,
    context,
    kernel_times,
    store_columns,
    store_estimate,
)
from hexir.costmodel.locality import (
    CACHE_COLUMNS,
    REGISTER_COLUMNS,
    VECTOR_COLUMNS,
    cache_traffic,
    register_columns,
    shared_depth,
    vector_columns,
    window,
)
from hexir.costmodel.walk import OP_KINDS, Access, KernelWalk, Store, walk_kernel
from hexir.ir.dtype import itemsize
from hexir.ir.tir import GPU_KINDS, Buffer, PrimFunc
from hexir.runtime.target import Target

# Buffers per store described in their own columns (the ones moving the most bytes).
# The written buffer, then the two read buffers moving the most bytes.
BUFFER_SLOTS = ("out", "in0", "in1")
# Memory scopes a buffer can be in, as features tell them apart: a kernel parameter, a global
# scratch buffer (a pack), shared memory, local (registers, an accumulator).
SCOPES = ("param", "global", "shared", "local")
# Loop kinds, grouped: the three axes of a GPU binding count as one.
KIND_GROUPS = ("serial", "parallel", "vectorized", "unrolled", "blockIdx", "threadIdx", "vthread")
CACHE_LINE = 64

# --- Per-store columns. The additive ones are summed over stores for `total.*`. -------------
# arith: operations of each kind over all iterations of the store (log)
# memory: bytes accessed and unique bytes touched, per scope (log)
ADDITIVE = (
    "trips",
    *(f"arith.{k}" for k in OP_KINDS),
    *(f"mem.{scope}.bytes" for scope in SCOPES),
    *(f"mem.{scope}.unique_bytes" for scope in SCOPES),
)
# loops: loops of extent > 1, and per kind group their number and the product of extents
# innermost: the innermost loop (extent > 1): its extent, whether vectorized / unrolled
# vector: lanes of the vectorized loops, lanes / the target's lanes, whether a multiple
# unroll: product of unrolled extents, the largest auto-unroll step annotated around
# parallel: parallel iterations per core, how evenly they split over the cores, whether the
#   outermost loop is the parallel one; threads: threads per block a multiple of the warp
# flags: the store is a reduction's init, sits in a reduction block, runs under a predicate
# intensity: float operations per unique byte and per byte accessed
# est: what the analytic estimate worked out (estimate.STORE_COLUMNS; 0 off the CPU)
SHAPE = (
    "loops.depth",
    *(f"loops.{g}.{what}" for g in KIND_GROUPS for what in ("count", "extent")),
    "innermost.extent", "innermost.vectorized", "innermost.unrolled",
    "vector.lanes", "vector.lanes_per_target", "vector.full_vectors",
    "unroll.extent", "unroll.auto_step",
    "parallel.per_core", "parallel.balance", "parallel.outermost", "threads.warp_multiple",
    "flags.init", "flags.reduction", "flags.predicated",
    "intensity.per_unique_byte", "intensity.per_byte",
    *CACHE_COLUMNS, *VECTOR_COLUMNS, *STORE_COLUMNS,
)  # fmt: skip
# per buffer slot (out: the buffer stored to; in0, in1: the read buffers moving the most
# bytes): read / written, its scope, bytes accessed, unique bytes, cache lines, reuse ratio
# (bytes / unique), the innermost loop's stride in elements (0: the same element again),
# bytes contiguous along the innermost loops, and the innermost loop that reuses the data:
# its extent (reuse count), the iterations and the bytes between two uses (reuse distance).
# For `out` of a reduction the reuse distance in iterations is the number of independent
# accumulators the inner loops update: one means a chain of dependent adds.
BUFFER = (
    "read", "write", *(f"scope.{s}" for s in SCOPES),
    "bytes", "unique_bytes", "lines", "reuse_ratio", "stride", "contiguous_bytes",
    "reuse.count", "reuse.distance_iters", "reuse.distance_bytes",
)  # fmt: skip
STORE = ADDITIVE + SHAPE + tuple(f"{b}.{n}" for b in BUFFER_SLOTS for n in BUFFER)
# Kernel-wide: stores, blocks, barriers and root loop nests; allocations per scope (count and
# bytes of their footprint, the size compact_buffers will give them); float operations per
# unique byte of the parameters; the share of float operations in vectorized stores and of
# iterations under a parallel loop; the CUDA resource report when a build gave one; on a GPU,
# the static analyzer's reading of the schedule (its worst shared-memory bank conflict, as
# wavefronts over the conflict-free count, and the fraction of peak its inner loop's issue
# mix allows: hexir/codegen/gpu_analyze.py; 1 and 0 off the GPU); the estimated cycles by
# bound over the kernel's ideal cycles (estimate.TIME_COLUMNS; 0 off the CPU).
KERNEL = (
    "stores", "blocks", "barriers", "root_nests",
    *(f"alloc.{s}.{what}" for s in SCOPES[1:] for what in ("count", "bytes")),
    "intensity.params", "share.vectorized_flops", "share.parallel_trips", *REGISTER_COLUMNS,
    "cuda.has_resources", "cuda.registers", "cuda.spill_bytes", "cuda.shared_bytes",
    "cuda.worst_conflict", "cuda.predicted_peak",
    *TIME_COLUMNS,
)  # fmt: skip

FEATURE_NAMES: tuple[str, ...] = (
    *(f"main.{n}" for n in STORE),
    *(f"aux.{n}" for n in STORE),
    *(f"total.{n}" for n in ADDITIVE),
    *(f"kernel.{n}" for n in KERNEL),
)
NUM_FEATURES = len(FEATURE_NAMES)

# Columns stored as log2(1 + x); the others are flags and ratios in [0, 1] or small counts.
_STORE_LOG = frozenset(
    {*ADDITIVE, "loops.depth", "innermost.extent", "vector.lanes", "unroll.extent"}
    | {"unroll.auto_step", "parallel.per_core", "intensity.per_unique_byte"}
    | {"intensity.per_byte", *CACHE_COLUMNS, "est.body", "est.accumulators"}
    | {f"loops.{g}.extent" for g in KIND_GROUPS}
    | {f"{b}.{n}" for b in BUFFER_SLOTS for n in BUFFER[6:]}
)
_KERNEL_LOG = frozenset(
    {"stores", "blocks", "barriers", "root_nests", "intensity.params", "cuda.registers"}
    | {"cuda.spill_bytes", "cuda.shared_bytes", "cuda.worst_conflict", *REGISTER_COLUMNS}
    | set(TIME_COLUMNS)
    | {f"alloc.{s}.{w}" for s in SCOPES[1:] for w in ("count", "bytes")}
)
LOG_COLUMNS = np.array(
    [n.split(".", 1)[1] in (_STORE_LOG if not n.startswith("kernel.") else _KERNEL_LOG)
     or n.startswith("total.") for n in FEATURE_NAMES]
)  # fmt: skip
_LOG_INDEX = np.flatnonzero(LOG_COLUMNS)
_N_ADD, _N_STORE = len(ADDITIVE), len(STORE)
_FLOAT_KINDS = [i for i, k in enumerate(OP_KINDS) if k.startswith("float_")]
_FMA = OP_KINDS.index("float_fma")


def extract(func: PrimFunc, target: Target, resources: dict | None = None) -> np.ndarray:
    """The feature vector of a scheduled `func` for `target` (float32, len(FEATURE_NAMES)).

    `resources` is a CUDA build's report (`registers`, `spill_bytes`, `shared_bytes`), when
    there is one; without it those columns are 0 and `kernel.cuda.has_resources` says so."""
    kernel = walk_kernel(func)
    params = frozenset(func.params)
    flops = [_flops(s) for s in kernel.stores]
    traffic = [cache_traffic(s) for s in kernel.stores]
    times, estimated = _estimates(kernel, func, flops, traffic, target)
    stores = [
        store_vector(s, f, target, params, t, e)
        for s, f, t, e in zip(kernel.stores, flops, traffic, estimated, strict=True)
    ]
    empty = [0.0] * _N_STORE
    main = max(range(len(stores)), key=lambda i: (flops[i], stores[i][0]), default=None)
    rest = [i for i in range(len(stores)) if i != main]
    aux = max(rest, key=lambda i: (_bytes_moved(stores[i]), stores[i][0]), default=None)
    total = [sum(column) for column in zip(*(s[:_N_ADD] for s in stores), strict=True)] or empty[
        :_N_ADD
    ]
    out = np.array(
        [
            *(empty if main is None else stores[main]),
            *(empty if aux is None else stores[aux]),
            *total,
            *_kernel_columns(kernel, func, flops, params, target, resources),
            *times,
        ]
    )
    out[_LOG_INDEX] = np.log2(1.0 + out[_LOG_INDEX])
    return out.astype(np.float32)


def _estimates(
    kernel: KernelWalk,
    func: PrimFunc,
    flops: list[float],
    traffic: list[list[float]],
    target: Target,
) -> tuple[list[float], list[list[float]]]:
    """The kernel's TIME_COLUMNS and each store's STORE_COLUMNS (raw; zeros off the CPU)."""
    if target.kind != "cpu":
        return [0.0] * len(TIME_COLUMNS), [[0.0] * len(STORE_COLUMNS)] * len(kernel.stores)
    ctx = context(kernel, target)
    estimates = [store_estimate(s, t, ctx) for s, t in zip(kernel.stores, traffic, strict=True)]
    param_bytes = sum(p.size * itemsize(p.dtype) for p in func.params)
    times, shares = kernel_times(estimates, sum(flops), param_bytes, ctx)
    return times, [store_columns(e, s) for e, s in zip(estimates, shares, strict=True)]


def _flops(store: Store) -> float:
    ops = store.ops
    n = sum(ops[i] for i in _FLOAT_KINDS) + ops[_FMA]  # an FMA is two operations
    return n * store.trips


def _bytes_moved(vec: list[float]) -> float:
    start = 1 + len(OP_KINDS)
    return sum(vec[start : start + len(SCOPES)])


def store_vector(
    store: Store,
    flops: float,
    target: Target,
    params: frozenset[Buffer],
    traffic: list[float],
    estimated: list[float],
) -> list[float]:
    """The raw (not yet log-scaled) columns of STORE for one store doing `flops`, given its
    locality.cache_traffic and its estimate.STORE_COLUMNS."""
    extents, trips = store.extents, store.trips
    # The store's own access comes first: its buffer is the "out" slot.
    slots = [_buffer_stats(accs, extents, trips, params) for accs in _by_buffer(store)]
    slots[1:] = sorted(slots[1:], key=lambda s: (s[6], s[7], s[8], s), reverse=True)
    by_scope = [0.0] * (2 * len(SCOPES))
    for s in slots:
        scope = s[2:6].index(1.0)
        by_scope[scope] += s[6]
        by_scope[len(SCOPES) + scope] += s[7]
    unique = sum(by_scope[len(SCOPES) :])
    intensity = [flops / max(unique, 1.0), flops / max(sum(by_scope[: len(SCOPES)]), 1.0)]
    vec = [trips, *(k * trips for k in store.ops), *by_scope]
    vec += _loop_columns(store, target)
    vec += [float(store.in_init), float(store.in_reduction), float(store.predicated)]
    vec += intensity
    vec += traffic
    vec += vector_columns(store, target)
    vec += estimated
    for b in range(len(BUFFER_SLOTS)):
        vec += slots[b] if b < len(slots) else [0.0] * len(BUFFER)
    return vec


def _by_buffer(store: Store) -> list[list[Access]]:
    groups: dict[Buffer, list[Access]] = {}
    for acc in store.accesses:
        groups.setdefault(acc.buffer, []).append(acc)
    return list(groups.values())


def _loop_columns(store: Store, target: Target) -> list[float]:
    """loops.*, innermost.*, vector.*, unroll.*, parallel.*, threads.* of one store."""
    count = dict.fromkeys(KIND_GROUPS, 0.0)
    product = dict.fromkeys(KIND_GROUPS, 1.0)
    depth, inner, auto_step = 0, None, 0
    for lp in store.loops:
        auto_step = max(auto_step, lp.unroll_step)
        # A GPU binding counts even at extent 1: one block or one thread is a fact to know.
        if lp.extent > 1 or lp.kind in GPU_KINDS:
            group = lp.kind.split(".")[0]
            count[group] += 1
            product[group] *= lp.extent
        if lp.extent > 1:
            depth += 1
            inner = lp
    kinds = []
    for g in KIND_GROUPS:
        kinds += [count[g], product[g] if count[g] else 0.0]
    lanes = product["vectorized"] if count["vectorized"] else 0.0
    width = max(target.vector_width, 1)
    outer = next((lp for lp in store.loops if lp.extent > 1), None)
    return [
        float(depth),
        *kinds,
        float(inner.extent) if inner else 0.0,
        float(inner is not None and inner.kind == "vectorized"),
        float(inner is not None and inner.kind == "unrolled"),
        lanes,
        lanes / width,
        float(lanes > 0 and lanes % width == 0),
        product["unrolled"] if count["unrolled"] else 0.0,
        float(auto_step),
        *_parallel_columns(count["parallel"], product["parallel"], target),
        float(outer is not None and outer.kind == "parallel"),
        float(count["threadIdx"] > 0 and product["threadIdx"] % (target.warp_size or 32) == 0),
    ]


def _parallel_columns(count: float, product: float, target: Target) -> list[float]:
    """Parallel iterations per core, and the share of the cores' time doing work when they
    split into equal chunks (1 when the cores divide the iterations evenly)."""
    if not count or target.kind != "cpu":
        return [0.0, 0.0]
    cores = max(target.num_cores, 1)
    return [product / cores, product / (math.ceil(product / cores) * cores)]


def _buffer_stats(
    accesses: list[Access], extents: list[int], trips: float, params: frozenset[Buffer]
) -> list[float]:
    """The BUFFER columns of one buffer in one store (raw). Its first access describes its
    pattern: a store reads and writes an accumulator at the same index."""
    buf = accesses[0].buffer
    size = itemsize(buf.dtype)
    flat = _flat_coefs(accesses[0], buf.shape)
    unique = window(accesses[0], extents, 0) * size
    stride, contiguous = _stride_contiguity(flat, extents)
    count, dist_iters, dist_bytes = _reuse(accesses[0], extents, size)
    moved = trips * size * len(accesses)
    lines = unique / min(CACHE_LINE, max(contiguous * size, size))
    scope = _scope(buf, params)
    return [
        float(any(not a.is_write for a in accesses)),
        float(any(a.is_write for a in accesses)),
        *(float(scope == s) for s in SCOPES),
        moved, unique, lines, moved / max(unique, 1.0),
        abs(stride), contiguous * size, count, dist_iters, dist_bytes,
    ]  # fmt: skip


def _scope(buf: Buffer, params: frozenset[Buffer]) -> str:
    return "param" if buf in params else buf.scope


def _flat_coefs(acc: Access, shape: tuple[int, ...]) -> dict[int, float]:
    """Per loop depth, how far the flattened (row-major) address moves, in elements."""
    flat: dict[int, float] = {}
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        for d, k in acc.coefs[axis].items():
            flat[d] = flat.get(d, 0.0) + k * stride
        stride *= shape[axis]
    return flat


def _stride_contiguity(flat: dict[int, float], extents: list[int]) -> tuple[float, float]:
    """The innermost loop's stride, and how many elements the innermost loops read in one
    contiguous run (loops that do not move the access are skipped)."""
    stride = None
    run = 1.0
    for d in range(len(extents) - 1, -1, -1):
        if extents[d] == 1:
            continue
        k = abs(flat.get(d, 0.0))
        if stride is None:
            stride = k
        if k == 0:
            continue
        if k != run:
            break
        run *= extents[d]
    return stride or 0.0, run


def _reuse(acc: Access, extents: list[int], size: int) -> tuple[float, float, float]:
    """The innermost loop that does not move the access (it reuses the data): its extent,
    and the iterations and distinct bytes of this access between two uses."""
    for d in range(len(extents) - 1, -1, -1):
        if extents[d] > 1 and d not in acc.moves:
            inner = float(math.prod(extents[d + 1 :]))
            return float(extents[d]), inner, window(acc, extents, d + 1) * size
    return 0.0, 0.0, 0.0


def _kernel_columns(
    kernel: KernelWalk,
    func: PrimFunc,
    flops: list[float],
    params: frozenset[Buffer],
    target: Target,
    resources: dict | None,
) -> list[float]:
    """The KERNEL columns (raw)."""
    allocs = _allocation_sizes(kernel)
    param_bytes = sum(p.size * itemsize(p.dtype) for p in params)
    total = sum(flops) or 1.0
    vectorized = sum(
        f for f, s in zip(flops, kernel.stores, strict=True) if _has_kind(s, "vectorized")
    )
    trips = [s.trips for s in kernel.stores]
    parallel = sum(t for t, s in zip(trips, kernel.stores, strict=True) if _has_kind(s, "parallel"))
    res = resources or {}
    columns = [
        float(len(kernel.stores)), float(kernel.blocks), kernel.barriers, kernel.root_nests,
        *allocs,
        sum(flops) / max(param_bytes, 1),
        vectorized / total,
        parallel / (sum(trips) or 1.0),
        *register_columns(kernel, target),
        float(resources is not None),
        float(res.get("registers", 0)),
        float(res.get("spill_bytes", 0)),
        float(res.get("shared_bytes", 0)),
        *_gpu_reading(func, target),
    ]  # fmt: skip
    return columns


def _gpu_reading(func: PrimFunc, target: Target) -> tuple[float, float]:
    """The analyzer's worst bank conflict and predicted fraction of peak; (1, 0) off the GPU."""
    if target.kind != "cuda":
        return 1.0, 0.0
    from hexir.codegen.gpu_analyze import read_schedule  # the CUDA modules load for CUDA only

    reading = read_schedule(func, target)
    return reading.worst, reading.predicted


def _has_kind(store: Store, kind: str) -> bool:
    return any(lp.kind == kind and lp.extent > 1 for lp in store.loops)


def _allocation_sizes(kernel: KernelWalk) -> list[float]:
    """Count and bytes per scope (global, shared, local) of the allocations, each sized as
    the footprint of its accesses under the innermost loop that holds all of them."""
    uses: dict[Buffer, list[tuple[Store, Access]]] = {b: [] for b in kernel.allocations}
    for store in kernel.stores:
        for acc in store.accesses:
            if acc.buffer in uses:
                uses[acc.buffer].append((store, acc))
    out = [0.0] * (2 * (len(SCOPES) - 1))
    for buf, found in uses.items():
        slot = 2 * (SCOPES.index(buf.scope) - 1)
        out[slot] += 1
        out[slot + 1] += _window(found) * itemsize(buf.dtype)
    return out


def _window(uses: list[tuple[Store, Access]]) -> float:
    if not uses:
        return 0.0
    shared = shared_depth([s for s, _ in uses])
    return max(window(acc, s.extents, shared) for s, acc in uses)
