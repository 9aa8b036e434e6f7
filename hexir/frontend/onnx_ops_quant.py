"""Converters of ONNX's quantization ops, as compositions of Hexir's own ops that compute what
ONNX's reference computes, bit for bit where it rounds:

- DequantizeLinear: (float32(x) - float32(zero_point)) · scale, in the scale's dtype;
- QuantizeLinear: round(x / scale) + zero_point (ties to even), clipped to the integer type;
- DynamicQuantizeLinear: the same to uint8 with a scale and zero point from x's range;
- MatMulInteger and ConvInteger: int32 contractions of the operands less their zero points;
- QLinearMatMul and QLinearConv: those, requantized with a_scale · b_scale / y_scale.

Scales and zero points are per tensor (scalars), per axis (a vector along `axis`) or, from
opset 21, per block of `block_size` elements along `axis`. The integer types are those Hexir
has (int8, uint8, int16, uint16); int4 and the float8 types are refused by the importer's dtype
check.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, hexir_dtype, normalized_axis
from hexir.frontend.onnx_ops import (
    Spec,
    cast,
    gemm,
    gemm_bias,
    matmul_nd,
    reshape,
    saturated_cast,
)
from hexir.frontend.onnx_ops_window import CONV_ATTRS, conv_of
from hexir.ir.dtype import BYTE_INTS, SUB_BYTE_INTS, int_range
from hexir.ir.graph import Value
from hexir.ir.narrow import BYTE_FLOATS

_QUANTIZED = ("int8", "uint8", "int16", "uint16", *SUB_BYTE_INTS)


def _along(ctx: Context, p: Value, x: Value, axis: int, block: int) -> Value:
    """A scale or zero point `p` shaped to broadcast against `x`: a scalar as it is, a vector
    along `axis`, a tensor of blocks (`block` elements of x along `axis` each) spread out."""
    shape, rank = x.type.shape, len(x.type.shape)
    if p.type.size == 1 and not block:
        return reshape(ctx, p, ())
    axis = normalized_axis(axis, rank)
    if not block:
        if p.type.shape != (shape[axis],):
            raise Unsupported(f"a scale or zero point of shape {p.type.shape} for {x.type!r}")
        return reshape(ctx, p, tuple(shape[axis] if d == axis else 1 for d in range(rank)))
    blocks = -(-shape[axis] // block)
    want = tuple(blocks if d == axis else n for d, n in enumerate(shape))
    if p.type.shape != want:
        raise Unsupported(f"blocked scales of shape {p.type.shape}; {want} expected")
    index = ctx.constant(np.arange(shape[axis], dtype=np.int64) // block)
    return ctx.op("gather", p, index, axis=axis)


def _clip_cast(ctx: Context, x: Value, dtype: str) -> Value:
    """`x` (integer-valued floats) clipped to the range of the integer `dtype`, cast to it."""
    low, high = int_range(dtype)
    x = ctx.op("maximum", x, ctx.scalar(low, x))
    return cast(ctx, ctx.op("minimum", x, ctx.scalar(high, x)), dtype)


def _attrs(ctx: Context) -> tuple[int, int]:
    return int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0))


def _dequantize(ctx: Context) -> Sequence[Value]:
    x, scale, zero = ctx.input(0), ctx.input(1), ctx.optional(2)
    axis, block = _attrs(ctx)
    out = ctx.attr("output_dtype")
    dtype = hexir_dtype(out, "output_dtype") if out else scale.type.dtype
    y = cast(ctx, x, "float32")
    if zero is not None:
        y = ctx.op("sub", y, cast(ctx, _along(ctx, zero, x, axis, block), "float32"))
    y = ctx.op("mul", y, cast(ctx, _along(ctx, scale, x, axis, block), "float32"))
    if dtype == "float32" and not block and x.type.dtype in BYTE_INTS:
        ctx.dequantized[y.name] = (x, scale, zero, axis)
    return [cast(ctx, y, dtype)]


def _quantize(ctx: Context) -> Sequence[Value]:
    x, scale, zero = ctx.input(0), ctx.input(1), ctx.optional(2)
    axis, block = _attrs(ctx)
    out = ctx.attr("output_dtype")
    dtype = hexir_dtype(out, "output_dtype") if out else "uint8"
    dtype = zero.type.dtype if zero is not None else dtype
    if dtype in BYTE_FLOATS:  # x / scale + zero, no rounding to an integer, then the cast
        q = ctx.op("div", x, _along(ctx, scale, x, axis, block))
        if zero is not None:
            q = ctx.op("add", q, cast(ctx, _along(ctx, zero, x, axis, block), x.type.dtype))
        return [saturated_cast(ctx, q, dtype)]
    if dtype not in _QUANTIZED:
        raise Unsupported(f"quantizing to {dtype}")
    if ctx.attr("precision"):
        raise Unsupported("QuantizeLinear's precision attribute")
    if zero is not None:
        zero = _along(ctx, zero, x, axis, block)
    return [quantize_linear(ctx, x, _along(ctx, scale, x, axis, block), zero, dtype)]


def quantize_linear(ctx: Context, x: Value, scale: Value, zero: Value | None, dtype: str) -> Value:
    """round(x / scale) + zero (ties to even), clipped to the integer `dtype` and cast to it;
    `scale` and `zero` broadcast against x."""
    q = ctx.op("round", ctx.op("div", x, scale))
    if zero is not None:
        q = ctx.op("add", q, cast(ctx, zero, x.type.dtype))
    return _clip_cast(ctx, q, dtype)


def _dynamic_quantize(ctx: Context) -> Sequence[Value]:
    return list(dynamic_quantize(ctx, ctx.input(0)))


def dynamic_quantize(ctx: Context, x: Value) -> tuple[Value, Value, Value]:
    """DynamicQuantizeLinear: x as uint8 over [min(x, 0), max(x, 0)], with its scale = (max -
    min) / 255 (1/255 where the range is empty) and zero point = round(clip(-min / scale, 0,
    255)) (uint8)."""
    axes = tuple(range(len(x.type.shape)))
    zero = ctx.scalar(0, x)
    high = ctx.op("maximum", ctx.op("reduce_max", x, axes=axes), zero)
    low = ctx.op("minimum", ctx.op("reduce_min", x, axes=axes), zero)
    span = ctx.op("sub", high, low)
    span = ctx.op("where", ctx.op("equal", span, zero), ctx.scalar(1, x), span)
    scale = ctx.op("div", span, ctx.scalar(255, x))
    start = ctx.op("sub", zero, ctx.op("div", low, scale))
    start = ctx.op("minimum", ctx.op("maximum", start, zero), ctx.scalar(255, x))
    zero_point = ctx.op("round", start)
    y = ctx.op("add", ctx.op("round", ctx.op("div", x, scale)), zero_point)
    return _clip_cast(ctx, y, "uint8"), scale, cast(ctx, zero_point, "uint8")


def _less_zero(ctx: Context, x: Value, zero: Value | None, row_axis: int | None) -> Value:
    """int32(x) - int32(zero): a per-row zero point (a vector over x's `row_axis`) broadcast
    along that axis, any other as numpy broadcasts it."""
    x32 = cast(ctx, x, "int32")
    if zero is None:
        return x32
    z = cast(ctx, zero, "int32")
    rank = len(x.type.shape)
    if row_axis is not None and len(z.type.shape) == 1 and z.type.size > 1 and rank >= 2:
        axis = normalized_axis(row_axis, rank)
        z = reshape(ctx, z, tuple(z.type.size if d == axis else 1 for d in range(rank)))
    return ctx.op("sub", x32, z)


def integer_matmul(
    ctx: Context, a: Value, b: Value, a_zero: Value | None, b_zero: Value | None
) -> Value:
    """int32 (a - a_zero) @ (b - b_zero), numpy.matmul's broadcasting. 8-bit a and a 2-D b
    multiply as they are, into int32 (a uint8 x int8 matmul runs on VNNI), the zero points
    applied after: - a_zero·colsum(b) - rowsum(a)·b_zero + K·a_zero·b_zero (the sums of a
    constant b fold at compile time); any other case widens both operands first."""
    a_zero, b_zero = _nonzero(ctx, a_zero), _nonzero(ctx, b_zero)
    rank = len(a.type.shape)
    per_row = a_zero is not None and a_zero.type.size > 1
    if (
        a.type.dtype not in BYTE_INTS
        or b.type.dtype not in BYTE_INTS
        or len(b.type.shape) != 2
        or rank < 2
        or (per_row and rank != 2)
    ):
        return matmul_nd(ctx, _less_zero(ctx, a, a_zero, -2), _less_zero(ctx, b, b_zero, None))
    za = None if a_zero is None else cast(ctx, a_zero, "int32")
    if a.type.dtype == b.type.dtype:  # VNNI multiplies uint8 by int8: shift a by 128
        a, za = _flipped_sign(ctx, a, za)
    y = matmul_nd(ctx, a, b)
    zb = None if b_zero is None else cast(ctx, b_zero, "int32")
    if za is not None:
        za = reshape(ctx, za, (za.type.size, 1) if per_row else ())
        columns = ctx.op("reduce_sum", cast(ctx, b, "int32"), axes=(0,), keepdims=False)
        y = ctx.op("sub", y, ctx.op("mul", za, columns))
    if zb is not None:
        rows = ctx.op("reduce_sum", cast(ctx, a, "int32"), axes=(rank - 1,), keepdims=True)
        y = ctx.op("sub", y, ctx.op("mul", rows, reshape(ctx, zb, zb.type.shape[-1:] or ())))
    if za is not None and zb is not None:
        inner = ctx.scalar(a.type.shape[-1], y)
        y = ctx.op("add", y, ctx.op("mul", ctx.op("mul", za, zb), inner))
    return y


def _nonzero(ctx: Context, zero: Value | None) -> Value | None:
    """A zero point, or None where it is a constant of zeros (symmetric quantization)."""
    known = None if zero is None else ctx.known(zero)
    return None if known is not None and not np.any(known) else zero


def _flipped_sign(ctx: Context, x: Value, zero: Value | None) -> tuple[Value, Value]:
    """An 8-bit `x` as the other signedness, shifted by 128 (x - zero unchanged): int8 + 128
    as uint8, or uint8 - 128 as int8; `zero` (int32) shifted the same."""
    to, shift = ("uint8", 128) if x.type.dtype == "int8" else ("int8", -128)
    wide = cast(ctx, x, "int16")
    flipped = cast(ctx, ctx.op("add", wide, ctx.scalar(shift, wide)), to)
    zero = ctx.constant(np.int32(0)) if zero is None else zero
    return flipped, ctx.op("add", zero, ctx.scalar(shift, zero))


def _dequantized_product(ctx: Context, a: Value, b: Value, transposed: bool) -> Value | None:
    """a @ b (a @ bᵀ where `transposed`) where both are DequantizeLinear outputs of 8-bit
    tensors, a per-tensor scale on a and a per-tensor or per-column one on a 2-D b (a QDQ
    model's linear layer): the integer product of the quantized tensors scaled once after
    it, one uint8 x int8 kernel (VNNI) with the scale in its epilogue where the dequantized
    product would be a float32 one. None for other operands."""
    qa, qb = ctx.dequantized.get(a.name), ctx.dequantized.get(b.name)
    if qa is None or qb is None or len(b.type.shape) != 2 or len(a.type.shape) < 2:
        return None
    (xa, sa, za, _), (xb, sb, zb, axis) = qa, qb
    if sa.type.size > 1 or (za is not None and za.type.size > 1):
        return None
    per_column = sb.type.size > 1
    if per_column and normalized_axis(axis, 2) != (0 if transposed else 1):
        return None
    if transposed:
        xb = ctx.op("transpose", xb, perm=(1, 0))  # a constant weight: at compile time
    scale = ctx.op("mul", cast(ctx, reshape(ctx, sa, ()), "float32"), cast(ctx, sb, "float32"))
    scale = reshape(ctx, scale, scale.type.shape[-1:] if per_column else ())
    acc = integer_matmul(ctx, xa, xb, za, zb)
    return ctx.op("mul", cast(ctx, acc, "float32"), scale)


def _matmul(ctx: Context) -> Sequence[Value]:
    """numpy.matmul (`matmul_nd`), or a QDQ layer's integer product."""
    a, b = ctx.input(0), ctx.input(1)
    product = _dequantized_product(ctx, a, b, False)
    return [matmul_nd(ctx, a, b) if product is None else product]


def _gemm(ctx: Context) -> Sequence[Value]:
    """Gemm (`onnx_ops.gemm`), or with transA=0 and alpha=1 a QDQ layer's integer product plus
    its bias."""
    plain = ctx.attr("transA", 0) or ctx.float_attr("alpha", 1.0) != 1.0
    transposed = bool(ctx.attr("transB", 0))
    product = None if plain else _dequantized_product(ctx, ctx.input(0), ctx.input(1), transposed)
    return gemm(ctx) if product is None else [gemm_bias(ctx, product)]


def _matmul_integer(ctx: Context) -> Sequence[Value]:
    return [integer_matmul(ctx, ctx.input(0), ctx.input(1), ctx.optional(2), ctx.optional(3))]


def _conv_integer(ctx: Context) -> Sequence[Value]:
    x = _less_zero(ctx, ctx.input(0), ctx.optional(2), None)
    w = _less_zero(ctx, ctx.input(1), ctx.optional(3), 0)
    return [conv_of(ctx, x, w, None)]


def _requantize(ctx: Context, acc: Value, scale: Value, zero: Value | None, dtype: str) -> Value:
    """An int32 accumulator times a float32 scale, in float64 as the reference computes it,
    plus the zero point, rounded (ties to even) and clipped to `dtype`."""
    y = ctx.op("mul", cast(ctx, acc, "float64"), cast(ctx, scale, "float64"))
    if zero is not None:
        y = ctx.op("add", y, cast(ctx, zero, "float64"))
    return _clip_cast(ctx, ctx.op("round", y), dtype)


def _qlinear_matmul(ctx: Context) -> Sequence[Value]:
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale = (ctx.optional(i) for i in range(7))
    y_zero = ctx.optional(7)
    acc = integer_matmul(ctx, a, b, a_zero, b_zero)
    scale = ctx.op("div", ctx.op("mul", a_scale, b_scale), y_scale)
    dtype = (y_zero or a).type.dtype
    return [_requantize(ctx, acc, scale, y_zero, dtype)]


def _qlinear_conv(ctx: Context) -> Sequence[Value]:
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale = (ctx.optional(i) for i in range(7))
    y_zero, bias = ctx.optional(7), ctx.optional(8)
    acc = conv_of(ctx, _less_zero(ctx, x, x_zero, None), _less_zero(ctx, w, w_zero, 0), bias)
    if w_scale.type.size > 1:  # per output channel
        w_scale = reshape(ctx, w_scale, (1, w_scale.type.size, *(1,) * (len(acc.type.shape) - 2)))
    scale = ctx.op("div", ctx.op("mul", x_scale, w_scale), y_scale)
    dtype = (y_zero or x).type.dtype
    return [_requantize(ctx, acc, scale, y_zero, dtype)]


_BLOCKED = {"axis": None, "block_size": None, "output_dtype": None}

QUANT_SPECS: dict[str, Spec] = {
    "MatMul": Spec(_matmul),
    "Gemm": Spec(_gemm, {"alpha": None, "beta": None, "transA": None, "transB": None}),
    "DequantizeLinear": Spec(_dequantize, _BLOCKED),
    "QuantizeLinear": Spec(_quantize, {**_BLOCKED, "saturate": None, "precision": None}),
    "DynamicQuantizeLinear": Spec(_dynamic_quantize, outputs=3),
    "MatMulInteger": Spec(_matmul_integer),
    "ConvInteger": Spec(_conv_integer, CONV_ATTRS),
    "QLinearMatMul": Spec(_qlinear_matmul),
    "QLinearConv": Spec(_qlinear_conv, CONV_ATTRS),
}
