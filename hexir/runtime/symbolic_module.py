"""What `hexir.compile` makes of a graph with symbolic dimensions: one module that runs the
graph at any sizes of its symbols.

    graph: x: tensor<1x{seq}x768xf32> -> ...
    module = hexir.compile(graph)
    module.run([x17])                  # seq = 17
    module.run([x200])                 # seq = 200
    module.specializations             # {(("seq", 17),): Module, (("seq", 200),): Module}

Each run reads the symbols' sizes from its inputs' shapes (hexir/graph/specialize.py) and
runs the module compiled for those sizes, compiling it on the first run at them: the graph
specialized, then `hexir.compile` as for any graph (the database's records for those
workloads, else default schedules; kernels from the build cache). So every size is a
separate set of kernels, each compiled once per process (and once per machine, through the
build cache); kernels with symbolic extents, one per op for every size, are the next step
(issue 16). A module with symbols is not saved as an artifact: save a specialization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hexir.errors import ArtifactError
from hexir.graph.evaluate import input_sizes
from hexir.graph.specialize import graph_symbols, specialize
from hexir.ir.graph import Graph
from hexir.runtime.target import Target

__all__ = ["SymbolicModule"]

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


class SymbolicModule:
    """A graph with symbolic dimensions, compiled per size of its symbols as it is run."""

    def __init__(self, graph: Graph, target: Target, database: object = None):
        self.graph = graph
        self.target = target
        self.database = database
        self.symbols = tuple(sorted(graph_symbols(graph)))
        self.specializations: dict[tuple[tuple[str, int], ...], object] = {}

    def specialized(self, sizes: Mapping[str, int]):  # -> Module
        """The module compiled for these sizes of the symbols (compiled on first use)."""
        from hexir.runtime.executor import compile

        key = tuple(sorted((name, int(size)) for name, size in sizes.items()))
        module = self.specializations.get(key)
        if module is None:
            concrete = specialize(self.graph, dict(key))
            module = compile(concrete, self.target, self.database)  # type: ignore[arg-type]
            self.specializations[key] = module
        return module

    def for_inputs(self, inputs: Inputs):  # -> Module
        """The specialization that runs these inputs."""
        return self.specialized(input_sizes(self.graph, inputs))

    def run(self, inputs: Inputs, *, plan: bool = True) -> list[np.ndarray]:
        """As `Module.run`, at the sizes the inputs' shapes give the symbols."""
        return self.for_inputs(inputs).run(inputs, plan=plan)

    def run_timed(self, inputs: Inputs) -> tuple[list[np.ndarray], list[float]]:
        return self.for_inputs(inputs).run_timed(inputs)

    def profile(self, inputs: Inputs, *, repeats: int = 10, warmup: int = 2):
        return self.for_inputs(inputs).profile(inputs, repeats=repeats, warmup=warmup)

    def save(self, path: object) -> None:
        raise ArtifactError(
            f"graph @{self.graph.name} has symbolic dimensions ({', '.join(self.symbols)}), "
            "and an artifact holds kernels of fixed sizes: save one specialization, "
            "module.specialized({"
            + ", ".join(f"'{s}': ..." for s in self.symbols)
            + "}).save(path)"
        )

    def __repr__(self) -> str:
        sizes = ", ".join(
            "(" + ", ".join(f"{n} = {s}" for n, s in key) + ")" for key in self.specializations
        )
        return (
            f"SymbolicModule @{self.graph.name} on {self.target}: symbols "
            f"{', '.join(self.symbols)}; compiled for {sizes or 'no sizes yet'}"
        )
