"""Tests of hexir.ir.verify: a valid function passes; each invariant has a failing example."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import replace

import pytest

from hexir.errors import HexirError, VerifyError
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferRegion,
    BufferStore,
    Expr,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    IterVar,
    PrimFunc,
    Range,
    Select,
    Stmt,
    Var,
    seq,
)
from hexir.ir.verify import problems, verify

N = 16
A = Buffer("A", (N, N))
B = Buffer("B", (N, N))
C = Buffer("C", (N, N))
i, j, k = Var("i"), Var("j"), Var("k")
vi, vj, vk = Var("vi"), Var("vj"), Var("vk")


def matmul_block(**changes: object) -> Block:
    block = Block(
        name="matmul",
        iter_vars=(
            IterVar(vi, "spatial", N, i),
            IterVar(vj, "spatial", N, j),
            IterVar(vk, "reduce", N, k),
        ),
        reads=(BufferRegion(A, (vi, vk)), BufferRegion(B, (vk, vj))),
        writes=(BufferRegion(C, (vi, vj)),),
        init=BufferStore(C, (vi, vj), FloatImm(0.0)),
        body=BufferStore(C, (vi, vj), C[vi, vj] + A[vi, vk] * B[vk, vj]),
    )
    return replace(block, **changes)


def nest(body: Stmt, *loops: tuple[Var, int]) -> Stmt:
    for var, extent in reversed(loops):
        body = For(var, extent, "serial", body)
    return body


def matmul(block: Block | None = None, **changes: object) -> PrimFunc:
    body = nest(block or matmul_block(), (i, N), (j, N), (k, N))
    return replace(PrimFunc("matmul", (A, B, C), body), **changes)


def staged() -> PrimFunc:
    """A cached read of A into a local buffer, then a nested block that uses it."""
    T = Buffer("T", (N,), scope="local")
    copy = Block(
        "copy",
        (IterVar(vi, "spatial", N, i),),
        reads=(BufferRegion(A, (IntImm(0), vi)),),
        writes=(BufferRegion(T, (vi,)),),
        body=BufferStore(T, (vi,), A[0, vi]),
    )
    wi = Var("wi")
    inner = Block(
        "inner",
        (IterVar(wi, "spatial", 4, j),),
        reads=(BufferRegion(T, (Range(vi * 4, vi * 4 + 4),)),),
        writes=(BufferRegion(C, (IntImm(0), vi * 4 + wi)),),
        body=BufferStore(C, (IntImm(0), vi * 4 + wi), T[vi * 4 + wi]),
    )
    i2 = Var("i2")  # the outer block's loop, in a nest beside the copy's
    outer = Block(
        "outer",
        (IterVar(vi, "spatial", 4, i2),),
        reads=(BufferRegion(T, (Range(vi * 4, vi * 4 + 4),)),),
        writes=(BufferRegion(C, (IntImm(0), Range(vi * 4, vi * 4 + 4))),),
        body=For(j, 4, "serial", inner),
        predicate=Binary("<", vi, IntImm(4)),
    )
    body = seq(Allocate(T), For(i, N, "serial", copy), For(i2, 4, "parallel", outer))
    return PrimFunc("staged", (A, C), body)


def test_valid_functions_pass() -> None:
    verify(matmul())
    assert problems(matmul()) == []


def test_nested_block_may_use_outer_iter_vars() -> None:
    func = staged()
    assert problems(func) == []


def test_error_lists_every_problem_and_pickles() -> None:
    bad = matmul(matmul_block(body=BufferStore(C, (vi,), A[vi, vk] * IntImm(2))))
    with pytest.raises(VerifyError) as info:
        verify(bad)
    err = info.value
    assert isinstance(err, HexirError)
    assert len(err.problems) >= 2
    assert all(p in str(err) for p in err.problems)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.problems == err.problems


def _store_in_block(value: Expr) -> PrimFunc:
    return matmul(matmul_block(body=BufferStore(C, (vi, vj), value)))


def _two_nests_same_var() -> PrimFunc:
    first = nest(BufferStore(C, (i, IntImm(0)), FloatImm(0.0)), (i, N))
    return PrimFunc("f", (A, B, C), seq(first, matmul().body))


def _use_before_allocate() -> PrimFunc:
    T = Buffer("T", (N,), scope="shared")
    use = nest(BufferStore(T, (i,), FloatImm(1.0)), (i, N))
    return PrimFunc("f", (A, B, C), seq(use, Allocate(T), matmul().body))


BAD: list[tuple[str, Callable[[], PrimFunc], str]] = [
    ("loop var bound twice", _two_nests_same_var, "bound by two loops"),
    (
        "undefined var",
        lambda: _store_in_block(C[vi, vj] + A[vi, Var("zz")] * B[vk, vj]),
        "undefined var %zz",
    ),
    (
        "extent not positive",
        lambda: PrimFunc(
            "f", (A, B, C), For(i, 0, "serial", BufferStore(C, (i, i), FloatImm(0.0)))
        ),
        "extent 0",
    ),
    (
        "binding uses a var not an enclosing loop",
        lambda: matmul(
            matmul_block(
                iter_vars=(IterVar(vi, "spatial", N, Var("q")),) + matmul_block().iter_vars[1:]
            )
        ),
        "undefined var %q",
    ),
    (
        "body uses an enclosing loop var",
        lambda: _store_in_block(C[i, vj] + A[vi, vk] * B[vk, vj]),
        "uses loop var %i from outside the block",
    ),
    (
        "region uses an enclosing loop var",
        lambda: matmul(matmul_block(writes=(BufferRegion(C, (i, vj)),))),
        "uses loop var %i from outside the block",
    ),
    (
        "buffer neither param nor allocated",
        lambda: _store_in_block(C[vi, vj] + Buffer("D", (N, N))[vi, vk]),
        "uses %D, neither a param nor allocated",
    ),
    ("buffer used before its Allocate", _use_before_allocate, "uses %T, neither a param"),
    (
        "buffer with a different type than declared",
        lambda: _store_in_block(C[vi, vj] + Buffer("A", (N, 8))[vi, vk]),
        "uses %A with a type other than",
    ),
    (
        "index count differs from rank",
        lambda: _store_in_block(C[vi, vj] + A[vi] * B[vk, vj]),
        "load of %A has 1 indices, rank 2",
    ),
    (
        "region rank",
        lambda: matmul(matmul_block(reads=(BufferRegion(A, (vi,)),))),
        "region of %A has 1 axes, rank 2",
    ),
    ("stored dtype", lambda: _store_in_block(IntImm(1)), "stores int32 into %C of float32"),
    (
        "float operands disagree",
        lambda: _store_in_block(C[vi, vj] + FloatImm(1.0, "float64")),
        "operands of + are float32 and float64",
    ),
    (
        "int and float operands",
        lambda: _store_in_block(C[vi, vj] * IntImm(2)),
        "operands of * are float32 and int32",
    ),
    (
        "comparison operands disagree",
        lambda: _store_in_block(Select(Binary("<", C[vi, vj], vi), C[vi, vj], FloatImm(0.0))),
        "operands of < are float32 and int32",
    ),
    (
        "condition not bool",
        lambda: matmul(matmul_block(body=IfThenElse(vi, BufferStore(C, (vi, vj), FloatImm(0.0))))),
        "if condition is int32, not bool",
    ),
    (
        "index not an integer",
        lambda: _store_in_block(A[vi, FloatImm(1.0)]),
        "index of %A is float32, not an integer",
    ),
    (
        "reduce iter var in the write region",
        lambda: matmul(matmul_block(writes=(BufferRegion(C, (vi, vk)),))),
        "reduce iter var vk indexes the write of %C",
    ),
    (
        "reduce iter var in a store",
        lambda: matmul(matmul_block(body=BufferStore(C, (vk, vj), A[vi, vk]))),
        "reduce iter var vk indexes the write of %C",
    ),
    (
        "output never written",
        lambda: PrimFunc("f", (A, B, C), nest(BufferStore(B, (i, j), A[i, j]), (i, N), (j, N))),
        "output %C is never stored to",
    ),
    ("params with one name", lambda: matmul(params=(A, A, C)), "two params named %A"),
    (
        "loop annotations not sorted",
        lambda: PrimFunc(
            "f",
            (A, B, C),
            For(
                i,
                N,
                "serial",
                nest(BufferStore(C, (i, j), FloatImm(0.0)), (j, N)),
                (("b", 1), ("a", 2)),
            ),
        ),
        "annotations not sorted",
    ),
    ("func attrs not sorted", lambda: matmul(attrs=(("op", "x"), ("axis", 1))), "attrs not sorted"),
    (
        "iter var domain not positive",
        lambda: matmul(
            matmul_block(iter_vars=(IterVar(vi, "spatial", 0, i),) + matmul_block().iter_vars[1:])
        ),
        "iter var vi has domain 0",
    ),
    ("num_outputs out of range", lambda: matmul(num_outputs=4), "num_outputs=4"),
    (
        "allocation reuses a declared name",
        lambda: PrimFunc("f", (A, B, C), seq(Allocate(Buffer("B", (4,))), matmul().body)),
        "allocates %B, a name already declared",
    ),
    (
        "iter var shadows a loop var",
        lambda: matmul(
            matmul_block(iter_vars=(IterVar(i, "spatial", N, i),) + matmul_block().iter_vars[1:])
        ),
        "iter var i is bound twice or shadows a var",
    ),
]


@pytest.mark.parametrize("name, make, expected", BAD, ids=[b[0] for b in BAD])
def test_invalid_function_is_reported(
    name: str, make: Callable[[], PrimFunc], expected: str
) -> None:
    func = make()
    with pytest.raises(VerifyError) as info:
        verify(func)
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_problem_names_the_block() -> None:
    found = problems(_store_in_block(C[i, vj]))
    assert found and found[0].startswith("block @matmul:")


def test_verify_is_pure() -> None:
    # Tests run it after every primitive: no call may leave anything behind for the next.
    good, bad = matmul(), _store_in_block(C[i, vj])
    text, first = str(good), problems(bad)
    for _ in range(3):
        assert verify(good) is None and problems(bad) == first
    assert str(good) == text and good == matmul()


def test_predicate_may_read_enclosing_loop_vars():
    # A non-dividing split guards its blocks with a predicate over the loop vars (TVM-style).
    func = matmul(matmul_block(predicate=Binary("<", i, IntImm(8))))
    assert problems(func) == [] and verify(func) is None
    # A var bound nowhere around the block is still refused.
    stray = matmul(matmul_block(predicate=Binary("<", Var("z"), IntImm(8))))
    assert problems(stray)
