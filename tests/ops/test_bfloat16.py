"""bfloat16: the dtype in both text forms and ONNX, casts and arithmetic computed in float and
rounded as ml_dtypes rounds (the numpy reference), and matmuls of bfloat16 operands into
float32, on AVX512_BF16's vdpbf16ps where the CPU has it (`sch.tensorize`)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hexir
from hexir.graph.evaluate import evaluate
from hexir.ir.dtype import numpy_dtype
from hexir.ops.parse import parse_graph
from hexir.runtime.target import Target
from hexir.schedule import Schedule
from hexir.search.sketch_dot import AMX_MIN_ROWS

BF16 = ml_dtypes.bfloat16


def _special_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random floats with the cases rounding must get right: NaN, infinities, zeros of both
    signs, denormals, the largest floats (which round to infinity) and exact ties."""
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-5, 6, n)).astype(np.float32)
    ties = (np.arange(8, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # halfway
    special = np.array(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3.4e38, -3.4e38, 1.0 + 2**-8],
        np.float32,
    )
    return np.concatenate([special, ties, x]).astype(np.float32)


def test_bfloat16_round_trips_through_both_text_forms_and_onnx(tmp_path, rng):
    b = hexir.GraphBuilder("g")
    x = b.input("x", (4, 32))
    w = b.constant(rng.standard_normal((32, 16)).astype(BF16))
    y = b.matmul(b.op("cast", x, dtype="bfloat16"), w)
    graph = b.build(b.op("cast", b.op("exp", b.op("cast", y, dtype="bf16")), dtype="float32"))
    assert "xbf16>" in str(graph)
    assert parse_graph(str(graph), dict(graph.constants)) == graph
    one = hexir.GraphBuilder("one")
    half = one.constant(np.full((), 0.5, BF16))
    one_graph = one.build(one.op("mul", one.input("x", (8, 16), "bfloat16"), half))
    func = hexir.lower(one_graph)
    assert "xbf16>" in str(func) and hexir.parse(str(func)) == func
    literal = str(func).replace("* %in1[]", "* 0.5bf16")  # a bfloat16 literal in the text
    assert "0.5bf16" in str(hexir.parse(literal))
    path = tmp_path / "bf16.onnx"
    hexir.export_onnx(graph, path)
    back = hexir.load_model(str(path))
    inputs = [rng.standard_normal((4, 32)).astype(np.float32)]
    np.testing.assert_array_equal(evaluate(back, inputs)[0], evaluate(graph, inputs)[0])


def test_casts_to_and_from_bfloat16_round_as_ml_dtypes(rng):
    x = _special_floats(rng, 3990).reshape(-1, 8)
    b = hexir.GraphBuilder("g")
    v = b.input("x", x.shape)
    to = b.op("cast", v, dtype="bfloat16")
    back = b.op("cast", to, dtype="float32")
    graph = b.build([to, back])
    want_bits = x.astype(BF16)
    got = hexir.compile(graph).run([x])
    for g in (got, evaluate(graph, [x])):
        assert g[0].dtype == BF16
        same = (g[0].view(np.uint16) == want_bits.view(np.uint16)) | np.isnan(want_bits)
        assert same.all() and np.isnan(g[0].astype(np.float32)[np.isnan(x)]).all()
        np.testing.assert_array_equal(g[1], want_bits.astype(np.float32))


@pytest.mark.parametrize("op", ["add", "mul", "div", "maximum"])
def test_bfloat16_arithmetic_rounds_after_every_op_as_numpy_does(op, rng):
    a = rng.standard_normal((16, 40)).astype(BF16)
    c = (rng.standard_normal((16, 40)) + 3).astype(BF16)
    b = hexir.GraphBuilder("g")
    x, y = b.input("a", a.shape, "bfloat16"), b.input("c", c.shape, "bfloat16")
    # two ops in one kernel: the intermediate is rounded to bfloat16 too
    graph = b.build(b.op("exp", b.op(op, x, y)))
    got = hexir.compile(graph).run([a, c])[0]
    want = evaluate(graph, [a, c])[0]
    assert got.dtype == want.dtype == BF16
    # float32's exp and numpy's may differ in the last float32 bit: at most one bfloat16 step
    steps = np.abs(got.view(np.int16).astype(np.int32) - want.view(np.int16).astype(np.int32))
    assert steps.max() <= 1 and (steps == 0).mean() > 0.99


@pytest.mark.parametrize("shape", [(128, 96, 64), (7, 64, 48), (1, 768, 96)])
def test_a_bfloat16_matmul_computes_in_float32_on_amx_or_vdpbf16ps_where_the_cpu_has_it(shape, rng):
    m, k, n = shape
    a = rng.standard_normal((m, k)).astype(BF16)
    w = rng.standard_normal((k, n)).astype(BF16)
    b = hexir.GraphBuilder("g")
    graph = b.build(b.op("relu", b.matmul(b.input("a", a.shape, "bfloat16"), b.constant(w))))
    module = hexir.compile(graph)
    got = module.run([a])[0]
    want = np.maximum(a.astype(np.float64) @ w.astype(np.float64), 0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if Target("cpu").bf16_dot and k % 2 == 0 and n % 16 == 0:
        sources = [open(str(k.path).replace(".so", ".c")).read() for k in module.kernels]
        # AMX's tile multiply where the CPU has it and the rows fill a tile's worth, else
        # AVX512_BF16's dot products (hexir/search/sketch_dot.py)
        tiles = Target("cpu").amx_bf16 and m >= AMX_MIN_ROWS and k % 32 == 0
        assert any(("hx_amx_bf16(" if tiles else "_mm512_dpbf16_ps") in s for s in sources)
        assert "weight_kgroup = 2" in str(module.graph)


def test_tensorize_refuses_a_bfloat16_nest_for_the_int8_intrinsic_and_keeps_the_schedule():
    from hexir.errors import ScheduleError
    from hexir.ops.builder import GraphBuilder
    from hexir.search.sketch_dot import dot_tile

    b = GraphBuilder("g")
    x, w = b.input("x", (12, 64), "bfloat16"), b.input("w", (2, 32, 16, 2), "bfloat16")
    func = hexir.lower(b.build(b.op("matmul", x, w, weight_block=16, weight_kgroup=2)))
    sch = Schedule(func, target=Target("cpu -features=avx2,avx512f,fma -cores=2"))
    assert dot_tile(sch, sch.get_block("matmul"), sch.target)
    assert "x86_bf16_dot_f32" in str(sch.trace)
    fresh = Schedule(func, seed=0)
    i, j, k = fresh.get_loops(fresh.get_block("matmul"))
    _, lane = fresh.split(j, [None, 16])
    k0, _ = fresh.split(k, [None, 2])
    fresh.reorder(k0, lane)  # (lane, pair) innermost: the bfloat16 intrinsic's nest
    fresh.decompose_reduction(fresh.get_block("matmul"), k0)
    before = fresh.func
    with pytest.raises(ScheduleError, match="does not compute x86_vnni_dot_u8s8"):
        fresh.tensorize(lane, "x86_vnni_dot_u8s8")
    assert fresh.func == before
    fresh.tensorize(lane, "x86_bf16_dot_f32")
    assert fresh.func != before


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bfloat16_kernels_compile_for_cuda_with_nvrtc(arch):
    # NVRTC has no stdint: bfloat16 is `unsigned short` there, converted as on the CPU.
    from hexir.runtime.default_schedule import default_schedule

    target = f"cuda -arch={arch}"
    e, m = hexir.GraphBuilder("e"), hexir.GraphBuilder("m")
    x, y = e.input("x", (64, 128), "bfloat16"), m.input("x", (64, 128), "bfloat16")
    for graph in (
        e.build(e.op("exp", e.op("mul", x, x))),
        m.build(m.matmul(y, m.input("w", (128, 32), "bfloat16"))),
    ):
        kernel = hexir.build(default_schedule(hexir.lower(graph), target).func, target)
        assert "unsigned short" in kernel.source and "hx_bf16_f32" in kernel.source


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_float_kernels_run_on_the_cpu_and_compile_for_cuda(dtype, rng):
    # float16 as bfloat16: stored narrow, computed in float and rounded after each op (numpy's
    # float16 arithmetic), compiled with NVRTC for CUDA (PTX's cvt for float16).
    from hexir.runtime.default_schedule import default_schedule

    b = hexir.GraphBuilder("g")
    x = b.input("x", (16, 40), dtype)
    graph = b.build(b.op("sub", b.op("mul", x, x), x))
    a = (rng.standard_normal((16, 40)) * 4).astype(numpy_dtype(dtype))
    got, want = hexir.compile(graph).run([a])[0], evaluate(graph, [a])[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    func = hexir.lower(graph)
    kernel = hexir.build(default_schedule(func, "cuda -arch=sm_90").func, "cuda -arch=sm_90")
    assert "unsigned short" in kernel.source
