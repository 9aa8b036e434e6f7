"""argmax and argmin from their one definition: numpy semantics (ties to the first index, or to
the last with `last`), the text form, the checks, and compiled CPU kernels (the extremum, then
its index) computing the same int64 indices on fresh inputs full of ties. ONNX import and
export: tests/frontend."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import TypeInferenceError
from hexir.graph.evaluate import evaluate
from hexir.ir.graph import Graph
from hexir.ir.graph_text import print_graph
from hexir.ops.builder import GraphBuilder
from hexir.ops.parse import parse_graph


def one_op(kind: str, shape: tuple[int, ...], dtype: str, **attrs: object) -> Graph:
    b = GraphBuilder("arg")
    return b.build(getattr(b, kind)(b.input("x", shape, dtype), **attrs))


def expected(kind: str, x: np.ndarray, axis: int, keepdims: bool, last: bool) -> np.ndarray:
    """The index by a plain scan of each row: the first (or last) position of its extremum."""
    rows = np.moveaxis(x, axis, -1)
    out = np.empty(rows.shape[:-1], np.int64)
    for index in np.ndindex(out.shape):
        row = rows[index]
        target = row.max() if kind == "argmax" else row.min()
        hits = np.flatnonzero(row == target)
        out[index] = hits[-1] if last else hits[0]
    return np.expand_dims(out, axis) if keepdims else out


def tied(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Fresh inputs from a few values, so that most rows tie for their extremum."""
    return rng.integers(-3, 4, shape).astype(dtype) * (0.5 if dtype.startswith("float") else 1)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, False, False), (1, True, True),
                                                (-1, False, True), (2, True, False)])  # fmt: skip
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "float64"])
def test_evaluated_and_compiled_indices_agree_with_a_scan(kind, axis, keepdims, last, dtype, rng):
    shape = (3, 5, 4)
    graph = one_op(kind, shape, dtype, axis=axis, keepdims=keepdims, last=last)
    op = graph.ops[0]
    assert dict(op.attrs) == {"axis": axis % 3, "keepdims": keepdims, "last": last}
    x = tied(shape, dtype, rng).astype(dtype)
    want = expected(kind, x, axis % 3, keepdims, last)
    (got,) = evaluate(graph, [x])
    assert got.dtype == np.int64 and got.shape == want.shape == op.result.type.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(hexir.compile(graph, target="cpu").run([x])[0], want)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_long_rows_compile_under_the_default_schedule(kind, rng):
    """Rows of ImageNet's 1000 classes, many of them: a parallel and vectorized schedule."""
    graph = one_op(kind, (64, 1000), "float32", axis=1)
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    x[:, 500] = x[:, 20] = 9.0 if kind == "argmax" else -9.0  # a tie in every row
    got = hexir.compile(graph, target="cpu").run([x])[0]
    np.testing.assert_array_equal(got, np.full(64, 20))
    last = one_op(kind, (64, 1000), "float32", axis=1, last=True)
    np.testing.assert_array_equal(hexir.compile(last, target="cpu").run([x])[0], np.full(64, 500))


def test_a_nan_gives_an_index_in_range(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    x[1, 3], x[2] = np.nan, np.nan
    for kind in ("argmax", "argmin"):
        got = hexir.compile(one_op(kind, (4, 6), "float32", axis=1), target="cpu").run([x])[0]
        assert ((0 <= got) & (got < 6)).all()
        np.testing.assert_array_equal(got[[0, 3]], getattr(np, kind)(x[[0, 3]], axis=1))


def test_the_text_form_round_trips():
    graph = one_op("argmin", (2, 3), "int32", axis=-1, keepdims=True, last=True)
    text = print_graph(graph)
    assert "hexir.argmin %x {axis = 1, keepdims = true, last = true" in text
    assert "tensor<2x1xi64>" in text
    assert parse_graph(text) == graph


def test_refused_operands_and_attributes():
    with pytest.raises(TypeInferenceError, match="x must be a numeric tensor, got bool"):
        one_op("argmax", (2, 3), "bool")
    with pytest.raises(TypeInferenceError, match="axis 1 is empty"):
        one_op("argmax", (2, 0), "float32", axis=1)
    with pytest.raises(TypeInferenceError, match="axis"):
        one_op("argmin", (2, 3), "float32", axis=2)
    with pytest.raises(TypeInferenceError, match="'last' must be a bool"):
        one_op("argmin", (2, 3), "float32", last=1)
