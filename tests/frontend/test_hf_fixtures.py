"""Models exported by PyTorch from Hugging Face's definitions (tiny configurations, random
weights; scripts/export_hf_fixtures.py made them, and its docstring says which exporter wrote
which file). Two language models, whose first op is an embedding lookup of the `input_ids`
input, and four image classifiers (ViT, ResNet, MobileNetV2, ConvNeXt), each at opsets 17, 18
and 20, from `pixel_values` to logits. They import, compile for the CPU and match ONNX's
reference evaluator (and ONNX Runtime where it is installed) on fresh inputs; a slow test
tunes one and builds from what the tune recorded. GPT-2 with past key/values
(gpt2_tiny_past) imports here at fixed sizes; tests/serve/test_onnx_decoder.py imports it
with symbolic dims and generates with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from small_search import SMALL_SEARCH

import hexir
from hexir import knobs
from hexir.costmodel import RandomModel
from hexir.database import Database
from hexir.frontend.onnx_import import import_onnx

FIXTURES = Path(__file__).parent / "fixtures"
VOCAB = 100  # scripts/export_hf_fixtures.py
CLASSES = 10
# Each model at every opset; opset 18 (the dynamo exporter's) in the quick suite, the legacy
# exporter's 17 and 20's Gelu in the slow one.
VISION = [pytest.param(f"{model}_tiny_opset{opset}",
                       marks=() if opset == 18 else pytest.mark.slow)
          for model in ("vit", "resnet", "mobilenetv2", "convnext")
          for opset in (17, 18, 20)]  # fmt: skip


def _matches_the_peers(proto: onnx.ModelProto, run, feed: np.ndarray) -> None:
    """`run`'s output on `feed` against the reference evaluator's and ONNX Runtime's."""
    feeds = {proto.graph.input[0].name: feed}
    (got,) = run([feed])
    (want,) = ReferenceEvaluator(proto).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    try:
        import onnxruntime
    except ImportError:
        return
    session = onnxruntime.InferenceSession(proto.SerializeToString())
    (peer,) = session.run(None, feeds)
    np.testing.assert_allclose(got, peer, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny"])
def test_an_exported_language_model_imports_compiles_and_matches_the_reference(name, rng):
    proto = onnx.load(FIXTURES / f"{name}.onnx")
    graph = import_onnx(proto)
    assert any(op.kind == "gather" for op in graph.ops)  # the token embedding, at run time
    (ids_value,) = graph.inputs
    module = hexir.compile(graph, target="cpu")
    for _ in range(2):
        _matches_the_peers(
            proto, module.run, rng.integers(0, VOCAB, ids_value.type.shape, np.int64)
        )


def test_the_decoder_with_past_imports_at_fixed_sizes_and_matches_the_reference(rng):
    proto = onnx.load(FIXTURES / "gpt2_tiny_past.onnx")
    sizes = {"batch": 1, "sequence": 2, "past_sequence": 4, "total_sequence": 6}
    module = hexir.compile(import_onnx(proto, dims=sizes), target="cpu")
    mask = np.ones((1, 6), np.int64)
    mask[0, 1] = 0  # a past token hidden
    feeds = {"input_ids": rng.integers(0, VOCAB, (1, 2)), "attention_mask": mask,
             "position_ids": np.array([[4, 5]])}  # fmt: skip
    for info in proto.graph.input[3:]:
        feeds[info.name] = rng.standard_normal((1, 2, 4, 16)).astype(np.float32)
    want = ReferenceEvaluator(proto).run(None, feeds)
    for got, peer in zip(module.run(list(feeds.values())), want, strict=True):
        np.testing.assert_allclose(got, peer, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", VISION)
def test_an_exported_image_classifier_imports_compiles_and_matches_the_reference(name, rng):
    proto = onnx.load(FIXTURES / f"{name}.onnx")
    assert proto.opset_import[0].version == int(name.rsplit("opset", 1)[1])
    graph = import_onnx(proto)
    (pixels,) = graph.inputs
    assert pixels.type.shape == (1, 3, 32, 32)
    assert [v.type.shape for v in graph.outputs] == [(1, CLASSES)]
    module = hexir.compile(graph, target="cpu")
    for _ in range(2):
        _matches_the_peers(proto, module.run, rng.standard_normal((1, 3, 32, 32), np.float32))


@pytest.mark.slow
def test_a_tuned_image_classifier_builds_from_the_database_and_matches(rng, tmp_path):
    proto = onnx.load(FIXTURES / "resnet_tiny_opset18.onnx")
    graph = import_onnx(proto)
    db = Database(f"sqlite:///{tmp_path / 'tune.db'}")
    with knobs.scope(**SMALL_SEARCH, tune_confirm_best=0):
        result = hexir.tune(graph, "cpu", trials=4, database=db, seed=0, model=RandomModel(0))
    # Each record is a trial, or a kernel timed inside the model at the end (its convs have
    # two forms: hexir/search/tune.py).
    assert sum(t.trials for t in result.tasks) == 4 == db.stats().records - result.in_model
    assert result.in_model > 0
    path = hexir.compile(graph, "cpu", database=db).save(tmp_path / "resnet.hxa")
    module = hexir.runtime.load(path)
    assert "tuned" in {r.schedule for r in module.report}
    _matches_the_peers(proto, module.run, rng.standard_normal((1, 3, 32, 32), np.float32))


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
