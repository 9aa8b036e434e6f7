"""The text form of graphs: exact round trips, and parse errors with line, column and caret."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hexir.errors import ParseError
from hexir.ir.graph import Graph, TensorType
from hexir.ir.graph_text import print_graph, print_op, print_tensor_type
from hexir.ops.builder import GraphBuilder
from hexir.ops.parse import parse, parse_graph

RNG = np.random.default_rng(1)


def blobs(graph: Graph) -> dict[str, np.ndarray]:
    return {name: data.array for name, data in graph.constants}


def round_trip(graph: Graph) -> str:
    text = print_graph(graph)
    again = parse_graph(text, constants=blobs(graph))
    assert again == graph
    assert print_graph(again) == text
    assert parse(text, constants=blobs(graph)) == graph
    return text


def every_op_graph() -> Graph:
    b = GraphBuilder("every_op")
    x = b.input("x", (2, 4, 8, 8))
    w = b.constant(RNG.standard_normal((6, 2, 3, 3)).astype(np.float32), name="w_conv")
    y = b.conv2d(x, w, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    y = b.bias_add(y, b.constant(RNG.standard_normal(6).astype(np.float32)), axis=1)
    bn = [b.constant(np.full(6, v, np.float32)) for v in (1.5, 0.0, -0.25, 2.0)]
    y = b.batch_norm(y, *bn, epsilon=1e-3)
    y = b.max_pool2d(b.relu(y), kernel=2, stride=1, padding=(1, 0))
    y = b.avg_pool2d(y, kernel=(2, 3), placement="cuda:0")
    g = b.global_avg_pool2d(y, name="pooled")
    flat = b.reshape(g, (2, -1))
    m = b.input("m", (6, 5))
    z = b.matmul(flat, m)
    z = b.dense(z, b.input("wd", (3, 5)))
    z3 = b.reshape(z, (1, 2, 3))
    z3 = b.batch_matmul(z3, b.transpose(z3, perm=(0, 2, -2)))
    z = b.reshape(z3, (2, 2))
    for name in ("add", "sub", "mul", "div", "maximum", "minimum", "power"):
        z = getattr(b, name)(z, b.constant(np.float32(0.5)))
    for name in ("sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt"):
        z = getattr(b, name)(z)
    z = b.gelu(b.gelu(z), approximate="tanh")
    cond = b.less(z, b.constant([[1.0], [2.0]]))
    for name in ("equal", "not_equal", "less_equal", "greater", "greater_equal"):
        cond = b.maximum(cond, getattr(b, name)(z, z))
    z = b.where(cond, z, b.constant(np.array(np.inf, np.float32)))
    z = b.softmax(z, axis=0)
    z = b.layer_norm(z, b.input("gamma", (2,)), b.input("beta", (2,)), epsilon=1e-6)
    s = b.reduce_sum(z, axes=-1, keepdims=True)
    s = b.reduce_mean(s, axes=(0, 1))
    mx = b.reduce_max(z)
    c = b.concat([z, b.slice(z, (-1, None), (None, None), (-1, -1))], axis=-1)
    c = b.pad(c, before=(1, 0), after=(0, 2), value=-np.inf)
    i = b.cast(c, "int32", name="as_int")
    i = b.add(i, b.constant(np.arange(-3, 15, dtype=np.int32).reshape(3, 6)))
    return b.build([s, mx, b.cast(i, "bool"), b.input("unused", ())])


def test_every_op_round_trips() -> None:
    text = round_trip(every_op_graph())
    assert "@w_conv" in text and "%c12 = hexir.constant dense<[[1.0], [2.0]]>" in text
    assert "%c5 = hexir.constant dense<0.5> : tensor<f32>" in text
    assert "%c13 = hexir.constant dense<inf> : tensor<f32>" in text
    assert "stride = (2, 1), padding = (1, 1), dilation" not in text  # keys are sorted
    assert "{dilation = (1, 2), groups = 2, padding = (1, 1), placement" in text
    assert '{approximate = "tanh", placement = "cpu"}' in text
    assert '{after = (0, 2), before = (1, 0), placement = "cpu", value = -inf}' in text
    assert "%c14 = hexir.constant @c14 : tensor<3x6xi32>" in text  # 18 elements: by name
    assert text.endswith("  hexir.return %44, %45, %50, %unused\n}")


EXAMPLE = """\
hexir.graph @mlp(%x: tensor<64x784xf32>) -> tensor<64xf32> {
  %w0 = hexir.constant @w0 : tensor<784x256xf32>
  %0 = hexir.matmul %x, %w0 {placement = "cpu"} : tensor<64x256xf32>
  %1 = hexir.relu %0 {placement = "cpu"} : tensor<64x256xf32>
  %s = hexir.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %2 = hexir.reduce_sum %1 {axes = (1,), keepdims = false, placement = "cpu"} : tensor<64xf32>
  hexir.return %2
}"""


def test_the_design_example_parses_and_prints_back() -> None:
    w0 = RNG.standard_normal((784, 256)).astype(np.float32)
    graph = parse_graph(EXAMPLE, constants={"w0": w0})
    assert print_graph(graph) == EXAMPLE
    assert [op.kind for op in graph.ops] == ["constant", "matmul", "relu", "constant", "reduce_sum"]
    np.testing.assert_array_equal(graph.constant("s"), np.array([1.0, 2.0], np.float32))
    assert graph.constant("w0") is not w0 and np.array_equal(graph.constant("w0"), w0)
    assert repr(graph) == str(graph) == EXAMPLE


def test_lenient_input_parses_to_the_same_graph() -> None:
    lenient = """
    // the same graph, written by hand
    hexir.graph @mlp(%x: tensor<64x784xf32>)->tensor<64xf32>{
      %w0 = hexir.constant @w0 : tensor<784x256xf32>   // a blob
      %0 = hexir.matmul %x,%w0 : tensor<64x256xf32>
      %1 = hexir.relu %0 {} : tensor<64x256xf32>
      %s = hexir.constant dense<[1, 2.0]> : tensor<2xf32>
      %2 = hexir.reduce_sum %1 {placement="cpu", axes=(-1,)} : tensor<64xf32>
      hexir.return %2
    }
    """
    w0 = np.zeros((784, 256), np.float32)
    assert parse_graph(lenient, {"w0": w0}) == parse_graph(EXAMPLE, {"w0": w0})


@pytest.mark.parametrize(
    "array",
    [
        np.array([np.nan, np.inf, -np.inf, -0.0, 0.1, 1e-45, 3.4028235e38], np.float32),
        np.array([[0.1, 1 / 3], [2.5e-308, -1e300]], np.float64),
        np.array([0.1, 65504.0, 6e-8, -np.inf], np.float16),
        np.array([-(2**31), 2**31 - 1, 0], np.int32),
        np.array([[-(2**63)], [2**63 - 1]], np.int64),
        np.array([[True, False], [False, True]]),
        np.array(7, np.int64),
        np.array(False),
        np.zeros((0,), np.float32),
        np.zeros((2, 0, 3), np.int32),
        np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2),
    ],
)
def test_inline_constants_round_trip(array: np.ndarray) -> None:
    b = GraphBuilder("g")
    b.constant(array, name="k", placement="cuda:1")
    c = b.constant(array)
    text = round_trip(b.build(c))
    assert "@" not in text.split("{", 1)[1].replace("@k", "")  # inline, named only for k
    assert '{placement = "cuda:1"}' in text


def test_random_floats_round_trip_exactly() -> None:
    b = GraphBuilder("bits")
    for dtype, bits in ((np.float32, np.uint32), (np.float16, np.uint16)):
        raw = RNG.integers(0, np.iinfo(bits).max, size=(200, 16), dtype=bits, endpoint=True)
        values = raw.view(dtype)
        values[~np.isfinite(values)] = 1.0  # nan payloads have no text form
        for row in values:
            b.constant(row)
    round_trip(b.build([]))


def test_constant_names() -> None:
    b = GraphBuilder("g")
    small = b.constant([1, 2], name="small")
    assert small.name == "small" and small.type == TensorType((2,), "int64")
    b.constant(np.ones(17, np.float32), name="big")
    b.constant([1.5, 2.5], name="named_small")
    op = b.ops[-1]
    op = type(op)(op.name, op.operands, op.result.__class__("other", op.result.type), op.attrs)
    graph = Graph("g", (), (*b.ops[:-1], op), (op.result,), tuple(b.constants))
    text = round_trip(graph)
    assert "%small = hexir.constant dense<[1, 2]> : tensor<2xi64>" in text
    assert "%big = hexir.constant @big : tensor<17xf32>" in text
    assert "%other = hexir.constant @named_small dense<[1.5, 2.5]> : tensor<2xf32>" in text
    assert print_op(b.ops[0]) == "%small = hexir.constant @small : tensor<2xi64>"


def test_several_zero_and_scalar_outputs() -> None:
    b = GraphBuilder("g")
    x = b.input("x", ())
    assert print_tensor_type(x.type) == "tensor<f32>"
    y = b.exp(x)
    assert "-> (tensor<f32>, tensor<f32>) {" in round_trip(b.build([x, y]))
    text = round_trip(b.build([]))
    assert "-> () {" in text and text.endswith("  hexir.return\n}")


def test_print_tensor_type() -> None:
    assert print_tensor_type(TensorType((64, 784), "float32")) == "tensor<64x784xf32>"
    assert print_tensor_type(TensorType((0, 3), "bool")) == "tensor<0x3xi1>"
    assert print_tensor_type(TensorType((5,), "int64")) == "tensor<5xi64>"


# --- errors ----------------------------------------------------------------------------------


def parse_error(text: str, constants=None) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_graph(text, constants=constants)
    e = info.value
    lines = str(e).splitlines()
    assert lines[1].strip() == e.source_line.strip() == text.splitlines()[e.line - 1].strip()
    assert lines[2].index("^") - 2 == e.column - 1  # the caret sits under the column
    assert pickle.loads(pickle.dumps(e)).column == e.column
    return e


def where(e: ParseError) -> tuple[int, int, str]:
    return e.line, e.column, e.source_line[e.column - 1 :]


SIMPLE = """\
hexir.graph @g(%x: tensor<2x3xf32>, %y: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = hexir.matmul %x, %y {placement = "cpu"} : tensor<2x4xf32>
  hexir.return %0
}"""


def test_simple_parses() -> None:
    assert print_graph(parse_graph(SIMPLE)) == SIMPLE


def test_unknown_op() -> None:
    e = parse_error(SIMPLE.replace("hexir.matmul", "hexir.matmull"))
    assert "unknown op 'hexir.matmull'" in e.message
    assert where(e)[:2] == (2, 8)


def test_result_type_disagrees_with_inference() -> None:
    e = parse_error(SIMPLE.replace(": tensor<2x4xf32>\n", ": tensor<2x5xf32>\n"))
    assert "hexir.matmul: the result type tensor<2x5xf32> disagrees" in e.message
    assert "inferred tensor<2x4xf32>" in e.message
    assert where(e) == (2, 50, "tensor<2x5xf32>")


def test_bad_operands_and_attributes_point_at_the_op() -> None:
    e = parse_error(SIMPLE.replace("%x, %y", "%y, %x"))
    assert e.message == "hexir.matmul: inner dimensions differ: a is 3x4, b is 2x3"
    assert where(e)[:2] == (2, 8)
    e = parse_error(SIMPLE.replace('{placement = "cpu"}', '{placement = "cpu", axis = 1}'))
    assert "unknown attribute(s) axis" in e.message
    e = parse_error(SIMPLE.replace('"cpu"}', "3}"))
    assert "placement must be a string" in e.message
    e = parse_error(SIMPLE.replace('"cpu"}', '"cpu", placement = "cpu"}'))
    assert "given twice" in e.message and where(e)[2].startswith('placement = "cpu"}')


def test_reduce_axes_out_of_range() -> None:
    text = EXAMPLE.replace("axes = (1,)", "axes = (2,)")
    e = parse_error(text, constants={"w0": np.zeros((784, 256), np.float32)})
    assert e.message == "hexir.reduce_sum: axis 2 is out of range for rank 2"
    assert where(e)[:2] == (6, 8)


def test_undefined_and_duplicate_values() -> None:
    e = parse_error(SIMPLE.replace("%x, %y", "%x, %z"))
    assert e.message == "%z is not defined"
    assert where(e) == (2, 25, '%z {placement = "cpu"} : tensor<2x4xf32>')
    e = parse_error(SIMPLE.replace("%0 =", "%x ="))
    assert e.message == "%x is defined twice" and where(e)[:2] == (2, 3)
    e = parse_error(SIMPLE.replace("return %0", "return %q"))
    assert e.message == "%q is not defined"


def test_return_must_match_the_signature() -> None:
    e = parse_error(SIMPLE.replace("return %0", "return %x"))
    assert "%x is tensor<2x3xf32>, the graph declares tensor<2x4xf32>" in e.message
    e = parse_error(SIMPLE.replace("return %0", "return %0, %x"))
    assert "returns 2 value(s), the graph declares 1" in e.message


def test_syntax_errors() -> None:
    e = parse_error(SIMPLE.replace("= hexir.matmul", "hexir.matmul"))
    assert e.message == "expected =, got 'hexir.matmul'" and where(e)[:2] == (2, 6)
    e = parse_error(SIMPLE.replace("tensor<3x4xf32>)", "tensor<3x4xf33>)"))
    assert "bad tensor type tensor<3x4xf33>" in e.message and where(e)[:2] == (1, 41)
    e = parse_error(SIMPLE.replace("%y {", "%y ? {"))
    assert e.message == "unexpected character '?'"
    e = parse_error(SIMPLE + "\nhexir.graph")
    assert e.message == "expected eof, got 'hexir.graph'" and e.line == 5
    e = parse_error(SIMPLE[:-1])
    assert e.message == "expected }, got 'end of input'"
    e = parse_error(SIMPLE.replace('"cpu"}', "(1, 2.5)}"))
    assert e.message == "expected an int, got '2.5'"


CONST = """\
hexir.graph @g() -> tensor<2x2xf32> {
  %c = hexir.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  hexir.return %c
}"""


def test_constant_errors() -> None:
    assert parse_graph(CONST).constant("c").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    e = parse_error(CONST.replace("[3.0, 4.0]]", "[3.0]]"))
    assert e.message == "the dense literal is ragged"
    e = parse_error(CONST.replace("tensor<2x2xf32>\n", "tensor<4xf32>\n"))
    assert e.message == "the dense literal is 2x2, the type is tensor<4xf32>"
    assert where(e)[:2] == (2, 29)
    e = parse_error(CONST.replace("xf32>", "xi32>"))
    assert e.message == "'1.0' is not a int32 value"
    e = parse_error(CONST.replace("dense<[[1.0, 2.0], [3.0, 4.0]]>", "@w"))
    assert e.message == "no data for constant @w; pass it in constants=" and where(e)[1] == 23
    e = parse_error(CONST.replace("dense<[[1.0, 2.0], [3.0, 4.0]]>", "@w"), {"w": np.ones(4)})
    assert "the data of @w is float64 of shape (4,), the text declares" in e.message
    too_big = CONST.replace("[[1.0, 2.0], [3.0, 4.0]]", "[[1, 2], [3, 4000000000]]")
    e = parse_error(too_big.replace("f32>", "i32>"))
    assert e.message == "a value of the dense literal does not fit int32"
    e = parse_error(CONST.replace("dense<", '{placement = "cpu"} dense<'))
    assert e.message.startswith("expected @name or dense<...>")
