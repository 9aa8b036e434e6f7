"""ONNX export: any graph Hexir can build, as a standard ONNX model that peers can run.

    export_onnx(graph, "model.onnx")     # also returns the onnx.ModelProto

The model uses the default domain at opset 17 (`OPSET`; ONNX Runtime runs it from 1.12 on)
and IR version 8. Constants become initializers; value names are kept, so graph inputs and
outputs have their Hexir names. Every op of docs/ops.md maps to standard ops, by its
definition's `export` (`hexir.ops`), which writes nodes through this module's exporter (the
`hexir.ops.Exporter` protocol); among them:

- gelu (Gelu arrived in opset 20) is spelled with Erf, or with Tanh for approximate="tanh",
  in the forms `hexir.frontend.onnx_import` recognizes and turns back into one gelu;
  rsqrt is Reciprocal(Sqrt(x)), which the importer also turns back;
- rms_norm (RMSNormalization arrived in opset 23) is Mul(x, x), ReduceMean, Add(epsilon), Sqrt,
  Div and Mul(scale), which import back as those six ops;
- dense is Gemm(transB=1) for floats and MatMul of the transposed weight for ints;
- bias_add is Add with the bias reshaped to broadcast along its axis;
- batch_norm is BatchNormalization on axis 1 and arithmetic on any other axis;
- conv2d and the pools on ints compute in float64 between two Casts (ONNX's are for floats);
- maximum, minimum on bools are Or, And; ordering comparisons of bools compare them as int32;
  relu on ints is Max(x, 0) (ONNX's Relu is for floats).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from hexir.errors import HexirError
from hexir.ir.dtype import SUB_BYTE_INTS, numpy_dtype
from hexir.ir.graph import Graph, Op, TensorType, Value
from hexir.ir.narrow import BYTE_FLOATS
from hexir.ir.symbolic import Sym
from hexir.ops import op_def

if TYPE_CHECKING:
    import onnx

OPSET = 17
IR_VERSION = 8

__all__ = ["OPSET", "export_onnx", "to_onnx"]


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


def _elem_type(dtype: str) -> int:
    from onnx import helper

    if dtype in BYTE_FLOATS:
        raise HexirError(
            f"{dtype} has no ONNX type at opset {OPSET} (8-bit floats: opset 19, float4: 23)"
        )
    if dtype in SUB_BYTE_INTS:
        raise HexirError(f"{dtype} has no ONNX type at opset {OPSET} (int4: opset 21, int2: 25)")
    return int(helper.np_dtype_to_tensor_dtype(numpy_dtype(dtype)))


def _onnx_dims(t: TensorType) -> list[int | str]:
    """A type's dims for ONNX: sizes, and each symbolic one as its dim_param (`seq`,
    `past + 1`), which the importer reads back as the same dimension."""
    return [str(d) if isinstance(d, Sym) else d for d in t.shape]


def _value_info(value: Value):
    from onnx import helper

    return helper.make_tensor_value_info(
        value.name, _elem_type(value.type.dtype), _onnx_dims(value.type)
    )


class _Exporter:
    """The nodes and initializers written so far, and the names they use (an
    `hexir.ops.Exporter`: the ops' export functions write through it)."""

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
        # (np.ascontiguousarray would make a rank-0 array rank 1: ONNX Runtime then warns
        # that the initializer's shape is not the value's.)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def scalar(self, value: float, like: Value, base: str) -> str:
        return self.const(np.asarray(value, numpy_dtype(like.type.dtype)), base)

    def ints(self, values: tuple[int, ...], base: str) -> str:
        return self.const(np.asarray(values, np.int64), base)

    def elem_type(self, dtype: str) -> int:
        return _elem_type(dtype)

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
                    name, _elem_type(value.type.dtype), _onnx_dims(value.type)
                )
            )
        return infos


def _export_op(ex: _Exporter, op: Op) -> None:
    d = op_def(op.kind)
    if d is None:
        raise NotImplementedError(f"no ONNX export of {op!r}")
    d.export(ex, op)
