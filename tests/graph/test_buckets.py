"""Buckets of a symbolic length: a graph whose results at each position read no later one runs
padded to its bucket and cut back (hexir/graph/buckets.py, SymbolicModule), with the same
answers as at the exact length; a graph that reads across the positions runs at exact sizes."""

import numpy as np
import pytest

import hexir
from hexir.frontend.zoo_transformer import gpt2_small
from hexir.graph.buckets import bucket, position_axes
from hexir.graph.specialize import specialize

SIZE = dict(layers=2, hidden=32, heads=2, vocab=100, seed=5)


def test_buckets_are_powers_of_two_then_multiples_of_128():
    assert [bucket(n) for n in (1, 2, 3, 17, 32, 33, 128, 129, 200, 256, 257)] == [
        1, 2, 4, 32, 32, 64, 128, 256, 256, 256, 384,
    ]  # fmt: skip


def test_a_causal_decoder_is_prefix_closed_along_its_tokens():
    axes = position_axes(gpt2_small(seq="seq", **SIZE))["seq"]
    assert axes.why is None
    assert axes.inputs == {"input_ids": 0}
    # logits [seq, vocab], then each layer's keys and values [heads, seq, head_dim]
    assert axes.outputs == {0: 0, 1: 1, 2: 1, 3: 1, 4: 1}


@pytest.mark.slow
def test_one_module_runs_lengths_1_17_30_and_200_padded_to_their_buckets():
    rng = np.random.default_rng()
    graph = gpt2_small(seq="seq", **SIZE)
    module = hexir.compile(graph)
    assert module.padded.keys() == {"seq"}
    for n in (1, 17, 30, 200):
        ids = rng.integers(0, 100, n)
        got = module.run([ids])
        want = hexir.reference(specialize(graph, {"seq": n}), [ids])
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.flags.c_contiguous
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    # 17 and 30 ran the module compiled for 32
    assert sorted(module.specializations) == [(("seq", 1),), (("seq", 32),), (("seq", 256),)]


def _reads_across(kind: str):
    """x [seq, 8] through an op that reads across the positions."""
    b = hexir.GraphBuilder(kind)
    x = b.input("x", ("seq", 8))
    if kind == "mean":
        y = b.op("reduce_mean", x, axes=(0,), keepdims=True)
    elif kind == "softmax":
        y = b.softmax(x, axis=0)
    elif kind == "scores":  # every row against every row, no causal mask
        y = b.matmul(x, b.transpose(x, (1, 0)))
    else:  # attention over all keys
        q = b.reshape(x, (1, -1, 8))
        y = b.op("attention", q, b.transpose(q, (0, 2, 1)), q, scale=0.5, causal=False)
    return b.build(b.relu(y))


@pytest.mark.parametrize(
    "kind, why",
    [
        ("mean", "reduce_mean: it reduces axis 0"),
        ("softmax", "softmax: it reads across axis 0"),
        ("scores", "matmul: the positions run along its weight"),
        ("attention", "attention: each query reads every key"),
    ],
)
def test_a_graph_that_reads_across_the_positions_runs_at_exact_sizes(kind, why):
    rng = np.random.default_rng()
    graph = _reads_across(kind)
    assert why in position_axes(graph)["seq"].why
    module = hexir.compile(graph)
    assert not module.padded and why in module.exact["seq"]
    for n in (3, 5):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        (got,) = module.run([x])
        (want,) = hexir.reference(specialize(graph, {"seq": n}), [x])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sorted(module.specializations) == [(("seq", 3),), (("seq", 5),)]


def test_rows_through_reshape_transpose_and_a_row_norm_keep_their_positions():
    rng = np.random.default_rng()
    w = rng.standard_normal((8, 12)).astype(np.float32)
    b = hexir.GraphBuilder("rows")
    x = b.input("x", (1, "seq", 8))
    h = b.matmul(b.reshape(x, (-1, 8)), b.constant(w))  # [seq, 12]
    heads = b.transpose(b.reshape(h, (-1, 3, 4)), (1, 0, 2))  # [3, seq, 4]
    graph = b.build(b.softmax(b.gelu(heads), axis=2))
    axes = position_axes(graph)["seq"]
    assert axes.why is None and axes.inputs == {"x": 1} and axes.outputs == {0: 1}
    module = hexir.compile(graph)
    x5 = rng.standard_normal((1, 5, 8)).astype(np.float32)
    (got,) = module.run([x5])
    assert got.shape == (3, 5, 4)
    np.testing.assert_allclose(got, hexir.reference(specialize(graph, {"seq": 5}), [x5])[0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert sorted(module.specializations) == [(("seq", 8),)]


def test_buckets_can_be_turned_off():
    from hexir.runtime.symbolic_module import SymbolicModule

    module = SymbolicModule(gpt2_small(seq="seq", **SIZE), hexir.Target("cpu"), buckets=False)
    module.run([np.arange(3)])
    assert sorted(module.specializations) == [(("seq", 3),)]


def test_the_padding_makes_nothing_a_masked_read_carries_into_a_real_row():
    # v = log(x) under causal attention: padding with zeros would make -inf values, which
    # the kernel's masked keys (weight 0) turn into NaN in every real row. The padding
    # repeats the last position instead.
    b = hexir.GraphBuilder("logs")
    x = b.input("x", (1, "seq", 8))
    v = b.log(x)
    y = b.op("attention", v, b.transpose(v, (0, 2, 1)), v, scale=0.3, causal=True)
    graph = b.build(y)
    module = hexir.compile(graph)
    assert module.padded.keys() == {"seq"}
    x5 = np.random.default_rng().uniform(0.5, 2.0, (1, 5, 8)).astype(np.float32)
    (got,) = module.run([x5])
    (want,) = hexir.reference(specialize(graph, {"seq": 5}), [x5])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sorted(module.specializations) == [(("seq", 8),)]
