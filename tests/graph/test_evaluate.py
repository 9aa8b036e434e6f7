"""The numpy semantics of every op, each against a straightforward per-element computation."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from seeding import current_rng

import hexir
from hexir.errors import HexirError
from hexir.graph.evaluate import evaluate
from hexir.ir.graph import Graph, TensorType
from hexir.ops import OPS
from hexir.ops.builder import GraphBuilder
from hexir.ops.numeric import erf
from hexir.ops.parse import parse_graph


def rand(*shape: int, dtype: str = "float32", low: float = -2.0, high: float = 2.0) -> np.ndarray:
    if dtype.startswith("int"):
        return current_rng().integers(-50, 50, size=shape).astype(dtype)
    return current_rng().uniform(low, high, size=shape).astype(dtype)


def run(kind: str, arrays: list[np.ndarray], shape: tuple[int, ...], dtype: str, /, **attrs):
    """Evaluate a one-op graph on `arrays`, built by the GraphBuilder; checks its result type."""
    b = GraphBuilder(kind)
    inputs = [b.input(f"a{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)]
    y = b.op(kind, *inputs, **attrs)
    assert y.type == TensorType(shape, dtype)
    (out,) = evaluate(b.build(y), arrays)
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    return out


def per_element(fn, *arrays: np.ndarray) -> np.ndarray:
    """fn over Python floats/ints of the broadcast operands, as a float64 (or object) array."""
    arrays = np.broadcast_arrays(*arrays)
    values = [
        fn(*(a.item() for a in items)) for items in zip(*(x.ravel() for x in arrays), strict=True)
    ]
    return np.array(values).reshape(arrays[0].shape)


def test_every_op_of_the_contract_has_semantics():
    kinds = set()
    with open(Path(__file__).parents[2] / "docs" / "ops.md") as f:
        for line in f:
            if line.startswith("| ") and not line.startswith("| op ") and "---" not in line:
                kinds.update(k.strip() for k in line.split("|")[1].split(","))
    with_semantics = {kind for kind, d in OPS.items() if d.evaluate is not None}
    assert kinds - {"constant"} == with_semantics == set(OPS) - {"constant"}


def test_erf_within_a_few_ulp_of_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), rand(1000) * 1e-3, [0.0, 30.0, -1e300]])
    want = per_element(math.erf, x)
    ulps = np.abs(erf(x) - want) / np.spacing(np.maximum(np.abs(want), 1e-300))
    assert ulps.max() <= 8
    assert np.isnan(erf(np.array([np.nan]))[0])


@pytest.mark.parametrize(
    "kind, fn",
    [
        ("add", lambda a, b: a + b),
        ("sub", lambda a, b: a - b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("maximum", max),
        ("minimum", min),
    ],
)
def test_float_binary_rounds_like_one_float32_operation(kind, fn):
    a, b = rand(3, 1, 4), rand(5, 4)
    want = per_element(fn, a, b).astype(np.float32)  # f64 then round == correctly rounded f32
    np.testing.assert_array_equal(run(kind, [a, b], (3, 5, 4), "float32"), want)


def test_int_div_truncates_toward_zero():
    a, b = rand(6, 7, dtype="int32"), rand(7, dtype="int32")
    b[b == 0] = 3

    def c_div(x, y):
        q = abs(x) // abs(y)
        return q if (x < 0) == (y < 0) else -q

    got = run("div", [a, b], (6, 7), "int32")
    np.testing.assert_array_equal(got, per_element(c_div, a, b))


def test_int_arithmetic_wraps_like_int32():
    a = np.array([2**31 - 1, -(2**31)], np.int32)
    b = np.array([1, -1], np.int32)
    np.testing.assert_array_equal(run("add", [a, b], (2,), "int32"), [-(2**31), 2**31 - 1])


def test_power():
    a, b = rand(4, 5, low=0.1, high=3.0), rand(5)
    got = run("power", [a, b], (4, 5), "float32")
    np.testing.assert_allclose(got, per_element(math.pow, a, b), rtol=1e-6)


@pytest.mark.parametrize(
    "kind, fn",
    [
        ("equal", lambda a, b: a == b),
        ("not_equal", lambda a, b: a != b),
        ("less", lambda a, b: a < b),
        ("less_equal", lambda a, b: a <= b),
        ("greater", lambda a, b: a > b),
        ("greater_equal", lambda a, b: a >= b),
    ],
)
def test_comparisons_give_bool(kind, fn):
    a, b = rand(4, 6, dtype="int32") // 10, rand(6, dtype="int32") // 10  # some equal pairs
    np.testing.assert_array_equal(run(kind, [a, b], (4, 6), "bool"), per_element(fn, a, b))


def test_where():
    cond, a, b = rand(3, 1) > 0, rand(3, 4), rand(4)
    want = per_element(lambda c, x, y: x if c else y, cond, a, b)
    np.testing.assert_array_equal(run("where", [cond, a, b], (3, 4), "float32"), want)


@pytest.mark.parametrize(
    "kind, fn, low",
    [
        ("relu", lambda x: max(x, 0.0), -2.0),
        ("sigmoid", lambda x: 1 / (1 + math.exp(-x)), -8.0),
        ("tanh", math.tanh, -3.0),
        ("exp", math.exp, -5.0),
        ("log", math.log, 0.01),
        ("erf", math.erf, -3.0),
        ("sqrt", math.sqrt, 0.01),
        ("rsqrt", lambda x: 1 / math.sqrt(x), 0.01),
    ],
)
def test_unary(kind, fn, low):
    x = rand(7, 9, low=low, high=5.0)
    got = run(kind, [x], (7, 9), "float32")
    np.testing.assert_allclose(got, per_element(fn, x), rtol=2e-7, atol=1e-30)


def test_relu_on_ints_and_float64():
    x = rand(10, dtype="int64")
    np.testing.assert_array_equal(run("relu", [x], (10,), "int64"), np.where(x > 0, x, 0))
    y = rand(10, dtype="float64")
    assert run("exp", [y], (10,), "float64").dtype == np.float64


def test_gelu_exact_and_tanh():
    x = np.concatenate([rand(200, low=-9.0, high=9.0), [-30.0, 30.0]]).astype(np.float32)
    # erfc rather than 1 + erf: the textbook form cancels to nothing for large negative x.
    exact = per_element(lambda v: 0.5 * v * math.erfc(-v / math.sqrt(2)), x)
    np.testing.assert_allclose(
        run("gelu", [x], x.shape, "float32", approximate="none"), exact, rtol=2e-7, atol=1e-30
    )
    c = math.sqrt(2 / math.pi)
    tanh = per_element(lambda v: 0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v**3))), x)
    # The tanh form itself cancels for large negative x, so only an absolute bound means much.
    np.testing.assert_allclose(
        run("gelu", [x], x.shape, "float32", approximate="tanh"), tanh, rtol=2e-7, atol=1e-12
    )
    half = x[:50].astype(np.float16)
    assert run("gelu", [half], half.shape, "float16", approximate="none").dtype == np.float16


def test_cast_truncates_toward_zero_and_tests_nonzero():
    x = rand(20, low=-100.0, high=100.0)
    np.testing.assert_array_equal(
        run("cast", [x], (20,), "int32", dtype="int32"), per_element(math.trunc, x)
    )
    x[::3] = 0.0
    np.testing.assert_array_equal(run("cast", [x], (20,), "bool", dtype="bool"), x != 0)


# ---------------------------------------------------------------------------------------------
# Contractions and convolution


def loop_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n))
    for i, j in itertools.product(range(m), range(n)):
        out[i, j] = math.fsum(float(a[i, t]) * float(b[t, j]) for t in range(k))
    return out


def test_matmul_dense_batch_matmul():
    a, b = rand(5, 7), rand(7, 3)
    np.testing.assert_allclose(run("matmul", [a, b], (5, 3), "float32"), loop_matmul(a, b), 1e-6)
    w = rand(4, 7)
    np.testing.assert_allclose(run("dense", [a, w], (5, 4), "float32"), loop_matmul(a, w.T), 1e-6)
    x, y = rand(2, 3, 6), rand(2, 6, 4)
    want = np.stack([loop_matmul(x[i], y[i]) for i in range(2)])
    np.testing.assert_allclose(run("batch_matmul", [x, y], (2, 3, 4), "float32"), want, 1e-6)
    ia, ib = rand(3, 4, dtype="int32"), rand(4, 2, dtype="int32")
    np.testing.assert_array_equal(run("matmul", [ia, ib], (3, 2), "int32"), loop_matmul(ia, ib))


def test_bias_add_on_an_axis():
    x, b = rand(2, 3, 4), rand(3)
    want = per_element(lambda v, c: v + c, x, b[:, None]).astype(np.float32)
    np.testing.assert_array_equal(run("bias_add", [x, b], (2, 3, 4), "float32", axis=1), want)


def loop_conv2d(x, w, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (s - 1) - 1) // sw + 1
    out = np.zeros((n, k, oh, ow))
    for b, o, y, z in itertools.product(range(n), range(k), range(oh), range(ow)):
        g = o // (k // groups)
        for ci, i, j in itertools.product(range(cg), range(r), range(s)):
            yy, zz = y * sh - ph + i * dh, z * sw - pw + j * dw
            if 0 <= yy < h and 0 <= zz < wd:
                out[b, o, y, z] += float(x[b, g * cg + ci, yy, zz]) * float(w[o, ci, i, j])
    return out


@pytest.mark.parametrize(
    "shape, k, rs, stride, padding, dilation, groups",
    [
        ((1, 3, 7, 7), 4, (3, 3), (1, 1), (0, 0), (1, 1), 1),
        ((2, 4, 9, 8), 6, (3, 2), (2, 1), (1, 2), (1, 1), 2),
        ((1, 2, 10, 9), 2, (3, 3), (1, 2), (2, 1), (2, 3), 1),
        ((1, 4, 6, 6), 4, (3, 3), (2, 2), (1, 1), (1, 1), 4),
    ],
)
def test_conv2d_against_loops(shape, k, rs, stride, padding, dilation, groups):
    x, w = rand(*shape), rand(k, shape[1] // groups, *rs)
    want = loop_conv2d(x, w, stride, padding, dilation, groups)
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    got = run("conv2d", [x, w], want.shape, "float32", **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv2d_of_a_resnet_layer_against_sums_of_windows():
    x, w = rand(1, 64, 56, 56), rand(64, 64, 3, 3)
    attrs = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    got = run("conv2d", [x, w], (1, 64, 56, 56), "float32", **attrs)
    for o, y, z in [(0, 0, 0), (17, 55, 3), (63, 28, 55)]:
        window = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))[0, :, y : y + 3, z : z + 3]
        want = math.fsum((window.astype(np.float64) * w[o]).ravel())
        assert got[0, o, y, z] == pytest.approx(want, rel=1e-5, abs=1e-4)


# ---------------------------------------------------------------------------------------------
# Normalizations and reductions


def test_batch_norm():
    x, scale, shift, mean = rand(2, 3, 4, 5), rand(3), rand(3), rand(3)
    var = rand(3, low=0.5, high=2.0)
    got = run("batch_norm", [x, scale, shift, mean, var], x.shape, "float32", axis=1, epsilon=1e-3)
    for c in range(3):
        want = (x[:, c] - mean[c]) / math.sqrt(var[c] + 1e-3) * scale[c] + shift[c]
        np.testing.assert_allclose(got[:, c], want, rtol=1e-5, atol=1e-6)


def test_softmax_is_stable():
    x = rand(4, 6) + np.float32(1000.0)
    got = run("softmax", [x], x.shape, "float32", axis=1)
    for row, out in zip(x, got, strict=True):
        exps = [math.exp(v - max(row)) for v in row]
        np.testing.assert_allclose(out, [e / math.fsum(exps) for e in exps], rtol=1e-6)
    got0 = run("softmax", [x], x.shape, "float32", axis=0)
    np.testing.assert_allclose(got0.sum(axis=0), 1.0, rtol=1e-6)


def test_layer_norm_over_trailing_axes():
    x, gamma, beta = rand(3, 4, 5), rand(4, 5), rand(4, 5)
    got = run("layer_norm", [x, gamma, beta], x.shape, "float32", axis=1, epsilon=1e-5)
    for i in range(3):
        values = [float(v) for v in x[i].ravel()]
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / len(values)
        want = (x[i] - mean) / math.sqrt(var + 1e-5) * gamma + beta
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)


def loop_reduce(x: np.ndarray, axes: tuple[int, ...], keepdims: bool, fn) -> np.ndarray:
    keep = [d for d in range(x.ndim) if d not in axes]
    out_shape = tuple(1 if d in axes else x.shape[d] for d in range(x.ndim))
    out = np.zeros(out_shape, dtype=object)
    for index in itertools.product(*(range(x.shape[d]) for d in keep)):
        picked = dict(zip(keep, index, strict=True))
        group = [
            x[tuple(picked.get(d, r[axes.index(d)] if d in axes else 0) for d in range(x.ndim))]
            for r in itertools.product(*(range(x.shape[a]) for a in axes))
        ]
        out[tuple(picked.get(d, 0) for d in range(x.ndim))] = fn([g.item() for g in group])
    return out if keepdims else out.reshape(tuple(x.shape[d] for d in keep))


@pytest.mark.parametrize("axes, keepdims", [((1,), False), ((0, 2), True), ((0, 1, 2), False)])
def test_reductions(axes, keepdims):
    x = rand(3, 4, 5)
    shape = loop_reduce(x, axes, keepdims, len).shape
    for kind, fn in [
        ("reduce_sum", math.fsum),
        ("reduce_mean", lambda g: math.fsum(g) / len(g)),
        ("reduce_max", max),
    ]:
        got = run(kind, [x], shape, "float32", axes=axes, keepdims=keepdims)
        want = loop_reduce(x, axes, keepdims, fn).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_integer_mean_truncates_toward_zero():
    x = rand(4, 7, dtype="int32")
    got = run("reduce_mean", [x], (4,), "int32", axes=(1,), keepdims=False)
    want = [math.trunc(sum(int(v) for v in row) / 7) for row in x]
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# Data movement and pools


def test_transpose_reshape_concat():
    x = rand(2, 3, 4)
    got = run("transpose", [x], (4, 2, 3), "float32", perm=(2, 0, 1))
    for i, j, k in itertools.product(range(2), range(3), range(4)):
        assert got[k, i, j] == x[i, j, k]
    np.testing.assert_array_equal(
        run("reshape", [x], (6, 4), "float32", shape=(6, 4)).ravel(), x.ravel()
    )
    y = rand(2, 5, 4)
    got = run("concat", [x, y], (2, 8, 4), "float32", axis=1)
    np.testing.assert_array_equal(got[:, :3], x)
    np.testing.assert_array_equal(got[:, 3:], y)


@pytest.mark.parametrize(
    "slices",
    [
        (slice(1, 4), slice(None, None, 2)),
        (slice(None, None, -1), slice(5, 0, -2)),
        (slice(-2, None, -3), slice(-100, 100)),
        (slice(3, 1), slice(None, -1, -1)),
    ],
)
def test_slice_like_python(slices):
    x = rand(6, 7)
    b = GraphBuilder("slice")
    xv = b.input("x", x.shape)
    attrs = [(s.start, s.stop, s.step) for s in slices]
    y = b.slice(xv, *(tuple(a[i] for a in attrs) for i in range(3)))
    (got,) = evaluate(b.build(y), [x])
    assert got.tolist() == [row[slices[1]] for row in x.tolist()[slices[0]]]
    # The contract itself: element i at start + i * step, with the normalized attributes.
    op = b.ops[-1]
    triples = zip(op.attr("start"), op.attr("stop"), op.attr("step"), strict=True)
    rows, cols = (range(a, z, s) for a, z, s in triples)
    assert got.tolist() == [[x.tolist()[r][c] for c in cols] for r in rows]


def test_pad():
    x = rand(2, 3, dtype="int32")
    got = run("pad", [x], (5, 4), "int32", before=(1, 0), after=(2, 1), value=7.0)
    for i, j in itertools.product(range(5), range(4)):
        inside = 1 <= i < 3 and j < 3
        assert got[i, j] == (x[i - 1, j] if inside else 7)


def loop_pool(x, kernel, stride, padding, fn):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((n, c, oh, ow))
    for b, ch, y, z in itertools.product(range(n), range(c), range(oh), range(ow)):
        window = [
            float(x[b, ch, y * sh - ph + i, z * sw - pw + j])
            for i, j in itertools.product(range(kh), range(kw))
            if 0 <= y * sh - ph + i < h and 0 <= z * sw - pw + j < w
        ]
        out[b, ch, y, z] = fn(window)
    return out


@pytest.mark.parametrize(
    "kernel, stride, padding",
    [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 0))],
)
def test_pools_ignore_padding(kernel, stride, padding):
    x = rand(2, 3, 7, 6) - np.float32(3.0)  # all negative: a padded 0 would win a max
    attrs = dict(kernel=kernel, stride=stride, padding=padding)
    want = loop_pool(x, kernel, stride, padding, max)
    np.testing.assert_array_equal(run("max_pool2d", [x], want.shape, "float32", **attrs), want)
    want = loop_pool(x, kernel, stride, padding, lambda g: math.fsum(g) / len(g))
    got = run("avg_pool2d", [x], want.shape, "float32", **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_global_avg_pool2d():
    x = rand(2, 3, 4, 5)
    got = run("global_avg_pool2d", [x], (2, 3, 1, 1), "float32")
    want = [[[[math.fsum(x[n, c].ravel().tolist()) / 20]] for c in range(3)] for n in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Graphs


MLP = """
hexir.graph @mlp(%x: tensor<8x16xf32>) -> (tensor<8x4xf32>, tensor<8x32xf32>) {
  %w0 = hexir.constant @w0 : tensor<32x16xf32>
  %b0 = hexir.constant @b0 : tensor<32xf32>
  %w1 = hexir.constant @w1 : tensor<32x4xf32>
  %0 = hexir.dense %x, %w0 : tensor<8x32xf32>
  %1 = hexir.bias_add %0, %b0 {axis = 1} : tensor<8x32xf32>
  %2 = hexir.gelu %1 {approximate = "none"} : tensor<8x32xf32>
  %3 = hexir.matmul %2, %w1 : tensor<8x4xf32>
  hexir.return %3, %1
}
"""


def mlp_graph(w0: np.ndarray, b0: np.ndarray, w1: np.ndarray) -> Graph:
    return parse_graph(MLP, {"w0": w0, "b0": b0, "w1": w1})


def test_mlp_graph():
    w0, b0, w1, x = rand(32, 16), rand(32), rand(32, 4), rand(8, 16)
    graph = mlp_graph(w0, b0, w1)
    y, h1 = evaluate(graph, {"x": x})
    want_h1 = x.astype(np.float64) @ w0.T + b0
    gelu = want_h1 * 0.5 * (1 + np.vectorize(math.erf)(want_h1 / math.sqrt(2)))
    np.testing.assert_allclose(h1, want_h1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, gelu @ w1, rtol=1e-5, atol=1e-5)
    assert y.flags.writeable


@pytest.mark.parametrize(
    "inputs, message",
    [
        ([], "takes 1 inputs"),
        ({"y": np.zeros((8, 16), np.float32)}, "missing %x"),
        ([np.ones((8, 15), np.float32)], "input %x"),
        ([np.ones((8, 16), np.float64)], "input %x"),
    ],
)
def test_inputs_are_checked(inputs, message):
    graph = mlp_graph(rand(32, 16), rand(32), rand(32, 4))
    with pytest.raises(HexirError, match=message):
        evaluate(graph, inputs)


def test_reference_evaluates_a_whole_graph_by_position_or_by_name(rng):
    """`hexir.reference` takes a Graph too (it took lowered PrimFuncs only)."""
    from hexir.frontend import zoo

    graph = zoo.mlp(batch=4, sizes=(16, 8, 3))
    (x,) = [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]
    want = evaluate(graph, [x])
    for got in (hexir.reference(graph, [x]), hexir.reference(graph, {graph.inputs[0].name: x})):
        np.testing.assert_array_equal(got[0], want[0])
    with pytest.raises(HexirError, match="missing: x; unknown: y"):
        hexir.reference(graph, {"y": x})
