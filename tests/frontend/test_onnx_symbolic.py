"""Symbolic dimensions through ONNX: exported as dim_params, imported back as the same
symbols (`import_onnx(..., symbolic=True)`), and run by ONNX Runtime and by Hexir at several
sizes with the same answers."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import hexir
from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx
from hexir.ir.symbolic import Sym

SEQ, PAST = Sym.named("seq"), Sym.named("past")


def _graph(rng):
    b = hexir.GraphBuilder("block")
    x = b.input("x", (1, "seq", 32))
    past = b.input("past", (1, "past", 16))
    w = b.constant(rng.standard_normal((32, 16)).astype(np.float32))
    y = b.softmax(b.relu(b.matmul(b.reshape(x, (-1, 32)), w)))
    return b.build(b.concat([past, b.reshape(y, (1, -1, 16))], axis=1))


def _dims(info):
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def test_export_writes_dim_params_that_onnxruntime_runs_at_any_size():
    rng = np.random.default_rng()
    graph = _graph(rng)
    model = hexir.export_onnx(graph)
    assert [_dims(i) for i in model.graph.input] == [[1, "seq", 32], [1, "past", 16]]
    assert [_dims(o) for o in model.graph.output] == [[1, "past + seq", 16]]
    session = onnxruntime.InferenceSession(model.SerializeToString())
    module = hexir.compile(graph)
    for seq, past in [(1, 1), (13, 4), (64, 30)]:
        x = rng.standard_normal((1, seq, 32)).astype(np.float32)
        p = rng.standard_normal((1, past, 16)).astype(np.float32)
        (want,) = session.run(None, {"x": x, "past": p})
        (got,) = module.run([x, p])
        assert got.shape == want.shape == (1, seq + past, 16)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_import_with_symbolic_keeps_the_symbols_the_export_wrote():
    rng = np.random.default_rng()
    graph = _graph(rng)
    back = import_onnx(hexir.export_onnx(graph), symbolic=True)
    assert [v.type.shape for v in back.inputs] == [(1, SEQ, 32), (1, PAST, 16)]
    assert back.outputs[0].type.shape == (1, PAST + SEQ, 16)
    x = rng.standard_normal((1, 6, 32)).astype(np.float32)
    p = rng.standard_normal((1, 2, 16)).astype(np.float32)
    np.testing.assert_allclose(
        hexir.compile(back).run([x, p])[0], hexir.reference(graph, [x, p])[0], rtol=1e-5, atol=1e-6
    )


def _model(dims_x, dims_out):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims_x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims_out)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unnamed_and_expression_dim_params_become_symbols():
    graph = import_onnx(_model([None, "past + 1", "batch size"], None), symbolic=True)
    assert graph.inputs[0].type.shape == (
        Sym.named("x_0"), PAST + 1, Sym.named("batch_size"),
    )  # fmt: skip
    x = np.random.default_rng().standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_array_equal(hexir.compile(graph).run([x])[0], np.maximum(x, 0))


def test_symbols_bound_by_dims_are_sizes_and_the_rest_stay_symbols():
    graph = import_onnx(
        _model(["batch", "seq"], ["batch", "seq"]), dims={"batch": 2}, symbolic=True
    )
    assert graph.inputs[0].type.shape == (2, SEQ)


def test_without_symbolic_a_free_dim_param_is_still_refused():
    with pytest.raises(ModelError, match="symbolic dims 'seq' not bound"):
        import_onnx(_model([1, "seq"], [1, "seq"]))


def test_a_declared_output_that_disagrees_with_the_symbols_is_refused():
    with pytest.raises(ModelError, match=r"output 'y' is declared"):
        import_onnx(_model(["seq"], ["other"]), symbolic=True)
