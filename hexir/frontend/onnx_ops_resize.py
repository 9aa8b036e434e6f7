"""Converter of ONNX Resize with constant scales or sizes, one resized axis at a time (every
mode is separable): "nearest" as a gather of each output position's source index; "linear" and
"cubic" as a weighted sum of gathers, one per tap of the interpolation kernel, the taps' source
indices and weights computed here with numpy from the spec's coordinate transformation.

    x [1, 3, 4, 4] --Resize(linear, scales [1, 1, 2, 2])--> [1, 3, 8, 8]
    along axis 2: gather(x, [0 0 0 1 1 2 2 3] , 2) * w0 + gather(x, [0 1 1 2 2 3 3 3], 2) * w1
    then the same along axis 3

A source coordinate x between f and f + 1 (f = ceil(x) - 1, so an integer x is f + 1 with
weight 1) reads the taps f + 1 - n/2 ... f + n/2, clamped into the axis (ONNX's edge padding):
n = 2 for linear, 4 for cubic, more where antialias widens the kernel to 1/scale when
downsampling. tf_crop_and_resize writes extrapolation_value where x falls outside the input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, int_list, normalized_axis
from hexir.frontend.onnx_ops import Spec
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Value

_COORDINATES = ("half_pixel", "half_pixel_symmetric", "asymmetric", "align_corners",
                "pytorch_half_pixel", "tf_half_pixel_for_nn", "tf_crop_and_resize")  # fmt: skip
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_SUPPORT = {"linear": 1, "cubic": 2}  # the kernel's half width, in input elements


@dataclass(frozen=True, slots=True)
class _Axis:
    """One resized axis: its extents, its scale (output over input) and, for
    tf_crop_and_resize, its region of interest (start and end, fractions of the axis)."""

    axis: int
    n_in: int
    n_out: int
    scale: float
    roi: tuple[float, float] = (0.0, 1.0)


def _resize(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    mode = str(ctx.attr("mode", "nearest"))
    if mode != "nearest" and not x.type.dtype.startswith("float"):
        raise Unsupported(f"Resize {mode} of {x.type.dtype} (float tensors only)")
    if mode == "nearest" and ctx.attr("antialias", 0):
        raise Unsupported("Resize nearest with antialias (ONNX defines none)")
    coordinates = str(ctx.attr("coordinate_transformation_mode", "half_pixel"))
    for ax in _resized_axes(ctx, x.type.shape, coordinates == "tf_crop_and_resize"):
        source = _source(ax, coordinates)
        if mode == "nearest":
            index = _nearest(source, ax.n_in, str(ctx.attr("nearest_mode", "round_prefer_floor")))
            y = ctx.op("gather", x, ctx.constant(index.astype(np.int64)), axis=ax.axis)
        else:
            y = _interpolate(ctx, x, ax, source, mode)
        if coordinates == "tf_crop_and_resize":
            y = _extrapolate(ctx, y, ax, source)
        x = y
    return [x]


def _resized_axes(ctx: Context, shape: tuple[int, ...], crop: bool) -> list[_Axis]:
    """The axes whose extent or coordinates change, from the scales or sizes (and the roi)."""
    given = int_list(ctx.attr("axes", list(range(len(shape)))))
    axes = [normalized_axis(a, len(shape)) for a in given]
    if any(shape[a] == 0 for a in axes):
        raise Unsupported(f"Resize of an empty axis in {shape}")
    out, factors = _extents(ctx, [shape[a] for a in axes])
    if len(factors) != len(axes) or any(o < 1 for o in out):
        raise Unsupported(f"Resize to {out} along axes {axes}")
    rois = _rois(ctx, len(axes)) if crop else [(0.0, 1.0)] * len(axes)
    resized = [
        _Axis(a, shape[a], o, f, r) for a, o, f, r in zip(axes, out, factors, rois, strict=True)
    ]
    return [ax for ax in resized if not _identity(ax)]


def _extents(ctx: Context, n_in: list[int]) -> tuple[list[int], list[float]]:
    """(output extents, scales) of the resized axes, from constant sizes or scales."""
    sizes = ctx.optional_array(3, "sizes")
    scales = None if ctx.has(3) else ctx.optional_array(2, "scales")
    if sizes is None and (scales is None or scales.size == 0):
        raise Unsupported("Resize without constant scales or sizes")
    if sizes is None:
        factors = [float(v) for v in np.asarray(scales).reshape(-1)]
        if not all(math.isfinite(f) and f > 0 for f in factors):
            raise Unsupported(f"Resize by scales {factors}")
        return [int(n * f) for n, f in zip(n_in, factors, strict=True)], factors
    out = int_list(sizes)
    factors = [o / n for n, o in zip(n_in, out, strict=True)]
    policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
    if policy == "stretch":
        return out, factors
    one = min(factors) if policy == "not_larger" else max(factors)  # one scale for all axes
    return [int(one * n + 0.5) for n in n_in], [one] * len(n_in)  # rounded half up


def _rois(ctx: Context, count: int) -> list[tuple[float, float]]:
    roi = list(np.asarray(ctx.array(1, "roi")).reshape(-1))
    if len(roi) != 2 * count:
        raise Unsupported(f"roi {roi} for {count} resized axes")
    return list(zip(roi[:count], roi[count:], strict=True))


def _identity(ax: _Axis) -> bool:
    return ax.n_out == ax.n_in and math.isclose(ax.scale, 1.0) and ax.roi == (0.0, 1.0)


def _source(ax: _Axis, mode: str) -> np.ndarray:
    """The input coordinate of each output position (ONNX's coordinate transformation; the
    output's length is the unrounded n_in * scale where the spec says length_resized)."""
    i = np.arange(ax.n_out, dtype=np.float64)
    scale, n_in, length = ax.scale, ax.n_in, ax.scale * ax.n_in
    match mode:
        case "asymmetric":
            return i / scale
        case "align_corners":
            return np.zeros_like(i) if length == 1 else i * (n_in - 1) / (length - 1)
        case "pytorch_half_pixel":
            return np.full_like(i, -0.5) if length == 1 else (i + 0.5) / scale - 0.5
        case "half_pixel_symmetric":  # the output's centre on the input's centre
            offset = n_in / 2 * (1 - ax.n_out / length)
            return offset + (i + 0.5) / scale - 0.5
        case "tf_half_pixel_for_nn":
            return (i + 0.5) / scale
        case "tf_crop_and_resize":  # the roi's float32 arithmetic as the reference does it
            start, end = ax.roi
            if length == 1:
                return np.full_like(i, (end - start) * (n_in - 1) / 2) + start * (n_in - 1)
            return i * (end - start) * (n_in - 1) / (length - 1) + start * (n_in - 1)
        case _:  # half_pixel
            return (i + 0.5) / scale - 0.5


def _nearest(source: np.ndarray, n_in: int, rounding: str) -> np.ndarray:
    if rounding == "floor":
        j = np.floor(source)
    elif rounding == "ceil":
        j = np.ceil(source)
    else:  # round half to the floor (or the ceil), the rest to the nearest
        half = source - np.floor(source) == 0.5
        up = np.ceil(source) if rounding == "round_prefer_ceil" else np.floor(source)
        j = np.where(half, up, np.round(source))
    return np.clip(j, 0, n_in - 1)


def _interpolate(ctx: Context, x: Value, ax: _Axis, source: np.ndarray, mode: str) -> Value:
    """Σ over the taps of gather(x, tap's indices) · tap's weights, along ax.axis."""
    indices, weights = _taps(ctx, ax, source, mode)
    shape = [1] * len(x.type.shape)
    shape[ax.axis] = ax.n_out
    dtype = numpy_dtype(x.type.dtype)
    total: Value | None = None
    for index, weight in zip(indices.T, weights.T, strict=True):
        if not weight.any():
            continue
        taken = ctx.op("gather", x, ctx.constant(index), axis=ax.axis)
        term = ctx.op("mul", taken, ctx.constant(weight.astype(dtype).reshape(shape)))
        total = term if total is None else ctx.op("add", total, term)
    if total is None:  # exclude_outside with every tap outside the input
        raise Unsupported(f"Resize whose weights along axis {ax.axis} are all zero")
    return total


def _taps(ctx: Context, ax: _Axis, source: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each [n_out, taps]: the input elements each output position reads
    and their weights."""
    antialias = bool(ctx.attr("antialias", 0))
    shrink = min(ax.scale, 1.0) if antialias else 1.0  # antialias widens the kernel
    half = math.ceil(_SUPPORT[mode] / shrink)
    floor = np.ceil(source) - 1  # an integer coordinate is the right end of its interval
    offsets = np.arange(1 - half, half + 1)
    distance = (source - floor)[:, None] - offsets[None, :]
    if mode == "linear":
        weights = np.clip(1 - np.abs(distance * shrink), 0, 1)
    else:
        weights = _cubic(np.abs(distance * shrink), float(ctx.attr("cubic_coeff_a", -0.75)))
    positions = floor.astype(np.int64)[:, None] + offsets[None, :]
    if ctx.attr("exclude_outside", 0):
        weights = np.where((positions < 0) | (positions >= ax.n_in), 0.0, weights)
    if antialias or ctx.attr("exclude_outside", 0):
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(positions, 0, ax.n_in - 1), weights


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient a, at distances d >= 0."""
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _extrapolate(ctx: Context, y: Value, ax: _Axis, source: np.ndarray) -> Value:
    """extrapolation_value where the source coordinate falls outside the input."""
    outside = (source < 0) | (source > ax.n_in - 1)
    if not outside.any():
        return y
    shape = [1] * len(y.type.shape)
    shape[ax.axis] = ax.n_out
    fill = ctx.scalar(float(ctx.float_attr("extrapolation_value", 0.0)), y)
    return ctx.op("where", ctx.constant(outside.reshape(shape)), fill, y)


RESIZE_SPECS: dict[str, Spec] = {
    "Resize": Spec(
        _resize,
        {
            "mode": ("nearest", "linear", "cubic"),
            "axes": None,
            "coordinate_transformation_mode": _COORDINATES,
            "nearest_mode": _NEAREST,
            "antialias": None,
            "exclude_outside": None,
            "keep_aspect_ratio_policy": ("stretch", "not_larger", "not_smaller"),
            "cubic_coeff_a": None,
            "extrapolation_value": None,
        },
    ),
}
