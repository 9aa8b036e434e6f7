"""`hexir.reference(func_or_graph, inputs)`: numpy's answer for what a workload or a whole
graph computes.

A Graph is evaluated as it is (`hexir.graph.evaluate`), inputs in graph order or by name. A
PrimFunc made by lowering carries `("source", <hexir graph text>)` in its attrs: the graph it
computes, whose inputs are the func's input params in order and whose outputs are its outputs.
The reference parses that graph and evaluates it with the numpy semantics of every op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hexir.errors import HexirError
from hexir.graph.evaluate import evaluate
from hexir.ir.graph import Graph
from hexir.ir.tir import PrimFunc

__all__ = ["reference", "source_graph"]


def reference(
    func: PrimFunc | Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """The outputs of `func` on `inputs` (its input params, in order), computed by numpy; of a
    Graph, on its inputs in order or by name."""
    if isinstance(func, Graph):
        return evaluate(func, _in_order(func, inputs))
    if isinstance(inputs, Mapping):
        raise HexirError(f"reference of @{func.name} takes its inputs in order, not by name")
    graph = source_graph(func)
    if len(inputs) != len(graph.inputs):
        raise HexirError(
            f"reference of @{func.name} takes {len(graph.inputs)} inputs "
            f"({', '.join('%' + p.name for p in func.inputs)}), got {len(inputs)}; "
            "pass the inputs only, not the output buffers"
        )
    return evaluate(graph, inputs)


def _in_order(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    names = [v.name for v in graph.inputs]
    if not isinstance(inputs, Mapping):
        if len(inputs) != len(names):
            raise HexirError(
                f"reference of graph @{graph.name} takes {len(names)} inputs "
                f"({', '.join(names)}), got {len(inputs)}"
            )
        return list(inputs)
    missing, extra = set(names) - set(inputs), set(inputs) - set(names)
    if missing or extra:
        raise HexirError(
            f"reference of graph @{graph.name} takes inputs {', '.join(names)}; missing: "
            f"{', '.join(sorted(missing)) or 'none'}; unknown: {', '.join(sorted(extra)) or 'none'}"
        )
    return [inputs[n] for n in names]


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
