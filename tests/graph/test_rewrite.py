"""Compile-time evaluation and exact rewrites: each rewrite, checked by numpy before and after."""

from __future__ import annotations

import numpy as np
import pytest
from seeding import current_rng

from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import is_view, partition
from hexir.graph.rewrite import fold_batch_norms, remove_dead_ops, simplify_graph
from hexir.ir.graph import Graph, Value
from hexir.ir.graph_text import print_graph
from hexir.ops.builder import GraphBuilder
from hexir.ops.parse import parse_graph


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    if dtype.startswith("int"):
        return current_rng().integers(-50, 50, size=shape).astype(dtype)
    return current_rng().uniform(-2.0, 2.0, size=shape).astype(dtype)


def kinds(graph: Graph) -> list[str]:
    return [op.kind for op in graph.ops]


def simplified(graph: Graph, rtol: float = 0.0) -> Graph:
    """simplify_graph(graph), checked: same interface, a fixed point, the same values."""
    after = simplify_graph(graph)
    assert after.inputs == graph.inputs and after.outputs == graph.outputs
    assert simplify_graph(after) == after
    data = {k: d.array for k, d in after.constants}
    assert parse_graph(print_graph(after), data) == after
    inputs = [rand(*v.type.shape, dtype=v.type.dtype) for v in graph.inputs]
    for got, want in zip(evaluate(after, inputs), evaluate(graph, inputs), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        if rtol == 0.0:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    return after


# ---------------------------------------------------------------------------------------------
# Compile-time evaluation and dead ops


def test_constant_subgraphs_become_one_constant():
    b = GraphBuilder("g")
    x = b.input("x", (3, 4))
    c = b.exp(b.transpose(b.constant(rand(4, 3)), perm=(1, 0)))
    y = b.add(x, b.mul(c, b.constant(rand(4))))
    after = simplified(b.build(y))
    assert kinds(after) == ["constant", "add"]
    assert [name for name, _ in after.constants] == [after.ops[0].result.name]


def test_dead_ops_and_unused_constants_go_inputs_stay():
    b = GraphBuilder("g")
    x, unused = b.input("x", (3, 4)), b.input("unused", (2,))
    b.exp(b.add(x, b.constant(rand(3, 4), name="dead")))
    y = b.relu(x)
    after = simplified(b.build(y))
    assert kinds(after) == ["relu"] and after.constants == ()
    assert after.inputs == (x, unused)
    assert remove_dead_ops(after) == after


# ---------------------------------------------------------------------------------------------
# Exact rewrites


@pytest.mark.parametrize(
    "kind, constant_first, unit",
    [("mul", False, 1), ("mul", True, 1), ("div", False, 1), ("add", False, 0),
     ("add", True, 0), ("sub", False, 0), ("add", False, -0.0)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_identity_ops_go(kind, constant_first, unit, dtype):
    b = GraphBuilder("g")
    x = b.input("x", (3, 4), dtype)
    c = b.constant(np.full((3, 4), unit, dtype))
    y = b.op(kind, *((c, x) if constant_first else (x, c)))
    after = simplified(b.build(b.relu(y)))
    assert kinds(after) == ["relu"] and after.ops[0].operands == (x,)


@pytest.mark.parametrize(
    "kind, value, x_shape, c_shape",
    [
        ("mul", 1.0000001, (3, 4), (4,)),  # not exactly one
        ("add", 1e-30, (3, 4), (3, 4)),  # not exactly zero
        ("add", 0.0, (4,), (3, 4)),  # broadcasting changes the shape
        ("mul", 1.0, (1, 4), (3, 1)),
        ("sub", 0.0, (3, 4), (3, 4)),  # 0 - x is not x
    ],
)
def test_ops_that_are_not_identities_stay(kind, value, x_shape, c_shape):
    b = GraphBuilder("g")
    x = b.input("x", x_shape)
    c = b.constant(np.full(c_shape, value, np.float32))
    y = b.op(kind, *((c, x) if kind == "sub" else (x, c)))
    after = simplified(b.build(b.relu(y)))
    assert kinds(after) == ["constant", kind, "relu"]


def test_identity_that_is_a_graph_output_stays():
    b = GraphBuilder("g")
    x = b.input("x", (3, 4))
    y = b.mul(b.relu(x), b.constant(np.ones((3, 4), np.float32)))
    after = simplified(b.build(y))
    assert kinds(after) == ["relu", "constant", "mul"]


def test_reshape_of_reshape_is_one_reshape():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4))
    r = b.reshape(b.reshape(x, (6, 4)), (4, 6))
    back = b.reshape(b.reshape(b.relu(x), (24,)), (2, 3, 4))
    after = simplified(b.build([b.relu(r), b.exp(back)]))
    assert kinds(after) == ["reshape", "relu", "relu", "exp"]
    assert after.ops[0].operands == (x,) and after.ops[0].attr("shape") == (4, 6)


def test_inner_reshape_with_another_use_stays():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4))
    inner = b.reshape(x, (6, 4))
    after = simplified(b.build([b.reshape(inner, (24,)), b.relu(inner)]))
    assert kinds(after) == ["reshape", "reshape", "relu"]
    assert after.ops[1].operands == (x,)


def test_a_reshape_sinks_below_elementwise_ops_into_the_shape_its_producer_computes():
    # A 3-D activation times a 2-D weight, as the ONNX importer writes it: reshape -> matmul
    # -> reshape, then a bias over the last axis, a gelu and a residual add on 3-D.
    b = GraphBuilder("g")
    x, residual = b.input("x", (1, 6, 8)), b.input("r", (1, 6, 12))
    m = b.matmul(b.reshape(x, (6, 8)), b.constant(rand(8, 12)))
    h = b.gelu(b.bias_add(b.reshape(m, (1, 6, 12)), b.constant(rand(12)), axis=2))
    graph = b.build(b.add(h, residual))
    after = simplified(graph, rtol=1e-6)
    assert kinds(after) == ["reshape", "constant", "matmul", "constant", "bias_add", "gelu",
                            "reshape", "add", "reshape"]  # fmt: skip
    assert [op.attr("axis") for op in after.ops if op.kind == "bias_add"] == [1]
    # One kernel: the reshapes are views, the epilogues the matmul's.
    groups = [g for g in partition(after) if not is_view(g)]
    assert [[op.kind for op in g.ops] for g in groups] == [["matmul", "bias_add", "gelu", "add"]]


def test_a_reshape_sinks_past_an_operand_of_one_element():
    # relu6 after a 1x1 conv computed as a matmul: its 6 (one element, of the 4-D image's
    # rank) goes along as a [1, 1] view, so the clip is the matmul's epilogue too.
    b = GraphBuilder("g")
    x = b.input("x", (12, 8))
    m = b.reshape(b.matmul(x, b.constant(rand(8, 16))), (1, 3, 4, 16))
    six = b.constant(np.full((1, 1, 1, 1), 6.0, np.float32))
    graph = b.build(b.minimum(b.relu(m), six))
    after = simplified(graph)
    assert kinds(after)[-2:] == ["minimum", "reshape"]
    (clip,) = [op for op in after.ops if op.kind == "minimum"]
    assert [v.type.shape for v in clip.operands] == [(12, 16), (1, 1)]
    groups = [g for g in partition(after) if not is_view(g)]
    assert [[op.kind for op in g.ops if op.kind != "constant"] for g in groups] == [
        ["matmul", "relu", "minimum"]]  # fmt: skip


def test_a_reshape_stays_above_a_broadcast_and_a_viewed_input():
    b = GraphBuilder("g")
    x = b.input("x", (4, 6))
    h = b.reshape(b.exp(x), (24,))
    wide = b.add(h, b.input("y", (3, 24)))  # h broadcasts up: not sunk
    viewed = b.relu(b.reshape(x, (24,)))  # a graph input: nothing computes in (4, 6)
    after = simplified(b.build([wide, viewed]))
    assert kinds(after) == ["exp", "reshape", "add", "reshape", "relu"]


def test_transposes_compose_and_identity_goes():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4))
    t = b.transpose(b.transpose(x, perm=(1, 2, 0)), perm=(0, 2, 1))
    gone = b.transpose(b.transpose(x, perm=(2, 0, 1)), perm=(1, 2, 0))
    after = simplified(b.build([b.relu(t), b.exp(gone)]))
    assert kinds(after) == ["transpose", "relu", "exp"]
    assert after.ops[0].operands == (x,) and after.ops[0].attr("perm") == (1, 0, 2)
    assert after.ops[2].operands == (x,)


def test_a_transpose_moving_only_unit_axes_is_a_reshape():
    b = GraphBuilder("g")
    x = b.input("x", (1, 12, 1, 64))
    heads = b.transpose(b.reshape(x, (1, 12, 64)), perm=(1, 0, 2))  # 12x1x64: same order
    moves_rows = b.transpose(x, perm=(0, 3, 2, 1))
    back = b.transpose(b.transpose(x, perm=(2, 1, 0, 3)), perm=(1, 0, 2, 3))
    after = simplified(b.build([b.relu(heads), b.exp(moves_rows), back]))
    assert sorted(kinds(after)) == ["exp", "relu", "reshape", "reshape", "transpose"]
    reshapes = {op.attr("shape"): op.operands for op in after.ops if op.kind == "reshape"}
    assert reshapes == {(12, 1, 64): (x,), (12, 1, 1, 64): (x,)}


NHWC, NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def test_a_transpose_sinks_through_epilogues_to_the_one_that_undoes_it():
    # The Winograd form's shape: NHWC -> NCHW, a bias, a relu, and NCHW -> NHWC for the next
    # conv, which also reads the block's input in NHWC for its residual add.
    b = GraphBuilder("g")
    x, skip = b.input("x", (1, 4, 5, 8)), b.input("skip", (1, 8, 4, 5))
    skip_nhwc = b.exp(b.transpose(skip, perm=NHWC))  # the next conv's input, made first
    h = b.relu(b.bias_add(b.transpose(x, perm=NCHW), b.constant(rand(8)), axis=1))
    scaled = b.mul(h, b.constant(rand(1, 8, 4, 5)))  # a constant in NCHW: transposed here
    res = b.relu(b.add(scaled, skip))  # skip's NHWC copy is made already: no new transpose
    graph = b.build([b.transpose(res, perm=NHWC), skip_nhwc])
    after = simplified(graph, rtol=1e-6)
    transposes = [op for op in after.ops if op.kind == "transpose"]
    assert len(transposes) == 1 and transposes[0].operands == (skip,)  # only skip's, shared
    assert [op.attr("axis") for op in after.ops if op.kind == "bias_add"] == [3]
    assert kinds(after).count("relu") == 2 and "mul" in kinds(after)


def test_a_transpose_that_meets_no_inverse_keeps_its_epilogues():
    # NHWC -> NCHW, then a bias and relu read by an NCHW consumer (a 1x1 conv as a matmul, a
    # graph output): sinking would only part the transposing copy from what it fuses.
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 5, 8))
    h = b.relu(b.bias_add(b.transpose(x, perm=NCHW), b.constant(rand(8)), axis=1))
    z = b.input("z", (1, 4, 5, 8))
    both = b.add(b.transpose(z, perm=NCHW), b.input("y", (1, 8, 4, 5)))  # y: no NHWC copy
    after = simplified(b.build([h, b.transpose(both, perm=NHWC)]))
    assert kinds(after) == ["transpose", "constant", "bias_add", "relu", "transpose", "add",
                            "transpose"]  # fmt: skip
    groups = [[op.kind for op in g.ops] for g in partition(after) if not is_view(g)]
    assert ["transpose", "bias_add", "relu"] in groups


def test_the_same_transpose_twice_is_made_once():
    # A 1x1 conv in NHWC and a residual add both read a ResNet stage's input transposed.
    b = GraphBuilder("g")
    x = b.input("x", (1, 8, 4, 5))
    one, two = b.transpose(x, perm=NHWC), b.transpose(x, perm=NHWC)
    after = simplified(b.build([b.relu(one), b.sigmoid(two)]))
    assert kinds(after) == ["transpose", "relu", "sigmoid"]
    assert after.ops[1].operands == after.ops[2].operands


def test_a_batch_matmul_reads_a_transposed_operand_in_place():
    # q·kᵀ of a decode step: the key cache was transposed by a kernel of its own.
    b = GraphBuilder("g")
    q, k = b.input("q", (3, 2, 8)), b.input("k", (3, 5, 8))
    after = simplified(b.build(b.batch_matmul(q, b.transpose(k, perm=(0, 2, 1)))))
    assert kinds(after) == ["batch_matmul"]
    assert after.ops[0].attr("transpose_b") is True and after.ops[0].operands == (q, k)


def test_an_imported_matmul_of_transposed_keys_reads_them_in_place():
    # ONNX's MatMul(q, Transpose(k, perm=[0, 1, 3, 2])) on [1, heads, tokens, head_dim]: the
    # import views both as [heads, .., ..] for batch_matmul; the keys stay untransposed.
    b = GraphBuilder("g")
    q, k = b.input("q", (1, 3, 2, 8)), b.input("k", (1, 3, 5, 8))
    kt = b.reshape(b.transpose(k, perm=(0, 1, 3, 2)), (3, 8, 5))
    after = simplified(b.build(b.batch_matmul(b.reshape(q, (3, 2, 8)), kt)))
    assert kinds(after) == ["reshape", "reshape", "batch_matmul"]  # views, no kernel
    assert after.ops[2].attr("transpose_b") is True
    assert after.ops[2].operands[1].type.shape == (3, 5, 8)


def test_keys_scaled_after_their_transpose_are_scaled_in_place():
    # torch's exported attention: keys [1, heads, tokens, d] viewed as [heads, tokens, d],
    # transposed, scaled by sqrt(1/sqrt(d)), then the batch_matmul; the scaling now runs on
    # the keys as they are laid out, and the batch_matmul reads them untransposed.
    b = GraphBuilder("g")
    q, k = b.input("q", (3, 2, 8)), b.input("k", (1, 3, 5, 8))
    kt = b.transpose(b.reshape(k, (3, 5, 8)), (0, 2, 1))
    half = b.constant(np.array([0.5], np.float32))
    after = simplified(b.build(b.batch_matmul(q, b.tanh(b.mul(kt, half)))))
    assert kinds(after) == ["reshape", "constant", "mul", "tanh", "batch_matmul"]
    assert after.ops[2].result.type.shape == (3, 5, 8)
    assert after.ops[4].attr("transpose_b") is True


def test_a_transpose_with_another_use_is_not_folded_into_batch_matmul():
    b = GraphBuilder("g")
    q, k = b.input("q", (3, 2, 8)), b.input("k", (3, 5, 8))
    kt = b.transpose(k, perm=(0, 2, 1))
    after = simplified(b.build([b.batch_matmul(q, kt), b.relu(kt)]))
    assert kinds(after) == ["transpose", "batch_matmul", "relu"]
    assert not after.ops[1].attr("transpose_b")


def test_a_slice_of_a_transpose_moves_above_it_and_meets_the_transpose_back():
    # A strided 1x1 conv's every other pixel, picked in NCHW from NHWC activations that a
    # transpose made NCHW, then transposed to NHWC for the conv's matmul: one slice in NHWC.
    b = GraphBuilder("g")
    x = b.input("x", (1, 6, 6, 8))
    nchw = b.transpose(x, perm=NCHW)
    bounds = {"start": (0, 0, 0, 0), "stop": (1, 8, 5, 5), "step": (1, 1, 2, 2)}
    picked = b.op("slice", nchw, **bounds)
    graph = b.build(b.relu(b.transpose(picked, perm=NHWC)))
    after = simplified(graph)
    assert kinds(after) == ["slice", "relu"]
    assert after.ops[0].attr("step") == (1, 2, 2, 1)
    data = rand(1, 6, 6, 8)
    np.testing.assert_array_equal(evaluate(after, [data])[0], evaluate(graph, [data])[0])
    np.testing.assert_array_equal(evaluate(after, [data])[0], np.maximum(data[:, ::2, ::2], 0))


def test_chain_of_broadcasts_is_one_broadcast_and_keeps_signed_zeros():
    b = GraphBuilder("g")
    x = b.input("x", (4,))
    z1 = b.constant(np.array([[0.0], [-0.0], [0.0]], np.float32).repeat(4, axis=1))
    z2 = b.constant(np.array([-0.0, 0.0], np.float32).reshape(2, 1, 1))
    y = b.add(b.add(x, z1), z2)
    ones = b.constant(np.ones((5, 1), np.float32))
    m = b.mul(ones, b.mul(x, b.constant(np.ones((2, 1, 4), np.float32))))
    graph = b.build([y, b.relu(m)])
    after = simplified(graph)
    assert kinds(after) == ["constant", "add", "constant", "mul", "relu"]
    assert after.ops[1].operands[0] == x and after.ops[0].result.type.shape == (2, 3, 4)
    assert after.ops[3].operands[0] == x and after.ops[2].result.type.shape == (2, 5, 4)
    xs = rand(4)
    xs[1] = -0.0
    got, want = evaluate(after, [xs])[0], evaluate(graph, [xs])[0]
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_rewrites_reach_a_fixed_point_through_each_other():
    # Folding makes the constant all ones, then x·1 goes, then the reshapes meet, then they
    # turn out to be the identity, and the transposes compose to the identity.
    b = GraphBuilder("g")
    x = b.input("x", (2, 6))
    half = b.constant(np.full((2, 6), 0.5, np.float32))
    y = b.mul(x, b.add(half, half))
    y = b.reshape(b.reshape(y, (3, 4)), (2, 6))
    y = b.transpose(b.transpose(b.relu(y), perm=(1, 0)), perm=(1, 0))
    after = simplified(b.build(b.exp(y)))
    assert kinds(after) == ["relu", "exp"]


# ---------------------------------------------------------------------------------------------
# Batch-norm folding


def batch_norm(b: GraphBuilder, x: Value, channels: int) -> Value:
    params = [rand(channels), rand(channels), rand(channels)]
    var = current_rng().uniform(0.5, 2.0, channels).astype(np.float32)
    scale, shift, mean = (b.constant(p) for p in params)
    return b.batch_norm(x, scale, shift, mean, b.constant(var), epsilon=1e-3)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("groups, stride", [(1, 1), (2, 2)])
def test_batch_norm_folds_into_conv2d(with_bias, groups, stride):
    b = GraphBuilder("g")
    x = b.input("x", (2, 4, 7, 7))
    y = b.conv2d(x, b.constant(rand(6, 4 // groups, 3, 3)), stride, 1, groups=groups)
    if with_bias:
        y = b.bias_add(y, b.constant(rand(6)))
    after = simplified(b.build(b.relu(batch_norm(b, y, 6))), rtol=1e-5)
    assert kinds(after) == ["constant", "constant", "conv2d", "bias_add", "relu"]
    conv = after.ops[2]
    assert conv.operands[0] == x and conv.attr("groups") == groups


def test_batch_norm_stays_when_it_cannot_fold():
    b = GraphBuilder("g")
    x, w = b.input("x", (1, 3, 5, 5)), b.input("w", (3, 3, 1, 1))
    weight_is_input = batch_norm(b, b.conv2d(x, w), 3)
    conv = b.conv2d(x, b.constant(rand(3, 3, 1, 1)))
    conv_used_twice = b.add(batch_norm(b, conv, 3), conv)
    not_after_conv = batch_norm(b, b.relu(x), 3)
    graph = b.build([weight_is_input, conv_used_twice, not_after_conv])
    assert fold_batch_norms(graph) == remove_dead_ops(graph)
    assert kinds(simplified(graph)).count("batch_norm") == 3


def test_conv_bn_relu_simplifies_to_one_fused_kernel():
    b = GraphBuilder("g")
    x = b.input("x", (1, 3, 8, 8))
    y = b.relu(batch_norm(b, b.conv2d(x, b.constant(rand(4, 3, 3, 3)), padding=1), 4))
    after = simplified(b.build(y), rtol=1e-5)
    assert [k for k in kinds(after) if k != "constant"] == ["conv2d", "bias_add", "relu"]
    (group,) = partition(after)
    assert [op.kind for op in group.ops] == ["conv2d", "bias_add", "relu"]
