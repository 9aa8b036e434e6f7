"""scatter_elements and scatter_nd: a copy of data with updates written at indices known only at
run time (a KV cache's update at the decode position), against a plain loop over the updates
on fresh random inputs, compiled for the CPU, imported from ONNX and exported back."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import hexir
from hexir.errors import HexirError, ModelError, TypeInferenceError
from hexir.frontend.onnx_export import to_onnx
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate
from hexir.ops.builder import GraphBuilder

COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _put(out: np.ndarray, at: tuple[int, ...], value, reduction: str) -> None:
    out[at] = value if reduction == "none" else COMBINE[reduction](out[at], value)


def scatter_elements_loop(x, indices, updates, axis, reduction="none", clip=False):
    """ONNX's definition, one update at a time (the last write wins); `clip`: an index out of
    range clamped into it, as a kernel does."""
    axis %= x.ndim
    out, n = x.copy(), x.shape[axis]
    for j in np.ndindex(indices.shape):
        i = int(indices[j]) + (n if indices[j] < 0 else 0)
        at = j[:axis] + (min(max(i, 0), n - 1) if clip else i,) + j[axis + 1 :]
        _put(out, at, updates[j], reduction)
    return out


def scatter_nd_loop(x, indices, updates, reduction="none", clip=False):
    out, depth = x.copy(), indices.shape[-1]
    for t in np.ndindex(indices.shape[:-1]):
        at = []
        for j, n in zip(indices[t], x.shape[:depth], strict=True):
            i = int(j) + (n if j < 0 else 0)
            at.append(min(max(i, 0), n - 1) if clip else i)
        _put(out, tuple(at), updates[t], reduction)
    return out


def _graph(kind, shapes, dtype="float32", index_dtype="int64", **attrs):
    b = GraphBuilder(kind)
    x, i, u = (b.input(n, s, d) for n, s, d in zip(
        "xiu", shapes, (dtype, index_dtype, dtype), strict=True))  # fmt: skip
    return b.build(b.op(kind, x, i, u, **attrs))


def _check(graph, inputs, want, exact=True):
    module = hexir.compile(graph, target="cpu")
    copies = [a.copy() for a in inputs]
    for got in (evaluate(graph, inputs)[0], module.run(inputs)[0]):
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(inputs, copies, strict=True):  # the operands are left as they were
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "x_shape,i_shape,axis,index_dtype",
    [((9, 4), (5, 4), 0, "int64"), ((3, 7, 5), (2, 4, 5), 1, "int32"),
     ((4, 6), (3, 2), -1, "int64")],
)  # fmt: skip
def test_scatter_elements_matches_a_loop_compiled_for_the_cpu(
    rng, x_shape, i_shape, axis, index_dtype
):
    graph = _graph("scatter_elements", [x_shape, i_shape, i_shape], index_dtype=index_dtype,
                   axis=axis)  # fmt: skip
    n = x_shape[axis]
    for _ in range(2):  # fresh indices each time, negative ones and duplicates included
        x = rng.standard_normal(x_shape).astype(np.float32)
        i = rng.integers(-n, n, i_shape).astype(index_dtype)
        u = rng.standard_normal(i_shape).astype(np.float32)
        _check(graph, [x, i, u], scatter_elements_loop(x, i, u, axis))


@pytest.mark.parametrize(
    "x_shape,i_shape",
    [((8, 5), (3, 1)), ((2, 10, 6), (2, 1, 2)), ((4, 5, 3), (6, 3)), ((6, 4), (2,))],
)
def test_scatter_nd_matches_a_loop_compiled_for_the_cpu(rng, x_shape, i_shape):
    depth = i_shape[-1]
    u_shape = i_shape[:-1] + x_shape[depth:]
    graph = _graph("scatter_nd", [x_shape, i_shape, u_shape])
    for _ in range(2):
        x = rng.standard_normal(x_shape).astype(np.float32)
        columns = [rng.integers(-n, n, i_shape[:-1]) for n in x_shape[:depth]]
        i = np.stack(columns, axis=-1).astype(np.int64)
        u = rng.standard_normal(u_shape).astype(np.float32)
        _check(graph, [x, i, u], scatter_nd_loop(x, i, u))


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_reductions_combine_every_update_with_data(rng, reduction):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    i = np.array([[1, -1, 0, 2], [1, 5, 0, 2], [-5, 3, 0, 3]], np.int64)  # duplicates
    u = rng.standard_normal((3, 4)).astype(np.float32)
    graph = _graph("scatter_elements", [(6, 4), (3, 4), (3, 4)], axis=0, reduction=reduction)
    _check(graph, [x, i, u], scatter_elements_loop(x, i, u, 0, reduction), exact=False)
    rows = np.array([[2], [-4], [0], [5]], np.int64)
    graph = _graph("scatter_nd", [(6, 4), (4, 1), (4, 4)], reduction=reduction)
    u = rng.standard_normal((4, 4)).astype(np.float32)
    _check(graph, [x, rows, u], scatter_nd_loop(x, rows, u, reduction), exact=False)


def test_ints_scatter_too(rng):
    x = rng.integers(-50, 50, (5, 3)).astype(np.int32)
    i = np.array([[4, 0, -1], [0, 0, 2]], np.int64)
    u = rng.integers(-50, 50, (2, 3)).astype(np.int32)
    for reduction in ("none", "max", "add"):
        graph = _graph("scatter_elements", [(5, 3), (2, 3), (2, 3)], "int32", axis=0,
                       reduction=reduction)  # fmt: skip
        _check(graph, [x, i, u], scatter_elements_loop(x, i, u, 0, reduction))


def test_an_index_out_of_range_is_refused_by_numpy_and_clamped_by_the_kernel(rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    u = rng.standard_normal((2, 3)).astype(np.float32)
    i = np.array([[0, 7, 1], [-6, 2, 4]], np.int64)
    graph = _graph("scatter_elements", [(5, 3), (2, 3), (2, 3)], axis=0)
    with pytest.raises(HexirError, match="scatter_elements: index 7 out of range for axis 0 of 5"):
        evaluate(graph, [x, i, u])
    got = hexir.compile(graph, target="cpu").run([x, i, u])[0]  # never written outside out
    np.testing.assert_array_equal(got, scatter_elements_loop(x, i, u, 0, clip=True))
    rows = np.array([[1, 2], [-5, 9]], np.int64)
    graph = _graph("scatter_nd", [(5, 3), (2, 2), (2,)])
    with pytest.raises(HexirError, match="scatter_nd: index 9 out of range for axis 1 of 3"):
        evaluate(graph, [x, rows, u[0, :2]])
    got = hexir.compile(graph, target="cpu").run([x, rows, u[0, :2]])[0]
    np.testing.assert_array_equal(got, scatter_nd_loop(x, rows, u[0, :2], clip=True))


def test_bad_operands_are_refused():
    b = GraphBuilder("bad")
    x, f = b.input("x", (4, 3)), b.input("f", (2, 3))
    i = b.input("i", (2, 3), "int64")
    with pytest.raises(TypeInferenceError, match="indices must be int32 or int64"):
        b.scatter_elements(x, f, f)
    with pytest.raises(TypeInferenceError, match="attribute 'reduction' must be"):
        b.scatter_elements(x, i, f, reduction="mean")
    with pytest.raises(
        TypeInferenceError, match=r"updates of shape \(2, 3\) must have shape \(2,\)"
    ):
        b.scatter_nd(x, b.input("rows", (2, 2), "int64"), f)
    with pytest.raises(TypeInferenceError, match="last extent must be 1..2"):
        b.scatter_nd(x, b.input("deep", (2, 3), "int64"), f)


def _kv_update_model(reduction: str | None = None) -> onnx.ModelProto:
    """A decoder's cache update: past [batch, heads, seq, dim], the new step's keys written at
    [b, h, pos] (ScatterND, indices and the position computed at run time)."""
    extra = {} if reduction is None else {"reduction": reduction}
    node = helper.make_node("ScatterND", ["past", "where", "new"], ["present"], **extra)
    graph = helper.make_graph(
        [node],
        "kv",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, 8, 4]),
         helper.make_tensor_value_info("where", TensorProto.INT64, [1, 2, 1, 3]),
         helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 2, 1, 4])],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_onnx_kv_cache_update_imports_runs_and_exports(rng):
    proto = _kv_update_model()
    graph = import_onnx(proto)
    assert [op.kind for op in graph.ops] == ["scatter_nd"]
    module = hexir.compile(graph, target="cpu")
    for pos in (3, -1):  # the decode position, counted from the end too
        past = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
        new = rng.standard_normal((1, 2, 1, 4)).astype(np.float32)
        where = np.array([[[[0, 0, pos]], [[0, 1, pos]]]], np.int64)
        (want,) = ReferenceEvaluator(proto).run(None, {"past": past, "where": where, "new": new})
        np.testing.assert_array_equal(evaluate(graph, [past, where, new])[0], want)
        np.testing.assert_array_equal(module.run([past, where, new])[0], want)
    back = to_onnx(graph)
    onnx.checker.check_model(back)
    (again,) = ReferenceEvaluator(back).run(None, {"past": past, "where": where, "new": new})
    np.testing.assert_array_equal(again, want)


def test_an_unknown_onnx_reduction_is_refused_with_a_model_error():
    with pytest.raises(ModelError, match="attribute reduction='mean' is not supported"):
        import_onnx(_kv_update_model("mean"))


def test_max_and_min_have_no_onnx_export_at_opset_17():
    graph = import_onnx(_kv_update_model("max"))
    with pytest.raises(HexirError, match="scatter_nd with reduction 'max' has no ONNX form"):
        to_onnx(graph)


def test_scatter_builds_for_cuda_with_nvrtc(tmp_path):
    """No GPU needed: both stages compile (the last update per row, then the copy)."""
    graph = import_onnx(_kv_update_model())
    with hexir.knobs.scope(cache_dir=str(tmp_path)):
        module = hexir.compile(graph, target="cuda -arch=sm_90")
    assert all("__global__" in k.source for k in module.kernels)


@pytest.mark.parametrize("reduction", ["none", "max"])
def test_the_gpu_search_space_of_scatter_nd_computes_the_last_update_under_the_copys_blocks(
    reduction, rng, tmp_path
):
    """The last update of each row is a reduction with reuse, but the copy that reads it has
    more elements than it: the GPU sketch computes it under the copy's blockIdx loop (one grid
    for the kernel), not as a tiled contraction of its own. Sampled schedules verify, compile
    with NVRTC and compute the loop's answer with serial semantics on the CPU."""
    import random

    from hexir.codegen.cuda import generate_cuda
    from hexir.codegen.gpu_verify import verify_gpu
    from hexir.runtime.nvrtc import compile_cuda
    from hexir.runtime.target import Target
    from hexir.search.space import SearchSpace

    x_shape, i_shape, u_shape = (12, 10, 3), (3, 2), (3, 3)
    func = hexir.workload("scatter_nd", shapes=[x_shape, i_shape, u_shape], reduction=reduction)
    target = Target("cuda -arch=sm_90")
    schedules = SearchSpace().sample_schedules(func, target, random.Random(0), 6)
    assert len(schedules) == 6
    x = rng.standard_normal(x_shape).astype(np.float32)
    i = np.stack([rng.integers(-n, n, 3) for n in x_shape[:2]], axis=-1).astype(np.int64)
    u = rng.standard_normal(u_shape).astype(np.float32)
    (want,) = hexir.reference(func, [x, i, u])
    with hexir.knobs.scope(cache_dir=str(tmp_path)):
        for sch in schedules[:3]:
            verify_gpu(sch.func, target)
            cuda = generate_cuda(sch.func, target)
            compile_cuda(cuda.source, target, cuda.name)
            out = np.full(x_shape, np.nan, np.float32)
            hexir.build(sch.func, "cpu")(x, i, u, out)
            np.testing.assert_array_equal(out, want)
