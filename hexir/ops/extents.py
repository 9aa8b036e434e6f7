"""Ops whose result extents are attributes, which may be symbolic: arange (ONNX Range) and
broadcast_to (ONNX Expand).

    %pos = hexir.arange {dtype = "int64", start = {past}, step = 1, stop = {past + seq}}
        : tensor<{seq}xi64>                            // the positions of the new tokens
    %m = hexir.broadcast_to %one {shape = (1, {past + seq})} : tensor<1x{past + seq}xi1>

They are what an exported model's shape arithmetic becomes where the sizes are symbols: a
Range from sizes read off a Shape node, an Expand to such a shape (`hexir.frontend`'s ONNX
import writes them where the shapes are symbolic; at fixed sizes it folds them itself).
Specialization (`hexir.graph.specialize`) makes the attributes numbers; an arange then has
nothing to read and constant folding makes it a constant before any kernel is built.
"""

from __future__ import annotations

import numpy as np

from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.symbolic import Dim, Sym, SymbolicError, format_dim
from hexir.ir.tir import Buffer, Cast
from hexir.ops.base import (
    Exporter,
    OpDef,
    Pattern,
    always_cheap,
    no_flops,
    operand_names,
    symbolic_only,
)
from hexir.ops.compute import Kernel, affine, attr_int, attr_ints, broadcast
from hexir.ops.numeric import Attrs, get_int, get_ints

# --- arange -----------------------------------------------------------------------------------


def _arange_infer(c: Check) -> TensorType:
    start, stop, step = c.extent("start", 0), c.extent("stop"), c.integer("step", 1)
    dtype = c.dtype("dtype") if "dtype" in c.raw else "int64"
    c.out["dtype"] = dtype
    if dtype == "bool":
        fail("an arange of bools: dtype must be a number type")
    if step == 0:
        fail("attribute 'step' must not be 0")
    length = _length(start, stop, step)
    return TensorType((length,), dtype)


def _length(start: Dim, stop: Dim, step: int) -> Dim:
    """len(range(start, stop, step)), where it is a number or a dimension for every size."""
    if not isinstance(start, Sym) and not isinstance(stop, Sym):
        return len(range(start, stop, step))
    span = stop - start if step > 0 else start - stop
    try:
        if isinstance(span, int):
            return max(0, -(-span // abs(step)))
        if span.minimum is None:  # may be negative: the length is a max(0, ...)
            raise SymbolicError(f"{{{span}}} may be negative")
        return span // abs(step)  # exact for every size, or SymbolicError
    except SymbolicError as e:
        shown = ", ".join(format_dim(d) for d in (start, stop, step))
        fail(f"the length of range({shown}) is no dimension: {e}")


def _arange_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    start, stop, step = get_int(attrs, "start"), get_int(attrs, "stop"), get_int(attrs, "step")
    return np.arange(start, stop, step).astype(str(dict(attrs)["dtype"]))


def _arange_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    start, step = attr_int(op, "start"), attr_int(op, "step")
    k.compute("arange", out, lambda i: Cast(out.dtype, affine(((i[0], step),), start)))


def _arange_export(ex: Exporter, op: Op) -> None:
    symbolic_only(ex, op, "start", "stop")
    dtype = np.dtype(str(op.attr("dtype")))
    bounds = [
        ex.const(np.asarray(attr_int(op, key), dtype), f"{op.result.name}.{key}")
        for key in ("start", "stop", "step")
    ]
    ex.node("Range", bounds, op.result.name)


def _arange_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """Element i is start + i · step: a longer range only adds elements after."""
    return 0


ARANGE = OpDef(
    "arange",
    "start, start + step, ... up to stop (excluded), of dtype",
    (),
    ("start", "stop", "step", "dtype"),
    infer=_arange_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_arange_evaluate,
    lower=_arange_lower,
    export=_arange_export,
    cheap=always_cheap,
    flops=no_flops,
    positions=_arange_positions,
)


# --- broadcast_to -----------------------------------------------------------------------------


def _broadcast_to_infer(c: Check) -> TensorType:
    (x,) = c.types
    shape = c.extents("shape")
    if any(isinstance(d, int) and d < 0 for d in shape):
        fail(f"attribute 'shape' {shape} holds a negative extent")
    skip = len(shape) - len(x.shape)
    if skip < 0 or any(
        d != 1 and d != s for d, s in zip(x.shape, shape[skip:], strict=True)
    ):  # fmt: skip
        shown = "(" + ", ".join(map(format_dim, shape)) + ")"
        fail(f"x of {dims(x)} does not broadcast to {shown}")
    return TensorType(shape, x.dtype)


def _broadcast_to_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    k.compute("broadcast_to", out, lambda i: broadcast(x, i, out.shape))


def _broadcast_to_export(ex: Exporter, op: Op) -> None:
    symbolic_only(ex, op, "shape")
    shape = ex.ints(attr_ints(op, "shape"), f"{op.result.name}.shape")
    ex.node("Expand", [*operand_names(op), shape], op.result.name)


def _broadcast_to_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """The operand's positions where numpy's broadcasting aligns them; a new axis of a
    symbol's extent repeats the same element at every position."""
    (a,) = axes
    shape = op.result.type.shape
    if a is not None:
        return a + len(shape) - len(op.operands[0].type.shape)
    symbolic = [b for b, d in enumerate(shape) if isinstance(d, Sym)]
    return symbolic[0] if len(symbolic) == 1 else None


BROADCAST_TO = OpDef(
    "broadcast_to",
    "x repeated along its extents of 1 (and new leading axes) to shape, as numpy's",
    ("x",),
    ("shape",),
    infer=_broadcast_to_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=lambda xs, attrs: np.broadcast_to(xs[0], get_ints(attrs, "shape")).copy(),
    lower=_broadcast_to_lower,
    export=_broadcast_to_export,
    cheap=always_cheap,
    positions=_broadcast_to_positions,
)

OPS: tuple[OpDef, ...] = (ARANGE, BROADCAST_TO)
