"""Generic traversals of hextir: walk every node, rebuild with a function, substitute vars.

substitute(expr_or_stmt, {i: j * 4 + k})
map_stmt(func.body, expr_fn=simplify)       # every expression, bindings and regions too
[n for n in walk(func.body) if isinstance(n, BufferLoad)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from hexir.ir.tir import (
    Allocate,
    Barrier,
    Binary,
    Block,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Call,
    Cast,
    Expr,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    IterVar,
    Range,
    Select,
    Seq,
    Stmt,
    Unary,
    Var,
    seq,
)

Node = Expr | Stmt
ExprFn = Callable[[Expr], Expr]
StmtFn = Callable[[Stmt], Stmt]


def children(node: Node) -> Iterator[Node]:
    """The direct child expressions and statements of `node`, in printing order."""
    match node:
        case Var() | IntImm() | FloatImm() | Allocate() | Barrier():
            return
        case Binary(_, a, b):
            yield a
            yield b
        case Unary(_, a) | Cast(_, a):
            yield a
        case Call(_, args):
            yield from args
        case Select(c, t, e):
            yield from (c, t, e)
        case BufferLoad(_, indices):
            yield from indices
        case For(_, _, _, body, _):
            yield body
        case Block():
            yield from (iv.binding for iv in node.iter_vars)
            for region in node.reads + node.writes:
                yield from _region_exprs(region)
            if node.predicate is not None:
                yield node.predicate
            if node.init is not None:
                yield node.init
            yield node.body
        case BufferStore(_, indices, value):
            yield from indices
            yield value
        case IfThenElse(cond, then, else_):
            yield cond
            yield then
            if else_ is not None:
                yield else_
        case Seq(stmts):
            yield from stmts
        case _:
            raise TypeError(f"not a hextir node: {node!r}")


def _region_exprs(region: BufferRegion) -> Iterator[Expr]:
    for r in region.region:
        if isinstance(r, Range):
            yield r.start
            yield r.stop
        else:
            yield r


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node` (itself included), pre-order."""
    stack = [node]
    pop, push = stack.pop, stack.extend
    while stack:
        n = pop()
        yield n
        kids = _REVERSED_CHILDREN.get(type(n))
        push(kids(n) if kids is not None else reversed(list(children(n))))


# `children` in reverse, for the node types that fill IR trees, without a generator: `walk`
# runs over whole kernels many times a build (a conv candidate's C took ~1 s to generate, a
# third of it walking), and the generator per node was most of that.
_REVERSED_CHILDREN: dict[type, Callable[..., tuple | list]] = {
    Var: lambda n: (),
    IntImm: lambda n: (),
    FloatImm: lambda n: (),
    Allocate: lambda n: (),
    Barrier: lambda n: (),
    Binary: lambda n: (n.b, n.a),
    Unary: lambda n: (n.a,),
    Cast: lambda n: (n.value,),
    Call: lambda n: n.args[::-1],
    Select: lambda n: (n.else_, n.then, n.cond),
    BufferLoad: lambda n: n.indices[::-1],
    For: lambda n: (n.body,),
    BufferStore: lambda n: (n.value, *n.indices[::-1]),
    IfThenElse: lambda n: (n.then, n.cond) if n.else_ is None else (n.else_, n.then, n.cond),
    Seq: lambda n: n.stmts[::-1],
}


def map_expr(expr: Expr, fn: ExprFn) -> Expr:
    """Rebuild `expr` bottom-up, applying `fn` to every node after its children."""
    new: Expr
    match expr:
        case Var() | IntImm() | FloatImm():
            new = expr
        case Binary(op, a, b):
            new = Binary(op, map_expr(a, fn), map_expr(b, fn))
        case Unary(op, a):
            new = Unary(op, map_expr(a, fn))
        case Cast(dtype, a):
            new = Cast(dtype, map_expr(a, fn))
        case Call(name, args):
            new = Call(name, tuple(map_expr(a, fn) for a in args))
        case Select(c, t, e):
            new = Select(map_expr(c, fn), map_expr(t, fn), map_expr(e, fn))
        case BufferLoad(buffer, indices):
            new = BufferLoad(buffer, tuple(map_expr(i, fn) for i in indices))
        case _:
            raise TypeError(f"not a hextir expression: {expr!r}")
    return fn(new)


def map_stmt(stmt: Stmt, expr_fn: ExprFn | None = None, stmt_fn: StmtFn | None = None) -> Stmt:
    """Rebuild `stmt` bottom-up: `expr_fn` maps every expression (via map_expr on each node),
    `stmt_fn` every statement after its children. Seqs are rebuilt in canonical form."""

    def ex(e: Expr) -> Expr:
        return map_expr(e, expr_fn) if expr_fn is not None else e

    def st(s: Stmt) -> Stmt:
        return map_stmt(s, expr_fn, stmt_fn)

    match stmt:
        case For(var, extent, kind, body, ann):
            new: Stmt = For(var, extent, kind, st(body), ann)
        case Block():
            new = replace(
                stmt,
                iter_vars=tuple(replace(iv, binding=ex(iv.binding)) for iv in stmt.iter_vars),
                reads=tuple(_map_region(r, ex) for r in stmt.reads),
                writes=tuple(_map_region(r, ex) for r in stmt.writes),
                predicate=None if stmt.predicate is None else ex(stmt.predicate),
                init=None if stmt.init is None else st(stmt.init),
                body=st(stmt.body),
            )
        case BufferStore(buffer, indices, value):
            new = BufferStore(buffer, tuple(ex(i) for i in indices), ex(value))
        case IfThenElse(cond, then, else_):
            new = IfThenElse(ex(cond), st(then), None if else_ is None else st(else_))
        case Seq(stmts):
            new = seq(*(st(s) for s in stmts))
        case Allocate() | Barrier():
            new = stmt
        case _:
            raise TypeError(f"not a hextir statement: {stmt!r}")
    return stmt_fn(new) if stmt_fn is not None else new


def _map_region(region: BufferRegion, ex: ExprFn) -> BufferRegion:
    axes = tuple(
        Range(ex(r.start), ex(r.stop)) if isinstance(r, Range) else ex(r) for r in region.region
    )
    return BufferRegion(region.buffer, axes)


def substitute(node: Node, mapping: Mapping[Var, Expr]) -> Node:
    """Replace vars by expressions everywhere in an expression or a statement."""
    if not mapping:
        return node

    def fn(e: Expr) -> Expr:
        return mapping.get(e, e) if isinstance(e, Var) else e

    if isinstance(node, (For, Block, BufferStore, IfThenElse, Seq, Allocate, Barrier)):
        return map_stmt(node, expr_fn=fn)
    return map_expr(node, fn)


def free_vars(node: Node) -> set[Var]:
    """Vars used in `node` and not bound by a loop or block inside it."""
    used: set[Var] = set()
    bound: set[Var] = set()
    for n in walk(node):
        if isinstance(n, Var):
            used.add(n)
        elif isinstance(n, For):
            bound.add(n.var)
        elif isinstance(n, Block):
            bound.update(iv.var for iv in n.iter_vars)
    return used - bound


def iter_var_map(block: Block) -> dict[Var, IterVar]:
    return {iv.var: iv for iv in block.iter_vars}
