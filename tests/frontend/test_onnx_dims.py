"""ONNX models exported with dynamic axes (symbolic input dims): imported at the sizes the
caller binds (`dims` by name, `input_shapes` whole), compiled, and matching ONNX Runtime at
several sizes; what is left unbound or contradicts the model is refused with every problem
listed (the CLI's `--dim` and `--inputs`: tests/cli/test_cli_dims.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import hexir
from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx, input_names

FIXTURES = Path(__file__).parent / "fixtures"
VOCAB = 100  # scripts/export_hf_fixtures.py


def _flattening_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x[batch, seq, 8] + a mask[batch, seq, 1]: x flattened to [batch*seq, 8] by a shape
    computed at run time (Shape -> Gather -> Mul -> Concat -> Reshape, as exporters write
    for dynamic axes), times a weight, reshaped back, plus the mask."""
    weight = rng.standard_normal((8, 4)).astype(np.float32)

    def ints(name: str, values: object) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Mul", ["batch", "seq"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"]),
        helper.make_node("Concat", ["rows1", "eight"], ["flat"], axis=0),
        helper.make_node("Reshape", ["x", "flat"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w"], ["y2"]),
        helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch1"]),
        helper.make_node("Unsqueeze", ["seq", "axis0"], ["seq1"]),
        helper.make_node("Concat", ["batch1", "seq1", "four"], ["back"], axis=0),
        helper.make_node("Reshape", ["y2", "back"], ["y"]),
        helper.make_node("Add", ["y", "mask"], ["out"]),
    ]
    weights = [
        numpy_helper.from_array(weight, "w"),
        ints("zero", 0),
        ints("one", 1),
        ints("axis0", [0]),
        ints("eight", [8]),
        ints("four", [4]),
    ]
    graph = helper.make_graph(
        nodes,
        "flattening",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq", 1]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 4])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matches_onnxruntime(proto: onnx.ModelProto, graph, feeds: dict[str, np.ndarray]) -> None:
    want = onnxruntime.InferenceSession(proto.SerializeToString()).run(None, feeds)
    got = hexir.compile(graph, target="cpu").run(list(feeds.values()))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch, seq", [(1, 1), (3, 5)])
def test_symbolic_dims_bound_by_name_import_at_those_sizes(rng, batch, seq):
    proto = _flattening_model(rng)
    graph = import_onnx(proto, dims={"batch": batch, "seq": seq})
    assert [v.type.shape for v in graph.inputs] == [(batch, seq, 8), (batch, seq, 1)]
    assert graph.outputs[0].type.shape == (batch, seq, 4)
    feeds = {
        "x": rng.standard_normal((batch, seq, 8)).astype(np.float32),
        "mask": rng.standard_normal((batch, seq, 1)).astype(np.float32),
    }
    _matches_onnxruntime(proto, graph, feeds)


def test_a_whole_input_shape_binds_the_dims_of_the_other_inputs(rng):
    graph = import_onnx(_flattening_model(rng), input_shapes={"x": (2, 6, 8)})
    assert [v.type.shape for v in graph.inputs] == [(2, 6, 8), (2, 6, 1)]


def test_unbound_or_contradicting_sizes_are_refused_each_named(rng):
    proto = _flattening_model(rng)
    with pytest.raises(ModelError) as info:
        import_onnx(proto)
    assert "--dim NAME=SIZE" in str(info.value)
    assert [p for p in info.value.problems] == [
        "input 'x' has symbolic dims 'batch', 'seq' not bound",
        "input 'mask' has symbolic dims 'batch', 'seq' not bound",
    ]
    with pytest.raises(ModelError) as info:
        import_onnx(
            proto,
            dims={"batch": 2, "seqq": 3, "seq": 0},
            input_shapes={"x": (2, 3, 7), "y": (1,)},
        )
    problems = "\n".join(info.value.problems)
    assert "input_shapes names 'y', which is no input of the model" in problems
    assert "dims['seq'] = 0 is not a positive size" in problems
    assert "dims names 'seqq', which no input of the model has" in problems
    assert "input 'x': dim 2 (8) is 8, given shape (2, 3, 7)" in problems
    with pytest.raises(ModelError, match="dim 0 .'batch'. is 2, given shape"):
        import_onnx(proto, dims={"batch": 2}, input_shapes={"x": (3, 4, 8)})


@pytest.mark.parametrize("batch, seq", [(1, 1), (2, 7), (3, 16)])
def test_a_bert_exported_with_dynamic_axes_runs_at_any_size(rng, batch, seq):
    """PyTorch's legacy exporter, input_ids and attention_mask [batch, sequence] (some tokens
    masked out): its graph computes the attention mask's shapes at run time."""
    proto = onnx.load(FIXTURES / "bert_tiny_dynamic.onnx")
    graph = import_onnx(proto, dims={"batch": batch, "sequence": seq})
    mask = (rng.random((batch, seq)) < 0.8).astype(np.int64)
    mask[:, 0] = 1
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq), np.int64), "attention_mask": mask}
    _matches_onnxruntime(proto, graph, feeds)


@pytest.mark.parametrize("batch, seq", [(1, 1), (2, 7), (3, 16)])
def test_a_gpt2_exported_with_dynamic_shapes_runs_at_any_size(rng, batch, seq):
    """PyTorch's dynamo exporter: position ids from an int64 CumSum, the causal mask from a
    Range of the run-time sequence length."""
    proto = onnx.load(FIXTURES / "gpt2_tiny_dynamic.onnx")
    graph = import_onnx(proto, dims={"batch": batch, "sequence": seq})
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq), np.int64)}
    _matches_onnxruntime(proto, graph, feeds)


def test_input_names_are_the_graphs_without_reading_weights():
    path = FIXTURES / "bert_tiny_dynamic.onnx"
    graph = import_onnx(path, dims={"batch": 1, "sequence": 4})
    assert input_names(path) == [v.name for v in graph.inputs] == ["input_ids", "attention_mask"]
