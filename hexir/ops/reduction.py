"""Reductions and the multi-stage normalizations: reduce_sum/mean/max, argmax/argmin (the
extremum, then its index), softmax (max, exp, sum, norm), log_softmax (max, sum of exp, norm),
layer_norm (mean, var, norm) and rms_norm (mean square, norm).

A reduction ends the fusion group it joins; softmax, log_softmax, layer_norm and rms_norm are
single ops, so each is one kernel with its elementwise producers. Their numpy semantics reduce
in float64 (int64 for ints; integer means truncate toward zero, as the kernels' C division
does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail, normalize_axis
from hexir.ir.tir import Binary, Buffer, Call, Cast, Expr, Select, const
from hexir.ops.base import (
    Evaluate,
    Exporter,
    Infer,
    Lower,
    OpDef,
    Pattern,
    operand_names,
    positions_of_first,
    unpositional,
)
from hexir.ops.compute import (
    Kernel,
    ReduceFn,
    attr_float,
    attr_int,
    attr_ints,
    highest,
    lowest,
    mean,
)
from hexir.ops.numeric import (
    Attrs,
    f64,
    get_float,
    get_int,
    get_ints,
    highest_value,
    lowest_value,
    mean_of,
    wide,
)

Indices = tuple[Expr, ...]
T = TypeVar("T")
# One reduction stage: (kernel, out, the reduced extents, the input element, its dtype).
Stage = Callable[[Kernel, Buffer, tuple[int, ...], ReduceFn, str], None]

# --- reduce_sum, reduce_mean, reduce_max, reduce_min ----------------------------------------


def _reduce_infer(allowed: str) -> Infer:
    def infer(c: Check) -> TensorType:
        (x,) = c.types
        c.dtype_in(allowed)
        ndim = len(x.shape)
        if not isinstance(c.raw.get("axes"), bool) and hasattr(c.raw.get("axes"), "__index__"):
            c.raw["axes"] = (c.raw["axes"],)
        given = c.ints("axes", tuple(range(ndim)))
        axes = tuple(sorted(normalize_axis(a, ndim) for a in given))
        if len(set(axes)) != len(axes):
            fail(f"attribute 'axes' repeats an axis: {given}")
        c.out["axes"] = axes
        if c.flag("keepdims", False):
            return TensorType(tuple(1 if k in axes else d for k, d in enumerate(x.shape)), x.dtype)
        return TensorType(tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype)

    return infer


def _reduced_index(ndim: int, axes: tuple[int, ...], keepdims: bool, s: Indices, r: Indices):
    """The input index of a reduction: reduce vars on `axes`, spatial vars elsewhere."""
    index, s_at, r_at = [], 0, 0
    for d in range(ndim):
        if d in axes:
            index.append(r[r_at])
            r_at += 1
            s_at += keepdims  # a kept axis has an extent-1 spatial var that the input ignores
        else:
            index.append(s[s_at])
            s_at += 1
    return tuple(index)


def _reduce_lower(stage: Stage) -> Lower:
    def lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
        (x,) = args
        axes = attr_ints(op, "axes")
        keepdims = op.attr("keepdims") is True
        extents = tuple(x.shape[a] for a in axes)

        def load(s: Indices, r: Indices) -> Expr:
            return x[_reduced_index(len(x.shape), axes, keepdims, s, r)]

        stage(k, out, extents, load, x.dtype)

    return lower


def _sum_stage(k: Kernel, out: Buffer, extents: tuple[int, ...], load: ReduceFn, dt: str) -> None:
    k.reduce("reduce_sum", out, extents, load)


def _max_stage(k: Kernel, out: Buffer, extents: tuple[int, ...], load: ReduceFn, dt: str) -> None:
    k.reduce("reduce_max", out, extents, load, combine="max", init=lowest(dt))


def _min_stage(k: Kernel, out: Buffer, extents: tuple[int, ...], load: ReduceFn, dt: str) -> None:
    k.reduce("reduce_min", out, extents, load, combine="min", init=highest(dt))


def _prod_stage(k: Kernel, out: Buffer, extents: tuple[int, ...], load: ReduceFn, dt: str) -> None:
    k.reduce("reduce_prod", out, extents, load, combine="*", init=const(1, dt))


def _mean_stage(k: Kernel, out: Buffer, extents: tuple[int, ...], load: ReduceFn, dt: str) -> None:
    mean(k, "reduce_mean", out, extents, load, math.prod(extents))


def _reduce_sum_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return np.sum(wide(xs[0]), axis=get_ints(attrs, "axes"), keepdims=bool(attrs["keepdims"]))


def _reduce_prod_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return np.prod(wide(xs[0]), axis=get_ints(attrs, "axes"), keepdims=bool(attrs["keepdims"]))


def _reduce_mean_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, axes = xs[0], get_ints(attrs, "axes")
    count = math.prod(x.shape[a] for a in axes)
    return mean_of(np.sum(wide(x), axis=axes, keepdims=bool(attrs["keepdims"])), count)


def _extreme_evaluate(largest: bool) -> Evaluate:
    """reduce_max's (reduce_min's) numpy semantics: the initial value makes an empty
    reduction give the kernels' identity, not a numpy error."""

    def evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        x = xs[0]
        reduce, initial = (np.max, lowest_value) if largest else (np.min, highest_value)
        return reduce(
            x,
            axis=get_ints(attrs, "axes"),
            keepdims=bool(attrs["keepdims"]),
            initial=initial(x.dtype),
        )

    return evaluate


_ONNX_REDUCE = {"reduce_mean": "ReduceMean", "reduce_min": "ReduceMin", "reduce_prod": "ReduceProd"}


def _reduce_export(ex: Exporter, op: Op) -> None:
    names, out = operand_names(op), op.result.name
    axes = attr_ints(op, "axes")
    keepdims = int(bool(op.attr("keepdims")))
    if not axes:  # no axis reduced; to ONNX empty axes would mean every axis
        ex.node("Identity", names, out)
    elif op.kind == "reduce_sum":  # axes became an input in opset 13, for ReduceSum only
        ex.node("ReduceSum", [names[0], ex.ints(axes, f"{out}.axes")], out, keepdims=keepdims)
    else:
        onnx_op = _ONNX_REDUCE.get(op.kind, "ReduceMax")
        ex.node(onnx_op, names, out, axes=list(axes), keepdims=keepdims)


def _reduced_positions(reduced: Callable[[Op], tuple[int, ...]]) -> Callable:
    """A reduction's `positions`: the axis kept, one lower for each reduced axis before it
    unless kept as 1; a reduction along it reads across the positions."""

    def rule(op: Op, axes: tuple[int | None, ...]) -> int | None:
        (a,) = axes
        if a is None:
            return None
        gone = reduced(op)
        if a in gone:
            raise unpositional(op, f"it reduces axis {a}, along which the positions run")
        return a if op.attr("keepdims") else a - sum(g < a for g in gone)

    return rule


def _reduce(name: str, doc: str, allowed: str, evaluate: Evaluate, stage: Stage) -> OpDef:
    return OpDef(
        name,
        doc,
        ("x",),
        ("axes", "keepdims"),
        infer=_reduce_infer(allowed),
        fusion=Pattern.REDUCTION,
        evaluate=evaluate,
        lower=_reduce_lower(stage),
        export=_reduce_export,
        positions=_reduced_positions(lambda op: attr_ints(op, "axes")),
    )


REDUCE_SUM = _reduce("reduce_sum", "the sum over axes", "numeric", _reduce_sum_evaluate, _sum_stage)
REDUCE_MEAN = _reduce(
    "reduce_mean", "the mean over axes", "numeric", _reduce_mean_evaluate, _mean_stage
)
REDUCE_MAX = _reduce("reduce_max", "the max over axes", "any", _extreme_evaluate(True), _max_stage)
REDUCE_MIN = _reduce("reduce_min", "the min over axes", "any", _extreme_evaluate(False), _min_stage)
REDUCE_PROD = _reduce(
    "reduce_prod", "the product over axes", "numeric", _reduce_prod_evaluate, _prod_stage
)


# --- argmax, argmin ---------------------------------------------------------------------------


def _arg_infer(c: Check) -> TensorType:
    (x,) = c.types
    c.dtype_in("numeric")
    axis = c.axis("axis", len(x.shape), 0)
    if x.shape[axis] == 0:
        fail(f"axis {axis} is empty: it has no extremum to index, x is {dims(x)}")
    c.flag("last", False)
    kept = (1,) if c.flag("keepdims", False) else ()
    return TensorType(x.shape[:axis] + kept + x.shape[axis + 1 :], "int64")


def _arg_evaluate(pick: Callable[..., np.ndarray]) -> Evaluate:
    """np.argmax's or np.argmin's index (the first of ties), or with `last` the last of ties:
    the first of the axis reversed, counted from the end."""

    def evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        x, axis = xs[0], get_int(attrs, "axis")
        if attrs["last"]:
            index = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis)
        else:
            index = pick(x, axis=axis)
        index = np.asarray(index, np.int64)
        return np.expand_dims(index, axis) if attrs["keepdims"] else index

    return evaluate


def _arg_lower(extremum: str) -> Lower:
    """Two reductions along the axis: the extremum ("max" or "min"), then the lowest (with
    `last` the highest) index holding it. An index is dropped only where its element is
    strictly worse than the extremum, so NaN elements still give an index in range."""

    def lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
        (x,) = args
        axis, dt = attr_int(op, "axis"), x.dtype
        n, rest = x.shape[axis], _drop(x.shape, axis)
        keepdims, last = op.attr("keepdims") is True, op.attr("last") is True
        best = k.alloc(f"{op.kind}_best", rest, dt)
        init = lowest(dt) if extremum == "max" else highest(dt)
        k.reduce(f"{op.kind}_best", best, (n,), lambda s, r: x[_insert(s, axis, r)], extremum, init)
        worse = "<" if extremum == "max" else ">"
        miss = const(-1 if last else n, "int64")

        def position(s: Indices, r: Indices) -> Expr:
            o = _drop(s, axis) if keepdims else s
            element = x[_insert(o, axis, r)]
            return Select(Binary(worse, element, best[o]), miss, Cast("int64", r[0]))

        k.reduce(f"{op.kind}_index", out, (n,), position, "max" if last else "min", miss)

    return lower


def _arg_export(ex: Exporter, op: Op) -> None:
    ex.node(
        "ArgMax" if op.kind == "argmax" else "ArgMin",
        operand_names(op),
        op.result.name,
        axis=attr_int(op, "axis"),
        keepdims=int(op.attr("keepdims") is True),
        select_last_index=int(op.attr("last") is True),
    )


def _arg(name: str, doc: str, pick: Callable[..., np.ndarray], extremum: str) -> OpDef:
    return OpDef(
        name,
        doc,
        ("x",),
        ("axis", "keepdims", "last"),
        infer=_arg_infer,
        fusion=Pattern.REDUCTION,
        evaluate=_arg_evaluate(pick),
        lower=_arg_lower(extremum),
        export=_arg_export,
        positions=_reduced_positions(lambda op: (attr_int(op, "axis"),)),
    )


ARGMAX = _arg("argmax", "the index of the max along axis (int64)", np.argmax, "max")
ARGMIN = _arg("argmin", "the index of the min along axis (int64)", np.argmin, "min")


# --- softmax ----------------------------------------------------------------------------------


def _drop(i: tuple[T, ...], axis: int) -> tuple[T, ...]:
    return i[:axis] + i[axis + 1 :]


def _insert(s: Indices, axis: int, r: Indices) -> Indices:
    return s[:axis] + r + s[axis:]


def _softmax_infer(c: Check) -> TensorType:
    (x,) = c.types
    c.dtype_in("float")
    c.axis("axis", len(x.shape), len(x.shape) - 1)
    return x


def _softmax_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, axis = f64(xs[0]), get_int(attrs, "axis")
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """max, exp(x - max), sum, scale: the numerically stable form. The last stage multiplies
    by one reciprocal a row (the C compiler computes it outside the vectorized loop): a
    vector divide an element costs as much as the exp."""
    (x,) = args
    axis = attr_int(op, "axis")
    n, rest, dt = x.shape[axis], _drop(x.shape, axis), x.dtype
    mx = k.alloc("softmax_max", rest, dt)
    k.reduce("softmax_max", mx, (n,), lambda s, r: x[_insert(s, axis, r)], "max", lowest(dt))
    e = k.alloc("softmax_exp", x.shape, dt)
    k.compute("softmax_exp", e, lambda i: Call("exp", (x[i] - mx[_drop(i, axis)],)))
    total = k.alloc("softmax_sum", rest, dt)
    k.reduce("softmax_sum", total, (n,), lambda s, r: e[_insert(s, axis, r)])
    k.compute("softmax_norm", out, lambda i: e[i] * (const(1, dt) / total[_drop(i, axis)]))


def _softmax_export(ex: Exporter, op: Op) -> None:
    ex.node("Softmax", operand_names(op), op.result.name, axis=attr_int(op, "axis"))


SOFTMAX = OpDef(
    "softmax",
    "exp(x) / sum(exp(x)) along axis",
    ("x",),
    ("axis",),
    infer=_softmax_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_softmax_evaluate,
    lower=_softmax_lower,
    export=_softmax_export,
    flops=lambda op: 5 * op.result.type.size,  # per element: max, subtract, exp, sum, divide
    positions=positions_of_first(lambda op: (int(op.attr("axis")),)),
)


# --- log_softmax ------------------------------------------------------------------------------


def _log_softmax_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, axis = f64(xs[0]), get_int(attrs, "axis")
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _log_softmax_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """max, the sum of exp(x - max), then x - (max + log(sum)): the numerically stable form
    (every exp is of a number <= 0, and the sum is >= 1), in three stages over the rows. The
    exponentials are not stored: the sum recomputes them, and the last stage needs none."""
    (x,) = args
    axis = attr_int(op, "axis")
    n, rest, dt = x.shape[axis], _drop(x.shape, axis), x.dtype
    mx = k.alloc("log_softmax_max", rest, dt)
    k.reduce("log_softmax_max", mx, (n,), lambda s, r: x[_insert(s, axis, r)], "max", lowest(dt))
    total = k.alloc("log_softmax_sum", rest, dt)
    k.reduce(
        "log_softmax_sum", total, (n,), lambda s, r: Call("exp", (x[_insert(s, axis, r)] - mx[s],))
    )

    def norm(i: Indices) -> Expr:
        o = _drop(i, axis)
        # One term per row: the vectorized loop splats it, and the C compiler computes it (and
        # its log) once per row, outside the loop.
        return x[i] - (mx[o] + Call("log", (total[o],)))

    k.compute("log_softmax_norm", out, norm)


def _log_softmax_export(ex: Exporter, op: Op) -> None:
    ex.node("LogSoftmax", operand_names(op), op.result.name, axis=attr_int(op, "axis"))


LOG_SOFTMAX = OpDef(
    "log_softmax",
    "x - log(sum(exp(x))) along axis",
    ("x",),
    ("axis",),
    infer=_softmax_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_log_softmax_evaluate,
    lower=_log_softmax_lower,
    export=_log_softmax_export,
    # Per element: max, subtract, exp, sum, subtract (the log is one per row).
    flops=lambda op: 5 * op.result.type.size,
    positions=positions_of_first(lambda op: (int(op.attr("axis")),)),
)


# --- layer_norm -------------------------------------------------------------------------------


def _norm_infer(c: Check) -> TensorType:
    """x and the parameters after it (layer_norm's gamma and beta, rms_norm's scale), each of
    the normalized axes' shape x.shape[axis:]."""
    x = c.types[0]
    dtype = c.same_dtype()
    c.dtype_in("float", 0)
    axis = c.axis("axis", len(x.shape), len(x.shape) - 1)
    c.real("epsilon", 1e-5)
    for name, t in zip(c.names[1:], c.types[1:], strict=True):
        if t.shape != x.shape[axis:]:
            want = "x".join(map(str, x.shape[axis:]))
            fail(f"{name} must have shape {want} (x.shape[{axis}:]), got {dims(t)}")
    return TensorType(x.shape, dtype)


def _layer_norm_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, gamma, beta = (f64(v) for v in xs)
    axes = tuple(range(get_int(attrs, "axis"), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = np.square(x - mean).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + get_float(attrs, "epsilon")) * gamma + beta


def _layer_norm_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """mean, then the variance around it (two passes: stable), then normalize and scale."""
    x, gamma, beta = args
    axis = attr_int(op, "axis")
    eps = const(attr_float(op, "epsilon"), x.dtype)
    outer, inner, dt = x.shape[:axis], x.shape[axis:], x.dtype
    scale = const(1 / math.prod(inner), dt)
    mean = k.alloc("layer_norm_mean", outer, dt)
    k.reduce("layer_norm_mean", mean, inner, lambda s, r: x[s + r] * scale)
    var = k.alloc("layer_norm_var", outer, dt)

    def square(s: Indices, r: Indices) -> Expr:
        d = x[s + r] - mean[s]
        return d * d * scale

    k.reduce("layer_norm_var", var, inner, square)

    def norm(i: Indices) -> Expr:
        o, j = i[:axis], i[axis:]
        centered = (x[i] - mean[o]) * Call("rsqrt", (var[o] + eps,))
        return centered * gamma[j] + beta[j]

    k.compute("layer_norm_norm", out, norm)


def _layer_norm_export(ex: Exporter, op: Op) -> None:
    ex.node(
        "LayerNormalization",
        operand_names(op),
        op.result.name,
        axis=attr_int(op, "axis"),
        epsilon=attr_float(op, "epsilon"),
    )


def _normalized_axes(op: Op) -> range:
    """The axes a norm reads across: `axis` to the last."""
    return range(int(op.attr("axis")), len(op.result.type.shape))


LAYER_NORM = OpDef(
    "layer_norm",
    "x normalized over axes axis..ndim-1, then · gamma + beta",
    ("x", "gamma", "beta"),
    ("axis", "epsilon"),
    infer=_norm_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_layer_norm_evaluate,
    lower=_layer_norm_lower,
    export=_layer_norm_export,
    # Per element: the mean's add; the variance's subtract, square and add; normalizing's
    # subtract and multiply; the scale and the shift.
    flops=lambda op: 8 * op.result.type.size,
    positions=positions_of_first(_normalized_axes),
)


# --- rms_norm ---------------------------------------------------------------------------------


def _rms_norm_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, scale = (f64(v) for v in xs)
    axes = tuple(range(get_int(attrs, "axis"), x.ndim))
    mean_square = np.square(x).mean(axis=axes, keepdims=True)
    return x / np.sqrt(mean_square + get_float(attrs, "epsilon")) * scale


def _rms_norm_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """The mean square of each row (one pass), then x · rsqrt(it + epsilon) · scale (one
    more): layer_norm without the mean's pass and the centering."""
    x, gain = args
    axis = attr_int(op, "axis")
    eps = const(attr_float(op, "epsilon"), x.dtype)
    outer, inner, dt = x.shape[:axis], x.shape[axis:], x.dtype
    scale = const(1 / math.prod(inner), dt)
    ms = k.alloc("rms_norm_meansq", outer, dt)
    k.reduce("rms_norm_meansq", ms, inner, lambda s, r: x[s + r] * x[s + r] * scale)

    def norm(i: Indices) -> Expr:
        o, j = i[:axis], i[axis:]
        return x[i] * Call("rsqrt", (ms[o] + eps,)) * gain[j]

    k.compute("rms_norm_norm", out, norm)


def _rms_norm_export(ex: Exporter, op: Op) -> None:
    """RMSNormalization is opset 23's, past the exporter's opset: the same arithmetic in
    opset-17 ops, Mul(x, x) -> ReduceMean -> Add(epsilon) -> Sqrt -> Div -> Mul(scale)."""
    (x, scale), out = op.operands, op.result.name
    axes = list(range(attr_int(op, "axis"), len(x.type.shape)))
    eps = ex.scalar(attr_float(op, "epsilon"), x, f"{out}.epsilon")
    ms = ex.node("ReduceMean", [ex.node("Mul", [x.name, x.name])], axes=axes, keepdims=1)
    rms = ex.node("Sqrt", [ex.node("Add", [ms, eps])])
    ex.node("Mul", [ex.node("Div", [x.name, rms]), scale.name], out)


RMS_NORM = OpDef(
    "rms_norm",
    "x / sqrt(mean(x²) over axes axis..ndim-1 + epsilon) · scale",
    ("x", "scale"),
    ("axis", "epsilon"),
    infer=_norm_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_rms_norm_evaluate,
    lower=_rms_norm_lower,
    export=_rms_norm_export,
    # Per element: the square and the mean's add; normalizing's multiply; the scale.
    flops=lambda op: 4 * op.result.type.size,
    positions=positions_of_first(_normalized_axes),
)

OPS: tuple[OpDef, ...] = (
    SOFTMAX,
    LOG_SOFTMAX,
    LAYER_NORM,
    RMS_NORM,
    REDUCE_SUM,
    REDUCE_MEAN,
    REDUCE_MAX,
    REDUCE_MIN,
    REDUCE_PROD,
    ARGMAX,
    ARGMIN,
)
