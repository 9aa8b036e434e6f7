"""Constant weights laid out at compile time (hexir/graph/layout.py)."""

from __future__ import annotations

import numpy as np

import hexir
from hexir import knobs
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import fused_kernels
from hexir.graph.layout import layout_weights
from hexir.ops.builder import GraphBuilder


def _mlp(rng: np.random.Generator, weight_is_input: bool = False) -> tuple[hexir.Graph, dict]:
    b = GraphBuilder("mlp")
    x = b.input("x", (6, 24))
    w1 = rng.standard_normal((40, 24), dtype=np.float32)
    w2 = rng.standard_normal((8, 40), dtype=np.float32)
    bias = rng.standard_normal(40, dtype=np.float32)
    h = b.relu(b.bias_add(b.dense(x, b.constant(w1, name="w1")), b.constant(bias), axis=1))
    second = b.input("w2", (8, 40)) if weight_is_input else b.constant(w2, name="w2")
    graph = b.build(b.dense(h, second))
    return graph, {"w1": w1, "w2": w2, "bias": bias}


def test_dense_of_a_constant_weight_becomes_a_matmul_of_its_transpose(rng):
    graph, data = _mlp(rng)
    after = layout_weights(graph)
    assert [op.kind for op in after.ops if op.kind != "constant"] == [
        "matmul", "bias_add", "relu", "matmul"
    ]  # fmt: skip
    assert after.outputs == graph.outputs and after.inputs == graph.inputs
    names = {name for name, _ in after.constants}
    assert "w1" not in names and "w2" not in names  # only the transposed copies are kept
    np.testing.assert_array_equal(after.constant("w1_t"), data["w1"].T)
    x = rng.standard_normal((6, 24), dtype=np.float32)
    (got,) = hexir.compile(graph).run([x])
    (want,) = evaluate(graph, [x])  # numpy semantics of the graph as given
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_module_holds_the_transposed_constants_and_no_kernel_transposes_them(rng):
    graph, data = _mlp(rng)
    module = hexir.compile(graph)
    shapes = sorted(a.shape for a in module.constants.values())
    assert shapes == [(24, 40), (40,), (40, 8)]  # [K, N] each: laid out once, at compile time
    assert all("dense" not in r.name and "transpose" not in r.name for r in module.report)
    # Each matmul reads its weight along N with unit stride: its pack is a copy of a panel.
    _, kernels = fused_kernels(graph)
    for _, func in kernels:
        assert "dense" not in func.name


def test_a_weight_that_is_an_input_stays_a_dense(rng):
    graph, _ = _mlp(rng, weight_is_input=True)
    kinds = [op.kind for op in layout_weights(graph).ops]
    assert kinds.count("dense") == 1 and kinds.count("matmul") == 1


def test_the_knob_keeps_the_weights_as_they_are(rng):
    graph, _ = _mlp(rng)
    with knobs.scope(pack_weights=False):
        assert layout_weights(graph) == graph
        module = hexir.compile(graph)
    assert any(r.name.startswith("fused_dense") for r in module.report)
    x = rng.standard_normal((6, 24), dtype=np.float32)
    (got,) = module.run([x])
    (want,) = hexir.compile(graph).run([x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _convs(rng: np.random.Generator) -> hexir.Graph:
    """A 3x3 conv (laid out in blocks), a 1x1 and a grouped one (kept KCRS)."""
    b = GraphBuilder("convs")
    x = b.input("x", (1, 8, 10, 10))
    w3 = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    w1 = rng.standard_normal((16, 16, 1, 1), dtype=np.float32)
    wg = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    h = b.relu(b.conv2d(x, b.constant(w3, name="w3"), padding=1))
    h = b.conv2d(h, b.constant(w1, name="w1"))
    return b.build(b.conv2d(h, b.constant(wg, name="wg"), padding=1, groups=2))


def test_a_windowed_conv_takes_its_constant_weight_in_panels_of_the_vector_width(rng):
    from hexir.ops.nn import unblock_conv_weight
    from hexir.runtime.target import Target

    graph = _convs(rng)
    lanes = Target("cpu").vector_width
    after = layout_weights(graph, Target("cpu"))
    convs = [op for op in after.ops if op.kind == "conv2d"]
    assert [op.attr("weight_block") for op in convs] == [lanes, None, None]
    packed = after.constant(convs[0].operands[1].name)
    assert packed.shape == (16 // lanes, 8, 3, 3, lanes)
    np.testing.assert_array_equal(unblock_conv_weight(packed), graph.constant("w3"))
    assert after.outputs == graph.outputs
    assert layout_weights(graph, Target("cuda")) == graph  # the GPU's kernels read KCRS
    x = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
    module = hexir.compile(graph)
    (got,) = module.run([x])
    (want,) = evaluate(graph, [x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Laid out once, here: the kernel of the blocked conv reads its weight in place, no pack.
    assert any(a.shape == packed.shape for a in module.constants.values())
    first = next(r for r in module.report if r.ops[0] == "conv2d")
    assert "cache_read" not in str(first.trace)
    with knobs.scope(pack_weights=False):
        assert layout_weights(graph, Target("cpu")) == graph
