"""The C printer: hand-built PrimFuncs compiled and compared with numpy on random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.c import CPrinter, generate_c, kernel_symbol
from hexir.ir.tir import (
    Allocate,
    Barrier,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Call,
    Cast,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    IterVar,
    PrimFunc,
    Select,
    Var,
    seq,
)
from hexir.runtime.build import build


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def loops(body, *specs):
    """Loops around `body`, outermost first: specs are (var, extent, kind)."""
    for var, extent, kind in reversed(specs):
        body = For(var, extent, kind, body)
    return body


def block(name, iters, body, init=None, predicate=None):
    """A block from (var, kind, dom, binding) tuples; regions are left out (codegen needs none)."""
    return Block(name, tuple(IterVar(*it) for it in iters), (), (), body, init, predicate)


def _poisoned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.full(shape, np.nan if dtype.kind == "f" else 7, dtype)


def run(func, *inputs):
    """Build `func`, call it on `inputs` and poisoned outputs (NaN, or 7 for ints and bools:
    anything the kernel forgets to write shows); return the outputs."""
    outputs = [_poisoned(b.shape, np.dtype(b.dtype)) for b in func.outputs]
    build(func)(*inputs, *outputs)
    return outputs[0] if len(outputs) == 1 else outputs


i, j, k, l = Var("i"), Var("j"), Var("k"), Var("l")
vi, vj, vk = Var("vi"), Var("vj"), Var("vk")


def matmul(M, N, K, kinds=("parallel", "serial", "vectorized"), dtype="float32"):
    A, B, C = Buffer("A", (M, K), dtype), Buffer("B", (K, N), dtype), Buffer("C", (M, N), dtype)
    body = block(
        "matmul",
        [(vi, "spatial", M, i), (vj, "spatial", N, j), (vk, "reduce", K, k)],
        BufferStore(C, (vi, vj), C[vi, vj] + A[vi, vk] * B[vk, vj]),
        init=BufferStore(C, (vi, vj), FloatImm(0.0, dtype)),
    )
    nest = loops(body, (i, M, kinds[0]), (k, K, kinds[1]), (j, N, kinds[2]))
    return PrimFunc("matmul", (A, B, C), nest)


def test_golden_relu():
    A, B = Buffer("A", (8,)), Buffer("B", (8,))
    body = block(
        "relu", [(vi, "spatial", 8, i)], BufferStore(B, (vi,), Binary("max", A[vi], FloatImm(0.0)))
    )
    source = generate_c(PrimFunc("relu", (A, B), For(i, 8, "vectorized", body)))
    assert source == GOLDEN_RELU


GOLDEN_RELU = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#define HX_EXPORT __attribute__((visibility("default")))
typedef float hx_f32x8 __attribute__((vector_size(32)));
static inline hx_f32x8 hx_load_f32x8(const float* p) {
  hx_f32x8 r; __builtin_memcpy(&r, p, 32); return r;
}
typedef int32_t hx_i32x8 __attribute__((vector_size(32)));
static inline hx_f32x8 hx_select_f32x8(hx_i32x8 c, hx_f32x8 a, hx_f32x8 b) {
  return (hx_f32x8)(((hx_i32x8)a & c) | ((hx_i32x8)b & ~c));
}
static inline hx_f32x8 hx_max_f32x8(hx_f32x8 a, hx_f32x8 b) { return hx_select_f32x8(a > b, a, b); }
static inline hx_f32x8 hx_splat_f32x8(float s) { return (hx_f32x8){s, s, s, s, s, s, s, s}; }
static inline void hx_store_f32x8(float* p, hx_f32x8 x) { __builtin_memcpy(p, &x, 32); }

HX_EXPORT void relu(float* restrict A, float* restrict B) {
  {  // block relu
    hx_store_f32x8(&B[0], hx_max_f32x8(hx_load_f32x8(&A[0]), hx_splat_f32x8(0.0f)));
  }
}
"""


@pytest.mark.parametrize(
    "kinds", [("parallel", "serial", "vectorized"), ("serial", "unrolled", "serial")]
)
def test_matmul_with_init(rng, kinds):
    a = rng.standard_normal((13, 7), dtype=np.float32)
    b = rng.standard_normal((7, 19), dtype=np.float32)
    np.testing.assert_allclose(run(matmul(13, 19, 7, kinds), a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_float64(rng):
    a, b = rng.standard_normal((5, 6)), rng.standard_normal((6, 4))
    np.testing.assert_allclose(run(matmul(5, 4, 6, dtype="float64"), a, b), a @ b, rtol=1e-12)


def test_split_loop_with_predicate(rng):
    n = 10
    A, B = Buffer("A", (n,)), Buffer("B", (n,))
    index = i * 4 + j
    body = block(
        "scale",
        [(vi, "spatial", n, index)],
        BufferStore(B, (vi,), A[vi] * 2.0 + 1.0),
        predicate=Binary("<", index, IntImm(n)),
    )
    func = PrimFunc("scale", (A, B), loops(body, (i, 3, "parallel"), (j, 4, "vectorized")))
    a = rng.standard_normal(n, dtype=np.float32)
    np.testing.assert_allclose(run(func, a), a * 2 + 1, rtol=1e-6)


def test_nested_parallel_loops_run_serially_inside(rng):
    A, B = Buffer("A", (6, 5)), Buffer("B", (6, 5))
    body = block(
        "neg", [(vi, "spatial", 6, i), (vj, "spatial", 5, j)], BufferStore(B, (vi, vj), -A[vi, vj])
    )
    func = PrimFunc("neg", (A, B), loops(body, (i, 6, "parallel"), (j, 5, "parallel")))
    assert generate_c(func).count("#pragma omp parallel") == 1
    a = rng.standard_normal((6, 5), dtype=np.float32)
    np.testing.assert_array_equal(run(func, a), -a)
    with knobs.scope(num_threads=1):
        np.testing.assert_array_equal(run(func, a), -a)


def test_a_parallel_loop_of_one_job_starts_no_threads(rng):
    A, B = Buffer("A", (1, 5)), Buffer("B", (1, 5))
    body = block(
        "neg", [(vi, "spatial", 1, i), (vj, "spatial", 5, j)], BufferStore(B, (vi, vj), -A[vi, vj])
    )
    func = PrimFunc("neg", (A, B), loops(body, (i, 1, "parallel"), (j, 5, "serial")))
    assert "omp parallel" not in generate_c(func)
    a = rng.standard_normal((1, 5), dtype=np.float32)
    np.testing.assert_array_equal(run(func, a), -a)


def test_gpu_kinds_run_serially(rng):
    # A transpose bound to blocks, virtual threads and threads; a barrier between stages.
    A, B = Buffer("A", (8, 12)), Buffer("B", (12, 8))
    row, col = (i * 2 + l) * 4 + j, k
    body = block(
        "transpose",
        [(vi, "spatial", 8, row), (vj, "spatial", 12, col)],
        BufferStore(B, (vj, vi), A[vi, vj]),
    )
    nest = loops(
        seq(body, Barrier()),
        (i, 1, "blockIdx.x"),
        (l, 2, "vthread"),
        (j, 4, "threadIdx.x"),
        (k, 12, "threadIdx.y"),
    )
    a = rng.standard_normal((8, 12), dtype=np.float32)
    np.testing.assert_array_equal(run(PrimFunc("transpose", (A, B), nest), a), a.T)


@pytest.mark.parametrize("M,N", [(6, 9), (40, 33)])
def test_global_allocate_between_blocks(M, N, rng):
    # T = exp(A) in a buffer of its own, then S = T.sum(axis=1).
    A, S = Buffer("A", (M, N)), Buffer("S", (M,))
    T = Buffer("T", (M, N))
    exp = block(
        "softmax_exp",
        [(vi, "spatial", M, i), (vj, "spatial", N, j)],
        BufferStore(T, (vi, vj), Call("exp", (A[vi, vj],))),
    )
    total = block(
        "softmax_sum",
        [(vi, "spatial", M, i), (vk, "reduce", N, k)],
        BufferStore(S, (vi,), S[vi] + T[vi, vk]),
        init=BufferStore(S, (vi,), FloatImm(0.0)),
    )
    body = seq(
        Allocate(T),
        loops(exp, (i, M, "parallel"), (j, N, "serial")),
        loops(total, (i, M, "serial"), (k, N, "serial")),
    )
    func = PrimFunc("exp_sum", (A, S), body)
    source = generate_c(func)
    if M * N * 4 <= CPrinter.small_global_bytes:  # a small one is a stack array
        assert f"float T[{M * N}]" in source and "hx_scratch(" not in source
    else:  # a heap buffer is thread-local scratch, kept from one call to the next (not freed)
        assert "(float*)hx_scratch(&hx_scratch_0, 5312)" in source and "free(T);" not in source
    a = rng.standard_normal((M, N), dtype=np.float32)
    np.testing.assert_allclose(run(func, a), np.exp(a).sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("scope,size", [("local", 4), ("shared", 4), ("local", 40000)])
def test_stack_and_large_allocations(rng, scope, size):
    # A row sum through a local accumulator buffer; a large one moves to the heap.
    M, N = 5, 7
    A, S = Buffer("A", (M, N)), Buffer("S", (M,))
    acc = Buffer("acc", (size,), scope=scope)
    zero = BufferStore(acc, (IntImm(0),), FloatImm(0.0))
    add = BufferStore(acc, (IntImm(0),), acc[0] + A[i, j])
    body = seq(Allocate(acc), zero, For(j, N, "serial", add), BufferStore(S, (i,), acc[0]))
    func = PrimFunc("rowsum", (A, S), For(i, M, "parallel", body))
    source = generate_c(func)
    assert ("aligned_alloc" in source) == (size * 4 > 64 * 1024)
    a = rng.standard_normal((M, N), dtype=np.float32)
    np.testing.assert_allclose(run(func, a), a.sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_floordiv_floormod_negative(rng, dtype):
    n = 64
    A, B = Buffer("A", (n,), dtype), Buffer("B", (n,), dtype)
    Q, R = Buffer("Q", (n,), dtype), Buffer("R", (n,), dtype)
    body = seq(
        BufferStore(Q, (i,), Binary("floordiv", A[i], B[i])),
        BufferStore(R, (i,), Binary("floormod", A[i], B[i])),
    )
    func = PrimFunc("divmod", (A, B, Q, R), For(i, n, "serial", body), num_outputs=2)
    a = rng.integers(-50, 50, n).astype(dtype)
    b = rng.choice([-7, -3, -1, 1, 2, 5], n).astype(dtype)
    q, r = run(func, a, b)
    np.testing.assert_array_equal(q, np.floor_divide(a, b))
    np.testing.assert_array_equal(r, np.mod(a, b))


def test_float_floormod_and_floordiv(rng):
    n = 32
    A, Q, R = Buffer("A", (n,)), Buffer("Q", (n,)), Buffer("R", (n,))
    body = seq(
        BufferStore(Q, (i,), Binary("floordiv", A[i], FloatImm(-0.75))),
        BufferStore(R, (i,), Binary("floormod", A[i], FloatImm(0.75))),
    )
    func = PrimFunc("fdivmod", (A, Q, R), For(i, n, "serial", body), num_outputs=2)
    a = rng.uniform(-5, 5, n).astype(np.float32)
    q, r = run(func, a)
    np.testing.assert_allclose(q, np.floor(a / np.float32(-0.75)))
    np.testing.assert_allclose(r, np.mod(a, np.float32(0.75)), atol=1e-6)


def test_select_and_if_then_else(rng):
    n = 50
    A, B, C = Buffer("A", (n,)), Buffer("B", (n,)), Buffer("C", (n,))
    leaky = Select(Binary(">", A[i], FloatImm(0.0)), A[i], A[i] * 0.1)
    branch = IfThenElse(
        Binary("<", A[i], FloatImm(-0.5)),
        BufferStore(C, (i,), FloatImm(-1.0)),
        BufferStore(C, (i,), A[i] + 3.0),
    )
    body = For(i, n, "serial", seq(BufferStore(B, (i,), leaky), branch))
    a = rng.standard_normal(n, dtype=np.float32)
    b, c = run(PrimFunc("sel", (A, B, C), body, num_outputs=2), a)
    np.testing.assert_allclose(b, np.where(a > 0, a, a * np.float32(0.1)), rtol=1e-6)
    np.testing.assert_allclose(c, np.where(a < -0.5, -1.0, a + 3), rtol=1e-6)


def test_casts_bool_and_int64(rng):
    n = 40
    A, X = Buffer("A", (n,)), Buffer("X", (n,), "int32")
    I, F = Buffer("I", (n,), "int32"), Buffer("F", (n,), "float64")
    P, W = Buffer("P", (n,), "bool"), Buffer("W", (n,), "int64")
    body = seq(
        BufferStore(I, (i,), Cast("int32", A[i] * 10.0)),
        BufferStore(F, (i,), Cast("float64", X[i]) * 0.5 + Cast("float64", Cast("bool", X[i]))),
        BufferStore(P, (i,), Binary(">", A[i], FloatImm(0.25))),
        BufferStore(W, (i,), Cast("int64", X[i]) * IntImm(3_000_000_000, "int64")),
    )
    func = PrimFunc("casts", (A, X, I, F, P, W), For(i, n, "serial", body), num_outputs=4)
    a = rng.standard_normal(n, dtype=np.float32)
    x = rng.integers(-1000, 1000, n, dtype=np.int32)
    got_i, got_f, got_p, got_w = run(func, a, x)
    np.testing.assert_array_equal(got_i, (a * np.float32(10)).astype(np.int32))
    np.testing.assert_array_equal(got_f, x * 0.5 + (x != 0))
    np.testing.assert_array_equal(got_p, a > 0.25)
    np.testing.assert_array_equal(got_w, x.astype(np.int64) * 3_000_000_000)


_erf = np.vectorize(math.erf)
MATH = {
    "exp": np.exp,
    "log": lambda x: np.log(np.abs(x) + 0.5),
    "sqrt": lambda x: np.sqrt(np.abs(x)),
    "rsqrt": lambda x: 1 / np.sqrt(np.abs(x) + 0.5),
    "tanh": np.tanh,
    "erf": _erf,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "abs": np.abs,
    "floor": np.floor,
    "ceil": np.ceil,
    "sin": np.sin,
    "cos": np.cos,
}


def _math_arg(name, x):
    # Keep log, sqrt and rsqrt in their domains, as the numpy references do.
    if name == "log" or name == "rsqrt":
        return Call("abs", (x,)) + 0.5
    return Call("abs", (x,)) if name == "sqrt" else x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_calls(rng, dtype):
    n = 33
    A = Buffer("A", (n,), dtype)
    outs = [Buffer(f"out_{name}", (n,), dtype) for name in MATH]
    stores = [
        BufferStore(out, (i,), Call(name, (_math_arg(name, A[i]),)))
        for name, out in zip(MATH, outs, strict=True)
    ]
    extra = [Buffer(n_, (n,), dtype) for n_ in ("pw", "mn", "mx", "lit")]
    stores += [
        BufferStore(extra[0], (i,), Binary("pow", Call("abs", (A[i],)), FloatImm(1.5, dtype))),
        BufferStore(extra[1], (i,), Binary("min", A[i], FloatImm(0.1, dtype))),
        BufferStore(extra[2], (i,), Binary("max", A[i], FloatImm(float("-inf"), dtype))),
        BufferStore(extra[3], (i,), A[i] * FloatImm(-1e-3, dtype) + FloatImm(0.1, dtype)),
    ]
    params = (A, *outs, *extra)
    func = PrimFunc("maths", params, For(i, n, "serial", seq(*stores)), num_outputs=len(params) - 1)
    a = rng.standard_normal(n).astype(dtype)
    got = run(func, a)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-14)
    for name, value in zip(MATH, got[: len(MATH)], strict=True):  # then the four extras
        np.testing.assert_allclose(value, MATH[name](a), **tol, err_msg=name)
    t = np.dtype(dtype).type
    np.testing.assert_allclose(got[-4], np.abs(a) ** t(1.5), **tol)
    np.testing.assert_array_equal(got[-3], np.minimum(a, t(0.1)))
    np.testing.assert_array_equal(got[-2], a)
    np.testing.assert_allclose(got[-1], a * t(-1e-3) + t(0.1), **tol)


def test_literals():
    A = Buffer("A", (2,), "float64")
    func = PrimFunc(
        "lits",
        (A,),
        seq(
            BufferStore(A, (IntImm(0),), FloatImm(float("nan"), "float64")),
            BufferStore(A, (IntImm(1),), Cast("float64", IntImm(-(2**31)))),
        ),
    )
    source = generate_c(func)
    assert "A[0] = NAN;" in source and "INT32_MIN" in source
    out = np.full(2, 5.0)  # neither of what the kernel writes
    build(func)(out)
    assert np.isnan(out[0]) and out[1] == -(2**31)


def test_float16_is_stored_as_float16_and_computed_in_float():
    # 1/3 in float16 (rounded once, to 0.333251953125), times 3 in float, rounded again: 1.0
    A = Buffer("A", (2,), "float16")
    third = Cast("float16", FloatImm(1 / 3, "float32"))
    body = seq(
        BufferStore(A, (IntImm(0),), third),
        BufferStore(A, (IntImm(1),), BufferLoad(A, (IntImm(0),)) * FloatImm(3.0, "float16")),
    )
    func = PrimFunc("half", (A,), body)
    assert "_Float16" in generate_c(func)
    out = np.zeros(2, np.float16)
    build(func)(out)
    want = np.float16(1 / 3)
    np.testing.assert_array_equal(out, [want, np.float16(np.float32(want) * 3)])


def test_names_that_clash_with_c_are_renamed(rng):
    # A buffer named like a C keyword, one like a math function, a var like a buffer.
    A, B = Buffer("int", (3,)), Buffer("exp", (3,))
    v = Var("exp")
    body = For(v, 3, "serial", BufferStore(B, (v,), Call("exp", (A[v],))))
    func = PrimFunc("float", (A, B), body)
    assert kernel_symbol(func) == "float_kernel"
    a = rng.standard_normal(3, dtype=np.float32)
    np.testing.assert_allclose(run(func, a), np.exp(a), rtol=1e-6)


def test_fused_loop_divides_plainly_when_bounds_allow(rng):
    # vi = f // 12 and vj = f % 12 with f in [0, 96): C's / and % are exact, no helper needed.
    A, B, f = Buffer("A", (8, 12)), Buffer("B", (12, 8)), Var("f")
    body = block(
        "transpose",
        [
            (vi, "spatial", 8, Binary("floordiv", f, IntImm(12))),
            (vj, "spatial", 12, Binary("floormod", f, IntImm(12))),
        ],
        BufferStore(B, (vj, vi), A[vi, vj]),
    )
    func = PrimFunc("transpose", (A, B), For(f, 96, "parallel", body))
    source = generate_c(func)
    assert "B[((f % 12) * 8) + (f / 12)] = A[f];" in source and "hx_floordiv" not in source
    a = rng.standard_normal((8, 12), dtype=np.float32)
    np.testing.assert_array_equal(run(func, a), a.T)


@pytest.mark.parametrize(
    "depth,step,pragmas", [(32, 0, []), (32, 16, [4]), (32, 512, [8, 4]), (256, 512, [4])]
)
def test_auto_unroll_step_unrolls_the_small_nests_inside(depth, step, pragmas, rng):
    """`pragma_auto_unroll_max_step` on a loop: each serial loop inside whose nest makes at
    most that many iterations, in at most AUTO_UNROLL_MAX_NODES nodes, gets `GCC unroll`
    (K=256: the k loop's 256 copies are too many); the kernel computes the same."""
    import hexir
    from hexir.schedule import Schedule

    func = hexir.workload("matmul", M=16, N=24, K=depth)
    sch = Schedule(func, seed=0)
    i, _, k = sch.get_loops(sch.get_block("matmul"))
    sch.split(k, [None, 4])
    sch.annotate(i, "pragma_auto_unroll_max_step", step)
    source = generate_c(sch.func)
    found = [int(line.split()[-1]) for line in source.splitlines() if "GCC unroll" in line]
    assert found == pragmas
    a = rng.standard_normal((16, depth), np.float32)
    b = rng.standard_normal((depth, 24), np.float32)
    c = np.full((16, 24), np.nan, np.float32)
    build(sch.func)(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_a_large_unrolled_loop_unrolls_only_as_far_as_the_source_stays_small(rng):
    # 960 iterations of a 20-statement body: a full `#pragma GCC unroll 960` took GCC minutes.
    from hexir.codegen.c_lower import UNROLL_MAX_NODES

    func = hexir.workload("matmul", M=24, N=40, K=20)
    sch = hexir.Schedule(func, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    fused = sch.fuse(i, j)
    sch.unroll(k)  # expanded in the source: the body of the fused loop is 20 statements
    sch.unroll(fused)
    source = generate_c(sch.func)
    (factor,) = [int(line.split()[-1]) for line in source.splitlines() if "GCC unroll" in line]
    assert 1 < factor < 960 and factor * 20 <= UNROLL_MAX_NODES
    a = rng.standard_normal((24, 20), dtype=np.float32)
    b = rng.standard_normal((20, 40), dtype=np.float32)
    np.testing.assert_allclose(run(sch.func, a, b), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M, unrolled", [(13, True), (10, False)])
def test_a_ragged_tile_loop_is_split_where_its_guards_stop_holding(M, unrolled, rng):
    # Rows in tiles of 4, the last tile guarded (13 = 3 x 4 + 1; 10 = 2 x 4 + 2): the full
    # tiles run in a loop of their own without the guard, the last after it. Unrolled, the
    # tail's guards are decided when the C is written; a loop inside the tail is split in
    # turn (its 2 valid rows, then none).
    func = hexir.workload("matmul", M=M, N=8, K=6)
    sch = hexir.Schedule(func, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    outer, inner = sch.split(i, [None, 4])
    if unrolled:
        sch.reorder(outer, j, k, inner)
        sch.unroll(inner)
    source = generate_c(sch.func)
    lines = [line.strip() for line in source.splitlines()]
    assert f"for (int32_t i0_0 = 0; i0_0 < {M // 4}; ++i0_0) {{" in lines
    guards = [line for line in lines if line.startswith("if (") and f"< {M})" in line]
    assert not guards
    a = rng.standard_normal((M, 6), dtype=np.float32)
    b = rng.standard_normal((6, 8), dtype=np.float32)
    np.testing.assert_allclose(run(sch.func, a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_a_zero_bordered_copy_is_a_plain_copy_inside_its_border(rng):
    # pad's select (and the clamps of its load) hold for 1 <= i < 8 on both image axes: the
    # loops split there, the interior copies without them, the border rows and columns store
    # zeros with their guards decided when the C is written.
    func = hexir.workload("pad", shape=(2, 3, 7, 7), before=(0, 0, 1, 1), after=(0, 0, 1, 1))
    source = generate_c(func)
    assert "?" not in source and "hx_max_i32" not in source
    x = rng.standard_normal((2, 3, 7, 7), dtype=np.float32)
    np.testing.assert_array_equal(run(func, x), np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))))


def test_the_pieces_of_a_partitioned_loop_keep_their_own_register_tiles(rng):
    """A ragged last column panel is a piece of its own, with guarded scalar accesses to its
    accumulator; the main panels' accumulator is a buffer of its own still, an array of
    vectors (in registers), not memory shared with the tail."""
    import re

    from hexir.runtime.default_schedule import default_schedule

    func = hexir.workload("matmul", M=600, N=197, K=16)
    kernel = build(default_schedule(func, "cpu").func)
    declared = set(re.findall(r"\n\s*((?:hx_f32x\d+|float) C_local\w*)\[", kernel.source))
    assert any(d.startswith("hx_f32x") and d.endswith(" C_local") for d in declared)
    assert any(d.endswith("C_local_p1") for d in declared)
    a = rng.standard_normal((600, 16), dtype=np.float32)
    b = rng.standard_normal((16, 197), dtype=np.float32)
    c = np.full((600, 197), np.nan, np.float32)
    kernel(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_a_kernel_whose_partitioning_copies_past_its_line_limit_is_refused_before_printing():
    """A padded copy's loops partition into pieces; where the caller takes so few lines that
    the pieces pass PIECE_NODES_PER_LINE a line, lowering stops (before the printer would);
    without a limit the same kernel prints."""
    from hexir.codegen.c_lower import PIECE_NODES_PER_LINE, SourceTooLong, lower_for_c

    func = hexir.workload("pad", shape=(2, 3, 7, 7), before=(0, 0, 1, 1), after=(0, 0, 1, 1))
    assert "if" not in generate_c(func)  # partitioned: no guard is left
    with pytest.raises(SourceTooLong, match=f"more than {PIECE_NODES_PER_LINE * 2} nodes"):
        lower_for_c(func.body, max_lines=2)
    lower_for_c(func.body, max_lines=10_000)  # the same pieces, within a larger limit


def test_a_line_limit_refuses_only_c_longer_than_it():
    """Random samples of a padded conv printed to a limit at their median length: each one
    within it prints the C it prints without a limit, and each one refused prints longer;
    some are refused by their partitioning's copies, before their C."""
    import random

    from hexir.codegen.c_lower import SourceTooLong
    from hexir.runtime.build import c_source
    from hexir.search.evolutionary import EvolutionarySearch

    conv = hexir.workload("conv2d", N=1, C=8, H=14, W=14, K=16, R=3, S=3, padding=1)
    cpu = hexir.Target("cpu")
    batch = EvolutionarySearch(conv, cpu, rng=random.Random(0)).sample(16)
    full = [c_source(c.func, cpu) for c in batch]
    limit = sorted(s.count("\n") for s in full)[len(full) // 2]
    refused = []
    for candidate, whole in zip(batch, full, strict=True):
        try:
            assert c_source(candidate.func, cpu, max_lines=limit) == whole
            assert whole.count("\n") <= limit
        except SourceTooLong as e:
            assert whole.count("\n") > limit
            refused.append(str(e))
    assert any("partitioning" in r for r in refused) and len(refused) >= 4
