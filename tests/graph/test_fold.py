"""Constant folding: constant subgraphs become constants and the graph computes the same."""

from __future__ import annotations

import numpy as np
from seeding import current_rng

from hexir.graph.evaluate import evaluate
from hexir.graph.fold import fold_constants
from hexir.ir.graph_text import print_graph
from hexir.ops.parse import parse_graph

GRAPH = """
hexir.graph @g(%x: tensor<4x8xf32>) -> (tensor<4x3xf32>, tensor<3xf32>) {
  %w = hexir.constant @w : tensor<3x8xf32>
  %b = hexir.constant @b : tensor<3xf32>
  %c = hexir.constant @c : tensor<3xf32>
  %unused = hexir.constant @unused : tensor<5x5xf32>
  %wt = hexir.transpose %w {perm = (1, 0)} : tensor<8x3xf32>
  %bc = hexir.add %b, %c : tensor<3xf32>
  %e = hexir.exp %bc : tensor<3xf32>
  %0 = hexir.matmul %x, %wt : tensor<4x3xf32>
  %1 = hexir.bias_add %0, %e {axis = 1} : tensor<4x3xf32>
  hexir.return %1, %bc
}
"""


def rand(*shape: int) -> np.ndarray:
    return current_rng().uniform(-2.0, 2.0, size=shape).astype(np.float32)


def blobs() -> dict[str, np.ndarray]:
    return {"w": rand(3, 8), "b": rand(3), "c": rand(3), "unused": rand(5, 5)}


def test_constant_subgraphs_fold():
    data = blobs()
    graph = parse_graph(GRAPH, data)
    folded = fold_constants(graph)
    kinds = [op.kind for op in folded.ops]
    # w, b, c and the never-used constant are gone; wt, bc (an output) and e replace them.
    assert kinds == ["constant", "constant", "constant", "matmul", "bias_add"]
    assert [name for name, _ in folded.constants] == ["wt", "bc", "e"]
    np.testing.assert_array_equal(folded.constant("wt"), data["w"].T)
    np.testing.assert_array_equal(folded.constant("bc"), data["b"] + data["c"])
    assert folded.constant("e").dtype == np.float32


def test_folded_graph_computes_the_same():
    graph = parse_graph(GRAPH, blobs())
    folded = fold_constants(graph)
    x = rand(4, 8)
    for got, want in zip(evaluate(folded, [x]), evaluate(graph, [x]), strict=True):
        np.testing.assert_array_equal(got, want)


def test_folded_graph_round_trips_through_text():
    folded = fold_constants(parse_graph(GRAPH, blobs()))
    text = print_graph(folded)
    assert "%bc = hexir.constant dense<" in text  # small: printed inline under its value's name
    big = {name: data.array for name, data in folded.constants if data.array.size > 16}
    assert parse_graph(text, big) == folded


def test_a_fully_constant_graph_folds_to_its_outputs():
    text = """
    hexir.graph @k() -> tensor<2x2xf32> {
      %a = hexir.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
      %0 = hexir.matmul %a, %a : tensor<2x2xf32>
      hexir.return %0
    }
    """
    folded = fold_constants(parse_graph(text))
    assert [op.kind for op in folded.ops] == ["constant"]
    (out,) = evaluate(folded, [])
    np.testing.assert_array_equal(out, [[7.0, 10.0], [15.0, 22.0]])


def test_a_name_taken_by_other_data_gets_a_suffix():
    text = """
    hexir.graph @k(%x: tensor<2xf32>) -> tensor<2xf32> {
      %a = hexir.constant @0 dense<[1.0, 2.0]> : tensor<2xf32>
      %0 = hexir.exp %a : tensor<2xf32>
      %1 = hexir.add %x, %0 : tensor<2xf32>
      %2 = hexir.add %1, %a : tensor<2xf32>
      hexir.return %2
    }
    """
    folded = fold_constants(parse_graph(text))
    assert [name for name, _ in folded.constants] == ["0", "0_1"]
    x = rand(2)
    np.testing.assert_allclose(evaluate(folded, [x])[0], x + np.exp([1.0, 2.0]) + [1.0, 2.0])


def test_a_graph_without_constants_is_unchanged():
    text = """
    hexir.graph @k(%x: tensor<3xf32>) -> tensor<3xf32> {
      %0 = hexir.relu %x : tensor<3xf32>
      hexir.return %0
    }
    """
    graph = parse_graph(text)
    assert fold_constants(graph) == graph
