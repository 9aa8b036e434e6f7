"""Loop primitives: split, fuse, reorder.

Each Schedule method resolves its handles, calls the pure rewrite below it (PrimFunc in,
PrimFunc out, ScheduleError on an illegal use), and records one instruction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from hexir.ir import arith
from hexir.ir.names import unique_name
from hexir.ir.symbolic import Dim, Sym, SymbolicError
from hexir.ir.tir import (
    Binary,
    Block,
    BufferLoad,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    IntImm,
    PrimFunc,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import substitute as subst
from hexir.ir.visit import walk
from hexir.schedule.common import (
    find_path,
    is_loop,
    loop_ranges,
    loops_of,
    replace_body,
    schedule_error,
    sub_stmts,
    substitute_simplify,
    taken_names,
)
from hexir.schedule.compute_region import Span, access_span
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.trace import ExprRV, LoopRV


class LoopPrimitives(ScheduleBase):
    @primitive
    def split(self, loop: LoopRV, factors: Sequence[int | ExprRV | None]) -> list[LoopRV]:
        """Split `loop` into nested loops of extents `factors` (one may be None: inferred).

        `sch.split(i, [None, 32])` on `for %i in 0..1000` gives

            for %i_0 in 0..32 serial {
              for %i_1 in 0..32 serial {
                block @add(vi = spatial(1000) %i_0 * 32 + %i_1) where %i_0 * 32 + %i_1 < 1000 ...

        The new loops are serial and named `<var>_0`, `<var>_1`, ...; a product of factors
        larger than the extent guards the blocks under the loop with a predicate.
        """
        node = self._loop(loop, "split")
        sizes = [None if f is None else self._int(f, "split") for f in factors]
        func, new_vars = split_loop(self.func, node, sizes)
        inputs = (("loop", loop), ("factors", list(factors)))
        outs = self._commit("split", inputs, (), func, [(LoopRV, v) for v in new_vars])
        return outs  # type: ignore[return-value]

    @primitive
    def fuse(self, *loops: LoopRV) -> LoopRV:
        """Fuse directly nested loops, outermost first, into one loop `<a>_<b>_fused`.

        for %i in 0..64 serial {                for %i_j_fused in 0..4096 serial {
          for %j in 0..64 serial {        ->      block @add(vi = spatial(64)
            block @add(vi = spatial(64) %i,          floordiv(%i_j_fused, 64),
                       vj = spatial(64) %j)          vj = spatial(64) floormod(%i_j_fused, 64))
        """
        nodes = [self._loop(rv, "fuse") for rv in loops]
        func, var = fuse_loops(self.func, nodes)
        (out,) = self._commit("fuse", (("*loops", list(loops)),), (), func, [(LoopRV, var)])
        return out  # type: ignore[return-value]

    @primitive
    def merge(self, first: LoopRV, second: LoopRV) -> None:
        """Run loop `second`'s body inside loop `first`, after `first`'s body (Halide's
        compute_with): two loops of one extent, `second` right after `first`.

            for %i in 0..16 serial {               for %i in 0..16 serial {
              block @exp(vi = spatial(1024)          block @exp(...)
                     %i * 64 + %j) ...        ->     block @sum_rf(..., vk = reduce(16) %i)
            }                                      }
            for %k in 0..16 serial {
              block @sum_rf(..., vk = reduce(16) %k)
            }

        Legal where, of what `first` writes, `second` reads at an iteration only what `first`
        wrote at that same iteration (and never writes again), `first` reads nothing
        `second` writes, and they write no buffer in common; `second`'s loop goes away.
        """
        a, b = self._loop(first, "merge"), self._loop(second, "merge")
        func = merge_loops(self.func, a, b)
        self._commit("merge", (("first", first), ("second", second)), (), func)

    @primitive
    def reorder(self, *loops: LoopRV) -> None:
        """Put `loops` (of one perfectly nested chain) in the given order, outermost first.

            for %i in 0..64 serial {              for %k in 0..64 serial {
              for %j in 0..64 serial {      ->      for %j in 0..64 serial {
                for %k in 0..64 serial {              for %i in 0..64 serial {
                  block @matmul(...)                    block @matmul(...)

        `sch.reorder(k, j, i)`. Loops of the chain not named keep their place; kinds and
        annotations move with their loop.
        """
        nodes = [self._loop(rv, "reorder") for rv in loops]
        func = reorder_loops(self.func, nodes)
        self._commit("reorder", (("*loops", list(loops)),), (), func)


# ---------------------------------------------------------------------------------------------
# split


def split_loop(
    func: PrimFunc, loop: For, factors: Sequence[int | None]
) -> tuple[PrimFunc, list[Var]]:
    """`func` with `loop` split into loops of extents `factors`, and the new loop vars."""
    sizes = _split_sizes(func, loop, factors)
    taken = taken_names(func)
    new_vars = [Var(unique_name(f"{loop.var.name}_{n}", taken)) for n in range(len(sizes))]
    ranges = loop_ranges(func) | dict(zip(new_vars, sizes, strict=True))
    index: Expr = new_vars[0]
    for v, f in zip(new_vars[1:], sizes[1:], strict=True):
        index = index * f + v
    index = arith.simplify(index, ranges)
    body = substitute_simplify(loop.body, {loop.var: index}, ranges)
    if math.prod(sizes) != loop.extent:
        cond = arith.simplify(Binary("<", index, IntImm(loop.extent)), ranges)
        body = add_predicate(body, cond)
    for v, f in reversed(list(zip(new_vars, sizes, strict=True))):
        body = For(v, f, "serial", body)
    return replace_body(func, is_loop(loop.var), lambda _: body), new_vars


def _split_sizes(func: PrimFunc, loop: For, factors: Sequence[int | None]) -> list[int]:
    def fail(reason: str) -> Exception:
        return schedule_error("split", reason, func, loop=loop.var)

    if not factors:
        raise fail("no factors given")
    if list(factors).count(None) > 1:
        raise fail(f"at most one factor may be None (inferred), got {list(factors)}")
    known = [f for f in factors if f is not None]
    if any(f < 1 for f in known):
        raise fail(f"factors must be positive, got {list(factors)}")
    inferred = -(-loop.extent // math.prod(known))
    sizes = [inferred if f is None else f for f in factors]
    if math.prod(sizes) < loop.extent:
        raise fail(
            f"factors {sizes} multiply to {math.prod(sizes)}, less than the extent "
            f"{loop.extent} of loop %{loop.var.name}"
        )
    return sizes


def add_predicate(stmt: Stmt, cond: Expr) -> Stmt:
    """Guard every block (and every store outside a block) under `stmt` with `cond`."""
    match stmt:
        case Block():
            old = stmt.predicate
            return replace(stmt, predicate=cond if old is None else Binary("&&", old, cond))
        case For():
            return replace(stmt, body=add_predicate(stmt.body, cond))
        case Seq(stmts):
            return seq(*(add_predicate(s, cond) for s in stmts))
        case IfThenElse(c, then, else_):
            new_else = None if else_ is None else add_predicate(else_, cond)
            return IfThenElse(c, add_predicate(then, cond), new_else)
        case BufferStore():
            return IfThenElse(cond, stmt)
        case _:
            # Allocations and barriers stay unguarded: every thread must reach a barrier.
            return stmt


# ---------------------------------------------------------------------------------------------
# fuse


def fuse_loops(func: PrimFunc, loops: Sequence[For]) -> tuple[PrimFunc, Var]:
    """`func` with directly nested `loops` (outermost first) fused into one, and its var."""
    if not loops:
        raise schedule_error("fuse", "no loops given", func)
    _check_distinct("fuse", func, loops)
    for outer, inner in itertools.pairwise(loops):
        if not (isinstance(outer.body, For) and outer.body.var == inner.var):
            raise schedule_error(
                "fuse",
                f"loop %{inner.var.name} is not directly inside loop %{outer.var.name}: "
                "only directly nested loops fuse, outermost first",
                func,
                loop=outer.var,
            )
    name = "_".join(loop.var.name for loop in loops) + "_fused"
    fused = Var(unique_name(name, taken_names(func)))
    extents = [loop.extent for loop in loops]
    total = math.prod(extents)
    ranges = loop_ranges(func) | ({fused: total} if isinstance(total, int) else {})
    mapping: dict[Var, Expr] = {}
    for n, loop in enumerate(loops):
        index: Expr = fused
        if loop.extent == 1:
            mapping[loop.var] = IntImm(0, fused.dtype)
            continue
        # A symbolic extent (a size known at run time) fuses where no index divides by it:
        # it is the outermost of the loops of more than one iteration.
        stride = _number(math.prod(extents[n + 1 :]))
        if stride > 1:
            index = index // stride
        if math.prod(extents[:n]) != 1:
            index = index % _number(loop.extent)
        mapping[loop.var] = arith.simplify(index, ranges)
    body = substitute_simplify(loops[-1].body, mapping, ranges)
    new = For(fused, total, "serial", body)
    return replace_body(func, is_loop(loops[0].var), lambda _: new), fused


def _number(extent: Dim) -> int:
    if isinstance(extent, Sym):
        raise SymbolicError(f"fusing divides by the symbolic extent {{{extent}}}")
    return extent


def _check_distinct(primitive: str, func: PrimFunc, loops: Sequence[For]) -> None:
    seen: set[Var] = set()
    for loop in loops:
        if loop.var in seen:
            raise schedule_error(
                primitive, f"loop %{loop.var.name} given twice", func, loop=loop.var
            )
        seen.add(loop.var)


# ---------------------------------------------------------------------------------------------
# merge


def merge_loops(func: PrimFunc, first: For, second: For) -> PrimFunc:
    """`func` with loop `second`'s body run in loop `first` after its own (`merge`)."""

    def fail(reason: str) -> Exception:
        return schedule_error("merge", reason, func, loop=second.var)

    path = find_path(func.body, is_loop(first.var))
    parent = path[-2] if path is not None and len(path) > 1 else None
    stmts = list(parent.stmts) if isinstance(parent, Seq) else []
    at = next((n for n, s in enumerate(stmts) if s is first), -1)
    if at < 0 or at + 1 >= len(stmts) or stmts[at + 1] is not second:
        raise fail(f"loop %{second.var.name} does not come right after loop %{first.var.name}")
    if first.extent != second.extent:
        raise fail(f"extents {first.extent} and {second.extent} differ")
    ranges = loop_ranges(func)
    body = substitute_simplify(second.body, {second.var: first.var}, ranges)
    _check_merge(first, body, ranges, fail)
    merged = replace(first, body=seq(first.body, body))
    new_parent = seq(*stmts[:at], merged, *stmts[at + 2 :])
    return replace_body(func, lambda s: s is parent, lambda _: new_parent)


def _check_merge(first: For, body: Stmt, ranges: dict, fail: Callable[[str], Exception]) -> None:
    """The dependences `merge` keeps: see its docstring."""
    writes_a, reads_a = _accesses(first.body, store=True), _accesses(first.body, store=False)
    writes_b, reads_b = _accesses(body, store=True), _accesses(body, store=False)
    if both := writes_a.keys() & writes_b.keys():
        raise fail(f"both loops write %{next(iter(both)).name}")
    if back := reads_a.keys() & writes_b.keys():
        raise fail(f"the first loop reads %{next(iter(back)).name}, which the second writes")
    inner_a, inner_b = _inner_extents(first.body), _inner_extents(body)
    for buffer in writes_a.keys() & reads_b.keys():
        written = [_spans(i, inner_a, ranges) for i in writes_a[buffer]]
        if not all(w is not None and _own_iteration(w, first.var) for w in written):
            raise fail(f"the first loop may write an element of %{buffer.name} twice")
        for index in reads_b[buffer]:
            read = _spans(index, inner_b, ranges)
            if read is None or not any(_within(read, w, ranges) for w in written):  # type: ignore[arg-type]
                raise fail(
                    f"the second loop reads %{buffer.name} beyond what the first writes at the "
                    "same iteration"
                )


def _accesses(stmt: Stmt, store: bool) -> dict:
    """Each buffer stored (or loaded) under `stmt` -> its index tuples in the loop vars."""
    found: dict = {}
    for node in walk(stmt):
        if not isinstance(node, Block):
            continue
        env = {iv.var: iv.binding for iv in node.iter_vars}
        parts = [p for p in (node.init, node.body) if p is not None]
        kind = BufferStore if store else BufferLoad
        for part in parts:
            for access in walk(part):
                if isinstance(access, kind):
                    index = tuple(subst(i, env) for i in access.indices)
                    found.setdefault(access.buffer, []).append(index)
    return found


def _inner_extents(stmt: Stmt) -> dict[Var, int]:
    return {n.var: n.extent for n in walk(stmt) if isinstance(n, For)}


def _spans(index: tuple[Expr, ...], inner: dict, ranges: dict) -> list[Span] | None:
    spans = [access_span(i, inner, ranges) for i in index]
    return None if any(s is None for s in spans) else spans  # type: ignore[return-value]


def _own_iteration(spans: list[Span], var: Var) -> bool:
    """Whether the elements written at one iteration of `var` are written at no other: on
    some axis the start moves by at least the extent per iteration."""
    for span in spans:
        coeffs = arith.affine_coefficients(span.start, [var])
        if coeffs is not None and abs(coeffs[var]) >= span.extent:
            return True
    return False


def _within(read: list[Span], written: list[Span], ranges: dict) -> bool:
    for r, w in zip(read, written, strict=True):
        offset = arith.simplify(Binary("-", r.start, w.start), ranges)
        if not isinstance(offset, IntImm) or offset.value < 0:
            return False
        if offset.value + r.extent > w.extent:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# reorder


def reorder_loops(func: PrimFunc, loops: Sequence[For]) -> PrimFunc:
    """`func` with `loops` (all in one perfectly nested chain) in the given order."""
    if not loops:
        raise schedule_error("reorder", "no loops given", func)
    _check_distinct("reorder", func, loops)
    paths = [loops_of(find_path(func.body, is_loop(loop.var)) or []) for loop in loops]
    deepest = [loop.var for loop in max(paths, key=len)]
    for loop in loops:
        if loop.var not in deepest:
            raise schedule_error(
                "reorder",
                f"loop %{loop.var.name} is not in the nest of loop %{deepest[-1].name}",
                func,
                loop=loop.var,
            )
    positions = sorted(deepest.index(loop.var) for loop in loops)
    chain = max(paths, key=len)[positions[0] : positions[-1] + 1]
    _check_perfect(func, chain)
    order = list(chain)
    for pos, loop in zip(positions, loops, strict=True):
        order[pos - positions[0]] = loop
    body = chain[-1].body
    for loop in reversed(order):
        body = replace(loop, body=body)
    return replace_body(func, is_loop(chain[0].var), lambda _: body)


def _check_perfect(func: PrimFunc, chain: Sequence[For]) -> None:
    """Loops move only through a chain of loops with nothing else between them, over a body
    with no loop-carried dependence (stores outside blocks reading another element they write)."""
    for outer, inner in itertools.pairwise(chain):
        if outer.body is not inner:
            raise schedule_error(
                "reorder",
                f"loop %{outer.var.name} holds more than loop %{inner.var.name}: "
                "the loops to reorder must be perfectly nested",
                func,
                loop=outer.var,
            )
    dep = _carried_dependence(chain[-1].body)
    if dep is not None:
        raise schedule_error("reorder", dep, func, loop=chain[0].var)


def _carried_dependence(stmt: Stmt) -> str | None:
    stores = list(_raw_stores(stmt))
    written = {(s.buffer, s.indices) for s in stores}
    buffers = {s.buffer for s in stores}
    for s in stores:
        for n in walk(s.value):
            match n:
                case BufferLoad(buffer, indices) if buffer in buffers:
                    if (buffer, indices) not in written:
                        return (
                            f"a store to %{buffer.name} outside any block reads another element "
                            "of it: reordering could change the result"
                        )
    return None


def _raw_stores(stmt: Stmt) -> Iterator[BufferStore]:
    """The stores under `stmt` that are outside any block."""
    match stmt:
        case BufferStore():
            yield stmt
        case Block():
            return
        case _:
            for child in sub_stmts(stmt):
                yield from _raw_stores(child)
