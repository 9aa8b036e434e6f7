"""ONNX import of hand-made models: each compared with onnx's reference evaluator on fresh
random inputs; unsupported nodes all listed in one error; static shapes required."""

from __future__ import annotations

import math
import pickle
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from seeding import current_rng

import hexir
from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate
from hexir.ir.op_attrs import NAME_RE

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), opset=17):
    """A model from (name, shape) or (name, shape, elem type) inputs (float32 by default),
    output names and (name, array) initializers."""
    infos = [helper.make_tensor_value_info(i[0], i[2] if len(i) > 2 else F, i[1]) for i in inputs]
    graph = helper.make_graph(
        nodes,
        "test",
        infos,
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def agrees(proto, rtol=1e-5, atol=1e-5):
    """Import, evaluate on fresh random inputs and compare with the reference evaluator; the
    imported graph."""
    graph = import_onnx(proto)
    arrays = [current_rng().uniform(-2, 2, v.type.shape).astype(v.type.dtype) for v in graph.inputs]
    initialized = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initialized]
    want = ReferenceEvaluator(proto).run(None, dict(zip(names, arrays, strict=True)))
    got = evaluate(graph, arrays)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return graph


def kinds(graph):
    return Counter(op.kind for op in graph.ops)


def w(*shape):
    return current_rng().uniform(-1, 1, shape).astype(np.float32)


def test_unsupported_nodes_are_all_listed():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("NonMaxSuppression", ["a"], ["b"], name="nms"),
        helper.make_node("Conv", ["a", "w"], ["c"], name="conv", foo=3),
        helper.make_node("AveragePool", ["y"], ["d"], name="pool", kernel_shape=[1, 1, 1, 1]),
        helper.make_node("Attention", ["a"], ["e"], name="fused", domain="com.microsoft"),
        helper.make_node("Reshape", ["a", "s"], ["f"], name="reshape"),
        helper.make_node("Add", ["b", "c"], ["g"], name="add"),  # fine, after broken inputs
        # inference mode: a running mean as output 1 is the spec's "invalid", never made
        helper.make_node("BatchNormalization", ["g", *["bn"] * 4], ["h", "mask"], name="drop"),
        helper.make_node("Unique", ["h"], ["i", "j"], name="unique"),
    ]
    proto = model(
        nodes,
        [("x", [1, 2, 4, 4]), ("s", [2], TensorProto.INT64), ("y", [1, 1, 2, 2, 2, 2])],
        ["d", "e", "f", "i", "mask"],
        [("w", w(2, 2, 1, 1)), ("bn", np.ones(2, np.float32))],
    )
    with pytest.raises(ModelError) as info:
        import_onnx(proto)
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "node 'nms' (NonMaxSuppression)",
        "node 'conv' (Conv)",
        "node 'pool' (AveragePool)",
        "node 'fused' (Attention)",
        "node 'reshape' (Reshape)",
        "node 'drop' (BatchNormalization)",
        "node 'unique' (Unique)",
    ]
    text = str(info.value)
    for what in (
        "op type not supported",
        "'foo'",
        "only 1-D, 2-D and 3-D pools",
        "'com.microsoft'",
        "must be a constant",
        "output 1 ('mask')",
    ):
        assert what in text
    assert pickle.loads(pickle.dumps(info.value)).problems == problems


def test_a_runtime_value_is_looked_into_once_however_many_paths_reach_it():
    # A Reshape's shape made by 40 doublings of an input (each Add reads the last twice):
    # whether it is a constant was decided along every path, 2^40 of them, where a 12-layer
    # quantized GPT-2 had taken minutes; now each value once, and the refusal comes at once.
    nodes, last = [], "s"
    for i in range(40):
        nodes.append(helper.make_node("Add", [last, last], [f"t{i}"]))
        last = f"t{i}"
    nodes.append(helper.make_node("Reshape", ["x", last], ["y"]))
    proto = model(nodes, [("x", [2, 3]), ("s", [2], TensorProto.INT64)], ["y"])
    with pytest.raises(ModelError, match="must be a constant"):
        import_onnx(proto)


def test_symbolic_dims_need_input_shapes():
    proto = model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Add", ["y", "z"], ["out"])],
        [("x", ["batch", 4]), ("z", [None, 4])],
        ["out"],
    )
    with pytest.raises(ModelError, match="input_shapes") as info:
        import_onnx(proto)
    assert len(info.value.problems) == 2 and "'batch'" in info.value.problems[0]
    graph = import_onnx(proto, input_shapes={"x": (3, 4), "z": (3, 4)})
    assert graph.outputs[0].type.shape == (3, 4)


def test_an_old_opset_the_converter_cannot_convert_is_refused_saying_why():
    node = helper.make_node("Upsample", ["x", "scales"], ["y"])  # scales: an undefined input
    proto = model([node], [("x", [1, 1, 2, 2])], ["y"], opset=9)
    with pytest.raises(ModelError, match="opset 9; .*13-23.*could not convert it to 13"):
        import_onnx(proto)


def test_names_are_cleaned():
    nodes = [helper.make_node("Relu", ["input:0"], ["/block/relu/Relu_output_0"], name="/r")]
    nodes.append(helper.make_node("Neg", ["/block/relu/Relu_output_0"], ["out put"]))
    graph = agrees(model(nodes, [("input:0", [3])], ["out put"]))
    names = [graph.inputs[0].name] + [op.result.name for op in graph.ops]
    assert all(NAME_RE.fullmatch(n) for n in names)
    assert graph.inputs[0].name == "input_0" and graph.outputs[0].name == "out_put"
    assert "block_relu_Relu_output_0" in names


@pytest.mark.parametrize("op, dtype", [("MaxPool", np.int8), ("MaxPool", np.float32),
                                       ("AveragePool", np.float32)])  # fmt: skip
def test_a_dilated_pool_is_strided_slices_combined(op, dtype):
    # 3x3 windows with dilation 2, stride 2, uneven pads and ceil_mode: the int8 max pads
    # with -128 (no -inf), the average divides each output by the elements it covers.
    attrs = {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [2, 2],
             "pads": [1, 0, 2, 1], "ceil_mode": 1}  # fmt: skip
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    proto = model([node], [("x", [1, 2, 9, 10], elem)], ["y"], opset=19)
    graph = import_onnx(proto)
    x = current_rng().integers(-100, 100, (1, 2, 9, 10)).astype(dtype)
    want = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    got = evaluate(graph, [x])[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(hexir.compile(graph).run([x])[0], want, rtol=1e-6)


def test_pytorch_style_gelu_is_one_op():
    c = {
        n: numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))
    }
    nodes = [helper.make_node("Constant", [], [n], value=t) for n, t in c.items()]
    nodes += [
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["one", "e"], ["a"]),
        helper.make_node("Mul", ["x", "half"], ["h"]),
        helper.make_node("Mul", ["h", "a"], ["y"]),
    ]
    graph = agrees(model(nodes, [("x", [4, 6])], ["y"]))
    assert kinds(graph) == Counter(gelu=1)


def test_gelu_pattern_with_a_shared_inside_is_left_alone():
    nodes = [
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["x", "a"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]
    consts = [
        (n, np.array(v, np.float32))
        for n, v in (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))
    ]
    graph = agrees(model(nodes, [("x", [5])], ["y", "e"], consts))  # e is also an output
    assert kinds(graph)["gelu"] == 0 and kinds(graph)["erf"] == 1


def test_gelu_op_of_opset_20():
    nodes = [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")]
    graph = import_onnx(model(nodes, [("x", [3, 4])], ["y"], opset=20))
    assert [(op.kind, op.attr("approximate")) for op in graph.ops] == [("gelu", "tanh")]


@pytest.mark.parametrize(
    "a, b",
    [
        ((4, 5), (5, 3)),
        ((2, 1, 4, 5), (3, 5, 6)),
        ((2, 4, 5), (5, 3)),
        ((5,), (5, 3)),
        ((2, 4, 5), (5,)),
        ((4, 5), (2, 5, 3)),
    ],
)
def test_matmul_broadcasts_like_numpy(a, b):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    graph = agrees(model(nodes, [("a", list(a)), ("b", list(b))], ["y"]))
    assert graph.outputs[0].type.shape == np.matmul(np.empty(a), np.empty(b)).shape


@pytest.mark.parametrize(
    "trans_a, trans_b, alpha, beta, c_shape",
    [(0, 1, 1.0, 1.0, (3,)), (1, 0, 0.5, 2.0, (4, 3)), (0, 0, 1.0, 1.0, None)],
)
def test_gemm(trans_a, trans_b, alpha, beta, c_shape):
    a_shape = (5, 4) if trans_a else (4, 5)
    b_shape = (3, 5) if trans_b else (5, 3)
    inits = [("b", w(*b_shape))] + ([("c", w(*c_shape))] if c_shape else [])
    node = helper.make_node(
        "Gemm",
        ["a", "b"] + (["c"] if c_shape else []),
        ["y"],
        transA=trans_a,
        transB=trans_b,
        alpha=alpha,
        beta=beta,
    )
    graph = agrees(model([node], [("a", list(a_shape))], ["y"], inits))
    if c_shape == (3,) and trans_b:
        assert kinds(graph) == Counter(constant=2, dense=1, bias_add=1)


def test_conv_same_padding_and_bias():
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])
    graph = agrees(model([node], [("x", [1, 3, 8, 8])], ["y"], [("w", w(4, 3, 3, 3)), ("b", w(4))]))
    assert graph.outputs[0].type.shape == (1, 4, 4, 4)
    assert kinds(graph)["pad"] == 1 and kinds(graph)["bias_add"] == 1  # uneven 'same' pads


def test_batch_norm_and_pools():
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
        helper.make_node(
            "MaxPool", ["n"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]
        ),
        helper.make_node(
            "AveragePool", ["n"], ["q"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1
        ),
        helper.make_node("AveragePool", ["n"], ["r"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["n"], ["g"]),
        helper.make_node("GlobalMaxPool", ["n"], ["h"]),
    ]
    inits = [("s", w(3)), ("b", w(3)), ("m", w(3)), ("v", w(3) + 2)]
    graph = agrees(model(nodes, [("x", [2, 3, 6, 6])], list("pqrgh"), inits))
    (norm,) = [op for op in graph.ops if op.kind == "batch_norm"]
    assert norm.attr("epsilon") == 1e-3  # the float32 attribute read back as written


def test_shape_arithmetic_becomes_static():
    """PyTorch's Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) chain."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
        helper.make_node("Flatten", ["x"], ["f"], axis=2),
        helper.make_node("Squeeze", ["u"], ["sq"]),
        helper.make_node("Unsqueeze", ["x", "axes2"], ["un"]),
        helper.make_node("Reshape", ["x", "shape0"], ["z"]),
    ]
    inits = [
        ("zero", np.array(0, np.int64)),
        ("axes", np.array([0], np.int64)),
        ("minus1", np.array([-1], np.int64)),
        ("axes2", np.array([0, -1], np.int64)),
        ("shape0", np.array([0, -1], np.int64)),
    ]
    graph = agrees(
        model(nodes, [("x", [2, 3, 4]), ("u", [1, 5, 1])], ["y", "f", "sq", "un", "z"], inits)
    )
    assert [v.type.shape for v in graph.outputs] == [
        (2, 12),
        (6, 4),
        (5,),
        (1, 2, 3, 4, 1),
        (2, 12),
    ]
    assert set(kinds(graph)) == {"reshape"}  # the shape arithmetic left no op behind


def test_slices_splits_gathers():
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["a"]),
        helper.make_node("Slice", ["x", "st2", "en2"], ["b"]),
        helper.make_node("Split", ["x", "parts"], ["c1", "c2"], axis=1),
        helper.make_node("Gather", ["x", "idx"], ["g1"], axis=2),
        helper.make_node("Gather", ["x", "idx2"], ["g2"], axis=0),
        helper.make_node("Gather", ["x", "scalar"], ["g3"], axis=1),
    ]
    inits = [
        ("st", i64(-1, 0)),
        ("en", i64(np.iinfo(np.int64).min, 10)),
        ("ax", i64(2, 1)),
        ("sp", i64(-2, 3)),
        ("st2", i64(1)),
        ("en2", i64(-1)),
        ("parts", i64(2, 4)),
        ("idx", i64(0, 2, 3)),
        ("idx2", i64([-1, 0], [1, 1])),
        ("scalar", i64(-2)),
    ]
    graph = agrees(
        model(nodes, [("x", [3, 6, 5])], ["a", "b", "c1", "c2", "g1", "g2", "g3"], inits)
    )
    assert graph.outputs[5].type.shape == (2, 2, 6, 5)


def test_split_by_num_outputs_of_opset_18():
    node = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0, num_outputs=3)
    graph = agrees(model([node], [("x", [8, 2])], ["a", "b", "c"], opset=18))
    assert [v.type.shape[0] for v in graph.outputs] == [3, 3, 2]


def test_reductions_before_and_after_opset_18():
    for opset in (13, 18):
        axes = {} if opset >= 18 else {"axes": [1]}
        inputs = ["x", "axes"] if opset >= 18 else ["x"]
        nodes = [
            helper.make_node("ReduceMean", inputs, ["m"], keepdims=0, **axes),
            helper.make_node("ReduceMax", inputs, ["n"], **axes),
            helper.make_node("ReduceSum", ["x", "axes"], ["s"]),
            helper.make_node("ReduceSum", ["x"], ["t"], keepdims=0),
        ]
        inits = [("axes", np.array([1], np.int64))]
        graph = agrees(model(nodes, [("x", [3, 4, 2])], ["m", "n", "s", "t"], inits, opset))
        assert [v.type.shape for v in graph.outputs] == [(3, 2), (3, 1, 2), (3, 1, 2), ()]


def test_elementwise_zoo():
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
        helper.make_node("Greater", ["x", "y"], ["gt"]),
        helper.make_node("Not", ["gt"], ["ngt"]),
        helper.make_node("Where", ["ngt", "x", "y"], ["wh"]),
        helper.make_node("Or", ["gt", "ngt"], ["or"]),
        helper.make_node("Abs", ["x"], ["abs"]),
        helper.make_node("Reciprocal", ["y"], ["rec"]),
        helper.make_node("Pow", ["y", "two"], ["pow"]),
        helper.make_node("Max", ["x", "y", "clip"], ["max"]),
        helper.make_node("Sum", ["x", "y", "clip"], ["sum"]),
        helper.make_node("Softmax", ["x"], ["sm"], axis=0),
        helper.make_node("Cast", ["x"], ["int"], to=TensorProto.INT32),
        helper.make_node("Expand", ["z", "shape"], ["ex"]),
        helper.make_node("Pad", ["x", "pads", "val", "pad_axes"], ["pad"]),
        helper.make_node("Identity", ["x"], ["id"]),
    ]
    inits = [
        ("lo", np.array(-0.5, np.float32)),
        ("hi", np.array(0.7, np.float32)),
        ("two", np.array(2, np.int64)),
        ("shape", np.array([2, 3, 4], np.int64)),
        ("pads", np.array([1, 2], np.int64)),
        ("val", np.array(3.0, np.float32)),
        ("pad_axes", np.array([-1], np.int64)),
    ]
    outputs = [
        "clip",
        "wh",
        "or",
        "abs",
        "rec",
        "pow",
        "max",
        "sum",
        "sm",
        "int",
        "ex",
        "pad",
        "id",
    ]
    agrees(model(nodes, [("x", [3, 4]), ("y", [3, 4]), ("z", [3, 1])], outputs, inits, 18))


def test_layer_norm_and_softmax_attention():
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
        helper.make_node("Reshape", ["n", "heads"], ["r"]),
        helper.make_node("Transpose", ["r"], ["q"], perm=[1, 0, 2]),
        helper.make_node("Transpose", ["r"], ["k"], perm=[1, 2, 0]),
        helper.make_node("MatMul", ["q", "k"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"]),
        helper.make_node("MatMul", ["p", "q"], ["y"]),
    ]
    inits = [("g", w(8)), ("b", w(8)), ("heads", np.array([5, 2, 4], np.int64))]
    graph = agrees(model(nodes, [("x", [5, 8])], ["y"], inits))
    assert kinds(graph)["batch_matmul"] == 2 and kinds(graph)["layer_norm"] == 1


@pytest.mark.parametrize(
    "shape,scale,attrs",
    [
        ((4, 768), (768,), {}),
        ((197, 768), (768,), {"axis": -1, "epsilon": 1e-6}),
        ((2, 3, 8), (1, 8), {"axis": -2, "epsilon": 1e-3, "stash_type": 1}),  # broadcast scale
        ((2, 3, 8), (3, 8), {"axis": 1}),
    ],
)
def test_rms_normalization_of_opset_23(shape, scale, attrs):
    import onnxruntime as ort

    nodes = [
        helper.make_node("Add", ["x", "r"], ["h"]),
        helper.make_node("RMSNormalization", ["h", "s"], ["y"], **attrs),
    ]
    proto = model(nodes, [("x", list(shape)), ("r", list(shape))], ["y"], [("s", w(*scale))], 23)
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, list(shape)))
    onnx.checker.check_model(proto, full_check=True)
    graph = agrees(proto)
    assert kinds(graph)["rms_norm"] == 1
    (op,) = [op for op in graph.ops if op.kind == "rms_norm"]
    assert op.attr("axis") == attrs.get("axis", -1) % len(shape)
    assert op.attr("epsilon") == pytest.approx(attrs.get("epsilon", 1e-5))
    x, r = (current_rng().uniform(-2, 2, shape).astype(np.float32) for _ in range(2))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x, "r": r})
    np.testing.assert_allclose(evaluate(graph, [x, r])[0], want, rtol=1e-5, atol=1e-5)


def test_rms_norm_exports_as_opset_17_arithmetic_and_imports_back(rng):
    from hexir.frontend.onnx_export import export_onnx
    from hexir.ops.builder import GraphBuilder

    b = GraphBuilder("rms")
    x = b.input("x", (197, 768))
    graph = b.build(b.rms_norm(x, b.constant(w(768)), epsilon=1e-6))
    exported = export_onnx(graph)
    assert [n.op_type for n in exported.graph.node] == [
        *("Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul")
    ]
    back = import_onnx(exported)
    assert [op.kind for op in back.ops if op.kind != "constant"] == [
        *("mul", "reduce_mean", "add", "sqrt", "div", "mul")
    ]
    inputs = [rng.uniform(-2, 2, (197, 768)).astype(np.float32)]
    np.testing.assert_allclose(evaluate(back, inputs)[0], evaluate(graph, inputs)[0], rtol=1e-5)


@pytest.mark.parametrize(
    "shape,attrs,opset",
    [
        ((4, 1000), {}, 13),
        ((197, 197), {"axis": -1}, 17),
        ((2, 5, 7), {"axis": 1}, 17),  # not the last axis
        ((3, 4, 5), {"axis": 0}, 23),
    ],
)
def test_log_softmax(shape, attrs, opset):
    import onnxruntime as ort

    nodes = [
        helper.make_node("Add", ["x", "r"], ["h"]),
        helper.make_node("LogSoftmax", ["h"], ["y"], **attrs),
    ]
    proto = model(nodes, [("x", list(shape)), ("r", list(shape))], ["y"], opset=opset)
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, list(shape)))
    onnx.checker.check_model(proto, full_check=True)
    graph = agrees(proto)
    assert kinds(graph)["log_softmax"] == 1
    (op,) = [op for op in graph.ops if op.kind == "log_softmax"]
    axis = attrs.get("axis", -1) % len(shape)
    assert op.attr("axis") == axis
    # Logits up to ±100: onnx's reference evaluator takes the log of a softmax that underflows
    # to 0 there (-inf); ONNX Runtime and Hexir subtract the max and stay finite.
    x, r = (current_rng().uniform(-50, 50, shape).astype(np.float32) for _ in range(2))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x, "r": r})
    (got,) = evaluate(graph, [x, r])
    h = (x + r).astype(np.float64)
    mx = h.max(axis=axis, keepdims=True)
    exact = h - mx - np.log(np.exp(h - mx).sum(axis=axis, keepdims=True))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_log_softmax_exports_as_log_softmax_and_imports_back(rng):
    from hexir.frontend.onnx_export import export_onnx
    from hexir.ops.builder import GraphBuilder

    b = GraphBuilder("logits")
    x = b.input("x", (3, 197, 5))
    graph = b.build(b.log_softmax(x, axis=1))
    exported = export_onnx(graph)
    (node,) = exported.graph.node
    assert node.op_type == "LogSoftmax" and helper.get_attribute_value(node.attribute[0]) == 1
    back = import_onnx(exported)
    assert [(op.kind, dict(op.attrs)) for op in back.ops] == [("log_softmax", {"axis": 1})]
    inputs = [rng.uniform(-80, 80, (3, 197, 5)).astype(np.float32)]
    np.testing.assert_array_equal(evaluate(back, inputs)[0], evaluate(graph, inputs)[0])


def test_initializers_become_named_constants():
    nodes = [helper.make_node("MatMul", ["x", "layer.weight"], ["y"])]
    graph = import_onnx(
        model(nodes, [("x", [2, 3])], ["y"], [("layer.weight", w(3, 4)), ("unused", w(2))])
    )
    assert [name for name, _ in graph.constants] == ["layer.weight"]


def test_onnx_file_errors(tmp_path):
    with pytest.raises(ModelError, match="no such ONNX file"):
        import_onnx(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00 definitely not protobuf \xff" * 3)
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        import_onnx(bad)
    good = tmp_path / "good.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], ["y"]), good)
    assert import_onnx(good).ops[0].kind == "relu"


def test_odd_outputs_and_clashing_names():
    nodes = [
        helper.make_node("Add", ["a:b", "a/b"], ["sum"]),
        helper.make_node("Neg", ["a:b"], ["unused"]),  # dead: pruned
    ]
    proto = model(nodes, [("a:b", [3]), ("a/b", [3])], ["sum", "a:b", "c"], [("c", w(2))])
    graph = agrees(proto)
    assert [v.name for v in graph.inputs] == ["a_b", "a_b_1"]
    assert [v.name for v in graph.outputs] == ["sum", "a_b", "c"]
    assert kinds(graph) == Counter(add=1, constant=1)


def test_model_local_functions_are_inlined():
    square = helper.make_function(
        "local",
        "Square",
        ["v"],
        ["r"],
        [helper.make_node("Mul", ["v", "v"], ["r"])],
        [helper.make_opsetid("", 17)],
    )
    proto = model([helper.make_node("Square", ["x"], ["y"], domain="local")], [("x", [4])], ["y"])
    proto.functions.append(square)
    proto.opset_import.append(helper.make_opsetid("local", 1))
    graph = agrees(proto)
    assert kinds(graph) == Counter(mul=1)


def test_dropout_is_the_identity_in_inference_and_refused_in_training_mode():
    def dropout(training: bool):
        nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])]
        inits = [("ratio", np.array(0.5, np.float32)), ("training", np.array(training))]
        return model(nodes, [("x", [3, 4])], ["y"], inits)

    graph = agrees(dropout(False))  # the reference evaluator: the identity too
    assert kinds(graph) == Counter()
    with pytest.raises(ModelError, match="Dropout in training mode"):
        import_onnx(dropout(True))  # was run as the identity: a wrong answer


def test_constant_of_shape_is_folded_at_import():
    value = numpy_helper.from_array(np.array([2.5], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["c"], value=value),
        helper.make_node("Add", ["x", "c"], ["y"]),
        helper.make_node("ConstantOfShape", ["shape"], ["z"]),  # no value: float zeros
        helper.make_node("Mul", ["y", "z"], ["out"]),
    ]
    proto = model(nodes, [("x", [2, 3])], ["y", "out"], [("shape", np.array([2, 3], np.int64))])
    graph = agrees(proto)
    assert "constant_of_shape" not in kinds(graph)


def test_isnan_finds_the_nans_of_a_runtime_tensor():
    nodes = [helper.make_node("IsNaN", ["x"], ["m"]),
             helper.make_node("Where", ["m", "zero", "x"], ["y"])]  # fmt: skip
    proto = model(nodes, [("x", [2, 4])], ["m", "y"], [("zero", np.float32(0.0))])
    graph = import_onnx(proto)
    x = current_rng().standard_normal((2, 4)).astype(np.float32)
    x[0, 1] = x[1, 3] = np.nan
    want = ReferenceEvaluator(proto).run(None, {"x": x})
    for got in (evaluate(graph, [x]), hexir.compile(graph, target="cpu").run([x])):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("LeakyRelu", {"alpha": 0.1}),
        ("LeakyRelu", {}),
        ("Elu", {"alpha": 0.7}),
        ("Selu", {}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("HardSwish", {}),
        ("Softplus", {}),
        ("Mish", {}),
    ],
)
def test_activations_import_as_compositions_that_agree_with_the_reference(op, attrs):
    proto = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", [3, 5])], ["y"], opset=18)
    graph = agrees(proto, rtol=1e-5, atol=1e-6)
    x = current_rng().uniform(-4, 4, (3, 5)).astype(np.float32)
    got = hexir.compile(graph, target="cpu").run([x])[0]
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_prelu_takes_a_slope_per_channel():
    slope = current_rng().uniform(0, 0.5, (3, 1, 1)).astype(np.float32)
    proto = model([helper.make_node("PRelu", ["x", "slope"], ["y"])], [("x", [2, 3, 4, 4])],
                  ["y"], [("slope", slope)])  # fmt: skip
    agrees(proto)


@pytest.mark.parametrize("op,groups,opset", [("InstanceNormalization", None, 17),
                                             ("GroupNormalization", 2, 21),
                                             ("GroupNormalization", 3, 18)])  # fmt: skip
def test_instance_and_group_normalization_are_layer_norms_of_channel_groups(op, groups, opset):
    rng = current_rng()
    channels = 6
    per = channels if groups is None or opset >= 21 else groups  # opset 18: a scale per group
    attrs = {"epsilon": 1e-4} | ({} if groups is None else {"num_groups": groups})
    node = helper.make_node(op, ["x", "scale", "bias"], ["y"], **attrs)
    inits = [("scale", rng.uniform(0.5, 2, per).astype(np.float32)),
             ("bias", rng.uniform(-1, 1, per).astype(np.float32))]  # fmt: skip
    proto = model([node], [("x", [2, channels, 5, 4])], ["y"], inits, opset=opset)
    graph = agrees(proto, rtol=1e-4, atol=1e-4)
    assert "layer_norm" in kinds(graph)
    x = rng.standard_normal((2, channels, 5, 4)).astype(np.float32)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    got = hexir.compile(graph, target="cpu").run([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_range_of_constants_is_folded():
    nodes = [
        helper.make_node("Range", ["s", "l", "d"], ["r"]),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    inits = [("s", np.float32(1.5)), ("l", np.float32(9.0)), ("d", np.float32(1.5))]
    graph = agrees(model(nodes, [("x", [5])], ["y"], inits))
    assert kinds(graph) == Counter({"add": 1, "constant": 1})  # the range, as data


def test_tile_by_constant_repeats():
    nodes = [helper.make_node("Tile", ["x", "r"], ["y"])]
    agrees(model(nodes, [("x", [2, 3])], ["y"], [("r", np.array([2, 3], np.int64))]))


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 1), (1, -2)])
def test_trilu_keeps_a_triangle_of_the_last_two_axes(upper, k):
    nodes = [helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)]
    agrees(model(nodes, [("x", [2, 4, 5])], ["y"], [("k", np.array(k, np.int64))]))


@pytest.mark.parametrize("axis,exclusive,reverse", [(1, 0, 0), (2, 1, 0), (0, 0, 1), (-1, 1, 1)])
def test_cumsum_along_a_constant_axis(axis, exclusive, reverse):
    node = helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    proto = model([node], [("x", [3, 5, 4])], ["y"], [("a", np.array(axis, np.int64))])
    graph = agrees(proto)
    x = current_rng().standard_normal((3, 5, 4)).astype(np.float32)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    np.testing.assert_allclose(hexir.compile(graph, target="cpu").run([x])[0], want, atol=1e-5)


def test_an_old_opset_is_converted_and_a_new_one_read_where_its_ops_did_not_change():
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    agrees(model(relu, [("x", [2, 3])], ["y"], opset=11))  # converted up to 13
    agrees(model(relu, [("x", [2, 3])], ["y"], opset=25))  # Relu unchanged since 14
    flatten = [helper.make_node("Flatten", ["x"], ["y"], axis=1)]  # Flatten-24: types only
    agrees(model(flatten, [("x", [2, 3, 4])], ["y"], opset=25))
    qkv = [("q", [1, 2, 4, 8]), ("k", [1, 2, 4, 8]), ("v", [1, 2, 4, 8])]
    # Attention as of 25 (its windows and nonpad_kv_seqlen: onnx_import.NEWER) is read whole
    agrees(model([helper.make_node("Attention", ["q", "k", "v"], ["y"])], qkv, ["y"], opset=25))
    windowed = [helper.make_node("Attention", ["q", "k", "v"], ["y"], left_window_size=2)]
    agrees(model(windowed, qkv, ["y"], opset=25))
    # SpaceToDepth-28 added `mode` (onnx_import.NEWER): DCR, the default, and CRD
    for mode in ("DCR", "CRD"):
        blocks = [helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode=mode)]
        agrees(model(blocks, [("x", [1, 3, 4, 6])], ["y"], opset=28))
    # Cast-24's round_mode applies to float8e8m0 only, a dtype Hexir refuses by name
    cast = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16, round_mode="down")]
    agrees(model(cast, [("x", [2, 3])], ["y"], opset=28))
    e8m0 = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, round_mode="up")]
    with pytest.raises(ModelError, match="FLOAT8E8M0, Hexir has no such dtype"):
        import_onnx(model(e8m0, [("x", [2, 3])], ["y"], opset=28))


def test_an_op_version_after_the_checked_opset_is_refused_by_name(monkeypatch):
    """A version may change an op's meaning in its text alone (Mod-28 did): one after the
    opset onnx_import.CHECKED names is refused, unless NEWER reads it."""
    from hexir.frontend import onnx_import

    assert onnx_import.op_versions("Celu") == (28, 28)  # Celu-28: types added only
    assert onnx_import.op_versions("Swish") == (24, 24)  # new in 24
    monkeypatch.setattr(onnx_import, "CHECKED", 27)
    assert onnx_import.op_versions("Celu") == (12, 28)
    celu = [helper.make_node("Celu", ["x"], ["y"])]
    with pytest.raises(ModelError, match=r"Celu \(version 28, after opset 27"):
        import_onnx(model(celu, [("x", [2, 3])], ["y"], opset=28))
    agrees(model(celu, [("x", [2, 3])], ["y"], opset=23))
    mod = [helper.make_node("Mod", ["x", "d"], ["y"], fmod=0)]  # NEWER reads Mod-28
    agrees(model(mod, [("x", [2, 3])], ["y"], [("d", np.float32(-1.5))], opset=28))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_28_of_signed_ints_and_amounts_past_the_width(rng, dtype, direction):
    """BitShift-28: signed ints shift right arithmetically; an amount below 0 or of the width or
    more gives the sign's fill (-1 right of a negative, else 0), as onnx's reference."""
    width = 8 * np.dtype(dtype).itemsize
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (4, 9), endpoint=True).astype(dtype)
    amounts = [0, 1, width - 1, width, width + 3, *rng.integers(0, width, 4)]
    y = np.asarray(amounts, dtype)
    if info.min < 0:
        y[-1] = -2
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)
    proto = model([node], [("x", [4, 9], elem), ("y", [9], elem)], ["z"], opset=28)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x, "y": y})
    graph = import_onnx(proto)
    for got in (evaluate(graph, [x, y])[0], hexir.compile(graph, target="cpu").run([x, y])[0]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("stash", [None, 1, 11])
def test_range_27_of_float16_counts_in_its_stash_type(stash):
    """Range-27: a float16 range is counted in float32 (stash_type 1, the default) or float64
    (11), then rounded; counting in float16 would give other elements here."""
    attrs = {} if stash is None else {"stash_type": stash}
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"], **attrs)]
    bounds = [("s", np.float16(1000)), ("l", np.float16(3000)), ("d", np.float16(0.7))]
    proto = model(nodes, [], ["r"], bounds, opset=27)
    (want,) = ReferenceEvaluator(proto).run(None, {})
    (got,) = evaluate(import_onnx(proto), [])
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "op", ["ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSumExp"]
)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_composed_of_sum_and_max(op, keepdims):
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    inits = [("axes", np.array([1, -1], np.int64))]
    agrees(model([node], [("x", [2, 3, 4])], ["y"], inits, opset=18), rtol=1e-5, atol=1e-5)


def test_cast_like_and_size():
    nodes = [helper.make_node("CastLike", ["x", "like"], ["c"]),
             helper.make_node("Size", ["x"], ["n"])]  # fmt: skip
    proto = model(nodes, [("x", [2, 3])], ["c", "n"], [("like", np.zeros(1, np.float64))])
    graph = agrees(proto)
    assert graph.outputs[0].type.dtype == "float64"


def test_layer_norm_mean_and_inv_std_dev_and_dropout_mask_outputs():
    rng = current_rng()
    nodes = [
        helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=1),
        helper.make_node("Dropout", ["y"], ["z", "mask"]),
    ]
    inits = [("s", rng.uniform(0.5, 2, (3, 4)).astype(np.float32)),
             ("b", rng.uniform(-1, 1, (3, 4)).astype(np.float32))]  # fmt: skip
    agrees(model(nodes, [("x", [2, 3, 4])], ["z", "mean", "inv", "mask"], inits), atol=1e-4)


@pytest.mark.parametrize("mode, numpy_mode", [("edge", "edge"), ("reflect", "reflect"),
                                              ("wrap", "wrap")])  # fmt: skip
@pytest.mark.parametrize("pads", [[1, 2, 0, 2], [0, 0, 3, 1], [2, 1, 2, 3]])
def test_pad_of_edge_reflect_and_wrap_modes_is_slices_and_a_concat(mode, numpy_mode, pads, rng):
    """Pad's modes that copy the tensor's own elements: no pad op, slices along each padded
    axis concatenated around it; numpy.pad's modes of the same names, evaluated and compiled."""
    proto = model(
        [helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)],
        [("x", [4, 5])],
        ["y"],
        [("pads", np.asarray(pads, np.int64))],
        opset=18,
    )
    graph = import_onnx(proto)
    assert "pad" not in kinds(graph)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    want = np.pad(x, [(pads[0], pads[2]), (pads[1], pads[3])], mode=numpy_mode)
    np.testing.assert_array_equal(evaluate(graph, [x])[0], want)
    np.testing.assert_array_equal(hexir.compile(graph, target="cpu").run([x])[0], want)


def test_a_reflect_pad_wider_than_the_tensor_is_refused():
    proto = model(
        [helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
        [("x", [4, 5])],
        ["y"],
        [("pads", np.asarray([4, 0, 0, 0], np.int64))],
        opset=18,
    )
    with pytest.raises(ModelError, match="Pad mode reflect of 4 on an extent of 4"):
        import_onnx(proto)


def test_a_newer_opset_reads_an_op_whose_new_inputs_the_node_does_not_give():
    # A newer definition that only adds optional inputs means the old one where the node does
    # not give them (_same_inputs); Attention's (nonpad_kv_seqlen) and its windows Hexir reads
    # as of opset 25 (NEWER), given or not.
    from onnx import defs

    from hexir.frontend.onnx_import import _changed, _same_inputs

    old, new = (defs.get_schema("Attention", max_inclusive_version=v).inputs for v in (23, 25))
    plain = helper.make_node("Attention", ["q", "k", "v"], ["y"])
    padded = helper.make_node("Attention", ["q", "k", "v", "", "", "", "lens"], ["y"])
    assert _same_inputs(old, new, plain) and not _same_inputs(old, new, padded)
    windowed = helper.make_node("Attention", ["q", "k", "v"], ["y"], left_window_size=4)
    assert _changed(plain, 23, 25) == _changed(padded, 23, 25) == _changed(windowed, 23, 25) == ""
