"""Fused kernels are ordinary workloads: the search space schedules them on both targets, and
every sampled schedule computes what the fused graph computes."""

import random

import numpy as np
import pytest

import hexir
from hexir.graph.fusion import partition
from hexir.graph.lower import lower
from hexir.graph.rewrite import simplify_graph
from hexir.search import SearchSpace


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.2).astype("float32")


def matmul_bias_relu(rng):
    g = hexir.GraphBuilder("mbr")
    x = g.input("x", (16, 24))
    y = g.relu(g.bias_add(g.matmul(x, g.constant(_w(rng, 24, 32))), g.constant(_w(rng, 32))))
    return g.build([y])


def conv_bn_relu(rng, residual=False):
    g = hexir.GraphBuilder("cbr")
    x = g.input("x", (1, 8, 10, 10))
    h = g.conv2d(x, g.constant(_w(rng, 8, 8, 3, 3)), padding=1)
    c = [g.constant(np.abs(_w(rng, 8)) + 0.5) for _ in range(4)]
    h = g.batch_norm(h, c[0], c[1], c[2], c[3])
    if residual:
        h = g.add(h, x)
    return g.build([g.relu(h)])


def softmax(rng):
    g = hexir.GraphBuilder("sm")
    return g.build([g.softmax(g.input("x", (8, 48)))])


def layer_norm(rng):
    g = hexir.GraphBuilder("ln")
    x = g.input("x", (8, 48))
    return g.build([g.layer_norm(x, g.constant(_w(rng, 48)), g.constant(_w(rng, 48)))])


GRAPHS = {
    "matmul+bias+relu": matmul_bias_relu,
    "conv2d+bn+relu": conv_bn_relu,
    "residual": lambda rng: conv_bn_relu(rng, residual=True),
    "softmax": softmax,
    "layer_norm": layer_norm,
}


# The CPU sketch's conv kernels unroll their register tiles: about 10 s of compiling each.
SLOW_ON_CPU = ("conv2d+bn+relu", "residual")


@pytest.mark.parametrize(
    ("name", "target"),
    [
        pytest.param(n, t, marks=pytest.mark.slow if t == "cpu" and n in SLOW_ON_CPU else ())
        for n in GRAPHS
        for t in ("cpu", "cuda -arch=sm_90")
    ],
)
def test_fused_kernel_is_one_kernel_the_space_can_schedule(name, target, rng):
    graph = simplify_graph(GRAPHS[name](rng))
    (group,) = partition(graph)  # one kernel after fusion
    func = lower(group.graph())
    inputs = [rng.standard_normal(b.shape).astype("float32") for b in func.inputs]
    expected = hexir.reference(func, inputs)
    for trace in SearchSpace().sample(func, target, random.Random(0), 3):
        scheduled = trace.apply(func).func
        assert scheduled != func
        out = [np.full(b.shape, np.nan, "float32") for b in func.outputs]
        hexir.build(scheduled, "cpu")(*inputs, *out)  # GPU schedules run serially here
        for got, want in zip(out, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
