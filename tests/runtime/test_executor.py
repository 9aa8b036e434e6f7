"""Whole graphs through the executor: folded constants, one kernel per op, numpy's answer."""

import numpy as np
import pytest

import hexir
from hexir.graph.evaluate import evaluate


def _weights(rng, *shape, scale=0.1):
    return (rng.standard_normal(shape) * scale).astype("float32")


def mlp(rng: np.random.Generator) -> hexir.Graph:
    g = hexir.GraphBuilder("mlp")
    h = g.input("x", (16, 64))
    for n, (k, m) in enumerate([(64, 32), (32, 32), (32, 10)]):
        w = g.constant(_weights(rng, m, k), name=f"w{n}")
        b = g.constant(_weights(rng, m), name=f"b{n}")
        h = g.bias_add(g.dense(h, w), b)
        if n < 2:
            h = g.relu(h)
    return g.build([g.softmax(h)])


def convnet(rng: np.random.Generator) -> hexir.Graph:
    g = hexir.GraphBuilder("convnet")
    x = g.input("image", (2, 3, 16, 16))
    w1 = g.constant(_weights(rng, 8, 3, 3, 3), name="w1")
    h = g.relu(g.bias_add(g.conv2d(x, w1, padding=1), g.constant(_weights(rng, 8))))
    h = g.max_pool2d(h, kernel=2)
    w2 = g.constant(_weights(rng, 16, 8, 3, 3), name="w2")
    h = g.relu(g.conv2d(h, w2, stride=2, padding=1))
    h = g.avg_pool2d(h, kernel=2)
    h = g.reshape(g.global_avg_pool2d(h), (2, 16))
    w3 = g.constant(_weights(rng, 5, 16), name="w3")
    return g.build([g.bias_add(g.dense(h, w3), g.constant(_weights(rng, 5)))])


def test_three_layer_mlp_matches_numpy():
    rng = np.random.default_rng()
    graph = mlp(rng)
    x = rng.standard_normal((16, 64)).astype("float32")
    (out,) = hexir.compile(graph, target="cpu").run([x])
    # numpy written out by hand, independent of hexir's own evaluator
    h = x
    for n in range(3):
        h = h @ graph.constant(f"w{n}").T + graph.constant(f"b{n}")
        h = np.maximum(h, 0) if n < 2 else h
    e = np.exp(h - h.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)


def test_small_conv_net_matches_numpy():
    rng = np.random.default_rng()
    graph = convnet(rng)
    image = rng.standard_normal((2, 3, 16, 16)).astype("float32")
    module = hexir.compile(graph, target="cpu")
    (out,) = module.run({"image": image})
    (expected,) = evaluate(graph, [image])
    assert out.shape == (2, 5)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_constant_subgraphs_are_folded_before_building():
    rng = np.random.default_rng()
    g = hexir.GraphBuilder("folded")
    x = g.input("x", (4, 8))
    w = g.transpose(g.constant(_weights(rng, 6, 8)))  # folded: a kernel-free constant
    y = g.matmul(x, g.mul(w, g.constant(np.float32(2.0))))
    graph = g.build([y])
    module = hexir.compile(graph)
    assert len(module.commands) == 1
    xv = rng.standard_normal((4, 8)).astype("float32")
    (out,) = module.run([xv])
    (expected,) = evaluate(graph, [xv])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_identical_kernels_are_built_once():
    g = hexir.GraphBuilder("twice")
    x = g.input("x", (8, 8))
    graph = g.build([g.relu(g.relu(x))])
    module = hexir.compile(graph)
    assert len(module.commands) == 2 and len(module.kernels) == 1
    xv = np.random.default_rng().standard_normal((8, 8)).astype("float32")
    np.testing.assert_array_equal(module.run([xv])[0], np.maximum(xv, 0))


def test_bad_inputs_are_named():
    g = hexir.GraphBuilder("g")
    x = g.input("x", (2, 3))
    module = hexir.compile(g.build([g.exp(x)]))
    with pytest.raises(hexir.HexirError, match="%x"):
        module.run([np.ones((3, 2), "float32")])
    with pytest.raises(hexir.HexirError, match="missing inputs x"):
        module.run({})
    with pytest.raises(hexir.HexirError, match="takes 1 inputs, got 2"):
        module.run([np.ones((2, 3), "float32")] * 2)
