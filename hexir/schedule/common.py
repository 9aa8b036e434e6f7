"""IR queries and rewrites shared by the schedule primitives.

Loops are named by their var (loop vars are unique within a function), blocks by their name.
Every rewrite builds a new tree; nothing here records anything in a trace.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from hexir.errors import ScheduleError
from hexir.ir import arith
from hexir.ir.symbolic import Sym, SymbolicError
from hexir.ir.tir import (
    Allocate,
    Barrier,
    Binary,
    Block,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    PrimFunc,
    Range,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import free_vars, substitute, walk

if TYPE_CHECKING:
    from hexir.schedule.state import ScheduleBase
    from hexir.schedule.trace import LoopRV

# ---------------------------------------------------------------------------------------------
# Finding loops and blocks


def sub_stmts(stmt: Stmt) -> tuple[Stmt, ...]:
    """The statements directly under `stmt`."""
    match stmt:
        case For(body=body):
            return (body,)
        case Block(init=init, body=body):
            return (body,) if init is None else (init, body)
        case IfThenElse(then=then, else_=else_):
            return (then,) if else_ is None else (then, else_)
        case Seq(stmts):
            return stmts
        case _:
            return ()


def index_vars(index: Expr | Range) -> set[Var]:
    """The vars one index (or range) of a buffer region uses."""
    parts = (index.start, index.stop) if isinstance(index, Range) else (index,)
    return set().union(*(free_vars(p) for p in parts))


def region_vars(region: BufferRegion) -> set[Var]:
    """The vars a buffer region's indices (or ranges) use."""
    return set().union(*(index_vars(index) for index in region.region))


def find_path(stmt: Stmt, match: Callable[[Stmt], bool]) -> list[Stmt] | None:
    """The statements from `stmt` down to the first (pre-order) one that `match`es."""
    if match(stmt):
        return [stmt]
    for child in sub_stmts(stmt):
        path = find_path(child, match)
        if path is not None:
            return [stmt, *path]
    return None


def is_loop(var: Var) -> Callable[[Stmt], bool]:
    return lambda s: isinstance(s, For) and s.var == var


def is_block(name: str) -> Callable[[Stmt], bool]:
    return lambda s: isinstance(s, Block) and s.name == name


def loops_of(path: list[Stmt]) -> list[For]:
    return [s for s in path if isinstance(s, For)]


def child_blocks(stmt: Stmt) -> list[Block]:
    """The blocks under `stmt` that are not inside another block under it, in program order."""
    out: list[Block] = []
    for child in sub_stmts(stmt):
        if isinstance(child, Block):
            out.append(child)
        else:
            out.extend(child_blocks(child))
    return out


def walk_stmts(stmt: Stmt) -> Iterator[Stmt]:
    """Every statement under `stmt` (itself included), pre-order, without descending into
    expressions: the primitives' queries need only statements, and expressions are most of
    the nodes."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        stack.extend(reversed(sub_stmts(s)))


def all_blocks(stmt: Stmt) -> Iterator[Block]:
    return (n for n in walk_stmts(stmt) if isinstance(n, Block))


def all_loops(stmt: Stmt) -> Iterator[For]:
    return (n for n in walk_stmts(stmt) if isinstance(n, For))


def taken_names(func: PrimFunc) -> set[str]:
    """Every var and buffer name in `func`: both print as `%name`, so they share a namespace.
    A valid function uses only vars its loops and blocks define, so statements suffice."""
    names = {b.name for b in func.params}
    for n in walk_stmts(func.body):
        match n:
            case For(var=var):
                names.add(var.name)
            case Block(iter_vars=ivs):
                names.update(iv.var.name for iv in ivs)
            case Allocate(buffer):
                names.add(buffer.name)
    return names


# ---------------------------------------------------------------------------------------------
# Rewriting


def replace_at(stmt: Stmt, match: Callable[[Stmt], bool], fn: Callable[[Stmt], Stmt]) -> Stmt:
    """`stmt` with the first statement that `match`es replaced by `fn(it)`; only the path down
    to it is rebuilt."""
    if match(stmt):
        return fn(stmt)
    match stmt:
        case For():
            return replace(stmt, body=replace_at(stmt.body, match, fn))
        case Block():
            init = None if stmt.init is None else replace_at(stmt.init, match, fn)
            return replace(stmt, init=init, body=replace_at(stmt.body, match, fn))
        case IfThenElse(cond, then, else_):
            new_else = None if else_ is None else replace_at(else_, match, fn)
            return IfThenElse(cond, replace_at(then, match, fn), new_else)
        case Seq(stmts):
            return seq(*(replace_at(s, match, fn) for s in stmts))
        case _:
            return stmt


def replace_body(func: PrimFunc, match: Callable[[Stmt], bool], fn: Callable) -> PrimFunc:
    return replace(func, body=replace_at(func.body, match, fn))


def map_top_exprs(stmt: Stmt, fn: Callable[[Expr], Expr]) -> Stmt:
    """Rebuild `stmt` with `fn` applied once to each whole expression in it (bindings, regions,
    predicates, indices, values, conditions), not to every sub-expression."""
    match stmt:
        case For():
            return replace(stmt, body=map_top_exprs(stmt.body, fn))
        case Block():
            return replace(
                stmt,
                iter_vars=tuple(replace(iv, binding=fn(iv.binding)) for iv in stmt.iter_vars),
                reads=tuple(_map_region(r, fn) for r in stmt.reads),
                writes=tuple(_map_region(r, fn) for r in stmt.writes),
                predicate=None if stmt.predicate is None else fn(stmt.predicate),
                init=None if stmt.init is None else map_top_exprs(stmt.init, fn),
                body=map_top_exprs(stmt.body, fn),
            )
        case BufferStore(buffer, indices, value):
            return BufferStore(buffer, tuple(fn(i) for i in indices), fn(value))
        case IfThenElse(cond, then, else_):
            new_else = None if else_ is None else map_top_exprs(else_, fn)
            return IfThenElse(fn(cond), map_top_exprs(then, fn), new_else)
        case Seq(stmts):
            return seq(*(map_top_exprs(s, fn) for s in stmts))
        case Allocate() | Barrier():
            return stmt
    raise TypeError(f"not a hextir statement: {stmt!r}")


def _map_region(region: BufferRegion, fn: Callable[[Expr], Expr]) -> BufferRegion:
    axes = tuple(
        Range(fn(r.start), fn(r.stop)) if isinstance(r, Range) else fn(r) for r in region.region
    )
    return BufferRegion(region.buffer, axes)


def substitute_simplify(stmt: Stmt, mapping: Mapping[Var, Expr], ranges: dict) -> Stmt:
    """Substitute `mapping` in `stmt` and simplify each expression that changed."""
    old = set(mapping)

    def fn(e: Expr) -> Expr:
        if not (free_vars(e) & old):
            return e
        return arith.simplify(subst(e, mapping), ranges)

    return map_top_exprs(stmt, fn)


def conjuncts(cond: Expr | None) -> list[Expr]:
    """The parts of `cond` joined by `&&` (none for None)."""
    match cond:
        case None:
            return []
        case Binary("&&", a, b):
            return conjuncts(a) + conjuncts(b)
        case _:
            return [cond]


def conjoin(conds: Iterable[Expr]) -> Expr | None:
    """`conds` joined by `&&`, in order; None for none."""
    out: Expr | None = None
    for c in conds:
        out = c if out is None else Binary("&&", out, c)
    return out


def subst(expr: Expr, mapping: Mapping[Var, Expr]) -> Expr:
    """`substitute` on an expression, typed as one."""
    return cast(Expr, substitute(expr, mapping))


def loop_ranges(func: PrimFunc) -> dict[Var, int]:
    """Each loop var's extent, for the simplifier's bound rules (a symbolic one bounds
    nothing)."""
    return {loop.var: loop.extent for loop in all_loops(func.body) if isinstance(loop.extent, int)}


def symbolic_loops(func: PrimFunc) -> dict[Var, Sym]:
    """Each loop var whose extent is symbolic (a size known at run time), and that extent."""
    return {loop.var: loop.extent for loop in all_loops(func.body) if isinstance(loop.extent, Sym)}


# ---------------------------------------------------------------------------------------------
# Dependence facts


def reduce_fed_by(stmt: Stmt, var: Var) -> tuple[Block, Var] | None:
    """A block under `stmt` with a reduce iter var whose binding depends on `var` (through
    outer blocks' iter vars too), and that iter var; None when there is none."""
    return _reduce_fed(stmt, {var})


def _reduce_fed(stmt: Stmt, tainted: set[Var]) -> tuple[Block, Var] | None:
    if isinstance(stmt, Block):
        inner = set(tainted)
        for iv in stmt.iter_vars:
            if free_vars(iv.binding) & tainted:
                if iv.kind == "reduce":
                    return stmt, iv.var
                inner.add(iv.var)
        tainted = inner
    for child in sub_stmts(stmt):
        found = _reduce_fed(child, tainted)
        if found is not None:
            return found
    return None


def accesses(stmt: Stmt, env: Mapping[Var, Expr] | None = None) -> Iterator[BufferLoad]:
    """Every buffer access under `stmt` (stores as loads of the same element), with block iter
    vars replaced by their bindings, so indices are in terms of loop vars."""
    for load, _ in guarded_accesses(stmt, env):
        yield load


def guarded_accesses(
    stmt: Stmt, env: Mapping[Var, Expr] | None = None, guards: tuple[Expr, ...] = ()
) -> Iterator[tuple[BufferLoad, tuple[Expr, ...]]]:
    """As `accesses`, each with the conditions it runs under (the blocks' predicates and the
    `if`s around it, in terms of loop vars): a split's `f1 * 8 + f2 < 128`."""
    env = dict(env or {})
    match stmt:
        case Block():
            if stmt.predicate is not None:
                guards = (*guards, subst(stmt.predicate, env))
            for iv in stmt.iter_vars:
                env[iv.var] = subst(iv.binding, env)
            for child in sub_stmts(stmt):
                yield from guarded_accesses(child, env, guards)
            return
        case BufferStore(buffer, indices, value):
            yield BufferLoad(buffer, tuple(subst(i, env) for i in indices)), guards
            exprs: tuple[Expr, ...] = (*indices, value)
        case IfThenElse(cond=cond, then=then, else_=other):
            yield from _loads(cond, env, guards)
            yield from guarded_accesses(then, env, (*guards, subst(cond, env)))
            if other is not None:
                yield from guarded_accesses(other, env, guards)
            return
        case _:
            exprs = ()
    for e in exprs:
        yield from _loads(e, env, guards)
    for child in sub_stmts(stmt):
        yield from guarded_accesses(child, env, guards)


def _loads(
    expr: Expr, env: Mapping[Var, Expr], guards: tuple[Expr, ...]
) -> Iterator[tuple[BufferLoad, tuple[Expr, ...]]]:
    for n in walk(expr):
        if isinstance(n, BufferLoad):
            yield BufferLoad(n.buffer, tuple(subst(i, env) for i in n.indices)), guards


# ---------------------------------------------------------------------------------------------
# Errors


def schedule_error(
    primitive: str,
    reason: str,
    func: PrimFunc,
    *,
    loop: Var | None = None,
    block: str | None = None,
) -> ScheduleError:
    """A ScheduleError whose IR (printed only if asked for) marks `loop` or `block`."""
    return ScheduleError(reason, primitive, lambda: marked_ir(func, loop, block))


def marked_ir(func: PrimFunc, loop: Var | None = None, block: str | None = None) -> str:
    """`func` printed, with `  <-- here` after the line that opens `loop` or `block`."""
    from hexir.ir.tir_text import print_func

    lines = print_func(func).splitlines()
    if loop is not None:
        pattern = re.compile(rf"^\s*for %{re.escape(loop.name)} in ")
    elif block is not None:
        pattern = re.compile(rf"^\s*block @{re.escape(block)}\(")
    else:
        return "\n".join(lines)
    for n, line in enumerate(lines):
        if pattern.match(line):
            lines[n] = f"{line}  <-- here"
            break
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Hand-written schedules


def attempt(action: Callable[[], object]) -> bool:
    """Run a schedule step that may refuse: False where it raises ScheduleError (a primitive
    that raises leaves the schedule as it was, so the schedule then does less), or a
    SymbolicError (the step needs a number where a kernel's extent is symbolic)."""
    try:
        action()
    except (ScheduleError, SymbolicError):
        return False
    return True


def loop_extent(sch: ScheduleBase, loop: LoopRV) -> int:
    """The extent of the loop `loop` names in `sch`."""
    node = sch.get(loop)
    assert isinstance(node, For)
    return node.extent
