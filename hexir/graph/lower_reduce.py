"""Lowering of reductions and the multi-stage normalizations: reduce_sum/mean/max, softmax
(max, exp, sum, norm) and layer_norm (mean, var, norm)."""

from __future__ import annotations

import math
from typing import TypeVar

from hexir.graph.compute import Kernel, attr_float, attr_int, attr_ints, lowest, mean
from hexir.ir.graph import Op
from hexir.ir.tir import Buffer, Call, Expr, const

Indices = tuple[Expr, ...]
T = TypeVar("T")


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


def lower_reduce(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    axes = attr_ints(op, "axes")
    keepdims = op.attr("keepdims") is True
    extents = tuple(x.shape[a] for a in axes)

    def load(s: Indices, r: Indices) -> Expr:
        return x[_reduced_index(len(x.shape), axes, keepdims, s, r)]

    match op.kind:
        case "reduce_sum":
            k.reduce("reduce_sum", out, extents, load)
        case "reduce_max":
            low = lowest(x.dtype)
            k.reduce("reduce_max", out, extents, load, combine="max", init=low)
        case "reduce_mean":
            mean(k, "reduce_mean", out, extents, load, math.prod(extents))


def _drop(i: tuple[T, ...], axis: int) -> tuple[T, ...]:
    return i[:axis] + i[axis + 1 :]


def _insert(s: Indices, axis: int, r: Indices) -> Indices:
    return s[:axis] + r + s[axis:]


def lower_softmax(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """max, exp(x - max), sum, divide: the numerically stable form."""
    (x,) = args
    axis = attr_int(op, "axis")
    n, rest, dt = x.shape[axis], _drop(x.shape, axis), x.dtype
    mx = k.alloc("softmax_max", rest, dt)
    k.reduce("softmax_max", mx, (n,), lambda s, r: x[_insert(s, axis, r)], "max", lowest(dt))
    e = k.alloc("softmax_exp", x.shape, dt)
    k.compute("softmax_exp", e, lambda i: Call("exp", (x[i] - mx[_drop(i, axis)],)))
    total = k.alloc("softmax_sum", rest, dt)
    k.reduce("softmax_sum", total, (n,), lambda s, r: e[_insert(s, axis, r)])
    k.compute("softmax_norm", out, lambda i: e[i] / total[_drop(i, axis)])


def lower_layer_norm(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
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
