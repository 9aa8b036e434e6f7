"""ONNX export: any graph Hexir can build, as a standard ONNX model that peers can run.

    export_onnx(graph, "model.onnx")     # also returns the onnx.ModelProto

The model uses the default domain at opset 17 (`OPSET`; ONNX Runtime runs it from 1.12 on)
and IR version 8. Constants become initializers; value names are kept, so graph inputs and
outputs have their Hexir names. Every op of docs/ops.md maps to standard ops:

- gelu (Gelu arrived in opset 20) is spelled with Erf, or with Tanh for approximate="tanh",
  in the forms `hexir.frontend.onnx_import` recognizes and turns back into one gelu;
  rsqrt is Reciprocal(Sqrt(x)), which the importer also turns back;
- dense is Gemm(transB=1) for floats and MatMul of the transposed weight for ints;
- bias_add is Add with the bias reshaped to broadcast along its axis;
- batch_norm is BatchNormalization on axis 1 and arithmetic on any other axis;
- conv2d and the pools on ints compute in float64 between two Casts (ONNX's are for floats);
- maximum, minimum on bools are Or, And; ordering comparisons of bools compare them as int32;
  relu on ints is Max(x, 0) (ONNX's Relu is for floats).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph, Op, TensorType, Value

if TYPE_CHECKING:
    import onnx

OPSET = 17
IR_VERSION = 8

__all__ = ["OPSET", "export_onnx", "to_onnx"]

# hexir op -> ONNX op with the same operands and no attributes
_SAME: dict[str, str] = {
    "matmul": "MatMul",
    "batch_matmul": "MatMul",
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "power": "Pow",
    "where": "Where",
    "equal": "Equal",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "exp": "Exp",
    "log": "Log",
    "erf": "Erf",
    "sqrt": "Sqrt",
    "global_avg_pool2d": "GlobalAveragePool",
}
# ops whose ONNX counterparts take floats only, though Hexir's take ints as well
_FLOAT_ONLY = ("conv2d", "max_pool2d", "avg_pool2d", "global_avg_pool2d")
_ORDER: dict[str, str] = {
    "less": "Less",
    "less_equal": "LessOrEqual",
    "greater": "Greater",
    "greater_equal": "GreaterOrEqual",
}


def export_onnx(graph: Graph, path: str | os.PathLike[str] | None = None) -> onnx.ModelProto:
    """`graph` as an ONNX model (checked with onnx.checker), saved to `path` when given."""
    import onnx

    model = to_onnx(graph)
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def to_onnx(graph: Graph) -> onnx.ModelProto:
    """The onnx.ModelProto of `graph`, unchecked."""
    from onnx import helper

    from hexir import __version__

    ex = _Exporter(graph)
    for op in graph.ops:
        _export_op(ex, op)
    outputs = ex.outputs()
    onnx_graph = helper.make_graph(
        ex.nodes,
        graph.name,
        [_value_info(v) for v in graph.inputs],
        outputs,
        initializer=ex.initializers,
        value_info=[_value_info(op.result) for op in graph.ops if op.kind != "constant"],
    )
    model = helper.make_model(
        onnx_graph,
        producer_name="hexir",
        producer_version=__version__,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
    )
    return model


def _ints(op: Op, key: str) -> list[int]:
    value = op.attr(key)
    assert isinstance(value, tuple), f"{op!r}: attribute {key} is not a tuple"
    return [int(v) for v in value]


def _int(op: Op, key: str) -> int:
    value = op.attr(key)
    assert isinstance(value, int), f"{op!r}: attribute {key} is not an int"
    return int(value)


def _float(op: Op, key: str) -> float:
    value = op.attr(key)
    assert isinstance(value, int | float), f"{op!r}: attribute {key} is not a float"
    return float(value)


def _elem_type(dtype: str) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(numpy_dtype(dtype)))


def _value_info(value: Value):
    from onnx import helper

    return helper.make_tensor_value_info(
        value.name, _elem_type(value.type.dtype), list(value.type.shape)
    )


class _Exporter:
    """The nodes and initializers written so far, and the names they use."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list = []
        self.initializers: list = []
        self.used = {v.name for v in graph.inputs} | {op.result.name for op in graph.ops}

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.used:
            name, n = f"{base}_{n}", n + 1
        self.used.add(name)
        return name

    def node(self, op_type: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        """One node; its output is `output`, or a fresh name for a helper's result."""
        from onnx import helper

        out = output if output is not None else self.fresh(f"{inputs[0]}.{op_type.lower()}")
        name = self.fresh(f"{op_type}_{out}")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def const(self, array: np.ndarray, base: str, name: str | None = None) -> str:
        from onnx import numpy_helper

        name = name if name is not None else self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def scalar(self, value: float, like: Value, base: str) -> str:
        return self.const(np.asarray(value, numpy_dtype(like.type.dtype)), base)

    def ints(self, values: tuple[int, ...], base: str) -> str:
        return self.const(np.asarray(values, np.int64), base)

    def outputs(self) -> list:
        """The graph outputs; an output that is an input, a constant or a repeat is copied by
        an Identity (ONNX wants each output made by a node)."""
        from onnx import helper

        made = {op.result.name for op in self.graph.ops if op.kind != "constant"}
        infos, seen = [], set()
        for value in self.graph.outputs:
            name = value.name
            if name not in made or name in seen:
                name = self.node("Identity", [value.name], self.fresh(f"{value.name}.out"))
            seen.add(name)
            infos.append(
                helper.make_tensor_value_info(
                    name, _elem_type(value.type.dtype), list(value.type.shape)
                )
            )
        return infos


def _export_op(ex: _Exporter, op: Op) -> None:
    if op.kind in _FLOAT_ONLY and not op.result.type.dtype.startswith("float"):
        _export_in_float64(ex, op)
        return
    names = [v.name for v in op.operands]
    out = op.result.name
    kind = op.kind
    if kind == "constant":
        data = ex.graph.constant(str(op.attr("name"))).reshape(op.result.type.shape)
        ex.const(data, out, name=out)
    elif kind in _SAME:
        ex.node(_SAME[kind], names, out)
    elif kind in _ORDER:
        _export_order(ex, op, names)
    elif kind in ("maximum", "minimum", "not_equal", "relu", "rsqrt", "gelu", "cast"):
        _export_elementwise(ex, op, names)
    elif kind in ("dense", "bias_add", "conv2d", "batch_norm", "layer_norm", "softmax"):
        _export_nn(ex, op, names)
    elif kind in ("reduce_sum", "reduce_mean", "reduce_max"):
        _export_reduce(ex, op, names)
    else:
        _export_movement(ex, op, names)


def _export_in_float64(ex: _Exporter, op: Op) -> None:
    """An op ONNX defines for floats only, on ints: computed in float64 and cast back (exact
    while the int results fit a float64 mantissa and do not overflow)."""
    double = _elem_type("float64")

    def wide(v: Value, name: str) -> Value:
        return Value(name, TensorType(v.type.shape, "float64"))

    operands = tuple(wide(v, ex.node("Cast", [v.name], to=double)) for v in op.operands)
    result = wide(op.result, ex.fresh(f"{op.result.name}.f64"))
    _export_op(ex, replace(op, operands=operands, result=result))
    ex.node("Cast", [result.name], op.result.name, to=_elem_type(op.result.type.dtype))


def _export_order(ex: _Exporter, op: Op, names: list[str]) -> None:
    if op.operands[0].type.dtype == "bool":
        int32 = _elem_type("int32")
        names = [ex.node("Cast", [n], to=int32) for n in names]
    ex.node(_ORDER[op.kind], names, op.result.name)


def _export_elementwise(ex: _Exporter, op: Op, names: list[str]) -> None:
    out, x = op.result.name, op.operands[0]
    match op.kind:
        case "maximum" | "minimum" if x.type.dtype == "bool":
            ex.node("Or" if op.kind == "maximum" else "And", names, out)
        case "maximum" | "minimum":
            ex.node("Max" if op.kind == "maximum" else "Min", names, out)
        case "not_equal":
            ex.node("Not", [ex.node("Equal", names)], out)
        case "relu" if x.type.dtype.startswith("float"):
            ex.node("Relu", names, out)
        case "relu":
            ex.node("Max", [names[0], ex.scalar(0, x, f"{out}.zero")], out)
        case "rsqrt":
            ex.node("Reciprocal", [ex.node("Sqrt", names)], out)
        case "gelu":
            _export_gelu(ex, op)
        case "cast":
            ex.node("Cast", names, out, to=_elem_type(str(op.attr("dtype"))))


def _export_gelu(ex: _Exporter, op: Op) -> None:
    """PyTorch's spellings: x·(1 + erf(x/√2))·0.5, or the same with
    tanh(√(2/π)·(x + 0.044715·x³)) in place of the erf."""
    (x,) = op.operands
    out = op.result.name
    if op.attr("approximate") == "tanh":
        cube = ex.node("Pow", [x.name, ex.scalar(3.0, x, f"{out}.three")])
        inner = ex.node("Mul", [cube, ex.scalar(0.044715, x, f"{out}.coeff")])
        inner = ex.node("Add", [x.name, inner])
        inner = ex.node("Mul", [inner, ex.scalar(math.sqrt(2.0 / math.pi), x, f"{out}.k")])
        core = ex.node("Tanh", [inner])
    else:
        core = ex.node("Erf", [ex.node("Div", [x.name, ex.scalar(math.sqrt(2.0), x, f"{out}.k")])])
    one_plus = ex.node("Add", [core, ex.scalar(1.0, x, f"{out}.one")])
    ex.node("Mul", [ex.node("Mul", [x.name, one_plus]), ex.scalar(0.5, x, f"{out}.half")], out)


def _export_nn(ex: _Exporter, op: Op, names: list[str]) -> None:
    out, x = op.result.name, op.operands[0]
    match op.kind:
        case "dense" if x.type.dtype.startswith("float"):
            ex.node("Gemm", names, out, transB=1)
        case "dense":
            ex.node("MatMul", [names[0], ex.node("Transpose", [names[1]], perm=[1, 0])], out)
        case "bias_add":
            bias = _on_axis(ex, names[1], _int(op, "axis"), len(x.type.shape))
            ex.node("Add", [names[0], bias], out)
        case "conv2d":
            ex.node(
                "Conv",
                names,
                out,
                kernel_shape=list(op.operands[1].type.shape[2:]),
                strides=_ints(op, "stride"),
                pads=_ints(op, "padding") * 2,
                dilations=_ints(op, "dilation"),
                group=_int(op, "groups"),
            )
        case "batch_norm":
            _export_batch_norm(ex, op, names)
        case "layer_norm":
            ex.node(
                "LayerNormalization",
                names,
                out,
                axis=_int(op, "axis"),
                epsilon=_float(op, "epsilon"),
            )
        case "softmax":
            ex.node("Softmax", names, out, axis=_int(op, "axis"))


def _on_axis(ex: _Exporter, vector: str, axis: int, ndim: int) -> str:
    """A [C] vector reshaped to broadcast along `axis` of an ndim-d tensor."""
    if axis == ndim - 1:
        return vector
    shape = (-1,) + (1,) * (ndim - 1 - axis)
    return ex.node("Reshape", [vector, ex.ints(shape, f"{vector}.shape")])


def _export_batch_norm(ex: _Exporter, op: Op, names: list[str]) -> None:
    x, out = op.operands[0], op.result.name
    axis, eps = _int(op, "axis"), _float(op, "epsilon")
    ndim = len(x.type.shape)
    if axis == 1 and ndim >= 2:
        ex.node("BatchNormalization", names, out, epsilon=eps)
        return
    _, scale, shift, mean, var = (_on_axis(ex, n, axis, ndim) for n in names)
    std = ex.node("Sqrt", [ex.node("Add", [var, ex.scalar(eps, x, f"{out}.eps")])])
    inv = ex.node("Div", [scale, std])
    centered = ex.node("Sub", [names[0], mean])
    ex.node("Add", [ex.node("Mul", [centered, inv]), shift], out)


def _export_reduce(ex: _Exporter, op: Op, names: list[str]) -> None:
    out = op.result.name
    axes = tuple(_ints(op, "axes"))
    keepdims = int(bool(op.attr("keepdims")))
    if not axes:  # no axis reduced; to ONNX empty axes would mean every axis
        ex.node("Identity", names, out)
    elif op.kind == "reduce_sum":  # axes became an input in opset 13, for ReduceSum only
        ex.node("ReduceSum", [names[0], ex.ints(axes, f"{out}.axes")], out, keepdims=keepdims)
    else:
        onnx_op = "ReduceMean" if op.kind == "reduce_mean" else "ReduceMax"
        ex.node(onnx_op, names, out, axes=list(axes), keepdims=keepdims)


def _export_movement(ex: _Exporter, op: Op, names: list[str]) -> None:
    out, x = op.result.name, op.operands[0]
    match op.kind:
        case "transpose":
            ex.node("Transpose", names, out, perm=_ints(op, "perm"))
        case "reshape":
            shape = tuple(_ints(op, "shape"))
            # allowzero: an extent of 0 is an extent, not "copy the input's"
            extra = {"allowzero": 1} if 0 in shape else {}
            ex.node("Reshape", [names[0], ex.ints(shape, f"{out}.shape")], out, **extra)
        case "concat":
            ex.node("Concat", names, out, axis=_int(op, "axis"))
        case "slice":
            _export_slice(ex, op, names)
        case "pad":
            pads = ex.ints(tuple(_ints(op, "before") + _ints(op, "after")), f"{out}.pads")
            value = ex.scalar(_float(op, "value"), x, f"{out}.value")
            ex.node("Pad", [names[0], pads, value], out, mode="constant")
        case "max_pool2d" | "avg_pool2d":
            _export_pool(ex, op, names)
        case _:
            raise NotImplementedError(f"no ONNX export of {op!r}")


def _export_slice(ex: _Exporter, op: Op, names: list[str]) -> None:
    out = op.result.name
    starts, stops, steps = (tuple(_ints(op, k)) for k in ("start", "stop", "step"))
    # In normal form a stop of -1 with a negative step means "through index 0"; to ONNX a -1
    # counts from the end, so say "before the start" with the most negative int64.
    ends = tuple(
        np.iinfo(np.int64).min if b == -1 and c < 0 else b
        for b, c in zip(stops, steps, strict=True)
    )
    axes = tuple(range(len(starts)))
    inputs = [
        ex.ints(v, f"{out}.{k}")
        for k, v in zip(
            ("starts", "ends", "axes", "steps"), (starts, ends, axes, steps), strict=True
        )
    ]
    ex.node("Slice", [names[0], *inputs], out)


def _export_pool(ex: _Exporter, op: Op, names: list[str]) -> None:
    common = {
        "kernel_shape": _ints(op, "kernel"),
        "strides": _ints(op, "stride"),
        "pads": _ints(op, "padding") * 2,
    }
    if op.kind == "max_pool2d":
        ex.node("MaxPool", names, op.result.name, **common)
    else:  # hexir averages over the in-bounds elements only
        ex.node("AveragePool", names, op.result.name, count_include_pad=0, **common)
