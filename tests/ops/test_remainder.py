"""mod and fmod (ONNX's Mod with fmod 0 and 1): the divisor's sign (numpy's %) and the
dividend's (C's %, fmod), on every integer dtype and on the floats, broadcast, in the reference
and compiled (vector body and scalar tail), with zero divisors giving 0 for integers (C would
trap) and NaN for floats, as numpy does."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hexir
from hexir.graph.evaluate import evaluate

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def remainder_graph(kind: str, dtype: str) -> hexir.Graph:
    b = hexir.GraphBuilder("t")
    x, y = b.input("x", (3, 37), dtype), b.input("y", (37,), dtype)
    return b.build(b.op(kind, x, y))


def operands(rng, dtype):
    if np.dtype(dtype).kind == "f":
        x = (rng.standard_normal((3, 37)) * 20).astype(dtype)
        y = (rng.standard_normal(37) * 3).astype(dtype)
        y[0], x[0, 1] = 0, 0  # NaN, and a zero dividend
        return x, y
    info = np.iinfo(dtype)
    low = max(info.min, -1000)
    x = rng.integers(low, min(info.max, 1000), (3, 37), endpoint=True).astype(dtype)
    y = rng.integers(max(info.min, -9), 10, 37, endpoint=True).astype(dtype)
    y[:3] = 0, 1, 7 if info.min == 0 else -7
    return x, y


@pytest.mark.parametrize("dtype", [*INTS, "float32", "float64", "float16"])
@pytest.mark.parametrize("kind, fn", [("mod", np.mod), ("fmod", np.fmod)])
def test_remainders_match_numpy(rng, kind, fn, dtype):
    graph = remainder_graph(kind, dtype)
    x, y = operands(rng, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = fn(x, y)
    if want.dtype.kind in "iu":
        want = np.where(y == 0, 0, want).astype(dtype)
    for got in (evaluate(graph, [x, y])[0], hexir.compile(graph).run([x, y])[0]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_onnx_mod_imports_and_exports_both_signs(rng):
    import onnx
    from onnx import TensorProto, helper

    from hexir.frontend.onnx_export import export_onnx
    from hexir.frontend.onnx_import import import_onnx

    for fmod, dtype, elem in ((0, "int32", TensorProto.INT32), (1, "float32", TensorProto.FLOAT)):
        node = helper.make_node("Mod", ["x", "y"], ["z"], fmod=fmod)
        inputs = [
            helper.make_tensor_value_info(n, elem, s) for n, s in (("x", [3, 37]), ("y", [37]))
        ]
        out = helper.make_tensor_value_info("z", elem, [3, 37])
        model = helper.make_model(helper.make_graph([node], "m", inputs, [out]))
        graph = import_onnx(model)
        x, y = operands(rng, dtype)
        y = np.where(y == 0, 3, y).astype(dtype)
        want = (np.fmod if fmod else np.mod)(x, y)
        np.testing.assert_array_equal(hexir.compile(graph).run([x, y])[0], want)
        again = import_onnx(onnx.load_from_string(export_onnx(graph).SerializeToString()))
        np.testing.assert_array_equal(evaluate(again, [x, y])[0], want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_a_float_floor_remainder_follows_numpy_at_zeros_infinities_and_nans(rng, dtype):
    """ONNX Mod 28 (fmod 0 of floats): a zero result has the divisor's sign, an infinite
    dividend or a zero divisor gives NaN, an infinite divisor gives the dividend where the
    signs agree and the divisor where not: numpy's mod, C's fmod moved to the divisor's sign.
    Beside them random operands, so that the vector body sees them too."""
    special = [
        (0.0, -2.0), (-0.0, 2.0), (0.0, 2.0), (-0.0, -2.0), (-6.0, 3.0), (6.0, -3.0),
        (-3.0, np.inf), (3.0, np.inf), (-1.0, -np.inf), (1.0, -np.inf), (np.inf, 2.0),
        (-np.inf, 2.0), (1.0, 0.0), (1.0, -0.0), (np.nan, 2.0), (1.0, np.nan),
    ]  # fmt: skip
    x, y = operands(rng, dtype)
    y[0] = 3
    x[0, : len(special)], y[: len(special)] = zip(*special, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = np.mod(x, y)
        graph = remainder_graph("mod", dtype)
        for got in (evaluate(graph, [x, y])[0], hexir.compile(graph).run([x, y])[0]):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
