"""Symbolic dimensions: their arithmetic, comparisons and text, in graphs' types."""

import numpy as np
import pytest

import hexir
from hexir.errors import ParseError, TypeInferenceError
from hexir.ir.graph import TensorType
from hexir.ir.symbolic import Sym, SymbolicError, format_dim, parse_dim
from hexir.ops.parse import parse_graph

SEQ, PAST = Sym.named("seq"), Sym.named("past")


def test_linear_arithmetic_keeps_symbols_and_cancels_to_numbers():
    assert str(SEQ + 1) == "seq + 1"
    assert str(2 * SEQ - 1) == "2*seq - 1"
    assert str(PAST + SEQ) == str(SEQ + PAST) == "past + seq"
    assert str(3 - SEQ) == "-seq + 3"
    assert (SEQ * 768) // 768 == SEQ
    assert (PAST + 1) - PAST == 1 and type((PAST + 1) - PAST) is int
    assert (2 * SEQ + 4) % 2 == 0
    assert np.prod((1, SEQ, 768)) == 768 * SEQ


@pytest.mark.parametrize(
    "bad",
    [
        lambda: SEQ * SEQ,  # not linear
        lambda: SEQ // 3,  # not exact for every size
        lambda: (SEQ + 1) % 2,
        lambda: int(SEQ),
        lambda: range(SEQ),
        lambda: SEQ > 2,  # true for some sizes only
        lambda: SEQ < PAST,
        lambda: SEQ / 2,
    ],
)
def test_what_needs_a_number_raises_symbolic_error(bad):
    with pytest.raises(SymbolicError, match="seq"):
        bad()


def test_comparisons_hold_for_every_size_of_at_least_one():
    assert SEQ >= 1 and SEQ > 0 and 1 <= SEQ and not SEQ < 1 and not SEQ <= 0
    assert SEQ + 1 > 1 and SEQ + PAST > SEQ and 3 - SEQ < 3
    assert SEQ == Sym.named("seq") and SEQ != 1 and hash(SEQ) == hash(Sym.named("seq"))


@pytest.mark.parametrize(
    "text, dim",
    [("64", 64), ("seq", SEQ), ("{seq}", SEQ), ("past + 1", PAST + 1), ("{2*seq - 1}", 2 * SEQ - 1),
     ("seq*3", 3 * SEQ), ("past + seq", PAST + SEQ), ("-seq + 4", 4 - SEQ)],
)  # fmt: skip
def test_dimensions_parse_and_print_back(text, dim):
    assert parse_dim(text) == dim
    assert parse_dim(format_dim(dim)) == dim


@pytest.mark.parametrize("text", ["a b", "seq +", "2x", "1.5", "", "{}", "seq ** 2"])
def test_bad_dimension_text_is_refused(text):
    with pytest.raises(SymbolicError, match="bad dimension"):
        parse_dim(text)


def test_tensor_types_take_symbols_and_strings():
    t = TensorType((1, "seq", 768))
    assert t.shape == (1, SEQ, 768) and t.symbolic and t.size == 768 * SEQ
    assert repr(t) == "tensor<1x{seq}x768xf32>"
    assert not TensorType((2, 3)).symbolic and TensorType((2, 3)).size == 6


def _graph():
    b = hexir.GraphBuilder("g")
    x = b.input("x", (1, "seq", 768))
    past = b.input("past", (1, "past", 64))
    w = b.constant(np.random.default_rng(0).standard_normal((768, 64)).astype(np.float32))
    y = b.softmax(b.relu(b.matmul(b.reshape(x, (-1, 768)), w)))
    both = b.concat([past, b.reshape(y, (1, -1, 64))], axis=1)
    return b.build(b.reshape(both, (-1, 64)))


def test_shape_inference_carries_symbols_through_reshape_and_concat():
    g = _graph()
    assert [op.result.type.shape for op in g.ops if op.kind != "constant"] == [
        (SEQ, 768), (SEQ, 64), (SEQ, 64), (SEQ, 64), (1, SEQ, 64), (1, PAST + SEQ, 64),
        (PAST + SEQ, 64),
    ]  # fmt: skip
    # a reshape keeps its symbolic extent as the -1 it was given: attributes are numbers
    assert g.ops[1].attr("shape") == (-1, 768)


def test_graph_text_round_trips_symbolic_types():
    g = _graph()
    text = str(g)
    assert "tensor<1x{past + seq}x64xf32>" in text
    assert parse_graph(text, {k: v.array for k, v in g.constants}) == g


@pytest.mark.parametrize(
    "text", ["tensor<1x{seq x2xf32>", "tensor<1x{-3}x2xf32>", "tensor<{a b}x2xf32>"]
)
def test_bad_symbolic_tensor_types_are_parse_errors(text):
    with pytest.raises(ParseError, match="bad tensor type"):
        parse_graph(f"hexir.graph @g(%x: {text}) -> {text} {{\n  hexir.return %x\n}}")


def test_an_op_that_needs_a_number_names_the_symbol():
    b = hexir.GraphBuilder("g")
    x = b.input("x", ("a", "b"))
    with pytest.raises(TypeInferenceError, match=r"hexir.add: shapes do not broadcast"):
        b.add(x, b.input("y", ("b", "a")))
    with pytest.raises(TypeInferenceError, match=r"\{a\}"):
        b.reshape(x, (3, -1))  # a*b / 3 is not exact for every size
    with pytest.raises(TypeInferenceError, match="bad graph input"):
        b.input("z", ("a b",))
