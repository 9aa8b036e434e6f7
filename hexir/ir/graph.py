"""The `hexir` dialect: a graph of ops on tensors, in SSA form.

A `Graph` is an ordered list of `Op`s over SSA `Value`s of `TensorType(shape, dtype)`. Every
op has a name (`hexir.matmul`, ...), operands, attributes, one result and a `placement`.
Nodes are frozen dataclasses with structural equality. Graphs are built with
`hexir.ops.builder.GraphBuilder`, which infers shapes and checks attributes as each op is added;
docs/ops.md lists every op, its operands and its attributes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from hexir.ir.arrays import aligned_copy
from hexir.ir.dtype import check_dtype
from hexir.ir.symbolic import Dim, Sym, as_dim
from hexir.ir.tir import Annotations, AnnotationValue


@dataclass(frozen=True, slots=True, repr=False)
class TensorType:
    """A shape and an element type. A dimension is an int or a `Sym` (hexir/ir/symbolic.py):
    `TensorType((1, "seq", 768))` reads "seq" as the symbol; `size` is then symbolic too."""

    shape: tuple[Dim, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(as_dim(s) for s in self.shape))

    @property
    def size(self) -> Dim:
        if self.symbolic:
            n: Dim = 1
            for d in self.shape:
                n = d * n
            return n
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def symbolic(self) -> bool:
        """Whether a dimension is a symbol."""
        return any(type(d) is Sym for d in self.shape)

    def __repr__(self) -> str:
        from hexir.ir.graph_text import print_tensor_type

        return print_tensor_type(self)


@dataclass(frozen=True, slots=True, repr=False)
class Value:
    """An SSA value: a graph input or the result of one op."""

    name: str
    type: TensorType

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type!r}"


@dataclass(frozen=True, slots=True, repr=False)
class Op:
    """One op. `attrs` are sorted by key; `placement` is "cpu", "cuda:0", ..."""

    name: str
    operands: tuple[Value, ...]
    result: Value
    attrs: Annotations = ()
    placement: str = "cpu"

    def attr(self, key: str, default: AnnotationValue | None = None) -> AnnotationValue | None:
        return dict(self.attrs).get(key, default)

    @property
    def kind(self) -> str:
        """The op name without its dialect: "matmul" for "hexir.matmul"."""
        return self.name.split(".", 1)[1]

    def __repr__(self) -> str:
        from hexir.ir.graph_text import print_op

        return print_op(self)


class ConstantData:
    """The array behind a `hexir.constant` op: immutable, compared by dtype, shape and bytes."""

    __slots__ = ("array", "_digest")

    def __init__(self, array: np.ndarray):
        # A private copy (the caller's array stays writable), rank kept even for scalars, on
        # a cache line: kernels read it in place as a weight.
        array = aligned_copy(array)
        array.setflags(write=False)
        self.array = array
        self._digest = hashlib.sha256(
            f"{array.dtype.str}{array.shape}".encode() + array.tobytes()
        ).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstantData) and self._digest == other._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        return f"ConstantData({self.array.dtype}, {self.array.shape})"


@dataclass(frozen=True, slots=True, repr=False)
class Graph:
    """A whole graph: inputs, ops in order, outputs, and the data of its constants by name."""

    name: str
    inputs: tuple[Value, ...]
    ops: tuple[Op, ...]
    outputs: tuple[Value, ...]
    constants: tuple[tuple[str, ConstantData], ...] = ()

    def constant(self, name: str) -> np.ndarray:
        for key, data in self.constants:
            if key == name:
                return data.array
        raise KeyError(f"graph @{self.name} has no constant @{name}")

    def constant_arrays(self) -> dict[str, np.ndarray]:
        """The data of each constant op, by the name of its result."""
        return {
            op.result.name: self.constant(str(op.attr("name")))
            for op in self.ops
            if op.kind == "constant"
        }

    def __repr__(self) -> str:
        from hexir.ir.graph_text import print_graph

        return print_graph(self)

    __str__ = __repr__
