"""Lowering of the data-movement ops: transpose, reshape, concat, slice, pad."""

from __future__ import annotations

import math

from hexir.graph.compute import (
    Kernel,
    add,
    affine,
    attr_float,
    attr_int,
    attr_ints,
    clamp,
    floordiv,
    guarded_load,
)
from hexir.ir.graph import Op
from hexir.ir.tir import Binary, Buffer, Expr, IntImm, Select, const

Indices = tuple[Expr, ...]


def lower_transpose(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    perm = attr_ints(op, "perm")

    def load(i: Indices) -> Expr:
        index: list[Expr] = [IntImm(0)] * len(perm)
        for d, p in enumerate(perm):
            index[p] = i[d]  # out.shape[d] == x.shape[perm[d]]
        return x[tuple(index)]

    k.compute("transpose", out, load)


def lower_reshape(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args

    def load(i: Indices) -> Expr:
        index: list[Expr] = []
        for outs, ins in _reshape_groups(out.shape, x.shape):
            strides = [math.prod(out.shape[d + 1 : outs[-1] + 1]) for d in outs]
            flat = affine(
                (i[d], st) for d, st in zip(outs, strides, strict=True) if out.shape[d] != 1
            )
            index.extend(_unflatten(k, flat, [x.shape[d] for d in ins]))
        return x[tuple(index)]

    k.compute("reshape", out, load)


def _reshape_groups(out_shape: tuple[int, ...], in_shape: tuple[int, ...]):
    """Pairs (output axes, input axes) of the smallest runs with equal element counts, so that
    a reshape that merges or splits some axes indexes the others directly."""
    groups, o, i = [], 0, 0
    while o < len(out_shape) or i < len(in_shape):
        outs, ins = [o], [i]
        po = out_shape[o] if o < len(out_shape) else 1
        pi = in_shape[i] if i < len(in_shape) else 1
        while po != pi:
            if po < pi:
                o += 1
                outs.append(o)
                po *= out_shape[o]
            else:
                i += 1
                ins.append(i)
                pi *= in_shape[i]
        o, i = o + 1, i + 1
        groups.append(
            ([d for d in outs if d < len(out_shape)], [d for d in ins if d < len(in_shape)])
        )
    return groups


def _unflatten(k: Kernel, flat: Expr, shape: list[int]) -> list[Expr]:
    index: list[Expr] = []
    for d, extent in enumerate(shape):
        if extent == 1:
            index.append(IntImm(0))
            continue
        part = floordiv(flat, math.prod(shape[d + 1 :]))
        hi = (k.bound(part) or (0, extent))[1]
        index.append(part if hi < extent else Binary("floormod", part, IntImm(extent)))
    return index


def lower_concat(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """A select chain over the axis: `i < end0 ? x0[i] : i < end1 ? x1[i - end0] : ...`."""
    axis = attr_int(op, "axis")
    starts = [sum(x.shape[axis] for x in args[:n]) for n in range(len(args))]

    def load(i: Indices) -> Expr:
        def part(n: int) -> Expr:
            index = i[:axis] + (add(i[axis], -starts[n]),) + i[axis + 1 :]
            x = args[n]
            return x[tuple(clamp(k, e, x.shape[d]) for d, e in enumerate(index))]

        value = part(len(args) - 1)
        for n in reversed(range(len(args) - 1)):
            end = IntImm(starts[n] + args[n].shape[axis])
            value = Select(Binary("<", i[axis], end), part(n), value)
        return value

    k.compute("concat", out, load)


def lower_slice(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    start, step = attr_ints(op, "start"), attr_ints(op, "step")

    def load(i: Indices) -> Expr:
        # An axis that keeps one element needs no var: it reads `start` whatever the step.
        return x[
            tuple(
                IntImm(b) if n == 1 else affine([(v, s)], b)
                for v, b, s, n in zip(i, start, step, out.shape, strict=True)
            )
        ]

    k.compute("slice", out, load)


def lower_pad(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    before = attr_ints(op, "before")
    fill = const(attr_float(op, "value"), x.dtype)

    def load(i: Indices) -> Expr:
        cond, value = guarded_load(k, x, [add(v, -b) for v, b in zip(i, before, strict=True)])
        return value if cond is None else Select(cond, value, fill)

    k.compute("pad", out, load)
