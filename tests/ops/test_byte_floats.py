"""The 8-bit floats (float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz) and the 4-bit
float4_e2m1fn (a byte each, as ml_dtypes holds them): stored as their bits, computed in float32
and rounded after every op as ml_dtypes does. Every code
decodes exactly; floats encode to ml_dtypes' code (ties to even, overflow to infinity or
NaN, NaN and signed zeros) over every code, every midpoint and its neighbours, and random
floats of every magnitude; arithmetic rounds after each op; the text forms round-trip; CUDA C
compiles; ONNX's saturating Cast clamps to the largest finite value."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import hexir
from hexir.codegen.cuda import generate_cuda
from hexir.graph.evaluate import evaluate
from hexir.graph.lower import lower_op
from hexir.ir.dtype import numpy_dtype, short_name
from hexir.ir.tir_parse import parse_func
from hexir.ir.tir_text import print_func
from hexir.schedule.handwritten import gpu_schedule

FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"]


def cast_graph(src: str, dst: str, n: int) -> hexir.Graph:
    b = hexir.GraphBuilder("t")
    return b.build(b.op("cast", b.input("x", (n,), src), dtype=dst))


def probes(dtype: str, rng) -> np.ndarray:
    codes = np.arange(256, dtype=np.uint8).view(numpy_dtype(dtype)).astype(np.float32)
    finite = np.unique(codes[np.isfinite(codes)])
    mids = (finite[:-1] + finite[1:]) / 2  # the ties
    top = finite.max() * np.array([1.03, 1.0624, 1.0625, 1.07, 2.0, 1e6], np.float32)
    random = rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 7, 4000)
    specials = [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-38, 1e-45]
    return np.concatenate([
        codes, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), top, -top,
        random, specials,
    ]).astype(np.float32)  # fmt: skip


@pytest.mark.parametrize("dtype", FLOAT8)
def test_every_code_decodes_exactly(dtype):
    codes = np.arange(256, dtype=np.uint8).view(numpy_dtype(dtype))
    graph = cast_graph(dtype, "float32", 256)
    want = codes.astype(np.float32)
    for got in (evaluate(graph, [codes])[0], hexir.compile(graph).run([codes])[0]):
        np.testing.assert_array_equal(got, want)  # NaN equals NaN here


@pytest.mark.parametrize("dtype", FLOAT8)
def test_floats_encode_to_ml_dtypes_codes(rng, dtype):
    x = probes(dtype, rng)
    graph = cast_graph("float32", dtype, x.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = x.astype(numpy_dtype(dtype)).view(np.uint8)
    for got in (evaluate(graph, [x])[0], hexir.compile(graph).run([x])[0]):
        bad = np.nonzero(got.view(np.uint8) != want)[0]
        assert bad.size == 0, [(x[i], hex(want[i]), hex(got.view(np.uint8)[i])) for i in bad[:5]]


@pytest.mark.parametrize("dtype", FLOAT8)
def test_arithmetic_rounds_after_every_op(rng, dtype):
    np8 = numpy_dtype(dtype)
    a = (rng.standard_normal(37) * 4).astype(np8)
    b = (rng.standard_normal(37) * 4).astype(np8)
    gb = hexir.GraphBuilder("t")
    x, y = gb.input("x", (37,), dtype), gb.input("y", (37,), dtype)
    graph = gb.build(gb.mul(gb.add(x, y), y))
    want = ((a + b) * b).view(np.uint8)  # ml_dtypes: each op in float32, rounded
    for got in (evaluate(graph, [a, b])[0], hexir.compile(graph).run([a, b])[0]):
        np.testing.assert_array_equal(got.view(np.uint8), want)


@pytest.mark.parametrize("dtype", FLOAT8)
def test_text_forms_round_trip_and_cuda_compiles(dtype):
    text_forms_round_trip_and_cuda_compiles(dtype)


def text_forms_round_trip_and_cuda_compiles(dtype: str) -> None:
    """A cast from float32 into `dtype`: its hextir prints the dtype's short name and parses
    back; its CUDA C converts with the dtype's helper, and NVRTC compiles it."""
    graph = cast_graph("float32", dtype, 64)
    func = lower_op(graph.ops[-1])
    text = print_func(func)
    assert f"x{short_name(dtype)}>" in text and parse_func(text) == func
    source = generate_cuda(gpu_schedule(func).func, "cuda -arch=sm_90").source
    assert f"hx_f32_{short_name(dtype)}(" in source
    hexir.build(gpu_schedule(func).func, "cuda -arch=sm_90")  # NVRTC compiles it


@pytest.mark.parametrize("saturate", [1, 0])
def test_onnx_cast_saturates_by_default(saturate):
    from onnx import TensorProto, helper

    from hexir.frontend.onnx_import import import_onnx

    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN, saturate=saturate)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [6])]
    model = helper.make_model(helper.make_graph([node], "m", inputs, outputs))
    graph = import_onnx(model)
    x = np.array([1000.0, -1000.0, np.inf, -np.inf, np.nan, 3.3], np.float32)
    top = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    got = hexir.compile(graph).run([x])[0].astype(np.float32)
    if saturate:
        np.testing.assert_array_equal(got, [top, -top, top, -top, np.nan, 3.25])
    else:  # e4m3fn has no infinity: an overflow is NaN
        assert np.isnan(got[:5]).all() and got[5] == 3.25


def test_onnx_export_refuses_an_8bit_float_by_name():
    from hexir.errors import HexirError
    from hexir.frontend.onnx_export import export_onnx

    with pytest.raises(HexirError, match="float8_e5m2 has no ONNX type at opset 17"):
        export_onnx(cast_graph("float32", "float8_e5m2", 4))


def test_onnx_quantize_linear_into_an_8bit_float_saturates(rng):
    from onnx import TensorProto, helper, numpy_helper

    from hexir.frontend.onnx_import import import_onnx

    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    node = helper.make_node(
        "QuantizeLinear", ["x", "scale"], ["y"], output_dtype=TensorProto.FLOAT8E5M2
    )
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT8E5M2, [64])]
    graph = import_onnx(helper.make_model(helper.make_graph([node], "m", inputs, outputs, [scale])))
    x = (rng.standard_normal(64) * 10.0 ** rng.integers(-3, 6, 64)).astype(np.float32)
    top = float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)
    want = np.clip(x / np.float32(0.5), -top, top).astype(ml_dtypes.float8_e5m2)
    for got in (evaluate(graph, [x])[0], hexir.compile(graph).run([x])[0]):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
