"""Facts about a PrimFunc that tools report: how many floating-point operations it does."""

from __future__ import annotations

from hexir.ir.dtype import is_float
from hexir.ir.tir import (
    Binary,
    Block,
    BufferStore,
    Call,
    Expr,
    For,
    IfThenElse,
    PrimFunc,
    Select,
    Seq,
    Stmt,
)
from hexir.ir.visit import children


def flop_count(func: PrimFunc) -> int:
    """Floating-point operations of one call: per store, its float arithmetic (each +, -, *,
    /, min, max and math call counts 1) times the iterations of the loops around it.
    A predicate or `if` is assumed true, so split tails are counted as full tiles; of a
    select, the costlier value is counted."""
    return _flops(func.body, 1)


def _flops(stmt: Stmt, trips: int) -> int:
    match stmt:
        case For(_, extent, _, body, _):
            return _flops(body, trips * extent)
        case Seq(stmts):
            return sum(_flops(s, trips) for s in stmts)
        case Block():
            # The init runs once per output element; its arithmetic is not worth counting.
            return _flops(stmt.body, trips)
        case IfThenElse(_, then, else_):
            return _flops(then, trips) + (0 if else_ is None else _flops(else_, trips))
        case BufferStore(_, _, value):
            return trips * _expr_flops(value)
        case _:
            return 0


def _expr_flops(expr: Expr) -> int:
    """The float arithmetic of one evaluation of `expr`: of a select, the costlier of its two
    values (one of them is evaluated; a case split on a loop var, as Winograd's transforms
    are written, is one case an element, not all of them)."""
    if isinstance(expr, Select):
        return _expr_flops(expr.cond) + max(_expr_flops(expr.then), _expr_flops(expr.else_))
    own = 1 if isinstance(expr, (Binary, Call)) and is_float(expr.dtype) else 0
    return own + sum(_expr_flops(c) for c in children(expr))
