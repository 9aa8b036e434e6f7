"""Converters of ONNX's training losses and a few small ops, as compositions of Hexir's own:
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (a gather of each target's score along
the class axis, weighted, masked where the target is `ignore_index`, then summed or averaged
by the weights), Hardmax and OneHot (comparisons against the class indices), LpNormalization
and SpaceToDepth.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, normalized_axis
from hexir.frontend.onnx_ops import Spec, broadcast_to, cast, reshape
from hexir.ir.graph import Value

REDUCTIONS = ("none", "sum", "mean")

# --- losses -----------------------------------------------------------------------------------


def nll_loss(
    ctx: Context,
    scores: Value,
    target: Value,
    weight: Value | None,
    ignore: int | None,
    reduction: str,
) -> Value:
    """ONNX's NegativeLogLikelihoodLoss of `scores` [N, C, d...] (log-probabilities) at the
    class indices `target` [N, d...]: -scores[n, target[n, d], d] times the target's weight,
    0 where the target is `ignore`; `reduction` none, sum, or mean (the sum over the sum of
    the weights taken)."""
    dtype = scores.type.dtype
    if target.type.dtype not in ("int32", "int64"):
        raise Unsupported(f"the target must be int32 or int64, got {target.type.dtype}")
    kept = None
    if ignore is not None:  # an ignored target reads class 0, then counts for nothing
        kept = ctx.op("not_equal", target, ctx.scalar(ignore, target))
        target = ctx.op("where", kept, target, ctx.scalar(0, target))
    shape = target.type.shape
    picked = ctx.op(
        "gather_elements", scores, reshape(ctx, target, (shape[0], 1, *shape[1:])), axis=1
    )
    picked = reshape(ctx, picked, shape)
    weights = ctx.op("gather", weight, target, axis=0) if weight is not None else None
    if kept is not None:
        mask = cast(ctx, kept, dtype)
        weights = mask if weights is None else ctx.op("mul", weights, mask)
    loss = picked if weights is None else ctx.op("mul", picked, weights)
    loss = ctx.op("sub", ctx.scalar(0, loss), loss)
    if reduction == "none":
        return loss
    everything = tuple(range(len(shape)))
    total = ctx.op("reduce_sum", loss, axes=everything, keepdims=False)
    if reduction == "sum":
        return total
    if weights is None:
        return ctx.op("div", total, ctx.constant(np.asarray(np.prod(shape), scores.type.dtype)))
    weights = broadcast_to(ctx, weights, shape)
    return ctx.op("div", total, ctx.op("reduce_sum", weights, axes=everything, keepdims=False))


def _loss_attrs(ctx: Context) -> tuple[int | None, str]:
    ignore = ctx.attr("ignore_index")
    return (None if ignore is None else int(ignore)), str(ctx.attr("reduction", "mean"))


def _nll(ctx: Context) -> Sequence[Value]:
    ignore, reduction = _loss_attrs(ctx)
    return [nll_loss(ctx, ctx.input(0), ctx.input(1), ctx.optional(2), ignore, reduction)]


def _softmax_cross_entropy(ctx: Context) -> Sequence[Value]:
    """The loss of log_softmax over the classes (axis 1), and those log-probabilities as the
    second output where the node asks for it."""
    ignore, reduction = _loss_attrs(ctx)
    log_prob = ctx.op("log_softmax", ctx.input(0), axis=1)
    loss = nll_loss(ctx, log_prob, ctx.input(1), ctx.optional(2), ignore, reduction)
    return [loss, log_prob][: max(1, len(ctx.current.outputs))]


# --- small ops --------------------------------------------------------------------------------


def _classes(ctx: Context, n: int, axis: int, ndim: int) -> Value:
    """0 .. n-1 (int64) along `axis` of a rank-`ndim` shape, every other extent 1."""
    shape = [1] * ndim
    shape[axis] = n
    return ctx.constant(np.arange(n, dtype=np.int64).reshape(shape))


def _hardmax(ctx: Context) -> Sequence[Value]:
    """1 at the first largest element along the axis, 0 elsewhere."""
    x = ctx.input(0)
    ndim = len(x.type.shape)
    axis = normalized_axis(int(ctx.attr("axis", -1)), ndim)
    top = ctx.op("argmax", x, axis=axis, keepdims=True, last=False)
    hit = ctx.op("equal", top, _classes(ctx, x.type.shape[axis], axis, ndim))
    return [broadcast_to(ctx, cast(ctx, hit, x.type.dtype), x.type.shape)]


def _one_hot(ctx: Context) -> Sequence[Value]:
    """values[1] where the class index along the new axis is the (wrapped) index, values[0]
    elsewhere; indices outside [-depth, depth) match no class."""
    indices, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.array(1, "depth")).reshape(-1)[0])
    if depth < 1:
        raise Unsupported(f"OneHot depth {depth}: must be at least 1")
    ndim = len(indices.type.shape) + 1
    axis = normalized_axis(int(ctx.attr("axis", -1)), ndim)
    index = cast(ctx, indices, "int64") if indices.type.dtype != "int64" else indices
    if index.type.dtype != "int64":
        raise Unsupported(f"OneHot indices of type {indices.type.dtype}")
    negative = ctx.op("less", index, ctx.scalar(0, index))
    index = ctx.op("where", negative, ctx.op("add", index, ctx.scalar(depth, index)), index)
    shape = list(indices.type.shape)
    shape.insert(axis, 1)
    hit = ctx.op("equal", reshape(ctx, index, shape), _classes(ctx, depth, axis, ndim))
    off, on = (ctx.op("slice", values, start=(i,), stop=(i + 1,), step=(1,)) for i in (0, 1))
    out = ctx.op("where", hit, reshape(ctx, on, ()), reshape(ctx, off, ()))
    full = list(indices.type.shape)
    full.insert(axis, depth)
    return [broadcast_to(ctx, out, full)]


def _lp_normalization(ctx: Context) -> Sequence[Value]:
    """x over its L1 or L2 norm along the axis (0 where the norm is 0)."""
    x = ctx.input(0)
    axis = normalized_axis(int(ctx.attr("axis", -1)), len(x.type.shape))
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"LpNormalization p={p}: ONNX allows 1 and 2")
    zero = ctx.scalar(0, x)
    size = ctx.op("maximum", x, ctx.op("sub", zero, x)) if p == 1 else ctx.op("mul", x, x)
    norm = ctx.op("reduce_sum", size, axes=(axis,), keepdims=True)
    norm = norm if p == 1 else ctx.op("sqrt", norm)
    # A zero norm is a zero vector: ONNX gives 0 there (x / 1), not NaN.
    safe = ctx.op("where", ctx.op("equal", norm, zero), ctx.scalar(1, norm), norm)
    return [ctx.op("div", x, safe)]


def _space_to_depth(ctx: Context) -> Sequence[Value]:
    """[N, C, H, W] -> [N, C·b·b, H/b, W/b]: each b x b block's pixels become channels, the
    block's row and column outermost (mode DCR, the default) or innermost (CRD, as of opset
    28): ONNX's reshape, transpose, reshape."""
    x = ctx.input(0)
    b = int(ctx.attr("blocksize"))
    if len(x.type.shape) != 4 or b < 1 or x.type.shape[2] % b or x.type.shape[3] % b:
        raise Unsupported(f"SpaceToDepth of {x.type!r} in blocks of {b}")
    n, c, h, w = x.type.shape
    blocks = reshape(ctx, x, (n, c, h // b, b, w // b, b))
    perm = (0, 1, 3, 5, 2, 4) if str(ctx.attr("mode", "DCR")) == "CRD" else (0, 3, 5, 1, 2, 4)
    moved = ctx.op("transpose", blocks, perm=perm)
    return [reshape(ctx, moved, (n, c * b * b, h // b, w // b))]


_LOSS = {"ignore_index": None, "reduction": REDUCTIONS}
LOSS_SPECS: dict[str, Spec] = {
    "NegativeLogLikelihoodLoss": Spec(_nll, _LOSS),
    "SoftmaxCrossEntropyLoss": Spec(_softmax_cross_entropy, _LOSS, outputs=None),
    "Hardmax": Spec(_hardmax, {"axis": None}),
    "SpaceToDepth": Spec(_space_to_depth, {"blocksize": None, "mode": ("DCR", "CRD")}),
    "OneHot": Spec(_one_hot, {"axis": None}),
    "LpNormalization": Spec(_lp_normalization, {"axis": None, "p": None}),
}
