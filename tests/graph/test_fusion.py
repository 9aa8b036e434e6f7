"""Fusion: the expected groups, valid partitions, and fused kernels that compute the graph."""

from __future__ import annotations

import random

import numpy as np
import pytest
from seeding import current_rng

import hexir
from hexir import knobs
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import Group, Pattern, partition, pattern
from hexir.graph.lower import lower, lowered_kinds
from hexir.graph.rewrite import simplify_graph
from hexir.ir.graph import Graph, Value
from hexir.ir.tir import Block
from hexir.ir.visit import walk
from hexir.ops import OPS
from hexir.ops.builder import GraphBuilder


def rand(*shape: int) -> np.ndarray:
    return current_rng().uniform(-1.0, 1.0, size=shape).astype(np.float32)


def kinds(groups: list[Group]) -> list[list[str]]:
    return [[op.kind for op in g.ops] for g in groups]


def check_partition(graph: Graph, groups: list[Group]) -> None:
    """Every non-constant op once; in order, each group reads only what is already computed;
    outputs are exactly the results needed outside (or by nobody)."""
    ops = [op for op in graph.ops if op.kind != "constant"]
    assert sorted(map(id, [op for g in groups for op in g.ops])) == sorted(map(id, ops))
    ready = {v.name for v in graph.inputs}
    ready |= {op.result.name for op in graph.ops if op.kind == "constant"}
    users = {v.name for op in ops for v in op.operands} | {v.name for v in graph.outputs}
    for g in groups:
        inside = {op.result.name for op in g.ops}
        read = [v for op in g.ops for v in op.operands if v.name not in inside]
        assert g.inputs == tuple(dict.fromkeys(read)) and all(v.name in ready for v in read)
        used_outside = {v.name for h in groups if h is not g for op in h.ops for v in op.operands}
        used_outside |= {v.name for v in graph.outputs} | (inside - users)
        assert {v.name for v in g.outputs} == inside & used_outside
        ready |= inside
    assert all(v.name in ready for v in graph.outputs)


def run_groups(graph: Graph, groups: list[Group], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The graph computed kernel by kernel: each group lowered, verified, built and run."""
    env = {op.result.name: graph.constant(str(op.attr("name")))
           for op in graph.ops if op.kind == "constant"}  # fmt: skip
    env.update({v.name: x for v, x in zip(graph.inputs, inputs, strict=True)})
    for g in groups:
        func = lower(g.graph())
        hexir.verify(func)
        outs = [np.full(v.type.shape, np.nan, np.float32) for v in g.outputs]
        hexir.build(func)(*(env[v.name] for v in g.inputs), *outs)
        env.update({v.name: out for v, out in zip(g.outputs, outs, strict=True)})
    return [env[v.name] for v in graph.outputs]


def check_runs(graph: Graph, groups: list[Group], rtol: float = 1e-4) -> None:
    check_partition(graph, groups)
    inputs = [rand(*v.type.shape) for v in graph.inputs]
    for got, want in zip(run_groups(graph, groups, inputs), evaluate(graph, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def batch_norm(b: GraphBuilder, x: Value, channels: int) -> Value:
    scale, shift, mean = (b.constant(rand(channels)) for _ in range(3))
    var = b.constant(current_rng().uniform(0.5, 2.0, channels).astype(np.float32))
    return b.batch_norm(x, scale, shift, mean, var)


def conv_bn(b: GraphBuilder, x: Value, out: int, stride: int = 1, kernel: int = 3) -> Value:
    w = b.constant(rand(out, x.type.shape[1], kernel, kernel))
    return batch_norm(b, b.conv2d(x, w, stride, kernel // 2), out)


def residual_block(b: GraphBuilder, x: Value, out: int, stride: int = 1) -> Value:
    y = conv_bn(b, b.relu(conv_bn(b, x, out, stride)), out)
    shortcut = x if stride == 1 and out == x.type.shape[1] else conv_bn(b, x, out, stride, 1)
    return b.relu(b.add(y, shortcut))


# ---------------------------------------------------------------------------------------------
# Patterns


def test_every_lowered_op_has_a_pattern():
    assert all(OPS[kind].fusion is not Pattern.OPAQUE for kind in lowered_kinds())


def test_patterns_of_ops():
    b = GraphBuilder("g")
    x, v = b.input("x", (4, 6)), b.input("v", (6,))
    b.add(x, x), b.add(x, v), b.bias_add(x, v), b.dense(x, x), b.softmax(x), b.transpose(x)
    got = [pattern(op) for op in b.ops]
    assert got == [Pattern.ELEMENTWISE, Pattern.BROADCAST, Pattern.BROADCAST,
                   Pattern.OUT_FUSABLE, Pattern.REDUCTION, Pattern.INJECTIVE]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The expected groups, run kernel by kernel


def test_matmul_bias_relu_is_one_kernel_with_a_block_per_op():
    b = GraphBuilder("g")
    x = b.input("x", (8, 12))
    y = b.relu(b.bias_add(b.matmul(x, b.constant(rand(12, 6))), b.constant(rand(6))))
    graph = b.build(y)
    groups = partition(graph)
    assert kinds(groups) == [["matmul", "bias_add", "relu"]]
    blocks = [n.name for n in walk(lower(groups[0].graph()).body) if isinstance(n, Block)]
    assert blocks == ["matmul", "bias_add", "relu"]
    check_runs(graph, groups)


def test_residual_block_is_two_kernels():
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 6, 6))
    graph = simplify_graph(b.build(residual_block(b, x, 4)))
    groups = partition(graph)
    assert kinds(groups) == [["conv2d", "bias_add", "relu"], ["conv2d", "bias_add", "add", "relu"]]
    assert groups[1].inputs[-1] == x  # the residual
    check_runs(graph, groups)


def test_a_graph_is_lowered_once_within_lowering_once_for_each_forms_and_knobs():
    from hexir.graph.fusion import fused_kernels, lowering_once

    b = GraphBuilder("g")
    graph = simplify_graph(b.build(residual_block(b, b.input("x", (1, 4, 28, 28)), 4)))
    conv = next(op.result.name for op in graph.ops if op.kind == "conv2d")
    assert fused_kernels(graph) is not fused_kernels(graph)  # outside: made each time
    with lowering_once():
        made = fused_kernels(graph)
        assert fused_kernels(graph, "cpu", {}) is made
        direct = fused_kernels(graph, "cpu", {conv: 0})
        assert direct is not made and fused_kernels(graph, "cpu", {conv: 0}) is direct
        with knobs.scope(winograd="0"):  # other knobs: lowered again
            assert fused_kernels(graph) is not made
        # Another graph object of the same ops is not taken for this one.
        again = simplify_graph(b.build(graph.outputs[0]))
        assert again is not graph and fused_kernels(again) is not made
    assert fused_kernels(graph) is not made  # the scope's lowerings go with it


def test_softmax_and_layer_norm_are_one_kernel_with_their_elementwise_producers():
    b = GraphBuilder("g")
    scores, mask = b.input("scores", (4, 8)), b.input("mask", (8,))
    scaled = b.add(b.mul(scores, b.constant(np.full((4, 8), 0.35, np.float32))), mask)
    x, residual = b.input("x", (4, 8)), b.input("residual", (4, 8))
    normed = b.layer_norm(b.add(x, residual), b.constant(rand(8)), b.constant(rand(8)))
    graph = b.build([b.softmax(scaled), normed])
    groups = partition(graph)
    assert kinds(groups) == [["mul", "add", "softmax"], ["add", "layer_norm"]]
    check_runs(graph, groups)


def test_elementwise_into_a_reduction_ends_the_group():
    b = GraphBuilder("g")
    x = b.input("x", (4, 8))
    e = b.exp(x)
    total = b.reduce_sum(e, axes=1, keepdims=True)
    graph = b.build(b.div(e, total))
    groups = partition(graph)
    assert kinds(groups) == [["exp", "reduce_sum"], ["div"]]
    assert groups[0].outputs == (e, total)
    check_runs(graph, groups)


def test_mlp_dense_gelu_dense():
    b = GraphBuilder("g")
    x = b.input("x", (8, 16))
    h = b.gelu(b.bias_add(b.dense(x, b.constant(rand(32, 16))), b.constant(rand(32))))
    y = b.bias_add(b.dense(h, b.constant(rand(10, 32))), b.constant(rand(10)))
    graph = b.build(y)
    groups = partition(graph)
    assert kinds(groups) == [["dense", "bias_add", "gelu"], ["dense", "bias_add"]]
    check_runs(graph, groups)


def test_fusion_off_gives_one_op_per_group():
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 6, 6))
    graph = simplify_graph(b.build(residual_block(b, x, 4)))
    with knobs.scope(fusion=False):
        groups = partition(graph)
    ops = [op for op in graph.ops if op.kind != "constant"]
    assert [g.ops for g in groups] == [(op,) for op in ops]
    check_runs(graph, groups)


def test_same_block_from_two_models_gives_the_same_kernels():
    def model(prefix: str, shift: int) -> Graph:
        b = GraphBuilder(f"{prefix}model")
        x = b.input(f"{prefix}x", (1, 4, 6, 6))
        for _ in range(shift):  # dead ops, so the block's values get other names
            b.exp(b.constant(rand(3)))
        return simplify_graph(b.build(residual_block(b, x, 4)))

    one, two = partition(model("", 0)), partition(model("other_", 3))
    keys = [[hexir.workload_key(lower(g.graph())) for g in gs] for gs in (one, two)]
    assert keys[0] == keys[1] and len(set(keys[0])) == 2
    assert [v.name for v in one[1].inputs] != [v.name for v in two[1].inputs]


# ---------------------------------------------------------------------------------------------
# What does not fuse


def test_injective_fuses_into_elementwise_only_when_cheap():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4))
    keeps_rows = b.relu(b.transpose(x, perm=(1, 0, 2)))
    moves_rows = b.relu(b.transpose(x, perm=(0, 2, 1)))
    strided = b.relu(b.slice(x, (None, None, None), (None, None, None), (1, 1, 2)))
    reshaped = b.exp(b.reshape(x, (6, 4)))
    graph = b.build([keeps_rows, moves_rows, strided, reshaped])
    groups = partition(graph)
    # Any transpose computes its consumers where it stores (a transposing copy and its
    # epilogue: one pass); a slice with a step along the rows does not. A reshape is a view
    # (no kernel): it takes no consumer in.
    assert kinds(groups) == [
        ["transpose", "relu"],
        ["transpose", "relu"],
        ["slice"],
        ["relu"],
        ["reshape"],
        ["exp"],
    ]
    check_runs(graph, groups)


def test_ops_on_different_devices_do_not_fuse():
    b = GraphBuilder("g")
    x = b.input("x", (4, 4))
    graph = b.build(b.relu(b.exp(x), placement="cuda:0"))
    assert kinds(partition(graph)) == [["exp"], ["relu"]]


def test_a_group_value_is_not_broadcast_up():
    b = GraphBuilder("g")
    row, m = b.input("row", (6,)), b.input("m", (4, 6))
    broadcast_up = b.add(b.exp(row), m)
    broadcast_in = b.add(b.exp(m), row)
    graph = b.build([broadcast_up, broadcast_in])
    assert kinds(partition(graph)) == [["exp"], ["add"], ["exp", "add"]]


# ---------------------------------------------------------------------------------------------
# No cycles


def test_diamonds_make_no_cycle():
    b = GraphBuilder("g")
    x = b.input("x", (4, 4))
    biased = b.bias_add(b.matmul(x, b.constant(rand(4, 4))), b.constant(rand(4)))
    # Joining the matmul's group would need the transpose, which needs that group: a cycle;
    # the transpose's group takes the add instead.
    across = b.add(b.relu(biased), b.transpose(biased))
    # The same with a slice.
    product = b.matmul(x, x)
    sliced = b.add(b.relu(product), b.slice(product, [0, 0], [4, 4]))
    # An intermediate read twice inside a group would be computed twice once inlined.
    e = b.exp(x)
    twice = b.add(b.relu(e), b.tanh(e))
    graph = b.build([across, sliced, twice])
    groups = partition(graph)
    assert kinds(groups) == [
        ["matmul", "bias_add", "relu"], ["transpose", "add"], ["matmul", "relu"],
        ["slice", "add"], ["exp", "relu"], ["tanh", "add"],
    ]  # fmt: skip
    check_runs(graph, groups)


def grow(b: GraphBuilder, kind: str, a: Value, c: Value) -> Value:
    """One op of `kind` on 4x4 values, giving a 4x4 value."""
    match kind:
        case "add" | "mul" | "matmul":
            return b.op(kind, a, c)
        case "exp" | "relu" | "transpose" | "softmax":
            return b.op(kind, a)
        case "pool":
            return b.reshape(b.max_pool2d(b.reshape(a, (1, 1, 4, 4)), 1), (4, 4))
    raise AssertionError(kind)


def random_graph(rng: random.Random) -> Graph:
    b = GraphBuilder("g")
    values = [b.input("x", (4, 4)), b.input("y", (4, 4))]
    ops = ["add", "mul", "matmul", "exp", "relu", "transpose", "softmax", "pool"]
    for _ in range(14):
        values.append(grow(b, rng.choice(ops), rng.choice(values), rng.choice(values)))
    return b.build(values[-3:])


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_partition_without_cycles(seed):
    graph = random_graph(random.Random(seed))
    groups = partition(graph)
    check_partition(graph, groups)
    if seed < 2:
        check_runs(graph, groups)


# ---------------------------------------------------------------------------------------------
# A ResNet-18-like stack


def resnet_like() -> Graph:
    b = GraphBuilder("resnet_like")
    x = b.input("x", (1, 3, 16, 16))
    y = b.max_pool2d(b.relu(conv_bn(b, x, 8)), 3, 2, 1)
    for out, stride in [(8, 1), (8, 1), (16, 2), (16, 1)]:
        y = residual_block(b, y, out, stride)
    y = b.reshape(b.global_avg_pool2d(y), (1, 16))
    y = b.bias_add(b.dense(y, b.constant(rand(10, 16))), b.constant(rand(10)))
    return b.build(y)


def test_resnet_like_has_under_half_the_kernels_fused():
    graph = simplify_graph(resnet_like())
    fused = partition(graph)
    with knobs.scope(fusion=False):
        unfused = partition(graph)
    assert len(fused) < len(unfused) / 2
    assert sum(len(g.ops) > 1 for g in fused) == 11  # each conv with its epilogue
    check_runs(graph, fused)
