"""Moves at indices known only at run time: gather, gather_elements, gather_nd (reads) and
scatter_elements, scatter_nd (a copy of data with updates written at the indices).

    b = GraphBuilder("kv")
    cache, pos = b.input("cache", (2, 16, 8)), b.input("pos", (2, 1, 2), "int64")
    new = b.input("new", (2, 1, 8))
    out = b.scatter_nd(cache, pos, new)    # rows [b, pos] of the cache replaced: a KV update

Every index follows ONNX: a negative one counts from the end of its axis. The numpy semantics
refuse an index out of range (IndexError); a kernel clamps it into range, so it never reads or
writes outside a buffer. A gather is one spatial block reading its operand at loaded indices
(injective). A scatter's kernel writes every output element once, at its own position, as
every other kernel does: a first stage finds, for each element (or each row, for scatter_nd),
the last update that lands on it (a max over the update positions; with reduction "add", "mul",
"max" or "min", it combines all of them), and the second picks that update or keeps data. The
first stage costs its keys times the update positions: every element times the indices' extent
along axis (scatter_elements), every row of data's first K axes times the index tuples
(scatter_nd; every element with a reduction). Each output element is data's or one update's
(or, with a reduction, those combined), so a scatter is injective, and never cheap: a kernel of
its own.

Duplicate indices with reduction "none" (undefined in ONNX): the last one in row-major order of
the indices wins, in numpy semantics and in a kernel alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hexir.errors import HexirError
from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.tir import Binary, Buffer, Cast, Expr, IntImm, Select, const
from hexir.ops.base import Exporter, OpDef, Pattern, no_flops, operand_names, unpositional
from hexir.ops.compute import (
    Kernel,
    affine,
    attr_int,
    clamp,
    conjunction,
    guarded_load,
    highest,
    limit,
    lowest,
)
from hexir.ops.movement import unflatten
from hexir.ops.numeric import Attrs, get_int

Indices = tuple[Expr, ...]

# --- shared: index operands, range checks, loaded indices -----------------------------------


def _index_dtype(indices: TensorType) -> None:
    if indices.dtype not in ("int32", "int64"):
        fail(f"indices must be int32 or int64, got {indices.dtype}")


def _in_range(kind: str, indices: np.ndarray, axis: int, n: int) -> np.ndarray:
    """`indices` with the negative ones counted from the end; IndexError for one outside."""
    bad = indices[(indices < -n) | (indices >= n)]
    if bad.size:
        raise IndexError(f"{kind}: index {int(bad.flat[0])} out of range for axis {axis} of {n}")
    return np.where(indices < 0, indices + n, indices)


def _loaded_index(k: Kernel, index: Expr, n: int) -> Expr:
    """An index loaded at run time as an index into an axis of `n`: a negative one counted
    from the end, one out of range clamped into it (never a read outside the operand)."""
    raw = Cast("int32", index)
    return clamp(k, Select(Binary("<", raw, IntImm(0)), Binary("+", raw, IntImm(n)), raw), n)


# --- gather, gather_elements ---------------------------------------------------------------


def _gather_infer(c: Check) -> TensorType:
    x, indices = c.types
    _index_dtype(indices)
    if not indices.shape:
        fail("indices must have at least one axis (a scalar index: reshape it to [1] first)")
    axis = c.axis("axis", len(x.shape), 0)
    return TensorType(x.shape[:axis] + indices.shape + x.shape[axis + 1 :], x.dtype)


def _gather_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, indices = xs
    axis = get_int(attrs, "axis")
    return np.take(x, _in_range("gather", indices, axis, x.shape[axis]), axis=axis)


def _gather_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """out[..., j..., ...] = x[..., indices[j...], ...]: a negative index counts from the end;
    an index out of range is clamped into it, so the kernel never reads outside x (the
    reference evaluator refuses such an index)."""
    x, indices = args
    axis, rank = attr_int(op, "axis"), len(indices.shape)
    n = x.shape[axis]

    def load(i: Indices) -> Expr:
        j = _loaded_index(k, indices[tuple(i[axis : axis + rank])], n)
        return x[i[:axis] + (j,) + i[axis + rank :]]

    k.compute("gather", out, load)


def _gather_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """Positions along the indices (an embedding lookup of each token) land where the indices'
    axes do; along x, beside the gathered axis, they stay; along it, a lookup reads across
    them."""
    x, indices = axes
    axis, rank = attr_int(op, "axis"), len(op.operands[1].type.shape)
    if x is None:
        return None if indices is None else axis + indices
    if indices is not None or x == axis:
        raise unpositional(op, "it gathers along the positions' axis, or by positioned indices")
    return x if x < axis else x + rank - 1


GATHER = OpDef(
    "gather",
    "x's slices along axis at runtime indices (an embedding lookup): "
    "out.shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]",
    ("x", "indices"),
    ("axis",),
    infer=_gather_infer,
    fusion=Pattern.INJECTIVE,  # each output element is one element of x, at a loaded index
    evaluate=_gather_evaluate,
    lower=_gather_lower,
    export=lambda ex, op: ex.node(
        "Gather", operand_names(op), op.result.name, axis=attr_int(op, "axis")
    ),
    flops=no_flops,
    positions=_gather_positions,
)


def _gather_elements_infer(c: Check) -> TensorType:
    x, indices = c.types
    _index_dtype(indices)
    if len(indices.shape) != len(x.shape) or not x.shape:
        fail(f"indices {dims(indices)} must have x's rank ({len(x.shape)})")
    axis = c.axis("axis", len(x.shape), 0)
    pairs = enumerate(zip(indices.shape, x.shape, strict=True))
    if any(i > d for k, (i, d) in pairs if k != axis):
        fail(f"indices {dims(indices)} extend past x {dims(x)} off axis {axis}")
    return TensorType(indices.shape, x.dtype)


def _gather_elements_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, indices = xs
    axis = get_int(attrs, "axis")
    wrapped = _in_range("gather_elements", indices, axis, x.shape[axis])
    return np.take_along_axis(x, wrapped, axis=axis)


def _gather_elements_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """out[i] = x[i with axis replaced by indices[i]]: wrapped and clamped as gather's."""
    x, indices = args
    axis = attr_int(op, "axis")
    n = x.shape[axis]

    def load(i: Indices) -> Expr:
        return x[i[:axis] + (_loaded_index(k, indices[i], n),) + i[axis + 1 :]]

    k.compute("gather_elements", out, load)


GATHER_ELEMENTS = OpDef(
    "gather_elements",
    "x's elements at runtime indices along axis, elsewhere at their own position: "
    "out[i] = x[i with i[axis] = indices[i]] (ONNX GatherElements)",
    ("x", "indices"),
    ("axis",),
    infer=_gather_elements_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_gather_elements_evaluate,
    lower=_gather_elements_lower,
    export=lambda ex, op: ex.node(
        "GatherElements", operand_names(op), op.result.name, axis=attr_int(op, "axis")
    ),
    flops=no_flops,
)


# --- gather_nd --------------------------------------------------------------------------------


def _gather_nd_infer(c: Check) -> TensorType:
    x, indices = c.types
    _index_dtype(indices)
    b = c.integer("batch_dims", 0, minimum=0)
    if not indices.shape or b >= min(len(indices.shape), len(x.shape)):
        fail(f"batch_dims {b} must be below the ranks of x {dims(x)} and indices {dims(indices)}")
    if x.shape[:b] != indices.shape[:b]:
        fail(f"the first {b} extents of x {dims(x)} and indices {dims(indices)} differ")
    depth = indices.shape[-1]
    if not 1 <= depth <= len(x.shape) - b:
        fail(f"indices {dims(indices)}: the last extent must be 1..{len(x.shape) - b}")
    return TensorType(indices.shape[:-1] + x.shape[b + depth :], x.dtype)


def _gather_nd_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, indices = xs
    b, lead = get_int(attrs, "batch_dims"), indices.shape[:-1]
    # The batch positions, each an index array that broadcasts against the index tuples.
    pad = (1,) * (len(lead) - b)
    batch = tuple(g.reshape(g.shape + pad) for g in np.indices(lead[:b], sparse=True))
    picked = tuple(
        _in_range("gather_nd", indices[..., j], b + j, x.shape[b + j])
        for j in range(indices.shape[-1])
    )
    return x[batch + picked]


def _gather_nd_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """out[t..., rest...] = x[t[:batch_dims]..., indices[t..., :]..., rest...]: each loaded
    index wrapped and clamped as gather's."""
    x, indices = args
    b, q = attr_int(op, "batch_dims"), len(indices.shape)

    def load(i: Indices) -> Expr:
        lead = i[: q - 1]
        at = tuple(
            _loaded_index(k, indices[lead + (IntImm(j),)], x.shape[b + j])
            for j in range(indices.shape[-1])
        )
        return x[lead[:b] + at + i[q - 1 :]]

    k.compute("gather_nd", out, load)


GATHER_ND = OpDef(
    "gather_nd",
    "x's slices at runtime index tuples (ONNX GatherND): out[t..., rest...] = "
    "x[t[:batch_dims]..., indices[t...]..., rest...]",
    ("x", "indices"),
    ("batch_dims",),
    infer=_gather_nd_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_gather_nd_evaluate,
    lower=_gather_nd_lower,
    export=lambda ex, op: ex.node(
        "GatherND", operand_names(op), op.result.name, batch_dims=attr_int(op, "batch_dims")
    ),
    flops=no_flops,
)


# --- scatters: shared ------------------------------------------------------------------------

REDUCTIONS = ("none", "add", "mul", "max", "min")
_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
_COMBINE = {"add": "+", "mul": "*", "max": "max", "min": "min"}
# ONNX's ScatterND and ScatterElements take max and min from opset 18; the export writes 17.
_EXPORTED = ("none", "add", "mul")


def _scatter_checks(c: Check, data: TensorType, updates: TensorType) -> None:
    if updates.dtype != data.dtype:
        fail(f"updates are {updates.dtype}, data {data.dtype}")
    reduction = c.choice("reduction", REDUCTIONS, "none")
    if reduction != "none" and data.dtype == "bool":
        fail(f"reduction {reduction!r} of bool data (only 'none')")


def _scattered(x: np.ndarray, flat: np.ndarray, values: np.ndarray, reduction: str) -> np.ndarray:
    """A copy of `x` with `values` put at row-major positions `flat` (both in the order the
    updates come): the last one at a position wins, or `reduction` combines them all."""
    out = x.copy()
    flat, values = flat.reshape(-1), values.reshape(-1)
    if reduction == "none":
        _, first = np.unique(flat[::-1], return_index=True)  # first from the end: the last
        last = flat.size - 1 - first
        out.reshape(-1)[flat[last]] = values[last]
    else:
        _UFUNCS[reduction].at(out.reshape(-1), flat, values)
    return out


@dataclass(frozen=True, slots=True)
class _Scatter:
    """One scatter's lowering: the updates come from `positions` (extents: the index tuples,
    or the indices' axis), each landing on a key, an index into the first `keys` axes of out
    (a row of it for scatter_nd, one element for scatter_elements)."""

    name: str
    data: Buffer
    out: Buffer
    keys: int
    positions: tuple[int, ...]
    match: Callable[[Indices, Indices], Expr]  # (key s, position r): whether r lands on s
    update: Callable[[Indices, Indices], Expr]  # (out index i, position r): r's update for i


def _last_update(k: Kernel, sc: _Scatter) -> None:
    """The last position landing on each key (a max; -1 where none lands), then each element
    of out its update, or data's element where none lands."""
    n = math.prod(sc.positions)
    last = k.alloc(f"{sc.name}_last", sc.out.shape[: sc.keys], "int32")
    strides = [math.prod(sc.positions[d + 1 :]) for d in range(len(sc.positions))]

    def which(s: Indices, r: Indices) -> Expr:
        return Select(sc.match(s, r), affine(zip(r, strides, strict=True)), IntImm(-1))

    k.reduce(f"{sc.name}_last", last, sc.positions, which, "max", IntImm(-1))

    def pick(i: Indices) -> Expr:
        p = last[i[: sc.keys]]
        r = tuple(unflatten(k, limit(k, p, 0, n - 1), list(sc.positions)))
        return Select(Binary("<=", IntImm(0), p), sc.update(i, r), sc.data[i])

    k.compute(sc.name, sc.out, pick)


def _combined_updates(k: Kernel, sc: _Scatter, reduction: str) -> None:
    """The updates landing on each element combined (the identity where none lands), then
    combined with data's element."""
    op, dt = _COMBINE[reduction], sc.out.dtype
    identity = {"add": const(0, dt), "mul": const(1, dt), "max": lowest(dt), "min": highest(dt)}
    unit = identity[reduction]
    acc = k.alloc(f"{sc.name}_{reduction}", sc.out.shape, dt)

    def term(s: Indices, r: Indices) -> Expr:
        return Select(sc.match(s[: sc.keys], r), sc.update(s, r), unit)

    k.reduce(f"{sc.name}_{reduction}", acc, sc.positions, term, op, unit)
    # acc first: max and min are `a > b ? a : b`, so data's NaN stays where nothing lands
    k.compute(sc.name, sc.out, lambda i: Binary(op, acc[i], sc.data[i]))


def _scatter_lower(k: Kernel, sc: _Scatter, reduction: str) -> None:
    if reduction == "none":
        _last_update(k, sc)
    else:
        _combined_updates(k, sc, reduction)


def _scatter_export(op_type: str, **extra: Callable[[Op], object]) -> Callable:
    def export(ex: Exporter, op: Op) -> None:
        reduction = str(op.attr("reduction"))
        if reduction not in _EXPORTED:
            raise HexirError(
                f"{op.kind} with reduction {reduction!r} has no ONNX form at opset 17 "
                f"({op_type}'s max and min arrived in opset 18)"
            )
        attrs = {key: get(op) for key, get in extra.items()}
        if reduction != "none":
            attrs["reduction"] = reduction
        ex.node(op_type, operand_names(op), op.result.name, **attrs)

    return export


def _scatter_flops(op: Op) -> int:
    """One combine per update with a reduction; none for a plain overwrite."""
    return 0 if op.attr("reduction") == "none" else op.operands[2].type.size


# --- scatter_elements -------------------------------------------------------------------------


def _scatter_elements_infer(c: Check) -> TensorType:
    x, indices, updates = c.types
    _index_dtype(indices)
    if len(indices.shape) != len(x.shape) or not x.shape or indices.shape != updates.shape:
        fail(
            f"indices {dims(indices)} and updates {dims(updates)} must have one shape, of x's "
            f"rank ({len(x.shape)})"
        )
    axis = c.axis("axis", len(x.shape), 0)
    pairs = enumerate(zip(indices.shape, x.shape, strict=True))
    if any(i > d for k, (i, d) in pairs if k != axis):
        fail(f"indices {dims(indices)} extend past x {dims(x)} off axis {axis}")
    _scatter_checks(c, x, updates)
    return x


def _scatter_elements_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, indices, updates = xs
    axis = get_int(attrs, "axis")
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = _in_range("scatter_elements", indices, axis, x.shape[axis])
    flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*where)), x.shape)
    return _scattered(x, flat, updates, str(attrs["reduction"]))


def _scatter_elements_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """out[i] = the update at j where j is i with j[axis] running over the indices' axis and
    indices[j] (wrapped and clamped as gather's) is i[axis]; data[i] where there is none."""
    x, indices, updates = args
    axis = attr_int(op, "axis")

    def moved(i: Indices, r: Indices) -> Indices:
        return i[:axis] + (r[0],) + i[axis + 1 :]

    def match(s: Indices, r: Indices) -> Expr:
        inside, index = guarded_load(k, indices, moved(s, r))  # s may pass indices off axis
        hit = Binary("==", _loaded_index(k, index, x.shape[axis]), s[axis])
        return hit if inside is None else Binary("&&", inside, hit)

    def update(i: Indices, r: Indices) -> Expr:
        return guarded_load(k, updates, moved(i, r))[1]

    sc = _Scatter("scatter_elements", x, out, len(x.shape), (indices.shape[axis],), match, update)
    _scatter_lower(k, sc, str(op.attr("reduction")))


SCATTER_ELEMENTS = OpDef(
    "scatter_elements",
    "x with updates written along axis at runtime indices, elsewhere at their own position "
    "(ONNX ScatterElements): out[i with i[axis] = indices[i]] = updates[i]",
    ("x", "indices", "updates"),
    ("axis", "reduction"),
    infer=_scatter_elements_infer,
    fusion=Pattern.INJECTIVE,  # not cheap: always a kernel of its own
    evaluate=_scatter_elements_evaluate,
    lower=_scatter_elements_lower,
    export=_scatter_export("ScatterElements", axis=lambda op: attr_int(op, "axis")),
    flops=_scatter_flops,
)


# --- scatter_nd -------------------------------------------------------------------------------


def _scatter_nd_infer(c: Check) -> TensorType:
    x, indices, updates = c.types
    _index_dtype(indices)
    if not indices.shape or not 1 <= indices.shape[-1] <= len(x.shape):
        fail(f"indices {dims(indices)}: the last extent must be 1..{len(x.shape)} (x's rank)")
    want = indices.shape[:-1] + x.shape[indices.shape[-1] :]
    if updates.shape != want:
        fail(f"updates of shape {updates.shape} must have shape {want}")
    _scatter_checks(c, x, updates)
    return x


def _scatter_nd_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, indices, updates = xs
    depth = indices.shape[-1]
    rows = tuple(
        _in_range("scatter_nd", indices[..., j], j, x.shape[j]).reshape(-1) for j in range(depth)
    )
    row = np.ravel_multi_index(rows, x.shape[:depth])
    width = math.prod(x.shape[depth:])
    flat = row[:, None] * width + np.arange(width)  # each index tuple's elements, in order
    return _scattered(x, flat, updates, str(attrs["reduction"]))


def _scatter_nd_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """out[s..., rest...] = updates[t..., rest...] for the index tuple t whose indices (wrapped
    and clamped as gather's) are s; data where there is none. The tuples are searched once
    per row s of data's first K axes, not per element."""
    x, indices, updates = args
    depth, lead = indices.shape[-1], indices.shape[:-1]

    def match(s: Indices, r: Indices) -> Expr:
        t = r[: len(lead)]
        hits = (
            Binary("==", _loaded_index(k, indices[t + (IntImm(j),)], x.shape[j]), s[j])
            for j in range(depth)
        )
        found = conjunction(hits)
        assert found is not None
        return found

    def update(i: Indices, r: Indices) -> Expr:
        return updates[r[: len(lead)] + i[depth:]]

    # No tuple axes (indices of shape [K]): one position, r = (0,).
    sc = _Scatter("scatter_nd", x, out, depth, lead or (1,), match, update)
    _scatter_lower(k, sc, str(op.attr("reduction")))


SCATTER_ND = OpDef(
    "scatter_nd",
    "x with slices replaced by updates at runtime index tuples (ONNX ScatterND, a KV-cache "
    "update): out[indices[t...]..., rest...] = updates[t..., rest...]",
    ("x", "indices", "updates"),
    ("reduction",),
    infer=_scatter_nd_infer,
    fusion=Pattern.INJECTIVE,  # not cheap: always a kernel of its own
    evaluate=_scatter_nd_evaluate,
    lower=_scatter_nd_lower,
    export=_scatter_export("ScatterND"),
    flops=_scatter_flops,
)

OPS: tuple[OpDef, ...] = (GATHER, GATHER_ELEMENTS, GATHER_ND, SCATTER_ELEMENTS, SCATTER_ND)
