"""Converters of ONNX ops that Hexir computes as compositions of its own ops, exact as written:
Einsum (transposes, sums and contractions), LRN (a windowed sum of squares), ConvTranspose
(a convolution of the input spread out by the stride, with the weight flipped at import) and
TopK (rounds of argmax, then a gather).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, int_list, normalized_axis
from hexir.frontend.onnx_ops import Spec, reshape
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Value

# --- Einsum -----------------------------------------------------------------------------------

_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")


@dataclass(frozen=True, slots=True)
class Labeled:
    """A value and the einsum label of each of its axes."""

    value: Value
    labels: tuple[str, ...]

    def size(self, label: str) -> int:
        return self.value.type.shape[self.labels.index(label)]


def _einsum(ctx: Context) -> Sequence[Value]:
    """Each operand's own sums (and diagonals) first, then the operands contracted pairwise
    from the left (a matmul, batch_matmul or dense of the operands transposed and flattened to
    [batch, rows, inner] and [batch, inner, columns]; a product where nothing is contracted),
    then the remaining sums and a transpose to the output's order."""
    operands = [ctx.input(i) for i in range(len(ctx.current.inputs))]
    terms, output = _parse_equation(str(ctx.attr("equation")), operands)
    items = [_diagonals(ctx, Labeled(v, t)) for v, t in zip(operands, terms, strict=True)]
    items = _broadcast_ones(ctx, items)
    result = items[0]
    for k, other in enumerate(items[1:], start=1):
        later = set(output).union(*(t.labels for t in items[k + 1 :]))
        result = _contract(ctx, _sum_out(ctx, result, later | set(other.labels)), other, later)
    result = _sum_out(ctx, result, set(output))
    perm = tuple(result.labels.index(label) for label in output)
    if perm == tuple(range(len(perm))):
        return [result.value]
    return [ctx.op("transpose", result.value, perm=perm)]


def _parse_equation(
    equation: str, operands: list[Value]
) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """Each operand's labels and the output's, with "..." spelled out as labels "0", "1", ...
    (aligned from the right across operands, as numpy broadcasts) and an implicit output
    (no "->") made of the ellipsis and the letters used once, in alphabetical order."""
    text = equation.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    written = inputs.split(",")
    if len(written) != len(operands) or not all(_TERM.fullmatch(t) for t in written + [output]):
        raise Unsupported(f"Einsum equation {equation!r} for {len(operands)} operand(s)")
    ellipsis_rank = 0
    for term, v in zip(written, operands, strict=True):
        letters = len(term.replace("...", ""))
        if len(v.type.shape) < letters or ("..." not in term and len(v.type.shape) != letters):
            raise Unsupported(f"Einsum term {term!r} of an operand of rank {len(v.type.shape)}")
        if "..." in term:
            ellipsis_rank = max(ellipsis_rank, len(v.type.shape) - letters)
    spelled = [
        _spell(t, len(v.type.shape), ellipsis_rank) for t, v in zip(written, operands, strict=True)
    ]
    if not arrow:
        letters = "".join(written).replace("...", "")
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        output = ("..." if ellipsis_rank else "") + "".join(once)
    out = _spell(output, ellipsis_rank + len(output.replace("...", "")), ellipsis_rank)
    if len(set(out)) != len(out) or not set(out) <= {x for t in spelled for x in t}:
        raise Unsupported(f"Einsum output {output!r} of equation {equation!r}")
    return spelled, out


def _spell(term: str, rank: int, ellipsis_rank: int) -> tuple[str, ...]:
    """The labels of a term's axes; its "..." covers the last of the ellipsis labels."""
    before, dots, after = term.partition("...")
    if not dots:
        return tuple(term)
    count = rank - len(before) - len(after)
    dims = tuple(str(d) for d in range(ellipsis_rank - count, ellipsis_rank))
    return (*before, *dims, *after)


def _diagonals(ctx: Context, item: Labeled) -> Labeled:
    """A label written twice in one term ("ii") takes the diagonal: the two axes moved last,
    flattened, and every (n + 1)th element kept."""
    labels = item.labels
    repeated = next((x for x in labels if labels.count(x) > 1), None)
    if repeated is None:
        return item
    p = labels.index(repeated)
    q = labels.index(repeated, p + 1)
    x = item.value
    n = x.type.shape[p]
    if x.type.shape[q] != n:
        raise Unsupported(f"Einsum diagonal of axes of sizes {n} and {x.type.shape[q]}")
    rest = [d for d in range(len(labels)) if d not in (p, q)]
    moved = _permuted(ctx, x, tuple(rest + [p, q]))
    shape = tuple(x.type.shape[d] for d in rest)
    flat = reshape(ctx, moved, (*shape, n * n))
    ndim = len(shape) + 1
    diagonal = ctx.op(
        "slice",
        flat,
        start=(0,) * ndim,
        stop=(*shape, n * n),
        step=(*(1,) * len(shape), n + 1),
    )
    return _diagonals(ctx, Labeled(diagonal, tuple(labels[d] for d in rest) + (repeated,)))


def _broadcast_ones(ctx: Context, items: list[Labeled]) -> list[Labeled]:
    """A label of size 1 in one operand and n > 1 in another broadcasts: the operand drops that
    axis. Sizes that differ otherwise are refused."""
    sizes: dict[str, set[int]] = {}
    for item in items:
        for label, n in zip(item.labels, item.value.type.shape, strict=True):
            sizes.setdefault(label, set()).add(n)
    for label, seen in sizes.items():
        if len(seen - {1}) > 1:
            raise Unsupported(f"Einsum label {label!r} has sizes {sorted(seen)}")
    result = []
    for item in items:
        keep = [
            d
            for d, label in enumerate(item.labels)
            if item.value.type.shape[d] != 1 or sizes[label] == {1}
        ]
        shape = tuple(item.value.type.shape[d] for d in keep)
        value = reshape(ctx, item.value, shape)
        result.append(Labeled(value, tuple(item.labels[d] for d in keep)))
    return result


def _sum_out(ctx: Context, item: Labeled, keep: set[str]) -> Labeled:
    """The sum over the axes whose labels are not in `keep`."""
    axes = tuple(d for d, label in enumerate(item.labels) if label not in keep)
    if not axes:
        return item
    summed = ctx.op("reduce_sum", item.value, axes=axes, keepdims=False)
    return Labeled(summed, tuple(x for x in item.labels if x in keep))


def _permuted(ctx: Context, x: Value, perm: tuple[int, ...]) -> Value:
    return x if perm == tuple(range(len(perm))) else ctx.op("transpose", x, perm=perm)


def _grouped(ctx: Context, item: Labeled, groups: Sequence[Sequence[str]]) -> Value:
    """`item` transposed to the labels of `groups` in order, each group flattened to one axis."""
    order = [label for group in groups for label in group]
    moved = _permuted(ctx, item.value, tuple(item.labels.index(x) for x in order))
    extents = [math.prod(item.size(x) for x in group) for group in groups]
    return reshape(ctx, moved, extents)


def _contract(ctx: Context, a: Labeled, b: Labeled, later: set[str]) -> Labeled:
    """a and b multiplied, summing the labels they share that nothing later needs. `a` has no
    label of its own that nothing needs (`_sum_out` took them); `b`'s are summed here."""
    b = _sum_out(ctx, b, later | set(a.labels))
    batch = [x for x in a.labels if x in b.labels and x in later]
    inner = [x for x in a.labels if x in b.labels and x not in later]
    rows = [x for x in a.labels if x not in b.labels]
    columns = [x for x in b.labels if x not in a.labels]
    labels = (*batch, *rows, *columns)
    shape = tuple(a.size(x) if x in a.labels else b.size(x) for x in labels)
    if not inner:  # an outer product: a [batch, rows, 1] times b [batch, 1, columns]
        left = _grouped(ctx, a, [batch, rows, []])
        y = ctx.op("mul", left, _grouped(ctx, b, [batch, [], columns]))
    elif not batch and list(b.labels) == columns + inner:  # b is [columns, inner]: x · wᵀ
        y = ctx.op("dense", _grouped(ctx, a, [rows, inner]), _grouped(ctx, b, [columns, inner]))
    elif not batch:
        y = ctx.op("matmul", _grouped(ctx, a, [rows, inner]), _grouped(ctx, b, [inner, columns]))
    else:
        left = _grouped(ctx, a, [batch, rows, inner])
        y = ctx.op("batch_matmul", left, _grouped(ctx, b, [batch, inner, columns]))
    return Labeled(reshape(ctx, y, shape), labels)


# --- LRN --------------------------------------------------------------------------------------


def _lrn(ctx: Context) -> Sequence[Value]:
    """x / (bias + alpha / size * the sum of x² over `size` channels around each)^beta: the
    window's sum of squares as size times an average pool over channels (zeros padded past the
    ends, floor((size - 1) / 2) before and the rest after, as ONNX places the window)."""
    x = ctx.input(0)
    shape = x.type.shape
    size = int(ctx.attr("size"))
    if len(shape) < 2 or size < 1 or not x.type.dtype.startswith("float"):
        raise Unsupported(f"LRN of size {size} over {x.type!r}")
    n, c = shape[:2]
    rows = reshape(ctx, ctx.op("mul", x, x), (n, 1, c, math.prod(shape[2:])))
    before = (size - 1) // 2
    padded = ctx.op("pad", rows, before=(0, 0, before, 0), after=(0, 0, size - 1 - before, 0))
    mean = ctx.op("avg_pool2d", padded, kernel=(size, 1), stride=(1, 1), padding=(0, 0))
    alpha, beta = ctx.float_attr("alpha", 1e-4), ctx.float_attr("beta", 0.75)
    scaled = ctx.op("mul", reshape(ctx, mean, shape), ctx.scalar(alpha, x))
    base = ctx.op("add", scaled, ctx.scalar(ctx.float_attr("bias", 1.0), x))
    return [ctx.op("div", x, ctx.op("power", base, ctx.scalar(beta, x)))]


# --- ConvTranspose ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Axis:
    """One spatial axis of a ConvTranspose: the input's extent, the kernel's, and the
    attributes. `end` may be negative: zeros appended (an output_shape past the natural one)."""

    size: int
    kernel: int
    stride: int
    dilation: int
    begin: int
    end: int
    output_padding: int

    @property
    def reach(self) -> int:
        return (self.kernel - 1) * self.dilation

    @property
    def natural(self) -> int:
        """The output's extent before the pads are taken off."""
        return self.stride * (self.size - 1) + self.output_padding + self.reach + 1


def _conv_transpose(ctx: Context) -> Sequence[Value]:
    """The transposed convolution as the convolution it is the gradient of: the input spread
    out by the stride (stride - 1 zeros after each element), padded by the kernel's reach less
    the pads (cropped where that is negative, with output_padding more at the end), convolved
    at stride 1 with the weight's channels swapped in each group and its taps reversed. 1-D
    ones are 2-D ones of height 1; 3-D ones are 2-D ones over each output depth's window of
    depths (`_depth_windows`)."""
    x, w = ctx.input(0), ctx.input(1)
    rank = len(x.type.shape) - 2
    if rank not in (1, 2, 3) or len(w.type.shape) != rank + 2:
        raise Unsupported(f"ConvTranspose of {x.type!r} by {w.type!r}: 1-D, 2-D and 3-D only")
    axes = _transpose_axes(ctx, x.type.shape[2:], w.type.shape[2:])
    if rank == 1:  # a unit height in front
        x = reshape(ctx, x, (*x.type.shape[:2], 1, x.type.shape[2]))
        axes = [_Axis(1, 1, 1, 1, 0, 0, 0), *axes]
    groups = int(ctx.attr("group", 1))
    weight = _reversed_weight(ctx, groups, rank)
    spread = _spread(ctx, x, axes)
    if rank == 3:
        spread = _depth_windows(ctx, spread, axes[0], groups)
    y = ctx.op(
        "conv2d",
        spread,
        weight,
        stride=(1, 1),
        padding=(0, 0),
        dilation=tuple(a.dilation for a in axes[-2:]),
        groups=groups,
    )
    if rank == 1:
        y = reshape(ctx, y, (*y.type.shape[:2], y.type.shape[3]))
    if rank == 3:  # [N * D', M, H', W'] -> [N, M, D', H', W']
        n, depth = x.type.shape[0], y.type.shape[0] // x.type.shape[0]
        y = reshape(ctx, y, (n, depth, *y.type.shape[1:]))
        y = ctx.op("transpose", y, perm=(0, 2, 1, 3, 4))
    bias = ctx.optional(2)
    return [y if bias is None else ctx.op("bias_add", y, bias, axis=1)]


def _transpose_axes(ctx: Context, sizes: Sequence[int], kernel: Sequence[int]) -> list[_Axis]:
    """The spatial axes, with pads from `pads`, or from `output_shape` or `auto_pad` (ONNX's
    split of the total: the odd one at the end for SAME_UPPER, at the start otherwise)."""
    rank = len(sizes)
    given = ctx.attr("kernel_shape")
    if given is not None and int_list(given) != list(kernel):
        raise Unsupported(f"kernel_shape {int_list(given)} differs from W's {list(kernel)}")
    strides = int_list(ctx.attr("strides", [1] * rank))
    dilations = int_list(ctx.attr("dilations", [1] * rank))
    extra = int_list(ctx.attr("output_padding", [0] * rank))
    pads = int_list(ctx.attr("pads", [0] * 2 * rank))
    axes = [
        _Axis(n, k, s, d, pads[i], pads[rank + i], p)
        for i, (n, k, s, d, p) in enumerate(
            zip(sizes, kernel, strides, dilations, extra, strict=True)
        )
    ]
    auto = ctx.attr("auto_pad", "NOTSET")
    shape = ctx.attr("output_shape")
    if shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = [n * s for n, s in zip(sizes, strides, strict=True)]
    if shape is None:
        return axes
    shape = int_list(shape)[-rank:]
    return [_split_padding(a, out, auto) for a, out in zip(axes, shape, strict=True)]


def _split_padding(axis: _Axis, out: int, auto: str) -> _Axis:
    total = axis.natural - out
    if total < 0 and auto != "NOTSET":  # onnxruntime's output stays natural, onnx's grows
        raise Unsupported(f"ConvTranspose with auto_pad {auto} and a stride past the kernel")
    if total <= 0:  # an output_shape past the natural one: zeros at the end
        return dataclasses.replace(axis, begin=0, end=total)
    begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
    return dataclasses.replace(axis, begin=begin, end=total - begin)


def _spread(ctx: Context, x: Value, axes: list[_Axis]) -> Value:
    """x [N, C, *spatial] with stride - 1 zeros after each element of each spatial axis, then
    the kernel's reach less the pads added (zeros) or taken off (a slice) at each end."""
    n, c, *sizes = x.type.shape
    strides = [a.stride for a in axes]
    if any(s != 1 for s in strides):  # [N, C, H, 1, W, 1] padded to [N, C, H, sh, W, sw]
        cells = reshape(ctx, x, (n, c, *(d for size in sizes for d in (size, 1))))
        after = (0, 0, *(d for s in strides for d in (0, s - 1)))
        cells = ctx.op("pad", cells, before=(0,) * len(after), after=after)
        spread = (size * s for size, s in zip(sizes, strides, strict=True))
        x = reshape(ctx, cells, (n, c, *spread))
    # what each end needs, the spread's trailing stride - 1 zeros already counted
    before = [a.reach - a.begin for a in axes]
    after = [a.reach - a.end + a.output_padding - (a.stride - 1) for a in axes]
    if any(v > 0 for v in before + after):
        grow_before, grow_after = ([max(v, 0) for v in side] for side in (before, after))
        x = ctx.op("pad", x, before=(0, 0, *grow_before), after=(0, 0, *grow_after))
    if any(v < 0 for v in before + after):
        shape = x.type.shape
        start = (0, 0, *(max(-v, 0) for v in before))
        stop = (n, c, *(d + min(v, 0) for d, v in zip(shape[2:], after, strict=True)))
        x = ctx.op("slice", x, start=start, stop=stop, step=(1,) * len(shape))
    return x


def _depth_windows(ctx: Context, x: Value, depth: _Axis, groups: int) -> Value:
    """The spread input [N, C, D, H, W] of a 3-D ConvTranspose as the input of a 2-D
    convolution, [N * D', G * kd * C/G, H, W]: for each output depth, the kd depths its window
    reads (dilated), each group's channels tap by tap, as `_reversed_weight` orders the
    weight's. A stride-1 convolution over depth is then one 2-D convolution."""
    n, c, d, h, w = x.type.shape
    kd, step = depth.kernel, depth.dilation
    out = d - (kd - 1) * step
    if out < 1:
        raise Unsupported(f"ConvTranspose whose output has depth {out}")
    taps = [
        reshape(
            ctx,
            ctx.op(
                "slice",
                x,
                start=(0, 0, t * step, 0, 0),
                stop=(n, c, t * step + out, h, w),
                step=(1,) * 5,
            ),
            (n, groups, 1, c // groups, out, h, w),
        )
        for t in range(kd)
    ]
    stacked = taps[0] if kd == 1 else ctx.op("concat", *taps, axis=2)
    moved = ctx.op("transpose", stacked, perm=(0, 4, 1, 2, 3, 5, 6))
    return reshape(ctx, moved, (n * out, c * kd, h, w))


def _reversed_weight(ctx: Context, groups: int, rank: int) -> Value:
    """W [C, M / groups, k...] as conv2d's [M, C / groups, kh, kw]: within each group the
    channel axes swapped, and the taps reversed. A 3-D one's depth taps go in front of each
    group's channels ([M, kd * C / groups, kh, kw], as `_depth_windows` stacks the input).
    Computed at import for a constant W."""
    w = ctx.input(1)
    c, m = w.type.shape[:2]
    kernel = (1,) * (2 - rank) + w.type.shape[2:]
    if c % groups:
        raise Unsupported(f"ConvTranspose of {c} channels in {groups} groups")
    grouped = (groups, c // groups, m, *kernel)
    if rank == 3:  # [G, M/G, kd, C/G, kh, kw], the taps of axes 2, 4 and 5 reversed
        perm, flipped = (0, 2, 3, 1, 4, 5), (2, 4, 5)
        out = (groups * m, kernel[0] * (c // groups), *kernel[1:])
    else:  # [G, M/G, C/G, kh, kw]
        perm, flipped = (0, 2, 1, 3, 4), (3, 4)
        out = (groups * m, c // groups, *kernel)
    known = ctx.array(1, "W") if ctx.current.inputs[1] in ctx.initializers else ctx.known(w)
    if known is not None:
        moved = np.flip(known.reshape(grouped).transpose(perm), flipped)
        return ctx.constant(np.ascontiguousarray(moved.reshape(out)))
    moved = ctx.op("transpose", reshape(ctx, w, grouped), perm=perm)
    shape = moved.type.shape
    # slice.indices' form of ::-1 on the reversed axes
    start = tuple(n - 1 if a in flipped else 0 for a, n in enumerate(shape))
    stop = tuple(-1 if a in flipped else n for a, n in enumerate(shape))
    step = tuple(-1 if a in flipped else 1 for a in range(len(shape)))
    return reshape(ctx, ctx.op("slice", moved, start=start, stop=stop, step=step), out)


# --- TopK -------------------------------------------------------------------------------------


def _topk(ctx: Context) -> Sequence[Value]:
    """The k largest (or smallest) elements along an axis and their int64 indices, in order,
    ties to the smaller index as ONNX orders them (sorted=0 allows any order: this one too):
    k rounds of argmax (argmin), each over the elements not yet picked, then one gather of
    the values. Each round reads the axis twice: for a k of a few, not a sort."""
    x = ctx.input(0)
    axis = normalized_axis(int(ctx.attr("axis", -1)), len(x.type.shape))
    n, k = x.type.shape[axis], int(np.asarray(ctx.array(1, "K")).reshape(-1)[0])
    if not 1 <= k <= n:
        raise Unsupported(f"TopK of k {k} along an axis of {n}")
    dtype = numpy_dtype(x.type.dtype)
    if dtype.kind not in "fiu":
        raise Unsupported(f"TopK of {x.type.dtype} (numeric tensors only)")
    picks = _topk_picks(ctx, x, axis, k, "argmax" if ctx.attr("largest", 1) else "argmin")
    indices = picks[0] if k == 1 else ctx.op("concat", *picks, axis=axis)
    return [ctx.op("gather_elements", x, indices, axis=axis), indices]


def _topk_picks(ctx: Context, x: Value, axis: int, k: int, kind: str) -> list[Value]:
    """Each round's index (the axis kept, extent 1). A picked element is masked with its
    dtype's lowest value (highest, for argmin); where every element left has that value, the
    round's argmax may land on a masked one, so a round that picks a taken element takes the
    first one not taken instead (the smallest `order`: the position, plus n once taken)."""
    n = x.type.shape[axis]
    along = [n if i == axis else 1 for i in range(len(x.type.shape))]
    iota = ctx.constant(np.arange(n, dtype=np.int64).reshape(along))
    taken_at = ctx.constant(np.arange(n, 2 * n, dtype=np.int64).reshape(along))
    limit = ctx.constant(np.asarray(n, np.int64))
    dtype = numpy_dtype(x.type.dtype)
    ints = np.iinfo(dtype) if dtype.kind != "f" else None
    low, high = (-np.inf, np.inf) if ints is None else (ints.min, ints.max)
    mask = ctx.constant(np.asarray(low if kind == "argmax" else high, dtype))
    picks = [ctx.op(kind, x, axis=axis, keepdims=True, last=False)]
    order = iota
    for _ in range(1, k):
        order = ctx.op("where", ctx.op("equal", iota, picks[-1]), taken_at, order)
        free = ctx.op("less", order, limit)
        best = ctx.op(kind, ctx.op("where", free, x, mask), axis=axis, keepdims=True, last=False)
        first_free = ctx.op("argmin", order, axis=axis, keepdims=True, last=False)
        still_free = ctx.op("gather_elements", free, best, axis=axis)
        picks.append(ctx.op("where", still_free, best, first_free))
    return picks


COMPOSED_SPECS: dict[str, Spec] = {
    "Einsum": Spec(_einsum, {"equation": None}),
    "LRN": Spec(_lrn, {"size": None, "alpha": None, "beta": None, "bias": None}),
    "ConvTranspose": Spec(
        _conv_transpose,
        {
            "kernel_shape": None,
            "strides": None,
            "pads": None,
            "dilations": None,
            "group": None,
            "output_padding": None,
            "output_shape": None,
            "auto_pad": ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"),
        },
    ),
    "TopK": Spec(_topk, {"axis": None, "largest": None, "sorted": None}, outputs=2),
}
