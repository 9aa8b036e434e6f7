"""Small graphs that use every op of docs/ops.md, and fresh random inputs for them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hexir.ir.graph import Graph, Value
from hexir.ops.builder import GraphBuilder
from hexir.ops.contraction import block_matmul_weight
from hexir.ops.nn import block_conv_weight

# The cases' constants are built at import time: a fixed seed, the same in every test.
WEIGHTS = np.random.default_rng(0)

Build = Callable[..., Value | list[Value]]


def one_op(name: str, inputs: list[tuple[tuple[int, ...], str]], build: Build) -> Graph:
    b = GraphBuilder(name)
    xs = [b.input(f"x{i}", shape, dtype) for i, (shape, dtype) in enumerate(inputs)]
    return b.build(build(b, *xs))


def random_inputs(
    graph: Graph, rng: np.random.Generator, positive: bool = False
) -> dict[str, np.ndarray]:
    """Fresh inputs: floats in [-2, 2] ([0.5, 2] where `positive`), small ints, random bools."""
    arrays = {}
    for v in graph.inputs:
        shape, dtype = v.type.shape, v.type.dtype
        if dtype == "bool":
            arrays[v.name] = rng.random(shape) < 0.5
        elif dtype.startswith("int"):
            arrays[v.name] = rng.integers(-5, 6, size=shape).astype(dtype)
        elif dtype.startswith("uint"):
            arrays[v.name] = rng.integers(0, 11, size=shape).astype(dtype)
        else:
            low = 0.5 if positive else -2.0
            arrays[v.name] = rng.uniform(low, 2.0, size=shape).astype(dtype)
    return arrays


def _w(*shape: int) -> np.ndarray:
    return WEIGHTS.uniform(-1.0, 1.0, size=shape).astype(np.float32)


F = "float32"
_TABLE = np.array([[3, 1], [0, 4]], np.int32)  # two sequences' pages in a pool of 5
POSITIVE = {"log", "sqrt", "rsqrt", "power"}  # cases whose inputs must be positive

# case id -> (graph, inputs positive?)
CASES: dict[str, Graph] = {
    "matmul": one_op("matmul", [((4, 5), F), ((5, 3), F)], lambda b, x, y: b.matmul(x, y)),
    "matmul_blocked": one_op(
        "matmul_blocked",
        [((4, 5), F)],
        lambda b, x: b.matmul(x, b.constant(block_matmul_weight(_w(5, 12), 4)), weight_block=4),
    ),
    "batch_matmul_blocked": one_op(
        "batch_matmul_blocked",
        [((2, 4, 5), F)],
        lambda b, x: b.batch_matmul(
            x, b.constant(block_matmul_weight(_w(2, 5, 12), 4)), weight_block=4
        ),
    ),
    "winograd_input": one_op(
        "winograd_input", [((2, 10, 6, 3), F)], lambda b, x: b.winograd_input(x, tile=4)
    ),
    "winograd_output": one_op(
        "winograd_output", [((4, 4, 1, 2, 3, 5), F)], lambda b, x: b.winograd_output(x, tile=2)
    ),
    "batch_matmul": one_op(
        "batch_matmul", [((2, 4, 5), F), ((2, 5, 3), F)], lambda b, x, y: b.batch_matmul(x, y)
    ),
    "batch_matmul_transpose_b": one_op(
        "batch_matmul_transpose_b",
        [((2, 4, 5), F), ((2, 3, 5), F)],
        lambda b, x, y: b.batch_matmul(x, y, transpose_b=True),
    ),
    "matmul_int4": one_op(
        "matmul_int4",
        [((3, 8), F), ((4, 5), "uint8")],
        lambda b, x, w: b.matmul_int4(x, w, b.constant(_w(2, 5)), group=4),
    ),
    "matmul_int4_blocked": one_op(
        "matmul_int4_blocked",
        [((1, 64), F)],
        lambda b, x: b.matmul_int4(
            x,
            b.constant(block_matmul_weight(WEIGHTS.integers(0, 256, (32, 6)).astype(np.uint8), 3)),
            b.constant(block_matmul_weight(_w(2, 6), 3)),
            group=32,
            weight_block=3,
        ),
    ),
    "dense": one_op("dense", [((4, 5), F), ((3, 5), F)], lambda b, x, w: b.dense(x, w)),
    "dense_int32": one_op(
        "dense_int32", [((4, 5), "int32"), ((3, 5), "int32")], lambda b, x, w: b.dense(x, w)
    ),
    "bias_add": one_op(
        "bias_add", [((2, 3, 4, 5), F), ((3,), F)], lambda b, x, c: b.bias_add(x, c, axis=1)
    ),
    "bias_add_last": one_op(
        "bias_add_last", [((4, 5), F), ((5,), F)], lambda b, x, c: b.bias_add(x, c, axis=1)
    ),
    "conv2d": one_op(
        "conv2d",
        [((1, 4, 9, 9), F)],
        lambda b, x: b.conv2d(x, b.constant(_w(6, 2, 3, 3)), stride=2, padding=1, groups=2),
    ),
    "conv2d_blocked": one_op(
        "conv2d_blocked",
        [((1, 3, 9, 9), F)],
        lambda b, x: b.conv2d(
            x, b.constant(block_conv_weight(_w(8, 3, 3, 3), 4)), padding=1, weight_block=4
        ),
    ),
    "conv2d_dilated": one_op(
        "conv2d_dilated",
        [((1, 3, 10, 8), F), ((5, 3, 3, 2), F)],
        lambda b, x, w: b.conv2d(x, w, stride=(1, 2), padding=(2, 0), dilation=2),
    ),
    "batch_norm": one_op(
        "batch_norm",
        [((2, 3, 4, 4), F)],
        lambda b, x: b.batch_norm(
            x, *(b.constant(_w(3)) for _ in range(3)), b.constant(_w(3) + 2), epsilon=1e-3
        ),
    ),
    "batch_norm_axis2": one_op(
        "batch_norm_axis2",
        [((2, 3, 4), F)],
        lambda b, x: b.batch_norm(
            x, *(b.constant(_w(4)) for _ in range(3)), b.constant(_w(4) + 2), axis=2
        ),
    ),
    **{
        kind: one_op(kind, [((4, 1, 5), F), ((3, 5), F)], lambda b, x, y, k=kind: b.op(k, x, y))
        for kind in ("add", "sub", "mul", "div", "maximum", "minimum", "power")
    },
    "remainders": one_op(
        "remainders",
        [((3, 4), "int32"), ((4,), "int32")],
        lambda b, x, y: [b.op("mod", x, y), b.op("fmod", x, y)],
    ),
    "shifts": one_op(
        "shifts",
        [((3, 4), "uint32"), ((4,), "uint32")],
        lambda b, x, y: [b.op("left_shift", x, y), b.op("right_shift", x, y)],
    ),
    "fmod_float": one_op(
        "fmod_float", [((3, 4), F), ((4,), F)], lambda b, x, y: b.op("fmod", x, y)
    ),
    "add_int32": one_op(
        "add_int32", [((3, 4), "int32"), ((4,), "int32")], lambda b, x, y: b.mul(b.add(x, y), x)
    ),
    "where": one_op(
        "where", [((3, 4), "bool"), ((3, 4), F), ((4,), F)], lambda b, c, x, y: b.where(c, x, y)
    ),
    **{
        kind: one_op(kind, [((3, 4), F), ((3, 4), F)], lambda b, x, y, k=kind: b.op(k, x, y))
        for kind in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
    },
    "compare_bool": one_op(
        "compare_bool",
        [((3, 4), "bool"), ((3, 4), "bool")],
        lambda b, x, y: [b.less(x, y), b.greater_equal(x, y), b.maximum(x, y), b.minimum(x, y)],
    ),
    **{
        kind: one_op(kind, [((3, 4), F)], lambda b, x, k=kind: b.op(k, x))
        for kind in ("relu", "sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt")
        + ("floor", "ceil", "round", "sin", "cos", "sign")
    },
    "sign_int8": one_op("sign_int8", [((3, 4), "int8")], lambda b, x: b.op("sign", x)),
    "add_uint8": one_op(
        "add_uint8", [((3, 4), "uint8"), ((3, 4), "uint8")], lambda b, x, y: b.add(x, y)
    ),
    "relu_int32": one_op("relu_int32", [((3, 4), "int32")], lambda b, x: b.relu(x)),
    "gelu": one_op("gelu", [((3, 4), F)], lambda b, x: b.gelu(x)),
    "gelu_tanh": one_op("gelu_tanh", [((3, 4), F)], lambda b, x: b.gelu(x, approximate="tanh")),
    "cast": one_op("cast", [((3, 4), F)], lambda b, x: [b.cast(x, "int32"), b.cast(x, "float64")]),
    "softmax": one_op("softmax", [((3, 4, 5), F)], lambda b, x: [b.softmax(x), b.softmax(x, 0)]),
    "attention": one_op(
        "attention",
        [((2, 3, 4), F), ((2, 4, 5), F), ((2, 5, 6), F), ((3, 5), F)],
        lambda b, q, kt, v, bias: [
            b.op("attention", q, kt, v),
            b.op("attention", q, kt, v, bias, scale=0.7, causal=True),
        ],
    ),
    "paged_attention": one_op(
        "paged_attention",
        [((2, 2, 4), F), ((5, 2, 3, 4), F), ((5, 2, 3, 4), F), ((2, 2, 4), F), ((2, 2, 4), F)],
        lambda b, q, kp, vp, kn, vn: [
            b.paged_attention(q, kp, vp, b.constant(_TABLE), b.constant(np.array([4, 2], "i4"))),
            b.paged_attention(
                q, kp, vp, b.constant(_TABLE), b.constant(np.array([0, 5], "i4")), kn, vn, 0.3
            ),
        ],
    ),
    "log_softmax": one_op(
        "log_softmax", [((3, 4, 5), F)], lambda b, x: [b.log_softmax(x), b.log_softmax(x, 1)]
    ),
    "layer_norm": one_op(
        "layer_norm",
        [((2, 3, 4), F)],
        lambda b, x: b.layer_norm(x, b.constant(_w(3, 4)), b.constant(_w(3, 4)), axis=1),
    ),
    "rms_norm": one_op(
        "rms_norm",
        [((2, 3, 4), F)],
        lambda b, x: [
            b.rms_norm(x, b.constant(_w(4))),
            b.rms_norm(x, b.constant(_w(3, 4)), 1, 1e-3),
        ],
    ),
    "reduce": one_op(
        "reduce",
        [((2, 3, 4), F)],
        lambda b, x: [
            b.reduce_sum(x, axes=1),
            b.reduce_mean(x, axes=(0, 2), keepdims=True),
            b.reduce_max(x),
            b.reduce_min(x, axes=(1, 2), keepdims=True),
            b.reduce_sum(x, axes=()),
            b.op("reduce_prod", x, axes=2),
        ],
    ),
    "arg": one_op(
        "arg",
        [((2, 3, 4), F), ((3, 5), "int32")],
        lambda b, x, i: [
            b.argmax(x, 1),
            b.argmin(x, -1, keepdims=True, last=True),
            b.argmax(i, 0, last=True),
            b.argmin(i, 1),
        ],
    ),
    "transpose_reshape": one_op(
        "transpose_reshape",
        [((2, 3, 4), F)],
        lambda b, x: b.reshape(b.transpose(x, (2, 0, 1)), (4, -1)),
    ),
    "nhwc_images": one_op(
        "nhwc_images",
        [((1, 7, 6, 4), F)],
        lambda b, x: [
            b.conv2d(x, b.constant(_w(4, 1, 3, 3)), stride=2, padding=1, groups=4, layout="NHWC"),
            b.conv2d(
                x,
                b.constant(block_conv_weight(_w(8, 4, 3, 3), 4)),
                padding=1,
                weight_block=4,
                layout="NHWC",
            ),
            b.max_pool2d(x, 3, stride=2, padding=1, layout="NHWC"),
            b.avg_pool2d(x, 2, layout="NHWC"),
            b.global_avg_pool2d(x, layout="NHWC"),
        ],
    ),
    "layout_transform": one_op(
        "layout_transform",
        [((1, 8, 3, 2), F)],
        lambda b, x: [
            b.layout_transform(x, src="NCHW", dst="NHWC"),
            b.layout_transform(
                b.layout_transform(x, src="NCHW", dst="NCHW4c"), src="NCHW4c", dst="NHW2cC"
            ),
        ],
    ),
    "concat": one_op(
        "concat",
        [((2, 3), F), ((2, 1), F), ((2, 2), F)],
        lambda b, x, y, z: b.concat([x, y, z], axis=1),
    ),
    "slice": one_op(
        "slice",
        [((5, 6, 4), F)],
        lambda b, x: [
            b.slice(x, (None, 1, None), (None, -1, None), (-1, 2, -2)),
            b.slice(x, (1,), (4,)),
        ],
    ),
    "gather": one_op(  # runtime indices in -5..5 of an axis of 6
        "gather", [((6, 3), F), ((2, 2), "int64")], lambda b, x, i: b.gather(x, i, axis=0)
    ),
    "gather_elements": one_op(  # runtime indices in -5..5 of an axis of 6
        "gather_elements",
        [((6, 3), F), ((4, 3), "int64")],
        lambda b, x, i: b.gather_elements(x, i, axis=0),
    ),
    "gather_nd": one_op(  # runtime index tuples in -5..5 of axes of 6
        "gather_nd",
        [((2, 6, 6, 3), F), ((2, 4, 2), "int64"), ((6, 3), F), ((3, 1), "int64")],
        lambda b, x, i, y, j: [b.gather_nd(x, i, batch_dims=1), b.gather_nd(y, j)],
    ),
    "scatter_elements": one_op(  # duplicate indices: the last wins, or all add up
        "scatter_elements",
        [((6, 3), F), ((4, 3), "int64"), ((4, 3), F)],
        lambda b, x, i, u: [
            b.scatter_elements(x, i, u, axis=0),
            b.scatter_elements(x, i, u, axis=-2, reduction="add"),
        ],
    ),
    "scatter_nd": one_op(
        "scatter_nd",
        [((6, 6, 3), F), ((2, 2), "int64"), ((2, 3), F)],
        lambda b, x, i, u: [b.scatter_nd(x, i, u), b.scatter_nd(x, i, u, reduction="mul")],
    ),
    "pad": one_op(
        "pad", [((2, 3), F)], lambda b, x: b.pad(x, before=(1, 0), after=(2, 3), value=1.5)
    ),
    "arange": one_op(  # exported as Range, imported back as its folded data
        "arange",
        [((4,), F)],
        lambda b, x: [b.add(x, b.arange(start=2, stop=13, step=3, dtype=F)), b.arange(stop=5)],
    ),
    "broadcast_to": one_op(
        "broadcast_to", [((3, 1), F)], lambda b, x: b.broadcast_to(x, shape=(2, 3, 4))
    ),
    "pools": one_op(
        "pools",
        [((1, 2, 7, 8), F)],
        lambda b, x: [
            b.max_pool2d(x, 3, stride=2, padding=1),
            b.avg_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 1)),
            b.global_avg_pool2d(x),
        ],
    ),
    "constant_outputs": one_op(
        "constant_outputs",
        [((3,), F)],
        lambda b, x: [x, (c := b.constant(_w(3), name="c")), b.mul(x, c), b.mul(x, c)],
    ),
}

# Ops ONNX defines for floats only, on ints (exported through float64).
CASES["int_windows"] = one_op(
    "int_windows",
    [((1, 2, 6, 6), "int32"), ((3, 2, 3, 3), "int32")],
    lambda b, x, w: [
        b.conv2d(x, w, padding=1),
        b.max_pool2d(x, 2),
        b.avg_pool2d(x, 3, stride=2, padding=1),
        b.global_avg_pool2d(x),
    ],
)

# Ops with no ONNX form at the export's opset (17): exporting them is refused, naming why.
UNEXPORTED: dict[str, Graph] = {
    "bitwise": one_op(
        "bitwise",
        [((3, 4), "int32"), ((4,), "int32")],
        lambda b, x, y: [b.op(k, x, y) for k in ("bitwise_and", "bitwise_or", "bitwise_xor")],
    ),
    "signed_shift": one_op(
        "signed_shift",
        [((3, 4), "int32"), ((4,), "int32")],
        lambda b, x, y: b.op("left_shift", x, y),
    ),
}
