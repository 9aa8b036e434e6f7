"""ONNX export: every op of docs/ops.md exports to a checked model that computes what Hexir
computes (onnx's reference evaluator says so) and imports back to the same outputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx_cases import CASES, POSITIVE, UNEXPORTED, random_inputs

from hexir.errors import HexirError
from hexir.frontend.onnx_export import OPSET, export_onnx
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate
from hexir.ops import OPS


def test_the_cases_cover_every_op():
    kinds = {op.kind for graph in (*CASES.values(), *UNEXPORTED.values()) for op in graph.ops}
    assert kinds == set(OPS)


@pytest.mark.parametrize("case", sorted(UNEXPORTED))
def test_an_op_without_an_onnx_form_is_refused_by_name(case):
    graph = UNEXPORTED[case]
    with pytest.raises(HexirError, match=f"{graph.ops[0].kind} .*has no ONNX form"):
        export_onnx(graph)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_op_round_trips(case, rng):
    graph = CASES[case]
    model = export_onnx(graph)  # runs onnx.checker
    assert model.opset_import[0].version == OPSET
    back = import_onnx(model)
    assert [v.name for v in back.inputs] == [v.name for v in graph.inputs]
    inputs = random_inputs(graph, rng, positive=case in POSITIVE)
    for got, want in zip(evaluate(back, inputs), evaluate(graph, inputs), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_op_exports_what_hexir_computes(case, rng):
    from onnx.reference import ReferenceEvaluator

    graph = CASES[case]
    inputs = random_inputs(graph, rng, positive=case in POSITIVE)
    got = ReferenceEvaluator(export_onnx(graph)).run(None, inputs)
    for g, want in zip(got, evaluate(graph, inputs), strict=True):
        assert g.dtype == want.dtype and g.shape == want.shape
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_gelu_and_rsqrt_come_back_as_one_op():
    for case, kind in (("gelu", "gelu"), ("gelu_tanh", "gelu"), ("rsqrt", "rsqrt")):
        back = import_onnx(export_onnx(CASES[case]))
        assert [op.kind for op in back.ops] == [kind]
        assert back.ops[0].attrs == CASES[case].ops[0].attrs


def test_export_writes_a_file(tmp_path):
    import onnx

    path = tmp_path / "bias.onnx"
    export_onnx(CASES["bias_add"], path)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["x0", "x1"]
    assert model.graph.name == "bias_add"


def test_onnxruntime_agrees(rng):
    cases = ("conv2d", "pools", "layer_norm", "rms_norm", "log_softmax", "gelu_tanh", "slice")
    for case in (*cases, "batch_norm_axis2"):
        graph = CASES[case]
        session = ort.InferenceSession(export_onnx(graph).SerializeToString())
        inputs = random_inputs(graph, rng)
        for got, want in zip(session.run(None, inputs), evaluate(graph, inputs), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_rank_0_constant_exports_as_a_rank_0_initializer(tmp_path, rng):
    # numpy's ascontiguousarray makes rank-0 arrays rank 1; ONNX Runtime then warned that the
    # initializer's shape is not the value's.
    from hexir.ops.builder import GraphBuilder

    b = GraphBuilder("g")
    x = b.input("x", (3, 4))
    graph = b.build(b.op("maximum", x, b.constant(np.float32(0.25))))
    model = export_onnx(graph, tmp_path / "g.onnx")
    scalars = [i for i in model.graph.initializer if i.data_type == 1]
    assert scalars and all(list(i.dims) == [] for i in scalars)
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    (got,) = evaluate(import_onnx(model), [xs])
    np.testing.assert_array_equal(got, np.maximum(xs, 0.25))
