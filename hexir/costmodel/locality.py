"""Feature groups about locality and code generation: the traffic a store makes at each cache
level, whether its vectorized loop prints as SIMD, and which local buffers live in registers.

These are what separates two tilings of the same loops, so they carry most of what a model
learns about a tiled kernel: per-kind loop products cannot tell which loop level is where.
"""

from __future__ import annotations

import math

from hexir.codegen.c_lower import MAX_REGISTER_VECTORS, MAX_STRAIGHT_CHUNKS
from hexir.costmodel.walk import Access, KernelWalk, Store
from hexir.ir.dtype import itemsize
from hexir.runtime.target import Target

# Capacities (bytes) the working set of a loop nest is compared with: the vector register
# file (32 x 64 B), L1d (48 KiB) and L2 (1 MiB) per core (PERFORMANCE.md), and a last level.
CACHE_LEVELS = (("registers", 2048), ("l1", 48 * 1024), ("l2", 1024 * 1024), ("llc", 32 << 20))

# cache.<level>: bytes the store moves into a cache of that size, estimated as (iterations of
# the loops outside the outermost loop whose body's working set fits) x (that working set).
CACHE_COLUMNS = tuple(f"cache.{name}.traffic" for name, _ in CACHE_LEVELS)
# simd: the vectorized loop is the innermost (else codegen falls back to scalar code), its
# extent is whole vectors and few enough to print straight, the store is contiguous along it,
# and how many loads along it are gathers (neither contiguous nor invariant).
VECTOR_COLUMNS = ("simd.innermost", "simd.straight", "simd.store_contiguous", "simd.gathers")
# registers: vectors of local buffers that fit the register file and are indexed only by
# unrolled or vectorized loops (GCC keeps them in registers), and local bytes that do not.
REGISTER_COLUMNS = ("registers.vectors", "registers.spilled_bytes")


def cache_traffic(store: Store) -> list[float]:
    """The CACHE_COLUMNS of one store (raw bytes)."""
    firsts: dict[object, Access] = {}
    for acc in store.accesses:
        firsts.setdefault(acc.buffer, acc)
    extents = store.extents
    depth = len(extents)
    # working[d]: bytes touched by one iteration of the loops outside depth d.
    working = [0.0] * (depth + 1)
    for acc in firsts.values():
        size = itemsize(acc.buffer.dtype)
        for d, elements in enumerate(windows(acc, extents)):
            working[d] += elements * size
    out = []
    for _, capacity in CACHE_LEVELS:
        d = next((d for d in range(depth + 1) if working[d] <= capacity), depth)
        out.append(math.prod(extents[:d]) * working[d])
    return out


def window(acc: Access, extents: list[int], start: int) -> float:
    """Distinct elements the access touches over the loops at depth `start` and deeper."""
    box = 1.0
    shape = acc.buffer.shape
    for axis, coefs in enumerate(acc.coefs):
        span = 1.0
        for d, k in coefs.items():
            if d >= start:
                span += abs(k) * (extents[d] - 1)
        box *= shape[axis] if span > shape[axis] else span
    moving = 1.0
    for d in acc.moves:
        if d >= start:
            moving *= extents[d]
    return box if box < moving else moving


def windows(acc: Access, extents: list[int]) -> list[float]:
    """`window(acc, extents, start)` for every start from 0 to len(extents), in one pass from
    the innermost loop out."""
    shape = acc.buffer.shape
    steps: list[list[tuple[int, float]]] = [[] for _ in extents]
    for axis, coefs in enumerate(acc.coefs):
        for d, k in coefs.items():
            steps[d].append((axis, abs(k) * (extents[d] - 1)))
    spans = [1.0] * len(shape)
    moving = 1.0
    out = [1.0] * (len(extents) + 1)
    for d in range(len(extents) - 1, -1, -1):
        for axis, step in steps[d]:
            spans[axis] += step
        if d in acc.moves:
            moving *= extents[d]
        box = 1.0
        for span, size in zip(spans, shape, strict=True):
            box *= size if span > size else span
        out[d] = box if box < moving else moving
    return out


def vector_columns(store: Store, target: Target) -> list[float]:
    """The VECTOR_COLUMNS of one store."""
    loops = store.loops
    vec = next((d for d in range(len(loops) - 1, -1, -1) if loops[d].kind == "vectorized"), None)
    if vec is None or loops[vec].extent < 2:
        return [0.0] * len(VECTOR_COLUMNS)
    innermost = all(lp.extent == 1 for lp in loops[vec + 1 :])
    lanes = max(target.vector_width, 1)
    extent = loops[vec].extent
    straight = extent % lanes == 0 and extent // lanes <= MAX_STRAIGHT_CHUNKS
    strides = [flat_step(acc, vec) for acc in store.accesses]
    gathers = sum(1 for s in strides[1:] if s not in (0.0, 1.0))
    return [float(innermost), float(straight), float(strides[0] == 1.0), float(gathers)]


def flat_step(acc: Access, depth: int) -> float:
    """How far the flattened address of `acc` moves per iteration of the loop at `depth`."""
    step, stride = 0.0, 1
    for axis in range(len(acc.coefs) - 1, -1, -1):
        step += acc.coefs[axis].get(depth, 0.0) * stride
        stride *= acc.buffer.shape[axis]
    return abs(step)


def register_columns(kernel: KernelWalk, target: Target) -> list[float]:
    """The REGISTER_COLUMNS of a kernel: each local allocation sized by its window under the
    loops all its uses share, as compact_buffers will size it."""
    lanes = max(target.vector_width, 1)
    vectors = spilled = 0.0
    for buf in kernel.allocations:
        if buf.scope != "local":
            continue
        uses = [(s, a) for s in kernel.stores for a in s.accesses if a.buffer == buf]
        if not uses:
            continue
        shared = shared_depth([s for s, _ in uses])
        last = max(_last_span(a, s.extents, shared) for s, a in uses)
        size = max(window(a, s.extents, shared) for s, a in uses)
        regular = all(
            s.loops[d].kind in ("unrolled", "vectorized") for s, a in uses for d in a.moves
            if d >= shared
        )  # fmt: skip
        if regular and last % lanes == 0 and size <= MAX_REGISTER_VECTORS * lanes:
            vectors += size / lanes
        else:
            spilled += size * itemsize(buf.dtype)
    return [vectors, spilled]


def shared_depth(stores: list[Store]) -> int:
    """How many loops (outermost first) every one of `stores` sits in."""
    first = stores[0].nodes
    shared = len(first)
    for store in stores[1:]:
        n = 0
        for a, b in zip(first, store.nodes, strict=False):  # the common prefix
            if a is not b:
                break
            n += 1
        shared = min(shared, n)
    return shared


def _last_span(acc: Access, extents: list[int], start: int) -> float:
    span = 1.0
    for d, k in acc.coefs[-1].items():
        if d >= start:
            span += abs(k) * (extents[d] - 1)
    return min(span, float(acc.buffer.shape[-1]))
