"""Numpy helpers of the ops' semantics: precision, C integer division, erf, windows.

The precision of each op's `evaluate` is chosen to be the best answer a kernel of the result
dtype can be compared with:

- one IEEE operation per element (add, sub, mul, div, maximum, minimum, relu, bias_add, pad,
  comparisons, data movement) runs in the operand dtype, so it rounds exactly as a kernel does;
- everything else (transcendentals, power, contractions, reductions, normalizations, pools)
  runs in float64 (`f64`, `wide`) and is rounded to the result dtype once;
- integers run in int64 (`wide`) and wrap to the result dtype as two's-complement C arithmetic
  does; integer division and integer means truncate toward zero, as C does (`trunc_div`).

The attribute readers raise `TypeError` for a malformed attribute; the evaluator reports it as
a `HexirError` naming the op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from hexir.ir.dtype import numpy_is_float
from hexir.ir.tir import AnnotationValue

Attrs = dict[str, AnnotationValue]
Evaluate = Callable[[list[np.ndarray], Attrs], np.ndarray]

# ---------------------------------------------------------------------------------------------
# Precision helpers


def wide(x: np.ndarray) -> np.ndarray:
    """float64 for floats, int64 for ints, bool unchanged: where sums and products happen."""
    if numpy_is_float(x.dtype):
        return x.astype(np.float64, copy=False)
    if x.dtype.kind in "iu":
        return x.astype(np.int64, copy=False)
    return x


def f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64, copy=False)


def trunc_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """C's integer division: the quotient truncated toward zero (numpy's // floors)."""
    q = np.floor_divide(a, b)
    inexact = np.remainder(a, b) != 0
    return np.where(inexact & ((np.asarray(a) < 0) != (np.asarray(b) < 0)), q + 1, q)


def mean_of(total: np.ndarray, count: np.ndarray | int) -> np.ndarray:
    if total.dtype.kind in "iub":
        return trunc_div(total.astype(np.int64), count)
    return total / count


def get_int(attrs: Attrs, key: str) -> int:
    value = attrs[key]
    if not isinstance(value, int):
        raise TypeError(f"attribute {key} must be an int, got {value!r}")
    return value


def get_float(attrs: Attrs, key: str) -> float:
    value = attrs[key]
    if not isinstance(value, int | float):
        raise TypeError(f"attribute {key} must be a float, got {value!r}")
    return float(value)


def get_ints(attrs: Attrs, key: str) -> tuple[int, ...]:
    value = attrs[key]
    if not isinstance(value, tuple):
        raise TypeError(f"attribute {key} must be a tuple of ints, got {value!r}")
    return tuple(int(v) for v in value)


def lowest_value(dtype: np.dtype) -> float | int | bool:
    """The identity of max in numpy: -inf, the smallest integer, or False."""
    if numpy_is_float(dtype):
        return -np.inf
    if dtype.kind in "iu":
        return int(np.iinfo(dtype).min)
    return False


def highest_value(dtype: np.dtype) -> float | int | bool:
    """The identity of min in numpy: inf, the largest integer, or True."""
    if numpy_is_float(dtype):
        return np.inf
    if dtype.kind in "iu":
        return int(np.iinfo(dtype).max)
    return True


def on_axis(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along `axis` of an ndim-d tensor."""
    return v.reshape([-1 if d == axis else 1 for d in range(ndim)])


# ---------------------------------------------------------------------------------------------
# erf in float64: no scipy, and math.erf per element is far too slow for real tensors.
# Series for |x| < 2 and a continued fraction for erfc beyond: within a few ulp of math.erf
# over the whole line (tests/graph/test_evaluate.py checks it).

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SERIES_LIMIT = 2.0


def _exp_minus_square(x: np.ndarray) -> np.ndarray:
    # exp(-x*x) loses x*x*eps relative accuracy to the rounding of x*x; splitting x into a
    # 24-bit head (whose square is exact) and a tail keeps the tail of erfc accurate.
    head = x.astype(np.float32).astype(np.float64)
    return np.exp(-head * head) * np.exp(-(x - head) * (x + head))


def _erf_series(x: np.ndarray) -> np.ndarray:
    # erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2x^2)^n x / (1*3*...*(2n+1)): positive terms, no
    # cancellation; 40 terms reach float64 precision for |x| < 2.
    x2 = x * x
    term = x.copy()
    total = x.copy()
    for n in range(1, 40):
        term *= 2.0 * x2 / (2 * n + 1)
        total += term
    return _TWO_OVER_SQRT_PI * _exp_minus_square(x) * total


def _erfc_fraction(x: np.ndarray) -> np.ndarray:
    # erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), for x >= 2,
    # evaluated backward from a fixed depth (stable); beyond 30 it underflows to 0 anyway.
    x = np.minimum(x, 30.0)
    f = x.copy()
    for k in range(60, 0, -1):
        f = x + (0.5 * k) / f
    return _exp_minus_square(x) / (math.sqrt(math.pi) * f)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in float64 (within a few ulp of math.erf)."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.ravel()
    out = np.empty_like(flat)
    small = np.abs(flat) < _SERIES_LIMIT
    out[small] = _erf_series(flat[small])
    big = ~small
    out[big] = np.copysign(1.0 - _erfc_fraction(np.abs(flat[big])), flat[big])
    return out.reshape(x.shape)


def erfc(x: np.ndarray) -> np.ndarray:
    # 1 - erf(x): relative accuracy of a few ulp for x >= 2 and x <= 0, where gelu needs it;
    # between 0 and 2 it is 1 - erf(x), a few ulp of 1 (ample for any float32 result).
    x = np.asarray(x, dtype=np.float64)
    flat = x.ravel()
    out = np.empty_like(flat)
    small = np.abs(flat) < _SERIES_LIMIT
    out[small] = 1.0 - _erf_series(flat[small])
    big = ~small
    tail = _erfc_fraction(np.abs(flat[big]))
    out[big] = np.where(flat[big] > 0, tail, 2.0 - tail)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# Windows of NCHW images (convolution, pools)


def windows(
    x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> np.ndarray:
    """View of an (already padded) NCHW tensor as [N, C, OH, OW, R, S] windows; no copy."""
    n, c, h, w = x.shape
    (r, s), (sh, sw), (dh, dw) = kernel, stride, dilation
    oh = (h - dh * (r - 1) - 1) // sh + 1
    ow = (w - dw * (s - 1) - 1) // sw + 1
    s0, s1, s2, s3 = x.strides
    return np.lib.stride_tricks.as_strided(
        x,
        shape=(n, c, max(oh, 0), max(ow, 0), r, s),
        strides=(s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw),
        writeable=False,
    )


def block_axis(a: np.ndarray, axis: int, block: int) -> np.ndarray:
    """`a` with axis `axis` cut into blocks of `block`, the block index first and the place in
    a block last (the `weight_block` layouts: conv2d's KCRS [K, C, R, S] on axis 0 ->
    [K/b, C, R, S, b]; matmul's [K, N] on axis 1 -> [N/b, K, b])."""
    shape = a.shape
    split = a.reshape(*shape[:axis], shape[axis] // block, block, *shape[axis + 1 :])
    rest = [d for d in range(a.ndim + 1) if d not in (axis, axis + 1)]
    return np.ascontiguousarray(split.transpose(axis, *rest, axis + 1))


def unblock_perm(axis: int, ndim: int) -> list[int]:
    """The transpose that takes an array blocked on `axis` (`block_axis`, `ndim` axes before)
    back to its axes' order, each block's index beside its place in the block: a reshape then
    merges the two."""
    others = [d for d in range(ndim) if d != axis]
    perm: list[int] = []
    for d in range(ndim):
        perm += [0, ndim] if d == axis else [1 + others.index(d)]
    return perm


def unblock_axis(a: np.ndarray, axis: int) -> np.ndarray:
    """The array `block_axis(x, axis, b)` was made from."""
    moved = a.transpose(unblock_perm(axis, a.ndim - 1))
    shape = moved.shape
    return moved.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2 :])


def pad_hw(x: np.ndarray, padding: Sequence[int], value: float | int | bool) -> np.ndarray:
    ph, pw = padding
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


# ---------------------------------------------------------------------------------------------
# Semantics made from numpy functions


def in_dtype(fn: Callable[..., np.ndarray]) -> Evaluate:
    """`fn` of the operands as they are (one IEEE operation per element)."""
    return lambda xs, attrs: fn(*xs)


def in_f64(fn: Callable[..., np.ndarray]) -> Evaluate:
    """`fn` of the operands in float64, rounded to the result dtype once by the evaluator."""
    return lambda xs, attrs: fn(*(f64(x) for x in xs))
