"""Constant folding: every op computed from constants alone becomes a constant.

    %w = hexir.constant @w : tensor<256x784xf32>
    %0 = hexir.transpose %w {perm = [1, 0]} : tensor<784x256xf32>
    %1 = hexir.matmul %x, %0 : tensor<64x256xf32>
  becomes
    %0 = hexir.constant @0 : tensor<784x256xf32>
    %1 = hexir.matmul %x, %0 : tensor<64x256xf32>

The values come from the numpy semantics (`hexir.graph.evaluate`), never from a backend.
A folded op keeps its result value, so its users and the graph outputs need no rewriting;
its data is named after that value (with a suffix if the name is taken), so the text form
prints a small folded constant inline as `%0 = hexir.constant dense<...>`.
"""

from __future__ import annotations

import numpy as np

from hexir.graph.evaluate import constant_array, evaluate_op
from hexir.ir.graph import ConstantData, Graph, Op

__all__ = ["fold_constants"]


def fold_constants(graph: Graph) -> Graph:
    """Fold every op whose operands are all (transitively) constants, but one whose result's
    shape is symbolic (an `arange` to a prompt's length: a size known at run time); drop
    unused constants."""
    data: dict[str, np.ndarray] = {}  # result name -> value, for every constant-valued result
    taken = {name for name, _ in graph.constants}
    new_data: list[tuple[str, ConstantData]] = []
    ops: list[Op] = []
    for op in graph.ops:
        if op.kind == "constant":
            data[op.result.name] = constant_array(graph, op)
            ops.append(op)
        elif all(v.name in data for v in op.operands) and not op.result.type.symbolic:
            value = evaluate_op(op, [data[v.name] for v in op.operands])
            data[op.result.name] = value
            name = _fresh(op.result.name, taken)
            new_data.append((name, ConstantData(value)))
            ops.append(_constant_op(op, name))
        else:
            ops.append(op)
    return _drop_unused(graph, ops, [*graph.constants, *new_data])


def _constant_op(op: Op, name: str) -> Op:
    return Op("hexir.constant", (), op.result, (("name", name),), op.placement)


def _fresh(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _drop_unused(graph: Graph, ops: list[Op], constants: list[tuple[str, ConstantData]]) -> Graph:
    used = {v.name for op in ops for v in op.operands} | {v.name for v in graph.outputs}
    kept = [op for op in ops if op.kind != "constant" or op.result.name in used]
    referenced = {str(op.attr("name")) for op in kept if op.kind == "constant"}
    blobs = tuple((k, d) for k, d in constants if k in referenced)
    return Graph(graph.name, graph.inputs, tuple(kept), graph.outputs, blobs)
