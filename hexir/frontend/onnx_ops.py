"""Converters of ONNX nodes to Hexir ops: elementwise ops, contractions, normalizations,
reductions.

Each `Spec` says which attributes its converter understands and which of their values (a
static check, so the importer lists every unsupported node before converting any), and how
many outputs it makes. Data movement is in `onnx_ops_shape`, Resize in `onnx_ops_resize`,
Conv, the pools and BatchNormalization in `onnx_ops_window`;
Einsum, LRN, ConvTranspose and TopK, compositions of several Hexir ops, are in
`onnx_ops_compose`; Attention and RotaryEmbedding in `onnx_ops_attention`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, hexir_dtype, int_list
from hexir.ir.dtype import is_float, is_unsigned, numpy_dtype
from hexir.ir.graph import Value
from hexir.ir.narrow import BYTE_FLOATS

Convert = Callable[[Context], Sequence[Value]]


@dataclass(frozen=True, slots=True)
class Spec:
    """How to convert one ONNX op type. `attrs`: each understood attribute and its allowed
    values (None: any value); `outputs`: how many outputs it makes (None: as many as asked),
    or that as a function of the node's attributes."""

    convert: Convert
    attrs: Mapping[str, tuple[Any, ...] | None] = field(default_factory=dict)
    outputs: int | None | Callable[[Mapping[str, Any]], int | None] = 1


# --- helpers shared with onnx_ops_shape -----------------------------------------------------


def reshape(ctx: Context, x: Value, shape: Sequence[int]) -> Value:
    return x if tuple(shape) == x.type.shape else ctx.op("reshape", x, shape=tuple(shape))


def cast(ctx: Context, x: Value, dtype: str) -> Value:
    return x if x.type.dtype == dtype else ctx.op("cast", x, dtype=dtype)


def broadcast_to(ctx: Context, x: Value, shape: Sequence[int]) -> Value:
    """`x` broadcast to `shape` (numpy rules): where(true, x, x) against a bool constant that is
    as big as the broadcast dimensions only."""
    shape = tuple(shape)
    if x.type.shape == shape:
        return x
    padded = (1,) * (len(shape) - len(x.type.shape)) + x.type.shape
    grow = tuple(n if d == 1 else 1 for d, n in zip(padded, shape, strict=True))
    return ctx.op("where", ctx.constant(np.ones(grow, bool)), x, x)


def matmul_nd(ctx: Context, a: Value, b: Value) -> Value:
    """numpy.matmul semantics on Hexir's matmul and batch_matmul: 1-D operands gain and then
    lose an axis; batch axes broadcast and flatten into batch_matmul's one batch axis."""
    sa, sb = a.type.shape, b.type.shape
    if not sa or not sb:
        raise Unsupported("MatMul of a scalar")
    a2 = reshape(ctx, a, (1, sa[0])) if len(sa) == 1 else a
    b2 = reshape(ctx, b, (sb[0], 1)) if len(sb) == 1 else b
    (m, k), n = a2.type.shape[-2:], b2.type.shape[-1]
    batch = tuple(np.broadcast_shapes(a2.type.shape[:-2], b2.type.shape[:-2]))
    if len(b2.type.shape) == 2:  # one weight for every row: a plain matmul
        rows = math.prod(a2.type.shape[:-1])
        y = ctx.op("matmul", reshape(ctx, a2, (rows, k)), b2)
    else:
        size = int(np.prod(batch, dtype=np.int64))
        a3 = reshape(ctx, broadcast_to(ctx, a2, batch + (m, k)), (size, m, k))
        b3 = reshape(ctx, broadcast_to(ctx, b2, batch + (k, n)), (size, k, n))
        y = ctx.op("batch_matmul", a3, b3)
    final = batch + ((m,) if len(sa) > 1 else ()) + ((n,) if len(sb) > 1 else ())
    return reshape(ctx, as_operands(ctx, y, a), final)


def as_operands(ctx: Context, y: Value, a: Value) -> Value:
    """A contraction's result in its operands' dtype where they are bfloat16 (ONNX's MatMul
    and Gemm keep it; Hexir's contraction gives float32, rounded here once)."""
    return cast(ctx, y, "bfloat16") if a.type.dtype == "bfloat16" else y


# --- elementwise ----------------------------------------------------------------------------


def _binary(kind: str) -> Convert:
    return lambda ctx: [ctx.op(kind, ctx.input(0), ctx.input(1))]


def _mod(ctx: Context) -> Sequence[Value]:
    a, b = ctx.input(0), ctx.input(1)
    return [ctx.op("fmod" if ctx.attr("fmod", 0) else "mod", a, b)]


def _bit_shift(ctx: Context) -> Sequence[Value]:
    kind = "left_shift" if ctx.attr("direction") == "LEFT" else "right_shift"
    return [ctx.op(kind, ctx.input(0), ctx.input(1))]


def _bitwise_not(ctx: Context) -> Sequence[Value]:
    """x ^ (all ones)."""
    x = ctx.input(0)
    ones = np.asarray(-1).astype(numpy_dtype(x.type.dtype))  # wraps to the unsigned maximum
    return [ctx.op("bitwise_xor", x, ctx.constant(ones, x.type.dtype))]


def _mean(ctx: Context) -> Sequence[Value]:
    (total,) = _variadic("add")(ctx)
    return [ctx.op("div", total, ctx.scalar(len(ctx.current.inputs), total))]


def _eye_like(ctx: Context) -> Sequence[Value]:
    """Ones on the k-th diagonal of a 2-D tensor of the input's shape, zeros elsewhere."""
    x = ctx.input(0)
    if len(x.type.shape) != 2:
        raise Unsupported(f"EyeLike of {x.type!r}: the input must be 2-D")
    to = ctx.attr("dtype")
    dtype = x.type.dtype if to is None else hexir_dtype(int(to), "EyeLike's dtype")
    eye = np.eye(*x.type.shape, k=int(ctx.attr("k", 0)), dtype=numpy_dtype(dtype))
    return [ctx.constant(eye, dtype)]


def _variadic(kind: str) -> Convert:
    def convert(ctx: Context) -> Sequence[Value]:
        operands = [ctx.input(i) for i in range(len(ctx.current.inputs))]
        return [functools.reduce(lambda a, b: ctx.op(kind, a, b), operands)]

    return convert


def _unary(kind: str) -> Convert:
    return lambda ctx: [ctx.op(kind, ctx.input(0))]


def _add(ctx: Context) -> Sequence[Value]:
    """Add, or bias_add where one operand is a vector along one axis of the other (a Linear's
    or a Conv's bias, as exporters write it)."""
    a, b = ctx.input(0), ctx.input(1)
    for x, v in ((a, b), (b, a)):  # float addition commutes exactly
        axis = _bias_axis(x, v)
        if axis is not None:
            return [ctx.op("bias_add", x, _vector(ctx, v), axis=axis)]
    return [ctx.op("add", a, b)]


def _bias_axis(x: Value, v: Value) -> int | None:
    """The one axis along which `v` varies, when x + v is x.shape and v matches x there."""
    xs, vs = x.type.shape, v.type.shape
    if x.type.dtype != v.type.dtype or not vs or len(vs) > len(xs):
        return None
    padded = (1,) * (len(xs) - len(vs)) + vs
    if padded == xs and not (len(vs) == 1 and len(xs) > 1):
        return None  # two tensors of one shape: a residual add, say, not a bias
    varying = [i for i, d in enumerate(padded) if d != 1]
    if len(varying) == 1 and padded[varying[0]] == xs[varying[0]]:
        return varying[0]
    return None


def _vector(ctx: Context, v: Value) -> Value:
    """`v` as a rank-1 vector; a reshape that made it from one is looked through."""
    source = ctx.producer(v)
    if source is not None and source.kind == "reshape" and len(source.operands[0].type.shape) == 1:
        return source.operands[0]
    return reshape(ctx, v, (v.type.size,))


def _pow(ctx: Context) -> Sequence[Value]:
    """base ** exponent in the base's dtype (ONNX lets the exponent's differ); an integer base
    computes in float64, exact for the integers it holds, and converts back toward zero, as
    ONNX's reference does."""
    base, exponent = ctx.input(0), ctx.input(1)
    if is_float(base.type.dtype):
        return [ctx.op("power", base, cast(ctx, exponent, base.type.dtype))]
    wide = ctx.op("power", cast(ctx, base, "float64"), cast(ctx, exponent, "float64"))
    return [cast(ctx, wide, base.type.dtype)]


def _neg(ctx: Context, x: Value) -> Value:
    return ctx.op("mul", x, ctx.scalar(-1, x))


def _reciprocal(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [ctx.op("div", ctx.scalar(1, x), x)]


def _abs_of(ctx: Context, x: Value) -> Value:
    if is_unsigned(x.type.dtype):
        return x
    return ctx.op("maximum", x, _neg(ctx, x))


def _square(ctx: Context, x: Value) -> Value:
    return ctx.op("mul", x, x)


def _not(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [ctx.op("equal", x, ctx.scalar(False, x))]


def _isnan(ctx: Context) -> Sequence[Value]:
    """x != x: true exactly for NaN (the C backend compiles without -ffast-math, which would
    assume it false). The dynamo exporter's attention writes Where(IsNaN(softmax), 0, ...)."""
    x = ctx.input(0)
    return [ctx.op("not_equal", x, x)]


def _isinf(ctx: Context) -> Sequence[Value]:
    """x == +inf, x == -inf, or either (detect_positive, detect_negative)."""
    x = ctx.input(0)
    signs = [s for s, key in ((1, "detect_positive"), (-1, "detect_negative")) if ctx.attr(key, 1)]
    if not signs:  # detects neither: false everywhere (x < x, NaN included)
        return [ctx.op("less", x, x)]
    hits = [ctx.op("equal", x, ctx.scalar(s * np.inf, x)) for s in signs]
    return [hits[0] if len(hits) == 1 else ctx.op("maximum", *hits)]


def _clip(ctx: Context) -> Sequence[Value]:
    y = ctx.input(0)
    if ctx.has(1):
        y = ctx.op("maximum", y, ctx.input(1))
    if ctx.has(2):
        y = ctx.op("minimum", y, ctx.input(2))
    return [y]


def _cast(ctx: Context) -> Sequence[Value]:
    dtype = hexir_dtype(int(ctx.attr("to")), "the cast's target")
    return [saturated_cast(ctx, ctx.input(0), dtype)]


def _cast_like(ctx: Context) -> Sequence[Value]:
    return [saturated_cast(ctx, ctx.input(0), ctx.input(1).type.dtype)]


def ml_finfo(dtype: str):  # noqa: ANN201 - ml_dtypes.finfo
    import ml_dtypes

    return ml_dtypes.finfo(numpy_dtype(dtype))


def saturated_cast(ctx: Context, x: Value, dtype: str) -> Value:
    """A cast; into an 8-bit float with `saturate` (ONNX's default) a value beyond its range,
    infinities included, becomes its largest (a NaN stays NaN); without, it overflows to
    infinity or NaN as the conversion does."""
    if dtype not in BYTE_FLOATS or not ctx.attr("saturate", 1) or not is_float(x.type.dtype):
        return cast(ctx, x, dtype)
    top = float(ml_finfo(dtype).max)
    clipped = ctx.op("minimum", ctx.op("maximum", x, ctx.scalar(-top, x)), ctx.scalar(top, x))
    kept = ctx.op("where", ctx.op("not_equal", x, x), x, clipped)  # NaN: not clipped
    return cast(ctx, kept, dtype)


def _gelu(ctx: Context) -> Sequence[Value]:
    return [ctx.op("gelu", ctx.input(0), approximate=ctx.attr("approximate", "none"))]


def _softmax(ctx: Context) -> Sequence[Value]:
    return [ctx.op("softmax", ctx.input(0), axis=int(ctx.attr("axis", -1)))]


def _log_softmax(ctx: Context) -> Sequence[Value]:
    return [ctx.op("log_softmax", ctx.input(0), axis=int(ctx.attr("axis", -1)))]


def _layer_norm(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    axis = int(ctx.attr("axis", -1)) % len(x.type.shape)
    tail = x.type.shape[axis:]
    scale = _as_shape(ctx, ctx.input(1), tail, "Scale")
    bias = ctx.constant(np.zeros(tail, scale.type.dtype)) if not ctx.has(2) else ctx.input(2)
    bias = _as_shape(ctx, bias, tail, "B")
    eps = ctx.float_attr("epsilon", 1e-5)
    y = ctx.op("layer_norm", x, scale, bias, axis=axis, epsilon=eps)
    if len([o for o in ctx.current.outputs if o]) == 1:
        return [y]
    # Mean and InvStdDev asked for too (training graphs, ONNX's tests): over the same axes.
    axes = tuple(range(axis, len(x.type.shape)))
    mean = ctx.op("reduce_mean", x, axes=axes, keepdims=True)
    centered = ctx.op("sub", x, mean)
    var = ctx.op("reduce_mean", ctx.op("mul", centered, centered), axes=axes, keepdims=True)
    inv = ctx.op("rsqrt", ctx.op("add", var, ctx.scalar(eps, var)))
    return [y, mean, inv]


def _group_norm(ctx: Context, groups: int) -> Value:
    """x [N, C, ...] normalized over each group of C / groups channels and the spatial axes
    (layer_norm over the rows of an [N * groups, rest] view), then scaled and shifted per
    channel by inputs 1 and 2 (of C elements; of `groups`, opset 18's GroupNormalization, each
    spreads over its group's channels)."""
    x = ctx.input(0)
    n, c = x.type.shape[:2]
    if len(x.type.shape) < 3 or c % groups:
        raise Unsupported(f"{ctx.current.op_type} of {x.type!r} in {groups} groups")
    rows = reshape(ctx, x, (n * groups, x.type.size // (n * groups)))
    ones = ctx.constant(np.ones(rows.type.shape[1:], numpy_dtype(x.type.dtype)))
    zeros = ctx.constant(np.zeros(rows.type.shape[1:], numpy_dtype(x.type.dtype)))
    eps = ctx.float_attr("epsilon", 1e-5)
    normed = ctx.op("layer_norm", rows, ones, zeros, axis=1, epsilon=eps)
    per_channel = (c,) + (1,) * (len(x.type.shape) - 2)
    out = reshape(ctx, normed, x.type.shape)
    for i, combine in ((1, "mul"), (2, "add")):
        v = ctx.array(i, "scale" if i == 1 else "bias").astype(numpy_dtype(x.type.dtype))
        if v.size == groups and groups != c:
            v = np.repeat(v.reshape(-1), c // groups)
        out = ctx.op(combine, out, ctx.constant(v.reshape(per_channel)))
    return out


def _instance_norm(ctx: Context) -> Sequence[Value]:
    return [_group_norm(ctx, ctx.input(0).type.shape[1])]


def _group_norm_op(ctx: Context) -> Sequence[Value]:
    return [_group_norm(ctx, int(ctx.attr("num_groups")))]


def _rms_norm(ctx: Context) -> Sequence[Value]:
    """RMSNormalization (opset 23). A scale of another float type than X is cast to X's, which
    is Y's (as onnx's shape inference has it)."""
    x = ctx.input(0)
    axis = int(ctx.attr("axis", -1)) % len(x.type.shape)
    scale = _as_shape(ctx, ctx.input(1), x.type.shape[axis:], "scale")
    if scale.type.dtype != x.type.dtype:
        scale = ctx.op("cast", scale, dtype=x.type.dtype)
    return [ctx.op("rms_norm", x, scale, axis=axis, epsilon=ctx.float_attr("epsilon", 1e-5))]


def _as_shape(ctx: Context, v: Value, shape: tuple[int, ...], what: str) -> Value:
    """A LayerNormalization or RMSNormalization parameter in the shape Hexir's layer_norm and
    rms_norm take."""
    if v.type.shape == shape:
        return v
    if int(np.prod(v.type.shape, dtype=np.int64)) == int(np.prod(shape, dtype=np.int64)):
        return reshape(ctx, v, shape)
    return broadcast_to(ctx, v, shape)


def _identity(ctx: Context) -> Sequence[Value]:
    return [ctx.input(0)]


def _dropout(ctx: Context) -> Sequence[Value]:
    """Inference: the identity. In training mode (opset 12's third input, true) Dropout draws a
    random mask, which Hexir does not compute: refused, not run as the identity."""
    training = ctx.optional_array(2, "training_mode")
    if training is not None and bool(np.asarray(training).any()):
        raise Unsupported(
            "Dropout in training mode (training_mode = true) zeroes a random share of its "
            "input; Hexir compiles models for inference: export the model in eval mode"
        )
    x = ctx.input(0)
    keep = ctx.constant(np.ones(x.type.shape, bool))  # the mask, where asked: all kept
    return [x, keep][: max(1, len([o for o in ctx.current.outputs if o]))]


# --- contractions, reductions -------------------------------------------------------------


def gemm(ctx: Context) -> Sequence[Value]:
    a, b = ctx.input(0), ctx.input(1)
    if len(a.type.shape) != 2 or len(b.type.shape) != 2:
        raise Unsupported("Gemm needs 2-D A and B")
    if ctx.attr("transA", 0):
        a = ctx.op("transpose", a, perm=(1, 0))
    y = as_operands(ctx, ctx.op("dense" if ctx.attr("transB", 0) else "matmul", a, b), a)
    alpha = ctx.float_attr("alpha", 1.0)
    if alpha != 1.0:
        y = ctx.op("mul", y, ctx.scalar(alpha, y))
    return [gemm_bias(ctx, y)]


def gemm_bias(ctx: Context, y: Value) -> Value:
    """Gemm's y plus beta · C, its optional third input."""
    beta = ctx.float_attr("beta", 1.0)
    c = ctx.optional(2)
    if c is None:
        return y
    if beta != 1.0:
        c = ctx.op("mul", c, ctx.scalar(beta, c))
    if c.type.shape == (y.type.shape[1],):
        return ctx.op("bias_add", y, c, axis=1)
    return ctx.op("add", y, c)


def _reduce(kind: str) -> Callable[..., Sequence[Value]]:
    """The ONNX reduction of input 0 (or of `x`, given), its axes and keepdims (or `keepdims`,
    given) from the node."""

    def convert(
        ctx: Context, x: Value | None = None, keepdims: bool | None = None
    ) -> Sequence[Value]:
        x = ctx.input(0) if x is None else x
        if ctx.attr("axes") is not None:
            axes = int_list(ctx.attr("axes"))
        else:
            given = ctx.optional_array(1, "axes")
            axes = [] if given is None else int_list(given)
        if not axes:
            if ctx.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(len(x.type.shape)))
        keep = bool(ctx.attr("keepdims", 1)) if keepdims is None else keepdims
        return [ctx.op(kind, x, axes=tuple(axes), keepdims=keep)]

    return convert


Compose = Callable[[Context, Value], Value]


def _reduce_of(kind: str, before: Compose | None = None, after: Compose | None = None) -> Convert:
    """A reduction ONNX names, as `after(kind(before(x)))`: ReduceSumSquare is
    reduce_sum(x * x), ReduceL1 reduce_sum(|x|), ReduceL2 its sqrt."""
    reduce = _reduce(kind)

    def convert(ctx: Context) -> Sequence[Value]:
        x = ctx.input(0)
        (out,) = reduce(ctx, x if before is None else before(ctx, x))
        return [out if after is None else after(ctx, out)]

    return convert


def _reduce_log_sum_exp(ctx: Context) -> Sequence[Value]:
    """log(sum(exp(x))) = m + log(sum(exp(x - m))) with m the max over the same axes: no
    overflow where exp(x) alone would."""
    x = ctx.input(0)
    keep = _reduce("reduce_max")(ctx, x, keepdims=True)[0]
    shifted = ctx.op("exp", ctx.op("sub", x, keep))
    (total,) = _reduce("reduce_sum")(ctx, shifted)
    (peak,) = _reduce("reduce_max")(ctx, x)
    return [ctx.op("add", ctx.op("log", total), peak)]


def _arg(kind: str) -> Convert:
    """ArgMax or ArgMin: int64 indices along one axis (ONNX keeps the axis by default)."""

    def convert(ctx: Context) -> Sequence[Value]:
        last = bool(ctx.attr("select_last_index", 0))
        keep = bool(ctx.attr("keepdims", 1))
        return [ctx.op(kind, ctx.input(0), axis=int(ctx.attr("axis", 0)), keepdims=keep, last=last)]

    return convert


_REDUCE = {"axes": None, "keepdims": None, "noop_with_empty_axes": None}
_ARG = {"axis": None, "keepdims": (0, 1), "select_last_index": (0, 1)}

SPECS: dict[str, Spec] = {
    "Add": Spec(_add),
    "Sub": Spec(_binary("sub")),
    "Mul": Spec(_binary("mul")),
    "Div": Spec(_binary("div")),
    "Pow": Spec(_pow),
    "Mod": Spec(_mod, {"fmod": (0, 1)}),
    "BitShift": Spec(_bit_shift, {"direction": ("LEFT", "RIGHT")}),
    "BitwiseAnd": Spec(_binary("bitwise_and")),
    "BitwiseOr": Spec(_binary("bitwise_or")),
    "BitwiseXor": Spec(_binary("bitwise_xor")),
    "BitwiseNot": Spec(_bitwise_not),
    "Max": Spec(_variadic("maximum")),
    "Min": Spec(_variadic("minimum")),
    "Sum": Spec(_variadic("add")),
    "Mean": Spec(_mean),
    "EyeLike": Spec(_eye_like, {"dtype": None, "k": None}),
    "Where": Spec(lambda ctx: [ctx.op("where", ctx.input(0), ctx.input(1), ctx.input(2))]),
    "Equal": Spec(_binary("equal")),
    "Less": Spec(_binary("less")),
    "LessOrEqual": Spec(_binary("less_equal")),
    "Greater": Spec(_binary("greater")),
    "GreaterOrEqual": Spec(_binary("greater_equal")),
    "And": Spec(_binary("minimum")),
    "Or": Spec(_binary("maximum")),
    "Xor": Spec(_binary("not_equal")),
    "Not": Spec(_not),
    "IsNaN": Spec(_isnan),
    "IsInf": Spec(_isinf, {"detect_positive": (0, 1), "detect_negative": (0, 1)}),
    **{k: Spec(_unary(k.lower())) for k in ("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Erf")},
    "Sqrt": Spec(_unary("sqrt")),
    **{k: Spec(_unary(k.lower())) for k in ("Floor", "Ceil", "Round", "Sin", "Cos", "Sign")},
    "Reciprocal": Spec(_reciprocal),
    "Neg": Spec(lambda ctx: [_neg(ctx, ctx.input(0))]),
    "Abs": Spec(lambda ctx: [_abs_of(ctx, ctx.input(0))]),
    "Clip": Spec(_clip),
    # round_mode (Cast 24) applies to float8e8m0 only, a dtype Hexir refuses
    "Cast": Spec(_cast, {"to": None, "saturate": None, "round_mode": None}),
    "Gelu": Spec(_gelu, {"approximate": ("none", "tanh")}),
    "Softmax": Spec(_softmax, {"axis": None}),
    "LogSoftmax": Spec(_log_softmax, {"axis": None}),
    "LayerNormalization": Spec(
        _layer_norm, {"axis": None, "epsilon": None, "stash_type": None}, outputs=None
    ),
    "RMSNormalization": Spec(_rms_norm, {"axis": None, "epsilon": None, "stash_type": None}),
    "InstanceNormalization": Spec(_instance_norm, {"epsilon": None}),
    "GroupNormalization": Spec(
        _group_norm_op, {"num_groups": None, "epsilon": None, "stash_type": None}
    ),
    "Identity": Spec(_identity),
    "Dropout": Spec(_dropout, {"seed": None}, outputs=None),
    "ReduceSum": Spec(_reduce("reduce_sum"), _REDUCE),
    "ReduceMean": Spec(_reduce("reduce_mean"), _REDUCE),
    "ReduceMax": Spec(_reduce("reduce_max"), _REDUCE),
    "ReduceMin": Spec(_reduce_of("reduce_min"), _REDUCE),
    "ReduceProd": Spec(_reduce_of("reduce_prod"), _REDUCE),
    "ReduceSumSquare": Spec(_reduce_of("reduce_sum", _square), _REDUCE),
    "ReduceL1": Spec(_reduce_of("reduce_sum", _abs_of), _REDUCE),
    "ReduceL2": Spec(_reduce_of("reduce_sum", _square, lambda ctx, x: ctx.op("sqrt", x)), _REDUCE),
    "ReduceLogSumExp": Spec(_reduce_log_sum_exp, _REDUCE),
    "ReduceLogSum": Spec(_reduce_of("reduce_sum", after=lambda ctx, x: ctx.op("log", x)), _REDUCE),
    "CastLike": Spec(_cast_like, {"saturate": None, "round_mode": None}),
    "ArgMax": Spec(_arg("argmax"), _ARG),
    "ArgMin": Spec(_arg("argmin"), _ARG),
}
