"""Bitwise ops on every integer dtype (ONNX's BitwiseAnd/Or/Xor/Not and BitShift): numpy's
answers in the reference and compiled (vector body and scalar tail), shifts by a negative
amount or the width or more included (0, or -1 for a negative integer shifted right: numpy's
answer, where C's is undefined)."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.graph.evaluate import evaluate

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
OPS = {
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
}


def shifted(fn, a, b):
    width = 8 * a.dtype.itemsize
    ok = (b >= 0) & (b < width)
    outside = np.zeros_like(a)  # in a's dtype: uint64 beside int64 would go float
    if fn is np.right_shift and a.dtype.kind == "i":
        outside[a < 0] = -1
    return np.where(ok, fn(a, np.where(ok, b, 0).astype(b.dtype)), outside)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("kind", OPS)
def test_bitwise_ops_match_numpy(rng, kind, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 37), dtype=dtype, endpoint=True)
    if kind.endswith("shift"):
        width = 8 * np.dtype(dtype).itemsize
        b = rng.integers(max(info.min, -3), width + 3, 37, endpoint=True).astype(dtype)
        want = shifted(OPS[kind], a, b)
    else:
        b = rng.integers(info.min, info.max, 37, dtype=dtype, endpoint=True)
        want = OPS[kind](a, b)
    gb = hexir.GraphBuilder("t")
    graph = gb.build(gb.op(kind, gb.input("a", (3, 37), dtype), gb.input("b", (37,), dtype)))
    for got in (evaluate(graph, [a, b])[0], hexir.compile(graph).run([a, b])[0]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_onnx_bitwise_not_is_xor_with_all_ones(rng):
    from onnx import TensorProto, helper

    from hexir.frontend.onnx_import import import_onnx

    node = helper.make_node("BitwiseNot", ["x"], ["y"])
    info = [helper.make_tensor_value_info(n, TensorProto.UINT16, [5]) for n in "xy"]
    graph = import_onnx(helper.make_model(helper.make_graph([node], "m", info[:1], info[1:])))
    x = rng.integers(0, 65535, 5, dtype=np.uint16, endpoint=True)
    np.testing.assert_array_equal(hexir.compile(graph).run([x])[0], np.bitwise_not(x))
