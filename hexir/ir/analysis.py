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
    Seq,
    Stmt,
)
from hexir.ir.visit import walk


def flop_count(func: PrimFunc) -> int:
    """Floating-point operations of one call: per store, its float arithmetic (each +, -, *,
    /, min, max and math call counts 1) times the iterations of the loops around it.
    A predicate or `if` is assumed true, so split tails are counted as full tiles."""
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
    return sum(1 for n in walk(expr) if isinstance(n, (Binary, Call)) and is_float(n.dtype))
