"""ONNX import of the quantization ops and of the integer types they use: each model computes
what onnx's reference evaluator computes on fresh random inputs, bit for bit (the outputs are
integers, or floats the same rounding made), evaluated and compiled for the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from seeding import current_rng
from test_onnx_import import model
from test_onnx_import_ops import compiled_agrees, uniform

import hexir
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate

U8, I8, I32, F = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32, TensorProto.FLOAT


def ints(dtype, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return current_rng().integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
@pytest.mark.parametrize("axis", [None, 1, 0])
def test_quantize_then_dequantize_per_tensor_and_per_axis(dtype, axis):
    shape = (4, 6)
    n = 1 if axis is None else shape[axis]
    scale = current_rng().uniform(0.01, 0.1, n).astype(np.float32)
    zero = ints(dtype, n) // 4
    if axis is None:
        scale, zero = scale.reshape(()), zero.reshape(())
    attrs = {} if axis is None else {"axis": axis}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
    ]
    proto = model(nodes, [("x", list(shape))], ["q", "y"], [("s", scale), ("z", zero)], opset=19)
    x = uniform(*shape) * 8  # some beyond the range: clipped
    x.flat[:3] = 0.5 * scale.flat[0], 1.5 * scale.flat[0], -2.5 * scale.flat[0]  # ties: to even
    compiled_agrees(proto, [x], rtol=0, atol=0)


def test_blocked_quantization_of_a_weight():
    scale = current_rng().uniform(0.01, 0.1, (4, 3)).astype(np.float32)  # blocks of 2 columns
    zero = ints(np.int8, 4, 3) // 8
    attrs = {"axis": 1, "block_size": 2}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
    ]
    proto = model(nodes, [("x", [4, 6])], ["q", "y"], [("s", scale), ("z", zero)], opset=21)
    compiled_agrees(proto, [uniform(4, 6)], rtol=0, atol=0)


def test_dynamic_quantize_linear():
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero"])
    proto = model([node], [("x", [5, 7])], ["y", "scale", "zero"])
    compiled_agrees(proto, [uniform(5, 7) + 0.7], rtol=0, atol=0)


@pytest.mark.parametrize("a_dtype, a_elem", [(np.uint8, U8), (np.int8, I8)])
def test_matmul_integer(a_dtype, a_elem):
    a, b = ints(a_dtype, 6, 40), ints(np.int8, 40, 5)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    inits = [("az", ints(a_dtype, 1)[0]), ("bz", ints(np.int8, 1)[0])]
    proto = model([node], [("a", [6, 40], a_elem), ("b", [40, 5], I8)], ["y"], inits)
    graph = compiled_agrees(proto, [a, b], rtol=0, atol=0)
    assert graph.outputs[0].type.dtype == "int32"


@pytest.mark.parametrize("constant_b", [False, True])
def test_matmul_integer_with_per_row_and_per_column_zero_points(constant_b):
    """A's zero point per row of A, B's per column of B (ONNX's spec; the reference evaluator
    broadcasts A's along the wrong axis, so numpy is the reference here). With B constant, the
    uint8 x int8 product runs as one VNNI kernel (on AVX-512), the zero points applied after."""
    a, b = ints(np.uint8, 6, 64), ints(np.int8, 64, 32)
    a_zero, b_zero = ints(np.uint8, 6), ints(np.int8, 32)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    inputs = [("a", [6, 64], U8)] + ([] if constant_b else [("b", [64, 32], I8)])
    inits = [("az", a_zero), ("bz", b_zero)] + ([("b", b)] if constant_b else [])
    graph = import_onnx(model([node], inputs, ["y"], inits))
    want = (a.astype(np.int32) - a_zero[:, None]) @ (b.astype(np.int32) - b_zero)
    feeds = [a] if constant_b else [a, b]
    for got in (evaluate(graph, feeds)[0], hexir.compile(graph).run(feeds)[0]):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_qlinear_matmul_of_a_3d_activation():
    a, b = ints(np.uint8, 2, 5, 32), ints(np.uint8, 32, 6)
    inits = [("as", np.float32(0.02)), ("az", np.uint8(120)), ("b", b), ("bs", np.float32(0.01)),
             ("bz", np.uint8(128)), ("ys", np.float32(0.3)), ("yz", np.uint8(100))]  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    proto = model([node], [("a", [2, 5, 32], U8)], ["y"], inits)
    compiled_agrees(proto, [a], rtol=0, atol=0)


def test_conv_integer_and_qlinear_conv_with_per_channel_weights():
    x, w = ints(np.uint8, 1, 3, 9, 9), ints(np.int8, 4, 3, 3, 3)
    conv = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], **conv)
    proto = model([node], [("x", [1, 3, 9, 9], U8)], ["y"], [("w", w), ("xz", np.uint8(7))])
    compiled_agrees(proto, [x], rtol=0, atol=0)
    inits = [("xs", np.float32(0.05)), ("xz", np.uint8(7)), ("w", w),
             ("ws", current_rng().uniform(0.01, 0.05, 4).astype(np.float32)),
             ("wz", np.zeros(4, np.int8)), ("ys", np.float32(0.2)), ("yz", np.int8(-3)),
             ("bias", ints(np.int32, 4) // 2**20)]  # fmt: skip
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"]
    node = helper.make_node("QLinearConv", names, ["y"], **conv)
    proto = model([node], [("x", [1, 3, 9, 9], U8)], ["y"], inits)
    compiled_agrees(proto, [x], rtol=0, atol=0)


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign", "Sin", "Cos"])
def test_rounding_and_trigonometric_unaries(op):
    x = uniform(3, 17) * 3
    x.flat[:4] = 0.5, 1.5, -2.5, 0.0
    proto = model([helper.make_node(op, ["x"], ["y"])], [("x", [3, 17])], ["y"])
    compiled_agrees(proto, [x], rtol=1e-6, atol=1e-6)


def test_abs_of_unsigned_ints_is_the_identity():
    x = ints(np.uint8, 4, 9)
    proto = model([helper.make_node("Abs", ["x"], ["y"])], [("x", [4, 9], U8)], ["y"])
    compiled_agrees(proto, [x], rtol=0, atol=0)


def qdq_linear(rows: int, k: int, n: int, activation_elem: int, per_column: bool):
    """A QDQ model's linear layer (what ONNX Runtime's quantizer writes): x quantized and
    dequantized, times a dequantized int8 weight, plus a bias, relu."""
    rng = current_rng()
    x_scale, x_zero = (
        np.float32(0.02),
        np.array(3 if activation_elem == U8 else -5).astype(
            np.uint8 if activation_elem == U8 else np.int8
        ),
    )
    w = ints(np.int8, k, n)
    w_scale = rng.uniform(0.001, 0.01, n if per_column else ()).astype(np.float32)
    axis = {"axis": 1} if per_column else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], **axis),
        helper.make_node("MatMul", ["xd", "wd"], ["mm"]),
        helper.make_node("Add", ["mm", "bias"], ["biased"]),
        helper.make_node("Relu", ["biased"], ["y"]),
    ]
    inits = [("xs", x_scale), ("xz", x_zero), ("w", w), ("ws", w_scale),
             ("wz", np.zeros(w_scale.shape, np.int8)),
             ("bias", rng.uniform(-0.5, 0.5, n).astype(np.float32))]  # fmt: skip
    return model(nodes, [("x", [rows, k])], ["y"], inits, opset=19)


@pytest.mark.parametrize("activation_elem", [U8, I8])
@pytest.mark.parametrize("per_column", [False, True])
def test_a_qdq_linear_layer_multiplies_integers(activation_elem, per_column):
    """The MatMul of two dequantized 8-bit tensors is their integer product scaled once (one
    uint8 x int8 kernel; an int8 activation shifted by 128 first), within float rounding of
    the reference's float32 product of the dequantized values."""
    proto = qdq_linear(7, 64, 48, activation_elem, per_column)
    graph = compiled_agrees(proto, [uniform(7, 64)], rtol=1e-5, atol=1e-5)
    matmuls = [op for op in graph.ops if op.kind == "matmul"]
    assert len(matmuls) == 1 and matmuls[0].result.type.dtype == "int32"
    assert {v.type.dtype for v in matmuls[0].operands} == {"uint8", "int8"}
