"""gather: x's slices along an axis at indices known only at run time (an embedding lookup,
the first op of every language model), against numpy on fresh random inputs, compiled for the
CPU, imported from ONNX (token ids as a graph input) and exported back; gather_elements and
gather_nd (slices at index tuples) likewise."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import hexir
from hexir.errors import HexirError, TypeInferenceError
from hexir.frontend.onnx_export import to_onnx
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate
from hexir.ops.builder import GraphBuilder


def _embedding(rng, table_shape, ids_shape, axis, dtype="int64"):
    b = GraphBuilder("embed")
    ids = b.input("ids", ids_shape, dtype)
    table = rng.standard_normal(table_shape).astype(np.float32)
    out = b.relu(b.gather(b.constant(table, "table"), ids, axis=axis))  # gather: its own kernel
    return b.build(out), table


@pytest.mark.parametrize(
    "table_shape,ids_shape,axis,dtype",
    [
        ((50, 16), (2, 7), 0, "int64"),
        ((6, 30, 5), (4,), 1, "int32"),
        ((8, 3), (3, 2, 2), 0, "int64"),
    ],
)
def test_gather_matches_numpy_compiled_for_the_cpu(rng, table_shape, ids_shape, axis, dtype):
    graph, table = _embedding(rng, table_shape, ids_shape, axis, dtype)
    module, n = hexir.compile(graph, target="cpu"), table_shape[axis]
    for _ in range(2):  # fresh ids each time, negative ones (counted from the end) included
        ids = rng.integers(-n, n, ids_shape).astype(dtype)
        want = np.maximum(np.take(table, ids, axis=axis), 0)
        np.testing.assert_array_equal(evaluate(graph, [ids])[0], want)
        np.testing.assert_array_equal(module.run([ids])[0], want)


def test_an_index_out_of_range_is_refused_by_numpy_and_never_read_outside_by_the_kernel(rng):
    graph, table = _embedding(rng, (10, 4), (3,), 0)
    ids = np.array([0, 10, -11], np.int64)
    with pytest.raises(HexirError, match="index 10 out of range for axis 0 of 10"):
        evaluate(graph, [ids])
    out = hexir.compile(graph, target="cpu").run([ids])[0]  # clamped: rows 0, 9, 0
    np.testing.assert_array_equal(out, np.maximum(table[[0, 9, 0]], 0))


def test_gather_refuses_float_indices_and_a_scalar_index():
    b = GraphBuilder("bad")
    x = b.input("x", (4, 3))
    with pytest.raises(TypeInferenceError, match="indices must be int32 or int64"):
        b.gather(x, b.input("f", (2,)), axis=0)
    with pytest.raises(TypeInferenceError, match="at least one axis"):
        b.gather(x, b.input("s", (), "int64"), axis=0)


@pytest.mark.parametrize("ids_shape", [[1, 6], []])  # a batch of token ids, one scalar id
def test_onnx_gather_of_token_ids_imports_runs_and_exports(rng, ids_shape):
    table = rng.standard_normal((20, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["wte", "input_ids"], ["h"], axis=0),
             helper.make_node("Relu", ["h"], ["out"])]  # fmt: skip
    graph_proto = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids_shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(table, "wte")],
    )
    proto = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(proto)
    assert any(op.kind == "gather" for op in graph.ops)
    ids = rng.integers(-20, 20, ids_shape).astype(np.int64)
    (want,) = ReferenceEvaluator(proto).run(None, {"input_ids": ids})
    np.testing.assert_array_equal(hexir.compile(graph, target="cpu").run([ids])[0], want)
    back = to_onnx(graph)
    onnx.checker.check_model(back)
    (again,) = ReferenceEvaluator(back).run(None, {back.graph.input[0].name: ids})
    np.testing.assert_array_equal(again, want)


def test_gather_builds_for_cuda_with_nvrtc(rng, tmp_path):
    """No GPU needed: the kernel compiles (threads over the output, one loaded index each)."""
    graph, _ = _embedding(rng, (100, 64), (1, 16), 0)
    with hexir.knobs.scope(cache_dir=str(tmp_path)):
        module = hexir.compile(graph, target="cuda -arch=sm_90")
    assert all("__global__" in k.source for k in module.kernels)


@pytest.mark.parametrize("axis", [0, 1])
def test_onnx_gather_elements_of_runtime_indices(rng, axis):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    graph_proto = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [3, 5] if axis == 0 else [4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    proto = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(proto)
    module = hexir.compile(graph, target="cpu")
    n = x.shape[axis]
    i = rng.integers(-n, n, (3, 5) if axis == 0 else (4, 2)).astype(np.int64)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x, "i": i})
    np.testing.assert_array_equal(evaluate(graph, [x, i])[0], want)
    np.testing.assert_array_equal(module.run([x, i])[0], want)


def gather_nd_loop(x, indices, batch_dims=0, clip=False):
    """ONNX's GatherND, one index tuple at a time; `clip`: clamped as a kernel does."""
    lead, b = indices.shape[:-1], batch_dims
    out = np.empty(lead + x.shape[b + indices.shape[-1] :], x.dtype)
    for t in np.ndindex(lead):
        at = []
        for j, n in zip(indices[t], x.shape[b:], strict=False):
            i = int(j) + (n if j < 0 else 0)
            at.append(min(max(i, 0), n - 1) if clip else i)
        out[t] = x[t[:b] + tuple(at)]
    return out


@pytest.mark.parametrize(
    "x_shape,i_shape,batch_dims",
    [((7, 5), (3, 1), 0), ((4, 6, 3), (2, 2, 2), 0), ((3, 5, 4, 2), (3, 4, 2), 1),
     ((2, 3, 4), (2, 3, 1), 2)],
)  # fmt: skip
def test_gather_nd_matches_a_loop_compiled_for_the_cpu(rng, x_shape, i_shape, batch_dims):
    b = GraphBuilder("gnd")
    x, i = b.input("x", x_shape), b.input("i", i_shape, "int64")
    graph = b.build(b.gather_nd(x, i, batch_dims=batch_dims))
    module = hexir.compile(graph, target="cpu")
    extents = x_shape[batch_dims : batch_dims + i_shape[-1]]
    for _ in range(2):  # fresh index tuples, negative entries included
        xs = rng.standard_normal(x_shape).astype(np.float32)
        ids = np.stack([rng.integers(-n, n, i_shape[:-1]) for n in extents], -1)
        want = gather_nd_loop(xs, ids, batch_dims)
        np.testing.assert_array_equal(evaluate(graph, [xs, ids])[0], want)
        np.testing.assert_array_equal(module.run([xs, ids])[0], want)


def test_gather_nd_refuses_an_index_out_of_range_and_the_kernel_clamps_it(rng):
    b = GraphBuilder("gnd")
    graph = b.build(b.gather_nd(b.input("x", (4, 3)), b.input("i", (2, 2), "int64")))
    x, ids = rng.standard_normal((4, 3)).astype(np.float32), np.array([[1, 3], [-1, -2]])
    with pytest.raises(HexirError, match="gather_nd: index 3 out of range for axis 1 of 3"):
        evaluate(graph, [x, ids])
    got = hexir.compile(graph, target="cpu").run([x, ids])[0]
    np.testing.assert_array_equal(got, gather_nd_loop(x, ids, clip=True))
    with pytest.raises(TypeInferenceError, match="last extent must be 1..2"):
        b.gather_nd(b.input("y", (4, 3)), b.input("deep", (2, 3), "int64"))


def test_onnx_gather_nd_of_runtime_indices_imports_and_exports(rng):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)
    graph_proto = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 4, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    proto = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(proto)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    i = rng.integers(-5, 5, (2, 4, 1)).astype(np.int64)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x, "i": i})
    np.testing.assert_array_equal(evaluate(graph, [x, i])[0], want)
    np.testing.assert_array_equal(hexir.compile(graph, target="cpu").run([x, i])[0], want)
    back = to_onnx(graph)
    onnx.checker.check_model(back)
    np.testing.assert_array_equal(ReferenceEvaluator(back).run(None, {"x": x, "i": i})[0], want)
