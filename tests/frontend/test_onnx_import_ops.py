"""ONNX import of ArgMax and ArgMin, Einsum, LRN and ConvTranspose: each imported model
computes what onnx's reference evaluator computes on fresh random inputs, evaluated and
compiled for the CPU, and unsupported attribute values are refused naming them."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from seeding import current_rng
from test_onnx_import import kinds, model

import hexir
from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate


def compiled_agrees(proto, inputs: list[np.ndarray], rtol=1e-5, atol=1e-5):
    """Import; the evaluated and the CPU-compiled graph agree with the reference evaluator on
    `inputs`; the imported graph."""
    graph = import_onnx(proto)
    initialized = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initialized]
    want = ReferenceEvaluator(proto).run(None, dict(zip(names, inputs, strict=True)))
    module = hexir.compile(graph, target="cpu")
    for got in (evaluate(graph, inputs), module.run(inputs)):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return graph


def uniform(*shape: int) -> np.ndarray:
    return current_rng().uniform(-2, 2, shape).astype(np.float32)


# --- ArgMax, ArgMin ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1},
                                   {"axis": 2, "select_last_index": 1},
                                   {"axis": 0, "keepdims": 0, "select_last_index": 1}])  # fmt: skip
def test_arg_max_and_min_are_one_op_of_int64_indices(op, attrs):
    proto = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", [3, 4, 5])], ["y"])
    x = (current_rng().integers(-2, 3, (3, 4, 5)) * 0.75).astype(np.float32)  # many ties
    graph = compiled_agrees(proto, [x])
    assert kinds(graph) == {op.lower(): 1}
    assert graph.outputs[0].type.dtype == "int64"


def test_arg_max_of_ints_feeds_a_gather():
    """Greedy decoding's pattern: the index of the largest logit picks an embedding row."""
    nodes = [
        helper.make_node("ArgMax", ["logits"], ["token"], axis=-1, keepdims=0),
        helper.make_node("Gather", ["table", "token"], ["y"], axis=0),
    ]
    table = current_rng().uniform(-1, 1, (7, 3)).astype(np.float32)
    proto = model(nodes, [("logits", [2, 7], TensorProto.INT32)], ["y"], [("table", table)])
    compiled_agrees(proto, [current_rng().integers(-9, 10, (2, 7)).astype(np.int32)])


def test_arg_max_refuses_a_keepdims_it_does_not_know():
    proto = model([helper.make_node("ArgMax", ["x"], ["y"], keepdims=2)], [("x", [3, 4])], ["y"])
    with pytest.raises(ModelError, match="keepdims"):
        import_onnx(proto)


# --- Einsum -----------------------------------------------------------------------------------

EINSUM = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], {"batch_matmul": 1}),
    ("bhid,bhjd->bhij", [(2, 3, 4, 8), (2, 3, 5, 8)], {"batch_matmul": 1}),  # attention scores
    ("bhij,bhjd->bhid", [(2, 3, 4, 5), (2, 3, 5, 8)], {"batch_matmul": 1}),
    ("bqhd,bkhd->bhqk", [(2, 4, 3, 8), (2, 5, 3, 8)], {"batch_matmul": 1}),
    ("ij,jk->ik", [(3, 4), (4, 5)], {"matmul": 1}),
    ("ij,jk", [(3, 4), (4, 5)], {"matmul": 1}),  # implicit output: ik
    ("ij,kj->ik", [(3, 4), (5, 4)], {"dense": 1}),  # a Linear's x · wᵀ
    ("ji,jk->ik", [(4, 3), (4, 5)], {"matmul": 1}),
    ("ij->ji", [(3, 4)], {"transpose": 1}),
    ("ij", [(3, 4)], {}),  # implicit: the identity
    ("ji", [(3, 4)], {"transpose": 1}),  # implicit: the letters sorted, so a transpose
    ("i,j->ij", [(3,), (4,)], {"mul": 1}),
    ("bi,bj->bij", [(2, 3), (2, 4)], {"mul": 1}),
    ("ij,ij->ij", [(3, 4), (3, 4)], {"mul": 1}),
    ("bij->bj", [(2, 3, 4)], {"reduce_sum": 1}),
    ("ij->", [(3, 4)], {"reduce_sum": 1}),
    ("i,i", [(5,), (5,)], {"dense": 1}),
    ("ii->i", [(4, 4)], {"slice": 1}),
    ("bii->b", [(2, 4, 4)], {"slice": 1, "reduce_sum": 1}),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 6)], {"batch_matmul": 1}),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)], {"matmul": 1}),  # 1 broadcasts to 5
    ("b...d,bd->b...", [(2, 3, 4, 5), (2, 5)], {"batch_matmul": 1}),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 6)], {"matmul": 2}),
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 3)], {"batch_matmul": 2}),
    ("ijk,jl->il", [(3, 4, 5), (4, 6)], {"reduce_sum": 1, "matmul": 1}),  # k summed first
]


@pytest.mark.parametrize("equation,shapes,contractions", EINSUM)
def test_einsum_of_the_equations_models_use(equation, shapes, contractions):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    proto = model([node], list(zip(names, shapes, strict=True)), ["y"])
    graph = compiled_agrees(proto, [uniform(*s) for s in shapes], rtol=1e-5, atol=1e-5)
    counted = {k: n for k, n in kinds(graph).items() if k not in ("reshape", "transpose")}
    want = {k: n for k, n in contractions.items() if k != "transpose"}
    assert counted == want, kinds(graph)
    if contractions.get("transpose"):
        assert kinds(graph)["transpose"] == contractions["transpose"]


def test_einsum_of_ints():
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")
    proto = model([node], [("a", [3, 4], TensorProto.INT64), ("b", [4, 2], TensorProto.INT64)],
                  ["y"])  # fmt: skip
    rng = current_rng()
    compiled_agrees(proto, [rng.integers(-5, 6, s).astype(np.int64) for s in ((3, 4), (4, 2))])


@pytest.mark.parametrize("equation,shapes,why", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "label 'j' has sizes"),
    ("ij->ik", [(3, 4)], "output"),
    ("ijk->i", [(3, 4)], "term 'ijk'"),
    ("i,j,k", [(3,), (4,)], "for 2 operand"),
])  # fmt: skip
def test_einsum_refuses_what_it_cannot_mean(equation, shapes, why):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    proto = model([node], list(zip(names, shapes, strict=True)), ["y"])
    with pytest.raises(ModelError, match=why):
        import_onnx(proto)


# --- LRN --------------------------------------------------------------------------------------


def lrn(x: np.ndarray, size: int, alpha=1e-4, beta=0.75, bias=1.0) -> np.ndarray:
    """ONNX's LRN, written from its definition in float64 (onnx's reference evaluator loops
    over the batch where it means the channels, so it is right only where N = C)."""
    x64, c = x.astype(np.float64), x.shape[1]
    square_sum = np.zeros_like(x64)
    for k in range(c):
        lo, hi = max(0, k - (size - 1) // 2), min(c, k + -(-(size - 1) // 2) + 1)
        square_sum[:, k] = (x64[:, lo:hi] ** 2).sum(axis=1)
    return (x64 / (bias + alpha / size * square_sum) ** beta).astype(x.dtype)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 7, 5, 4), {"size": 5}),  # AlexNet's
    ((2, 7, 5, 4), {"size": 2, "alpha": 0.5, "beta": 0.6, "bias": 2.0}),  # an uneven window
    ((1, 6, 3, 3), {"size": 3, "alpha": 1e-3, "beta": 1.0}),
    ((2, 4, 9), {"size": 7, "alpha": 0.3, "bias": 1.5}),  # wider than the channels, 1-D
    ((3, 5), {"size": 1, "alpha": 2.0}),
])  # fmt: skip
def test_lrn_is_a_channel_window_of_squares(shape, attrs):
    proto = model([helper.make_node("LRN", ["x"], ["y"], **attrs)], [("x", list(shape))], ["y"])
    graph = import_onnx(proto)
    assert kinds(graph)["avg_pool2d"] == 1
    x = uniform(*shape)
    want = lrn(x, **attrs)
    for got in (evaluate(graph, [x])[0], hexir.compile(graph, target="cpu").run([x])[0]):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("base, exponent", [("int64", "int64"), ("int32", "float32")])
def test_an_integer_power_computes_in_float64_and_converts_toward_zero(base, exponent):
    rng = current_rng()
    x = rng.integers(-6, 7, (3, 5)).astype(base)
    y = (rng.integers(0, 6, (3, 5)) + (0.5 if exponent == "float32" else 0)).astype(exponent)
    elem = {"int64": TensorProto.INT64, "int32": TensorProto.INT32, "float32": TensorProto.FLOAT}
    inputs = [("x", [3, 5], elem[base]), ("y", [3, 5], elem[exponent])]
    proto = model([helper.make_node("Pow", ["x", "y"], ["z"])], inputs, ["z"], opset=18)
    graph = import_onnx(proto)
    # x ** 2.5 of a negative x is NaN, which converts as C converts (ONNX leaves it undefined)
    defined = (x >= 0) | (np.floor(y) == y)
    with np.errstate(invalid="ignore"):
        want = np.trunc(np.power(x.astype(np.float64), y.astype(np.float64)))
    for got in (evaluate(graph, [x, y])[0], hexir.compile(graph, target="cpu").run([x, y])[0]):
        assert got.dtype == np.dtype(base)
        np.testing.assert_array_equal(got[defined], want[defined].astype(base))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 6)])
def test_training_mode_batch_norm_uses_the_batch_statistics_and_updates_the_running_ones(shape):
    c = shape[1]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            training_mode=1, momentum=0.8, epsilon=1e-3)  # fmt: skip
    inputs = [("x", list(shape)), *((n, [c]) for n in "sbmv")]
    proto = model([node], inputs, ["y", "rm", "rv"], opset=15)
    graph = import_onnx(proto)
    args = [uniform(*shape), *(uniform(c) for _ in range(3)), np.abs(uniform(c)) + 0.5]
    want = ReferenceEvaluator(proto).run(None, dict(zip("xsbmv", args, strict=True)))
    for got in (evaluate(graph, args), hexir.compile(graph, target="cpu").run(args)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 7, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "storage_order": 1}),
    ((1, 2, 6, 7), {"kernel_shape": [3, 2], "ceil_mode": 1, "strides": [2, 2]}),
    ((2, 2, 9), {"kernel_shape": [3], "pads": [1, 2], "dilations": [2]}),
])  # fmt: skip
def test_max_pool_gives_the_index_of_each_windows_first_largest_element(shape, attrs):
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    proto = model([node], [("x", list(shape))], ["y", "i"], opset=12)
    graph = import_onnx(proto)
    x = np.round(uniform(*shape) * 2) / 2  # ties: the first of them is the index
    want = ReferenceEvaluator(proto).run(None, {"x": x})
    for got in (evaluate(graph, [x]), hexir.compile(graph, target="cpu").run([x])):
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1].dtype == np.int64
        np.testing.assert_array_equal(got[1], want[1])


def test_lrn_of_ints_is_refused():
    node = helper.make_node("LRN", ["x"], ["y"], size=3)
    proto = model([node], [("x", [1, 3, 2, 2], TensorProto.INT32)], ["y"])
    with pytest.raises(ModelError, match="LRN of size 3"):
        import_onnx(proto)


# --- ConvTranspose ----------------------------------------------------------------------------

CONV_TRANSPOSE = [
    ((1, 3, 4, 5), (3, 2, 3, 3), {}),
    ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [2, 2]}),  # a decoder's 2x upsampling
    ((2, 3, 4, 5), (3, 4, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # DCGAN's
    (
        (1, 2, 3, 4),
        (2, 3, 3, 2),
        {"strides": [3, 2], "pads": [1, 0, 2, 1], "output_padding": [1, 1]},
    ),
    ((1, 2, 5, 4), (2, 2, 3, 3), {"pads": [3, 2, 3, 2]}),  # pads past the reach: a crop
    ((1, 2, 4, 4), (2, 3, 3, 2), {"dilations": [2, 3], "strides": [2, 1]}),
    ((2, 4, 3, 3), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
    ((1, 6, 3, 4), (6, 1, 2, 2), {"group": 6, "strides": [2, 2]}),  # depthwise
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ((1, 2, 4, 5), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [6, 7]}),  # pads split
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 3), (2, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 7), (3, 2, 3), {"strides": [2], "pads": [1, 0], "output_padding": [1]}),  # 1-D
    ((1, 1, 3, 4, 5), (1, 2, 3, 3, 3), {}),  # 3-D, as the ONNX node case
    (
        (2, 3, 3, 4, 3),
        (3, 2, 2, 3, 2),
        {"strides": [2, 1, 3], "pads": [1, 0, 0, 0, 1, 1], "output_padding": [1, 0, 2]},
    ),
    ((1, 4, 3, 3, 4), (4, 3, 3, 2, 2), {"group": 2, "dilations": [2, 1, 2], "strides": [1, 2, 1]}),
    ((1, 2, 2, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 2, 2], "output_shape": [5, 7, 6]}),
    ((1, 2, 3, 2, 2), (2, 1, 3, 2, 2), {"strides": [2, 1, 1], "auto_pad": "SAME_LOWER"}),
]


def onnxruntime_agrees(proto, inputs: list[np.ndarray], rtol=1e-5, atol=1e-5):
    """As `compiled_agrees`, with onnxruntime's answer: onnx's reference evaluator computes
    ConvTranspose of groups, or of an output_shape that the pads must shrink to, wrongly."""
    import onnxruntime as ort

    graph = import_onnx(proto)
    names = [
        i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}
    ]
    typed = copy.deepcopy(proto)  # onnxruntime wants the outputs' element type
    for output in typed.graph.output:
        output.type.tensor_type.elem_type = TensorProto.FLOAT
    session = ort.InferenceSession(typed.SerializeToString())
    want = session.run(None, dict(zip(names, inputs, strict=True)))
    for got in (evaluate(graph, inputs), hexir.compile(graph, target="cpu").run(inputs)):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return graph


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_TRANSPOSE)
@pytest.mark.parametrize("weight", ["constant", "input"])
def test_conv_transpose_is_a_conv_of_the_spread_input(x_shape, w_shape, attrs, weight):
    m = w_shape[1] * attrs.get("group", 1)
    bias = current_rng().uniform(-1, 1, m).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    x, w = uniform(*x_shape), uniform(*w_shape)
    if weight == "constant":
        proto = model([node], [("x", list(x_shape))], ["y"], [("w", w), ("b", bias)])
        inputs = [x]
    else:
        proto = model([node], [("x", list(x_shape)), ("w", list(w_shape))], ["y"], [("b", bias)])
        inputs = [x, w]
    graph = onnxruntime_agrees(proto, inputs)
    (conv,) = [op for op in graph.ops if op.kind == "conv2d"]
    weight_is_constant = conv.operands[1].name in dict(graph.constants)
    assert weight_is_constant == (weight == "constant")  # reversed at import, not by ops


def test_conv_transpose_refuses_a_same_output_past_the_natural_one():
    """auto_pad SAME asks for input * stride, past what a stride 3 and a kernel 2 reach:
    onnx's reference grows the output to it, onnxruntime keeps the shorter natural one."""
    node = helper.make_node(
        "ConvTranspose", ["x", "w"], ["y"], strides=[3, 3], auto_pad="SAME_UPPER"
    )
    proto = model([node], [("x", [1, 2, 3, 3])], ["y"], [("w", uniform(2, 2, 2, 2))])
    with pytest.raises(ModelError, match="auto_pad SAME_UPPER and a stride past the kernel"):
        import_onnx(proto)


def test_conv_transpose_of_4d_images_is_refused():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"])
    proto = model([node], [("x", [1, 1, 2, 3, 4, 5])], ["y"], [("w", uniform(1, 2, 2, 2, 2, 2))])
    with pytest.raises(ModelError, match="1-D, 2-D and 3-D only"):
        import_onnx(proto)


# --- 1-D convs and pools, ceil_mode ------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs, w_shape",
    [({}, (6, 4, 3)), ({"pads": [1, 2], "strides": [2]}, (6, 4, 3)),
     ({"dilations": [2], "auto_pad": "SAME_UPPER"}, (6, 4, 3)),
     ({"group": 2, "pads": [2, 2]}, (6, 2, 5))],
)  # fmt: skip
def test_a_1d_conv_is_a_2d_conv_one_row_high(attrs, w_shape):
    """Audio front ends and causal convs: [N, C, L] computed as [N, C, 1, L], the result
    reshaped back (views, no copies); bias included."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)]
    inits = [("w", uniform(*w_shape)), ("b", uniform(w_shape[0]))]
    proto = model(nodes, [("x", [2, 4, 17])], ["y"], inits)
    graph = compiled_agrees(proto, [uniform(2, 4, 17)], rtol=1e-4, atol=1e-4)
    assert kinds(graph).get("conv2d") == 1


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    "attrs", [{"kernel_shape": [3]}, {"kernel_shape": [2], "strides": [2], "pads": [1, 1]}]
)
def test_a_1d_pool_is_a_2d_pool_one_row_high(op, attrs):
    proto = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", [1, 3, 15])], ["y"])
    compiled_agrees(proto, [uniform(1, 3, 15)])


@pytest.mark.parametrize("size, attrs", [
    (8, {"kernel_shape": [3, 3], "strides": [2, 2]}),  # 4 windows, not 3
    (8, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (5, {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # a 4th would
    # start on the trailing pad: 3
])  # fmt: skip
def test_a_max_pool_of_ceil_mode_pads_its_ends_with_minus_infinity(size, attrs):
    """ceil_mode=1 rounds the output length up: the ends padded with -inf, which never wins
    a max, unless that last window would start past the input and its leading pad."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], ceil_mode=1, **attrs)]
    proto = model(nodes, [("x", [1, 2, size, size])], ["y"])
    compiled_agrees(proto, [uniform(1, 2, size, size)])


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "pads": [0, 1, 1, 0]},  # uneven
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
])  # fmt: skip
def test_an_average_pool_hexir_windows_cannot_pad_divides_by_what_each_window_covers(
    attrs, include
):
    """Uneven pads and ceil_mode's extra windows: the window sums over the zero-padded image
    times a constant per position, the window's size over the elements it covers (the image,
    with count_include_pad also the given pads; never the ceil extension)."""
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=include, **attrs)
    proto = model([node], [("x", [1, 2, 8, 8])], ["y"])
    graph = compiled_agrees(proto, [uniform(1, 2, 8, 8)])
    assert kinds(graph).get("avg_pool2d") == 1
