"""What a GPU-scheduled PrimFunc launches as, and whether it fits the target.

    launch = verify_gpu(func, Target("cuda -arch=sm_90"))   # Launch(grid, block) or an error
    launch.grid, launch.block                                # (x, y, z) each

The grid and the thread block come from the bound loops: the extent of the `blockIdx.x` loops
is the grid's x, and so on. Every loop bound to one axis must have the same extent (a kernel
has one block shape; split the loops so they agree); a stage that binds fewer axes than the
block has runs on the threads whose missing indices are 0. Over-limit schedules raise
`ResourceError` naming the limit, the value and the loops; inconsistent ones `ScheduleError`
with the offending loop marked in the printed IR.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexir.errors import ResourceError, ScheduleError
from hexir.ir.dtype import itemsize
from hexir.ir.tir import Allocate, Block, Buffer, BufferLoad, BufferStore, For, PrimFunc, Stmt
from hexir.ir.visit import walk
from hexir.schedule.common import schedule_error, sub_stmts
from hexir.schedule.compact import compact_buffers

if TYPE_CHECKING:
    from hexir.runtime.target import Target

BLOCK_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
# CUDA's fixed limits (every arch Hexir targets): block dimensions and grid dimensions.
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class Launch:
    """A kernel's launch shape, and the first loop bound to each axis (for messages)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    loops: tuple[tuple[str, str], ...] = ()  # (axis, loop var name)

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    def dim(self, axis: str) -> int:
        """The extent of `axis` ("threadIdx.y", "blockIdx.x", ...)."""
        dims = self.block if axis.startswith("threadIdx") else self.grid
        return dims["xyz".index(axis[-1])]

    def loop_of(self, axis: str) -> str:
        return dict(self.loops).get(axis, "?")


def launch_shape(func: PrimFunc) -> Launch:
    """The grid and block `func`'s bound loops describe; ScheduleError where two loops bound to
    one axis disagree on its extent."""
    first: dict[str, For] = {}
    for loop in _bound_loops(func.body):
        seen = first.setdefault(loop.kind, loop)
        if seen.extent != loop.extent:
            raise schedule_error(
                "gpu_verify",
                f"loop %{loop.var.name} is bound to {loop.kind} with extent {loop.extent}, but "
                f"loop %{seen.var.name} binds it with extent {seen.extent}: every loop bound to "
                "one axis must have the same extent (the kernel has one block and one grid "
                "shape); split the loops so their extents agree",
                func,
                loop=loop.var,
            )
    grid = tuple(first[a].extent if a in first else 1 for a in BLOCK_AXES)
    block = tuple(first[a].extent if a in first else 1 for a in THREAD_AXES)
    loops = tuple((axis, loop.var.name) for axis, loop in sorted(first.items()))
    return Launch(grid, block, loops)  # type: ignore[arg-type]


def verify_gpu(func: PrimFunc, target: Target) -> Launch:
    """`func`'s launch shape after checking it against `target`'s limits (threads per block,
    block and grid dimensions, static shared memory) and the consistency of its bindings.
    Caches are compacted first (as the build does), so their sizes are the tiles'."""
    func = compact_buffers(func)
    launch = launch_shape(func)
    limit = target.max_threads_per_block or 1024
    if launch.threads > limit:
        shape = ", ".join(
            f"{a}={launch.dim(a)} (loop %{launch.loop_of(a)})"
            for a in THREAD_AXES
            if launch.dim(a) > 1
        )
        raise ResourceError(
            f"kernel {func.name!r} needs {launch.threads} threads per block ({shape}), over "
            f"the limit of {limit} threads per block of target {target}: split the "
            "thread-bound loops so the product of their extents is at most the limit"
        )
    _check_dims(func, launch, THREAD_AXES, MAX_BLOCK_DIMS, "block dimension")
    _check_dims(func, launch, BLOCK_AXES, MAX_GRID_DIMS, "grid dimension")
    _check_block_scope(func, launch)
    _check_shared(func, target)
    return launch


def _check_dims(
    func: PrimFunc, launch: Launch, axes: tuple[str, ...], limits: tuple[int, ...], what: str
) -> None:
    for axis, limit in zip(axes, limits, strict=True):
        if launch.dim(axis) > limit:
            raise ResourceError(
                f"kernel {func.name!r}: loop %{launch.loop_of(axis)} bound to {axis} has "
                f"extent {launch.dim(axis)}, over the CUDA {what} limit of {limit} for {axis}: "
                "split it and bind the outer part elsewhere"
            )


def _check_shared(func: PrimFunc, target: Target) -> None:
    limit = target.max_shared_memory_per_block
    if limit is None:
        return
    buffers = shared_buffers(func.body)
    total = sum(buffer_bytes(b) for b in buffers)
    if total > limit:
        listing = ", ".join(f"%{b.name} {buffer_bytes(b)} B" for b in buffers)
        raise ResourceError(
            f"kernel {func.name!r} needs {total} bytes of static shared memory per block "
            f"({listing}), over the limit of {limit} bytes per block of target {target}: make "
            "the cached tiles smaller"
        )


def buffer_bytes(buffer: Buffer) -> int:
    return buffer.size * itemsize(buffer.dtype)


# ---------------------------------------------------------------------------------------------
# Where each allocation lives on the GPU


def shared_buffers(body: Stmt) -> list[Buffer]:
    """The allocations that live in shared memory: scope `shared`, or an allocated `global`
    buffer outside every thread loop (one copy per block: what a block-level stage such as an
    rfactor's partials needs), each once."""
    found: dict[Buffer, None] = {}
    for alloc, in_threads, _ in allocations(body):
        if placement(alloc.buffer, in_threads) == "shared":
            found[alloc.buffer] = None
    return list(found)


def placement(buffer: Buffer, in_threads: bool) -> str:
    """ "shared" or "local" (per thread) for an allocation, by its scope and whether a thread
    loop encloses it."""
    if buffer.scope == "shared":
        return "shared"
    if buffer.scope == "local" or in_threads:
        return "local"
    return "shared"


def allocations(
    stmt: Stmt, in_threads: bool = False, in_blocks: bool = False
) -> Iterator[tuple[Allocate, bool, bool]]:
    """Every Allocate under `stmt`, whether a threadIdx loop encloses it and whether a
    blockIdx loop does."""
    if isinstance(stmt, Allocate):
        yield stmt, in_threads, in_blocks
        return
    if isinstance(stmt, For):
        in_threads = in_threads or stmt.kind in THREAD_AXES
        in_blocks = in_blocks or stmt.kind in BLOCK_AXES
    for child in sub_stmts(stmt):
        yield from allocations(child, in_threads, in_blocks)


def _bound_loops(stmt: Stmt) -> Iterator[For]:
    for node in walk(stmt):
        if isinstance(node, For) and (node.kind in BLOCK_AXES or node.kind in THREAD_AXES):
            yield node


# ---------------------------------------------------------------------------------------------
# Work outside the blockIdx loops


def _check_block_scope(func: PrimFunc, launch: Launch) -> None:
    """Blocks do not wait for each other inside a kernel: with more than one block, every
    stage must sit under the blockIdx loops, and stages under different blockIdx loops must
    not pass data through a buffer."""
    if math.prod(launch.grid) == 1:
        return
    for alloc, in_threads, in_blocks in allocations(func.body):
        if not in_blocks and placement(alloc.buffer, in_threads) == "shared":
            raise schedule_error(
                "gpu_verify",
                f"%{alloc.buffer.name} is allocated outside every blockIdx loop of a kernel "
                "launched with more than one block, but the blocks cannot share memory: "
                "compute_at its producer under the blockIdx loops (so each block holds its own "
                "tile) or inline it",
                func,
            )
    nests: list[For] = []
    for stmt in _top_level(func.body):
        if isinstance(stmt, For) and stmt.kind in BLOCK_AXES:
            nests.append(stmt)
        elif _does_work(stmt):
            raise _outside(func, stmt)
    for n, later in enumerate(nests):
        for earlier in nests[:n]:
            passed = _written(earlier) & (_read(later) | _written(later))
            passed |= _read(earlier) & _written(later)
            if passed:
                raise schedule_error(
                    "gpu_verify",
                    f"the stages under blockIdx loops %{earlier.var.name} and "
                    f"%{later.var.name} both use %{min(b.name for b in passed)}, one writing "
                    "it: blocks do not wait for each other inside one kernel; compute_at the "
                    "producer under the consumer's blockIdx loop",
                    func,
                    loop=later.var,
                )


def _top_level(stmt: Stmt) -> Iterator[Stmt]:
    """The statements outside every blockIdx loop that are not mere structure (Seq, serial
    loops holding blockIdx loops, allocations)."""
    match stmt:
        case For() if stmt.kind in BLOCK_AXES:
            yield stmt
        case For() if any(isinstance(n, For) and n.kind in BLOCK_AXES for n in walk(stmt.body)):
            yield from _top_level(stmt.body)
        case Allocate():
            return
        case _ if any(isinstance(n, For) and n.kind in BLOCK_AXES for n in walk(stmt)):
            for child in sub_stmts(stmt):
                yield from _top_level(child)
        case _:
            yield stmt


def _does_work(stmt: Stmt) -> bool:
    return any(isinstance(n, (BufferStore, Block)) for n in walk(stmt))


def _outside(func: PrimFunc, stmt: Stmt) -> ScheduleError:
    block = next((n for n in walk(stmt) if isinstance(n, Block)), None)
    what = f"block @{block.name}" if block is not None else "a store"
    return schedule_error(
        "gpu_verify",
        f"{what} runs outside every blockIdx loop of a kernel launched with more than one "
        "block: each block would run it, in no order with the others; compute_at it under "
        "the blockIdx loops or build it as a kernel of its own",
        func,
        block=block.name if block is not None else None,
    )


def _written(stmt: Stmt) -> set[Buffer]:
    return {n.buffer for n in walk(stmt) if isinstance(n, BufferStore)}


def _read(stmt: Stmt) -> set[Buffer]:
    return {n.buffer for n in walk(stmt) if isinstance(n, BufferLoad)}


__all__ = [
    "BLOCK_AXES",
    "THREAD_AXES",
    "Launch",
    "allocations",
    "buffer_bytes",
    "launch_shape",
    "placement",
    "shared_buffers",
    "verify_gpu",
]
