"""`GraphBuilder`: build a `hexir` graph op by op, each checked and shape-inferred as it is added.

    b = GraphBuilder("mlp")
    x = b.input("x", (64, 784))
    w = b.constant(np.random.rand(784, 256).astype(np.float32), name="w0")
    y = b.relu(b.matmul(x, w))
    graph = b.build(b.reduce_sum(y, axes=1))

Results are named `%0`, `%1`, ... unless `name=` is given; constants `c0`, `c1`, ... (a
constant's result value is named after the constant). Every op method takes `placement=`
(default: the builder's) and `name=`. A name used twice is a `TypeInferenceError`.

There is one method per op of docs/ops.md, made from its definition in `hexir.ops.OPS`: the
op's operands (a sequence of them for concat), then its attributes, positional or by keyword
(left out or None: the op's default), then `placement=` and `name=`:

    b.conv2d(x, w, stride=2, padding=1)
    b.concat([x, y], axis=1)
    b.slice(x, (1, None), (-1, None))   # slice's definition takes Python-style indices

Only `constant` (data, not operands) is written here; `op(kind, ...)` builds any op by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hexir.errors import TypeInferenceError
from hexir.ir.dtype import check_dtype, numpy_dtype
from hexir.ir.graph import ConstantData, Graph, Op, TensorType, Value
from hexir.ir.op_attrs import NAME_RE
from hexir.ir.symbolic import Dim, SymbolicError, as_dim
from hexir.ops import OPS, OpDef, make_op


class GraphBuilder:
    def __init__(self, name: str, placement: str = "cpu"):
        if not NAME_RE.fullmatch(name):
            raise TypeInferenceError(f"bad graph name {name!r}; names match {NAME_RE.pattern}")
        self.name = name
        self.placement = placement
        self.inputs: list[Value] = []
        self.ops: list[Op] = []
        self.constants: list[tuple[str, ConstantData]] = []
        self._values: dict[str, Value] = {}
        self._reserved: set[str] = set()
        self._counter = 0
        self._constant_counter = 0

    def reserve(self, names: Iterable[str]) -> None:
        """Names that values added later take explicitly: fresh names skip them (a graph
        rebuilt op by op, with new ops between the ones it copies, keeps its names)."""
        self._reserved.update(names)

    # --- values -------------------------------------------------------------------------

    def _define(self, value: Value, what: str) -> Value:
        if value.name in self._values:
            raise TypeInferenceError(f"{what}: the name %{value.name} is already defined")
        self._values[value.name] = value
        return value

    def _fresh(self, prefix: str, counter: str) -> str:
        """The next unused `prefix<n>`; the counter moves on only once an op takes the name."""
        n = getattr(self, counter)
        while f"{prefix}{n}" in self._values or f"{prefix}{n}" in self._reserved:
            n += 1
        return f"{prefix}{n}"

    def input(self, name: str, shape: Sequence[Dim | str], dtype: str = "float32") -> Value:
        """A graph input; a dimension may be symbolic: a Sym, or its text ("seq", "{seq}")."""
        try:
            dims = tuple(as_dim(d) for d in shape)
        except (SymbolicError, TypeError, ValueError):
            dims = (-1,)
        if not NAME_RE.fullmatch(name) or any(isinstance(d, int) and d < 0 for d in dims):
            raise TypeInferenceError(f"bad graph input %{name} of shape {tuple(shape)}")
        value = self._define(Value(name, TensorType(dims, dtype)), "graph input")
        self.inputs.append(value)
        return value

    def constant(
        self,
        value: np.ndarray | float | int | bool | Sequence,
        name: str | None = None,
        dtype: str | None = None,
        placement: str | None = None,
    ) -> Value:
        """A constant op holding `value`; Python floats (not numpy arrays) become float32."""
        is_numpy = isinstance(value, np.ndarray | np.generic)
        array = np.asarray(value, dtype=numpy_dtype(check_dtype(dtype)) if dtype else None)
        if not is_numpy and dtype is None and array.dtype == np.float64:
            array = array.astype(np.float32)
        # a copy: ConstantData freezes the array it is given, which must not be the caller's
        array = array.astype(numpy_dtype(check_dtype(array.dtype.name)), copy=True)
        auto = name is None
        name = name or self._fresh("c", "_constant_counter")
        if any(key == name for key, _ in self.constants):
            raise TypeInferenceError(f"hexir.constant: the constant @{name} is already defined")
        op = make_op(
            "constant",
            [],
            {"name": name},
            name,
            placement or self.placement,
            result_type=TensorType(array.shape, array.dtype.name),
        )
        self.constants.append((name, ConstantData(array)))
        if auto:
            self._constant_counter = int(name[1:]) + 1
        return self._add(op)

    def _add(self, op: Op) -> Value:
        self._define(op.result, op.name)
        self.ops.append(op)
        return op.result

    def op(
        self,
        op_name: str,
        /,
        *operands: Value,
        placement: str | None = None,
        name: str | None = None,
        **attrs: object,
    ) -> Value:
        """Any op by name: `b.op("softmax", x, axis=1)`."""
        for v in operands:
            if isinstance(v, Value) and self._values.get(v.name) != v:
                raise TypeInferenceError(f"hexir.{op_name}: %{v.name} is not a value of this graph")
        result = name if name is not None else self._fresh("", "_counter")
        if name is not None and name in self._values:
            raise TypeInferenceError(f"hexir.{op_name}: the name %{name} is already defined")
        attrs = {k: v for k, v in attrs.items() if v is not None}
        op = make_op(op_name, operands, attrs, result, placement or self.placement)
        if name is None:
            self._counter = int(result) + 1
        return self._add(op)

    def build(self, outputs: Value | Sequence[Value]) -> Graph:
        outputs = (outputs,) if isinstance(outputs, Value) else tuple(outputs)
        for v in outputs:
            if self._values.get(v.name) != v:
                raise TypeInferenceError(f"graph @{self.name}: output {v!r} is not in the graph")
        return Graph(self.name, tuple(self.inputs), tuple(self.ops), outputs, tuple(self.constants))

    if TYPE_CHECKING:
        # The op methods, made from the op definitions below the class.
        def __getattr__(self, kind: str) -> Callable[..., Value]: ...


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_WRITTEN_BY_HAND = frozenset({"constant"})


def _arguments(d: OpDef) -> inspect.Signature:
    """The Python arguments of op `d`'s method: its `build` function's, or else its operands (a
    sequence of them for a variadic op), then its attributes, None meaning the op's default."""
    if d.build is not None:
        return inspect.signature(d.build)
    if d.variadic:
        params = [inspect.Parameter(f"{d.operands[0]}s", _POSITIONAL, annotation="Sequence[Value]")]
    else:
        required = len(d.operands) - d.optional  # the optional ones last, None when left out
        params = [
            inspect.Parameter(n, _POSITIONAL, annotation="Value")
            if i < required
            else inspect.Parameter(n, _POSITIONAL, default=None, annotation="Value | None")
            for i, n in enumerate(d.operands)
        ]
    params += [
        inspect.Parameter(k, _POSITIONAL, default=None, annotation="object") for k in d.attrs
    ]
    return inspect.Signature(params)


def _operands_and_attrs(
    d: OpDef, bound: inspect.BoundArguments
) -> tuple[Sequence[Value], dict[str, object]]:
    if d.build is not None:
        return d.build(*bound.args, **bound.kwargs)
    given = bound.arguments
    if d.variadic:
        operands = tuple(given[f"{d.operands[0]}s"])
    else:
        operands = tuple(given.get(n) for n in d.operands)
        while operands and operands[-1] is None:  # optional operands left out
            operands = operands[:-1]
    return operands, {k: given.get(k) for k in d.attrs}


def _op_method(d: OpDef) -> Callable[..., Value]:
    arguments = _arguments(d)

    def method(
        self: GraphBuilder,
        *args: object,
        placement: str | None = None,
        name: str | None = None,
        **kwargs: object,
    ) -> Value:
        operands, attrs = _operands_and_attrs(d, arguments.bind(*args, **kwargs))
        return self.op(d.name, *operands, placement=placement, name=name, **attrs)

    own = [
        inspect.Parameter("placement", _KEYWORD, default=None, annotation="str | None"),
        inspect.Parameter("name", _KEYWORD, default=None, annotation="str | None"),
    ]
    params = [inspect.Parameter("self", _POSITIONAL), *arguments.parameters.values(), *own]
    signature = inspect.Signature(params, return_annotation="Value")
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__name__ = d.name
    method.__qualname__ = f"GraphBuilder.{d.name}"
    method.__doc__ = f"hexir.{d.name}: {d.doc}."
    return method


def _add_op_methods() -> None:
    for d in OPS.values():
        if d.name in _WRITTEN_BY_HAND:
            continue
        if hasattr(GraphBuilder, d.name):
            raise TypeError(f"op {d.name!r} would hide GraphBuilder.{d.name}")
        setattr(GraphBuilder, d.name, _op_method(d))


_add_op_methods()
