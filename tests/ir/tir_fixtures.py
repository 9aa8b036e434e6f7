"""Hand-built PrimFuncs covering every hextir node kind, shared by the text and key tests."""

from __future__ import annotations

import math

from hexir.ir.tir import (
    LOOP_KINDS,
    Allocate,
    Barrier,
    Binary,
    Block,
    Buffer,
    BufferRegion,
    BufferStore,
    Call,
    Cast,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    IterVar,
    PrimFunc,
    Range,
    Select,
    Unary,
    Var,
    make_annotations,
    seq,
)


def matmul(
    n: int = 1024,
    names: tuple[str, ...] = ("matmul", "A", "B", "C", "i", "j", "k", "vi", "vj", "vk"),
    dtype: str = "float32",
    kind: str = "serial",
    op: str = "+",
    attrs: tuple = (),
) -> PrimFunc:
    fname, a, b, c, i, j, k, vi, vj, vk = names
    A, B, C = (Buffer(x, (n, n), dtype) for x in (a, b, c))
    i, j, k, vi, vj, vk = (Var(x) for x in (i, j, k, vi, vj, vk))
    block = Block(
        "matmul",
        (
            IterVar(vi, "spatial", n, i),
            IterVar(vj, "spatial", n, j),
            IterVar(vk, "reduce", n, k),
        ),
        (BufferRegion(A, (vi, vk)), BufferRegion(B, (vk, vj))),
        (BufferRegion(C, (vi, vj)),),
        BufferStore(C, (vi, vj), Binary(op, C[vi, vj], A[vi, vk] * B[vk, vj])),
        init=BufferStore(C, (vi, vj), FloatImm(0.0, dtype)),
    )
    body = For(i, n, kind, For(j, n, "serial", For(k, n, "serial", block)))
    return PrimFunc(fname, (A, B, C), body, attrs=attrs)


MATMUL_TEXT = """\
hextir.func @matmul(%A: buffer<1024x1024xf32>, %B: buffer<1024x1024xf32>, %C: buffer<1024x1024xf32>) {
  for %i in 0..1024 serial {
    for %j in 0..1024 serial {
      for %k in 0..1024 serial {
        block @matmul(vi = spatial(1024) %i, vj = spatial(1024) %j, vk = reduce(1024) %k) reads(%A[vi, vk], %B[vk, vj]) writes(%C[vi, vj]) {
          init {
            %C[vi, vj] = 0.0
          }
          %C[vi, vj] = %C[vi, vj] + %A[vi, vk] * %B[vk, vj]
        }
      }
    }
  }
}"""  # noqa: E501


def scheduled_gpu() -> PrimFunc:
    """A GPU-style schedule: bindings, shared and local allocs, barriers, ifs, ranges, pragmas."""
    A = Buffer("A", (128, 64))
    B = Buffer("B", (128,))
    S = Buffer("A_shared", (64, 32), scope="shared")
    L = Buffer("acc", (4,), scope="local")
    bx, tx, vt, k0, u = Var("i_0"), Var("i_1"), Var("vt"), Var("k_0"), Var("u")
    vi, vk = Var("vi"), Var("vk")
    row = bx * 64 + tx
    load = BufferStore(S, (tx, u), A[row, k0 * 32 + u])
    compute = Block(
        "sum",
        (IterVar(vi, "spatial", 128, row), IterVar(vk, "reduce", 64, k0 * 32 + u)),
        (BufferRegion(A, (vi, Range(IntImm(0), IntImm(64)))), BufferRegion(S, (vi % 64, vk))),
        (BufferRegion(B, (vi,)),),
        BufferStore(L, (IntImm(0),), L[IntImm(0)] + S[vi % 64, vk % 32]),
        init=seq(BufferStore(L, (IntImm(0),), FloatImm(0.0)), Barrier()),
        predicate=Binary("&&", Binary("<", row, IntImm(128)), Unary("!", IntImm(0, "bool"))),
        annotations=make_annotations(meta="x\ny", stage=(1, 2)),
    )
    inner = seq(
        Allocate(L),
        For(u, 32, "unrolled", load, make_annotations(unroll_step=16)),
        Barrier(),
        For(Var("u"), 32, "vectorized", compute),
        IfThenElse(
            Binary("<", tx, IntImm(32)),
            IfThenElse(Binary("==", tx, IntImm(0)), BufferStore(B, (row,), L[IntImm(0)])),
            IfThenElse(
                Binary(">=", tx, IntImm(48)),
                Barrier(),
                BufferStore(B, (row,), FloatImm(-1.5)),
            ),
        ),
    )
    body = For(
        bx,
        2,
        "blockIdx.x",
        For(
            vt,
            1,
            "vthread",
            For(tx, 64, "threadIdx.x", seq(Allocate(S), For(k0, 2, "serial", inner))),
        ),
        make_annotations(),
    )
    attrs = (
        ("empty", ()),
        ("f", 0.044715),
        ("flag", True),
        ("neg", -3),
        ("one", (3,)),
        ("op", "hexir.sum"),
        ("source", 'hexir.graph @g() {\n  "quoted" \\ tab\t\n}'),
        ("tiny", 1e-05),
        ("weird key", "v"),
    )
    return PrimFunc("sum_kernel", (A, B), body, 1, attrs)


def every_kind() -> PrimFunc:
    """One loop of every kind, nested, each with a store of an iter var."""
    out = Buffer("out", (2,) * len(LOOP_KINDS), "int32")
    vars_ = tuple(Var(f"l{n}") for n in range(len(LOOP_KINDS)))
    ivs = tuple(IterVar(Var(f"v{n}"), "spatial", 2, v) for n, v in enumerate(vars_))
    block = Block(
        "fill",
        ivs,
        (),
        (BufferRegion(out, tuple(iv.var for iv in ivs)),),
        BufferStore(out, tuple(iv.var for iv in ivs), ivs[0].var),
    )
    body = block
    for var, kind in reversed(list(zip(vars_, LOOP_KINDS, strict=True))):
        body = For(var, 2, kind, body)
    return PrimFunc("kinds", (out,), body)


def dtypes_and_specials() -> PrimFunc:
    """Every dtype, casts, calls, select, nan/inf, zero-dim buffers, several outputs."""
    x = Buffer("x", (), "float32")
    d = Buffer("d", (8,), "float64")
    h = Buffer("h", (8,), "float16")
    q = Buffer("q", (8,), "int64")
    m = Buffer("m", (8,), "bool")
    y = Buffer("y", (), "float32")
    i = Var("i")
    f64 = d[i] * FloatImm(1.5, "float64") + FloatImm(math.inf, "float64")
    stmts = (
        BufferStore(d, (i,), Binary("pow", f64, FloatImm(-math.inf, "float64"))),
        BufferStore(h, (i,), Call("exp", (h[i] - FloatImm(math.nan, "float16"),))),
        BufferStore(q, (i,), Binary("floordiv", q[i], IntImm(3, "int64")) + IntImm(-7, "int64")),
        BufferStore(m, (i,), Binary("||", m[i], Binary("!=", Cast("int32", q[i]), IntImm(-1)))),
        BufferStore(
            y,
            (),
            Select(m[i], Cast("float32", d[i]), Call("sqrt", (x[()] + FloatImm(math.nan),))),
        ),
        BufferStore(x, (), Unary("-", FloatImm(2.0)) * Unary("-", x[()]) - FloatImm(-0.0)),
    )
    block = Block(
        "specials",
        (),
        (BufferRegion(x, ()), BufferRegion(d, (Range(IntImm(0), IntImm(8)),))),
        (BufferRegion(y, ()),),
        seq(*stmts),
    )
    return PrimFunc("specials", (x, d, h, q, m, y), For(i, 8, "parallel", block), 3)


ALL = (matmul, scheduled_gpu, every_kind, dtypes_and_specials)
