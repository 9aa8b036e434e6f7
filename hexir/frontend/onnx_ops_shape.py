"""Converters of ONNX data-movement nodes: shapes, slices, concatenation, padding, gathers,
scatters.

Shapes, axes, starts and pads must be known at import time: initializers, Constant nodes, or
computed from them and from static shapes (a Shape node's output is a constant here, so the
Shape -> Gather -> Concat -> Reshape chains exporters write resolve to constants). Where an
input's dims are symbols (`import_onnx(..., symbolic=True)`), a Shape node's output is known
with the symbols in it (`Context.dims_value`), the same chains resolve to shapes that hold
them, and Reshape, Expand, ConstantOfShape and Range to such shapes and bounds become reshape,
broadcast_to and arange ops whose attributes are those dimensions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from hexir.frontend.onnx_context import (
    Context,
    Unsupported,
    dim_list,
    int_list,
    normalized_axis,
    tensor_array,
)
from hexir.frontend.onnx_ops import Spec, broadcast_to, reshape
from hexir.ir.graph import Value
from hexir.ir.symbolic import Dim, Sym, format_dim
from hexir.ops.indexing import REDUCTIONS


def _transpose(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    perm = ctx.attr("perm")
    perm = tuple(int_list(perm)) if perm is not None else None
    return [ctx.op("transpose", x, perm=perm)]


def _reshape(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    shape = dim_list(ctx.array(1, "shape"))
    if not ctx.attr("allowzero", 0):  # 0 copies the input's extent
        shape = [x.type.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [reshape(ctx, x, shape)]


def _flatten(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    ndim = len(x.type.shape)
    axis = int(ctx.attr("axis", 1))
    axis = axis + ndim if axis < 0 else axis
    outer = int(np.prod(x.type.shape[:axis], dtype=np.int64))
    return [reshape(ctx, x, (outer, -1) if x.type.size else (outer, 0))]


def _axes(ctx: Context, ndim: int) -> list[int] | None:
    """Squeeze/Unsqueeze axes: an attribute before opset 13, an input since."""
    given = ctx.attr("axes")
    if given is None and ctx.has(1):
        given = ctx.array(1, "axes")
    return None if given is None else [normalized_axis(a, ndim) for a in int_list(given)]


def _squeeze(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    shape = x.type.shape
    axes = _axes(ctx, len(shape))
    axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else axes
    if any(shape[a] != 1 for a in axes):
        raise Unsupported(f"Squeeze of axes {axes} whose extents are not 1 in {x.type!r}")
    return [reshape(ctx, x, [d for i, d in enumerate(shape) if i not in axes])]


def _unsqueeze(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    given = ctx.attr("axes")
    given = int_list(given if given is not None else ctx.array(1, "axes"))
    ndim = len(x.type.shape) + len(given)
    axes = [normalized_axis(a, ndim) for a in given]
    if len(set(axes)) != len(axes):
        raise Unsupported(f"Unsqueeze axes {given} name an axis twice")
    rest = iter(x.type.shape)
    return [reshape(ctx, x, [1 if i in axes else next(rest) for i in range(ndim)])]


def _concat(ctx: Context) -> Sequence[Value]:
    xs = [ctx.input(i) for i in range(len(ctx.current.inputs)) if ctx.has(i)]
    axis = normalized_axis(int(ctx.attr("axis")), len(xs[0].type.shape))
    return [xs[0] if len(xs) == 1 else ctx.op("concat", *xs, axis=axis)]


def _onnx_slice(start: int, end: int, step: int, dim: int) -> tuple[int, int, int]:
    """ONNX's clamping of one axis's slice, in slice's normal form (docs/ops.md)."""
    if step == 0:
        raise Unsupported("a Slice step is 0")
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim), step
    if dim == 0:
        return -1, -1, step
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step


def _slice(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    shape = x.type.shape
    starts = int_list(ctx.array(1, "starts"))
    ends = int_list(ctx.array(2, "ends"))
    axes_given = ctx.optional_array(3, "axes")
    given = int_list(axes_given) if axes_given is not None else []
    axes = [normalized_axis(a, len(shape)) for a in given]
    axes = axes or list(range(len(starts)))
    steps_given = ctx.optional_array(4, "steps")
    steps = int_list(steps_given) if steps_given is not None else [1] * len(starts)
    triples = [(0, d, 1) for d in shape]
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        triples[a] = _onnx_slice(s, e, st, shape[a])
    if all(t == (0, d, 1) for t, d in zip(triples, shape, strict=True)):
        return [x]
    start, stop, step = (tuple(t[i] for t in triples) for i in range(3))
    return [ctx.op("slice", x, start=start, stop=stop, step=step)]


def _take(ctx: Context, x: Value, axis: int, begin: int, end: int, step: int = 1) -> Value:
    shape = x.type.shape
    start = tuple(begin if i == axis else 0 for i in range(len(shape)))
    stop = tuple(end if i == axis else d for i, d in enumerate(shape))
    steps = tuple(step if i == axis else 1 for i in range(len(shape)))
    return ctx.op("slice", x, start=start, stop=stop, step=steps)


def _split(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    axis = normalized_axis(int(ctx.attr("axis", 0)), len(x.type.shape))
    dim, count = x.type.shape[axis], len(ctx.current.outputs)
    given = ctx.attr("split")
    if given is None and ctx.has(1):
        given = ctx.array(1, "split")
    if given is not None:
        sizes = int_list(given)
    else:  # opset 18's num_outputs: equal parts, the last one smaller
        chunk = -(-dim // count)
        sizes = [min(chunk, dim - i * chunk) for i in range(count)]
    if sum(sizes) != dim or len(sizes) != count:
        raise Unsupported(f"split sizes {sizes} do not cover extent {dim} in {count} outputs")
    bounds = np.cumsum([0, *sizes])
    return [_take(ctx, x, axis, int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _pad(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    ndim = len(x.type.shape)
    pads = int_list(ctx.array(1, "pads"))
    value = ctx.optional_array(2, "constant_value")
    axes_given = ctx.optional_array(3, "axes")
    given = int_list(axes_given) if axes_given is not None else []
    axes = [normalized_axis(a, ndim) for a in given]
    axes = axes or list(range(ndim))
    if len(pads) != 2 * len(axes) or any(p < 0 for p in pads):
        raise Unsupported(f"pads {pads} (negative pads crop, which Pad import does not do)")
    before, after = [0] * ndim, [0] * ndim
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    mode = str(ctx.attr("mode", "constant"))
    if mode != "constant":
        for axis, (b, e) in enumerate(zip(before, after, strict=True)):
            x = _pad_from_edges(ctx, x, axis, b, e, mode)
        return [x]
    fill = 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0])
    return [ctx.op("pad", x, before=tuple(before), after=tuple(after), value=fill)]


def _pad_from_edges(ctx: Context, x: Value, axis: int, before: int, after: int, mode: str) -> Value:
    """`x` padded along `axis` with its own elements: the edge one repeated ("edge"), a
    mirror without the edge ("reflect"), or the other end ("wrap"); slices and a concat."""
    if not before and not after:
        return x
    n = x.type.shape[axis]
    longest = {"edge": None, "reflect": n - 1, "wrap": n}[mode]
    if longest is not None and max(before, after) > longest:
        raise Unsupported(f"Pad mode {mode} of {max(before, after)} on an extent of {n}")
    match mode:
        case "edge":
            left = [_take(ctx, x, axis, 0, 1)] * before
            right = [_take(ctx, x, axis, n - 1, n)] * after
        case "reflect":
            left = [_take(ctx, x, axis, before, 0, -1)] if before else []
            right = [_take(ctx, x, axis, n - 2, n - 2 - after, -1)] if after else []
        case _:
            left = [_take(ctx, x, axis, n - before, n)] if before else []
            right = [_take(ctx, x, axis, 0, after)] if after else []
    return ctx.op("concat", *left, x, *right, axis=axis)


def _shape(ctx: Context) -> Sequence[Value]:
    """The input's static extents as a constant; symbolic ones as `Context.dims_value`, read
    with their symbols by the converters of the shape arithmetic after it."""
    shape = ctx.input(0).type.shape
    start, end = int(ctx.attr("start", 0)), ctx.attr("end")
    part = shape[start:] if end is None else shape[start : int(end)]
    return [ctx.dims_value(part)]


def _gather(ctx: Context) -> Sequence[Value]:
    """Gather with constant indices: slices (one when the indices step evenly), concat; with
    indices computed at run time (a language model's token ids): the `gather` op."""
    x = ctx.input(0)
    axis = normalized_axis(int(ctx.attr("axis", 0)), len(x.type.shape))
    dim = x.type.shape[axis]
    try:
        indices = np.asarray(ctx.array(1, "indices"))
    except Unsupported:
        return [_runtime_gather(ctx, x, ctx.input(1), axis)]
    if indices.dtype.kind not in "iu":
        raise Unsupported(f"Gather indices of type {indices.dtype} (ONNX's are int32 or int64)")
    indices = indices.astype(np.int64)
    flat = [int(i) + dim if i < 0 else int(i) for i in indices.reshape(-1)]
    if not flat or any(not 0 <= i < dim for i in flat):
        raise Unsupported(f"Gather indices {flat} for extent {dim}")
    steps = {b - a for a, b in itertools.pairwise(flat)}
    if len(steps) <= 1 and 0 not in steps:
        step = steps.pop() if steps else 1
        end = flat[-1] + (1 if step > 0 else -1)
        taken = _take(ctx, x, axis, flat[0], end, step)
    else:
        taken = ctx.op("concat", *(_take(ctx, x, axis, i, i + 1) for i in flat), axis=axis)
    shape = x.type.shape[:axis] + indices.shape + x.type.shape[axis + 1 :]
    return [reshape(ctx, taken, shape)]


def _runtime_gather(ctx: Context, x: Value, indices: Value, axis: int) -> Value:
    if indices.type.shape:
        return ctx.op("gather", x, indices, axis=axis)
    one = ctx.op("gather", x, reshape(ctx, indices, (1,)), axis=axis)  # a scalar index
    return reshape(ctx, one, x.type.shape[:axis] + x.type.shape[axis + 1 :])


def _gather_nd(ctx: Context) -> Sequence[Value]:
    batch_dims = int(ctx.attr("batch_dims", 0))
    return [ctx.op("gather_nd", ctx.input(0), ctx.input(1), batch_dims=batch_dims)]


def _scatter_elements(ctx: Context) -> Sequence[Value]:
    """ScatterElements (and opset 9's Scatter, the same op): the `scatter_elements` op,
    whatever its indices, constant or computed at run time."""
    operands = (ctx.input(0), ctx.input(1), ctx.input(2))
    axis, reduction = int(ctx.attr("axis", 0)), str(ctx.attr("reduction", "none"))
    return [ctx.op("scatter_elements", *operands, axis=axis, reduction=reduction)]


def _scatter_nd(ctx: Context) -> Sequence[Value]:
    """ScatterND (a KV cache's update at the decode position): the `scatter_nd` op."""
    operands = (ctx.input(0), ctx.input(1), ctx.input(2))
    return [ctx.op("scatter_nd", *operands, reduction=str(ctx.attr("reduction", "none")))]


def _expand(ctx: Context) -> Sequence[Value]:
    """Expand to a shape known at import: `where` against a constant of ones (see
    `broadcast_to`); to a shape with symbols in it, the broadcast_to op."""
    x = ctx.input(0)
    target = _broadcast_shapes(x.type.shape, tuple(dim_list(ctx.array(1, "shape"))))
    if any(isinstance(d, Sym) for d in target) and target != x.type.shape:
        return [ctx.op("broadcast_to", x, shape=target)]
    return [broadcast_to(ctx, x, target)]


def _broadcast_shapes(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """numpy's broadcast of two shapes whose extents may be symbols (equal ones, or 1)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        raise Unsupported(f"shapes {_shown(a)} and {_shown(b)} do not broadcast")
    return tuple(y if x == 1 else x for x, y in zip(a, b, strict=True))


def _shown(shape: tuple[Dim, ...]) -> str:
    return "(" + ", ".join(map(format_dim, shape)) + ")"


def _constant_of_shape(ctx: Context) -> Sequence[Value]:
    """A constant of a shape known at import (PyTorch's legacy exporter writes it for
    `torch.ones/zeros` of traced shapes: BERT's attention mask): folded to its data; of a
    shape with symbols in it, its one value broadcast to that shape."""
    shape = tuple(dim_list(ctx.array(0, "shape")))
    value = ctx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else tensor_array(value, "its value")
    if fill.size != 1:
        raise Unsupported(f"ConstantOfShape value of {fill.size} elements (ONNX allows one)")
    if any(isinstance(d, Sym) for d in shape):
        one = ctx.constant(fill.reshape((1,) * len(shape)))
        return [ctx.op("broadcast_to", one, shape=shape)]
    return [ctx.constant(np.full(shape, fill.reshape(()), fill.dtype))]


def _range(ctx: Context) -> Sequence[Value]:
    """Range of constant start, limit and delta: folded to its data; of bounds read off
    symbolic shapes (positions past a KV cache's length), the arange op."""
    start, limit, delta = (
        np.asarray(ctx.array(i, n)) for i, n in enumerate(("start", "limit", "delta"))
    )
    if isinstance(delta.item(), Sym) or delta.item() == 0:
        raise Unsupported(f"Range with delta {format_dim(delta.item())} (a nonzero number)")
    if isinstance(start.item(), Sym) or isinstance(limit.item(), Sym):
        dtype = ctx.input(0).type.dtype
        if not dtype.startswith("int"):
            raise Unsupported(f"Range of {dtype} from symbolic bounds (integers only)")
        first, last = dim_list([start.item(), limit.item()])
        return [ctx.op("arange", start=first, stop=last, step=int(delta.item()), dtype=dtype)]
    return [ctx.constant(_arange(start, limit, delta, int(ctx.attr("stash_type", 1))))]


def _arange(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, stash: int) -> np.ndarray:
    """numpy's arange in start's dtype; a float16 or bfloat16 one counted in float32 (stash_type
    1, Range 27's default) or float64 (11), then rounded, as Range 27 says."""
    dtype = start.dtype
    if dtype.name not in ("float16", "bfloat16"):
        return np.arange(start.item(), limit.item(), delta.item(), dtype=dtype)
    wide = np.dtype(np.float32 if stash == 1 else np.float64)
    first, last, step = (float(v.astype(wide)) for v in (start, limit, delta))
    return np.arange(first, last, step, dtype=wide).astype(dtype)


def _tile(ctx: Context) -> Sequence[Value]:
    """Tile by constant repeats: the operand concatenated with itself along each axis."""
    x = ctx.input(0)
    repeats = int_list(ctx.array(1, "repeats"))
    if len(repeats) != len(x.type.shape) or any(r < 1 for r in repeats):
        raise Unsupported(f"Tile repeats {repeats} for {x.type!r}")
    for axis, r in enumerate(repeats):
        if r > 1:
            x = ctx.op("concat", *([x] * r), axis=axis)
    return [x]


def _trilu(ctx: Context) -> Sequence[Value]:
    """The upper (or lower) triangle of the last two axes from diagonal k, zeros elsewhere:
    a select against a constant mask."""
    x = ctx.input(0)
    if len(x.type.shape) < 2:
        raise Unsupported(f"Trilu of {x.type!r}")
    k = 0 if not ctx.has(1) else int(np.asarray(ctx.array(1, "k")).reshape(-1)[0])
    ones = np.ones(x.type.shape[-2:], bool)
    mask = np.triu(ones, k) if int(ctx.attr("upper", 1)) else np.tril(ones, k)
    zero = ctx.constant(np.zeros((), np.dtype(x.type.dtype)))
    return [ctx.op("where", ctx.constant(mask), x, zero)]


def _cumsum(ctx: Context) -> Sequence[Value]:
    """Cumulative sum along a constant axis: of floats, a matmul with a triangle of ones
    (exclusive: the strict triangle; reverse: from the end), the axis moved last and back; of
    integers (position ids from an attention mask) a masked sum (`_masked_prefix`)."""
    x = ctx.input(0)
    ndim = len(x.type.shape)
    axis = normalized_axis(int(np.asarray(ctx.array(1, "axis")).reshape(-1)[0]), ndim)
    if not x.type.dtype.startswith("float"):
        return [_masked_prefix(ctx, x, axis, "reduce_sum", 0)]
    n = x.type.shape[axis]
    # column j sums the rows i <= j (i < j exclusive; i >= j, i > j in reverse)
    k = 1 if ctx.attr("exclusive", 0) else 0
    ones = np.ones((n, n), np.dtype(x.type.dtype))
    triangle = np.tril(ones, -k) if ctx.attr("reverse", 0) else np.triu(ones, k)
    perm = [d for d in range(ndim) if d != axis] + [axis]
    moved = x if axis == ndim - 1 else ctx.op("transpose", x, perm=tuple(perm))
    rows = reshape(ctx, moved, (moved.type.size // n, n))
    summed = reshape(ctx, ctx.op("matmul", rows, ctx.constant(triangle)), moved.type.shape)
    back = [perm.index(d) for d in range(ndim)]
    return [summed if axis == ndim - 1 else ctx.op("transpose", summed, perm=tuple(back))]


def _cumprod(ctx: Context) -> Sequence[Value]:
    """Cumulative product along a constant axis (`_masked_prefix`)."""
    x = ctx.input(0)
    axis = normalized_axis(int(np.asarray(ctx.array(1, "axis")).reshape(-1)[0]), len(x.type.shape))
    return [_masked_prefix(ctx, x, axis, "reduce_prod", 1)]


def _masked_prefix(ctx: Context, x: Value, axis: int, reduce: str, identity: int) -> Value:
    """Each output position's `reduce` over a row of the input masked by a triangle (the
    `identity` where an element is not in its prefix; exclusive: the strict triangle;
    reverse: from the end): n reductions of n for an axis of n."""
    ndim, n = len(x.type.shape), x.type.shape[axis]
    k = 1 if ctx.attr("exclusive", 0) else 0
    ones = np.ones((n, n), bool)  # [output j, input i]: i <= j (i < j exclusive; reversed)
    taken = np.triu(ones, k) if ctx.attr("reverse", 0) else np.tril(ones, -k)
    spread = list(x.type.shape)
    spread.insert(axis, 1)  # [..., 1 (j), n (i), ...]
    mask_shape = [1] * (ndim + 1)
    mask_shape[axis], mask_shape[axis + 1] = n, n
    mask = ctx.constant(taken.reshape(mask_shape))
    masked = ctx.op("where", mask, reshape(ctx, x, spread), ctx.scalar(identity, x))
    return ctx.op(reduce, masked, axes=(axis + 1,), keepdims=False)


def _constant(ctx: Context) -> Sequence[Value]:
    attrs = ctx.current.attrs
    if "value" in attrs:
        array = tensor_array(attrs["value"], "its value")
    elif "value_float" in attrs or "value_floats" in attrs:
        array = np.asarray(attrs.get("value_float", attrs.get("value_floats")), np.float32)
    else:
        array = np.asarray(attrs.get("value_int", attrs.get("value_ints")), np.int64)
    return [ctx.constant(array)]


SHAPE_SPECS: dict[str, Spec] = {
    "Transpose": Spec(_transpose, {"perm": None}),
    "Reshape": Spec(_reshape, {"allowzero": None}),
    "Flatten": Spec(_flatten, {"axis": None}),
    "Squeeze": Spec(_squeeze, {"axes": None}),
    "Unsqueeze": Spec(_unsqueeze, {"axes": None}),
    "Concat": Spec(_concat, {"axis": None}),
    "Slice": Spec(_slice),
    "Split": Spec(_split, {"axis": None, "split": None, "num_outputs": None}, outputs=None),
    "Pad": Spec(_pad, {"mode": ("constant", "edge", "reflect", "wrap")}),
    "Shape": Spec(_shape, {"start": None, "end": None}),
    "Gather": Spec(_gather, {"axis": None}),
    "GatherElements": Spec(
        lambda ctx: [
            ctx.op("gather_elements", ctx.input(0), ctx.input(1), axis=int(ctx.attr("axis", 0)))
        ],
        {"axis": None},
    ),
    "GatherND": Spec(_gather_nd, {"batch_dims": None}),
    "Scatter": Spec(_scatter_elements, {"axis": None}),
    "ScatterElements": Spec(_scatter_elements, {"axis": None, "reduction": REDUCTIONS}),
    "ScatterND": Spec(_scatter_nd, {"reduction": REDUCTIONS}),
    "ConstantOfShape": Spec(_constant_of_shape, {"value": None}),
    "Range": Spec(_range, {"stash_type": (1, 11)}),
    "Size": Spec(lambda ctx: [ctx.dims_value([ctx.input(0).type.size], shape=())]),
    "Tile": Spec(_tile),
    "Trilu": Spec(_trilu, {"upper": None}),
    "CumSum": Spec(_cumsum, {"exclusive": None, "reverse": None}),
    "CumProd": Spec(_cumprod, {"exclusive": None, "reverse": None}),
    "Expand": Spec(_expand),
    "Constant": Spec(
        _constant,
        {
            "value": None,
            "value_float": None,
            "value_floats": None,
            "value_int": None,
            "value_ints": None,
        },
    ),
}
