"""Lowering graph ops to unscheduled PrimFuncs: structure, names, and numerics of every op."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import HexirError
from hexir.graph.lower import lower, lower_op, lowered_kinds
from hexir.graph.workloads import workload
from hexir.ir.tir import (
    Allocate,
    Block,
    BufferLoad,
    BufferRegion,
    FloatImm,
    For,
    IntImm,
    PrimFunc,
    Select,
    Seq,
)
from hexir.ir.visit import walk
from hexir.ops import slice_indices
from hexir.ops.builder import GraphBuilder
from hexir.ops.compute import bound


def blocks(func: PrimFunc) -> list[Block]:
    return [n for n in walk(func.body) if isinstance(n, Block)]


def block_names(func: PrimFunc) -> list[str]:
    return [b.name for b in blocks(func)]


def loops(func: PrimFunc) -> list[For]:
    return [n for n in walk(func.body) if isinstance(n, For)]


# ---------------------------------------------------------------------------------------------
# Structure


def test_matmul_is_the_design_example():
    func = workload("matmul", M=8, N=6, K=4)
    assert [p.name for p in func.params] == ["A", "B", "C"]
    assert func.num_outputs == 1 and func.outputs[0].shape == (8, 6)
    assert [(f.var.name, f.extent, f.kind) for f in loops(func)] == [
        ("i0", 8, "serial"),
        ("i1", 6, "serial"),
        ("k0", 4, "serial"),
    ]
    (block,) = blocks(func)
    assert block.name == "matmul"
    assert [(iv.var.name, iv.kind, iv.dom) for iv in block.iter_vars] == [
        ("vi0", "spatial", 8),
        ("vi1", "spatial", 6),
        ("vk0", "reduce", 4),
    ]
    assert [iv.binding for iv in block.iter_vars] == [f.var for f in loops(func)]
    vi, vj, vk = (iv.var for iv in block.iter_vars)
    a, b, c = func.params
    assert block.reads == (BufferRegion(a, (vi, vk)), BufferRegion(b, (vk, vj)))
    assert block.writes == (BufferRegion(c, (vi, vj)),)
    assert block.init is not None and block.init.value == FloatImm(0.0, "float32")
    assert hexir.parse(str(func)) == func


@pytest.mark.parametrize(
    "func, names",
    [
        (
            workload("softmax", M=4, N=8),
            ["softmax_max", "softmax_exp", "softmax_sum", "softmax_norm"],
        ),
        (
            workload("log_softmax", M=4, N=8),
            ["log_softmax_max", "log_softmax_sum", "log_softmax_norm"],
        ),
        (
            workload("layer_norm", M=4, N=8),
            ["layer_norm_mean", "layer_norm_var", "layer_norm_norm"],
        ),
        (workload("dense", M=4, N=8, K=3, activation="relu"), ["dense", "bias_add", "relu"]),
        (workload("dense", M=4, N=8, K=3, bias=False), ["dense"]),
    ],
)
def test_block_names_and_allocations(func, names):
    assert block_names(func) == names
    stmts = func.body.stmts if isinstance(func.body, Seq) else (func.body,)
    allocs = [s for s in stmts if isinstance(s, Allocate)]
    # Intermediates are declared first, in global scope, named after the stage that writes them.
    assert list(stmts[: len(allocs)]) == allocs
    assert [a.buffer.name for a in allocs] == names[:-1]
    assert all(a.buffer.scope == "global" for a in allocs)


def test_repeated_op_names_get_suffixes_and_loop_vars_stay_unique():
    b = GraphBuilder("g")
    x = b.input("x", (3, 4))
    graph = b.build(b.relu(b.exp(b.relu(x))))
    func = lower(graph)
    assert block_names(func) == ["relu", "exp", "relu_1"]
    assert [p.name for p in func.params] == ["in0", "out0"]
    assert func.name == "fused_relu_exp_relu"
    names = [f.var.name for f in loops(func)]
    assert names == ["i0", "i1", "i2", "i3", "i4", "i5"]
    assert len({iv.var.name for blk in blocks(func) for iv in blk.iter_vars}) == 6


def test_params_are_inputs_then_constants_by_first_use_then_outputs(rng):
    b = GraphBuilder("g")
    x = b.input("x", (2, 3))
    c_late = b.constant(np.arange(3, dtype=np.float32) + 1, name="late")
    b.constant(np.ones(3, np.float32), name="unused")
    c_early = b.constant(np.full((2, 3), 2.0, np.float32), name="early")
    y = b.add(b.mul(x, c_early), c_late)
    graph = b.build([y, b.relu(y)])
    func = lower(graph)
    assert [(p.name, p.shape) for p in func.params] == [
        ("in0", (2, 3)),
        ("in1", (2, 3)),
        ("in2", (3,)),
        ("out0", (2, 3)),
        ("out1", (2, 3)),
    ]
    assert func.num_outputs == 2
    source = func.attr("source")
    assert "hexir.constant" not in source and "@late" not in source
    xs = rng.standard_normal((2, 3)).astype(np.float32)
    run_and_compare(func, [xs, graph.constant("early"), graph.constant("late")], 1e-6)


def test_same_computation_from_two_models_is_the_same_func():
    def model(name: str, placement: str, value: str) -> hexir.Graph:
        b = GraphBuilder(name, placement=placement)
        x, w = b.input(f"{value}_x", (4, 5)), b.input(f"{value}_w", (6, 5))
        return b.build(b.relu(b.dense(x, w, name=f"{value}_d"), name=f"{value}_r"))

    one, two = lower(model("a", "cpu", "p")), lower(model("bee", "cuda:0", "q"))
    assert one == two
    assert hexir.workload_key(one) == hexir.workload_key(two)
    assert "%0 = hexir.dense %in0, %in1" in one.attr("source")


def test_lower_op_is_lower_of_the_one_op_graph():
    b = GraphBuilder("g")
    x = b.input("x", (3, 4))
    y = b.add(x, x)
    func = lower_op(b.ops[0])
    assert func == lower(b.build(y))
    assert func.name == "add" and [p.name for p in func.params] == ["in0", "out0"]
    with pytest.raises(HexirError):
        lower_op(_constant_op())


def _constant_op():
    b = GraphBuilder("c")
    b.constant(np.ones(2, np.float32))
    return b.ops[0]


def test_zero_dim_outputs():
    func = workload("relu", shape=())
    (block,) = blocks(func)
    assert block.iter_vars == () and loops(func) == []
    func = workload("reduce_sum", shape=(3, 4))  # every axis by default: a scalar
    (block,) = blocks(func)
    assert [iv.kind for iv in block.iter_vars] == ["reduce", "reduce"]
    assert func.outputs[0].shape == ()


def test_padding_is_a_guarded_select_and_no_padding_has_none():
    padded = workload("conv2d", N=1, C=2, H=5, W=5, K=2, R=3, S=3, padding=1)
    plain = workload("conv2d", N=1, C=2, H=5, W=5, K=2, R=3, S=3)
    assert any(isinstance(n, Select) for n in walk(padded.body))
    assert not any(isinstance(n, Select) for n in walk(plain.body))


def test_immediates_take_the_dtype_of_the_op():
    for func in (
        workload("conv2d", "float64", N=1, C=2, H=5, W=5, K=2, R=3, S=3, padding=1),
        workload("gelu", "float64", shape=(3,), approximate="tanh"),
        workload("softmax", "float64", M=2, N=3),
        workload("avg_pool2d", "float64", shape=(1, 1, 4, 4), kernel=3, padding=1),
    ):
        floats = {n.dtype for n in walk(func.body) if isinstance(n, FloatImm)}
        assert floats == {"float64"}, func.name
    func = workload("reduce_max", "int32", shape=(3, 4), axes=1)
    assert blocks(func)[0].init.value == IntImm(-(2**31), "int32")


def test_errors():
    b = GraphBuilder("g")
    x = b.input("x", (3,))
    with pytest.raises(HexirError, match="not computed by an op"):
        lower(b.build(x))
    graph = b.build(b.relu(x))
    with pytest.raises(HexirError, match="param_names"):
        lower(graph, param_names=["a"])
    with pytest.raises(HexirError, match="bad param name"):
        lower(graph, param_names=["a", "b c"])


# ---------------------------------------------------------------------------------------------
# Every op, lowered, verified and run against numpy.


def S(shape, start, stop, step=None):  # noqa: N802 - reads like numpy's slice
    return slice_indices(shape, start, stop, step)


# (kind, dtype, shapes, attrs, inputs): inputs "normal", "positive" (log, sqrt, ...), "grid"
# (small integer values, so that comparisons meet equal elements).
CASES = [
    ("matmul", "float32", [(3, 5), (5, 4)], {}, "normal"),
    ("matmul", "float32", [(1, 7), (7, 1)], {}, "normal"),
    ("batch_matmul", "float32", [(2, 3, 4), (2, 4, 5)], {}, "normal"),
    ("batch_matmul", "float32", [(1, 1, 3), (1, 3, 2)], {}, "normal"),
    ("batch_matmul", "float32", [(2, 3, 4), (2, 5, 4)], {"transpose_b": True}, "normal"),
    ("matmul_int4", "float32", [(3, 8), (4, 5), (2, 5)], {"group": 4}, "normal"),
    ("matmul_int4", "float32", [(1, 64), (2, 32, 3), (2, 2, 3)], {"group": 32, "weight_block": 3},
     "normal"),
    ("dense", "float32", [(3, 5), (4, 5)], {}, "normal"),
    ("dense", "float32", [(6, 2), (1, 2)], {}, "normal"),
    ("winograd_input", "float32", [(1, 6, 10, 3)], {"tile": 4}, "normal"),
    ("winograd_input", "float64", [(2, 6, 4, 9)], {"tile": 2}, "normal"),
    ("winograd_output", "float32", [(6, 6, 1, 2, 2, 3)], {"tile": 4}, "normal"),
    ("winograd_output", "float32", [(4, 4, 2, 1, 3, 9)], {"tile": 2}, "normal"),
    ("bias_add", "float32", [(2, 3, 4), (3,)], {"axis": 1}, "normal"),
    ("bias_add", "float32", [(2, 3, 4), (4,)], {"axis": -1}, "normal"),
    ("conv2d", "float32", [(1, 3, 6, 6), (4, 3, 3, 3)], {}, "normal"),
    ("conv2d", "float32", [(2, 4, 7, 6), (6, 2, 3, 2)],
     {"stride": (2, 1), "padding": (1, 2), "dilation": (2, 1), "groups": 2}, "normal"),
    ("conv2d", "float32", [(1, 4, 5, 5), (4, 1, 3, 3)], {"padding": 1, "groups": 4}, "normal"),
    ("conv2d", "float32", [(1, 2, 6, 5), (3, 2, 2, 3)], {"stride": 2, "padding": (2, 0)}, "normal"),
    # NHWC: x [N,H,W,C] and the result [N,OH,OW,K]; a depthwise one strided and padded
    ("conv2d", "float32", [(1, 6, 5, 3), (4, 3, 3, 3)], {"padding": 1, "layout": "NHWC"},
     "normal"),
    ("conv2d", "float32", [(1, 7, 6, 4), (4, 1, 3, 3)],
     {"stride": 2, "padding": 1, "groups": 4, "layout": "NHWC"}, "normal"),
    ("conv2d", "float32", [(1, 6, 6, 4), (8, 4, 1, 1)], {"stride": 2, "layout": "NHWC"},
     "normal"),
    ("batch_norm", "float32", [(2, 3, 4, 4), (3,), (3,), (3,), (3,)], {}, "positive"),
    ("batch_norm", "float32", [(3, 4), (3,), (3,), (3,), (3,)], {"axis": 0, "epsilon": 0.1},
     "positive"),
    ("add", "float32", [(2, 3, 4), (4,)], {}, "normal"),
    ("add", "float32", [(3, 1), (1, 4)], {}, "normal"),
    ("sub", "float32", [(4,), (2, 3, 4)], {}, "normal"),
    ("sub", "float32", [(3, 4), ()], {}, "normal"),
    ("mul", "float32", [(2, 1, 4), (3, 1)], {}, "normal"),
    ("mul", "float32", [(), ()], {}, "normal"),
    ("div", "float32", [(3, 4), (3, 4)], {}, "positive"),
    ("div", "float32", [(2, 3), (3,)], {}, "normal"),
    ("maximum", "float32", [(3, 4), (4,)], {}, "normal"),
    ("maximum", "float32", [(2, 1), (1, 5)], {}, "normal"),
    ("minimum", "float32", [(3, 4), (3, 1)], {}, "normal"),
    ("minimum", "float32", [(5,), (5,)], {}, "normal"),
    ("power", "float32", [(3, 4), (4,)], {}, "positive"),
    ("power", "float32", [(2, 3), ()], {}, "positive"),
    *[(kind, "int32", shapes, {}, "normal")  # divisors and shifts never 0 here
      for kind in ("mod", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor")
      + ("left_shift", "right_shift")
      for shapes in ([(3, 4), (4,)], [(2, 1, 3), (2, 3)])],
    ("fmod", "float32", [(3, 4), (4,)], {}, "positive"),
    ("where", "float32", [(3, 4), (4,), (3, 1)], {}, "normal"),
    ("where", "float32", [(5,), (5,), (5,)], {}, "normal"),
    *[(kind, "float32", shapes, {}, "grid")
      for kind in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
      for shapes in ([(3, 4), (4,)], [(2, 1, 3), (2, 3)])],
    *[(kind, "float32", [shape], {}, "positive" if kind in ("log", "sqrt", "rsqrt") else "normal")
      for kind in ("relu", "sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt")
      + ("floor", "ceil", "round", "sin", "cos", "sign")
      for shape in ((3, 5), ())],
    ("sign", "int8", [(3, 5)], {}, "normal"),
    ("sign", "uint16", [(3, 5)], {}, "normal"),
    ("gelu", "float32", [(3, 5)], {}, "normal"),
    ("gelu", "float32", [(2, 3, 4)], {"approximate": "tanh"}, "normal"),
    ("cast", "float32", [(3, 4)], {"attrs": {"dtype": "int32"}}, "normal"),
    ("cast", "int32", [(3, 4)], {"attrs": {"dtype": "float32"}}, "normal"),
    ("cast", "float32", [(5,)], {"attrs": {"dtype": "float64"}}, "normal"),
    ("cast", "float32", [(2, 3)], {"attrs": {"dtype": "bool"}}, "grid"),
    ("softmax", "float32", [(3, 5)], {}, "normal"),
    ("attention", "float32", [(2, 3, 4), (2, 4, 5), (2, 5, 6)], {}, "normal"),
    ("attention", "float32", [(2, 3, 4), (2, 4, 5), (2, 5, 6), (1, 5)], {"causal": True}, "normal"),
    ("paged_attention", "float32", [(2, 3, 4), (5, 3, 2, 4), (5, 3, 2, 4), (2, 3), (2,)], {},
     "paged"),
    ("paged_attention", "float32",
     [(2, 3, 4), (5, 3, 2, 4), (5, 3, 2, 6), (2, 3), (2,), (2, 3, 4), (2, 3, 6)], {}, "paged"),
    ("softmax", "float32", [(2, 3, 4)], {"axis": 1}, "normal"),
    ("softmax", "float32", [(2, 3, 4)], {"axis": 0}, "normal"),
    ("log_softmax", "float32", [(3, 5)], {}, "normal"),
    ("log_softmax", "float32", [(2, 3, 4)], {"axis": 1}, "normal"),
    ("log_softmax", "float32", [(2, 3, 4)], {"axis": 0}, "normal"),
    ("layer_norm", "float32", [(3, 8), (8,), (8,)], {}, "normal"),
    ("layer_norm", "float32", [(2, 3, 4), (3, 4), (3, 4)], {"axis": 1, "epsilon": 1e-3}, "normal"),
    ("rms_norm", "float32", [(3, 8), (8,)], {}, "normal"),
    ("rms_norm", "float32", [(2, 3, 4), (3, 4)], {"axis": 1, "epsilon": 1e-3}, "normal"),
    *[(kind, "float32", [(3, 4, 5)], attrs, "grid")  # ties: the first (or last) index
      for kind in ("argmax", "argmin")
      for attrs in ({"axis": 1}, {"axis": -1, "keepdims": True, "last": True})],
    *[(kind, "float32", [(3, 4, 5)], attrs, "normal")
      for kind in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod")
      for attrs in ({"axes": (1,)}, {"axes": (0, 2), "keepdims": True}, {})],
    ("layout_transform", "float32", [(1, 8, 3, 5)], {"src": "NCHW", "dst": "NHWC"}, "normal"),
    ("layout_transform", "float32", [(2, 3, 5, 4, 4)], {"src": "NCHW4c", "dst": "NHW2cC"},
     "normal"),
    ("layout_transform", "float64", [(2, 8, 3)], {"src": "NCW", "dst": "WN4cC"}, "normal"),
    ("transpose", "float32", [(2, 3, 4)], {"perm": (2, 0, 1)}, "normal"),
    ("transpose", "float32", [(3, 4)], {}, "normal"),
    *[("reshape", "float32", [src], {"attrs": {"shape": dst}}, "normal")
      for src, dst in [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, 6)), ((12,), (2, 2, 3)),
                       ((2, 6, 1, 1), (2, 6)), ((3, 4), (2, 1, 6)), ((), (1, 1)), ((1,), ())]],
    ("concat", "float32", [(2, 3), (2, 1), (2, 4)], {"axis": 1}, "normal"),
    ("concat", "float32", [(3, 2)], {"axis": 0}, "normal"),
    ("concat", "float32", [(2, 1, 2), (2, 1, 3)], {"axis": 2}, "normal"),
    ("slice", "float32", [(6, 5)], S((6, 5), (1, None), (5, None), (2, -1)), "normal"),
    ("slice", "float32", [(4, 7, 3)], S((4, 7, 3), (None, 6, 1), (None, 0, 2), (-2, -3, 1)),
     "normal"),
    ("pad", "float32", [(3, 4)], {"before": (1, 0), "after": (2, 3), "value": 0.5}, "normal"),
    # attributes named like workload()'s keywords go in attrs=
    ("arange", "int64", [], {"attrs": {"start": 2, "stop": 11, "step": 3, "dtype": "int64"}},
     "normal"),
    ("arange", "float32", [], {"attrs": {"start": 5, "stop": -4, "step": -2, "dtype": "float32"}},
     "normal"),
    ("broadcast_to", "float32", [(3, 1)], {"attrs": {"shape": (2, 3, 4)}}, "normal"),
    ("broadcast_to", "int32", [(4,)], {"attrs": {"shape": (3, 4)}}, "normal"),
    ("gather", "float32", [(10, 3), (4,)], {"axis": 0}, "normal"),  # ids in -9..9: in range
    ("gather", "float32", [(2, 12, 3), (2, 2)], {"axis": 1}, "normal"),
    ("gather_elements", "float32", [(10, 3), (4, 3)], {"axis": 0}, "normal"),
    ("gather_elements", "float32", [(2, 12, 3), (2, 5, 3)], {"axis": -2}, "normal"),
    # indices in -9..9 (in range for axes of 10 or more); duplicates: the last update wins
    ("gather_nd", "float32", [(10, 3), (4, 1)], {}, "normal"),
    ("gather_nd", "float32", [(2, 10, 12, 3), (2, 5, 2)], {"batch_dims": 1}, "normal"),
    ("scatter_elements", "float32", [(10, 3), (4, 3), (4, 3)], {"axis": 0}, "normal"),
    ("scatter_elements", "float32", [(2, 12, 3), (2, 5, 2), (2, 5, 2)],
     {"axis": 1, "reduction": "add"}, "normal"),
    ("scatter_nd", "float32", [(10, 3), (4, 1), (4, 3)], {}, "normal"),
    ("scatter_nd", "float32", [(12, 10, 3), (3, 2), (3, 3)], {"reduction": "max"}, "normal"),
    ("pad", "float32", [(2, 3, 4)], {"before": (0, 1, 2), "after": (1, 0, 0), "value": -1.0},
     "normal"),
    *[(kind, "float32", [shape], attrs, "normal")
      for kind in ("max_pool2d", "avg_pool2d")
      for shape, attrs in [((1, 2, 6, 6), {"kernel": 2}),
                           ((2, 3, 7, 5), {"kernel": (3, 2), "stride": (2, 1), "padding": 1})]],
    *[(kind, "float32", [(2, 7, 5, 3)],
       {"kernel": (3, 2), "stride": (2, 1), "padding": 1, "layout": "NHWC"}, "normal")
      for kind in ("max_pool2d", "avg_pool2d")],
    ("global_avg_pool2d", "float32", [(2, 3, 4, 5)], {}, "normal"),
    ("global_avg_pool2d", "float32", [(1, 1, 3, 3)], {}, "normal"),
    ("global_avg_pool2d", "float32", [(2, 4, 5, 3)], {"layout": "NHWC"}, "normal"),
    # float64: tighter tolerances
    ("matmul", "float64", [(4, 6), (6, 3)], {}, "normal"),
    ("conv2d", "float64", [(1, 2, 5, 5), (3, 2, 3, 3)], {"padding": 1, "stride": 2}, "normal"),
    ("softmax", "float64", [(3, 5)], {}, "normal"),
    ("log_softmax", "float64", [(3, 5)], {}, "normal"),
    ("layer_norm", "float64", [(3, 8), (8,), (8,)], {}, "normal"),
    ("rms_norm", "float64", [(3, 8), (8,)], {}, "normal"),
    ("gelu", "float64", [(4, 5)], {"approximate": "tanh"}, "normal"),
    ("avg_pool2d", "float64", [(1, 2, 5, 5)], {"kernel": 3, "padding": 1}, "normal"),
    # int32: exact, division and means truncate toward zero
    ("matmul", "int32", [(3, 5), (5, 4)], {}, "normal"),
    ("add", "int32", [(3, 4), (4,)], {}, "normal"),
    ("div", "int32", [(3, 4), (3, 4)], {}, "normal"),
    ("relu", "int32", [(3, 4)], {}, "normal"),
    ("reduce_mean", "int32", [(3, 4, 5)], {"axes": (1,)}, "normal"),
    ("reduce_max", "int32", [(3, 4)], {"axes": (1,), "keepdims": True}, "normal"),
    ("reduce_min", "uint8", [(3, 4)], {"axes": (0,)}, "normal"),
    ("reduce_sum", "int32", [(3, 4)], {}, "normal"),
    ("max_pool2d", "int32", [(1, 2, 5, 5)], {"kernel": 3, "padding": 1, "stride": 2}, "normal"),
    ("avg_pool2d", "int32", [(1, 2, 5, 5)], {"kernel": 3, "padding": 1}, "normal"),
    ("global_avg_pool2d", "int32", [(2, 3, 3, 2)], {}, "normal"),
    ("conv2d", "int32", [(1, 2, 4, 4), (2, 2, 3, 3)], {"padding": 1}, "normal"),
]  # fmt: skip

# Ops whose every output element is one IEEE operation (or a few) of its inputs.
ELEMENTWISE = {
    *("add", "sub", "mul", "div", "maximum", "minimum", "power", "where", "relu", "sigmoid"),
    *("tanh", "exp", "log", "erf", "sqrt", "rsqrt", "gelu", "cast", "bias_add", "batch_norm"),
    *("floor", "ceil", "round", "sin", "cos", "sign"),
    *("mod", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"),
    *("transpose", "layout_transform", "reshape", "concat", "slice", "pad", "max_pool2d"),
    *("gather", "arange", "broadcast_to"),
    *("gather_elements", "gather_nd", "scatter_elements", "scatter_nd"),
    "reduce_max",
    "reduce_min",
}


def case_id(case) -> str:
    kind, dtype, shapes, attrs, _ = case
    dims = ",".join("x".join(map(str, s)) or "scalar" for s in shapes)
    extra = ",".join(f"{k}={v}" for k, v in attrs.items())
    return f"{kind}-{dtype}-{dims}" + (f"-{extra}" if extra else "")


def case_func(case) -> PrimFunc:
    kind, dtype, shapes, attrs, _ = case
    return workload(kind, dtype, shapes=shapes, **attrs)


def random_inputs(func: PrimFunc, how: str, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = []
    for n, p in enumerate(func.inputs):
        a: np.ndarray
        if how == "paged" and n == 3:  # a block table: pages of the pool
            a = rng.integers(0, func.inputs[1].shape[0], p.shape)
        elif how == "paged" and n == 4:  # lengths: tokens of the table's pages (0: a new one)
            pages, slots = func.inputs[3].shape[1], func.inputs[1].shape[2]
            a = rng.integers(0 if len(func.inputs) > 5 else 1, pages * slots + 1, p.shape)
        elif p.dtype == "bool":
            a = rng.random(p.shape) < 0.5
        elif p.dtype == "uint8" and how != "grid":  # every byte: matmul_int4's two int4s
            a = rng.integers(0, 256, p.shape)
        elif p.dtype.startswith("int"):
            a = rng.integers(1, 10, p.shape) * rng.choice([-1, 1], p.shape)  # never 0: divisors
        elif how == "positive":
            a = rng.uniform(0.5, 2.0, p.shape)
        elif how == "grid":
            a = rng.integers(-2, 3, p.shape)
        else:
            a = rng.standard_normal(p.shape)
        arrays.append(np.asarray(a).astype(p.dtype))
    return arrays


def run_and_compare(func: PrimFunc, inputs: list[np.ndarray], rtol: float) -> None:
    outs = [np.empty(p.shape, p.dtype) for p in func.outputs]
    for o in outs:
        o.fill(7)  # anything the kernel forgets to write shows
    hexir.build(func)(*inputs, *outs)
    for out, ref in zip(outs, hexir.reference(func, inputs), strict=True):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        if out.dtype.kind in "biu":
            np.testing.assert_array_equal(out, ref)
        else:
            scale = max(1.0, float(np.max(np.abs(ref), initial=0.0)))
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * scale)


def tolerance(kind: str, dtype: str) -> float:
    if dtype == "float64":
        return 1e-12 if kind in ELEMENTWISE else 1e-10
    return 1e-5 if kind in ELEMENTWISE else 1e-4


def test_every_op_has_cases():
    assert {c[0] for c in CASES} == set(lowered_kinds())
    for kind in lowered_kinds():
        assert sum(c[0] == kind for c in CASES) >= 2, kind


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_lowered_op_is_well_formed(case):
    func = case_func(case)
    hexir.verify(func)
    assert hexir.parse(str(func)) == func
    names = [f.var.name for f in loops(func)]
    assert len(names) == len(set(names))
    for blk in blocks(func):
        assert all(
            iv.binding == f.var for iv, f in zip(blk.iter_vars, _loops_of(func, blk), strict=True)
        )
        domains = {iv.var: iv.dom for iv in blk.iter_vars}
        for load in (n for n in walk(blk.body) if isinstance(n, BufferLoad)):
            for index, extent in zip(load.indices, load.buffer.shape, strict=True):
                lo, hi = bound(index, domains)
                assert 0 <= lo and hi < extent, f"{blk.name}: {load} may read out of bounds"


def _loops_of(func: PrimFunc, block: Block) -> list[For]:
    """The loops enclosing `block`, outermost first."""

    def search(node, path):
        if node is block:
            return path
        for child in _stmt_children(node):
            found = search(child, path + [node] if isinstance(node, For) else path)
            if found is not None:
                return found
        return None

    return search(func.body, []) or []


def _stmt_children(node):
    match node:
        case Seq(stmts):
            return stmts
        case For():
            return (node.body,)
    return ()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_lowered_op_matches_numpy(case, rng):
    func = case_func(case)
    inputs = random_inputs(func, case[4], rng)
    run_and_compare(func, inputs, tolerance(case[0], case[1]))


def test_conv2d_against_direct_numpy(rng):
    func = workload("conv2d", N=1, C=4, H=6, W=7, K=4, R=3, S=2, stride=(2, 1), padding=(1, 1),
                    dilation=(1, 2), groups=2)  # fmt: skip
    x, w = random_inputs(func, "normal", rng)
    y = np.full(func.outputs[0].shape, np.nan, np.float32)
    hexir.build(func)(x, w, y)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros(y.shape)
    for k in range(4):
        g = k // 2
        for oh in range(y.shape[2]):
            for ow in range(y.shape[3]):
                patch = xp[0, 2 * g : 2 * g + 2, oh * 2 : oh * 2 + 3, ow : ow + 3 : 2]
                ref[0, k, oh, ow] = np.sum(patch * w[k])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
