"""`GraphBuilder`: build a `hexir` graph op by op, each checked and shape-inferred as it is added.

    b = GraphBuilder("mlp")
    x = b.input("x", (64, 784))
    w = b.constant(np.random.rand(784, 256).astype(np.float32), name="w0")
    y = b.relu(b.matmul(x, w))
    graph = b.build(b.reduce_sum(y, axes=1))

Results are named `%0`, `%1`, ... unless `name=` is given; constants `c0`, `c1`, ... (a
constant's result value is named after the constant). Every op method takes `placement=`
(default: the builder's) and `name=`. A name used twice is a `TypeInferenceError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexir.errors import TypeInferenceError
from hexir.ir.dtype import check_dtype, numpy_dtype
from hexir.ir.graph import ConstantData, Graph, Op, TensorType, Value
from hexir.ir.op_attrs import NAME_RE
from hexir.ir.ops import make_op, slice_indices

IntOrPair = int | tuple[int, int]
Axes = int | Sequence[int] | None


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
        self._counter = 0
        self._constant_counter = 0

    # --- values -------------------------------------------------------------------------

    def _define(self, value: Value, what: str) -> Value:
        if value.name in self._values:
            raise TypeInferenceError(f"{what}: the name %{value.name} is already defined")
        self._values[value.name] = value
        return value

    def _fresh(self, prefix: str, counter: str) -> str:
        """The next unused `prefix<n>`; the counter moves on only once an op takes the name."""
        n = getattr(self, counter)
        while f"{prefix}{n}" in self._values:
            n += 1
        return f"{prefix}{n}"

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Value:
        if not NAME_RE.fullmatch(name) or any(int(d) < 0 for d in shape):
            raise TypeInferenceError(f"bad graph input %{name} of shape {tuple(shape)}")
        value = self._define(Value(name, TensorType(tuple(shape), dtype)), "graph input")
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

    # --- ops, one method each (docs/ops.md) ------------------------------------------------

    def matmul(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("matmul", a, b, placement=placement, name=name)

    def batch_matmul(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("batch_matmul", a, b, placement=placement, name=name)

    def dense(
        self, x: Value, w: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        """x[M,K] · w[N,K]ᵀ"""
        return self.op("dense", x, w, placement=placement, name=name)

    def bias_add(
        self,
        x: Value,
        b: Value,
        axis: int = 1,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op("bias_add", x, b, axis=axis, placement=placement, name=name)

    def conv2d(
        self,
        x: Value,
        w: Value,
        stride: IntOrPair = 1,
        padding: IntOrPair = 0,
        dilation: IntOrPair = 1,
        groups: int = 1,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "conv2d",
            x,
            w,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            placement=placement,
            name=name,
        )

    def batch_norm(
        self,
        x: Value,
        scale: Value,
        shift: Value,
        mean: Value,
        var: Value,
        axis: int = 1,
        epsilon: float = 1e-5,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "batch_norm",
            x,
            scale,
            shift,
            mean,
            var,
            axis=axis,
            epsilon=epsilon,
            placement=placement,
            name=name,
        )

    def add(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("add", a, b, placement=placement, name=name)

    def sub(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("sub", a, b, placement=placement, name=name)

    def mul(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("mul", a, b, placement=placement, name=name)

    def div(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("div", a, b, placement=placement, name=name)

    def maximum(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("maximum", a, b, placement=placement, name=name)

    def minimum(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("minimum", a, b, placement=placement, name=name)

    def power(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("power", a, b, placement=placement, name=name)

    def equal(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("equal", a, b, placement=placement, name=name)

    def not_equal(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("not_equal", a, b, placement=placement, name=name)

    def less(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("less", a, b, placement=placement, name=name)

    def less_equal(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("less_equal", a, b, placement=placement, name=name)

    def greater(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("greater", a, b, placement=placement, name=name)

    def greater_equal(
        self, a: Value, b: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("greater_equal", a, b, placement=placement, name=name)

    def where(
        self,
        cond: Value,
        a: Value,
        b: Value,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op("where", cond, a, b, placement=placement, name=name)

    def relu(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("relu", x, placement=placement, name=name)

    def sigmoid(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("sigmoid", x, placement=placement, name=name)

    def tanh(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("tanh", x, placement=placement, name=name)

    def exp(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("exp", x, placement=placement, name=name)

    def log(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("log", x, placement=placement, name=name)

    def erf(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("erf", x, placement=placement, name=name)

    def sqrt(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("sqrt", x, placement=placement, name=name)

    def rsqrt(self, x: Value, *, placement: str | None = None, name: str | None = None) -> Value:
        return self.op("rsqrt", x, placement=placement, name=name)

    def global_avg_pool2d(
        self, x: Value, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("global_avg_pool2d", x, placement=placement, name=name)

    def gelu(
        self,
        x: Value,
        approximate: str = "none",
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op("gelu", x, approximate=approximate, placement=placement, name=name)

    def cast(
        self, x: Value, dtype: str, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("cast", x, dtype=dtype, placement=placement, name=name)

    def softmax(
        self, x: Value, axis: int = -1, *, placement: str | None = None, name: str | None = None
    ) -> Value:
        return self.op("softmax", x, axis=axis, placement=placement, name=name)

    def layer_norm(
        self,
        x: Value,
        gamma: Value,
        beta: Value,
        axis: int = -1,
        epsilon: float = 1e-5,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "layer_norm", x, gamma, beta, axis=axis, epsilon=epsilon, placement=placement, name=name
        )

    def reduce_sum(
        self,
        x: Value,
        axes: Axes = None,
        keepdims: bool = False,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "reduce_sum", x, axes=axes, keepdims=keepdims, placement=placement, name=name
        )

    def reduce_mean(
        self,
        x: Value,
        axes: Axes = None,
        keepdims: bool = False,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "reduce_mean", x, axes=axes, keepdims=keepdims, placement=placement, name=name
        )

    def reduce_max(
        self,
        x: Value,
        axes: Axes = None,
        keepdims: bool = False,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "reduce_max", x, axes=axes, keepdims=keepdims, placement=placement, name=name
        )

    def transpose(
        self,
        x: Value,
        perm: Sequence[int] | None = None,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op("transpose", x, perm=perm, placement=placement, name=name)

    def reshape(
        self,
        x: Value,
        shape: Sequence[int],
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op("reshape", x, shape=shape, placement=placement, name=name)

    def concat(
        self,
        xs: Sequence[Value],
        axis: int,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op("concat", *xs, axis=axis, placement=placement, name=name)

    def slice(
        self,
        x: Value,
        start: Sequence[int | None],
        stop: Sequence[int | None],
        step: Sequence[int | None] | None = None,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        """`x[start:stop:step]` per axis, Python-style (negatives count from the end)."""
        attrs = slice_indices(x.type.shape, start, stop, step)
        return self.op("slice", x, **attrs, placement=placement, name=name)

    def pad(
        self,
        x: Value,
        before: Sequence[int] | int,
        after: Sequence[int] | int,
        value: float = 0.0,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "pad", x, before=before, after=after, value=value, placement=placement, name=name
        )

    def max_pool2d(
        self,
        x: Value,
        kernel: IntOrPair,
        stride: IntOrPair | None = None,
        padding: IntOrPair = 0,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "max_pool2d",
            x,
            kernel=kernel,
            stride=stride,
            padding=padding,
            placement=placement,
            name=name,
        )

    def avg_pool2d(
        self,
        x: Value,
        kernel: IntOrPair,
        stride: IntOrPair | None = None,
        padding: IntOrPair = 0,
        *,
        placement: str | None = None,
        name: str | None = None,
    ) -> Value:
        return self.op(
            "avg_pool2d",
            x,
            kernel=kernel,
            stride=stride,
            padding=padding,
            placement=placement,
            name=name,
        )
