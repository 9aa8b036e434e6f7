"""Reduction primitives: decompose_reduction, rfactor.

Each Schedule method resolves its handles, calls the pure rewrite below it (PrimFunc in,
PrimFunc out, ScheduleError on an illegal use), and records one instruction.

Block predicates are read as the code generator reads them: in terms of the enclosing loop
vars (what `split` writes), iter vars allowed too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from hexir.ir import arith
from hexir.ir.dtype import is_float, is_int, numpy_dtype
from hexir.ir.names import unique_name
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Expr,
    For,
    IntImm,
    IterVar,
    PrimFunc,
    Seq,
    Stmt,
    Var,
    const,
    seq,
)
from hexir.ir.visit import free_vars, substitute, walk
from hexir.schedule.common import (
    all_blocks,
    conjoin,
    conjuncts,
    find_path,
    is_block,
    is_loop,
    loop_ranges,
    loops_of,
    replace_at,
    schedule_error,
    substitute_simplify,
    taken_names,
)
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.trace import BlockRV, LoopRV

COMBINERS = ("+", "*", "max", "min")
# The combiners whose reduction a vectorized loop may run across its lanes, in a tree.
LANE_COMBINERS = ("+", "max", "min")
Fail = Callable[..., Exception]


class ReductionPrimitives(ScheduleBase):
    @primitive
    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        """Move `block`'s init into a block `<name>_init` placed right before `loop`.

        `sch.decompose_reduction(matmul, k)` on

            for %i in 0..64 serial {
              for %j in 0..48 serial {
                for %k in 0..32 serial {
                  block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k) .. {
                    init { %C[vi, vj] = 0.0 }
                    %C[vi, vj] = %C[vi, vj] + %A[vi, vk] * %B[vk, vj]

        gives

            for %i in 0..64 serial {
              for %j in 0..48 serial {
                block @matmul_init(vi = spatial(64) %i, vj = spatial(48) %j) reads() .. {
                  %C[vi, vj] = 0.0
                }
                for %k in 0..32 serial {
                  block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k) .. {
                    %C[vi, vj] = %C[vi, vj] + %A[vi, vk] * %B[vk, vj]

        `loop` is an ancestor of the block at or above its outermost reduction loop. The init
        block gets its own copies (`<var>_init`, same kind) of the loops between `loop` and the
        block that its spatial iter vars use. Returns the init block.
        """
        node = self._block(block, "decompose_reduction")
        at = self._loop(loop, "decompose_reduction")
        func, name = decompose_reduction_block(self.func, node, at)
        inputs = (("block", block), ("loop", loop))
        (rv,) = self._commit("decompose_reduction", inputs, (), func, [(BlockRV, name)])
        return rv  # type: ignore[return-value]

    @primitive
    def rfactor(self, loop: LoopRV, factor_axis: int) -> BlockRV:
        """Split the reduction under `loop` into partial reductions indexed by `loop`'s var
        (block `<name>_rf` into a new buffer `<out>_rf`) and a write-back block `<name>`.

        `sch.rfactor(k_1, 1)` on

            for %i in 0..4 serial {
              for %k_0 in 0..2 serial {
                for %k_1 in 0..16 serial {
                  block @sum(vi = spatial(4) %i, vk = reduce(32) %k_0 * 16 + %k_1) .. {
                    init { %Y[vi] = 0.0 }
                    %Y[vi] = %Y[vi] + %X[vi, vk]

        gives

            alloc %Y_rf: buffer<4x16xf32>
            for %i in 0..4 serial {
              for %k_0 in 0..2 serial {
                for %k_1 in 0..16 serial {
                  block @sum_rf(vi = spatial(4) %i, vk_1 = spatial(16) %k_1,
                                vk_0 = reduce(2) %k_0) .. {
                    init { %Y_rf[vi, vk_1] = 0.0 }
                    %Y_rf[vi, vk_1] = %Y_rf[vi, vk_1] + %X[vi, vk_0 * 16 + vk_1]
                }}}
              for %k_1_wb in 0..16 serial {
                block @sum(vi = spatial(4) %i, vk_1 = reduce(16) %k_1_wb) .. {
                  init { %Y[vi] = 0.0 }
                  %Y[vi] = %Y[vi] + %Y_rf[vi, vk_1]

        The combiner (+, *, max, min) comes from the update `out = out OP expr`; partials
        start from its identity, the write-back from the original init. `%Y_rf` has `loop`'s
        extent inserted at `factor_axis` (negative counts from the end). The write-back sits
        right after the outermost loop that feeds a reduce iter var, under fresh serial copies
        (`<var>_wb`) of the loops it needs. Returns the rfactor block.
        """
        node = self._loop(loop, "rfactor")
        axis = self._int(factor_axis, "rfactor")
        func, name = rfactor_loop(self.func, node, axis)
        inputs = (("loop", loop), ("factor_axis", factor_axis))
        (rv,) = self._commit("rfactor", inputs, (), func, [(BlockRV, name)])
        return rv  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Shared analysis


def binding_loops(block: Block, kind: str) -> set[Var]:
    """The vars used by the bindings of `block`'s iter vars of `kind` (spatial or reduce)."""
    out: set[Var] = set()
    for iv in block.iter_vars:
        if iv.kind == kind:
            out |= free_vars(iv.binding)
    return out


def block_path(func: PrimFunc, block: Block) -> list[Stmt]:
    return find_path(func.body, is_block(block.name)) or []


def block_names(func: PrimFunc) -> set[str]:
    return {b.name for b in all_blocks(func.body)}


def point_region(load: BufferLoad | BufferStore) -> BufferRegion:
    return BufferRegion(load.buffer, load.indices)


def loads_in(stmt: Stmt) -> tuple[BufferRegion, ...]:
    """Point regions of the distinct loads in `stmt`, in order."""
    loads = [n for n in walk(stmt) if isinstance(n, BufferLoad)]
    return tuple(point_region(n) for n in dict.fromkeys(loads))


def touched_buffers(stmt: Stmt, reads: bool = True) -> set[str]:
    """The buffers `stmt` writes (and, with `reads`, reads)."""
    names: set[str] = set()
    for n in walk(stmt):
        match n:
            case BufferStore(buffer):
                names.add(buffer.name)
            case BufferLoad(buffer) if reads:
                names.add(buffer.name)
            case Block(reads=rs, writes=ws):
                names.update(r.buffer.name for r in (rs + ws if reads else ws))
    return names


# ---------------------------------------------------------------------------------------------
# decompose_reduction


def decompose_reduction_block(func: PrimFunc, block: Block, loop: For) -> tuple[PrimFunc, str]:
    """`func` with `block`'s init moved to a new block before `loop`, and that block's name."""

    def fail(reason: str) -> Exception:
        return schedule_error("decompose_reduction", reason, func, block=block.name)

    if block.init is None:
        raise fail(f"block @{block.name} has no init to decompose")
    loops = loops_of(block_path(func, block))
    pos = next((n for n, lp in enumerate(loops) if lp.var == loop.var), None)
    if pos is None:
        raise schedule_error(
            "decompose_reduction",
            f"loop %{loop.var.name} is not an ancestor of block @{block.name}",
            func,
            loop=loop.var,
        )
    above = {lp.var for lp in loops[:pos]}
    for iv in block.iter_vars:
        outer = free_vars(iv.binding) & above if iv.kind == "reduce" else set()
        if outer:
            raise fail(
                f"reduce iter var {iv.var.name} is bound to loop %{min(outer, key=str).name}, "
                f"above loop %{loop.var.name}: an init before it would reset the partial result "
                "on every iteration of that loop"
            )
    # A reader of the output under `loop` is left alone: it only ever sees finished elements.
    _check_sole_user(block, loop, fail, "initializing it before the loop", reads=False)
    spatial = binding_loops(block, "spatial")
    copies = [lp for lp in loops[pos:] if lp.var in spatial]
    taken = taken_names(func)
    renamed = {lp.var: Var(unique_name(f"{lp.var.name}_init", taken)) for lp in copies}
    name = unique_name(f"{block.name}_init", block_names(func))
    init = _init_block(block, name, {lp.var for lp in loops[pos:]} - spatial, fail)
    ranges = loop_ranges(func) | {renamed[lp.var]: lp.extent for lp in copies}
    nest: Stmt = substitute_simplify(init, renamed, ranges)
    for lp in reversed(copies):
        nest = For(renamed[lp.var], lp.extent, lp.kind, nest, lp.annotations)
    body = replace_at(func.body, is_block(block.name), _without_init)
    body = replace_at(body, is_loop(loop.var), lambda s: seq(nest, s))
    return replace(func, body=body), name


def _init_block(block: Block, name: str, dropped_loops: set[Var], fail: Fail) -> Block:
    """The init of `block` as a block of its own: spatial iter vars only, and the predicate's
    conjuncts that do not depend on the reduction (they hold where the init ran before)."""
    assert block.init is not None
    dropped = dropped_loops | {iv.var for iv in block.iter_vars if iv.kind == "reduce"}
    kept = []
    for c in conjuncts(block.predicate):
        used = free_vars(c)
        if not used & dropped:
            kept.append(c)
        elif used - dropped:
            raise fail(f"predicate {c} mixes reduction and spatial loops")
    return Block(
        name,
        tuple(iv for iv in block.iter_vars if iv.kind == "spatial"),
        loads_in(block.init),
        block.writes,
        block.init,
        predicate=conjoin(kept),
    )


def _without_init(stmt: Stmt) -> Stmt:
    match stmt:
        case Block():
            return replace(stmt, init=None)
    return stmt


def _check_sole_user(block: Block, loop: For, fail: Fail, change: str, reads: bool = True) -> None:
    """No other block under `loop` may write (or read) the output: `change` would move what
    it sees."""
    outs = {w.buffer.name for w in block.writes}
    for other in all_blocks(loop.body):
        if other.name == block.name or any(b.name == block.name for b in all_blocks(other)):
            continue
        shared = outs & touched_buffers(other, reads)
        if shared:
            raise fail(
                f"block @{other.name} under loop %{loop.var.name} also "
                f"{'accesses' if reads else 'writes'} "
                f"%{min(shared)}: {change} would change what it sees"
            )


# ---------------------------------------------------------------------------------------------
# rfactor


@dataclass(frozen=True, slots=True)
class Reduction:
    """`out[indices] = out[indices] op rhs` (or `rhs op out[indices]` when not out_first)."""

    out: Buffer
    indices: tuple[Expr, ...]
    op: str
    rhs: Expr
    out_first: bool

    def combine(self, acc: Expr, value: Expr) -> Expr:
        return Binary(self.op, acc, value) if self.out_first else Binary(self.op, value, acc)


def rfactor_loop(func: PrimFunc, loop: For, factor_axis: int) -> tuple[PrimFunc, str]:
    """`func` with the reduction under `loop` factored over `loop`'s var, and the rfactor
    block's name."""

    def fail(reason: str, at_loop: bool = False) -> Exception:
        return schedule_error("rfactor", reason, func, loop=loop.var if at_loop else None)

    block = _sole_block(func, loop, fail)
    red = match_reduction(block, fail)
    loops = loops_of(block_path(func, block))
    reduce_vars, spatial_vars = binding_loops(block, "reduce"), binding_loops(block, "spatial")
    if loop.var not in reduce_vars:
        raise fail(f"loop %{loop.var.name} feeds no reduce iter var of @{block.name}", True)
    for lp in loops:
        if lp.var in reduce_vars and lp.var in spatial_vars:
            raise fail(f"loop %{lp.var.name} feeds both spatial and reduce iter vars", True)
    ndim = len(red.out.shape)
    if not -(ndim + 1) <= factor_axis <= ndim:
        raise fail(f"factor_axis {factor_axis} out of range for a rank-{ndim} output")
    reducing = [lp for lp in loops if lp.var in reduce_vars]
    top = reducing[0]
    _check_sole_user(block, top, fail, "the write-back after the loop")
    axis = factor_axis % (ndim + 1)
    taken = taken_names(func)
    shape = red.out.shape[:axis] + (loop.extent,) + red.out.shape[axis:]
    rf_buf = Buffer(unique_name(f"{red.out.name}_rf", taken), shape, red.out.dtype)
    new_ivs = _rf_iter_vars(block, reducing, taken)
    rf_name = unique_name(f"{block.name}_rf", block_names(func))
    rf = _rf_block(func, block, red, reducing, new_ivs, (loop, rf_buf, axis), rf_name)
    start = next(n for n, lp in enumerate(loops) if lp.var == top.var)
    wb = _write_back(
        func, block, red, loops[start:], (loop, rf_buf, axis), new_ivs[loop.var], taken, fail
    )
    body = replace_at(func.body, is_block(block.name), lambda _: rf)
    body = replace_at(body, is_loop(top.var), lambda s: seq(s, wb))
    return replace(func, body=_allocate_first(body, rf_buf)), rf.name


def _sole_block(func: PrimFunc, loop: For, fail: Fail) -> Block:
    blocks = list(all_blocks(loop.body))
    if len(blocks) != 1:
        found = ", ".join(f"@{b.name}" for b in blocks) or "none"
        raise fail(f"loop %{loop.var.name} must hold exactly one block, it holds {found}", True)
    return blocks[0]


def match_reduction(block: Block, fail: Fail) -> Reduction:
    """The reduction `block` computes; ScheduleError unless it is `init { out = v }` and
    `out = out OP expr` with OP one of COMBINERS and expr free of `out`."""
    red: Reduction | None = None
    match block.body:
        case BufferStore(out, idx, Binary(op, a, b)) if op in COMBINERS:
            acc = BufferLoad(out, idx)
            if a == acc:
                red = Reduction(out, idx, op, b, True)
            elif b == acc:
                red = Reduction(out, idx, op, a, False)
    if red is None or _loads(red.rhs, red.out):
        raise fail(
            f"the update of @{block.name} is not `out = out OP expr` with OP one of "
            f"{', '.join(COMBINERS)} and expr free of out: {block.body}"
        )
    match block.init:
        case BufferStore(out, idx) if out == red.out and idx == red.indices:
            pass
        case _:
            raise fail(f"block @{block.name} has no init storing to the element it updates")
    if not (is_float(red.out.dtype) or is_int(red.out.dtype)):
        raise fail(f"no identity for {red.op} on {red.out.dtype}")
    return red


def _loads(expr: Expr, buffer: Buffer) -> bool:
    return any(isinstance(n, BufferLoad) and n.buffer == buffer for n in walk(expr))


def identity(op: str, dtype: str) -> Expr:
    """The element `x` with `x op y == y`: what each partial starts from."""
    if is_float(dtype):
        lo, hi = -math.inf, math.inf
    else:
        info = np.iinfo(numpy_dtype(dtype))
        lo, hi = int(info.min), int(info.max)
    value = {"+": 0, "*": 1, "max": lo, "min": hi}[op]
    return const(value, dtype)


def _insert(items: tuple, axis: int, item: object) -> tuple:
    return (*items[:axis], item, *items[axis:])


def _rf_iter_vars(block: Block, reducing: list[For], taken: set[str]) -> dict[Var, Var]:
    """One iter var per loop that feeds the reduction. A reduce iter var bound to exactly that
    loop lends its name, so an unsplit reduction reads as before."""
    plain = {iv.binding: iv.var for iv in block.iter_vars if iv.kind == "reduce"}
    return {
        lp.var: plain.get(lp.var) or Var(unique_name(f"v{lp.var.name}", taken)) for lp in reducing
    }


def _rf_block(
    func: PrimFunc,
    block: Block,
    red: Reduction,
    reducing: list[For],
    new_ivs: Mapping[Var, Var],
    rf: tuple[For, Buffer, int],
    name: str,
) -> Block:
    """The original block, reducing into `rf_buf[..., loop's iter var, ...]` and starting each
    partial from the identity (the original init is applied once, by the write-back)."""
    loop, rf_buf, axis = rf
    rf_var = new_ivs[loop.var]
    ivs = [iv for iv in block.iter_vars if iv.kind == "spatial"]
    ivs.append(IterVar(rf_var, "spatial", loop.extent, loop.var))
    ivs += [
        IterVar(new_ivs[lp.var], "reduce", lp.extent, lp.var)
        for lp in reducing
        if lp.var != loop.var
    ]
    # Each old reduce iter var becomes its binding over the new per-loop iter vars.
    sigma: dict[Var, Expr] = {
        iv.var: substitute(iv.binding, new_ivs)  # type: ignore[misc]
        for iv in block.iter_vars
        if iv.kind == "reduce" and iv.var not in new_ivs.values()
    }
    idx = _insert(red.indices, axis, rf_var)
    writes = tuple(
        BufferRegion(rf_buf, _insert(w.region, axis, rf_var)) if w.buffer == red.out else w
        for w in block.writes
    )
    new = Block(
        name,
        tuple(ivs),
        block.reads,
        writes,
        BufferStore(rf_buf, idx, red.combine(BufferLoad(rf_buf, idx), red.rhs)),
        BufferStore(rf_buf, idx, identity(red.op, red.out.dtype)),
        block.predicate,
        block.annotations,
    )
    ranges = loop_ranges(func) | {new_ivs[lp.var]: lp.extent for lp in reducing}
    return substitute_simplify(new, sigma, ranges)  # type: ignore[return-value]


def _write_back(
    func: PrimFunc,
    block: Block,
    red: Reduction,
    inner: list[For],
    rf: tuple[For, Buffer, int],
    rf_var: Var,
    taken: set[str],
    fail: Fail,
) -> Stmt:
    """The block `<name>` combining the partials into the output (with the original init),
    under serial copies of the loops of `inner` that it needs."""
    loop, rf_buf, axis = rf
    spatial = binding_loops(block, "spatial")
    copies = [lp for lp in inner if lp.var in spatial or lp.var == loop.var]
    renamed = {lp.var: Var(unique_name(f"{lp.var.name}_wb", taken)) for lp in copies}
    ranges = loop_ranges(func) | {renamed[lp.var]: lp.extent for lp in copies}
    partial = BufferLoad(rf_buf, _insert(red.indices, axis, rf_var))
    acc = BufferLoad(red.out, red.indices)
    ivs = [iv for iv in block.iter_vars if iv.kind == "spatial"]
    wb = Block(
        block.name,
        (*ivs, IterVar(rf_var, "reduce", loop.extent, loop.var)),
        (point_region(partial),),
        block.writes,
        BufferStore(red.out, red.indices, red.combine(acc, partial)),
        block.init,
    )
    wb = substitute_simplify(wb, renamed, ranges)  # type: ignore[assignment]
    others = [lp for lp in inner if lp.var not in renamed]
    pred = _write_back_predicate(block, others, renamed, ranges, fail)
    nest: Stmt = replace(wb, predicate=pred)
    for lp in reversed(copies):
        nest = For(renamed[lp.var], lp.extent, "serial", nest)
    return nest


def _write_back_predicate(
    block: Block,
    others: list[For],
    renamed: Mapping[Var, Var],
    ranges: dict,
    fail: Fail,
) -> Expr | None:
    """Where the write-back may read a partial: where the rfactor block's init ran for it,
    i.e. the predicate with the other reduction loops at 0. Sound only when a conjunct false
    there is false for every value of those loops (non-negative coefficients in them)."""
    if block.predicate is None:
        return None
    reduce_bindings = {iv.var: iv.binding for iv in block.iter_vars if iv.kind == "reduce"}
    zeros = {lp.var: IntImm(0) for lp in others if lp.var in binding_loops(block, "reduce")}
    kept = []
    for c in conjuncts(substitute(block.predicate, reduce_bindings)):  # type: ignore[arg-type]
        used = free_vars(c)
        stray = used & {lp.var for lp in others} - set(zeros)
        if stray or not _monotone(c, used & set(zeros), ranges):
            raise fail(f"predicate {c} of @{block.name} hides which partials the rfactor fills")
        new = arith.simplify(substitute(c, {**renamed, **zeros}), ranges)  # type: ignore[arg-type]
        if new != arith.TRUE:
            kept.append(new)
    return conjoin(kept)


def _monotone(cond: Expr, vars: set[Var], ranges: dict) -> bool:
    """`cond` can only turn false as `vars` grow from 0."""
    if not vars:
        return True
    match cond:
        case Binary("<" | "<=", a, b):
            diff = a - b
        case Binary(">" | ">=", a, b):
            diff = b - a
        case _:
            return False
    coeffs = arith.affine_coefficients(diff, vars, ranges)
    return coeffs is not None and all(coeffs[v] >= 0 for v in vars)


def _allocate_first(body: Stmt, buffer: Buffer) -> Stmt:
    """`body` declaring `buffer` after its leading allocations."""
    stmts = body.stmts if isinstance(body, Seq) else (body,)
    n = 0
    while n < len(stmts) and isinstance(stmts[n], Allocate):
        n += 1
    return seq(*stmts[:n], Allocate(buffer), *stmts[n:])
