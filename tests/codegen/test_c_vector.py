"""Explicit SIMD, source unrolling and register tiles in the C printer, checked against numpy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.c import generate_c
from hexir.ir.tir import (
    Allocate,
    Binary,
    Buffer,
    BufferStore,
    Call,
    Cast,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    PrimFunc,
    Select,
    Var,
    seq,
)
from hexir.runtime.build import build

AVX2 = SimpleNamespace(vector_width=8)  # all the printer reads of a target


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def run(func, *inputs):
    """`func` on `inputs` and poisoned outputs (NaN, or 7 for ints and bools); the outputs."""
    outputs = [
        np.full(b.shape, np.nan if np.dtype(b.dtype).kind == "f" else 7, b.dtype)
        for b in func.outputs
    ]
    build(func)(*inputs, *outputs)
    return outputs[0] if len(outputs) == 1 else outputs


def body_of(source: str) -> str:
    """The kernel's body: the source after the preamble's helpers."""
    return source[source.index("HX_EXPORT void") :]


i, j = Var("i"), Var("j")


def axpb(n: int, dtype: str = "float32", kind: str = "vectorized") -> PrimFunc:
    """Y[i] = A[i] * S[0] + B[i] + 0.5: a unit-stride load, a broadcast one and a constant."""
    A, B, S, Y = (Buffer(name, (n,) if name != "S" else (1,), dtype) for name in "ABSY")
    value = A[i] * S[0] + B[i] + FloatImm(0.5, dtype)
    return PrimFunc("axpb", (A, B, S, Y), For(i, n, kind, BufferStore(Y, (i,), value)))


@pytest.mark.parametrize(
    "n,chunk_loop,half,tail",
    [
        (64, False, False, False),
        (37, False, False, True),
        (1000, True, True, False),
        (5, False, False, True),
        (45, False, True, True),
    ],  # fmt: skip
)
def test_vector_shapes(rng, n, chunk_loop, half, tail):
    # 16 lanes a chunk, up to MAX_STRAIGHT_CHUNKS straight, more as a loop; a tail of at
    # least 8 runs as one 8-lane vector, what is left as a scalar loop (the memory plan may
    # run Y over A, so no recomputed last vector: the test after this one).
    func = axpb(n)
    body = body_of(generate_c(func))
    assert "hx_load_f32x" in body and "#pragma omp simd" not in body
    assert ("i += 16" in body) == chunk_loop
    assert ("hx_load_f32x8(" in body) == half
    assert ("for (int32_t i = " in body and "++i" in body) == tail
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    s = rng.standard_normal(1, dtype=np.float32)
    np.testing.assert_allclose(run(func, a, b, s), a * s[0] + b + 0.5, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n,chunk_loop", [(37, False), (1000, True), (45, False)])
def test_a_tail_runs_as_one_more_vector_ending_at_the_loops_end(rng, n, chunk_loop):
    # Y[i] = A[i + 1] * S[0] + B[i + 1]: no input of Y's shape, nothing the memory plan could
    # run it over; the tail is one more full vector, computed before the others.
    shapes = {"A": (n + 1,), "B": (n + 1,), "S": (1,), "Y": (n,)}
    A, B, S, Y = (Buffer(name, shapes[name]) for name in "ABSY")
    value = A[i + 1] * S[0] + B[i + 1] + FloatImm(0.5, "float32")
    func = PrimFunc("shifted", (A, B, S, Y), For(i, n, "vectorized", BufferStore(Y, (i,), value)))
    body = body_of(generate_c(func))
    assert ("i += 16" in body) == chunk_loop
    assert f"&Y[{n - 16}]" in body and "++i" not in body and "hx_load_f32x8(" not in body
    a = rng.standard_normal(n + 1, dtype=np.float32)
    b = rng.standard_normal(n + 1, dtype=np.float32)
    s = rng.standard_normal(1, dtype=np.float32)
    want = a[1:] * s[0] + b[1:] + 0.5
    np.testing.assert_allclose(run(func, a, b, s), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n,half,tail", [(5, False, True), (45, True, True), (40, True, False)])
def test_a_tail_that_rewrites_what_it_reads_runs_narrower_then_scalar(rng, n, half, tail):
    # y = y * s[0] in place: computed twice, an element would be scaled twice; a tail of at
    # least 8 runs as one 8-lane vector, what is left as a scalar loop.
    Y, S = Buffer("Y", (n,)), Buffer("S", (1,))
    func = PrimFunc("scale", (S, Y), For(i, n, "vectorized", BufferStore(Y, (i,), Y[i] * S[0])))
    body = body_of(generate_c(func))
    assert ("hx_load_f32x8(" in body) == half
    assert ("for (int32_t i = " in body and "++i" in body) == tail
    y, s = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(1, dtype=np.float32)
    want = y * s[0]
    build(func)(s, y)  # in place
    np.testing.assert_array_equal(y, want)


def test_float64_uses_eight_lanes(rng):
    func = axpb(40, "float64")
    assert "hx_f64x8" in generate_c(func)
    a, b, s = rng.standard_normal(40), rng.standard_normal(40), rng.standard_normal(1)
    np.testing.assert_allclose(run(func, a, b, s), a * s[0] + b + 0.5, rtol=1e-14)


def test_avx2_target_uses_256_bit_vectors():
    source = generate_c(axpb(64), AVX2)  # type: ignore[arg-type]
    assert "hx_f32x8 __attribute__((vector_size(32)))" in source and "hx_f32x16" not in source


def test_select_min_max_abs_and_masks(rng):
    n = 48
    A, B, Y, Z = (Buffer(name, (n,)) for name in "ABYZ")
    both = Binary("&&", Binary(">", A[i], FloatImm(0.0)), Binary("<", B[i], A[i]))
    leaky = Select(both, A[i], A[i] * 0.1)
    clipped = Binary("min", Binary("max", Call("abs", (B[i],)), FloatImm(0.25)), A[i] + 1.0)
    body = seq(BufferStore(Y, (i,), leaky), BufferStore(Z, (i,), clipped))
    func = PrimFunc("sel", (A, B, Y, Z), For(i, n, "vectorized", body), num_outputs=2)
    assert "hx_select_f32x16" in generate_c(func) and "omp simd" not in generate_c(func)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    y, z = run(func, a, b)
    np.testing.assert_array_equal(y, np.where((a > 0) & (b < a), a, a * np.float32(0.1)))
    np.testing.assert_array_equal(z, np.minimum(np.maximum(np.abs(b), 0.25), a + 1))


def test_int32_arithmetic_and_casts(rng):
    # Q = (X * 3 + i) // 4, R = that % 4 (signed: floor semantics), F = float(Q) * 0.5.
    n = 70
    X, Q, R = (Buffer(name, (n,), "int32") for name in "XQR")
    F = Buffer("F", (n,))
    value = X[i] * IntImm(3) + i
    body = seq(
        BufferStore(Q, (i,), Binary("floordiv", value, IntImm(4))),
        BufferStore(R, (i,), Binary("floormod", value, IntImm(4))),
        BufferStore(F, (i,), Cast("float32", Q[i]) * 0.5),
    )
    func = PrimFunc("ints", (X, Q, R, F), For(i, n, "vectorized", body), num_outputs=3)
    source = generate_c(func)
    assert "hx_ifloordiv_i32x16" in source and "omp simd" not in source  # X may be < 0
    x = rng.integers(-1000, 1000, n, dtype=np.int32)
    q, r, f = run(func, x)
    expect = x * 3 + np.arange(n, dtype=np.int32)
    np.testing.assert_array_equal(q, expect // 4)
    np.testing.assert_array_equal(r, expect % 4)
    np.testing.assert_array_equal(f, (expect // 4).astype(np.float32) * 0.5)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_bytes_widen_to_int32_and_float_lanes_in_one_instruction(dtype, rng):
    # An int4 weight's GEMV reads bytes into int32 lanes: one vpmovzxbd / vpmovsxbd on x86
    # (GCC 12 converts a byte vector one lane at a time through the scalar registers).
    from hexir.runtime.target import Target

    n = 70
    X, Q, F = Buffer("X", (n,), dtype), Buffer("Q", (n,), "int32"), Buffer("F", (n,))
    body = seq(
        BufferStore(
            Q, (i,), Binary("shr", Binary("shl", Cast("int32", X[i]), IntImm(28)), IntImm(28))
        ),  # fmt: skip
        BufferStore(F, (i,), Cast("float32", X[i]) * 0.5),
    )
    func = PrimFunc("widen", (X, Q, F), For(i, n, "vectorized", body), num_outputs=2)
    host = Target("cpu")
    source = generate_c(func, host)
    intrinsic = {"avx512f": "_mm512_cvtep", "avx2": "_mm256_cvtep"}
    found = next((name for feature, name in intrinsic.items() if feature in host.features), None)
    assert "omp simd" not in source and (found is None or found in source)
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, n).astype(dtype)
    q, f = run(func, x)
    np.testing.assert_array_equal(q, ((x.astype(np.int32) & 15) ^ 8) - 8)  # the low nibble
    np.testing.assert_array_equal(f, x.astype(np.float32) * np.float32(0.5))


def test_nonnegative_int_division_vectorizes(rng):
    n = 32
    X, Q = Buffer("X", (n,), "int32"), Buffer("Q", (n,), "int32")
    value = Binary("floordiv", Binary("max", X[i], IntImm(0)) + i, IntImm(3))
    func = PrimFunc("idiv", (X, Q), For(i, n, "vectorized", BufferStore(Q, (i,), value)))
    assert "omp simd" not in generate_c(func)
    x = rng.integers(-100, 100, n, dtype=np.int32)
    np.testing.assert_array_equal(run(func, x), (np.maximum(x, 0) + np.arange(n)) // 3)


def test_strided_load_is_gathered(rng):
    A, B = Buffer("A", (16, 24)), Buffer("B", (24, 16))
    copy = BufferStore(B, (j, i), A[i, j])
    func = PrimFunc("transpose", (A, B), For(j, 24, "serial", For(i, 16, "vectorized", copy)))
    assert "(hx_f32x16){A[" in generate_c(func)
    a = rng.standard_normal((16, 24), dtype=np.float32)
    np.testing.assert_array_equal(run(func, a), a.T)


def fallbacks() -> list[PrimFunc]:
    n = 20
    A, B = Buffer("A", (n,)), Buffer("B", (n,))
    sin = BufferStore(B, (i,), Call("sin", (A[i],)))  # a call without a vector form
    strided = BufferStore(B, (Binary("floormod", i * 3, IntImm(n)),), A[i])
    lane_if = IfThenElse(Binary("<", i * i, IntImm(49)), BufferStore(B, (i,), A[i]))
    lane_if = seq(BufferStore(B, (i,), -A[i]), lane_if)  # a guard no loop split can lift
    nested = For(j, 1, "serial", BufferStore(B, (i,), A[i] + 1.0))
    return [
        PrimFunc(name, (A, B), For(i, n, "vectorized", body))
        for name, body in {
            "sin": sin,
            "strided": strided,
            "lane_if": lane_if,
            "nest": nested,
        }.items()
    ]


@pytest.mark.parametrize("func", fallbacks(), ids=lambda f: f.name)
def test_fallback_to_scalar_simd_loop(rng, func):
    assert "#pragma omp simd" in generate_c(func)
    a = rng.standard_normal(20, dtype=np.float32)
    expect = {
        "sin": lambda: np.sin(a),
        "strided": lambda: a[[(7 * k) % 20 for k in range(20)]],  # B[3i % 20] = A[i]
        "lane_if": lambda: np.where(np.arange(20) < 7, a, -a),
        "nest": lambda: a + 1,
    }[func.name]()
    np.testing.assert_allclose(run(func, a), expect, rtol=1e-6)


def test_a_bound_on_the_lane_splits_the_vector_loop_instead_of_falling_back(rng):
    # `if i < 7` inside a vectorized loop of 20: the loop partitioning of c_lower splits it
    # at 7, so both parts vectorize without the guard (no scalar simd fallback).
    A, B = Buffer("A", (20,)), Buffer("B", (20,))
    guarded = IfThenElse(Binary("<", i, IntImm(7)), BufferStore(B, (i,), A[i]))
    body = seq(BufferStore(B, (i,), -A[i]), guarded)
    source = generate_c(PrimFunc("lane_bound", (A, B), For(i, 20, "vectorized", body)))
    assert "#pragma omp simd" not in source and "if (" not in source
    a = rng.standard_normal(20, dtype=np.float32)
    func = PrimFunc("lane_bound", (A, B), For(i, 20, "vectorized", body))
    np.testing.assert_allclose(run(func, a), np.where(np.arange(20) < 7, a, -a), rtol=1e-6)


def test_unrolled_loops_leave_no_loop(rng):
    # Y[i, j] = A[i, j] * (i + 1) with both loops unrolled: straight-line code only.
    A, Y = Buffer("A", (3, 5)), Buffer("Y", (3, 5))
    store = BufferStore(Y, (i, j), A[i, j] * Cast("float32", i + 1))
    func = PrimFunc("scale", (A, Y), For(i, 3, "unrolled", For(j, 5, "unrolled", store)))
    source = body_of(generate_c(func))
    assert "for (" not in source and "Y[14] = A[14] * 3.0f;" in source
    a = rng.standard_normal((3, 5), dtype=np.float32)
    np.testing.assert_array_equal(run(func, a), a * np.arange(1, 4, dtype=np.float32)[:, None])


def test_large_unrolled_loop_keeps_a_pragma():
    A = Buffer("A", (100,))
    func = PrimFunc("big", (A,), For(i, 100, "unrolled", BufferStore(A, (i,), FloatImm(1.0))))
    assert "#pragma GCC unroll 100" in generate_c(func)


# A matmul as the CPU schedule makes it (cache_write local + reverse_compute_at, cache_read
# global + compute_at, decompose_reduction, rows unrolled, columns vectorized), compacted.
TILED_MATMUL = """
hextir.func @matmul(%A: buffer<4x8xf32>, %B: buffer<8x32xf32>, %C: buffer<4x32xf32>) {
  for %i1_0 in 0..1 parallel {
    alloc %B_global: buffer<8x32xf32>
    for %ax0_1 in 0..8 serial {
      for %ax1_1 in 0..32 vectorized {
        block @B_global(v0_1 = spatial(8) %ax0_1, v1_1 = spatial(32) %ax1_1)
            reads(%B[v0_1, v1_1]) writes(%B_global[v0_1, v1_1]) {
          %B_global[v0_1, v1_1] = %B[v0_1, v1_1]
        }
      }
    }
    for %i0_0 in 0..2 serial {
      alloc %C_local: buffer<2x32xf32, local>
      for %i0_1_init in 0..2 unrolled {
        for %i1_1_init in 0..32 vectorized {
          block @matmul_init(vi0 = spatial(4) %i0_0 * 2 + %i0_1_init,
                             vi1 = spatial(32) %i1_1_init)
              reads() writes(%C_local[floormod(vi0, 2), vi1]) {
            %C_local[floormod(vi0, 2), vi1] = 0.0
          }
        }
      }
      for %k0 in 0..8 serial {
        for %i0_1 in 0..2 unrolled {
          for %i1_1 in 0..32 vectorized {
            block @matmul(vi0 = spatial(4) %i0_0 * 2 + %i0_1, vi1 = spatial(32) %i1_1,
                          vk0 = reduce(8) %k0)
                reads(%A[vi0, vk0], %B_global[vk0, vi1]) writes(%C_local[floormod(vi0, 2), vi1]) {
              %C_local[floormod(vi0, 2), vi1] = %C_local[floormod(vi0, 2), vi1]
                  + %A[vi0, vk0] * %B_global[vk0, vi1]
            }
          }
        }
      }
      for %ax0 in 0..2 unrolled {
        for %ax1 in 0..32 vectorized {
          block @C_local(v0 = spatial(4) %i0_0 * 2 + %ax0, v1 = spatial(32) %ax1)
              reads(%C_local[floormod(v0, 2), v1]) writes(%C[v0, v1]) {
            %C[v0, v1] = %C_local[floormod(v0, 2), v1]
          }
        }
      }
    }
  }
}
"""


def test_register_tile_matmul(rng):
    func = hexir.parse(TILED_MATMUL)
    source = generate_c(func)
    assert "hx_f32x16 C_local[2][2];" in source and "omp simd" not in source
    assert "C_local[1][1] = C_local[1][1] + " in source.replace("(", "").replace(")", "")
    a = rng.standard_normal((4, 8), dtype=np.float32)
    b = rng.standard_normal((8, 32), dtype=np.float32)
    np.testing.assert_allclose(run(func, a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_register_tile_read_at_a_variable_index_stays_correct(rng):
    # acc[j] read with j serial: not a register pattern, the buffer stays an array.
    A, Y = Buffer("A", (4, 16)), Buffer("Y", (4, 16))
    acc = Buffer("acc", (16,), scope="local")
    body = seq(
        Allocate(acc),
        For(j, 16, "vectorized", BufferStore(acc, (j,), A[i, j] * 2.0)),
        For(j, 16, "serial", BufferStore(Y, (i, IntImm(15) - j), acc[j])),
    )
    func = PrimFunc("rev", (A, Y), For(i, 4, "serial", body))
    assert "float acc[16]" in generate_c(func)
    a = rng.standard_normal((4, 16), dtype=np.float32)
    np.testing.assert_array_equal(run(func, a), (a * 2)[:, ::-1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_vector_min_max_keep_the_scalar_semantics_of_nans_and_signed_zeros(rng, dtype):
    # min(a, b) = a < b ? a : b and max(a, b) = a > b ? a : b, lane by lane: where the
    # compare is false (a NaN on either side, or equal zeros of either sign) the result is b.
    # On x86 targets each is one MINPS/MAXPS (same rule); without features, a compare and blend.
    n = 64
    A, B, LO, HI = (Buffer(name, (n,), dtype) for name in ("A", "B", "LO", "HI"))
    body = seq(
        BufferStore(LO, (i,), Binary("min", A[i], B[i])),
        BufferStore(HI, (i,), Binary("max", A[i], B[i])),
    )
    func = PrimFunc("minmax", (A, B, LO, HI), For(i, n, "vectorized", body), num_outputs=2)
    specials = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0], dtype)
    a = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    a[:36], b[:36] = np.repeat(specials, 6), np.tile(specials, 6)  # every pair of specials
    lo, hi = run(func, a, b)
    bits = f"u{np.dtype(dtype).itemsize}"  # compared bit for bit: NaNs and zeros' signs too
    np.testing.assert_array_equal(lo.view(bits), np.where(a < b, a, b).view(bits))
    np.testing.assert_array_equal(hi.view(bits), np.where(a > b, a, b).view(bits))


def test_vector_min_max_are_one_instruction_where_the_target_has_it():
    A, B = Buffer("A", (64,)), Buffer("B", (64,))
    func = PrimFunc(
        "relu",
        (A, B),
        For(i, 64, "vectorized", BufferStore(B, (i,), Binary("max", A[i], FloatImm(0.0)))),
    )
    avx512 = hexir.Target("cpu -features=avx2,avx512f,fma -cores=2")
    avx2 = hexir.Target("cpu -features=avx2,fma -cores=2")
    assert "_mm512_max_ps(a, b)" in generate_c(func, avx512)
    assert "_mm256_max_ps(a, b)" in generate_c(func, avx2)
    assert "#include <immintrin.h>" in generate_c(func, avx2)
    assert "hx_select_f32x16(a > b, a, b)" in generate_c(func)  # no target: portable C
