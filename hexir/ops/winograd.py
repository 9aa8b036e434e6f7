"""Winograd convolution F(m x m, 3 x 3): the input and output transforms, as two ops.

A stride-1 3x3 convolution computes each m x m tile of its output from an (m+2) x (m+2)
tile of its input. Winograd's minimal filtering (Lavin and Gray, 2015) computes it as

    Y_tile = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d_tile B) ] A

summed over the input channels: the elementwise products of (m+2)^2 transformed values
instead of m^2 * 9 multiply-adds, so summed over channels it is (m+2)^2 matrix products
[tiles x C] · [C x K], one per position of the transformed tile. F(4, 3) does 36 products
per 16 outputs against 144 (4x fewer multiplications), F(2, 3) 16 per 4 against 36.

The CPU layout pass (hexir/graph/layout.py) rewrites a conv2d into

    x (NCHW) -> transpose to NHWC -> pad -> winograd_input  [a, a, N, TH, TW, C]
             -> reshape [a*a, N*TH*TW, C] -> batch_matmul by U [a*a, C, K] (the weight
                transformed at compile time, `winograd_weight`)
             -> reshape [a, a, N, TH, TW, K] -> winograd_output [N, TH, m, TW, m, K]
             -> reshape [N, TH*m, TW*m, K] -> transpose to NCHW (-> slice)

so the contraction is an ordinary batch_matmul, scheduled and tuned like any other. The two
transforms are written with their coefficients as constants: each value is a case split on
its position in the tile (a `select` on the position's index), each case the transform's
non-zero terms only, nested so that the inner sums are shared between cases. The default
schedule unrolls the position loops (hexir/runtime/default_schedule.py, `case_loops`), so
the C backend folds every case to straight-line code over one vector of channels, in which
GCC shares the inner sums.

The matrices come from the Cook-Toom construction on the points 0, 1, -1 (F(2, 3)) and
0, 1, -1, 2, -2 (F(4, 3)) and infinity, computed exactly in rationals. Numerics (float32,
fresh normal inputs, against a float64 direct convolution; tests/ops/test_winograd.py): the
largest error relative to the largest output is about 3e-7 for F(2, 3) and 5e-6 for F(4, 3)
(the points 2 and -2 scale the transform's rows by up to 8), within 1e-4 at every ResNet shape.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.tir import Binary, Buffer, Expr, IntImm, Select, Unary, const
from hexir.ops.base import Exporter, OpDef, Pattern, always_cheap
from hexir.ops.compute import Kernel, add, attr_int, mul
from hexir.ops.numeric import Attrs, get_int

Indices = tuple[Expr, ...]

# The output tile sizes m with a transform here: F(2, 3) and F(4, 3).
TILES = (2, 4)
_POINTS = {2: (0, 1, -1), 4: (0, 1, -1, 2, -2)}


@functools.cache
def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Aᵀ [m, m+2], G [m+2, 3] and Bᵀ [m+2, m+2] of F(m, 3), in float64 (exact rationals)."""
    points = [Fraction(p) for p in _POINTS[m]]
    a = m + 2
    at = [[p**i for p in points] + [Fraction(i == m - 1)] for i in range(m)]
    g = []
    for j, p in enumerate(points):
        denominator = Fraction(1)
        for q in points[:j] + points[j + 1 :]:
            denominator *= p - q
        g.append([p**i / denominator for i in range(3)])
    g.append([Fraction(0), Fraction(0), Fraction(1)])
    bt = [_poly([q for q in points if q != p], a) for p in points] + [_poly(points, a)]
    as_array = lambda rows: np.array([[float(v) for v in row] for row in rows])  # noqa: E731
    return as_array(at), as_array(g), as_array(bt)


def _poly(roots: list[Fraction], length: int) -> list[Fraction]:
    """The coefficients (constant first) of prod(x - r), padded with zeros to `length`."""
    coefficients = [Fraction(1)]
    for r in roots:
        shifted = [Fraction(0), *coefficients]
        for t in range(len(coefficients)):
            shifted[t] -= r * coefficients[t]
        coefficients = shifted
    return coefficients + [Fraction(0)] * (length - len(coefficients))


def winograd_weight(w: np.ndarray, m: int) -> np.ndarray:
    """A KCRS 3x3 weight transformed for F(m, 3): U[(m+2)^2, C, K] = G w Gᵀ per (k, c), the
    operand b of the batch_matmul between the two transforms (computed in float64)."""
    _, g, _ = matrices(m)
    k, c = w.shape[:2]
    u = np.einsum("ar,kcrs,bs->abck", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape((m + 2) ** 2, c, k)).astype(w.dtype)


def _tile(c: Check) -> int:
    m = c.integer("tile")
    if m not in TILES:
        fail(f"attribute 'tile' is {m}; the transforms exist for {', '.join(map(str, TILES))}")
    return m


def _combination(coefficients: np.ndarray, terms: list[Expr], dtype: str) -> Expr:
    """sum(coefficient * term) over the non-zero coefficients, ±1 as an add or subtract."""
    result: Expr | None = None
    for cf, term in zip(coefficients.tolist(), terms, strict=True):
        if cf == 0:
            continue
        if abs(cf) != 1:
            term = Binary("*", const(abs(cf), dtype), term)
        if result is None:
            result = term if cf > 0 else Unary("-", term)
        else:
            result = Binary("+" if cf > 0 else "-", result, term)
    assert result is not None, "a transform row of zeros"
    return result


def _cases(index: Expr, values: list[Expr]) -> Expr:
    """values[index] for an index in range(len(values)), as a chain of selects."""
    result = values[-1]
    for n in reversed(range(len(values) - 1)):
        result = Select(Binary("==", index, IntImm(n)), values[n], result)
    return result


# --- winograd_input ---------------------------------------------------------------------------


def _input_infer(c: Check) -> TensorType:
    (x,) = c.ranks(4)
    c.dtype_in("float", 0)
    m = _tile(c)
    n, hp, wp, ch = x.shape
    if hp < m + 2 or wp < m + 2 or (hp - 2) % m or (wp - 2) % m:
        fail(f"x is {dims(x)}: its rows and columns less 2 must be positive multiples of {m}")
    a = m + 2
    return TensorType((a, a, n, (hp - 2) // m, (wp - 2) // m, ch), x.dtype)


def _input_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, m = xs[0], get_int(attrs, "tile")
    _, _, bt = matrices(m)
    tiles = _tiles(x, m)  # [N, TH, TW, a, a, C]
    return np.einsum("xi,yj,npqijc->xynpqc", bt, bt, tiles).astype(x.dtype)


def _tiles(x: np.ndarray, m: int) -> np.ndarray:
    """The overlapping (m+2) x (m+2) tiles of an NHWC image, m apart: [N, TH, TW, a, a, C]."""
    windows = np.lib.stride_tricks.sliding_window_view(x, (m + 2, m + 2), axis=(1, 2))
    return windows[:, ::m, ::m].transpose(0, 1, 2, 4, 5, 3)


def _input_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    m = attr_int(op, "tile")
    _, _, bt = matrices(m)
    a = m + 2

    def value(s: Indices) -> Expr:
        u, v, n, ty, tx, c = s
        pixel = [[x[n, add(mul(ty, m), i), add(mul(tx, m), j), c] for j in range(a)]
                 for i in range(a)]  # fmt: skip
        return _sandwich(bt, pixel, u, v, x.dtype)

    k.compute("winograd_input", out, value)


def _sandwich(left: np.ndarray, tile: list[list[Expr]], row: Expr, col: Expr, dtype: str) -> Expr:
    """(left · tile · leftᵀ)[row, col] as a case split on row and col: each case the non-zero
    terms of its row and column of `left`, the column sums (tile · leftᵀ) written the same in
    every case of a row, so the C compiler computes each once."""
    size = len(tile)
    by_col = [[_combination(left[q], tile[t], dtype) for q in range(len(left))]
              for t in range(size)]  # fmt: skip
    per_row = [
        _cases(col, [_combination(left[p], [by_col[t][q] for t in range(size)], dtype)
                     for q in range(len(left))])
        for p in range(len(left))
    ]  # fmt: skip
    return _cases(row, per_row)


def _input_export(ex: Exporter, op: Op) -> None:
    """Gathers of the tiles' rows and columns, then Bᵀ applied on each side by a MatMul."""
    x, out, m = op.operands[0], op.result.name, attr_int(op, "tile")
    _, _, bt = matrices(m)
    _, _, _, th, tw, _ = op.result.type.shape
    rows = ex.node("Gather", [x.name, ex.const(_tile_index(th, m), f"{out}.rows")], axis=1)
    tiles = ex.node("Gather", [rows, ex.const(_tile_index(tw, m), f"{out}.cols")], axis=3)
    last = ex.node("Transpose", [tiles], perm=[0, 1, 3, 5, 2, 4])  # [N, TH, TW, C, i, j]
    _two_sided(ex, last, bt, out, perm=[5, 4, 0, 1, 2, 3])


def _two_sided(ex: Exporter, x: str, left: np.ndarray, out: str, perm: list[int]) -> None:
    """`out` = transpose(left · X · leftᵀ over x's last two axes, `perm`): a MatMul by leftᵀ,
    the two axes swapped, a MatMul by leftᵀ again (X · leftᵀ, then (X leftᵀ)ᵀ leftᵀ)."""
    by = ex.const(np.ascontiguousarray(left.T).astype(np.float32), f"{out}.transform")
    swap = list(range(6))
    swap[4], swap[5] = 5, 4
    once = ex.node("Transpose", [ex.node("MatMul", [x, by])], perm=swap)
    ex.node("Transpose", [ex.node("MatMul", [once, by])], out, perm=perm)


def _tile_index(count: int, m: int) -> np.ndarray:
    """[count, m+2]: the rows (or columns) of each of `count` tiles, m apart."""
    return (np.arange(count)[:, None] * m + np.arange(m + 2)[None, :]).astype(np.int64)


def _input_flops(op: Op) -> int:
    _, _, bt = matrices(attr_int(op, "tile"))
    per_tile = 2 * 2 * int(np.count_nonzero(bt)) * bt.shape[0]  # rows, then columns
    a, _, n, th, tw, c = op.result.type.shape
    return per_tile * n * th * tw * c


WINOGRAD_INPUT = OpDef(
    "winograd_input",
    "x[N,Hp,Wp,C] (NHWC, zero-padded) in tiles of m+2, m apart, each as Bᵀ d B",
    ("x",),
    ("tile",),
    infer=_input_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_input_evaluate,
    lower=_input_lower,
    export=_input_export,
    flops=_input_flops,
)


# --- winograd_output --------------------------------------------------------------------------


def _output_infer(c: Check) -> TensorType:
    (x,) = c.ranks(6)
    c.dtype_in("float", 0)
    m = _tile(c)
    a, a2, n, th, tw, k = x.shape
    if a != m + 2 or a2 != m + 2:
        fail(f"x is {dims(x)}: F({m}, 3) takes tiles of {m + 2} x {m + 2} in its first two axes")
    return TensorType((n, th, m, tw, m, k), x.dtype)


def _output_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, m = xs[0], get_int(attrs, "tile")
    at, _, _ = matrices(m)
    return np.einsum("ix,jy,xynpqk->npiqjk", at, at, x).astype(x.dtype)


def _output_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    at, _, _ = matrices(attr_int(op, "tile"))
    a = at.shape[1]

    def value(s: Indices) -> Expr:
        n, ty, i, tx, j, c = s
        product = [[x[u, v, n, ty, tx, c] for v in range(a)] for u in range(a)]
        return _sandwich(at, product, i, j, x.dtype)

    k.compute("winograd_output", out, value)


def _output_export(ex: Exporter, op: Op) -> None:
    """Aᵀ applied on each side by a MatMul, between transposes."""
    at, _, _ = matrices(attr_int(op, "tile"))
    last = ex.node("Transpose", [op.operands[0].name], perm=[2, 3, 4, 5, 0, 1])
    _two_sided(ex, last, at, op.result.name, perm=[0, 1, 5, 2, 4, 3])  # [N, TH, i, TW, j, K]


def _output_flops(op: Op) -> int:
    at, _, _ = matrices(attr_int(op, "tile"))
    m, a = at.shape
    per_tile = 2 * int(np.count_nonzero(at)) * (a + m)  # rows, then columns
    _, _, n, th, tw, k = op.operands[0].type.shape
    return per_tile * n * th * tw * k


WINOGRAD_OUTPUT = OpDef(
    "winograd_output",
    "x[a,a,N,TH,TW,K], the transformed products, as output tiles Aᵀ x A: [N,TH,m,TW,m,K]",
    ("x",),
    ("tile",),
    infer=_output_infer,
    fusion=Pattern.INJECTIVE,
    # Its kernel computes the bias, relu and residual add where it stores (each output element
    # once): in NHWC between Winograd convs, they would be a pass of their own.
    cheap=always_cheap,
    evaluate=_output_evaluate,
    lower=_output_lower,
    export=_output_export,
    flops=_output_flops,
)

OPS: tuple[OpDef, ...] = (WINOGRAD_INPUT, WINOGRAD_OUTPUT)
