"""What the sketch rules ask of a block: its iter vars, its loops, its reuse, its neighbours.

Rules match these properties, never op names (DESIGN.md §5): a reduce block whose reads do not
all depend on all of its spatial iter vars reuses data (matmul, conv2d) and is tiled; a block
of spatial iter vars storing one value into an intermediate is elementwise and inlined.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from hexir.ir.symbolic import Sym
from hexir.ir.tir import (
    Block,
    Buffer,
    BufferStore,
    For,
    PrimFunc,
    Stmt,
    Var,
)
from hexir.ir.visit import free_vars
from hexir.schedule.common import (
    all_blocks,
    find_path,
    is_block,
    loops_of,
    region_vars,
)
from hexir.schedule.compute_region import block_inputs, stored


@dataclass(frozen=True, slots=True)
class LoopRole:
    """A loop around a block and the kind of the iter var it binds (None: binds none)."""

    loop: For
    role: str | None


def block_named(func: PrimFunc, name: str) -> Block:
    path = find_path(func.body, is_block(name))
    assert path is not None, name
    return path[-1]  # type: ignore[return-value]


def loops_around(func: PrimFunc, block: Block) -> list[For]:
    return loops_of(find_path(func.body, lambda s: s is block) or [])


def loop_roles(func: PrimFunc, block: Block) -> list[LoopRole]:
    """The loops around `block`, outermost first, each with the kind of iter var it feeds."""
    roles = []
    for loop in loops_around(func, block):
        kinds = {iv.kind for iv in block.iter_vars if loop.var in free_vars(iv.binding)}
        roles.append(LoopRole(loop, "reduce" if "reduce" in kinds else next(iter(kinds), None)))
    return roles


def has_kind(block: Block, kind: str) -> bool:
    return any(iv.kind == kind for iv in block.iter_vars)


def is_elementwise(func: PrimFunc, block: Block) -> bool:
    """Spatial iter vars only, one store, no init: the shape auto-inline looks for."""
    return (
        block.init is None
        and not has_kind(block, "reduce")
        and isinstance(block.body, BufferStore)
        and bool(block.iter_vars)
    )


def writes_intermediate(func: PrimFunc, block: Block) -> bool:
    return all(w.buffer not in func.params for w in block.writes)


def reused_reads(block: Block) -> list[int]:
    """The indices of the reads that skip one of `block`'s spatial iter vars (of extent > 1,
    or symbolic): each element read serves many outputs."""
    spatial = {
        iv.var
        for iv in block.iter_vars
        if iv.kind == "spatial" and (isinstance(iv.dom, Sym) or iv.dom > 1)
    }
    return [n for n, region in enumerate(block.reads) if spatial - region_vars(region)]


def has_reuse(block: Block) -> bool:
    """A reduction with reused reads: tiles that keep them in cache (or shared memory) pay."""
    return has_kind(block, "reduce") and bool(reused_reads(block))


def is_tileable(func: PrimFunc, block: Block) -> bool:
    """Every loop around `block` is perfectly nested down to it and binds exactly one iter var
    by itself (the shape lowering produces), so multi-level tiling may split and reorder them."""
    loops = loops_around(func, block)
    if not loops or len(loops) != len(block.iter_vars) or block.predicate is not None:
        return False
    for outer, inner in itertools.pairwise(loops):
        if outer.body is not inner:
            return False
    if loops[-1].body is not block:
        return False
    bindings = [iv.binding for iv in block.iter_vars]
    return sorted(str(b) for b in bindings) == sorted(str(lp.var) for lp in loops) and all(
        isinstance(b, Var) for b in bindings
    )


def consumers(func: PrimFunc, block: Block) -> list[Block]:
    """The blocks reading what `block` writes, in program order."""
    out = stored(block)
    return [b for b in leaf_blocks(func) if b is not block and block_inputs(b) & out]


def producers(func: PrimFunc, block: Block) -> list[Block]:
    inputs = block_inputs(block)
    return [b for b in leaf_blocks(func) if b is not block and stored(b) & inputs]


def leaf_blocks(func: PrimFunc) -> list[Block]:
    return list(all_blocks(func.body))


def root_nests(func: PrimFunc) -> Iterator[For]:
    """The loops directly in the function body (after its allocations)."""
    from hexir.ir.tir import Seq

    body: Stmt = func.body
    stmts = body.stmts if isinstance(body, Seq) else (body,)
    return (s for s in stmts if isinstance(s, For))


def output_buffers(block: Block) -> set[Buffer]:
    return {w.buffer for w in block.writes}
