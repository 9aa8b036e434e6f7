"""Language models exported by PyTorch from Hugging Face's definitions (tiny configurations,
random weights; scripts/export_hf_fixtures.py made them): their first op is an embedding
lookup of the `input_ids` input. They import, compile for the CPU and match ONNX's reference
evaluator (and ONNX Runtime where it is installed) on fresh token ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import hexir
from hexir.frontend.onnx_import import import_onnx

FIXTURES = Path(__file__).parent / "fixtures"
VOCAB = 100  # scripts/export_hf_fixtures.py


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny"])
def test_an_exported_language_model_imports_compiles_and_matches_the_reference(name, rng):
    proto = onnx.load(FIXTURES / f"{name}.onnx")
    graph = import_onnx(proto)
    assert any(op.kind == "gather" for op in graph.ops)  # the token embedding, at run time
    (ids_value,) = graph.inputs
    module = hexir.compile(graph, target="cpu")
    reference = ReferenceEvaluator(proto)
    for _ in range(2):
        ids = rng.integers(0, VOCAB, ids_value.type.shape).astype(np.int64)
        (want,) = reference.run(None, {proto.graph.input[0].name: ids})
        (got,) = module.run([ids])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        try:
            import onnxruntime
        except ImportError:
            continue
        session = onnxruntime.InferenceSession(proto.SerializeToString())
        (peer,) = session.run(None, {proto.graph.input[0].name: ids})
        np.testing.assert_allclose(got, peer, rtol=1e-4, atol=1e-4)


def test_a_refused_node_is_the_only_problem_listed_not_its_followers(monkeypatch):
    """With ConstantOfShape refused, BERT's import lists the two ConstantOfShape nodes alone:
    the nodes downstream (the gelu and scale patterns among them) are not listed as using
    undefined tensors."""
    from hexir.errors import ModelError
    from hexir.frontend import onnx_import

    monkeypatch.delitem(onnx_import.SUPPORTED, "ConstantOfShape")
    with pytest.raises(ModelError) as info:
        import_onnx(onnx.load(FIXTURES / "bert_tiny.onnx"))
    assert [p.split(":")[1].strip() for p in info.value.problems] == ["op type not supported"] * 2
    assert all("(ConstantOfShape)" in p for p in info.value.problems)
