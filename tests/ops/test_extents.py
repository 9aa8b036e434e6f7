"""Ops whose extents are attributes (arange, broadcast_to) and attributes that are symbolic
dimensions (theirs, a reshape's to several symbolic extents, a slice's whole symbolic axis):
shapes, refusals, the text form, specialization, numpy and the kernels against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import HexirError, TypeInferenceError
from hexir.frontend.onnx_export import export_onnx
from hexir.graph.evaluate import evaluate
from hexir.graph.lower import lower_op
from hexir.graph.specialize import specialize
from hexir.ir.symbolic import Sym, SymbolicError, quotient
from hexir.ops.builder import GraphBuilder
from hexir.ops.parse import parse_graph

SEQ, PAST = Sym.named("seq"), Sym.named("past")


def test_arange_lengths_with_numbers_and_symbols():
    b = GraphBuilder("g")
    assert b.arange(stop=5).type.shape == (5,) and b.arange(stop=5).type.dtype == "int64"
    assert b.arange(start=7, stop=-2, step=-3, dtype="float32").type.shape == (3,)
    assert b.arange(start=4, stop=2).type.shape == (0,)
    assert b.arange(start=PAST, stop=PAST + SEQ).type.shape == (SEQ,)
    assert b.arange(stop=2 * SEQ + 2, step=2).type.shape == (SEQ + 1,)
    assert b.arange(start=SEQ + 3, stop=3, step=-1).type.shape == (SEQ,)


@pytest.mark.parametrize(
    "attrs, match",
    [
        (dict(stop=5, step=0), "'step' must not be 0"),
        (dict(stop=SEQ, step=2), r"range\(0, \{seq\}, 2\) is no dimension"),
        (dict(start=SEQ, stop=PAST), "may be negative"),
        (dict(stop=3, dtype="bool"), "number type"),
    ],
)
def test_arange_refuses_what_has_no_length(attrs, match):
    with pytest.raises(TypeInferenceError, match=match):
        GraphBuilder("g").arange(**attrs)


def test_broadcast_to_shapes_and_refusals():
    b = GraphBuilder("g")
    x = b.input("x", (3, 1))
    assert b.broadcast_to(x, shape=(2, 3, 4)).type.shape == (2, 3, 4)
    assert b.broadcast_to(b.input("y", (1, "seq")), shape=(PAST, SEQ)).type.shape == (PAST, SEQ)
    with pytest.raises(TypeInferenceError, match=r"does not broadcast to \(4, 2\)"):
        b.broadcast_to(x, shape=(4, 2))
    with pytest.raises(TypeInferenceError, match="does not broadcast"):
        b.broadcast_to(x, shape=(1,))


def test_reshape_to_several_symbolic_extents_keeps_them_as_dimensions():
    b = GraphBuilder("g")
    m = b.input("m", (1, "seq", "past"))
    four = b.reshape(m, (1, 1, SEQ, PAST))
    assert four.type.shape == (1, 1, SEQ, PAST)
    assert b.ops[-1].attr("shape") == (1, 1, SEQ, PAST)
    x = b.input("x", (1, 2, "past", 16))
    merged = b.reshape(x, (-1, PAST, 16))  # the -1 is a number here
    assert merged.type.shape == (2, PAST, 16) and b.ops[-1].attr("shape") == (2, -1, 16)
    assert b.reshape(b.input("y", (2, "seq")), (-1,)).type.shape == (2 * SEQ,)
    with pytest.raises(TypeInferenceError, match="not a linear dimension"):
        b.reshape(m, (-1,))
    with pytest.raises(
        TypeInferenceError, match=r"\(1 \* \{seq\} \* \{seq\}\) keeps \{seq\} in its denominator"
    ):
        b.reshape(m, (1, SEQ, SEQ))


def test_quotient_cancels_equal_factors_only():
    assert quotient((1, SEQ, 32), (2, 16)) == SEQ
    assert quotient((2 * SEQ + 2, 4), (SEQ + 1,)) == 8
    assert quotient((PAST + SEQ, 6), (3,)) == 2 * (PAST + SEQ)
    with pytest.raises(SymbolicError):
        quotient((SEQ, PAST), ())


def _symbolic_graph():
    b = GraphBuilder("g")
    m = b.input("m", (1, "seq", "past"))
    positions = b.arange(start=PAST, stop=PAST + SEQ)
    mask = b.reshape(m, (1, 1, SEQ, PAST))
    ones = b.broadcast_to(b.constant(np.ones((1, 1), np.float32)), shape=(SEQ, PAST))
    whole = b.op("slice", m, start=(0, 0, 0), stop=(1, SEQ, PAST), step=(1, 1, 1))
    return b.build([positions, mask, b.mul(b.reshape(ones, (1, SEQ, PAST)), whole)])


def test_symbolic_attributes_print_parse_and_specialize():
    g = _symbolic_graph()
    text = str(g)
    assert "start = {past}, step = 1, stop = {past + seq}" in text
    assert "shape = (1, 1, {seq}, {past})" in text and "stop = (1, {seq}, {past})" in text
    assert parse_graph(text, {k: v.array for k, v in g.constants}) == g
    concrete = specialize(g, {"seq": 3, "past": 5})
    assert [op.attr("stop") for op in concrete.ops if op.kind == "arange"] == [8]
    attrs = [a for op in concrete.ops for _, a in op.attrs]
    assert not any(isinstance(v, Sym) for a in attrs for v in (a if isinstance(a, tuple) else (a,)))


def test_a_symbolic_graph_runs_at_its_inputs_sizes(rng):
    g = _symbolic_graph()
    module = hexir.compile(g, "cpu")
    for seq, past in ((3, 5), (1, 2)):
        m = rng.standard_normal((1, seq, past)).astype(np.float32)
        want = [np.arange(past, past + seq), m.reshape(1, 1, seq, past), m]
        for got in (evaluate(g, [m]), module.run([m])):
            for a, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, w)


def test_a_symbolic_attribute_does_not_export_and_says_to_specialize():
    with pytest.raises(HexirError, match=r"arange with the symbolic start \{past\}.*specialize"):
        export_onnx(_symbolic_graph())


@pytest.mark.parametrize(
    "build, want",
    [
        (lambda b: b.arange(start=3, stop=-9, step=-4, dtype="int32"), np.arange(3, -9, -4)),
        (lambda b: b.arange(start=1, stop=4, dtype="float32"), np.arange(1.0, 4.0)),
    ],
)
def test_the_arange_kernel_writes_numpy_arange(build, want):
    b = GraphBuilder("g")
    build(b)
    (op,) = b.ops
    out = np.full(op.result.type.shape, 99, op.result.type.dtype)
    hexir.build(lower_op(op), "cpu")(out)
    np.testing.assert_array_equal(out, want)


def test_the_broadcast_to_kernel_matches_numpy(rng):
    b = GraphBuilder("g")
    b.broadcast_to(b.input("x", (3, 1)), shape=(2, 3, 4))
    x = rng.standard_normal((3, 1)).astype(np.float32)
    out = np.zeros((2, 3, 4), np.float32)
    hexir.build(lower_op(b.ops[-1]), "cpu")(x, out)
    np.testing.assert_array_equal(out, np.broadcast_to(x, (2, 3, 4)))
