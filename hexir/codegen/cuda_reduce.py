"""Cross-thread reductions: a reduce loop bound to threadIdx.x becomes a block-level reduction.

A reduction whose reduce iter var is fed by a `threadIdx.x` loop (bound directly, or the
write-back of an `rfactor` bound to it) runs serially on the CPU; on the GPU each thread first
reduces its own share into a register, the threads then combine their partials (`AllReduce`:
warp shuffles, and a shared scratch buffer across warps), and thread 0 applies the result:

    for %k_1 in 0..128 threadIdx.x {         for %k_1 in 0..128 threadIdx.x {
      for %k_0 in 0..4 serial {                 alloc %Y_red: buffer<1xf32, local>
        block @sum(vi = spatial(64) %i,         %Y_red[0] = 0.0
            vk = reduce(512) %k_0 * 128  ->     for %k_0 in 0..4 serial {
                             + %k_1) {            block @sum(...) { %Y_red[0] = %Y_red[0] + .. }
          init { %Y[vi] = 0.0 }                 all-reduce(+) %Y_red
          %Y[vi] = %Y[vi] + %X[vi, vk]          if %k_1 == 0 { %Y[i] = 0.0
                                                               %Y[i] = %Y[i] + %Y_red[0] }

The rewrite runs before `lower_for_c` (it needs the blocks' iter var kinds); `AllReduce` is a
statement private to the CUDA printer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hexir.errors import ScheduleError
from hexir.ir.arith import FALSE, TRUE, simplify
from hexir.ir.tir import Allocate as Alloc
from hexir.ir.tir import (
    Barrier,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    IntImm,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import free_vars, map_stmt, substitute
from hexir.schedule.common import (
    all_blocks,
    all_loops,
    conjoin,
    conjuncts,
    reduce_fed_by,
    replace_at,
)
from hexir.schedule.reduction import Reduction, binding_loops, identity, match_reduction


@dataclass(frozen=True, slots=True, repr=False)
class AllReduce(Barrier):
    """Every thread of the block combines its `buffer[0]` with those of the other threads of
    its threadIdx.x row (`op` one of + * max min); afterwards each holds the total. Every
    thread of the block must reach it (it synchronizes)."""

    buffer: Buffer
    op: str


def lower_cross_thread(body: Stmt) -> Stmt:
    """`body` with every reduction over a threadIdx-bound loop rewritten as above."""
    return map_stmt(body, stmt_fn=_rewrite)


def _rewrite(stmt: Stmt) -> Stmt:
    if not isinstance(stmt, For) or not stmt.kind.startswith("threadIdx"):
        return stmt
    if reduce_fed_by(stmt.body, stmt.var) is None:
        return stmt
    return _cross_thread(stmt)


def _fail(loop: For, reason: str) -> ScheduleError:
    return ScheduleError(
        f"cross-thread reduction over loop %{loop.var.name} ({loop.kind}): {reason}",
        "generate_cuda",
    )


def _cross_thread(loop: For) -> Stmt:
    blocks = list(all_blocks(loop.body))
    if len(blocks) != 1:
        names = ", ".join(f"@{b.name}" for b in blocks)
        raise _fail(loop, f"the loop must hold exactly one block, it holds {names}")
    block = blocks[0]
    if loop.kind != "threadIdx.x":
        raise _fail(loop, "only threadIdx.x reduces across threads; bind the reduce loop to it")
    red = match_reduction(block, lambda reason, *_: _fail(loop, reason))
    reducing = {loop.var} | {lp.var for lp in all_loops(loop.body)}
    mixed = binding_loops(block, "spatial") & reducing
    if mixed:
        raise _fail(
            loop,
            f"loop %{min(v.name for v in mixed)} under it feeds a spatial iter var of "
            f"@{block.name}: each thread-bound reduction must produce one element; move the "
            "spatial loops outside the threadIdx.x loop",
        )
    acc = Buffer(f"{red.out.name}_red", (1,), red.out.dtype, "local")
    acc0 = BufferLoad(acc, (IntImm(0),))
    partial = replace(
        block,
        init=None,
        body=BufferStore(acc, (IntImm(0),), red.combine(acc0, red.rhs)),
        writes=(BufferRegion(acc, (IntImm(0),)),),
    )
    inner = replace_at(loop.body, lambda s: s is block, lambda _: partial)
    body = seq(
        Alloc(acc),
        BufferStore(acc, (IntImm(0),), identity(red.op, acc.dtype)),
        inner,
        AllReduce(acc, red.op),
        _write_back(loop.var, block, red, acc0, reducing),
    )
    return replace(loop, body=body)


def _write_back(lane: Var, block: Block, red: Reduction, acc0: Expr, reducing: set[Var]) -> Stmt:
    """Thread 0's part: the init where every reduce loop outside the threads is at 0, then
    the output combined with the total, where the block's spatial predicate holds."""
    bindings = {iv.var: iv.binding for iv in block.iter_vars}
    idx = tuple(simplify(substitute(i, bindings)) for i in red.indices)  # type: ignore[arg-type]
    zeros: dict[Var, Expr] = {v: IntImm(0) for v in reducing}
    first: Expr = TRUE
    for iv in block.iter_vars:
        if iv.kind == "reduce":
            at_zero = simplify(substitute(iv.binding, zeros))  # type: ignore[arg-type]
            first = simplify(Binary("&&", first, Binary("==", at_zero, IntImm(0, at_zero.dtype))))
    update = BufferStore(red.out, idx, red.combine(BufferLoad(red.out, idx), acc0))
    parts: list[Stmt] = []
    if first != FALSE and isinstance(block.init, BufferStore):
        value = simplify(substitute(block.init.value, bindings))  # type: ignore[arg-type]
        init = BufferStore(red.out, idx, value)
        parts.append(init if first == TRUE else IfThenElse(first, init))
    parts.append(update)
    plain = (simplify(substitute(c, bindings)) for c in conjuncts(block.predicate))  # type: ignore[arg-type]
    spatial = [c for c in plain if not free_vars(c) & reducing]
    guard = conjoin([Binary("==", lane, IntImm(0)), *spatial])
    assert guard is not None
    return IfThenElse(guard, seq(*parts))


__all__ = ["AllReduce", "lower_cross_thread"]
