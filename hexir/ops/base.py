"""`OpDef`: one op of the `hexir` dialect, every facet of it in one value.

    MATMUL = OpDef(
        "matmul", "a[M,K] · b[K,N]", ("a", "b"), (),     # name, doc, operands, attribute keys
        infer=_matmul_infer,                             # checks, result type, normalized attrs
        fusion=Pattern.OUT_FUSABLE,                      # takes elementwise epilogues
        evaluate=_matmul_evaluate,                       # numpy
        lower=_matmul_lower,                             # hextir, through the Kernel DSL
        export=onnx_same("MatMul"),                      # ONNX nodes, through an Exporter
        flops=_contraction_flops,                        # 2 per multiply-add
    )

The facets are plain functions over IR values, read by the stages that need them: `infer` by
`make_op` (so by the builder and the parser), `evaluate` by the numpy evaluator and constant
evaluation, `lower` by `hexir.graph.lower`, `fusion` by `hexir.graph.fusion` (and the executor,
through `pointwise`), `export` by `hexir.frontend.onnx_export`, `flops` by `Module.profile`.
Nothing here imports a stage: the lowering writes through the `Kernel` DSL
(`hexir.ops.compute`), the export through the `Exporter` protocol below, which the ONNX
exporter implements, so `hexir.ops` never imports onnx.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hexir.errors import HexirError
from hexir.ir.graph import Graph, Op, TensorType, Value
from hexir.ir.graph_text import format_attr_value
from hexir.ir.op_attrs import Check, fail
from hexir.ir.symbolic import Sym
from hexir.ir.tir import Buffer
from hexir.ops.compute import Kernel
from hexir.ops.numeric import Evaluate

# Shape and dtype rule: reads the operand types and attributes through `Check`, records the
# normalized attributes (docs/ops.md) and returns the result type.
Infer = Callable[[Check], TensorType]
# Lowering: the op's stages written into the kernel, reading `args`, writing `out`.
Lower = Callable[[Kernel, Op, tuple[Buffer, ...], Buffer], None]
# ONNX export: the op as nodes written through the exporter.
Export = Callable[["Exporter", Op], None]
# Floating-point operations of one op, from its operand and result types and attributes.
Flops = Callable[[Op], int]
# Positions along a symbolic dimension (hexir/graph/buckets.py): given, for each operand, the
# axis along which a symbol's positions run (None: the operand has no such axis), the
# result's axis, or None where it has none; raises `Unpositional` where a result at one
# position reads an operand at a later one (a reduction along it, a slice of it).
Positions = Callable[[Op, tuple["int | None", ...]], "int | None"]
# The builder method's Python arguments (after the builder's own `placement` and `name`) as
# the op's operands and attributes; for ops whose method is not "operands, then attributes".
BuildArgs = Callable[..., tuple[Sequence[Value], dict[str, object]]]


class Unpositional(HexirError):
    """An op whose result at one position of a symbolic axis reads other positions of it."""


class Pattern(enum.IntEnum):
    """How an op's output elements depend on its operands' elements, for fusion."""

    ELEMENTWISE = 0  # out[i] from operand[i], same shapes
    BROADCAST = 1  # out[i] from operand[f(i)], some operand smaller (bias_add, batch_norm)
    INJECTIVE = 2  # out[i] is one element of an operand, moved (transpose, reshape, ...)
    REDUCTION = 3  # out[i] from many elements of an operand (reduce_*, softmax, pools)
    OUT_FUSABLE = 4  # a contraction whose output takes elementwise epilogues
    OPAQUE = 8  # anything else: never fused


class Exporter(Protocol):
    """What an op's `export` writes ONNX through (`hexir.frontend.onnx_export` implements it).

    Values are named by strings: an op's operands by their Hexir names, its result by
    `op.result.name`; a node without `output` gets a fresh name, which `node` returns.
    """

    graph: Graph  # the graph being exported (constants' data)

    def node(
        self, op_type: str, inputs: list[str], output: str | None = None, **attrs: object
    ) -> str: ...

    def const(self, array: np.ndarray, base: str, name: str | None = None) -> str: ...

    def scalar(self, value: float, like: Value, base: str) -> str: ...

    def ints(self, values: tuple[int, ...], base: str) -> str: ...

    def fresh(self, base: str) -> str: ...

    def elem_type(self, dtype: str) -> int: ...


@dataclass(frozen=True, slots=True)
class OpDef:
    """One op of docs/ops.md: its signature, checks, semantics, lowering, fusion role, export.

    `evaluate` and `lower` are None only for `constant`, whose value is the graph's data.
    `cheap` (injective ops only) says whether computing the op inside its consumer's kernel is
    cheap (the consumer still reads the operand row by row); None means never.
    `view`: the result is the operand's elements in the same row-major order (reshape), so a
    lone view op needs no kernel: the memory plan gives its result the operand's storage.
    `flops` counts the op's floating-point operations (what a profile's GFLOP/s divides); None
    means the default of its fusion role, `default_flops`.
    `positions` maps the axis along which a symbol's positions run through the op (see
    `Positions`; hexir/graph/buckets.py pads such a symbol to a bucket); None means the
    default of its fusion role (elementwise and broadcast ops keep their operands' axis),
    and for others that the op reads across positions.
    """

    name: str
    doc: str
    operands: tuple[str, ...]
    attrs: tuple[str, ...]
    infer: Infer
    fusion: Pattern
    evaluate: Evaluate | None
    lower: Lower | None
    export: Export
    variadic: bool = False  # one or more operands, all named after operands[0]
    build: BuildArgs | None = None
    cheap: Callable[[Op], bool] | None = None
    flops: Flops | None = None
    view: bool = False
    optional: int = 0  # how many of the last operands a use may leave out
    positions: Positions | None = None

    def flop_count(self, op: Op) -> int:
        """The floating-point operations of `op`, an op of this definition."""
        return self.flops(op) if self.flops is not None else default_flops(self.fusion, op)

    @property
    def pointwise(self) -> bool:
        """Whether every output element comes from the same element of each full-size operand
        (elementwise and broadcast ops): a kernel made of these alone may write its output
        over such an operand."""
        return self.fusion in (Pattern.ELEMENTWISE, Pattern.BROADCAST)


def default_flops(fusion: Pattern, op: Op) -> int:
    """FLOPs of an op without its own count: one per result element for elementwise and
    broadcast ops, one per element read for reductions (reduce_*), none for data movement."""
    if fusion == Pattern.INJECTIVE:
        return 0
    if fusion == Pattern.REDUCTION:
        return op.operands[0].type.size
    return op.result.type.size


def multiply_adds(n: int) -> int:
    """FLOPs of `n` multiply-adds (a contraction's or a convolution's): 2 each."""
    return 2 * n


def always_cheap(op: Op) -> bool:
    """`OpDef.cheap` of an injective op whose every instance is cheap inside its consumer's
    kernel."""
    return True


def no_flops(op: Op) -> int:
    """The count of an op that moves or converts data and computes nothing."""
    return 0


def operand_names(op: Op) -> list[str]:
    """The op's operands by name: the inputs of the ONNX nodes it exports to."""
    return [v.name for v in op.operands]


def onnx_same(op_type: str) -> Export:
    """The export to one ONNX node of `op_type` with the same operands and no attributes."""

    def export(ex: Exporter, op: Op) -> None:
        ex.node(op_type, operand_names(op), op.result.name)

    return export


def symbolic_only(ex: Exporter, op: Op, *keys: str) -> None:
    """HexirError where one of the attributes `keys` holds a symbolic dimension: ONNX takes
    the op's shapes and bounds as tensors of numbers, so such an op exports from a
    specialization (`hexir.specialize(graph, sizes)`)."""
    for key in keys:
        value = op.attr(key)
        if isinstance(value, Sym) or (
            isinstance(value, tuple) and any(isinstance(v, Sym) for v in value)
        ):
            raise HexirError(
                f"{op.kind} with the symbolic {key} {format_attr_value(value)} has no ONNX form "
                "here (ONNX takes it as a tensor of numbers): export the graph specialized to "
                "sizes, hexir.specialize(graph, sizes)"
            )


def at_least(key: str, values: tuple[int, ...], minimum: int) -> tuple[int, ...]:
    """`values` of attribute `key`, refused unless every entry is at least `minimum`."""
    if any(v < minimum for v in values):
        fail(f"attribute '{key}' entries must be at least {minimum}, got {values}")
    return values


# --- positions (`Positions`): rules several op families share ------------------------------


def unpositional(op: Op, why: str) -> Unpositional:
    return Unpositional(f"%{op.result.name} = {op.kind}: {why}")


def positions_of_first(across: Callable[[Op], Sequence[int]]) -> Positions:
    """Positions that only the first operand carries, kept at their axis, unless the op reads
    across that axis (`across(op)`: the axes one result element reads many elements of) —
    softmax's and layer_norm's rows."""

    def rule(op: Op, axes: tuple[int | None, ...]) -> int | None:
        a, *rest = axes
        if any(r is not None for r in rest):
            raise unpositional(op, "an operand other than the first runs along the positions")
        if a is not None and a in across(op):
            raise unpositional(op, f"it reads across axis {a}, along which the positions run")
        return a

    return rule
