"""The CPU rewrite of attention's parts into one `attention` op (hexir/graph/attention.py):
what it matches (the zoo's GPT-2 and BERT, a scale by mul or div, a causal -1e9 mask as
`causal`, another mask as the bias operand), what it leaves (a shared intermediate, another
softmax axis, fewer keys than MIN_KEYS or queries than MIN_QUERIES, the knob off, a GPU
target), causal attention as blocks of queries over the keys they see, results equal to the
parts' on fresh inputs, and a compiled long GPT-2 block whose memory plan holds no
sequence x sequence buffer."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.frontend.zoo import bert, gpt2
from hexir.graph.attention import MIN_KEYS, MIN_QUERIES, causal_block, fuse_attention
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import compiled_graph
from hexir.graph.rewrite import simplify_graph
from hexir.ops.attention import causal_mask
from hexir.ops.builder import GraphBuilder
from hexir.runtime.target import Target

CPU = Target("cpu")


def inputs(graph, rng):
    return [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]


def attention_ops(graph):
    return [op for op in graph.ops if op.kind == "attention"]


def same_values(graph, rewritten, rng):
    xs = inputs(graph, rng)
    for got, want in zip(evaluate(rewritten, xs), evaluate(graph, xs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, causal", [(gpt2, True), (bert, False)])
def test_the_zoo_transformers_attention_becomes_one_op(rng, make, causal):
    graph = simplify_graph(make(seq=24, hidden=64, heads=4))
    rewritten = fuse_attention(graph, CPU, min_keys=1, min_queries=1)
    (op,) = attention_ops(rewritten)
    assert op.attr("causal") is causal and op.attr("scale") == pytest.approx(0.25)
    assert len(op.operands) == 3  # GPT-2's -1e9 mask is `causal`, not a bias
    assert not [o for o in rewritten.ops if o.kind in ("softmax", "batch_matmul")]
    same_values(graph, rewritten, rng)


def test_keys_read_in_place_are_transposed_for_the_attention_op(rng):
    # simplify_graph folds a transpose of the keys into the scores' batch_matmul
    # (transpose_b); the attention op reads them as [B, D, T], so the transpose comes back.
    b = GraphBuilder("parts")
    q, k, v = b.input("q", (2, 8, 4)), b.input("k", (2, 16, 4)), b.input("v", (2, 16, 4))
    scores = b.batch_matmul(q, b.transpose(k, (0, 2, 1)))
    half = b.constant(np.array(0.5, np.float32))
    graph = simplify_graph(b.build(b.batch_matmul(b.softmax(b.mul(scores, half), axis=2), v)))
    assert [op.attr("transpose_b") for op in graph.ops if op.kind == "batch_matmul"][0]
    rewritten = fuse_attention(graph, CPU, min_keys=1, min_queries=1)
    assert [op.kind for op in rewritten.ops] == ["transpose", "attention"]
    assert rewritten.ops[1].operands[1] == rewritten.ops[0].result
    same_values(graph, rewritten, rng)


def _parts(scale_op="mul", mask=None, axis=2, keep_scores=False, keys=16):
    b = GraphBuilder("parts")
    q, kt, v = b.input("q", (2, 8, 4)), b.input("kt", (2, 4, keys)), b.input("v", (2, keys, 4))
    scores = b.batch_matmul(q, kt)
    factor = b.constant(np.array(2.0 if scale_op == "div" else 0.5, np.float32))
    logits = getattr(b, scale_op)(scores, factor)
    if mask is not None:
        logits = b.add(logits, mask(b))
    out = b.batch_matmul(b.softmax(logits, axis=axis), v)
    return b.build([out, scores] if keep_scores else [out])


def test_a_division_scales_and_another_mask_is_the_bias(rng):
    padding = np.zeros((1, 1, 16), np.float32)
    padding[..., 11:] = -1e9
    graph = _parts("div", mask=lambda b: b.constant(padding))
    (op,) = attention_ops(fuse_attention(graph, CPU, min_keys=1, min_queries=1))
    assert op.attr("scale") == 0.5 and op.attr("causal") is False and len(op.operands) == 4
    same_values(graph, fuse_attention(graph, CPU, min_keys=1, min_queries=1), rng)
    runtime = _parts(mask=lambda b: b.input("bias", (8, 16)))
    (op,) = attention_ops(fuse_attention(runtime, CPU, min_keys=1, min_queries=1))
    assert op.operands[3].name == "bias"
    same_values(runtime, fuse_attention(runtime, CPU, min_keys=1, min_queries=1), rng)


def test_what_is_not_attention_stays_as_it_is():
    for graph in (_parts(keep_scores=True), _parts(axis=1)):
        assert fuse_attention(graph, CPU, min_keys=1, min_queries=1) is graph
    assert not attention_ops(fuse_attention(_parts(keys=MIN_KEYS - 1), CPU, min_queries=1))
    long = _parts(keys=MIN_KEYS)
    assert attention_ops(fuse_attention(long, CPU, min_queries=1))
    assert 8 < MIN_QUERIES and not attention_ops(fuse_attention(long, CPU))  # a decode's few
    assert fuse_attention(long, Target("cuda")) is long
    with knobs.scope(fuse_attention=False):
        assert fuse_attention(long, CPU) is long


@pytest.mark.parametrize("queries, keys", [(128, 128), (200, 200), (300, 300), (130, 170)])
def test_causal_attention_runs_as_blocks_of_queries_over_the_keys_they_see(rng, queries, keys):
    b = GraphBuilder("causal")
    q, kt = b.input("q", (2, queries, 8)), b.input("kt", (2, 8, keys))
    v = b.input("v", (2, keys, 8))
    mask = np.where(causal_mask(queries, keys), 0, -1e9).astype(np.float32)
    logits = b.add(b.mul(b.batch_matmul(q, kt), b.constant(np.float32(0.35))), b.constant(mask))
    graph = b.build([b.batch_matmul(b.softmax(logits, axis=2), v)])
    rewritten = fuse_attention(graph, CPU)  # no MIN_KEYS: blocks beat the parts at any length
    block = causal_block(queries)
    ops = attention_ops(rewritten)
    assert len(ops) == -(-queries // block) and all(op.attr("causal") for op in ops)
    # block i reads the keys its last query sees, up to (i + 1) * block + keys - queries
    assert [op.operands[1].type.shape[2] for op in ops] == [
        min(keys, (i + 1) * block + keys - queries) for i in range(len(ops))
    ]
    same_values(graph, rewritten, rng)
    xs = inputs(graph, rng)
    np.testing.assert_allclose(
        hexir.compile(graph).run(xs)[0], evaluate(graph, xs)[0], rtol=1e-4, atol=1e-5
    )


@pytest.mark.slow  # 1.9 s: the quick suite stays under 3 minutes
def test_a_long_gpt2_block_plans_no_sequence_by_sequence_buffer(rng):
    seq, heads = MIN_KEYS, 2
    graph = gpt2(seq=seq, hidden=32, heads=heads)
    square = heads * seq * seq * 4
    assert len(attention_ops(compiled_graph(graph, "cpu"))) == seq // causal_block(seq)
    module = hexir.compile(graph, "cpu")
    assert max(p.nbytes for _, p in module.plan.placements) < square
    with knobs.scope(fuse_attention=False):
        parts = hexir.compile(graph, "cpu")
    assert max(p.nbytes for _, p in parts.plan.placements) >= square
    xs = inputs(graph, rng)
    for got, want in zip(module.run(xs), parts.run(xs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
