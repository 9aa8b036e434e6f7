"""`hexir.reference(func, inputs)`: numpy's answer for what a workload computes.

A PrimFunc made by lowering carries `("source", <hexir graph text>)` in its attrs: the graph it
computes, whose inputs are the func's input params in order and whose outputs are its outputs.
The reference parses that graph and evaluates it with the numpy semantics of every op.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexir.errors import HexirError
from hexir.graph.evaluate import evaluate
from hexir.ir.graph import Graph
from hexir.ir.tir import PrimFunc

__all__ = ["reference", "source_graph"]


def reference(func: PrimFunc, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of `func` on `inputs` (its input params, in order), computed by numpy."""
    graph = source_graph(func)
    if len(inputs) != len(graph.inputs):
        raise HexirError(
            f"reference of @{func.name} takes {len(graph.inputs)} inputs "
            f"({', '.join('%' + p.name for p in func.inputs)}), got {len(inputs)}; "
            "pass the inputs only, not the output buffers"
        )
    return evaluate(graph, inputs)


def source_graph(func: PrimFunc) -> Graph:
    """The graph a lowered PrimFunc computes, parsed from its `source` attr."""
    from hexir.ops.parse import parse_graph

    text = func.attr("source")
    if not isinstance(text, str):
        raise HexirError(
            f"reference needs a func produced by lowering (hexir.workload / hexir.lower), "
            f"whose attrs hold its `source` graph; @{func.name} has none"
        )
    graph = parse_graph(text)
    outputs = len(graph.outputs)
    if outputs != func.num_outputs or len(graph.inputs) != len(func.inputs):
        raise HexirError(
            f"the source graph of @{func.name} has {len(graph.inputs)} inputs and {outputs} "
            f"outputs, the func {len(func.inputs)} inputs and {func.num_outputs} outputs"
        )
    return graph
