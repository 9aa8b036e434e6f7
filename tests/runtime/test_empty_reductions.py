"""A reduction over an axis of no elements gives its identity when compiled, as numpy does (its
init had never run: the kernel left the output as it found it)."""

import numpy as np
import pytest

import hexir


@pytest.mark.parametrize(
    "op, want", [("reduce_sum", 0.0), ("reduce_max", -np.inf), ("reduce_min", np.inf)]
)
def test_a_reduction_of_nothing_is_its_identity(op, want):
    b = hexir.GraphBuilder("empty")
    x = b.input("x", (2, 0, 4))
    graph = b.build(b.relu(b.op(op, x, axes=(1,), keepdims=True)))
    module = hexir.compile(graph)
    for _ in range(2):  # the pooled output is not left over from an earlier run
        (out,) = module.run([np.empty((2, 0, 4), np.float32)])
        assert out.shape == (2, 1, 4)
        np.testing.assert_array_equal(out, np.maximum(np.full((2, 1, 4), want), 0))
