"""Neural-network ops on channels and images: bias_add, batch_norm, conv2d and the pools.

bias_add and batch_norm are broadcast ops (a per-channel vector along one axis), so they fuse
as epilogues; conv2d is a contraction anchor; the pools are reductions over a window. Padded
windows read through `guarded_value`: a select on the in-bounds condition around a load at
clamped indices, so nothing is read out of bounds however the select is evaluated. ONNX's
Conv and pools take floats only: on ints they export as float64 between two Casts (exact
while the results fit a float64 mantissa).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hexir.ir.graph import Op, TensorType, Value
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.tir import Binary, Buffer, Call, Expr, IntImm, const
from hexir.ops.base import (
    Export,
    Exporter,
    OpDef,
    Pattern,
    at_least,
    multiply_adds,
    onnx_same,
    operand_names,
)
from hexir.ops.compute import (
    Kernel,
    add,
    affine,
    attr_float,
    attr_int,
    attr_ints,
    floordiv,
    guarded_value,
    limit,
    lowest,
    mean,
    mul,
)
from hexir.ops.numeric import (
    Attrs,
    block_axis,
    f64,
    get_float,
    get_int,
    get_ints,
    lowest_value,
    mean_of,
    on_axis,
    pad_hw,
    unblock_axis,
    unblock_perm,
    wide,
    windows,
)


def _onnx_on_axis(ex: Exporter, vector: str, axis: int, ndim: int) -> str:
    """A [C] vector reshaped to broadcast along `axis` of an ndim-d tensor."""
    if axis == ndim - 1:
        return vector
    shape = (-1,) + (1,) * (ndim - 1 - axis)
    return ex.node("Reshape", [vector, ex.ints(shape, f"{vector}.shape")])


def float_only(export: Export) -> Export:
    """`export` for floats; on ints, the op computed in float64 between two Casts (for ops
    whose ONNX counterparts take floats only)."""

    def export_any(ex: Exporter, op: Op) -> None:
        if op.result.type.dtype.startswith("float"):
            export(ex, op)
            return
        double = ex.elem_type("float64")

        def wide_value(v: Value, name: str) -> Value:
            return Value(name, TensorType(v.type.shape, "float64"))

        operands = tuple(wide_value(v, ex.node("Cast", [v.name], to=double)) for v in op.operands)
        result = wide_value(op.result, ex.fresh(f"{op.result.name}.f64"))
        export(ex, replace(op, operands=operands, result=result))
        ex.node("Cast", [result.name], op.result.name, to=ex.elem_type(op.result.type.dtype))

    return export_any


# --- bias_add ---------------------------------------------------------------------------------


def _bias_add_infer(c: Check) -> TensorType:
    x, b = c.types
    dtype = c.same_dtype()
    c.dtype_in("numeric", 0)
    axis = c.axis("axis", len(x.shape), 1)
    if b.shape != (x.shape[axis],):
        fail(
            f"b must have shape [{x.shape[axis]}] (x.shape[{axis}]), x is {dims(x)}, b is {dims(b)}"
        )
    return TensorType(x.shape, dtype)


def _bias_add_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return xs[0] + on_axis(xs[1], get_int(attrs, "axis"), xs[0].ndim)


def _bias_add_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, b = args
    axis = attr_int(op, "axis")
    k.compute("bias_add", out, lambda i: x[i] + b[i[axis]])


def _bias_add_export(ex: Exporter, op: Op) -> None:
    names = operand_names(op)
    bias = _onnx_on_axis(ex, names[1], attr_int(op, "axis"), len(op.operands[0].type.shape))
    ex.node("Add", [names[0], bias], op.result.name)


BIAS_ADD = OpDef(
    "bias_add",
    "x + b[C] along axis",
    ("x", "b"),
    ("axis",),
    infer=_bias_add_infer,
    fusion=Pattern.BROADCAST,
    evaluate=_bias_add_evaluate,
    lower=_bias_add_lower,
    export=_bias_add_export,
)


# --- batch_norm -------------------------------------------------------------------------------


def _batch_norm_infer(c: Check) -> TensorType:
    x = c.types[0]
    c.same_dtype()
    c.dtype_in("float", 0)
    axis = c.axis("axis", len(x.shape), 1)
    c.real("epsilon", 1e-5)
    for name, t in zip(c.names[1:], c.types[1:], strict=True):
        if t.shape != (x.shape[axis],):
            fail(f"{name} must have shape [{x.shape[axis]}] (x.shape[{axis}]), got {dims(t)}")
    return x


def _batch_norm_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, scale, shift, mean, var = (f64(v) for v in xs)
    axis, eps = get_int(attrs, "axis"), get_float(attrs, "epsilon")
    inv = scale / np.sqrt(var + eps)
    return (x - on_axis(mean, axis, x.ndim)) * on_axis(inv, axis, x.ndim) + on_axis(
        shift, axis, x.ndim
    )


def _batch_norm_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, scale, shift, mean, var = args
    axis = attr_int(op, "axis")
    eps = const(attr_float(op, "epsilon"), x.dtype)

    def value(i: tuple[Expr, ...]) -> Expr:
        c = i[axis]
        norm = (x[i] - mean[c]) / Call("sqrt", (var[c] + eps,))
        return norm * scale[c] + shift[c]

    k.compute("batch_norm", out, value)


def _batch_norm_export(ex: Exporter, op: Op) -> None:
    """BatchNormalization on axis 1, arithmetic on any other axis."""
    names = operand_names(op)
    x, out = op.operands[0], op.result.name
    axis, eps = attr_int(op, "axis"), attr_float(op, "epsilon")
    ndim = len(x.type.shape)
    if axis == 1 and ndim >= 2:
        ex.node("BatchNormalization", names, out, epsilon=eps)
        return
    _, scale, shift, mean, var = (_onnx_on_axis(ex, n, axis, ndim) for n in names)
    std = ex.node("Sqrt", [ex.node("Add", [var, ex.scalar(eps, x, f"{out}.eps")])])
    inv = ex.node("Div", [scale, std])
    centered = ex.node("Sub", [names[0], mean])
    ex.node("Add", [ex.node("Mul", [centered, inv]), shift], out)


BATCH_NORM = OpDef(
    "batch_norm",
    "(x - mean) / sqrt(var + epsilon) · scale + shift, per channel along axis",
    ("x", "scale", "shift", "mean", "var"),
    ("axis", "epsilon"),
    infer=_batch_norm_infer,
    fusion=Pattern.BROADCAST,
    evaluate=_batch_norm_evaluate,
    lower=_batch_norm_lower,
    export=_batch_norm_export,
)


# --- image layouts ----------------------------------------------------------------------------

# conv2d and the pools read and write NCHW images, or NHWC ones where `layout = "NHWC"` (the
# attribute is recorded only then: an NCHW op prints, and keys, as it always has).
IMAGE_LAYOUTS = ("NCHW", "NHWC")


def _image_layout(c: Check) -> bool:
    """Whether the op computes in NHWC (its `layout` attribute, checked)."""
    nhwc = c.choice("layout", IMAGE_LAYOUTS, "NCHW") == "NHWC"
    if not nhwc:
        del c.out["layout"]
    return nhwc


def is_nhwc(op: Op | Attrs) -> bool:
    attrs = op.attrs if isinstance(op, Op) else tuple(op.items())
    return dict(attrs).get("layout") == "NHWC"


def as_nchw(shape: tuple[int, ...], nhwc: bool) -> tuple[int, ...]:
    """An image's shape as NCHW (N, C, H, W)."""
    return (shape[0], shape[3], shape[1], shape[2]) if nhwc else shape


def in_layout(nchw: tuple, nhwc: bool) -> tuple:
    """An NCHW shape or index (N, C, H, W) in the op's layout."""
    return (nchw[0], nchw[2], nchw[3], nchw[1]) if nhwc else nchw


def _nchw_semantics(evaluate):
    """`evaluate` of NCHW images, taking and giving the op's layout."""

    def in_op_layout(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        if not is_nhwc(attrs):
            return evaluate(xs, attrs)
        x = np.transpose(xs[0], (0, 3, 1, 2))
        return np.transpose(evaluate([x, *xs[1:]], attrs), (0, 2, 3, 1))

    return in_op_layout


def _nchw_export(export: Export) -> Export:
    """`export` of an NCHW op, between Transposes where the op computes in NHWC."""

    def in_op_layout(ex: Exporter, op: Op) -> None:
        if not is_nhwc(op):
            export(ex, op)
            return
        x, out = op.operands[0], op.result
        image = _nchw_value(x, ex.node("Transpose", [x.name], perm=[0, 3, 1, 2]))
        result = _nchw_value(out, ex.fresh(f"{out.name}.nchw"))
        export(ex, replace(op, operands=(image, *op.operands[1:]), result=result))
        ex.node("Transpose", [result.name], out.name, perm=[0, 2, 3, 1])

    return in_op_layout


def _nchw_value(v: Value, name: str) -> Value:
    """NHWC image `v` as the NCHW value `name`."""
    return Value(name, TensorType(as_nchw(v.type.shape, True), v.type.dtype))


# --- conv2d -----------------------------------------------------------------------------------


def window_extent(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    """The output extent of a window sliding over a padded axis."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _conv2d_infer(c: Check) -> TensorType:
    # Recorded only when set: a plain conv2d prints (and keys) as it always has.
    block = c.integer("weight_block", minimum=1) if c.raw.get("weight_block") else 0
    x, w = c.ranks(4, 5 if block else 4)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    stride = at_least("stride", c.ints("stride", 1, length=2), 1)
    padding = at_least("padding", c.ints("padding", 0, length=2), 0)
    dilation = at_least("dilation", c.ints("dilation", 1, length=2), 1)
    groups = c.integer("groups", 1, minimum=1)
    nhwc = _image_layout(c)
    n, ch, h, wd = as_nchw(x.shape, nhwc)
    if block and w.shape[4] != block:
        fail(
            f"weight_block={block} needs w of shape [K/{block}, C/groups, R, S, {block}], "
            f"w is {dims(w)}"
        )
    k, cg, r, s = conv_weight_shape(w.shape)
    if ch % groups or k % groups:
        fail(f"groups={groups} must divide x's {ch} channels and w's {k} filters")
    if cg * groups != ch:
        fail(f"w has {cg} channels per group, x has {ch} channels in {groups} group(s)")
    oh = window_extent(h, r, stride[0], padding[0], dilation[0])
    ow = window_extent(wd, s, stride[1], padding[1], dilation[1])
    if oh < 1 or ow < 1:
        fail(f"the {r}x{s} kernel (dilation {dilation}) does not fit x's padded {h}x{wd} image")
    return TensorType(in_layout((n, k, oh, ow), nhwc), dtype)


def conv_weight_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """A conv2d weight's (K, C/groups, R, S), KCRS or blocked ([K/b, C/groups, R, S, b])."""
    if len(shape) == 5:
        blocks, cg, r, s, b = shape
        return blocks * b, cg, r, s
    k, cg, r, s = shape
    return k, cg, r, s


def block_conv_weight(w: np.ndarray, block: int) -> np.ndarray:
    """A KCRS conv2d weight with its filters in blocks of `block`, innermost: [K/b, C, R, S, b]
    (what a conv2d of weight_block=b reads: one vector of filters per input pixel, contiguous)."""
    return block_axis(w, 0, block)


def unblock_conv_weight(w: np.ndarray) -> np.ndarray:
    """The KCRS weight of a blocked one ([K/b, C, R, S, b])."""
    return unblock_axis(w, 0)


def _conv2d_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, w = wide(xs[0]), wide(xs[1])
    if w.ndim == 5:
        w = unblock_conv_weight(w)
    groups = get_int(attrs, "groups")
    n, k = x.shape[0], w.shape[0]
    kg, cg, r, s = k // groups, w.shape[1], w.shape[2], w.shape[3]
    padded = pad_hw(x, get_ints(attrs, "padding"), 0)
    win = windows(padded, (r, s), get_ints(attrs, "stride"), get_ints(attrs, "dilation"))
    oh, ow = win.shape[2], win.shape[3]
    # im2col per group, then one batched matmul: [N, G, OH*OW, Cg*R*S] @ [G, Cg*R*S, Kg].
    cols = win.reshape(n, groups, cg, oh, ow, r, s).transpose(0, 1, 3, 4, 2, 5, 6)
    cols = cols.reshape(n, groups, oh * ow, cg * r * s)
    filt = w.reshape(groups, kg, cg * r * s).transpose(0, 2, 1)
    out = np.matmul(cols, filt)
    return out.reshape(n, groups, oh, ow, kg).transpose(0, 1, 4, 2, 3).reshape(n, k, oh, ow)


def _conv2d_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """Two stages when padded: `conv2d_pad` copies x into a zero-bordered buffer, and the
    contraction reads it unguarded. Guarding every multiply-add instead (a select and two
    clamps per input pixel, R x S x K times) costs more than the copy of one image.

    A depthwise conv (one input channel per group) with a column stride s makes that copy
    even unpadded, with its columns split by phase: [N, C, H', s, W'/s], column j * s + q at
    [.., q, j], so that the conv reads the columns of each window offset with unit stride
    in the output column (x[.., rw % s, ow + rw // s]): it vectorizes along output columns,
    as its channels (each a plane of its own in NCHW) cannot without a transposing copy.

    A strided 1x1 conv (ResNet's projections) first gathers the pixels it reads into a compact
    image (`conv2d_stride`) and then runs unstrided: every pass of the contraction over its
    input then reads a quarter of the bytes (1024x14x14 -> 2048 with stride 2: 0.91x the
    time)."""
    x, w = args
    (sh, sw), (ph, pw) = attr_ints(op, "stride"), attr_ints(op, "padding")
    (dh, dw), groups = attr_ints(op, "dilation"), attr_int(op, "groups")
    nhwc = is_nhwc(op)
    _, c_per_group, kh, kw = conv_weight_shape(w.shape)
    k_per_group = as_nchw(out.shape, nhwc)[1] // groups
    block = int(op.attr("weight_block", 0))  # type: ignore[arg-type]
    # In NHWC a depthwise conv reads its channels contiguously: no phases.
    phases = sw if groups > 1 and c_per_group == 1 and sw > 1 and not nhwc else 1
    if (kh, kw) == (1, 1) and not (ph or pw) and (sh, sw) != (1, 1):
        x = _strided_copy(k, x, (sh, sw), as_nchw(out.shape, nhwc)[2:], nhwc)
        (sh, sw) = (1, 1)
    elif ph or pw or phases > 1:
        x = _padded_copy(k, x, ph, pw, phases, nhwc)

    def value(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        n, kk, oh, ow = as_nchw(s, nhwc)
        c, rh, rw = r
        channel = c if groups == 1 else affine([(floordiv(kk, k_per_group), c_per_group), (c, 1)])
        h = affine([(oh, sh), (rh, dh)])
        if phases > 1:
            offset = mul(rw, dw)
            columns: tuple[Expr, ...] = (
                Binary("floormod", offset, IntImm(phases)),
                add(ow, floordiv(offset, phases)),
            )
        else:
            columns = (affine([(ow, sw), (rw, dw)]),)
        pixel = (
            (n, channel, h, *columns) if phases > 1 else in_layout((n, channel, h, *columns), nhwc)
        )
        if block:
            filt = w[floordiv(kk, block), c, rh, rw, Binary("floormod", kk, IntImm(block))]
            return x[pixel] * filt
        return x[pixel] * w[kk, c, rh, rw]

    k.reduce("conv2d", out, (c_per_group, kh, kw), value)


def _strided_copy(
    k: Kernel, x: Buffer, stride: tuple[int, int], size: tuple[int, ...], nhwc: bool
) -> Buffer:
    """`conv2d_stride`: the pixels a strided 1x1 conv reads, gathered into a compact image."""
    n, c = as_nchw(x.shape, nhwc)[:2]
    picked = k.alloc("conv2d_stride", in_layout((n, c, *size), nhwc), x.dtype)

    def pixel(i: tuple[Expr, ...]) -> Expr:
        n, c, h, w = as_nchw(i, nhwc)
        return x[in_layout((n, c, mul(h, stride[0]), mul(w, stride[1])), nhwc)]

    k.compute("conv2d_stride", picked, pixel)
    return picked


def _padded_copy(k: Kernel, x: Buffer, ph: int, pw: int, phases: int, nhwc: bool) -> Buffer:
    """`conv2d_pad`: x with a zero border of ph rows and pw columns, its columns split by
    `phases` when more than one (NCHW only: [N, C, H', phases, W'/phases], see
    `_conv2d_lower`)."""
    n, c, h, wd = as_nchw(x.shape, nhwc)
    height, width = h + 2 * ph, wd + 2 * pw
    if phases == 1:
        padded = k.alloc("conv2d_pad", in_layout((n, c, height, width), nhwc), x.dtype)
    else:
        shape = (n, c, height, phases, -(-width // phases))
        padded = k.alloc("conv2d_pad", shape, x.dtype)

    def border(i: tuple[Expr, ...]) -> Expr:
        if phases == 1:
            i = as_nchw(i, nhwc)
        column = i[3] if phases == 1 else affine([(i[4], phases), (i[3], 1)])
        inner = (i[0], i[1], affine([(i[2], 1)], -ph), add(column, -pw))
        return guarded_value(k, x, in_layout(inner, nhwc), const(0, x.dtype))

    k.compute("conv2d_pad", padded, border)
    return padded


def _conv2d_flops(op: Op) -> int:
    """2 per multiply-add: each output element sums C/groups x R x S products."""
    _, c_per_group, r, s = conv_weight_shape(op.operands[1].type.shape)
    return multiply_adds(op.result.type.size * c_per_group * r * s)


def _conv2d_export(ex: Exporter, op: Op) -> None:
    names = operand_names(op)
    k, cg, r, s = conv_weight_shape(op.operands[1].type.shape)
    if op.attr("weight_block"):  # back to KCRS (ONNX Runtime folds it at load time)
        moved = ex.node("Transpose", [names[1]], perm=unblock_perm(0, 4))
        names[1] = ex.node("Reshape", [moved, ex.ints((k, cg, r, s), f"{op.result.name}.w")])
    ex.node(
        "Conv",
        names,
        op.result.name,
        kernel_shape=[r, s],
        strides=list(attr_ints(op, "stride")),
        pads=list(attr_ints(op, "padding")) * 2,
        dilations=list(attr_ints(op, "dilation")),
        group=attr_int(op, "groups"),
    )


CONV2D = OpDef(
    "conv2d",
    "NCHW x convolved with KCRS w (C/groups channels per filter; weight_block=b: w's filters in "
    'blocks of b, innermost, [K/b, C/groups, R, S, b]; layout="NHWC": x and the result NHWC)',
    ("x", "w"),
    ("stride", "padding", "dilation", "groups", "weight_block", "layout"),
    infer=_conv2d_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_nchw_semantics(_conv2d_evaluate),
    lower=_conv2d_lower,
    export=float_only(_nchw_export(_conv2d_export)),
    flops=_conv2d_flops,
)


# --- pools ------------------------------------------------------------------------------------


def _pool2d_infer(c: Check) -> TensorType:
    (x,) = c.ranks(4)
    c.dtype_in("numeric")
    kernel = at_least("kernel", c.ints("kernel", length=2), 1)
    stride = at_least("stride", c.ints("stride", kernel, length=2), 1)
    padding = at_least("padding", c.ints("padding", 0, length=2), 0)
    if padding[0] >= kernel[0] or padding[1] >= kernel[1]:
        fail(f"padding {padding} must be smaller than the kernel {kernel}")
    nhwc = _image_layout(c)
    n, ch, h, w = as_nchw(x.shape, nhwc)
    oh = window_extent(h, kernel[0], stride[0], padding[0])
    ow = window_extent(w, kernel[1], stride[1], padding[1])
    if oh < 1 or ow < 1:
        fail(f"the {kernel[0]}x{kernel[1]} window does not fit x's padded {h}x{w} image")
    return TensorType(in_layout((n, ch, oh, ow), nhwc), x.dtype)


def _max_pool2d_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = xs[0]
    # Padding with the lowest value leaves every max to in-bounds elements only.
    padded = pad_hw(x, get_ints(attrs, "padding"), lowest_value(x.dtype))
    kernel, stride = get_ints(attrs, "kernel"), get_ints(attrs, "stride")
    return windows(padded, kernel, stride, (1, 1)).max(axis=(4, 5))


def _avg_pool2d_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = wide(xs[0])
    kernel, stride, padding = (
        get_ints(attrs, "kernel"),
        get_ints(attrs, "stride"),
        get_ints(attrs, "padding"),
    )
    padded = pad_hw(x, padding, 0)
    total = windows(padded, kernel, stride, (1, 1)).sum(axis=(4, 5))
    # count_include_pad=False: divide by the in-bounds elements of each window.
    ones = pad_hw(np.ones((1, 1) + x.shape[2:], np.int64), padding, 0)
    count = windows(ones, kernel, stride, (1, 1)).sum(axis=(4, 5))
    return mean_of(total, count)


def _window(
    k: Kernel, op: Op, x: Buffer, s: tuple[Expr, ...], r: tuple[Expr, ...], fill: Expr
) -> Expr:
    """The pool window element r at output position s (`fill` in the padding)."""
    (sh, sw), (ph, pw) = attr_ints(op, "stride"), attr_ints(op, "padding")
    nhwc = is_nhwc(op)
    n, c, oh, ow = as_nchw(s, nhwc)
    h = affine([(oh, sh), (r[0], 1)], -ph)
    w = affine([(ow, sw), (r[1], 1)], -pw)
    return guarded_value(k, x, in_layout((n, c, h, w), nhwc), fill)


def _max_pool2d_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    low = lowest(x.dtype)

    def value(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        return _window(k, op, x, s, r, low)

    k.reduce("max_pool2d", out, attr_ints(op, "kernel"), value, combine="max", init=low)


def _avg_pool2d_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    kh, kw = attr_ints(op, "kernel")

    def term(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        return _window(k, op, x, s, r, const(0, x.dtype))

    padded = any(attr_ints(op, "padding"))
    count = (lambda s: _in_bounds_count(k, op, x, s)) if padded else kh * kw
    mean(k, "avg_pool2d", out, (kh, kw), term, count)


def _in_bounds_count(k: Kernel, op: Op, x: Buffer, s: tuple[Expr, ...]) -> Expr:
    """How many elements of the window at output position s lie inside the input
    (count_include_pad=False), as an expression of the output position."""
    extents = []
    nhwc = is_nhwc(op)
    for pos, stride, pad, size, extent in zip(
        as_nchw(s, nhwc)[2:],
        attr_ints(op, "stride"),
        attr_ints(op, "padding"),
        attr_ints(op, "kernel"),
        as_nchw(x.shape, nhwc)[2:],
        strict=True,
    ):
        start = limit(k, affine([(pos, stride)], -pad), 0, extent)
        end = limit(k, affine([(pos, stride)], size - pad), 0, extent)
        extents.append(Binary("-", end, start))
    return Binary("*", extents[0], extents[1])


def _pool_flops(op: Op) -> int:
    """One per window element of each output (a max or an add)."""
    kh, kw = attr_ints(op, "kernel")
    return op.result.type.size * kh * kw


def _pool_export(ex: Exporter, op: Op) -> None:
    common = {
        "kernel_shape": list(attr_ints(op, "kernel")),
        "strides": list(attr_ints(op, "stride")),
        "pads": list(attr_ints(op, "padding")) * 2,
    }
    if op.kind == "max_pool2d":
        ex.node("MaxPool", operand_names(op), op.result.name, **common)
    else:  # hexir averages over the in-bounds elements only
        ex.node("AveragePool", operand_names(op), op.result.name, count_include_pad=0, **common)


def _pool(name: str, doc: str, evaluate, lower) -> OpDef:
    return OpDef(
        name,
        doc,
        ("x",),
        ("kernel", "stride", "padding", "layout"),
        infer=_pool2d_infer,
        fusion=Pattern.REDUCTION,
        evaluate=_nchw_semantics(evaluate),
        lower=lower,
        export=float_only(_nchw_export(_pool_export)),
        flops=_pool_flops,
    )


MAX_POOL2D = _pool(
    "max_pool2d",
    'the max over each NCHW (or NHWC, layout="NHWC") window\'s in-bounds elements',
    _max_pool2d_evaluate,
    _max_pool2d_lower,
)
AVG_POOL2D = _pool(
    "avg_pool2d",
    "the mean over each NCHW (or NHWC) window's in-bounds elements (count_include_pad=False)",
    _avg_pool2d_evaluate,
    _avg_pool2d_lower,
)


def _global_avg_pool2d_infer(c: Check) -> TensorType:
    (x,) = c.ranks(4)
    c.dtype_in("numeric")
    nhwc = _image_layout(c)
    return TensorType(in_layout(as_nchw(x.shape, nhwc)[:2] + (1, 1), nhwc), x.dtype)


def _global_avg_pool2d_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = xs[0]
    total = np.sum(wide(x), axis=(2, 3), keepdims=True)
    return mean_of(total, x.shape[2] * x.shape[3])


def _global_avg_pool2d_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    nhwc = is_nhwc(op)
    h, w = as_nchw(x.shape, nhwc)[2:]
    term = lambda s, r: x[in_layout((s[0], as_nchw(s, nhwc)[1], r[0], r[1]), nhwc)]  # noqa: E731
    mean(k, "global_avg_pool2d", out, (h, w), term, h * w)


GLOBAL_AVG_POOL2D = OpDef(
    "global_avg_pool2d",
    'the mean over each NCHW image: [N,C,1,1] (NHWC where layout="NHWC": [N,1,1,C])',
    ("x",),
    ("layout",),
    infer=_global_avg_pool2d_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_nchw_semantics(_global_avg_pool2d_evaluate),
    lower=_global_avg_pool2d_lower,
    export=float_only(_nchw_export(onnx_same("GlobalAveragePool"))),
)

OPS: tuple[OpDef, ...] = (
    BIAS_ADD,
    CONV2D,
    BATCH_NORM,
    MAX_POOL2D,
    AVG_POOL2D,
    GLOBAL_AVG_POOL2D,
)
