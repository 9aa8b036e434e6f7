"""Interval bounds of integer index expressions under loop ranges.

    bound(i0 * 32 + i1, {i0: 4, i1: 32})            # Interval(0, 127)
    bound(floormod(i, 8), {i: Interval(3, 5)})      # Interval(3, 5)

Bounds are inclusive; None is unbounded on that side. They are sound, not always tight:
an expression that repeats a var (`i - i`) is bounded as if each use were independent, which
is why `simplify` cancels terms before it asks for bounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hexir.ir.dtype import is_int
from hexir.ir.tir import Binary, Cast, Expr, IntImm, Select, Unary, Var

INF = math.inf
_Num = int | float  # an int, or ±inf for an open side (internal only)


@dataclass(frozen=True, slots=True)
class Interval:
    """The inclusive integer interval [lo, hi]; None is unbounded on that side."""

    lo: int | None = None
    hi: int | None = None

    @staticmethod
    def point(value: int) -> Interval:
        return Interval(value, value)

    @property
    def is_point(self) -> bool:
        return self.lo is not None and self.lo == self.hi

    def _lo(self) -> _Num:
        return -INF if self.lo is None else self.lo

    def _hi(self) -> _Num:
        return INF if self.hi is None else self.hi

    def __add__(self, other: Interval) -> Interval:
        return _make(self._lo() + other._lo(), self._hi() + other._hi())

    def __neg__(self) -> Interval:
        return _make(-self._hi(), -self._lo())

    def __sub__(self, other: Interval) -> Interval:
        return self + (-other)

    def __mul__(self, other: Interval) -> Interval:
        ends = [_mul(a, b) for a in (self._lo(), self._hi()) for b in (other._lo(), other._hi())]
        return _make(min(ends), max(ends))

    def union(self, other: Interval) -> Interval:
        return _make(min(self._lo(), other._lo()), max(self._hi(), other._hi()))

    def floordiv(self, c: int) -> Interval:
        """Bounds of floordiv(x, c) for a constant c > 0."""
        return _make(_fdiv(self._lo(), c), _fdiv(self._hi(), c))

    def floormod(self, c: int) -> Interval:
        """Bounds of floormod(x, c) for a constant c > 0: exact when x stays in one period."""
        if self.lo is not None and self.hi is not None and self.lo // c == self.hi // c:
            return Interval(self.lo % c, self.hi % c)
        return Interval(0, c - 1)


def _mul(a: _Num, b: _Num) -> _Num:
    # 0 * inf is 0 here: a side pinned at zero stays at zero whatever the other factor.
    return 0 if a == 0 or b == 0 else a * b


def _fdiv(a: _Num, c: int) -> _Num:
    return a if math.isinf(a) else a // c


def _make(lo: _Num, hi: _Num) -> Interval:
    return Interval(None if math.isinf(lo) else int(lo), None if math.isinf(hi) else int(hi))


UNBOUNDED = Interval()
Ranges = Mapping[Var, Interval] | Mapping[Var, int]


def normalize_ranges(ranges: Ranges | None) -> dict[Var, Interval]:
    """Ranges as intervals: an int extent n means [0, n - 1]."""
    if not ranges:
        return {}
    return {v: r if isinstance(r, Interval) else Interval(0, r - 1) for v, r in ranges.items()}


def bound(expr: Expr, ranges: Ranges | None = None) -> Interval:
    """Interval bounds of an integer (or bool) expression given the ranges of its vars."""
    return bound_in(expr, normalize_ranges(ranges))


def bound_in(expr: Expr, rng: Mapping[Var, Interval]) -> Interval:
    """`bound` with ranges already normalized (the simplifier's inner loop calls this)."""
    if expr.dtype == "bool":
        return Interval(0, 1) if not isinstance(expr, IntImm) else Interval.point(expr.value)
    if not is_int(expr.dtype):
        return UNBOUNDED
    match expr:
        case IntImm(value):
            return Interval.point(value)
        case Var():
            return rng.get(expr, UNBOUNDED)
        case Unary("-", a):
            return -bound_in(a, rng)
        case Binary(op, a, b):
            return _bound_binary(op, bound_in(a, rng), bound_in(b, rng))
        case Select(_, then, else_):
            return bound_in(then, rng).union(bound_in(else_, rng))
        case Cast(_, value) if is_int(value.dtype) or value.dtype == "bool":
            return bound_in(value, rng)
        case _:
            return UNBOUNDED


def _bound_binary(op: str, a: Interval, b: Interval) -> Interval:
    match op:
        case "+":
            return a + b
        case "-":
            return a - b
        case "*":
            return a * b
        case "min":
            return _make(min(a._lo(), b._lo()), min(a._hi(), b._hi()))
        case "max":
            return _make(max(a._lo(), b._lo()), max(a._hi(), b._hi()))
        case "floordiv" if b.lo is not None and b.lo > 0:
            return a.floordiv(b.lo) if b.is_point else _div_by_range(a, b)
        case "floormod" if b.lo is not None and b.lo > 0:
            return a.floormod(b.lo) if b.is_point else _mod_by_range(a, b)
    return UNBOUNDED


def _div_by_range(a: Interval, b: Interval) -> Interval:
    # Divisor in [b.lo, b.hi] with b.lo > 0: for x >= 0 the quotient shrinks as the divisor grows.
    if a.lo is None or a.lo < 0:
        return UNBOUNDED
    lo = 0 if b.hi is None else a.lo // b.hi
    return _make(lo, _fdiv(a._hi(), b.lo))  # type: ignore[arg-type]


def _mod_by_range(a: Interval, b: Interval) -> Interval:
    hi = b._hi() - 1
    if a.lo is not None and a.lo >= 0:
        hi = min(hi, a._hi())
    return _make(0, hi)
