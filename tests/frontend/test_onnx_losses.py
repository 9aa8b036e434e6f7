"""ONNX's losses and small ops imported as compositions (hexir/frontend/onnx_ops_loss.py),
against numpy written here from the ONNX spec, on fresh random inputs, evaluated and compiled:
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss with and without weights and an ignored
class, every reduction; Hardmax; OneHot with negative and out-of-range indices."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hexir
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(op, inputs, outputs, initializers=(), **attrs):
    node = helper.make_node(op, [n for n, _, _ in inputs] + [t.name for t in initializers],
                            [n for n, _, _ in outputs], **attrs)  # fmt: skip
    infos = [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs]
    outs = [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs]
    graph = helper.make_graph([node], "m", infos, outs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def both(graph, inputs):
    return evaluate(graph, inputs), hexir.compile(graph, target="cpu").run(inputs)


def nll_reference(logp, target, weight, ignore, reduction):
    n, c = logp.shape[:2]
    safe = np.where(target == ignore, 0, target) if ignore is not None else target
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = weight[safe] if weight is not None else np.ones_like(picked)
    if ignore is not None:
        w = np.where(target == ignore, 0, w)
    loss = -picked * w
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / w.sum()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted, ignore", [(False, None), (True, None), (True, 2), (False, -1)])
@pytest.mark.parametrize("softmax", [False, True])
def test_losses_match_the_spec(rng, reduction, weighted, ignore, softmax):
    n, c, d = 3, 5, 4
    scores = rng.standard_normal((n, c, d)).astype(np.float32)
    target = rng.integers(0, c, (n, d)).astype(np.int64)
    if ignore is not None:
        target[0, :2] = ignore  # some ignored, the rest not
    weight = rng.random(c).astype(np.float32) + 0.5
    inits = [numpy_helper.from_array(weight, "w")] if weighted else []
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    out_shape = [n, d] if reduction == "none" else []
    op = "SoftmaxCrossEntropyLoss" if softmax else "NegativeLogLikelihoodLoss"
    outputs = [("loss", F32, out_shape)] + ([("log_prob", F32, [n, c, d])] if softmax else [])
    graph = import_onnx(
        model(op, [("x", F32, [n, c, d]), ("t", I64, [n, d])], outputs, inits, **attrs)
    )
    logp = scores
    if softmax:
        shifted = scores - scores.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    want = nll_reference(logp, target, weight if weighted else None, ignore, reduction)
    for got in both(graph, [scores, target]):
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
        if softmax:
            np.testing.assert_allclose(got[1], logp, rtol=1e-5, atol=1e-6)


def test_hardmax_marks_the_first_largest_element(rng):
    x = rng.integers(0, 3, (4, 6)).astype(np.float32)  # ties: the first one wins
    graph = import_onnx(model("Hardmax", [("x", F32, [4, 6])], [("y", F32, [4, 6])], axis=1))
    want = np.zeros_like(x)
    want[np.arange(4), x.argmax(axis=1)] = 1
    for got in both(graph, [x]):
        np.testing.assert_array_equal(got[0], want)


def test_one_hot_wraps_negative_indices_and_drops_the_rest():
    indices = np.array([[0, 3, -1], [-4, 7, 2]], np.int64)  # 7: out of range, all off
    depth, values = (
        numpy_helper.from_array(np.array(4, np.int64), "depth"),
        np.array([2, 9], np.float32),
    )
    inits = [depth, numpy_helper.from_array(values, "values")]
    graph = import_onnx(
        model("OneHot", [("i", I64, [2, 3])], [("y", F32, [2, 4, 3])], inits, axis=1)
    )
    wrapped = np.where(indices < 0, indices + 4, indices)
    want = np.where(np.arange(4)[None, :, None] == wrapped[:, None, :], 9, 2).astype(np.float32)
    for got in both(graph, [indices]):
        np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool_is_the_p_norm_of_each_zero_padded_window(rng, p):
    x = rng.standard_normal((1, 2, 7, 6)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=p)
    graph = import_onnx(
        model("LpPool", [("x", F32, [1, 2, 7, 6])], [("y", F32, [1, 2, 4, 6])], **attrs)
    )
    padded = np.pad(np.abs(x.astype(np.float64)) ** p, ((0, 0), (0, 0), (1, 1), (0, 1)))
    want = np.empty((1, 2, 4, 6))
    for i in range(4):
        for j in range(6):
            want[:, :, i, j] = padded[:, :, 2 * i : 2 * i + 3, j : j + 2].sum(axis=(2, 3))
    for got in both(graph, [x]):
        np.testing.assert_allclose(got[0], want ** (1 / p), rtol=1e-5, atol=1e-6)


def test_space_to_depth_moves_each_block_into_channels(rng):
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    graph = import_onnx(
        model("SpaceToDepth", [("x", F32, [2, 3, 4, 6])], [("y", F32, [2, 12, 2, 3])], blocksize=2)
    )
    want = x.reshape(2, 3, 2, 2, 3, 2).transpose(0, 3, 5, 1, 2, 4).reshape(2, 12, 2, 3)
    for got in both(graph, [x]):
        np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_along_a_constant_axis(rng, exclusive, reverse):
    x = rng.uniform(0.5, 1.5, (3, 5, 2)).astype(np.float32)
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    graph = import_onnx(model("CumProd", [("x", F32, [3, 5, 2])], [("y", F32, [3, 5, 2])], [axis],
                              exclusive=exclusive, reverse=reverse))  # fmt: skip
    flipped = x[:, ::-1] if reverse else x
    if exclusive:
        flipped = np.concatenate([np.ones_like(flipped[:, :1]), flipped[:, :-1]], axis=1)
    want = np.cumprod(flipped.astype(np.float64), axis=1)
    want = want[:, ::-1] if reverse else want
    for got in both(graph, [x]):
        np.testing.assert_allclose(got[0], want, rtol=1e-5)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_of_int64_along_a_constant_axis(rng, exclusive, reverse):
    """An integer CumSum (position ids from an attention mask) sums exactly, wrapping as numpy
    does, where the float form's matmul by a triangle would round."""
    x = rng.integers(-(2**40), 2**40, (3, 5, 2)).astype(np.int64)
    x[0, 0, 0] = np.iinfo(np.int64).max  # the sum wraps
    axis = numpy_helper.from_array(np.array(-2, np.int64), "axis")
    graph = import_onnx(model("CumSum", [("x", I64, [3, 5, 2])], [("y", I64, [3, 5, 2])], [axis],
                              exclusive=exclusive, reverse=reverse))  # fmt: skip
    flipped = x[:, ::-1] if reverse else x
    if exclusive:
        flipped = np.concatenate([np.zeros_like(flipped[:, :1]), flipped[:, :-1]], axis=1)
    want = np.cumsum(flipped, axis=1)
    want = want[:, ::-1] if reverse else want
    for got in both(graph, [x]):
        np.testing.assert_array_equal(got[0], want)


def test_reduce_prod_of_ints_and_floats(rng):
    for elem, dtype in ((F32, np.float32), (TensorProto.INT32, np.int32)):
        x = rng.integers(-3, 4, (2, 3, 4)).astype(dtype)
        axes = numpy_helper.from_array(np.array([0, 2], np.int64), "axes")
        graph = import_onnx(
            model("ReduceProd", [("x", elem, [2, 3, 4])], [("y", elem, [1, 3, 1])], [axes])
        )
        for got in both(graph, [x]):
            np.testing.assert_array_equal(got[0], np.prod(x, axis=(0, 2), keepdims=True))


def test_celu_mean_and_eye_like(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32) * 3
    y = rng.standard_normal((3, 4)).astype(np.float32)
    celu = import_onnx(model("Celu", [("x", F32, [3, 4])], [("y", F32, [3, 4])], alpha=0.7))
    want = np.maximum(0, x) + np.minimum(0, 0.7 * (np.exp(x / 0.7) - 1))
    for got in both(celu, [x]):
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    mean = import_onnx(
        model("Mean", [("x", F32, [3, 4]), ("y", F32, [3, 4])], [("z", F32, [3, 4])])
    )
    for got in both(mean, [x, y]):
        np.testing.assert_allclose(got[0], (x + y) / 2, rtol=1e-6)
    eye = import_onnx(model("EyeLike", [("x", F32, [3, 4])], [("y", I64, [3, 4])], k=1, dtype=I64))
    for got in both(eye, [x]):
        np.testing.assert_array_equal(got[0], np.eye(3, 4, k=1, dtype=np.int64))
