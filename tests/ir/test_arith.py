"""Tests of hexir.ir.arith: canonical simplification, bounds, proofs and affine analysis.

Expected forms are built as nodes and compared structurally.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from hexir.ir.arith import (
    Interval,
    affine_coefficients,
    bound,
    can_prove,
    evaluate,
    is_affine,
    simplify,
)
from hexir.ir.tir import Binary, Buffer, Cast, Expr, FloatImm, IntImm, Select, Unary, Var
from hexir.ir.visit import free_vars, substitute

i, j, k, f = Var("i"), Var("j"), Var("k"), Var("f")
i0, i1, i2 = Var("i0"), Var("i1"), Var("i2")
x = Buffer("X", (16,))[i]  # a float atom
TRUE, FALSE = IntImm(1, "bool"), IntImm(0, "bool")


def fdiv(a: Expr, c: int | Expr) -> Binary:
    return Binary("floordiv", a, c if isinstance(c, Expr) else IntImm(c))


def fmod(a: Expr, c: int | Expr) -> Binary:
    return Binary("floormod", a, c if isinstance(c, Expr) else IntImm(c))


def cmp(op: str, a: Expr, b: Expr | int) -> Binary:
    return Binary(op, a, b if isinstance(b, Expr) else IntImm(b))


def mn(a: Expr, b: Expr | int) -> Binary:
    return Binary("min", a, b if isinstance(b, Expr) else IntImm(b))


def mx(a: Expr, b: Expr | int) -> Binary:
    return Binary("max", a, b if isinstance(b, Expr) else IntImm(b))


SPLIT = {i0: 8, i1: 32}

CASES = [
    # canonical sums: order, like terms, identities, constant folding
    (i1 + 32 * i0 + 0, None, i0 * 32 + i1),
    (i * 1, None, i),
    (i + 0, None, i),
    (i * 0 + 3, None, IntImm(3)),
    ((i * 4) * 8, None, i * 32),
    (i - 1 + 2 * j - j, None, i + j - 1),
    (i - i, None, IntImm(0)),
    (5 - i, None, 5 - i),
    (-i - 5, None, Unary("-", i) - 5),
    (j * i * 3 + i * j, None, i * j * 4),
    ((i + 1) * (j + 2), None, i * 2 + i * j + j + 2),
    (IntImm(7) * 6 - 2, None, IntImm(40)),
    (i, {i: 1}, IntImm(0)),  # a loop of extent 1
    # split: i = i0 * 32 + i1
    (fdiv(i0 * 32 + i1, 32), SPLIT, i0),
    (fmod(i0 * 32 + i1, 32), SPLIT, i1),
    (fdiv(i0 * 32 + i1, 64), SPLIT, fdiv(i0, 2)),
    (fmod(i0 * 32 + i1, 64), SPLIT, fmod(i0, 2) * 32 + i1),
    (fdiv(i0 * 32 + i1, 8), SPLIT, i0 * 4 + fdiv(i1, 8)),
    (fdiv(i0 * 32 + i1, 32), None, i0 + fdiv(i1, 32)),  # no ranges: i1 may be anything
    (fdiv(i0 * 128 + i1 * 4 + i2, 4), {i0: 2, i1: 32, i2: 4}, i0 * 32 + i1),
    # fuse: f = i * J + j, and back
    (fdiv(f, 64) * 64 + fmod(f, 64), None, f),
    (fdiv(f, 128) * 128 + fmod(fdiv(f, 8), 16) * 8 + fmod(f, 8), None, f),
    (fdiv(fmod(f, 128), 8), None, fmod(fdiv(f, 8), 16)),
    ((fdiv(f, 64) * 64 + fmod(f, 64)) * 2 + 1, None, f * 2 + 1),
    # floordiv / floormod rules
    (fdiv(i, 1), None, i),
    (fmod(i, 1), None, IntImm(0)),
    (fdiv(fdiv(i, 4), 8), None, fdiv(i, 32)),
    (fmod(fmod(i, 32), 8), None, fmod(i, 8)),
    (fdiv(i, 32), {i: 32}, IntImm(0)),
    (fmod(i, 32), {i: 32}, i),
    (fdiv(i + 32, 32), {i: 32}, IntImm(1)),
    (fmod(i + 33, 32), {i: 31}, i + 1),
    (fdiv(i - 1, 32), {i: Interval(1, 32)}, IntImm(0)),
    (fdiv(i * 4 + 8, 4), None, i + 2),
    (fdiv(i + 33, 32), None, fdiv(i + 1, 32) + 1),
    (fmod(i * 2, 4), None, fmod(i, 2) * 2),
    (fdiv(IntImm(-7), 2), None, IntImm(-4)),
    (fmod(IntImm(-7), 2), None, IntImm(1)),
    (fdiv(i, j), None, fdiv(i, j)),
    # comparisons, min / max, select decided by bounds
    (cmp("<", i, 1024), {i: 1024}, TRUE),
    (cmp(">=", i, 1024), {i: 1024}, FALSE),
    (cmp("<", i0 * 32 + i1, 256), SPLIT, TRUE),
    (cmp("<", i0 * 32 + i1, 250), SPLIT, cmp("<", i0 * 32 + i1, 250)),
    (cmp("==", i + 1, i + 1), None, TRUE),
    (mn(i, i + 1), None, i),
    (mx(i, 31), {i: 32}, IntImm(31)),
    (mn(i, j), None, mn(i, j)),
    (mn(j, i), None, mn(i, j)),  # operands in key order
    (Select(cmp("<", i, 64), i, j), {i: 64}, i),
    (Select(cmp("<", i, 4), j, j), None, j),
    (Binary("&&", cmp("<", i, 64), cmp("<", j, 3)), {i: 64}, cmp("<", j, 3)),
    (Binary("||", cmp("<", i, 64), cmp("<", j, 3)), {i: 64}, TRUE),
    (Unary("!", cmp("<", i, j)), None, cmp(">=", i, j)),
    (Cast("int32", IntImm(5, "int64")), None, IntImm(5)),
    (Cast("int32", i), None, i),
]


@pytest.mark.parametrize("expr, ranges, expected", CASES)
def test_simplify(expr: Expr, ranges: dict | None, expected: Expr) -> None:
    out = simplify(expr, ranges)
    assert out == expected
    assert simplify(out, ranges) == out


def test_float_constants_fold_in_their_dtype() -> None:
    a, b = FloatImm(0.1), FloatImm(0.2)
    assert simplify(a + b) == FloatImm(float(np.float32(0.1) + np.float32(0.2)))
    assert simplify(FloatImm(0.1, "float64") + FloatImm(0.2, "float64")) == FloatImm(
        0.1 + 0.2, "float64"
    )
    assert simplify(Cast("float32", IntImm(3))) == FloatImm(3.0)


def test_float_arithmetic_is_not_reassociated() -> None:
    e = (x + 1.0) + 2.0
    assert simplify(e) == e
    assert simplify(x * 2.0 * 0.5) == x * 2.0 * 0.5


def test_float_identities_only_where_exact() -> None:
    assert simplify(x * 1.0) == x
    assert simplify(x / 1.0) == x
    assert simplify(x - 0.0) == x
    assert simplify(x + 0.0) == x + 0.0  # -0.0 + 0.0 is +0.0
    assert simplify(x * 0.0) == x * 0.0  # nan * 0.0 is nan
    assert simplify(FloatImm(1.0) / FloatImm(0.0)) == FloatImm(1.0) / FloatImm(0.0)


def test_float_comparison_of_constants() -> None:
    assert simplify(Binary("<", FloatImm(1.0), FloatImm(2.0))) == TRUE
    nan = FloatImm(math.nan)
    assert simplify(Binary("==", nan, nan)) == FALSE
    assert simplify(Unary("!", Binary("<", x, FloatImm(1.0)))) == Unary(
        "!", Binary("<", x, FloatImm(1.0))
    )


def test_simplify_inside_loads() -> None:
    load = Buffer("A", (64,))[fdiv(i0 * 32 + i1, 32) * 32 + fmod(i0 * 32 + i1, 32)]
    assert simplify(load, SPLIT) == Buffer("A", (64,))[i0 * 32 + i1]


def test_bound() -> None:
    assert bound(i0 * 32 + i1, SPLIT) == Interval(0, 255)
    assert bound(fmod(i, 8), {i: Interval(3, 5)}) == Interval(3, 5)
    assert bound(fmod(i, 8), {i: 64}) == Interval(0, 7)
    assert bound(fdiv(i, 8), {i: Interval(-9, 17)}) == Interval(-2, 2)
    assert bound(i - j, {i: 4}) == Interval(None, None)
    assert bound(i * 2, {i: Interval(0, None)}) == Interval(0, None)
    assert bound(mn(i, j), {i: 4, j: 10}) == Interval(0, 3)
    assert bound(Select(cmp("<", i, j), i, j + 20), {i: 4, j: 10}) == Interval(0, 29)
    assert bound(Unary("-", i), {i: 4}) == Interval(-3, 0)


def test_can_prove() -> None:
    assert can_prove(cmp("<", i0 * 32 + i1, 256), SPLIT)
    assert not can_prove(cmp("<", i0 * 32 + i1, 255), SPLIT)
    assert can_prove(cmp("<", i0 * 32 + i1, 256), {i0: Interval(0, 7), i1: Interval(0, 31)})
    assert not can_prove(cmp("<", i, 4))


def test_affine_coefficients() -> None:
    assert affine_coefficients(i * 1024 + k + 3, [i, k]) == {i: 1024, k: 1, None: 3}
    assert affine_coefficients(i * 1024 + k, [k]) == {k: 1, None: 0}
    assert affine_coefficients(i * 64 + j, [k]) == {k: 0, None: 0}
    assert affine_coefficients(fdiv(i0 * 32 + i1, 32), [i0], SPLIT) == {i0: 1, None: 0}
    assert affine_coefficients(fdiv(k, 4), [k]) is None
    assert affine_coefficients(i * k, [k]) is None
    assert affine_coefficients(FloatImm(1.0), [k]) is None
    assert is_affine(i * 3 - 2 * j, [i, j])
    assert not is_affine(Buffer("A", (4,))[k], [k])


def test_output_is_deterministic() -> None:
    exprs = [j + i * 3 + k * 2, k * 2 + j + i * 3, i * 3 + k * 2 + j]
    outs = {simplify(e) for e in exprs}
    assert outs == {i * 3 + k * 2 + j}


def test_fused_index_collapses_to_the_fused_var() -> None:
    # fuse(i: 12, j: J) -> f substitutes i = floordiv(f, J), j = floormod(f, J)
    for extent_j in (1, 3, 20, 64):
        idx = substitute(i * extent_j + j, {i: fdiv(f, extent_j), j: fmod(f, extent_j)})
        assert isinstance(idx, Binary)
        assert simplify(idx, {f: 12 * extent_j}) == f


# ---------------------------------------------------------------------------------------------
# Randomized: simplify never changes a value, and bound contains every value


def _random_expr(rng: random.Random, vars: list[Var], depth: int) -> Expr:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(vars) if rng.random() < 0.75 else IntImm(rng.randint(-6, 40))
    a = _random_expr(rng, vars, depth - 1)
    b = _random_expr(rng, vars, depth - 1)
    c = IntImm(rng.choice([1, 2, 3, 4, 8, 16, 32, -3]))
    match rng.randrange(9):
        case 0:
            return a + b
        case 1:
            return a - b
        case 2:
            return a * c
        case 3:
            return a * b if depth <= 2 else a * c
        case 4:
            return fdiv(a, c)
        case 5:
            return fmod(a, c)
        case 6:
            return mn(a, b) if rng.random() < 0.5 else mx(a, b)
        case 7:
            return Select(cmp(rng.choice(["<", "<=", "==", "!="]), a, b), a, b + 1)
        case _:
            return fdiv(a, c) * c + fmod(a, c)  # the fused-loop shape


def _random_ranges(rng: random.Random, vars: list[Var]) -> dict[Var, Interval]:
    out = {}
    for v in vars:
        lo = rng.choice([0, 0, 0, -3, 2])
        out[v] = Interval(lo, lo + rng.choice([0, 1, 3, 7]))  # at most 512 points
    return out


def _points(ranges: dict[Var, Interval]):
    vars = list(ranges)
    axes = [range(r.lo, r.hi + 1) for r in ranges.values()]  # type: ignore[arg-type]
    for values in itertools.product(*axes):
        yield dict(zip(vars, values, strict=True))


@pytest.mark.parametrize("seed", range(6))
def test_random_expressions_keep_their_values(seed: int) -> None:
    rng = random.Random(seed)
    vars = [i, j, k]
    for _ in range(60):
        e = _random_expr(rng, vars, rng.randint(1, 4))
        ranges = _random_ranges(rng, vars)
        for rs in (ranges, None):
            out = simplify(e, rs)
            assert simplify(out, rs) == out, "not idempotent"
            assert free_vars(out) <= free_vars(e)
            for env in _points(ranges):
                assert evaluate(out, env) == evaluate(e, env), (e, out, env)
        b = bound(e, ranges)
        for env in _points(ranges):
            value = evaluate(e, env)
            assert (b.lo is None or b.lo <= value) and (b.hi is None or value <= b.hi)


@pytest.mark.parametrize("seed", range(3))
def test_random_comparisons_keep_their_values(seed: int) -> None:
    rng = random.Random(100 + seed)
    vars = [i, j]
    for _ in range(60):
        a, b = _random_expr(rng, vars, 3), _random_expr(rng, vars, 2)
        e = cmp(rng.choice(["<", "<=", ">", ">=", "==", "!="]), a, b)
        ranges = _random_ranges(rng, vars)
        out = simplify(e, ranges)
        assert simplify(out, ranges) == out
        for env in _points(ranges):
            assert evaluate(out, env) == evaluate(e, env), (e, out, env)


def test_random_split_and_fuse_patterns() -> None:
    rng = random.Random(7)
    for _ in range(40):
        factor, outer = rng.choice([2, 4, 8, 16]), rng.choice([1, 2, 3, 5])
        divisor = rng.choice([1, 2, 4, 8, 16, 32, 64])
        idx = i0 * factor + i1  # the split of a loop of extent outer * factor
        ranges = {i0: outer, i1: factor}
        for e in (fdiv(idx, divisor), fmod(idx, divisor), fdiv(idx, divisor) * divisor):
            out = simplify(e, ranges)
            for env in _points({i0: Interval(0, outer - 1), i1: Interval(0, factor - 1)}):
                assert evaluate(out, env) == evaluate(e, env)
        if divisor >= factor and divisor % factor == 0:
            assert simplify(fdiv(idx, divisor), ranges) == simplify(
                fdiv(i0, divisor // factor), ranges
            )
        if divisor == factor:
            assert simplify(fdiv(idx, divisor), ranges) == i0
            assert simplify(fmod(idx, divisor), ranges) == i1
