"""The model zoo: real shapes, seeded weights, finite outputs of order one, and a round trip
through ONNX export and import that computes the same outputs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from seeding import current_rng

import hexir
from hexir.frontend.onnx_export import export_onnx
from hexir.frontend.onnx_import import import_onnx
from hexir.frontend.zoo import (
    ZOO,
    bert,
    gpt2,
    gpt2_decode,
    gpt2_small,
    gpt2_small_decode,
    mlp,
    mobilenet_v2,
    resnet,
    vit,
    zoo_model,
)
from hexir.graph.evaluate import evaluate
from hexir.ir.graph import Graph

# name -> (inputs, outputs): (name, shape) each
SIGNATURES = {
    "mlp": ([("x", (64, 784))], [("probs", (64, 10))]),
    "resnet18": ([("image", (1, 3, 224, 224))], [("logits", (1, 1000))]),
    "resnet50": ([("image", (1, 3, 224, 224))], [("logits", (1, 1000))]),
    "mobilenet-v2": ([("image", (1, 3, 224, 224))], [("logits", (1, 1000))]),
    "bert-base": ([("hidden", (128, 768))], [("out", (128, 768))]),
    "vit": ([("hidden", (197, 768))], [("out", (197, 768))]),
    "gpt2": (
        [("hidden", (128, 768))],
        [("out", (128, 768)), ("present_key", (12, 128, 64)), ("present_value", (12, 128, 64))],
    ),
    "gpt2-decode": (
        [("hidden", (1, 768)), ("past_key", (12, 127, 64)), ("past_value", (12, 127, 64))],
        [("out", (1, 768)), ("present_key", (12, 128, 64)), ("present_value", (12, 128, 64))],
    ),
}
KINDS = ("key", "value")
PRESENTS = [(f"present.{layer}.{kind}", (12, 128, 64)) for layer in range(12) for kind in KINDS]
SIGNATURES["gpt2-small"] = ([("input_ids", (128,))], [("logits", (128, 50257)), *PRESENTS])
SIGNATURES["gpt2-small-decode"] = (
    [("input_ids", (1,))]
    + [(f"past.{layer}.{kind}", (12, 127, 64)) for layer in range(12) for kind in KINDS],
    [("logits", (1, 50257)), *PRESENTS],
)
SLOW = {"resnet18", "resnet50", "mobilenet-v2", "gpt2-small", "gpt2-small-decode"}


def inputs_for(graph: Graph) -> dict[str, np.ndarray]:
    """Fresh activations, or token ids where an input takes them."""
    rng = current_rng()
    return {
        v.name: rng.integers(0, 100, v.type.shape)  # within the smallest vocabulary tested
        if v.type.dtype == "int64"
        else rng.standard_normal(v.type.shape).astype(np.float32)
        for v in graph.inputs
    }


def zoo_params():
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO]


def test_the_zoo_is_the_documented_one():
    assert set(ZOO) == set(SIGNATURES)


@pytest.mark.parametrize("name", zoo_params())
def test_zoo_model_evaluates(name):
    graph = zoo_model(name)
    inputs, outputs = SIGNATURES[name]
    assert [(v.name, v.type.shape) for v in graph.inputs] == inputs
    assert [(v.name, v.type.shape) for v in graph.outputs] == outputs
    for out in evaluate(graph, inputs_for(graph)):
        assert out.dtype == np.float32 and np.isfinite(out).all()
        assert 0.01 < float(np.std(out)) < 10.0  # weights scaled so activations stay O(1)


def test_zoo_weights_are_seeded():
    assert mlp() == mlp()
    assert mlp(seed=1) != mlp()
    assert zoo_model("mlp") is zoo_model("mlp")


def test_mlp_probabilities(rng):
    (probs,) = evaluate(mlp(batch=4, sizes=(32, 16, 8)), [rng.standard_normal((4, 32), "f4")])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)


def test_resnet_structure():
    kinds = Counter(op.kind for op in zoo_model("resnet18").ops)
    assert kinds["conv2d"] == kinds["batch_norm"] == 20  # 17 convs + 3 downsamples
    assert kinds["add"] == 8 and kinds["max_pool2d"] == 1 and kinds["global_avg_pool2d"] == 1
    kinds50 = Counter(op.kind for op in zoo_model("resnet50").ops)
    assert kinds50["conv2d"] == 53 and kinds50["add"] == 16
    weights = sum(d.array.size for name, d in zoo_model("resnet50").constants if "weight" in name)
    assert 25.0e6 < weights < 26.0e6  # torchvision's ResNet-50: 25.5M parameters


def test_transformer_structure():
    kinds = Counter(op.kind for op in zoo_model("bert-base").ops)
    assert kinds["dense"] == 6 and kinds["batch_matmul"] == 2 and kinds["softmax"] == 1
    assert kinds["layer_norm"] == 2 and kinds["gelu"] == 1
    gpt = Counter(op.kind for op in zoo_model("gpt2").ops)
    assert gpt["matmul"] == 4 and gpt["layer_norm"] == 2 and gpt["slice"] == 3
    (g,) = [op for op in zoo_model("gpt2").ops if op.kind == "gelu"]
    assert g.attr("approximate") == "tanh"
    assert Counter(op.kind for op in zoo_model("gpt2-decode").ops)["concat"] == 2


def test_causal_mask_hides_the_future(rng):
    graph = gpt2(seq=8, hidden=32, heads=2)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    later = x.copy()
    later[5:] = rng.standard_normal((3, 32))
    out, _, _ = evaluate(graph, [x])
    out_later, _, _ = evaluate(graph, [later])
    np.testing.assert_array_equal(out[:5], out_later[:5])
    assert not np.allclose(out[5:], out_later[5:])


@pytest.mark.parametrize("size", ["small", pytest.param("full", marks=pytest.mark.slow)])
def test_decode_continues_the_prefill(size, rng):
    """Decoding token t with the prefill's cache of tokens 0..t-1 gives the prefill's row t."""
    small = dict(hidden=32, heads=2) if size == "small" else {}
    seq = 8 if size == "small" else 128
    prefill, decode = gpt2(seq=seq, **small), gpt2_decode(past=seq - 1, **small)
    x = rng.standard_normal((seq, prefill.inputs[0].type.shape[1])).astype(np.float32)
    out, key, value = evaluate(prefill, [x])
    step, key2, value2 = evaluate(decode, [x[-1:], key[:, :-1], value[:, :-1]])
    np.testing.assert_allclose(step, out[-1:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(key2, key, rtol=1e-6)
    np.testing.assert_allclose(value2, value, rtol=1e-6)


def test_the_whole_gpt2_decode_continues_its_prefill_and_compiles(rng):
    """GPT-2 small's structure at a small size: decoding token t after the prefill's presents
    of tokens 0..t-1 gives the prefill's logits of row t and its presents; both compile."""
    small = dict(layers=2, hidden=32, heads=2, vocab=100)
    prefill, decode = gpt2_small(seq=9, **small), gpt2_small_decode(past=6, **small)
    ids = rng.integers(0, 100, 9)
    logits, *presents = evaluate(prefill, [ids])
    assert logits.shape == (9, 100) and 0.3 < float(np.std(logits)) < 3.0
    pasts = [p[:, :6] for p in presents]
    step, *after = evaluate(decode, [ids[6:7], *pasts])
    np.testing.assert_allclose(step, logits[6:7], rtol=1e-5, atol=1e-5)
    for got, want in zip(after, presents, strict=True):
        np.testing.assert_allclose(got, want[:, :7], rtol=1e-6)
    for graph, inputs in ((prefill, [ids]), (decode, [ids[6:7], *pasts])):
        compiled = hexir.compile(graph, "cpu").run(inputs)
        for got, want in zip(compiled, evaluate(graph, inputs), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gpt2_small_refuses_positions_past_its_1024():
    from hexir.errors import ModelError

    small = dict(layers=1, hidden=32, heads=2, vocab=100)
    gpt2_small_decode(past=1023, **small)  # the last position
    with pytest.raises(ModelError, match="GPT-2 has 1024 positions: tokens 1024..1024"):
        gpt2_small_decode(past=1024, **small)


def round_trips(graph: Graph) -> None:
    back = import_onnx(export_onnx(graph))
    assert [v.name for v in back.inputs] == [v.name for v in graph.inputs]
    assert [v.name for v in back.outputs] == [v.name for v in graph.outputs]
    assert Counter(op.kind for op in back.ops) == Counter(op.kind for op in graph.ops)
    inputs = inputs_for(graph)
    for got, want in zip(evaluate(back, inputs), evaluate(graph, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "graph",
    [
        mlp(),
        resnet(18, image=32, width=8, classes=10),
        resnet(50, image=32, width=4, classes=10),
        mobilenet_v2(image=32, width=0.25, classes=10),
        bert(seq=8, hidden=32, heads=2, ffn=64),
        vit(seq=9, hidden=32, heads=2, ffn=64),
        gpt2(seq=8, hidden=32, heads=2),
        gpt2_decode(past=7, hidden=32, heads=2),
        gpt2_small(seq=8, layers=2, hidden=32, heads=2, vocab=100),
        gpt2_small_decode(past=7, layers=2, hidden=32, heads=2, vocab=100),
    ],
    ids=lambda g: g.name,
)
def test_small_models_round_trip_through_onnx(graph):
    round_trips(graph)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ZOO if not n.startswith("gpt2-small")])
def test_zoo_round_trips_through_onnx(name):  # GPT-2 small: its small size above (500 MB)
    round_trips(zoo_model(name))
