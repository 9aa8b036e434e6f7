"""Integer index arithmetic: canonical simplification, proofs by bounds, affine analysis.

    simplify(floordiv(i0 * 32 + i1, 32), {i0: 8, i1: 32})     # i0
    simplify(floordiv(f, 64) * 64 + floormod(f, 64))          # f   (a fused loop, split back)
    can_prove(i0 * 32 + i1 < 256, {i0: 8, i1: 32})            # True
    affine_coefficients(vi * 1024 + vk + 3, [vi, vk])          # {vi: 1024, vk: 1, None: 3}

Canonical form of an integer expression: a sum of terms `atoms * coefficient` followed by the
constant. Terms with positive coefficients come first, larger magnitudes first, ties broken by
a structural key of the atoms, so `i1 + 32 * i0 + 0` prints as `i0 * 32 + i1`. Atoms are vars
and every non-polynomial node (floordiv, floormod, min, max, select, loads, casts, calls) with
canonical children. Float arithmetic is folded only between two constants, in the constant's
dtype, and never reassociated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache

from hexir.ir.arith_bound import Interval, Ranges, bound, bound_in, normalize_ranges
from hexir.ir.arith_eval import evaluate, fold_cast, fold_float
from hexir.ir.dtype import is_float, is_index_int, is_int
from hexir.ir.tir import (
    COMPARE_OPS,
    Binary,
    Buffer,
    BufferLoad,
    Call,
    Cast,
    Expr,
    FloatImm,
    IntImm,
    Select,
    Unary,
    Var,
    dim_expr,
)
from hexir.ir.visit import free_vars

__all__ = [
    "Interval",
    "affine_coefficients",
    "bound",
    "can_prove",
    "evaluate",
    "flat_index",
    "is_affine",
    "simplify",
]

TRUE = IntImm(1, "bool")
FALSE = IntImm(0, "bool")
_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def simplify(expr: Expr, ranges: Ranges | None = None) -> Expr:
    """The canonical form of `expr`; `ranges` (var -> Interval or extent) enables bound rules.

    Deterministic and idempotent: equal inputs give structurally equal outputs, and
    simplify(simplify(e, r), r) == simplify(e, r).
    """
    return _simplified(expr, frozenset(ranges.items()) if ranges else None)


@lru_cache(maxsize=1 << 16)
def _simplified(expr: Expr, ranges: frozenset[tuple[Var, Interval | int]] | None) -> Expr:
    # Memoized: code generation simplifies the same indices again and again (each piece of a
    # partitioned loop, each access of a vector chunk), a search the same ones in every
    # candidate of a workload.
    return _Simplifier(normalize_ranges(dict(ranges) if ranges else None)).expr(expr)


def can_prove(cond: Expr, ranges: Ranges | None = None) -> bool:
    """True when `cond` holds at every point of `ranges` (False means "not proven")."""
    return simplify(cond, ranges) == TRUE


def affine_coefficients(
    expr: Expr, vars: Iterable[Var], ranges: Ranges | None = None
) -> dict[Var | None, int] | None:
    """The coefficient of each of `vars` (0 when absent) and, under the key None, the integer
    constant; None when `expr` is not affine in `vars`. Terms free of `vars` (other loop vars,
    loads) are a symbolic offset: they appear in neither, so `vars` = the inner loop var gives
    its stride whatever the outer loops do."""
    if not is_index_int(expr.dtype):
        return None
    simp = _Simplifier(normalize_ranges(ranges))
    wanted = list(vars)
    targets = set(wanted)
    coeffs: dict[Var | None, int] = {v: 0 for v in wanted}
    coeffs[None] = 0
    for mono, c in simp.merge(simp.poly(expr)).terms.items():
        if not mono:
            coeffs[None] = c
        elif len(mono) == 1 and isinstance(v := mono[0], Var) and v in targets:
            coeffs[v] += c
        elif any(free_vars(a) & targets for a in mono):
            return None
    return coeffs


def is_affine(expr: Expr, vars: Iterable[Var]) -> bool:
    return affine_coefficients(expr, vars) is not None


# ---------------------------------------------------------------------------------------------
# Polynomials over atoms

Mono = tuple[Expr, ...]  # a product of atoms in key order; () is the constant term


@lru_cache(maxsize=1 << 16)
def _key(e: Expr) -> tuple:
    """A total order on expressions, so every sort in the canonical form is deterministic."""
    match e:
        case IntImm(v, dt):
            return (0, v, dt)
        case FloatImm(v, dt):
            return (1, repr(v), dt)
        case Var(name, dt):
            return (2, name, dt)
        case Binary(op, a, b):
            return (3, op, _key(a), _key(b))
        case Unary(op, a):
            return (4, op, _key(a))
        case Call(name, args):
            return (5, name, tuple(_key(a) for a in args))
        case Select(c, t, f):
            return (6, _key(c), _key(t), _key(f))
        case Cast(dt, v):
            return (7, dt, _key(v))
        case BufferLoad(buf, idx):
            return (8, buf.name, tuple(_key(i) for i in idx))
    raise TypeError(f"not a hextir expression: {type(e).__name__}")


class _Poly:
    """sum(coefficient * product of atoms); the constant is the term of the empty product."""

    __slots__ = ("terms", "dtype")

    def __init__(self, terms: Mapping[Mono, int], dtype: str):
        self.terms = {m: c for m, c in terms.items() if c != 0}
        self.dtype = dtype

    @staticmethod
    def num(value: int, dtype: str) -> _Poly:
        return _Poly({(): value}, dtype)

    @staticmethod
    def atom(e: Expr) -> _Poly:
        return _Poly({(e,): 1}, e.dtype)

    @property
    def const(self) -> int | None:
        """The value when the polynomial is a constant, else None."""
        return self.terms.get((), 0) if all(not m for m in self.terms) else None

    def __add__(self, other: _Poly) -> _Poly:
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return _Poly(terms, self.dtype)

    def scale(self, k: int) -> _Poly:
        return _Poly({m: c * k for m, c in self.terms.items()}, self.dtype)

    def __sub__(self, other: _Poly) -> _Poly:
        return self + other.scale(-1)

    def __mul__(self, other: _Poly) -> _Poly:
        terms: dict[Mono, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2, key=_key))
                terms[m] = terms.get(m, 0) + c1 * c2
        return _Poly(terms, self.dtype)

    def split(self, c: int) -> tuple[_Poly, _Poly]:
        """(q, r) with self == q * c + r, each coefficient of r truncated toward zero mod c:
        `i0 * 32 + i1 - 1` by 32 gives (i0, i1 - 1), which keeps remainders printable."""
        q: dict[Mono, int] = {}
        r: dict[Mono, int] = {}
        for m, k in self.terms.items():
            q[m] = k // c if k >= 0 else -(-k // c)
            r[m] = k - q[m] * c
        return _Poly(q, self.dtype), _Poly(r, self.dtype)


def _term(mono: Mono, coeff: int, dtype: str) -> Expr:
    prod = mono[0]
    for a in mono[1:]:
        prod = Binary("*", prod, a)
    if coeff == 1:
        return prod
    return Unary("-", prod) if coeff == -1 else Binary("*", prod, IntImm(coeff, dtype))


def _to_expr(p: _Poly) -> Expr:
    dt = p.dtype
    const = p.terms.get((), 0)
    terms = sorted(
        ((m, c) for m, c in p.terms.items() if m),
        key=lambda mc: (mc[1] < 0, -abs(mc[1]), tuple(_key(a) for a in mc[0])),
    )
    if not terms:
        return IntImm(const, dt)
    acc: Expr | None = None
    if terms[0][1] < 0 and const > 0:  # `5 - i`, not `-i + 5`
        acc, const = IntImm(const, dt), 0
    for m, c in terms:
        if acc is None:
            acc = _term(m, c, dt)
        else:
            acc = Binary("+" if c > 0 else "-", acc, _term(m, abs(c), dt))
    assert acc is not None
    if const:
        acc = Binary("+" if const > 0 else "-", acc, IntImm(abs(const), dt))
    return acc


def _const_of(e: Expr) -> int | None:
    return e.value if isinstance(e, IntImm) and e.dtype != "bool" else None


def _decide(op: str, d: Interval) -> bool | None:
    """The value of `a op b` given the bounds d of a - b, or None when they do not decide it."""
    lo = -math.inf if d.lo is None else d.lo
    hi = math.inf if d.hi is None else d.hi
    facts = {
        "<": (hi < 0, lo >= 0),
        "<=": (hi <= 0, lo > 0),
        ">": (lo > 0, hi <= 0),
        ">=": (lo >= 0, hi < 0),
        "==": (lo == hi == 0, lo > 0 or hi < 0),
        "!=": (lo > 0 or hi < 0, lo == hi == 0),
    }
    proven, refuted = facts[op]
    return True if proven else False if refuted else None


# ---------------------------------------------------------------------------------------------
# The simplifier


class _Simplifier:
    def __init__(self, rng: Mapping[Var, Interval]):
        self.rng = rng

    def expr(self, e: Expr) -> Expr:
        dt = e.dtype
        if is_index_int(dt):
            return _to_expr(self.merge(self.poly(e)))
        if dt == "bool":
            return self.logic(e)
        if is_float(dt):
            return self.floating(e)
        return self.rebuild(e)

    def poly(self, e: Expr) -> _Poly:
        match e:
            case IntImm(v, dt):
                return _Poly.num(v, dt)
            case Var():
                r = self.rng.get(e)
                if r is not None and r.lo is not None and r.is_point:
                    return _Poly.num(r.lo, e.dtype)  # a loop of extent 1 is its only value
                return _Poly.atom(e)
            case Binary("+", a, b):
                return self.poly(a) + self.poly(b)
            case Binary("-", a, b):
                return self.poly(a) - self.poly(b)
            case Binary("*", a, b):
                return self.poly(a) * self.poly(b)
            case Unary("-", a):
                return self.poly(a).scale(-1)
            case Binary("floordiv" | "floormod" as op, a, b):
                return self.divmod(op, self.merge(self.poly(a)), self.merge(self.poly(b)))
            case Binary("min" | "max" as op, a, b):
                return self.minmax(op, a, b)
        out = self.rebuild(e)
        if type(out) is type(e):
            return _Poly.atom(out)
        return self.poly(out)  # folded to a constant, or unwrapped to a canonical child

    def bound_poly(self, p: _Poly) -> Interval:
        total = Interval.point(0)
        for mono, c in p.terms.items():
            t = Interval.point(c)
            for a in mono:
                t = t * bound_in(a, self.rng)
            total = total + t
        return total

    def divmod(self, op: str, x: _Poly, d: _Poly) -> _Poly:
        c, xc, dt = d.const, x.const, x.dtype
        if c is not None and xc is not None and c != 0:
            return _Poly.num(xc // c if op == "floordiv" else xc % c, dt)
        if c is None or c <= 0:
            return _Poly.atom(Binary(op, _to_expr(x), _to_expr(d)))
        if c == 1:
            return x if op == "floordiv" else _Poly.num(0, dt)
        q, r = x.split(c)
        if op == "floormod":
            q = _Poly.num(0, dt)  # floormod(q * c + r, c) == floormod(r, c)
        g = math.gcd(c, *r.terms.values())
        if g > 1:  # floordiv(g*r, g*c) == floordiv(r, c); floormod(g*r, g*c) == g*floormod(r, c)
            inner = self.divmod(op, _exact_div(r, g), _Poly.num(c // g, dt))
            return q + (inner if op == "floordiv" else inner.scale(g))
        b = self.bound_poly(r)
        if b.lo is not None and b.hi is not None and b.lo // c == b.hi // c:
            k = b.lo // c  # r stays inside one period [k*c, (k+1)*c)
            return q + (_Poly.num(k, dt) if op == "floordiv" else r - _Poly.num(k * c, dt))
        flat = self.nested_divmod(op, r, c)
        if flat is None:
            flat = self.strip_low(op, r, c)
        if flat is not None:
            return q + flat
        return q + _Poly.atom(Binary(op, _to_expr(r), IntImm(c, dt)))

    def nested_divmod(self, op: str, r: _Poly, c: int) -> _Poly | None:
        """Flatten div/mod of a single div/mod atom, the shapes that fusing loops produces."""
        if len(r.terms) != 1:
            return None
        ((mono, coeff),) = r.terms.items()
        if coeff != 1 or len(mono) != 1 or not isinstance(mono[0], Binary):
            return None
        inner, a = mono[0], _const_of(mono[0].b)
        if a is None or a <= 0:
            return None
        dt, y = r.dtype, self.poly(inner.a)
        match inner.op, op:
            case "floordiv", "floordiv":
                return self.divmod("floordiv", y, _Poly.num(a * c, dt))
            case "floormod", "floordiv" if a % c == 0:
                # floordiv(floormod(y, m*c), c) == floormod(floordiv(y, c), m)
                div = self.divmod("floordiv", y, _Poly.num(c, dt))
                return self.divmod("floormod", div, _Poly.num(a // c, dt))
            case "floormod", "floormod" if a % c == 0:
                return self.divmod("floormod", y, _Poly.num(c, dt))
        return None

    def strip_low(self, op: str, r: _Poly, c: int) -> _Poly | None:
        """r = g*y + z with g | c and z in [0, g): floordiv(r, c) == floordiv(y, c/g) and
        floormod(r, c) == floormod(y, c/g)*g + z (`floordiv(i0*32 + i1, 64)` is floordiv(i0, 2)
        when i1 is in [0, 32))."""
        for g in sorted({math.gcd(c, k) for m, k in r.terms.items() if m}, reverse=True):
            if g == 1 or g == c:
                continue
            high = {m: k for m, k in r.terms.items() if m and k % g == 0}
            high[()] = r.terms.get((), 0) // g * g
            y, z = _Poly(high, r.dtype), r - _Poly(high, r.dtype)
            b = self.bound_poly(z)
            if b.lo is None or b.hi is None or b.lo < 0 or b.hi >= g:
                continue
            inner = self.divmod(op, _exact_div(y, g), _Poly.num(c // g, r.dtype))
            return inner if op == "floordiv" else inner.scale(g) + z
        return None

    def merge(self, p: _Poly) -> _Poly:
        """Fold `floordiv(x, K*J) * k*J + floormod(floordiv(x, K), J) * k` into
        `floordiv(x, K) * k` until nothing changes: fused loops indexing a buffer collapse back
        to the fused var (`floordiv(f, 64) * 64 + floormod(f, 64)` is `f`)."""
        changed = True
        while changed:
            changed = False
            for mono, k in p.terms.items():
                partner = _mod_partner(mono)
                if partner is not None and p.terms.get(partner[0]) == k * partner[1]:
                    y = mono[0].a  # type: ignore[union-attr]
                    gone = _Poly({mono: k, partner[0]: k * partner[1]}, p.dtype)
                    p = p - gone + self.poly(y).scale(k)
                    changed = True
                    break
        return p

    def minmax(self, op: str, a: Expr, b: Expr) -> _Poly:
        pa, pb = self.merge(self.poly(a)), self.merge(self.poly(b))
        d = self.bound_poly(pa - pb)
        if d.hi is not None and d.hi <= 0:
            return pa if op == "min" else pb
        if d.lo is not None and d.lo >= 0:
            return pb if op == "min" else pa
        # Operands in key order, a constant last: `max(x, 0)`, whichever way it was written.
        ea, eb = sorted(
            (_to_expr(pa), _to_expr(pb)), key=lambda e: (isinstance(e, IntImm), _key(e))
        )
        return _Poly.atom(Binary(op, ea, eb))

    def logic(self, e: Expr) -> Expr:
        match e:
            case Binary(op, a, b) if op in COMPARE_OPS:
                return self.compare(op, a, b)
            case Binary("&&" | "||" as op, a, b):
                return _and_or(op, self.expr(a), self.expr(b))
            case Unary("!", a):
                return _not(self.expr(a))
        return self.rebuild(e)

    def compare(self, op: str, a: Expr, b: Expr) -> Expr:
        if is_index_int(a.dtype) and is_index_int(b.dtype):
            pa, pb = self.merge(self.poly(a)), self.merge(self.poly(b))
            decided = _decide(op, self.bound_poly(pa - pb))
            if decided is not None:
                return TRUE if decided else FALSE
            return Binary(op, _to_expr(pa), _to_expr(pb))
        ea, eb = self.expr(a), self.expr(b)
        if isinstance(ea, (IntImm, FloatImm)) and isinstance(eb, (IntImm, FloatImm)):
            return TRUE if evaluate(Binary(op, ea, eb), {}) else FALSE
        return Binary(op, ea, eb)

    def floating(self, e: Expr) -> Expr:
        match e:
            case Binary(op, a, b):
                return fold_float(op, self.expr(a), self.expr(b))
            case Unary("-", a):
                inner = self.expr(a)
                match inner:
                    case FloatImm(v, dt):
                        return FloatImm(-v, dt)
                    case Unary("-", x):
                        return x
                return Unary("-", inner)
        return self.rebuild(e)

    def rebuild(self, e: Expr) -> Expr:
        """Simplify the children of a node the polynomial rules do not see through."""
        match e:
            case Select(c, t, f):
                cond = self.expr(c)
                if isinstance(cond, IntImm):
                    return self.expr(t if cond.value else f)
                then, else_ = self.expr(t), self.expr(f)
                return then if then == else_ else Select(cond, then, else_)
            case Cast(dt, v):
                return fold_cast(dt, self.expr(v))
            case Binary(op, a, b):
                ea, eb = self.expr(a), self.expr(b)
                ca, cb = _const_of(ea), _const_of(eb)
                if op == "pow" and ca is not None and cb is not None and cb >= 0:
                    return IntImm(ca**cb, e.dtype)
                return Binary(op, ea, eb)
            case Unary(op, a):
                return Unary(op, self.expr(a))
            case Call(name, args):
                return Call(name, tuple(self.expr(a) for a in args))
            case BufferLoad(buf, idx):
                return BufferLoad(buf, tuple(self.expr(i) for i in idx))
        return e


def _exact_div(p: _Poly, g: int) -> _Poly:
    return _Poly({m: c // g for m, c in p.terms.items()}, p.dtype)


def _mod_partner(mono: Mono) -> tuple[Mono, int] | None:
    """For the atom floormod(y, J), y = floordiv(x, K) or x: (the atom floordiv(x, K*J), J)."""
    if len(mono) != 1 or not (isinstance(m := mono[0], Binary) and m.op == "floormod"):
        return None
    j = _const_of(m.b)
    if j is None or j <= 0:
        return None
    y = m.a
    if isinstance(y, Binary) and y.op == "floordiv" and (k := _const_of(y.b)) is not None:
        return (Binary("floordiv", y.a, IntImm(k * j, m.b.dtype)),), j
    return (Binary("floordiv", y, m.b),), j


def _and_or(op: str, a: Expr, b: Expr) -> Expr:
    # No side effects exist, so a constant operand decides or vanishes whichever side it is on.
    absorbing = 0 if op == "&&" else 1
    for x, y in ((a, b), (b, a)):
        if isinstance(x, IntImm):
            return IntImm(absorbing, "bool") if x.value == absorbing else y
    return a if a == b else Binary(op, a, b)


def _not(a: Expr) -> Expr:
    match a:
        case IntImm(v):
            return IntImm(int(not v), "bool")
        case Unary("!", x):
            return x
        case Binary(op, x, y) if op in COMPARE_OPS and is_int(x.dtype):
            return Binary(_NEGATE[op], x, y)  # not for floats: !(x < y) is not x >= y on nan
    return Unary("!", a)


# ---------------------------------------------------------------------------------------------
# Flat offsets


def flat_index(
    buffer: Buffer, indices: tuple[Expr, ...], ranges: dict[Var, int] | None = None
) -> Expr:
    """The row-major offset of `indices` into `buffer` (int64 where int32 could overflow),
    simplified knowing each var of `ranges` lies in [0, extent). A buffer of symbolic extents
    is indexed in int32: a kernel is called with such buffers of fewer than 2^31 elements
    only (hexir/runtime/kernel.py checks)."""
    size = buffer.size
    wide = isinstance(size, int) and size > 2**31 - 1
    index_dtype = "int64" if wide else "int32"
    flat: Expr | None = None
    for extent, index in zip(buffer.shape, indices, strict=True):
        if wide and index.dtype != "int64":
            index = Cast("int64", index)
        if flat is None:
            flat = index
        elif extent == 1:
            flat = _add(flat, index)  # (flat * 1) + index
        else:
            flat = _add(Binary("*", flat, dim_expr(extent, index_dtype)), index)
    return simplify(flat if flat is not None else IntImm(0, index_dtype), ranges)


def _add(a: Expr, b: Expr) -> Expr:  # a + b, without adding a literal 0
    if isinstance(a, IntImm) and a.value == 0:
        return b
    if isinstance(b, IntImm) and b.value == 0:
        return a
    return Binary("+", a, b)
