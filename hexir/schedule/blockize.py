"""blockize: a loop nest made into a block of its own, the block inside it computed per
iteration of the new one.

    for %i_0 in 0..4 serial {                 for %i_0 in 0..4 serial {
      for %i_1 in 0..16 serial {                block @add_o(vi_o = spatial(4) %i_0)
        block @add(vi = spatial(64)      ->         reads(%A[vi_o * 16 : vi_o * 16 + 16])
            %i_0 * 16 + %i_1) ..                    writes(%C[vi_o * 16 : vi_o * 16 + 16]) {
          %C[vi] = %A[vi] + 1.0                   for %i_1 in 0..16 serial {
                                                    block @add(vi = spatial(64)
                                                        vi_o * 16 + %i_1) ..
                                                      %C[vi] = %A[vi] + 1.0

Each iter var of the inner block is bound to an affine expression of the loops outside the
nest (its outer part) plus one of the loops inside it (its inner part, spanning R indices):
the outer part must be a multiple of R, and becomes an iter var of the new block of the same
kind, domain dom / R, bound to it divided by R; the inner block's binding is then that var
times R plus the inner part, so the inner block sees only the new block's iter vars and the
loops inside it (TVM's block scoping, `hexir/ir/verify.py`). The new block's regions are the
inner block's over the nest's loops. The inner block keeps its init (its first iteration is
the new block's first too) and may have no predicate. This is what an intrinsic replaces
(`sch.tensorize(block, ...)` reads the nest under a blockized block), and a unit the trace
can name.
"""

from __future__ import annotations

from dataclasses import replace

from hexir.ir import arith
from hexir.ir.names import unique_name
from hexir.ir.tir import (
    Binary,
    Block,
    BufferRegion,
    Expr,
    For,
    IntImm,
    IterVar,
    PrimFunc,
    Range,
    Var,
)
from hexir.ir.visit import free_vars, substitute
from hexir.schedule.common import (
    all_blocks,
    all_loops,
    find_path,
    is_loop,
    loop_ranges,
    loops_of,
    replace_at,
    replace_body,
    schedule_error,
    taken_names,
)
from hexir.schedule.compute_region import access_span
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.trace import BlockRV, LoopRV


class BlockizePrimitives(ScheduleBase):
    @primitive
    def blockize(self, loop: LoopRV) -> BlockRV:
        """The nest rooted at `loop` as a block `<inner>_o` (module docstring), which is
        returned. The nest holds one block, bound as the docstring says."""
        node = self._loop(loop, "blockize")
        func, name = blockize_loop(self.func, node)
        (rv,) = self._commit("blockize", (("loop", loop),), (), func, [(BlockRV, name)])
        return rv  # type: ignore[return-value]


def blockize_loop(func: PrimFunc, loop: For) -> tuple[PrimFunc, str]:
    """`func` with `loop`'s nest made a block, and that block's name."""

    def fail(reason: str) -> Exception:
        return schedule_error("blockize", reason, func, loop=loop.var)

    inner = list(all_blocks(loop))
    if len(inner) != 1:
        raise fail(f"the nest holds {len(inner)} blocks; blockize takes a nest of one")
    (block,) = inner
    if block.predicate is not None:
        raise fail(f"block @{block.name} has a predicate (a split that does not divide)")
    path = find_path(func.body, lambda s: s is block) or []
    inside = {lp.var: lp.extent for lp in all_loops(loop)}
    outside = {lp.var for lp in loops_of(path)} - set(inside)
    ranges = loop_ranges(func)
    taken = taken_names(func)
    outer_vars: list[IterVar] = []
    rebound: list[IterVar] = []
    for iv in block.iter_vars:
        split = _split_binding(iv, inside, outside, ranges)
        if isinstance(split, str):
            raise fail(f"iter var {iv.var.name}: {split}")
        if split is None:  # the nest's loops alone (or a constant)
            rebound.append(iv)
            continue
        outer, span, rest = split
        var = Var(unique_name(f"{iv.var.name}_o", taken), iv.var.dtype)
        outer_vars.append(IterVar(var, iv.kind, iv.dom // span, outer))
        binding = var if span == 1 else Binary("+", Binary("*", var, IntImm(span)), rest)
        rebound.append(replace(iv, binding=arith.simplify(binding)))
    new_inner = replace(block, iter_vars=tuple(rebound))
    mapping: dict[Var, Expr] = {iv.var: iv.binding for iv in rebound}
    outer_block = Block(
        unique_name(f"{block.name}_o", {b.name for b in all_blocks(func.body)}),
        tuple(outer_vars),
        tuple(_relaxed(r, mapping, inside, ranges) for r in block.reads),
        tuple(_relaxed(w, mapping, inside, ranges) for w in block.writes),
        replace_at(loop, lambda s: s is block, lambda _: new_inner),
    )
    return replace_body(func, is_loop(loop.var), lambda _: outer_block), outer_block.name


def _split_binding(
    iv: IterVar, inside: dict[Var, int], outside: set[Var], ranges: dict[Var, int]
) -> tuple[Expr, int, Expr] | str | None:
    """`iv`'s binding as (its outer part divided by the span of its inner part, that span,
    the inner part); None where it reads no loop outside the nest; a reason where the two
    parts do not come apart so. The inner part is affine in the nest's loops; the outer part
    (what the binding is with them at 0: a fused loop's floordiv and floormod included) must
    be provably a multiple of the span."""
    if not free_vars(iv.binding) & outside:
        return None
    coeffs = arith.affine_coefficients(iv.binding, list(inside), ranges)
    if coeffs is None:
        return "its binding is not affine in the nest's loops"
    if any(coeffs[v] < 0 for v in inside):
        return "its binding runs backwards over a loop of the nest"
    span = 1 + sum(coeffs[v] * (extent - 1) for v, extent in inside.items())
    zero: dict[Var, Expr] = {v: IntImm(0) for v in inside}
    outer = arith.simplify(substitute(iv.binding, zero), ranges)  # type: ignore[arg-type]
    multiple = arith.simplify(Binary("floormod", outer, IntImm(span)), ranges)
    if iv.dom % span or multiple != IntImm(0):
        return f"its outer part is not a multiple of the {span} indices its inner part spans"
    rest: Expr = IntImm(0)
    for v in inside:
        if coeffs[v]:
            rest = Binary("+", rest, Binary("*", v, IntImm(coeffs[v])))
    divided = outer if span == 1 else Binary("floordiv", outer, IntImm(span))
    return arith.simplify(divided, ranges), span, arith.simplify(rest, ranges)


def _relaxed(
    region: BufferRegion, mapping: dict[Var, Expr], inside: dict[Var, int], ranges: dict[Var, int]
) -> BufferRegion:
    """`region` of the inner block over every iteration of the nest's loops, as ranges."""
    axes = []
    for index in region.region:
        if isinstance(index, Range):
            axes.append(index)  # (regions of the inner block are points as lowering writes them)
            continue
        bound = arith.simplify(substitute(index, mapping), ranges)  # type: ignore[arg-type]
        span = access_span(bound, inside, ranges)
        if span is None:
            axes.append(Range(IntImm(0), IntImm(region.buffer.shape[len(axes)])))
        elif span.extent == 1 and not free_vars(span.start) & set(inside):
            axes.append(span.start)
        else:
            stop = arith.simplify(Binary("+", span.start, IntImm(span.extent)))
            axes.append(Range(span.start, stop))
    return BufferRegion(region.buffer, tuple(axes))
