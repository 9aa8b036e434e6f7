"""Lowering of the contraction and window ops: matmul, batch_matmul, dense, conv2d and pools.

Padded windows read through `guarded_load`: a select on the in-bounds condition around a load
at clamped indices, so nothing is read out of bounds however the select is evaluated.
"""

from __future__ import annotations

from hexir.graph.compute import (
    Kernel,
    affine,
    attr_int,
    attr_ints,
    floordiv,
    guarded_load,
    limit,
    lowest,
    mean,
)
from hexir.ir.graph import Op
from hexir.ir.tir import Binary, Buffer, Expr, Select, const


def lower_matmul(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    k.reduce("matmul", out, a.shape[-1:], lambda s, r: a[s[0], r[0]] * b[r[0], s[1]])


def lower_batch_matmul(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    k.reduce(
        "batch_matmul",
        out,
        a.shape[-1:],
        lambda s, r: a[s[0], s[1], r[0]] * b[s[0], r[0], s[2]],
    )


def lower_dense(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, w = args
    k.reduce("dense", out, x.shape[-1:], lambda s, r: x[s[0], r[0]] * w[s[1], r[0]])


def lower_conv2d(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, w = args
    (sh, sw), (ph, pw) = attr_ints(op, "stride"), attr_ints(op, "padding")
    (dh, dw), groups = attr_ints(op, "dilation"), attr_int(op, "groups")
    k_per_group, c_per_group = out.shape[1] // groups, w.shape[1]

    def value(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        n, kk, oh, ow = s
        c, rh, rw = r
        channel = c if groups == 1 else affine([(floordiv(kk, k_per_group), c_per_group), (c, 1)])
        h = affine([(oh, sh), (rh, dh)], -ph)
        wi = affine([(ow, sw), (rw, dw)], -pw)
        cond, load = guarded_load(k, x, (n, channel, h, wi))
        pixel = load if cond is None else Select(cond, load, const(0, x.dtype))
        return pixel * w[kk, c, rh, rw]

    k.reduce("conv2d", out, w.shape[1:], value)


def _window(k: Kernel, op: Op, x: Buffer, s: tuple[Expr, ...], r: tuple[Expr, ...]):
    """(cond or None, load) of the pool window element r at output position s."""
    (sh, sw), (ph, pw) = attr_ints(op, "stride"), attr_ints(op, "padding")
    n, c, oh, ow = s
    h = affine([(oh, sh), (r[0], 1)], -ph)
    w = affine([(ow, sw), (r[1], 1)], -pw)
    return guarded_load(k, x, (n, c, h, w))


def lower_max_pool2d(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    low = lowest(x.dtype)

    def value(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        cond, load = _window(k, op, x, s, r)
        return load if cond is None else Select(cond, load, low)

    k.reduce("max_pool2d", out, attr_ints(op, "kernel"), value, combine="max", init=low)


def lower_avg_pool2d(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    kh, kw = attr_ints(op, "kernel")

    def term(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        cond, load = _window(k, op, x, s, r)
        return load if cond is None else Select(cond, load, const(0, x.dtype))

    padded = any(attr_ints(op, "padding"))
    count = (lambda s: _in_bounds_count(k, op, x, s)) if padded else kh * kw
    mean(k, "avg_pool2d", out, (kh, kw), term, count)


def _in_bounds_count(k: Kernel, op: Op, x: Buffer, s: tuple[Expr, ...]) -> Expr:
    """How many elements of the window at output position s lie inside the input
    (count_include_pad=False), as an expression of the output position."""
    extents = []
    for pos, stride, pad, size, extent in zip(
        s[2:],
        attr_ints(op, "stride"),
        attr_ints(op, "padding"),
        attr_ints(op, "kernel"),
        x.shape[2:],
        strict=True,
    ):
        start = limit(k, affine([(pos, stride)], -pad), 0, extent)
        end = limit(k, affine([(pos, stride)], size - pad), 0, extent)
        extents.append(Binary("-", end, start))
    return Binary("*", extents[0], extents[1])


def lower_global_avg_pool2d(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    h, w = x.shape[2:]
    term = lambda s, r: x[s[0], s[1], r[0], r[1]]  # noqa: E731
    mean(k, "global_avg_pool2d", out, (h, w), term, h * w)
