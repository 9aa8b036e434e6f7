"""Numpy semantics of every op of the `hexir` dialect (docs/ops.md) and `evaluate(graph, inputs)`.

    outputs = evaluate(graph, [x])           # or evaluate(graph, {"x": x})
    y = evaluate_op(op, [a, b])              # one op, result of exactly op.result.type

Each op kind maps to one small function of (operand arrays, attrs) -> array; the driver casts
its answer to the op's result dtype. Precision, chosen per op to be the best answer a kernel
of the result dtype can be compared with:

- one IEEE operation per element (add, sub, mul, div, maximum, minimum, relu, bias_add, pad,
  comparisons, data movement) runs in the operand dtype, so it rounds exactly as a kernel does;
- everything else (transcendentals, power, contractions, reductions, normalizations, pools)
  runs in float64 and is rounded to the result dtype once;
- integers run in int64 and wrap to the result dtype as two's-complement C arithmetic does;
  integer division and integer means truncate toward zero, as C does.

Floating-point exceptions are not errors: inf and nan are values, as in the kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hexir.errors import HexirError
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph, Op, Value
from hexir.ir.tir import AnnotationValue

Attrs = dict[str, AnnotationValue]
OpFn = Callable[[list[np.ndarray], Attrs], np.ndarray]

__all__ = ["evaluate", "evaluate_op", "constant_array", "erf", "OP_SEMANTICS"]


# ---------------------------------------------------------------------------------------------
# Graphs


def evaluate(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """Run `graph` op by op in numpy; one fresh array per graph output, in order."""
    env = bind_inputs(graph, inputs)
    for op in graph.ops:
        if op.kind == "constant":
            env[op.result.name] = constant_array(graph, op)
        else:
            env[op.result.name] = evaluate_op(op, [_lookup(env, v, op) for v in op.operands])
    return [np.array(_lookup(env, v, None)) for v in graph.outputs]


def evaluate_op(op: Op, operands: Sequence[np.ndarray]) -> np.ndarray:
    """The numpy value of one non-constant op, of exactly `op.result.type`."""
    fn = OP_SEMANTICS.get(op.kind)
    if fn is None:
        raise HexirError(f"no numpy semantics for op kind {op.kind!r}: {op!r}")
    try:
        with np.errstate(all="ignore"):
            out = np.asarray(fn(list(operands), dict(op.attrs)))
            out = out.astype(numpy_dtype(op.result.type.dtype), copy=False)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise HexirError(f"cannot evaluate {op!r}: {type(e).__name__}: {e}") from e
    if out.shape != op.result.type.shape:
        raise HexirError(
            f"evaluating {op!r} gave shape {out.shape}, its type says {op.result.type.shape}"
        )
    return out


def constant_array(graph: Graph, op: Op) -> np.ndarray:
    """The data of a `hexir.constant` op, checked against its result type."""
    name = op.attr("name")
    try:
        array = graph.constant(str(name))
    except KeyError:
        raise HexirError(f"graph @{graph.name} has no data for constant @{name}: {op!r}") from None
    _check_array(array, op.result, f"constant @{name}")
    return array


def _lookup(env: dict[str, np.ndarray], value: Value, op: Op | None) -> np.ndarray:
    try:
        return env[value.name]
    except KeyError:
        where = f" in {op!r}" if op is not None else " as a graph output"
        raise HexirError(f"%{value.name} is used{where} before it is defined") from None


def bind_inputs(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The graph's inputs by name, from a list in graph order or a dict by name, each checked
    for its shape and dtype (shared by the numpy evaluator and compiled modules)."""
    names = [v.name for v in graph.inputs]
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            raise HexirError(
                f"graph @{graph.name} takes inputs {_names(names)}; missing {_names(missing)}, "
                f"unexpected {_names(extra)}"
            )
        arrays = [inputs[n] for n in names]
    else:
        arrays = list(inputs)
        if len(arrays) != len(names):
            raise HexirError(
                f"graph @{graph.name} takes {len(names)} inputs ({_names(names)}), "
                f"got {len(arrays)}"
            )
    env: dict[str, np.ndarray] = {}
    for value, array in zip(graph.inputs, arrays, strict=True):
        array = np.asarray(array)
        _check_array(array, value, f"input %{value.name} of graph @{graph.name}")
        env[value.name] = array
    return env


def _check_array(array: np.ndarray, value: Value, what: str) -> None:
    want = numpy_dtype(value.type.dtype)
    if array.shape != value.type.shape or array.dtype != want:
        raise HexirError(
            f"{what} must be {value.type!r} (shape {value.type.shape}, numpy {want}); "
            f"got shape {array.shape}, numpy {array.dtype}"
        )


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"%{n}" for n in names) or "none"


# ---------------------------------------------------------------------------------------------
# Precision helpers


def _wide(x: np.ndarray) -> np.ndarray:
    """float64 for floats, int64 for ints, bool unchanged: where sums and products happen."""
    if x.dtype.kind == "f":
        return x.astype(np.float64, copy=False)
    if x.dtype.kind in "iu":
        return x.astype(np.int64, copy=False)
    return x


def _f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64, copy=False)


def _trunc_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """C's integer division: the quotient truncated toward zero (numpy's // floors)."""
    q = np.floor_divide(a, b)
    inexact = np.remainder(a, b) != 0
    return np.where(inexact & ((np.asarray(a) < 0) != (np.asarray(b) < 0)), q + 1, q)


def _mean(total: np.ndarray, count: np.ndarray | int) -> np.ndarray:
    if total.dtype.kind in "iub":
        return _trunc_div(total.astype(np.int64), count)
    return total / count


def _int(attrs: Attrs, key: str) -> int:
    value = attrs[key]
    if not isinstance(value, int):
        raise TypeError(f"attribute {key} must be an int, got {value!r}")
    return value


def _float(attrs: Attrs, key: str) -> float:
    value = attrs[key]
    if not isinstance(value, int | float):
        raise TypeError(f"attribute {key} must be a float, got {value!r}")
    return float(value)


def _ints(attrs: Attrs, key: str) -> tuple[int, ...]:
    value = attrs[key]
    if not isinstance(value, tuple):
        raise TypeError(f"attribute {key} must be a tuple of ints, got {value!r}")
    return tuple(int(v) for v in value)


def _lowest(dtype: np.dtype) -> float | int | bool:
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind in "iu":
        return int(np.iinfo(dtype).min)
    return False


def _on_axis(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along `axis` of an ndim-d tensor."""
    return v.reshape([-1 if d == axis else 1 for d in range(ndim)])


# ---------------------------------------------------------------------------------------------
# erf in float64: no scipy, and math.erf per element is far too slow for real tensors.
# Series for |x| < 2 and a continued fraction for erfc beyond: within a few ulp of math.erf
# over the whole line (tests/graph/test_evaluate.py checks it).

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SERIES_LIMIT = 2.0


def _exp_minus_square(x: np.ndarray) -> np.ndarray:
    # exp(-x*x) loses x*x*eps relative accuracy to the rounding of x*x; splitting x into a
    # 24-bit head (whose square is exact) and a tail keeps the tail of erfc accurate.
    head = x.astype(np.float32).astype(np.float64)
    return np.exp(-head * head) * np.exp(-(x - head) * (x + head))


def _erf_series(x: np.ndarray) -> np.ndarray:
    # erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2x^2)^n x / (1*3*...*(2n+1)): positive terms, no
    # cancellation; 40 terms reach float64 precision for |x| < 2.
    x2 = x * x
    term = x.copy()
    total = x.copy()
    for n in range(1, 40):
        term *= 2.0 * x2 / (2 * n + 1)
        total += term
    return _TWO_OVER_SQRT_PI * _exp_minus_square(x) * total


def _erfc_fraction(x: np.ndarray) -> np.ndarray:
    # erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), for x >= 2,
    # evaluated backward from a fixed depth (stable); beyond 30 it underflows to 0 anyway.
    x = np.minimum(x, 30.0)
    f = x.copy()
    for k in range(60, 0, -1):
        f = x + (0.5 * k) / f
    return _exp_minus_square(x) / (math.sqrt(math.pi) * f)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in float64 (within a few ulp of math.erf)."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.ravel()
    out = np.empty_like(flat)
    small = np.abs(flat) < _SERIES_LIMIT
    out[small] = _erf_series(flat[small])
    big = ~small
    out[big] = np.copysign(1.0 - _erfc_fraction(np.abs(flat[big])), flat[big])
    return out.reshape(x.shape)


def _erfc(x: np.ndarray) -> np.ndarray:
    # 1 - erf(x): relative accuracy of a few ulp for x >= 2 and x <= 0, where gelu needs it;
    # between 0 and 2 it is 1 - erf(x), a few ulp of 1 (ample for any float32 result).
    x = np.asarray(x, dtype=np.float64)
    flat = x.ravel()
    out = np.empty_like(flat)
    small = np.abs(flat) < _SERIES_LIMIT
    out[small] = 1.0 - _erf_series(flat[small])
    big = ~small
    tail = _erfc_fraction(np.abs(flat[big]))
    out[big] = np.where(flat[big] > 0, tail, 2.0 - tail)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# Elementwise ops


def _div(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    a, b = xs
    if a.dtype.kind in "iu":
        # Division by zero is undefined in C; 0 keeps the reference quiet and deterministic.
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, _trunc_div(a, safe))
    return np.true_divide(a, b)


def _gelu(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = _f64(xs[0])
    if attrs["approximate"] == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1.0 + np.tanh(inner))
    # x * Phi(x) = x/2 * erfc(-x/sqrt(2)): no cancellation for large negative x.
    return 0.5 * x * _erfc(-x * math.sqrt(0.5))


def _in_dtype(fn: Callable[..., np.ndarray]) -> OpFn:
    return lambda xs, attrs: fn(*xs)


def _in_f64(fn: Callable[..., np.ndarray]) -> OpFn:
    return lambda xs, attrs: fn(*(_f64(x) for x in xs))


_ELEMENTWISE: dict[str, OpFn] = {
    "add": _in_dtype(np.add),
    "sub": _in_dtype(np.subtract),
    "mul": _in_dtype(np.multiply),
    "div": _div,
    "maximum": _in_dtype(np.maximum),
    "minimum": _in_dtype(np.minimum),
    "power": _in_f64(np.power),
    "where": _in_dtype(np.where),
    "equal": _in_dtype(np.equal),
    "not_equal": _in_dtype(np.not_equal),
    "less": _in_dtype(np.less),
    "less_equal": _in_dtype(np.less_equal),
    "greater": _in_dtype(np.greater),
    "greater_equal": _in_dtype(np.greater_equal),
    "relu": lambda xs, attrs: np.maximum(xs[0], np.zeros((), xs[0].dtype)),
    "sigmoid": _in_f64(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "tanh": _in_f64(np.tanh),
    "exp": _in_f64(np.exp),
    "log": _in_f64(np.log),
    "erf": _in_f64(erf),
    "sqrt": _in_f64(np.sqrt),
    "rsqrt": _in_f64(lambda x: 1.0 / np.sqrt(x)),
    "gelu": _gelu,
    "cast": lambda xs, attrs: xs[0].astype(numpy_dtype(str(attrs["dtype"]))),
    "bias_add": lambda xs, a: xs[0] + _on_axis(xs[1], _int(a, "axis"), xs[0].ndim),
}


# ---------------------------------------------------------------------------------------------
# Contractions and convolution


def _windows(
    x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> np.ndarray:
    """View of an (already padded) NCHW tensor as [N, C, OH, OW, R, S] windows; no copy."""
    n, c, h, w = x.shape
    (r, s), (sh, sw), (dh, dw) = kernel, stride, dilation
    oh = (h - dh * (r - 1) - 1) // sh + 1
    ow = (w - dw * (s - 1) - 1) // sw + 1
    s0, s1, s2, s3 = x.strides
    return np.lib.stride_tricks.as_strided(
        x,
        shape=(n, c, max(oh, 0), max(ow, 0), r, s),
        strides=(s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw),
        writeable=False,
    )


def _pad_hw(x: np.ndarray, padding: Sequence[int], value: float | int | bool) -> np.ndarray:
    ph, pw = padding
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _conv2d(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, w = _wide(xs[0]), _wide(xs[1])
    groups = _int(attrs, "groups")
    n, k = x.shape[0], w.shape[0]
    kg, cg, r, s = k // groups, w.shape[1], w.shape[2], w.shape[3]
    padded = _pad_hw(x, _ints(attrs, "padding"), 0)
    win = _windows(padded, (r, s), _ints(attrs, "stride"), _ints(attrs, "dilation"))
    oh, ow = win.shape[2], win.shape[3]
    # im2col per group, then one batched matmul: [N, G, OH*OW, Cg*R*S] @ [G, Cg*R*S, Kg].
    cols = win.reshape(n, groups, cg, oh, ow, r, s).transpose(0, 1, 3, 4, 2, 5, 6)
    cols = cols.reshape(n, groups, oh * ow, cg * r * s)
    filt = w.reshape(groups, kg, cg * r * s).transpose(0, 2, 1)
    out = np.matmul(cols, filt)
    return out.reshape(n, groups, oh, ow, kg).transpose(0, 1, 4, 2, 3).reshape(n, k, oh, ow)


_CONTRACTIONS: dict[str, OpFn] = {
    "matmul": lambda xs, attrs: np.matmul(_wide(xs[0]), _wide(xs[1])),
    "batch_matmul": lambda xs, attrs: np.matmul(_wide(xs[0]), _wide(xs[1])),
    "dense": lambda xs, attrs: np.matmul(_wide(xs[0]), _wide(xs[1]).T),
    "conv2d": _conv2d,
}


# ---------------------------------------------------------------------------------------------
# Normalizations and reductions


def _batch_norm(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, scale, shift, mean, var = (_f64(v) for v in xs)
    axis, eps = _int(attrs, "axis"), _float(attrs, "epsilon")
    inv = scale / np.sqrt(var + eps)
    return (x - _on_axis(mean, axis, x.ndim)) * _on_axis(inv, axis, x.ndim) + _on_axis(
        shift, axis, x.ndim
    )


def _layer_norm(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, gamma, beta = (_f64(v) for v in xs)
    axes = tuple(range(_int(attrs, "axis"), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = np.square(x - mean).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + _float(attrs, "epsilon")) * gamma + beta


def _softmax(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, axis = _f64(xs[0]), _int(attrs, "axis")
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _reduce_sum(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return np.sum(_wide(xs[0]), axis=_ints(attrs, "axes"), keepdims=bool(attrs["keepdims"]))


def _reduce_mean(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, axes = xs[0], _ints(attrs, "axes")
    count = math.prod(x.shape[a] for a in axes)
    return _mean(np.sum(_wide(x), axis=axes, keepdims=bool(attrs["keepdims"])), count)


def _reduce_max(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = xs[0]
    # The initial value makes an empty reduction give the kernels' identity, not a numpy error.
    return np.max(
        x, axis=_ints(attrs, "axes"), keepdims=bool(attrs["keepdims"]), initial=_lowest(x.dtype)
    )


_REDUCTIONS: dict[str, OpFn] = {
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "softmax": _softmax,
    "reduce_sum": _reduce_sum,
    "reduce_mean": _reduce_mean,
    "reduce_max": _reduce_max,
}


# ---------------------------------------------------------------------------------------------
# Data movement


def _slice(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    starts, stops, steps = _ints(attrs, "start"), _ints(attrs, "stop"), _ints(attrs, "step")
    # slice.indices gives stop = -1 for "before index 0" with a negative step; to numpy a
    # negative stop counts from the end, so spell it as None.
    index = tuple(
        slice(a, None if b < 0 else b, c) for a, b, c in zip(starts, stops, steps, strict=True)
    )
    return xs[0][index]


def _pad(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    widths = list(zip(_ints(attrs, "before"), _ints(attrs, "after"), strict=True))
    return np.pad(xs[0], widths, constant_values=np.asarray(attrs["value"]).astype(xs[0].dtype))


def _max_pool2d(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = xs[0]
    # Padding with the lowest value leaves every max to in-bounds elements only.
    padded = _pad_hw(x, _ints(attrs, "padding"), _lowest(x.dtype))
    return _windows(padded, _ints(attrs, "kernel"), _ints(attrs, "stride"), (1, 1)).max(axis=(4, 5))


def _avg_pool2d(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = _wide(xs[0])
    kernel, stride, padding = (
        _ints(attrs, "kernel"),
        _ints(attrs, "stride"),
        _ints(attrs, "padding"),
    )
    padded = _pad_hw(x, padding, 0)
    total = _windows(padded, kernel, stride, (1, 1)).sum(axis=(4, 5))
    # count_include_pad=False: divide by the in-bounds elements of each window.
    ones = _pad_hw(np.ones((1, 1) + x.shape[2:], np.int64), padding, 0)
    count = _windows(ones, kernel, stride, (1, 1)).sum(axis=(4, 5))
    return _mean(total, count)


def _global_avg_pool2d(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = xs[0]
    total = np.sum(_wide(x), axis=(2, 3), keepdims=True)
    return _mean(total, x.shape[2] * x.shape[3])


_MOVEMENT: dict[str, OpFn] = {
    "transpose": lambda xs, attrs: np.transpose(xs[0], _ints(attrs, "perm")),
    "reshape": lambda xs, attrs: np.reshape(xs[0], _ints(attrs, "shape")),
    "concat": lambda xs, attrs: np.concatenate(xs, axis=_int(attrs, "axis")),
    "slice": _slice,
    "pad": _pad,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "global_avg_pool2d": _global_avg_pool2d,
}

# op kind -> numpy function; every op of docs/ops.md except `constant`, which needs the graph.
OP_SEMANTICS: dict[str, OpFn] = {**_ELEMENTWISE, **_CONTRACTIONS, **_REDUCTIONS, **_MOVEMENT}
