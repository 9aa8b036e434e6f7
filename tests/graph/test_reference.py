"""`hexir.reference`: numpy's answer for a lowered func equals evaluating the graph it lowers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from seeding import current_rng

import hexir
from hexir.errors import HexirError
from hexir.graph.evaluate import evaluate
from hexir.graph.lower import lower, lower_op
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph, Op
from hexir.ops.builder import GraphBuilder


def random_array(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return current_rng().random(shape) < 0.5
    if dtype.startswith("int"):
        return current_rng().integers(1, 20, size=shape).astype(dtype)
    return current_rng().uniform(0.1, 2.0, size=shape).astype(numpy_dtype(dtype))


def one_op_graph(op: Op) -> Graph:
    inputs = tuple({v.name: v for v in op.operands}.values())
    return Graph(op.kind, inputs, (op,), (op.result,))


def _ops() -> list[Op]:
    b = GraphBuilder("ops")
    x, y = b.input("x", (2, 3, 8, 8)), b.input("y", (4, 3, 3, 3))
    m, n = b.input("m", (6, 5)), b.input("n", (5, 7))
    v, i = b.input("v", (5,)), b.input("i", (6, 5), "int32")
    c = b.input("c", (6, 5), "bool")
    b.conv2d(x, y, stride=2, padding=1)
    b.matmul(m, n)
    b.add(m, m)  # one param for both operands
    b.div(i, i)
    b.where(c, m, v)
    b.gelu(m)
    b.gelu(m, approximate="tanh")
    b.softmax(m, axis=0)
    b.layer_norm(m, v, v)
    b.reduce_mean(m, axes=1, keepdims=True)
    b.slice(m, (None, 4), (None, 0), (-1, -2))
    b.avg_pool2d(x, kernel=3, stride=2, padding=1)
    b.cast(m, "int32")
    return b.ops


@pytest.mark.parametrize("op", _ops(), ids=lambda op: op.kind)
def test_reference_of_a_lowered_op_is_its_numpy_semantics(op):
    func = lower_op(op)
    inputs = [random_array(p.shape, p.dtype) for p in func.inputs]
    got = hexir.reference(func, inputs)
    want = evaluate(one_op_graph(op), inputs)
    assert len(got) == func.num_outputs == 1
    np.testing.assert_array_equal(got[0], want[0])
    assert got[0].dtype == numpy_dtype(func.outputs[0].dtype)


def test_reference_of_a_graph_with_constants_takes_them_as_inputs():
    b = GraphBuilder("g")
    x = b.input("x", (4, 6))
    w = b.constant(random_array((6, 3), "float32"), name="w")
    y = b.relu(b.matmul(x, w))
    graph = b.build([y, b.exp(y)])
    func = lower(graph)
    xs = random_array((4, 6), "float32")
    got = hexir.reference(func, [xs, graph.constant("w")])
    for g, w_ in zip(got, evaluate(graph, [xs]), strict=True):
        np.testing.assert_array_equal(g, w_)


def test_reference_needs_a_lowered_func():
    b = GraphBuilder("g")
    x = b.input("x", (3,))
    func = lower(b.build(b.relu(x)))
    with pytest.raises(HexirError, match="produced by lowering"):
        hexir.reference(dataclasses.replace(func, attrs=()), [random_array((3,), "float32")])
    with pytest.raises(HexirError, match="takes 1 inputs"):
        hexir.reference(func, [random_array((3,), "float32")] * 2)
    with pytest.raises(HexirError, match="input %in0"):
        hexir.reference(func, [random_array((4,), "float32")])
