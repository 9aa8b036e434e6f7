"""Vector math in the C printer (hexir/codegen/c_math.py), through the real compiler path: a
one-op kernel (`hexir.workload`) with its loop vectorized at 4, 8 or 16 fp32 lanes, built with
the system C compiler and run, against float64 numpy rounded to float32, within an ulp bound.

Inputs: every 997th float32 bit pattern (4.3 million values: both signs, denormals, inf, NaN),
each function's edges (exp's overflow and underflow thresholds, the ends of each polynomial's
interval, ...), and log-uniform random values from the `rng` fixture. A 16-lane kernel runs on
an AVX2 machine too, GCC lowering each 16-lane operation to AVX2's (in halves, comparisons lane
by lane): the same C source an AVX-512 machine runs, only the instructions differ
(test_avx512_assembly compiles it for AVX-512 there, without running it).
"""

from __future__ import annotations

import functools
import platform
import re
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.c import generate_c
from hexir.ir.tir import Buffer, BufferStore, Call, For, PrimFunc, Var
from hexir.ops.numeric import erf as erf64
from hexir.runtime.cc import compile_c
from hexir.runtime.kernel import CpuKernel
from hexir.runtime.target import Target

# The largest error allowed, in float32 ulp (the measured maxima are in docs/math.md).
BOUND = {"exp": 1, "log": 1, "tanh": 2, "sigmoid": 3, "erf": 2, "sqrt": 0.5, "rsqrt": 2}
FUNCS = tuple(BOUND)
F32 = np.finfo(np.float32)


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def _erf(x: np.ndarray) -> np.ndarray:
    out = np.where(np.isnan(x), np.nan, np.sign(x))  # +-1 at +-inf
    finite = np.isfinite(x)
    out[finite] = erf64(x[finite])
    return out


REFERENCE = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": _erf,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
}


def reference(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REFERENCE[name](x.astype(np.float64))


def kernel(
    op: str, n: int, lanes: int, vector_math: bool = True, features: tuple = (), **attrs
) -> CpuKernel:
    """`op` over n float32 values, its loop vectorized at `lanes`, built for this machine;
    the portable helpers unless `features` name the instructions of one (min, max, scale2)."""
    func = hexir.workload(op, shapes=[(n,)] * (2 if op == "power" else 1), attrs=attrs)
    sch = hexir.Schedule(func, seed=0)
    (loop,) = sch.get_loops(sch.get_block(op))
    sch.vectorize(loop)
    width = SimpleNamespace(vector_width=lanes, features=features)  # what the printer reads
    source = generate_c(sch.func, width, vector_math=vector_math)  # type: ignore[arg-type]
    target = Target("cpu")
    return CpuKernel(sch.func, source, compile_c(source, target), target)


def run(k: CpuKernel, *inputs: np.ndarray) -> np.ndarray:
    out = np.full(inputs[0].shape, np.nan, np.float32)
    k(*inputs, out)
    return out


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in float32 ulp at ref; where either is inf or NaN once rounded to float32,
    0 if they are the same (NaN for NaN) and inf if not."""
    with np.errstate(over="ignore"):
        exact = ref.astype(np.float32)
    exponent = np.frexp(ref)[1] - 1
    ulp = np.where(ref == 0, 2.0**-149, np.ldexp(1.0, np.maximum(exponent, -126) - 23))
    with np.errstate(invalid="ignore"):
        err = np.abs(got.astype(np.float64) - ref) / ulp
    special = ~np.isfinite(exact) | ~np.isfinite(got)
    same = (got == exact) | (np.isnan(got) & np.isnan(exact))
    return np.where(special, np.where(same, 0.0, np.inf), err)


def assert_within(name: str, x: np.ndarray, got: np.ndarray, ref: np.ndarray, bound: float):
    err = ulp_error(got, ref)
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (
        f"{name}: {int(np.sum(err > bound))} of {err.size} values beyond {bound} ulp, the worst "
        f"{err[worst]:.3g} ulp at x = {x.flat[worst]!r} ({x.view(np.uint32).flat[worst]:#010x}): "
        f"{got.flat[worst]!r}, numpy {ref.flat[worst]!r}"
    )
    zeros = ref == 0  # exact zeros keep their sign: erf(-0) = -0
    assert np.array_equal(np.signbit(got[zeros]), np.signbit(ref[zeros])), f"{name}: sign of 0"


def edges() -> np.ndarray:
    """The values where the functions change formula, saturate, overflow or underflow."""
    tiny = np.float32(F32.smallest_subnormal)
    values = [
        0.0, tiny, 2 * tiny, F32.tiny, F32.tiny - tiny, F32.max, np.inf, np.nan, 1.0, 0.5, 2.0,
        88.72283, 88.722839, 88.72284, 89.0, 87.33654, 103.27893, 103.97208, 103.97209, 104.0,
        0.625, 0.875, 2.25, 3.919206, 3.92, 9.010913, 17.0, 1e-20, 1e-30, 1e-38, 1e30, 1e38,
        np.sqrt(0.5), np.sqrt(2.0), 0.7071067, 1.4142135,
    ]  # fmt: skip
    v = np.array(values, np.float32)
    around = np.concatenate([np.nextafter(v, np.float32(-np.inf)), v, np.nextafter(v, F32.max)])
    return np.concatenate([around, -around])


@functools.cache
def sweep() -> np.ndarray:
    """Every 997th float32 bit pattern and the edges, padded to a multiple of 16 lanes."""
    bits = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), edges()])
    return np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])


@functools.cache
def sweep_reference(name: str) -> np.ndarray:
    return reference(name, sweep())


# AVX2's 8 lanes in the slow suite: the same helpers as 16 lanes', at half the width.
@pytest.mark.parametrize("lanes", [pytest.param(8, marks=pytest.mark.slow), 4, 16])
@pytest.mark.parametrize("name", FUNCS)
def test_sweep_of_all_float32(name, lanes):
    x = sweep()
    got = run(kernel(name, x.size, lanes), x)
    assert_within(name, x, got, sweep_reference(name), BOUND[name])


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh"])
def test_exp_on_this_machines_instructions_is_the_portable_exp_bit_for_bit(name):
    # With AVX-512, exp's a 2^n is one VSCALEFPS (and min/max one instruction each): the same
    # single rounding as the portable two-halves multiply, to denormals, 0 and inf, NaN kept.
    x = sweep()
    features = Target("cpu").features
    mine = run(kernel(name, x.size, 16, features=features), x)
    portable = run(kernel(name, x.size, 16), x)
    np.testing.assert_array_equal(mine.view(np.uint32), portable.view(np.uint32))


def test_exp_scales_by_one_instruction_on_avx512():
    func = hexir.workload("exp", shapes=[(64,)])
    sch = hexir.Schedule(func, seed=0)
    sch.vectorize(sch.get_loops(sch.get_block("exp"))[0])
    avx512 = Target("cpu -features=avx2,avx512f,fma -cores=2")
    assert "_mm512_scalef_ps(a, b)" in generate_c(sch.func, avx512)
    assert "scalef" not in generate_c(sch.func, Target("cpu -features=avx2,fma -cores=2"))


@pytest.mark.parametrize("name", FUNCS)
def test_random_values_and_a_scalar_tail(rng, name):
    # log-uniform magnitudes over the whole float32 range, both signs; 1003 = 125 chunks of 8
    # and a tail of 3 that runs libm's scalar calls.
    n = 1003
    x = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-45, 38.5, n)).astype(np.float32)
    x[:200] = rng.uniform(-12, 12, 200)  # where most of each function's shape is
    got = run(kernel(name, n, 8), x)
    assert_within(name, x, got, reference(name, x), BOUND[name])


@pytest.mark.parametrize("name", FUNCS)
def test_vector_math_replaces_the_scalar_loop(name):
    k = kernel(name, 64, 8)
    assert f"hx_{name}_f32x8(" in k.source and "omp simd" not in k.source
    scalar = kernel(name, 64, 8, vector_math=False)
    assert "#pragma omp simd" in scalar.source and "hx_" + name not in scalar.source


def test_the_knob_reaches_the_build():
    func = hexir.workload("exp", shape=(64,))
    sch = hexir.Schedule(func, seed=0)
    sch.vectorize(sch.get_loops(sch.get_block("exp"))[0])
    assert "hx_exp_f32x" in hexir.build(sch.func).source
    with knobs.scope(vector_math=False):
        assert "hx_exp_f32x" not in hexir.build(sch.func).source


# --- pow ---------------------------------------------------------------------------------------

POW_SPECIAL = np.array(
    [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 1.5, -1.5, 0.25, 7.0, -7.0, 10.0,
     2.0**24, 2.0**24 + 2, 2.0**23 + 1, -(2.0**23 + 1), 1e10, -1e10, 1e-10, 1e38, -1e38, 127.0,
     -149.0, F32.tiny, F32.smallest_subnormal, F32.max, np.inf, -np.inf, np.nan, 0.99999994,
     1.0000001],
    np.float32,
)  # fmt: skip


@pytest.mark.parametrize("lanes", [8, 4, 16])
def test_pow(rng, lanes):
    # Every pair of special values (C99's cases: pow(x, 0) = pow(1, y) = 1, pow(-1, inf) = 1,
    # negative x to a non-integer is NaN, odd integers keep x's sign, zeros and infinities),
    # then random bases to random and integer exponents.
    sx, sy = (a.ravel() for a in np.meshgrid(POW_SPECIAL, POW_SPECIAL))
    n = 20000
    rx = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-40, 38, n)).astype(np.float32)
    ry = rng.uniform(-40, 40, n).astype(np.float32)
    ry[: n // 2] = np.round(ry[: n // 2])
    near = rng.uniform(0.5, 2, n).astype(np.float32)  # large exponents of bases near 1
    x = np.concatenate([sx, rx, near])
    y = np.concatenate([sy, ry, rng.uniform(-300, 300, n).astype(np.float32)])
    pad = -x.size % 16
    x, y = np.pad(x, (0, pad), constant_values=2), np.pad(y, (0, pad), constant_values=2)
    got = run(kernel("power", x.size, lanes), x, y)
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), y.astype(np.float64))
    assert_within("pow", x, got, ref, 1)


def test_pow_falls_back_without_vector_math():
    assert "powf(" in kernel("power", 64, 8, vector_math=False).source


# --- gelu, float64, AVX-512 -------------------------------------------------------------------


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(rng, approximate):
    # gelu's own float32 arithmetic (1 + erf cancels for x << 0) bounds it, not erf's error:
    # within 4 ulp of the result plus 2 ulp of x, as the scalar libm kernel.
    n = 4096
    x = rng.uniform(-10, 10, n).astype(np.float32)
    x[:1024] = rng.standard_normal(1024)
    vector = kernel("gelu", n, 8, approximate=approximate)
    assert "hx_erf_f32x8" in vector.source or "hx_tanh_f32x8" in vector.source
    got, scalar = run(vector, x), run(kernel("gelu", n, 8, False, approximate=approximate), x)
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        ref = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    else:
        ref = 0.5 * x64 * (1 + erf64(x64 / np.sqrt(2)))
    tol = 4 * np.spacing(np.abs(ref).astype(np.float32)) + 2 * np.spacing(np.abs(x))
    assert np.all(np.abs(got - ref) <= tol)
    assert np.all(np.abs(scalar - ref) <= tol)


F64_BOUND = {"exp": 1, "log": 1, "sigmoid": 3, "sqrt": 0.5, "rsqrt": 2}
F64_EDGES = np.array(
    [0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, np.inf, np.nan, 1.0, 0.5,
     709.782712893384, 709.79, 710.0, 708.3964185322641, 744.4400719213812, 745.1332191019411,
     745.14, 746.0, np.sqrt(0.5), np.sqrt(2.0), 1e-300, 1e300],
)  # fmt: skip


def ulp_error64(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """As ulp_error, in float64 ulp, for a long double reference."""
    with np.errstate(over="ignore"):
        exact = ref.astype(np.float64)
        exponent = np.frexp(ref)[1] - 1
        ulp = np.where(ref == 0, 2.0**-1074, np.ldexp(1.0, np.maximum(exponent, -1022) - 52))
    with np.errstate(invalid="ignore"):
        err = (np.abs(got.astype(np.longdouble) - ref) / ulp).astype(np.float64)
    special = ~np.isfinite(exact) | ~np.isfinite(got)
    same = (got == exact) | (np.isnan(got) & np.isnan(exact))
    return np.where(special, np.where(same, 0.0, np.inf), err)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="needs an 80-bit long double")
@pytest.mark.parametrize("lanes", [8, 4, 16])  # fp32 lanes: 4, 2 and 8 float64 lanes
@pytest.mark.parametrize("name", F64_BOUND)
@pytest.mark.parametrize("native", [False, True], ids=["portable", "native"])
def test_float64(rng, name, lanes, native):
    # Random bit patterns (every exponent, both signs, NaNs), log-uniform magnitudes, the
    # range where exp overflows and underflows, the edges; against long double numpy. Native:
    # with this machine's instructions (AVX-512's VSCALEFPD, MINPD, MAXPD).
    n = 1 << 16
    x = np.concatenate(
        [
            rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64),
            rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-320, 308, n),
            rng.uniform(-750, 750, n),
            F64_EDGES,
            -F64_EDGES,
        ]
    )
    x = np.pad(x, (0, -x.size % 8), constant_values=1.0)
    func = hexir.workload(name, "float64", shape=(x.size,))
    sch = hexir.Schedule(func, seed=0)
    sch.vectorize(sch.get_loops(sch.get_block(name))[0])
    features = Target("cpu").features if native else ()
    printed = SimpleNamespace(vector_width=lanes, features=features)
    source = generate_c(sch.func, printed)  # type: ignore[arg-type]
    assert f"hx_{name}_f64x{lanes // 2}(" in source and "omp simd" not in source
    out = np.full_like(x, np.nan)
    CpuKernel(sch.func, source, compile_c(source, Target("cpu")), Target("cpu"))(x, out)
    with np.errstate(all="ignore"):
        ref = {
            "exp": np.exp,
            "log": np.log,
            "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
            "sqrt": np.sqrt,
            "rsqrt": lambda v: 1 / np.sqrt(v),
        }[name](x.astype(np.longdouble))
    err = ulp_error64(out, ref)
    worst = int(np.argmax(err))
    assert err[worst] <= F64_BOUND[name], (name, x[worst], out[worst], ref[worst], err[worst])


def test_float64_keeps_libm_for_the_rest():
    i = Var("i")
    A, B = Buffer("A", (40,), "float64"), Buffer("B", (40,), "float64")
    for call in ("erf", "tanh"):
        body = BufferStore(B, (i,), Call(call, (A[i],)))
        func = PrimFunc(call, (A, B), For(i, 40, "vectorized", body))
        assert "#pragma omp simd" in generate_c(func)


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which(knobs.get().cc) is None,
    reason="x86-64 only",
)
def test_avx512_assembly():
    # This machine may lack AVX-512: the 16-lane source is compiled for it, not run. Its
    # numerics are those of the same source run above on GCC's 256-bit lowering.
    for name in (*FUNCS, "power"):
        source = kernel(name, 64, 16).source
        asm = subprocess.run(
            [knobs.get().cc, "-O3", "-march=skylake-avx512", "-mprefer-vector-width=512",
             "-fno-math-errno", "-std=gnu11", "-fopenmp", "-S", "-o", "-", "-x", "c", "-"],
            input=source, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "zmm" in asm, name
        sqrt = re.search(r"vsqrtps\t[^\n]*%zmm", asm) is not None  # one per 16 lanes
        assert sqrt == (name in ("sqrt", "rsqrt")), name
