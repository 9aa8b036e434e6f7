"""GraphBuilder: names, constants, placement, and one method per op of docs/ops.md."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from hexir.errors import TypeInferenceError
from hexir.ir.graph import ConstantData, Graph, TensorType, Value
from hexir.ops import OPS
from hexir.ops.builder import GraphBuilder


def test_a_method_per_op_with_placement_and_name() -> None:
    for name in OPS:
        method = getattr(GraphBuilder, name)
        params = inspect.signature(method).parameters
        if name != "constant":
            assert params["placement"].kind == params["name"].kind == inspect.Parameter.KEYWORD_ONLY


def test_mlp() -> None:
    b = GraphBuilder("mlp")
    x = b.input("x", (64, 784))
    w = b.constant(np.ones((784, 256), np.float32), name="w0")
    y = b.relu(b.matmul(x, w))
    s = b.reduce_sum(y, axes=1)
    graph = b.build(s)
    assert isinstance(graph, Graph) and graph.outputs == (s,)
    assert [op.result.name for op in graph.ops] == ["w0", "0", "1", "2"]
    assert s == Value("2", TensorType((64,)))
    assert graph.constants == (("w0", ConstantData(np.ones((784, 256), np.float32))),)
    assert graph.ops[1].operands == (x, w)


def test_names() -> None:
    b = GraphBuilder("g")
    x = b.input("x", (2, 3))
    assert b.relu(x, name="1").name == "1"
    assert b.relu(x).name == "0"
    assert b.relu(x).name == "2"  # %1 is taken
    with pytest.raises(TypeInferenceError, match="the name %x is already defined"):
        b.relu(x, name="x")
    with pytest.raises(TypeInferenceError, match="already defined"):
        b.input("x", (1,))
    with pytest.raises(TypeInferenceError, match="inner dimensions differ"):
        b.matmul(x, x)
    assert b.exp(x).name == "3"  # a failed op uses no name
    assert b.constant(1.0).name == "c0" and b.constant(2.0, name="c1").name == "c1"
    assert b.constant(3.0).name == "c2"
    with pytest.raises(TypeInferenceError, match="constant @c1 is already defined"):
        b.constant(2.0, name="c1")
    with pytest.raises(TypeInferenceError, match="bad graph input"):
        b.input("y z", (1,))


def test_values_must_belong_to_the_graph() -> None:
    other = GraphBuilder("other").input("x", (2,))
    b = GraphBuilder("g")
    b.input("x", (3,))
    with pytest.raises(TypeInferenceError, match="%x is not a value of this graph"):
        b.relu(other)
    with pytest.raises(TypeInferenceError, match="is not in the graph"):
        b.build([other])


def test_placement() -> None:
    b = GraphBuilder("g", placement="cuda:0")
    x = b.input("x", (2,))
    b.relu(x)
    b.relu(x, placement="cpu")
    b.constant([1.0, 2.0], placement="cuda:1")
    assert [op.placement for op in b.ops] == ["cuda:0", "cpu", "cuda:1"]
    with pytest.raises(TypeInferenceError, match="bad placement"):
        b.relu(x, placement="tpu 0")


def test_constant_dtypes() -> None:
    b = GraphBuilder("g")
    assert b.constant([1.0, 2.0]).type == TensorType((2,), "float32")
    assert b.constant(np.array([1.0])).type == TensorType((1,), "float64")
    assert b.constant([1, 2]).type == TensorType((2,), "int64")
    assert b.constant(True).type == TensorType((), "bool")
    assert b.constant([1, 2], dtype="f16").type == TensorType((2,), "float16")
    assert b.constant(np.float64(2.0)).type.dtype == "float64"
    big_endian = np.arange(3, dtype=">i4")
    assert b.constant(big_endian, name="be").type.dtype == "int32"
    assert dict(b.constants)["be"] == ConstantData(np.arange(3, dtype=np.int32))
    assert b.constant(np.zeros(2, np.uint8)).type.dtype == "uint8"
    with pytest.raises(ValueError, match="unknown dtype"):
        b.constant(np.zeros(2, np.complex64))


def test_constant_leaves_the_callers_array_writable() -> None:
    array = np.zeros(3, np.float32)
    b = GraphBuilder("g")
    b.constant(array, name="c")
    assert array.flags.writeable
    array[0] = 1.0  # and the constant is the builder's own copy: writing leaves it as it was
    assert dict(b.constants)["c"] == ConstantData(np.zeros(3, np.float32))
    assert not dict(b.constants)["c"].array.flags.writeable


def test_generic_op_and_python_style_slice() -> None:
    b = GraphBuilder("g")
    x = b.input("x", (4, 6))
    y = b.op("softmax", x, axis=0, name="sm", placement="cuda:0")
    assert y.name == "sm" and b.ops[-1].attrs == (("axis", 0),)
    z = b.slice(x, (-1, 1), (None, -1), (-2, 2))
    assert z.type.shape == np.zeros((4, 6))[::-2, 1:-1:2].shape
    assert dict(b.ops[-1].attrs) == {"start": (3, 1), "stop": (-1, 5), "step": (-2, 2)}
    assert b.slice(x, (1,), (3,)).type.shape == (2, 6)
    assert b.concat([x, x, x], axis=-1).type.shape == (4, 18)
    assert b.pad(x, 1, (0, 2)).type.shape == (5, 9)
    assert b.conv2d(b.input("im", (1, 6, 5, 5)), b.input("w", (2, 3, 3, 3)), groups=2).type == (
        TensorType((1, 2, 3, 3))
    )
