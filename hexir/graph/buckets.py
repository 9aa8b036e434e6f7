"""Buckets of a symbolic dimension: a graph whose results at each position of a symbol read
no later position runs at a length padded up to a bucket, and its results cut back.

    axes = position_axes(graph)         # {"seq": PositionAxes(inputs={"input_ids": 0}, ...)}
    bucket(17)                          # 32: one module serves every length from 17 to 32

A symbol's *positions* run along one axis of a value (a prompt's tokens along axis 0 of the
ids, axis 1 of the keys [heads, seq, head_dim]). The graph is *prefix-closed* in a symbol
when every op maps its operands' position axes to one axis of its result without reading a
later position for an earlier one (each op's `positions` rule, hexir/ops/base.py: an
elementwise op keeps them, a matmul keeps them along its rows, causal attention reads a
query's keys up to its own position; a reduction along them, a slice of them or
non-causal attention over them does not). Then padding every input at the end of its
position axis leaves the results at the real positions exactly what they are at the real
length. The padding repeats the last position (values the graph computes with anyway, so it
makes no infinity or NaN that a masked read, 0 times it, would carry into a real row). A
SymbolicModule (hexir/runtime/symbolic_module.py) compiles such a graph once per bucket of
lengths instead of once per length, and the tuning database records schedules per bucket,
since the kernels it runs are those of the bucket's size.
A graph that is not prefix-closed in a symbol runs at that symbol's exact sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hexir.ir.graph import Graph, Value
from hexir.ir.symbolic import Sym
from hexir.ops import op_def
from hexir.ops.base import Pattern, Unpositional, positions_of_first, unpositional

__all__ = ["PositionAxes", "bucket", "position_axes"]

# Lengths up to this are padded to the next power of two; longer ones to a multiple of it.
BUCKET_STEP = 128


def bucket(n: int) -> int:
    """The bucket of lengths that `n` falls in, by its largest length: the next power of two
    up to BUCKET_STEP, then the next multiple of BUCKET_STEP (at most 2x the work of `n`
    for short lengths, under 1 + BUCKET_STEP / n for long ones)."""
    if n <= BUCKET_STEP:
        return 1 << (n - 1).bit_length()
    return -(-n // BUCKET_STEP) * BUCKET_STEP


@dataclass(frozen=True)
class PositionAxes:
    """Where one symbol's positions run in a prefix-closed graph: the axis of each input and
    output that has them (by name; the others have none). `why` is None for a prefix-closed
    graph, else the op that reads across the positions, and why."""

    inputs: dict[str, int] = field(default_factory=dict)
    outputs: dict[int, int] = field(default_factory=dict)  # output number -> axis
    why: str | None = None


def position_axes(graph: Graph) -> dict[str, PositionAxes]:
    """For each symbol of the graph's inputs, where its positions run, or why not."""
    from hexir.graph.specialize import graph_symbols

    return {s: _symbol_axes(graph, s) for s in sorted(graph_symbols(graph))}


def _symbol_axes(graph: Graph, symbol: str) -> PositionAxes:
    axes: dict[str, int | None] = {}
    try:
        for v in graph.inputs:
            named = _named(v, symbol)
            axes[v.name] = _axis(v, symbol, named[0] if len(named) == 1 else None)
        for op in graph.ops:
            given = tuple(axes[o.name] for o in op.operands)
            mentions = _mentions(op.result, symbol)
            if all(a is None for a in given) and not mentions:
                axes[op.result.name] = None
                continue
            definition = op_def(op.kind)
            rule = definition.positions if definition is not None else None
            if rule is None and definition is not None and definition.pointwise:
                rule = _pointwise if definition.fusion == Pattern.ELEMENTWISE else _FIRST_ONLY
            if rule is None:
                raise unpositional(op, "it has no positions rule")
            axes[op.result.name] = _axis(op.result, symbol, rule(op, given))
            if axes[op.result.name] is None and any(a is not None for a in given):
                raise unpositional(op, "its result has no positions")
    except Unpositional as e:
        return PositionAxes(why=str(e))
    inputs = {v.name: a for v in graph.inputs if (a := axes[v.name]) is not None}
    outputs = {i: a for i, v in enumerate(graph.outputs) if (a := axes[v.name]) is not None}
    return PositionAxes(inputs, outputs)


def _mentions(value: Value, symbol: str) -> bool:
    return any(isinstance(d, Sym) and symbol in d.symbols for d in value.type.shape)


def _named(value: Value, symbol: str) -> list[int]:
    """The axes whose extents name the symbol."""
    return [a for a, d in enumerate(value.type.shape) if isinstance(d, Sym) and symbol in d.symbols]


def _axis(value: Value, symbol: str, axis: int | None) -> int | None:
    """`axis` where the value's extent there is the symbol itself and no other extent names
    it; None where none does; else Unpositional."""
    shape = value.type.shape
    named = _named(value, symbol)
    plain = axis is not None and shape[axis] == Sym.named(symbol)
    if named != ([axis] if plain else []):
        shown = "x".join(str(d) for d in shape)
        raise Unpositional(
            f"%{value.name} ({shown}) holds {{{symbol}}} other than as one axis of positions"
        )
    return axis if plain else None


# A broadcast op (bias_add, batch_norm): its parameters broadcast along the first operand's
# axes and carry no positions.
_FIRST_ONLY = positions_of_first(lambda op: ())


def _pointwise(op, given: tuple[int | None, ...]) -> int | None:
    """Elementwise (numpy-broadcast) operands: each one's positions at the result's axis that
    its axis aligns with, all the same."""
    rank = len(op.result.type.shape)
    aligned = {
        a + rank - len(o.type.shape)
        for o, a in zip(op.operands, given, strict=True)
        if a is not None
    }
    if len(aligned) > 1:
        raise unpositional(op, "operands' positions do not align")
    return aligned.pop() if aligned else None
