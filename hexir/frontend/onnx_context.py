"""What an ONNX node's converter works with: the node, its inputs as Hexir values or constant
arrays, and a way to add ops. Used by `onnx_import` (the driver) and `onnx_ops*` (converters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexir.ir.dtype import check_dtype, numpy_dtype
from hexir.ir.graph import Op, Value
from hexir.ir.symbolic import Dim, Sym, SymbolicError
from hexir.ops.builder import GraphBuilder

# Constant inputs bigger than this are not evaluated at import time: a shape, axes or pads
# input is small, and anything bigger is a real tensor for the compiler to fold.
KNOWN_LIMIT = 1 << 16
# What `Context.array`'s refusal says of an input the importer needs as a constant, the
# tensor's name in group 1: "input 1 (starts, 'begin') must be a constant".
MUST_BE_CONSTANT = re.compile(r"\(\w+, '([^']+)'\) must be a constant")

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.$-]")


class Unsupported(Exception):
    """What about one node Hexir cannot import (the message leaves out the node)."""


def clean_name(name: str, fallback: str = "t") -> str:
    """An ONNX name in the graph's identifier alphabet ([A-Za-z0-9_.$-]+)."""
    if isinstance(name, bytes):  # a string field that is not UTF-8 (a damaged file)
        name = name.decode("utf-8", "replace")
    cleaned = _BAD_CHARS.sub("_", name).strip("_")
    return cleaned or fallback


def normalized_axis(axis: int, ndim: int) -> int:
    """An ONNX axis (negative counts from the end) as 0..ndim-1; Unsupported out of range."""
    if not -ndim <= axis < ndim:
        raise Unsupported(f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def hexir_dtype(elem_type: int, what: str) -> str:
    """The Hexir dtype of an ONNX element type; Unsupported for the others."""
    from onnx import helper

    try:
        return check_dtype(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name)
    except (ValueError, KeyError, TypeError):
        name = _type_name(elem_type)
        raise Unsupported(f"{what} has element type {name}, Hexir has no such dtype") from None


def _type_name(elem_type: int) -> str:
    from onnx import TensorProto

    if not elem_type:
        return "undefined"
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:  # a code ONNX does not define
        return f"{elem_type} (not an ONNX type)"


def tensor_array(tensor: Any, what: str) -> np.ndarray:
    """The data of an ONNX TensorProto (an initializer, a Constant's value) as an array;
    Unsupported where its element type has no Hexir dtype or its data does not fill its dims
    (a damaged file)."""
    from onnx import TensorProto, numpy_helper

    if not isinstance(tensor, TensorProto):  # an attribute of another type (a damaged file)
        raise Unsupported(f"{what} is not a tensor")
    hexir_dtype(tensor.data_type, what)
    try:
        return np.asarray(numpy_helper.to_array(tensor))
    except (ValueError, TypeError) as e:
        dims = "x".join(map(str, tensor.dims)) or "scalar"
        raise Unsupported(f"{what}: its data does not match its shape {dims} ({e})") from None


@dataclass(frozen=True, slots=True)
class Node:
    """One ONNX node, its attributes decoded to Python values."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]

    @property
    def label(self) -> str:
        return f"node {self.name!r} ({self.op_type})"


class Context:
    """The import in progress: ONNX tensor names bound to Hexir values, the current node."""

    def __init__(self, builder: GraphBuilder, initializers: Mapping[str, Any], opset: int):
        self.builder = builder
        self.initializers = dict(initializers)
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.owner: dict[str, str] = {}  # Hexir value name -> the ONNX tensor it helped make
        self.node: Node | None = None
        self._producers: dict[str, Op] = {}
        self._known: dict[str, np.ndarray] = {}
        self._unknown: set[str] = set()  # values `known` found to depend on an input
        # A DequantizeLinear's float output -> (its quantized input, scale, zero point, axis):
        # what a MatMul of two such outputs multiplies as integers (onnx_ops_quant.py).
        self.dequantized: dict[str, tuple[Value, Value, Value | None, int]] = {}

    # --- the current node's inputs ---------------------------------------------------------

    @property
    def current(self) -> Node:
        assert self.node is not None
        return self.node

    def has(self, i: int) -> bool:
        inputs = self.current.inputs
        return i < len(inputs) and inputs[i] != ""

    def input(self, i: int) -> Value:
        if not self.has(i):
            raise Unsupported(f"input {i} is missing")
        return self.value_of(self.current.inputs[i])

    def optional(self, i: int) -> Value | None:
        return self.input(i) if self.has(i) else None

    def array(self, i: int, what: str) -> np.ndarray:
        """The value of input `i` where the importer needs it now (a shape, axes, pads)."""
        name = self.current.inputs[i] if self.has(i) else ""
        if name in self.initializers:
            return self.initializer_array(name)
        known = self.known(self.value_of(name)) if name else None
        if known is None:
            raise Unsupported(
                f"input {i} ({what}, {name!r}) must be a constant (an initializer or computed "
                "from constants and static shapes)"
            )
        return known

    def optional_array(self, i: int, what: str) -> np.ndarray | None:
        return self.array(i, what) if self.has(i) else None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.current.attrs.get(key, default)

    def float_attr(self, key: str, default: float) -> float:
        """A float attribute as the decimal it was written as: ONNX keeps float32, so 1e-5
        arrives as 9.99999975e-06; its shortest float32 spelling gives 1e-5 back."""
        value = self.current.attrs.get(key)
        return default if value is None else float(str(np.float32(value)))

    def initializer_array(self, name: str) -> np.ndarray:
        return tensor_array(self.initializers[name], f"initializer {name!r}")

    def value_of(self, name: str) -> Value:
        """The Hexir value of an ONNX tensor; an initializer becomes a constant on first use."""
        value = self.values.get(name)
        if value is None and name in self.initializers:
            value = self._constant(self.initializer_array(name))
            self.values[name] = value
        if value is None:
            raise Unsupported(f"tensor {name!r} is used before it is defined")
        return value

    # --- adding ops ------------------------------------------------------------------------

    def op(self, kind: str, *operands: Value, **attrs: Any) -> Value:
        value = self.builder.op(kind, *operands, **attrs)
        self._producers[value.name] = self.builder.ops[-1]
        self._own(value)
        return value

    def constant(self, array: np.ndarray | float | int | bool, dtype: str | None = None) -> Value:
        value = self._constant(np.asarray(array, numpy_dtype(dtype) if dtype else None))
        self._own(value)
        return value

    def _constant(self, array: np.ndarray) -> Value:
        value = self.builder.constant(array)
        if array.size <= KNOWN_LIMIT:
            self._known[value.name] = np.asarray(array).reshape(value.type.shape)
        return value

    def scalar(self, value: float | int | bool, like: Value) -> Value:
        """A rank-0 constant of `like`'s dtype."""
        return self.constant(np.asarray(value, numpy_dtype(like.type.dtype)))

    def producer(self, value: Value) -> Op | None:
        """The op that made `value` (None for inputs and constants)."""
        return self._producers.get(value.name)

    def _own(self, value: Value) -> None:
        outputs = self.current.outputs if self.node is not None else ()
        if outputs and outputs[0]:
            self.owner[value.name] = outputs[0]

    # --- values known at import time ------------------------------------------------------

    def dims_value(self, dims: Sequence[Dim], shape: tuple[int, ...] | None = None) -> Value:
        """An int64 tensor of these dimensions (1-D, or of `shape`): a constant where they are
        numbers; where some are symbols, the ops that compute it at run time ([d] is an
        arange from d to d + 1), its array known here with the symbols in it (`known`), so
        that the converters reading it as a shape see them."""
        shape = (len(dims),) if shape is None else shape
        if not any(isinstance(d, Sym) for d in dims):
            return self.constant(np.asarray(dims, np.int64).reshape(shape))
        parts = [
            self.op("arange", start=d, stop=d + 1)
            if isinstance(d, Sym)
            else self.constant(np.asarray([d], np.int64))
            for d in dims
        ]
        value = parts[0] if len(parts) == 1 else self.op("concat", *parts, axis=0)
        if shape != (len(dims),):
            value = self.op("reshape", value, shape=shape)
        self._known[value.name] = np.asarray(dims, object).reshape(shape)
        return value

    def known(self, value: Value) -> np.ndarray | None:
        """The array of `value` when it follows from constants and the inputs' shapes alone,
        else None. Where the shapes are symbolic it is an object array whose elements are
        ints and Syms (a Shape node's output, and the arithmetic on it)."""
        from hexir.graph.evaluate import evaluate_op

        if value.name in self._known:
            return self._known[value.name]
        op = self._producers.get(value.name)
        if op is None or value.type.symbolic or value.type.size > KNOWN_LIMIT:
            return None  # a graph input, a big constant, or too big to evaluate here
        if value.name in self._unknown:
            return None
        # (Each value is asked once: a chain of ops back to an input, asked again at every
        # node that reads it, took a 12-layer quantized GPT-2 minutes to import.)
        operands = []
        for v in op.operands:
            array = self.known(v)
            if array is None:
                self._unknown.add(value.name)
                return None
            operands.append(array)
        if any(a.dtype == object for a in operands):
            array = _symbolic_evaluate(op, operands)
        else:
            array = evaluate_op(op, operands)
        if array is None:
            self._unknown.add(value.name)
            return None
        self._known[value.name] = array
        return array


def _symbolic_evaluate(op: Op, operands: list[np.ndarray]) -> np.ndarray | None:
    """`op`'s numpy semantics on object arrays that hold Syms (numpy's reshapes,
    concatenations, slices and arithmetic work on any objects): an object array while a Sym
    is left in it; None where the symbols do not allow the op (seq * past, int(seq))."""
    from hexir.ops import op_def

    semantics = op_def(op.kind)
    if semantics is None or semantics.evaluate is None:
        return None
    try:
        array = np.asarray(semantics.evaluate(list(operands), dict(op.attrs)), object)
        if array.shape != op.result.type.shape:
            return None
        if any(isinstance(d, Sym) for d in array.reshape(-1)):
            return array
        return array.astype(numpy_dtype(op.result.type.dtype))
    except (SymbolicError, TypeError, ValueError, ArithmeticError):
        return None


def int_list(values: Sequence[int] | np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def dim_list(values: Sequence[Dim] | np.ndarray) -> list[Dim]:
    """`int_list`, keeping the Syms of a shape known with symbols (`Context.known`)."""
    return [v if isinstance(v, Sym) else int(v) for v in np.asarray(values).reshape(-1)]
