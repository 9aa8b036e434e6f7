"""Generation with a Hugging Face decoder exported to ONNX with past key/values (the tiny
GPT-2 of tests/frontend/fixtures/gpt2_tiny_past.onnx, scripts/export_hf_fixtures.py): it
imports with symbolic dims, a step on a past of fresh random keys and values matches ONNX
Runtime, and greedy generation (the past padded to buckets, masked) gives exactly the token
ids of the plain loop in ONNX Runtime (a past of the exact length, empty at first)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx
from hexir.ir.symbolic import Sym
from hexir.ops.parse import parse_graph
from hexir.serve.onnx_decoder import OnnxDecoder

FIXTURES = Path(__file__).parents[1] / "frontend" / "fixtures"
MODEL = FIXTURES / "gpt2_tiny_past.onnx"
SEQ, PAST, TOTAL = (Sym.named(n) for n in ("sequence", "past_sequence", "total_sequence"))
PASTS = [f"past_key_values.{layer}.{kv}" for layer in range(2) for kv in ("key", "value")]


@pytest.fixture(scope="module")
def decoder() -> OnnxDecoder:
    return OnnxDecoder(MODEL)


@pytest.fixture(scope="module")
def session() -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(MODEL))


def test_the_export_imports_with_symbolic_dims_and_prints_back():
    graph = import_onnx(MODEL, dims={"batch": 1}, symbolic=True)
    types = {v.name: v.type.shape for v in (*graph.inputs, *graph.outputs)}
    assert types["input_ids"] == types["position_ids"] == (1, SEQ)
    assert types["attention_mask"] == (1, TOTAL)
    assert types["past_key_values.0.key"] == (1, 2, PAST, 16)
    assert types["present.1.value"] == (1, 2, PAST + SEQ, 16)
    assert types["logits"] == (1, SEQ, 100)
    # the positions' Range and the mask's Expand, sized by the symbols
    assert {"arange", "broadcast_to"} <= {op.kind for op in graph.ops}
    assert parse_graph(str(graph), {k: v.array for k, v in graph.constants}) == graph


def _feeds(rng, past: int, seq: int) -> dict[str, np.ndarray]:
    mask = np.ones((1, past + seq), np.int64)
    mask[0, rng.choice(past, 2, replace=False)] = 0  # two past tokens hidden
    feeds = {
        "input_ids": rng.integers(0, 100, (1, seq)),
        "attention_mask": mask,
        "position_ids": np.arange(past, past + seq)[None],
    }
    feeds.update((n, rng.standard_normal((1, 2, past, 16)).astype(np.float32)) for n in PASTS)
    return feeds


@pytest.mark.parametrize("past, seq", [(5, 1), (9, 3)])
def test_a_step_on_a_random_past_matches_onnxruntime(decoder, session, rng, past, seq):
    feeds = _feeds(rng, past, seq)
    want = session.run(None, feeds)
    got = decoder.module.run([feeds[v.name] for v in decoder.graph.inputs])
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _onnxruntime_generate(session, prompt: list[int], count: int) -> list[int]:
    """Greedy generation in ONNX Runtime: the past of the exact length, empty at first."""
    past = {n: np.zeros((1, 2, 0, 16), np.float32) for n in PASTS}
    tokens, new, cached = prompt, [], 0
    while len(new) < count:
        logits, *presents = session.run(None, {
            "input_ids": np.asarray([tokens]),
            "attention_mask": np.ones((1, cached + len(tokens)), np.int64),
            "position_ids": np.arange(cached, cached + len(tokens))[None],
            **past,
        })  # fmt: skip
        past = dict(zip(PASTS, presents, strict=True))
        cached += len(tokens)
        new.append(int(np.argmax(logits[0, -1])))
        tokens = new[-1:]
    return new


@pytest.mark.parametrize("bucket, modules", [(16, 2), (4, 3)])
def test_greedy_generation_gives_onnxruntimes_tokens(session, bucket, modules):
    prompt = [5, 17, 42]
    decoder = OnnxDecoder(MODEL, bucket=bucket)
    tokens = decoder.generate(prompt, 6)
    assert tokens == _onnxruntime_generate(session, prompt, 6)
    assert len(set(tokens)) > 1  # the weights are wide enough that tokens vary
    # one prefill, then a decode step per bucket the cache passes through (3..8 tokens)
    assert len(decoder.module.specializations) == modules
    assert decoder.generate(prompt, 2) == tokens[:2]  # the same modules again


def test_a_model_without_past_is_refused_naming_what_it_lacks():
    with pytest.raises(ModelError, match="lacks attention_mask, position_ids, .*past_key_values"):
        OnnxDecoder(FIXTURES / "gpt2_tiny_dynamic.onnx")


def test_the_fixture_is_small():
    assert MODEL.stat().st_size < 200_000
    assert onnx.load(MODEL).opset_import[0].version == 18
