"""Converters of ONNX's windowed nodes: Conv, the pools and BatchNormalization (Hexir's
conv2d, max_pool2d, avg_pool2d, global_avg_pool2d and batch_norm). A 1-D node computes as
the 2-D op one row high (`window_attrs`); pads Hexir's symmetric windows cannot take become
an explicit pad op (a max pool's ceil_mode: -inf padding at the ends; an average pool's: window
sums times a constant divisor per position). A 3-D pool computes as two 2-D ones
(`_pool_3d`); a dilated pool, and a 3-D LpPool, as strided slices combined (`_sliced_pool`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, int_list
from hexir.frontend.onnx_ops import Spec, cast, reshape
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Value
from hexir.ops.numeric import lowest_value


def spatial_pads(
    attrs: Mapping[str, Any],
    spatial: Sequence[int],
    kernel: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """ONNX `pads` ([begins..., ends...]) with `auto_pad` worked out for static shapes, from a
    window node's attributes (`window_attrs`)."""
    strides = attrs.get("strides", [1] * len(spatial))
    auto = attrs.get("auto_pad", "NOTSET")
    if auto == "NOTSET":
        return int_list(attrs.get("pads", [0] * 2 * len(spatial)))
    if auto == "VALID":
        return [0] * 2 * len(spatial)
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begins.append(small if auto == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def window_attrs(ctx: Context, x: Value, what: str) -> dict[str, Any]:
    """A conv's or pool's attributes for a 2-D window: a 1-D node's (an [N, C, L] input,
    computed as [N, C, 1, L]) with a window one row high, no stride, dilation or pad across
    the rows."""
    attrs = dict(ctx.current.attrs)
    if len(x.type.shape) == 4:
        return attrs
    if len(x.type.shape) != 3:
        ranks = "1-D, 2-D and 3-D" if what == "pools" else "1-D and 2-D"
        raise Unsupported(f"only {ranks} {what} are supported, the input is {x.type!r}")
    for key in ("kernel_shape", "strides", "dilations"):
        if key in attrs:
            attrs[key] = [1, *int_list(attrs[key])]
    if "pads" in attrs:
        begin, end = int_list(attrs["pads"])
        attrs["pads"] = [0, begin, 0, end]
    return attrs


def _as_rows(ctx: Context, x: Value) -> Value:
    """A 1-D window's [N, C, L] operand as [N, C, 1, L]; a 2-D one's as it is."""
    shape = x.type.shape
    return reshape(ctx, x, (*shape[:2], 1, shape[2])) if len(shape) == 3 else x


def _from_rows(ctx: Context, y: Value, one_d: bool) -> Value:
    shape = y.type.shape
    return reshape(ctx, y, (shape[0], shape[1], shape[3])) if one_d else y


def _conv(ctx: Context) -> Sequence[Value]:
    return [conv_of(ctx, ctx.input(0), ctx.input(1), ctx.optional(2))]


def conv_of(ctx: Context, x: Value, w: Value, bias: Value | None) -> Value:
    """The current node's convolution (its window attributes) of `x` by `w`, plus `bias`."""
    attrs = window_attrs(ctx, x, "convolutions")
    one_d = len(x.type.shape) == 3
    x, w = _as_rows(ctx, x), _as_rows(ctx, w)
    kernel = w.type.shape[2:]
    if int_list(attrs.get("kernel_shape", kernel)) != list(kernel):
        raise Unsupported(f"kernel_shape {ctx.attr('kernel_shape')} differs from W's {kernel}")
    dilations = int_list(attrs.get("dilations", [1, 1]))
    pads = spatial_pads(attrs, x.type.shape[2:], kernel, dilations)
    x, padding = _symmetric(ctx, x, pads, 0.0)
    y = ctx.op(
        "conv2d",
        x,
        w,
        stride=tuple(int_list(attrs.get("strides", [1, 1]))),
        padding=padding,
        dilation=tuple(dilations),
        groups=int(attrs.get("group", 1)),
    )
    y = y if bias is None else ctx.op("bias_add", y, bias, axis=1)
    return _from_rows(ctx, y, one_d)


def _symmetric(
    ctx: Context, x: Value, pads: list[int], value: float
) -> tuple[Value, tuple[int, int]]:
    """Hexir's windows pad the same on both sides; other pads become an explicit pad op."""
    if pads[:2] == pads[2:]:
        return x, (pads[0], pads[1])
    return _padded(ctx, x, pads, value), (0, 0)


def _padded(ctx: Context, x: Value, pads: Sequence[int], value: float) -> Value:
    """`x` [N, C, H, W] padded by ONNX `pads` ([top, left, bottom, right]) with `value`."""
    return ctx.op("pad", x, before=(0, 0, *pads[:2]), after=(0, 0, *pads[2:]), value=value)


def _batch_norm(ctx: Context) -> Sequence[Value]:
    """Y from the given mean and variance; in training mode (`training_mode=1`) from the
    batch's own (the population variance, over every axis but the channels', in float32
    for narrower floats), with the running mean and variance updated by `momentum` as the
    second and third outputs."""
    x = ctx.input(0)
    params = [ctx.input(i) for i in range(1, 5)]
    # opset 15 lets scale/bias and mean/var have their own float types
    params = [cast(ctx, p, x.type.dtype) for p in params]
    eps = ctx.float_attr("epsilon", 1e-5)
    if not ctx.attr("training_mode", 0):
        return [ctx.op("batch_norm", x, *params, axis=1, epsilon=eps)]
    scale, bias, running_mean, running_var = params
    wide = x.type.dtype if x.type.dtype in ("float32", "float64") else "float32"
    xs = cast(ctx, x, wide)
    axes = tuple(a for a in range(len(x.type.shape)) if a != 1)
    mean = ctx.op("reduce_mean", xs, axes=axes, keepdims=True)
    centered = ctx.op("sub", xs, mean)
    var = ctx.op("reduce_mean", ctx.op("mul", centered, centered), axes=axes, keepdims=True)
    stats = [cast(ctx, reshape(ctx, v, (x.type.shape[1],)), x.type.dtype) for v in (mean, var)]
    y = ctx.op("batch_norm", x, scale, bias, *stats, axis=1, epsilon=eps)
    momentum = ctx.float_attr("momentum", 0.9)
    updated = [
        ctx.op(
            "add",
            ctx.op("mul", running, ctx.scalar(momentum, running)),
            ctx.op("mul", current, ctx.scalar(1 - momentum, current)),
        )
        for running, current in ((running_mean, stats[0]), (running_var, stats[1]))
    ]
    return [y, *updated]


@dataclass(frozen=True)
class _Window:
    """A pool's input as rows ([N, C, H, W]; a 1-D one a row high), its attributes, window,
    stride, and pads as given and as ceil_mode grows them."""

    x: Value
    one_d: bool
    attrs: dict[str, Any]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    given: list[int]
    pads: list[int]


def _window(
    ctx: Context, x: Value | None = None, attributes: dict[str, Any] | None = None
) -> _Window:
    """The current node's window over its input, or over `x` with `attributes` (a 3-D
    pool's steps, `_pool_3d`)."""
    x = ctx.input(0) if x is None else x
    attrs = window_attrs(ctx, x, "pools") if attributes is None else attributes
    one_d = len(x.type.shape) == 3
    x = _as_rows(ctx, x)
    kernel = tuple(int_list(attrs["kernel_shape"]))
    given = spatial_pads(attrs, x.type.shape[2:], kernel, [1, 1])
    stride = tuple(int_list(attrs.get("strides", [1, 1])))
    pads = (
        _ceil_pads(x.type.shape[2:], kernel, stride, given) if attrs.get("ceil_mode", 0) else given
    )
    return _Window(x, one_d, attrs, kernel, stride, given, pads)


def _pool(ctx: Context) -> Sequence[Value]:
    """The pool, and for a MaxPool asked for its second output the indices (`_argmax`)."""
    x = ctx.input(0)
    indices = [_argmax(ctx, x)] if len(ctx.current.outputs) > 1 and ctx.current.outputs[1] else []
    rank = len(x.type.shape)
    if _dilated(ctx, rank):
        mode = "max" if ctx.current.op_type == "MaxPool" else "average"
        return [_sliced_pool(ctx, x, mode), *indices]
    if rank == 5:
        return [_pool_3d(ctx, x), *indices]
    return [_pool_of(ctx, _window(ctx)), *indices]


def _argmax(ctx: Context, x: Value) -> Value:
    """MaxPool's indices: where in x (flattened, row-major; with storage_order=1 the spatial
    axes column-major) each window's first largest element lies, as ONNX's reference scans
    a window: its elements in order, the pads skipped, a later one taken only where larger.
    Which window elements lie inside x is known here, so the scan is where-chains over the
    window's strided slices with those masks constant."""
    attrs = dict(ctx.current.attrs)
    spatial, lead = x.type.shape[2:], x.type.shape[:2]
    t = _taps(attrs, spatial)
    axes = range(len(spatial))
    flat = [int(np.prod(spatial[k + 1 :])) for k in axes]  # row-major strides
    if int(attrs.get("storage_order", 0)):
        flat = [int(np.prod(spatial[:k])) for k in axes]
    yes, no = ctx.constant(np.array(True)), ctx.constant(np.array(False))
    best = index = None
    seen = np.zeros(t.outs, bool)
    for start, piece in _tap_slices(ctx, x, t, lowest_value(numpy_dtype(x.type.dtype))):
        firsts = zip(t.outs, t.strides, start, t.before, strict=True)  # where x's axes start
        at = np.meshgrid(*(np.arange(o) * s + a - b for o, s, a, b in firsts), indexing="ij")
        valid = np.logical_and.reduce(
            [(p >= 0) & (p < n) for p, n in zip(at, spatial, strict=True)]
        )
        offset = ctx.constant(sum(p * f for p, f in zip(at, flat, strict=True)).astype(np.int64))
        if best is None:
            best, index = piece, offset
        else:
            larger = ctx.op("greater", piece, best)
            first = ctx.constant(valid & ~seen)
            better = ctx.op(
                "where", first, yes, ctx.op("where", ctx.constant(valid & seen), larger, no)
            )
            best = ctx.op("where", better, piece, best)
            index = ctx.op("where", better, offset, index)
        seen |= valid
    channels = np.arange(lead[0] * lead[1], dtype=np.int64).reshape(*lead, *([1] * len(spatial)))
    base = ctx.constant(channels * int(np.prod(spatial)))
    return ctx.op("add", index, base)  # type: ignore[arg-type]


def _dilated(ctx: Context, rank: int) -> bool:
    return any(d != 1 for d in int_list(ctx.current.attrs.get("dilations", [1] * (rank - 2))))


@dataclass(frozen=True)
class _Taps:
    """A pool's windows as strided slices of its padded input: the pads before and after
    (`after` grown for ceil_mode), the outputs along each spatial axis, strides and
    dilations, and the window's elements."""

    before: list[int]
    after: list[int]
    outs: list[int]
    strides: list[int]
    dilations: list[int]
    taps: list[tuple[int, ...]]
    given: list[int]  # the pads as the attributes give them (before, then after)

    def tap(self, j: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Window element j's slice of the padded input: its start and stop."""
        start = tuple(a * d for a, d in zip(j, self.dilations, strict=True))
        stop = tuple(
            b + (o - 1) * s + 1 for b, o, s in zip(start, self.outs, self.strides, strict=True)
        )
        return start, stop


def _taps(attrs: Mapping[str, Any], spatial: tuple[int, ...]) -> _Taps:
    n = len(spatial)
    kernel = int_list(attrs["kernel_shape"])
    dilations = int_list(attrs.get("dilations", [1] * n))
    strides = int_list(attrs.get("strides", [1] * n))
    given = spatial_pads(attrs, spatial, kernel, dilations)
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    ceil = bool(attrs.get("ceil_mode", 0))
    outs, ends = [], list(given[n:])
    for i, (size, r, step) in enumerate(zip(spatial, reach, strides, strict=True)):
        total = size + given[i] + given[n + i] - r
        out = (-(-total // step) if ceil else total // step) + 1
        if ceil and (out - 1) * step >= size + given[i]:
            out -= 1  # a last window may not start in the end padding alone
        ends[i] += max(0, (out - 1) * step + r - (size + given[i] + given[n + i]))
        outs.append(out)
    return _Taps(given[:n], ends, outs, strides, dilations, list(np.ndindex(*kernel)), given)


def _tap_slices(
    ctx: Context, x: Value, t: _Taps, fill: float | int | bool
) -> list[tuple[tuple[int, ...], Value]]:
    """Each window element's strided slice of x padded once with `fill`: (where the slice
    starts in the padded input, the slice), in the window's order."""
    padded = ctx.op("pad", x, before=(0, 0, *t.before), after=(0, 0, *t.after), value=fill)
    lead = x.type.shape[:2]
    slices = []
    for j in t.taps:
        start, stop = t.tap(j)
        piece = ctx.op("slice", padded, start=(0, 0, *start), stop=(*lead, *stop),
                       step=(1, 1, *t.strides))  # fmt: skip
        slices.append((start, piece))
    return slices


def _sliced_pool(ctx: Context, x: Value, mode: str) -> Value:
    """A pool of any rank and dilation (a dilated one's window skips elements) as strided
    slices: the input padded once (-inf, or the dtype's least, for a max; zeros otherwise),
    then each window element j is a strided slice (from j * dilation, every stride-th
    element, one per output) and the slices are combined elementwise: their max (`mode`
    "max"), their sum ("sum"), or their sum over how many of the window's elements count at
    each output ("average": the given pads with count_include_pad, never ceil_mode's
    extension), a constant computed here."""
    attrs = dict(ctx.current.attrs)
    spatial = x.type.shape[2:]
    n = len(spatial)
    t = _taps(attrs, spatial)
    given, begins, ends, strides, taps, tap = t.given, t.before, t.after, t.strides, t.taps, t.tap
    is_max = mode == "max"
    dtype = x.type.dtype
    fill = lowest_value(numpy_dtype(dtype)) if is_max else 0.0
    combined = None
    for _, piece in _tap_slices(ctx, x, t, fill):
        if combined is None:
            combined = piece
        else:
            combined = ctx.op("maximum" if is_max else "add", combined, piece)
    if mode != "average":
        return combined  # type: ignore[return-value]
    inside = np.zeros([b + size + e for b, size, e in zip(begins, spatial, ends, strict=True)])
    include = bool(attrs.get("count_include_pad", 0))
    low = [0] * n if include else begins
    high = [begins[i] + spatial[i] + (given[n + i] if include else 0) for i in range(n)]
    inside[tuple(slice(lo, hi) for lo, hi in zip(low, high, strict=True))] = 1.0
    counts = sum(inside[tuple(slice(a, b, s) for a, b, s in zip(*tap(j), strides, strict=True))]
                 for j in taps)  # fmt: skip
    divisor = ctx.constant(np.asarray(counts, numpy_dtype(dtype))[None, None])
    return ctx.op("div", combined, divisor)


def _pool_3d(ctx: Context, x: Value) -> Value:
    """A 3-D pool as two 2-D ones: over each depth slice's rows and columns ([N, C*D, H, W]),
    then over the depths ([N, C, D, H'*W'], a window one column wide). A box window's max is
    the max over depths of each slice's max; its average the average over depths of each
    slice's average, each over the elements that count along its own axes (the pads with
    count_include_pad, never ceil_mode's extension): both come apart axis by axis."""
    attrs = dict(ctx.current.attrs)
    n, c, depth, height, width = x.type.shape
    kernel = int_list(attrs["kernel_shape"])
    pads = spatial_pads(attrs, (depth, height, width), kernel, [1, 1, 1])
    strides = int_list(attrs.get("strides", [1, 1, 1]))
    common = {k: attrs[k] for k in ("ceil_mode", "count_include_pad") if k in attrs}
    rows = {**common, "kernel_shape": kernel[1:], "strides": strides[1:],
            "pads": [pads[1], pads[2], pads[4], pads[5]]}  # fmt: skip
    slices = _pool_of(ctx, _window(ctx, reshape(ctx, x, (n, c * depth, height, width)), rows))
    h, w = slices.type.shape[2:]
    depths = {**common, "kernel_shape": [kernel[0], 1], "strides": [strides[0], 1],
              "pads": [pads[0], 0, pads[3], 0]}  # fmt: skip
    y = _pool_of(ctx, _window(ctx, reshape(ctx, slices, (n, c, depth, h * w)), depths))
    return reshape(ctx, y, (n, c, y.type.shape[2], h, w))


def _pool_of(ctx: Context, w: _Window) -> Value:
    """The current node's pool (MaxPool or AveragePool) over the window `w`."""
    x, one_d, attrs, kernel, stride, given, pads = (
        w.x, w.one_d, w.attrs, w.kernel, w.stride, w.given, w.pads
    )  # fmt: skip
    is_max = ctx.current.op_type == "MaxPool"
    if not is_max and (pads != given or pads[:2] != pads[2:]):
        return _from_rows(ctx, _clipped_average(ctx, x, kernel, stride, given, pads, attrs),
                          one_d)  # fmt: skip
    if not is_max and attrs.get("count_include_pad", 0) and any(pads):
        # the padding zeros count: pad explicitly, then average whole windows
        x, padding = _padded(ctx, x, pads, 0.0), (0, 0)
    elif pads[:2] == pads[2:] or (is_max and x.type.dtype.startswith("float")):
        x, padding = _symmetric(ctx, x, pads, -np.inf)  # a -inf pad never wins a max
    else:
        raise Unsupported(f"{ctx.current.op_type} with uneven pads {pads} on {x.type!r}")
    kind = "max_pool2d" if is_max else "avg_pool2d"
    y = ctx.op(kind, x, kernel=kernel, stride=stride, padding=padding)
    return _from_rows(ctx, y, one_d)


def _lp_pool(ctx: Context) -> Sequence[Value]:
    """(the sum of |x|^p over each window)^(1/p), the padding zeros: an average pool of |x|^p
    over the explicitly padded image, times the window's size; a dilated or 3-D one, the sum
    of strided slices of |x|^p (`_sliced_pool`)."""
    p = float(ctx.attr("p", 2))
    x = ctx.input(0)
    strided = _dilated(ctx, len(x.type.shape)) or len(x.type.shape) == 5
    w = None if strided else _window(ctx)
    x = x if w is None else w.x
    if p == 2.0:
        powered = ctx.op("mul", x, x)
    else:
        size = ctx.op("maximum", x, ctx.op("sub", ctx.scalar(0, x), x))  # |x|
        powered = size if p == 1.0 else ctx.op("power", size, ctx.scalar(p, x))
    if w is None:
        total = _sliced_pool(ctx, powered, "sum")
    else:
        mean = ctx.op("avg_pool2d", _padded(ctx, powered, w.pads, 0.0), kernel=w.kernel,
                      stride=w.stride, padding=(0, 0))  # fmt: skip
        total = ctx.op("mul", mean, ctx.scalar(float(np.prod(w.kernel)), mean))
    if p == 1.0:
        root = total
    elif p == 2.0:
        root = ctx.op("sqrt", total)
    else:
        root = ctx.op("power", total, ctx.scalar(1.0 / p, total))
    return [root if w is None else _from_rows(ctx, root, w.one_d)]


def _clipped_average(
    ctx: Context,
    x: Value,
    kernel: Sequence[int],
    stride: Sequence[int],
    given: list[int],
    pads: list[int],
    attrs: Mapping[str, Any],
) -> Value:
    """An average pool whose windows Hexir's symmetric padding cannot express (uneven pads,
    ceil_mode's extra windows): the sum of each window over the zero-padded image (the
    average of whole windows times their size), times a constant per output position of the
    window's size over its divisor, the elements it covers inside the image (and inside the
    given pads with count_include_pad), never the ceil_mode extension."""
    n = len(kernel)
    spatial = x.type.shape[2:]
    mean = ctx.op("avg_pool2d", _padded(ctx, x, pads, 0.0), kernel=tuple(kernel),
                  stride=tuple(stride), padding=(0, 0))  # fmt: skip
    include = bool(attrs.get("count_include_pad", 0))
    inside = []  # per axis: how many of each window's elements count
    for i, (size, k, step, out) in enumerate(
        zip(spatial, kernel, stride, mean.type.shape[2:], strict=True)
    ):
        low, high = (-given[i], size + given[n + i]) if include else (0, size)
        starts = np.arange(out) * step - pads[i]
        inside.append(np.minimum(starts + k, high) - np.maximum(starts, low))
    scale = np.prod(kernel) / np.multiply.outer(*inside)
    return ctx.op("mul", mean, ctx.constant(scale[None, None].astype(x.type.dtype)))


def _ceil_pads(
    spatial: Sequence[int], kernel: Sequence[int], stride: Sequence[int], pads: list[int]
) -> list[int]:
    """`pads` grown at the end of each axis so that a pool's output length rounds up (ONNX's
    ceil_mode): one more window where a partial one remains, unless it would start past the
    input and its leading pad."""
    n = len(spatial)
    ends = list(pads[n:])
    for i, (size, k, s) in enumerate(zip(spatial, kernel, stride, strict=True)):
        total = size + pads[i] + ends[i]
        out = -(-(total - k) // s) + 1
        if (out - 1) * s >= size + pads[i]:
            out -= 1
        ends[i] += max(0, (out - 1) * s + k - total)
    return [*pads[:n], *ends]


def _global_pool(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    ndim = len(x.type.shape)
    if ctx.current.op_type == "GlobalAveragePool" and ndim == 4:
        return [ctx.op("global_avg_pool2d", x)]
    kind = "reduce_mean" if ctx.current.op_type == "GlobalAveragePool" else "reduce_max"
    return [ctx.op(kind, x, axes=tuple(range(2, ndim)), keepdims=True)]


_POOL = {
    "kernel_shape": None,
    "strides": None,
    "pads": None,
    "auto_pad": None,
    "dilations": None,
    "ceil_mode": (0, 1),
}

CONV_ATTRS = {
    "kernel_shape": None,
    "strides": None,
    "pads": None,
    "dilations": None,
    "group": None,
    "auto_pad": None,
}
WINDOW_SPECS: dict[str, Spec] = {
    "Conv": Spec(_conv, CONV_ATTRS),
    "BatchNormalization": Spec(
        _batch_norm,
        {"epsilon": None, "momentum": None, "training_mode": (0, 1)},
        # the running statistics in training mode only (the spec: "invalid" otherwise)
        outputs=lambda attrs: None if attrs.get("training_mode", 0) else 1,
    ),
    "MaxPool": Spec(_pool, {**_POOL, "storage_order": None}, outputs=None),
    "AveragePool": Spec(_pool, {**_POOL, "count_include_pad": None}),
    "GlobalAveragePool": Spec(_global_pool),
    "LpPool": Spec(_lp_pool, {**_POOL, "p": None}),
    "GlobalMaxPool": Spec(_global_pool),
}
