"""The sub-byte ints (int4, uint4, int2, uint2), one per byte as ml_dtypes holds them: they
convert as ml_dtypes does (an int wraps to the low bits, a float goes toward zero and is 0
out of range, NaN and infinities too), from every byte ml_dtypes reads as one (upper bits
ignored), evaluated and compiled; they move (reshape, transpose, concat, slice) but refuse
arithmetic by name; the text forms and a saved model's constants round-trip; CUDA C compiles;
ONNX's QuantizeLinear into int4 saturates; export at opset 17 refuses them by name."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from test_byte_floats import cast_graph, text_forms_round_trip_and_cuda_compiles

import hexir
from hexir.errors import HexirError, TypeInferenceError
from hexir.frontend.load import load_model, save_model
from hexir.graph.evaluate import evaluate
from hexir.ir.dtype import SUB_BYTE_INTS, int_range, numpy_dtype

SUB = list(SUB_BYTE_INTS)
SOURCES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "uint64"]


def values(src: str, rng) -> np.ndarray:
    """Every small value, the ends of the ranges and past them, random ones, and (floats)
    fractions, halves, NaN and infinities."""
    small = np.arange(-20, 21)
    if src.startswith("float"):
        extra = [-8.5, -7.9, 7.9, 8.0, -0.5, 0.5, 2.5, 3.999, 6e4, -6e4, np.nan, np.inf, -np.inf]
        random = rng.standard_normal(500) * 10
        return np.concatenate([small, extra, random]).astype(np.dtype(src))
    info = np.iinfo(np.dtype(src))
    kept = small[(small >= info.min) & (small <= info.max)].astype(np.dtype(src))
    ends = np.array([info.min, info.max], np.dtype(src))
    random = rng.integers(info.min, info.max, 500, dtype=np.dtype(src), endpoint=True)
    return np.concatenate([kept, ends, random])


@pytest.mark.parametrize("dst", SUB)
@pytest.mark.parametrize("src", SOURCES)
def test_conversions_into_them_are_ml_dtypes(rng, src, dst):
    x = values(src, rng)
    graph = cast_graph(src, dst, x.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = x.astype(numpy_dtype(dst)).astype(np.int8)
    for got in (evaluate(graph, [x])[0], hexir.compile(graph).run([x])[0]):
        assert got.dtype == numpy_dtype(dst)
        bad = np.nonzero(got.astype(np.int8) != want)[0]
        assert bad.size == 0, [(x[i], want[i], got[i]) for i in bad[:5]]


@pytest.mark.parametrize("src", SUB)
def test_every_byte_converts_out_by_its_low_bits(src):
    codes = np.arange(256, dtype=np.uint8).view(numpy_dtype(src))  # upper bits set or not
    for dst in ("float32", "int32", "uint8", "int4", "uint2"):
        graph = cast_graph(src, dst, 256)
        want = codes.astype(numpy_dtype(dst))
        for got in (evaluate(graph, [codes])[0], hexir.compile(graph).run([codes])[0]):
            np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_they_move_and_refuse_arithmetic(rng):
    low, high = int_range("int4")
    a = rng.integers(low, high, (3, 4), endpoint=True).astype(ml_dtypes.int4)
    c = rng.integers(low, high, (3, 2), endpoint=True).astype(ml_dtypes.int4)
    b = hexir.GraphBuilder("moves")
    x, y = b.input("x", (3, 4), "int4"), b.input("y", (3, 2), "int4")
    moved = b.concat([b.transpose(b.reshape(x, (4, 3)), (1, 0)), y], axis=1)
    graph = b.build([b.slice(moved, (0, 1), (3, 6)), b.cast(moved, "int32")])
    want = np.concatenate([a.reshape(4, 3).T, c], axis=1)
    for got in (evaluate(graph, [a, c]), hexir.compile(graph).run([a, c])):
        np.testing.assert_array_equal(got[0].astype(np.int8), want[:, 1:6].astype(np.int8))
        np.testing.assert_array_equal(got[1], want.astype(np.int32))
    with pytest.raises(TypeInferenceError, match="int4 values only move and convert"):
        b.add(x, x)


@pytest.mark.parametrize("dtype", SUB)
def test_text_forms_constants_and_cuda(tmp_path, rng, dtype):
    text_forms_round_trip_and_cuda_compiles(dtype)
    low, high = int_range(dtype)
    data = rng.integers(low, high, (5, 7), endpoint=True).astype(numpy_dtype(dtype))
    b = hexir.GraphBuilder("consts")
    x = b.input("x", (5, 7), dtype)
    saved = b.build(b.cast(b.concat([x, b.constant(data)], axis=0), "int32"))
    save_model(saved, tmp_path / "m.hexir")
    loaded = load_model(tmp_path / "m.hexir")
    assert loaded == saved
    (got,) = hexir.compile(loaded).run([data])
    np.testing.assert_array_equal(got, np.concatenate([data, data]).astype(np.int32))


def test_onnx_quantize_linear_into_int4_saturates_and_export_refuses(rng):
    from onnx import TensorProto, helper, numpy_helper

    from hexir.frontend.onnx_export import export_onnx
    from hexir.frontend.onnx_import import import_onnx

    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(1, ml_dtypes.int4), "zero")
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["y"])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT4, [64])]
    model = helper.make_model(
        helper.make_graph([node], "m", inputs, outputs, [scale, zero]),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    graph = import_onnx(model)
    x = (rng.standard_normal(64) * 4).astype(np.float32)
    want = np.clip(np.rint(x / np.float32(0.5)) + 1, -8, 7).astype(np.int8)
    for got in (evaluate(graph, [x])[0], hexir.compile(graph).run([x])[0]):
        np.testing.assert_array_equal(got.astype(np.int8), want)
    with pytest.raises(HexirError, match="int4 has no ONNX type at opset 17"):
        export_onnx(graph)
