"""The ops of the `hexir` dialect (docs/ops.md): one `OpDef` per op, by family, and `make_op`.

    OPS["softmax"].infer, .evaluate, .lower, .fusion, .export   # every facet of one op
    op_def("hexir.matmul")                                      # by name; None if unknown
    op_flops(op)                                                # its floating-point operations
    make_op("matmul", [x, w], {}, "0")                          # %0 = hexir.matmul %x, %w ...
    make_op("reduce_sum", [y], {"axes": -1}, "1")               # axes=(1,), keepdims=False

`OPS` gathers the families' definitions, in the order of `FAMILIES` (the order of docs/ops.md).
An op is defined once, in its family's module: adding one means adding its `OpDef` there (and,
if ONNX has it, an import converter in `hexir.frontend.onnx_ops`); the builder, the parser,
the evaluator, the lowering, fusion, the executor and the ONNX exporter all read it from here.

`make_op` is the one way to build an `Op`: the builder, the parser and the graph passes all go
through it, so every op in a graph has been checked and its attributes are in the normalized
form of docs/ops.md (axes non-negative, pairs full length, defaults filled in, reshape's -1
resolved). `make_op` is idempotent on attributes: rebuilding an op from `dict(op.attrs)` gives
the same op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hexir.errors import TypeInferenceError
from hexir.ir.dtype import SUB_BYTE_INTS
from hexir.ir.graph import Op, TensorType, Value
from hexir.ir.op_attrs import NAME_RE, PLACEMENT_RE, Check, Reject, fail
from hexir.ir.symbolic import SymbolicError
from hexir.ops import (
    attention,
    contraction,
    elementwise,
    extents,
    indexing,
    movement,
    nn,
    reduction,
    winograd,
)
from hexir.ops.base import Exporter, OpDef, Pattern
from hexir.ops.movement import slice_indices

__all__ = [
    "FAMILIES",
    "OPS",
    "Exporter",
    "OpDef",
    "Pattern",
    "make_op",
    "op_def",
    "op_flops",
    "slice_indices",
]

# The op families, each a module whose `OPS` tuple defines its ops.
FAMILIES = (
    contraction, nn, winograd, elementwise, reduction, attention, movement, indexing, extents,
)  # fmt: skip

OPS: dict[str, OpDef] = {d.name: d for family in FAMILIES for d in family.OPS}


def op_def(name: str) -> OpDef | None:
    """The definition of op `name` ("matmul" or "hexir.matmul"); None for an unknown op."""
    return OPS.get(name.removeprefix("hexir."))


def op_flops(op: Op) -> int:
    """The floating-point operations of `op` (its definition's `flops`, else the default of its
    fusion role): 2 per multiply-add of a contraction or convolution, one per element of an
    elementwise op, none for data movement."""
    spec = OPS[op.kind]
    return spec.flop_count(op)


def make_op(
    name: str,
    operands: Sequence[Value],
    attrs: Mapping[str, object] | None,
    result_name: str,
    placement: str = "cpu",
    *,
    result_type: TensorType | None = None,
) -> Op:
    """Check one op, infer its result type and normalize its attributes.

    `name` is "matmul" or "hexir.matmul". `result_type` is required for `constant` (the shape
    and dtype of its data); for other ops it is checked against inference when given.
    Raises `TypeInferenceError` naming the op, saying what is wrong and printing the op.
    """
    kind = name.removeprefix("hexir.")
    operands, attrs = tuple(operands), dict(attrs or {})
    try:
        spec = OPS.get(kind)
        if spec is None:
            fail(f"unknown op; the hexir ops are {', '.join(OPS)}")
        names = _check_signature(spec, operands, attrs, result_name, placement)
        check = Check(names, [v.type for v in operands], attrs, result_type)
        inferred = spec.infer(check)
        _check_sub_byte(spec, [v.type for v in operands], inferred)
        if result_type is not None and inferred != result_type:
            fail(f"the result type {result_type!r} disagrees with the inferred {inferred!r}")
    except (Reject, SymbolicError) as e:
        written = _as_written(f"hexir.{kind}", operands, attrs, result_name, placement)
        raise TypeInferenceError(f"hexir.{kind}: {e}\n{written}") from None
    attrs_out = tuple(sorted(check.out.items()))
    return Op(f"hexir.{kind}", operands, Value(result_name, inferred), attrs_out, placement)


def _check_sub_byte(spec: OpDef, operands: list[TensorType], result: TensorType) -> None:
    """Sub-byte ints (int4, uint4, int2, uint2) only move and convert, as ONNX uses them:
    arithmetic on them would need a wrap after every op, which the kernels do not do."""
    if spec.name in ("cast", "constant") or spec.fusion == Pattern.INJECTIVE:
        return
    found = sorted({t.dtype for t in (*operands, result)} & set(SUB_BYTE_INTS))
    if found:
        fail(
            f"{', '.join(found)} values only move and convert (cast, reshape, transpose, "
            "slice, concat, gather, ...): cast them to a wider int first"
        )


def _check_signature(
    spec: OpDef, operands: tuple, attrs: dict, result_name: object, placement: object
) -> tuple[str, ...]:
    """Arity, operand kinds, attribute keys, names; returns the operands' names."""
    for i, v in enumerate(operands):
        if not isinstance(v, Value):
            fail(f"operand {i} is a {type(v).__name__}, not a Value")
    if spec.variadic:
        if not operands:
            fail("needs at least one operand")
        names = tuple(f"{spec.operands[0]}{i}" for i in range(len(operands)))
    elif not len(spec.operands) - spec.optional <= len(operands) <= len(spec.operands):
        counts = range(len(spec.operands) - spec.optional, len(spec.operands) + 1)
        wanted = f"{' or '.join(map(str, counts))} operand(s) ({', '.join(spec.operands)})"
        fail(f"takes {wanted}, got {len(operands)}")
    else:
        names = spec.operands[: len(operands)]
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        takes = ", ".join(spec.attrs) or "no attributes"
        fail(f"unknown attribute(s) {', '.join(unknown)}; it takes {takes}")
    if not isinstance(result_name, str) or not NAME_RE.fullmatch(result_name):
        fail(f"bad result name {result_name!r}; names match {NAME_RE.pattern}")
    if not isinstance(placement, str) or not PLACEMENT_RE.fullmatch(placement):
        fail(f'bad placement {placement!r}; expected "cpu", "cuda:0", ...')
    return names


def _as_written(kind: str, operands: tuple, attrs: dict, result: object, placement: object) -> str:
    """The op in the text form, with the operands' types, as far as it can be printed."""
    from hexir.ir.graph_text import format_attr_value

    def show(value: object) -> str:
        try:
            return format_attr_value(tuple(value) if isinstance(value, list) else value)
        except TypeError:
            return repr(value)

    items = sorted({**attrs, "placement": placement}.items())
    attr_text = ", ".join(f"{k} = {show(v)}" for k, v in items)
    names = ", ".join(f"%{v.name}" if isinstance(v, Value) else repr(v) for v in operands)
    line = f"  in: %{result} = {kind} {names} {{{attr_text}}}".replace("  {", " {")
    typed = ", ".join(dict.fromkeys(repr(v) for v in operands if isinstance(v, Value)))
    return line + (f"\n  where {typed}" if typed else "")
