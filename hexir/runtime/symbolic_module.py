"""What `hexir.compile` makes of a graph with symbolic dimensions: one module that runs the
graph at any sizes of its symbols.

    graph: input_ids: tensor<{seq}xi64> -> logits: tensor<{seq}x50257xf32>, ...
    module = hexir.compile(graph)
    module.run([ids17])                # seq = 17: runs the module compiled for 32
    module.run([ids30])                # seq = 30: the same module
    module.run([ids200])               # seq = 200: the module for 256
    module.specializations             # {(("seq", 32),): Module, (("seq", 256),): Module}

Each run reads the symbols' sizes from its inputs' shapes (hexir/graph/specialize.py). Where
the graph is prefix-closed in a symbol (hexir/graph/buckets.py: no result at a position
reads a later position — a transformer's prompt under causal attention), the inputs are
padded along that symbol's positions up to the size's bucket (`bucket`: powers of two up to
128, then multiples of 128), their last position repeated, the bucket's module runs, and
the outputs are cut back to the real size: one set of kernels serves a bucket of lengths.
A symbol the graph reads across (a mean over it, a concat along it) runs at its exact
sizes. Each size the module runs at is compiled on its first run there: the graph
specialized, then `hexir.compile` as for any graph (the database's records for those
workloads, which are the bucket's, else default schedules; kernels from the build cache).
Kernels of symbolic extents, compiled once for every size, are the other way to run such a
graph: `hexir.compile(graph, dynamic=True)`, a DynamicModule (hexir/runtime/dynamic_module.py),
which runs its own contractions through SymbolicModules of their groups. A SymbolicModule is
not saved as an artifact: save a specialization (or the DynamicModule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hexir.errors import ArtifactError
from hexir.graph.buckets import bucket, position_axes
from hexir.graph.evaluate import input_sizes, inputs_by_name
from hexir.graph.specialize import graph_symbols, specialize
from hexir.ir.graph import Graph
from hexir.runtime.target import Target

__all__ = ["SymbolicModule"]

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


class SymbolicModule:
    """A graph with symbolic dimensions, compiled per size of its symbols as it is run."""

    def __init__(
        self, graph: Graph, target: Target, database: object = None, *, buckets: bool = True
    ):
        self.graph = graph
        self.target = target
        self.database = database
        self.symbols = tuple(sorted(graph_symbols(graph)))
        self.specializations: dict[tuple[tuple[str, int], ...], object] = {}
        # Where each padded symbol's positions run (the symbols the graph is prefix-closed
        # in); `exact` says why each other symbol runs at its exact sizes.
        axes = position_axes(graph) if buckets else {}
        self.padded = {s: a for s, a in axes.items() if a.why is None}
        self.exact = {s: a.why for s, a in axes.items() if a.why is not None}
        self._pads: dict[tuple, np.ndarray] = {}  # padded inputs, kept for the next run

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
        """The specialization that runs these inputs (a padded symbol's: its bucket's)."""
        return self._bound(inputs)[0]

    def run(
        self, inputs: Inputs, *, plan: bool = True, sizes: Mapping[str, int] | None = None
    ) -> list[np.ndarray]:
        """As `Module.run`, at the sizes the inputs' shapes give the symbols; `sizes`, where
        the caller has already read them (a DynamicModule's step), saves reading them again
        (the module that runs still checks the inputs against its shapes)."""
        module, feed, cut = self._bound(inputs, sizes)
        return cut(module.run(feed, plan=plan))

    def run_timed(self, inputs: Inputs) -> tuple[list[np.ndarray], list[float]]:
        module, feed, cut = self._bound(inputs)
        outputs, times = module.run_timed(feed)
        return cut(outputs), times

    def profile(self, inputs: Inputs, *, repeats: int = 10, warmup: int = 2):
        module, feed, _ = self._bound(inputs)
        return module.profile(feed, repeats=repeats, warmup=warmup)

    def _bound(self, inputs: Inputs, sizes: Mapping[str, int] | None = None):
        """The module that runs `inputs`, the inputs it takes (padded to its buckets) and the
        function that cuts its outputs back to the inputs' sizes."""
        if sizes is None:
            sizes = input_sizes(self.graph, inputs)
        else:
            sizes = {s: sizes[s] for s in self.symbols}
        if not self.padded:
            return self.specialized(sizes), inputs, lambda outputs: outputs
        run_at = {s: bucket(n) if s in self.padded else n for s, n in sizes.items()}
        arrays = inputs_by_name(self.graph, inputs)
        feed = [np.asarray(arrays[v.name]) for v in self.graph.inputs]
        for s, axes in self.padded.items():
            for i, v in enumerate(self.graph.inputs):
                if (a := axes.inputs.get(v.name)) is not None and run_at[s] > sizes[s]:
                    feed[i] = self._padded(i, feed[i], a, run_at[s])

        def cut(outputs: list[np.ndarray]) -> list[np.ndarray]:
            outputs = list(outputs)
            for s, axes in self.padded.items():
                for i, a in axes.outputs.items():
                    if outputs[i].shape[a] != sizes[s]:
                        index = (slice(None),) * a + (slice(0, sizes[s]),)
                        outputs[i] = np.ascontiguousarray(outputs[i][index])
            return outputs

        return self.specialized(run_at), feed, cut

    def _padded(self, i: int, array: np.ndarray, axis: int, size: int) -> np.ndarray:
        """Input `i` padded to `size` along `axis`, its last position repeated, in a buffer
        kept for the next run of that shape (a fresh one a run faults its pages in)."""
        shape = array.shape[:axis] + (size,) + array.shape[axis + 1 :]
        out = self._pads.get(key := (i, shape, array.dtype.str))
        if out is None:
            out = self._pads[key] = np.empty(shape, array.dtype)
        n, head = array.shape[axis], (slice(None),) * axis
        out[head + (slice(0, n),)] = array
        out[head + (slice(n, size),)] = array[head + (slice(n - 1, n),)]
        return out

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
        padded = f"; padded to buckets: {', '.join(self.padded)}" if self.padded else ""
        return (
            f"SymbolicModule @{self.graph.name} on {self.target}: symbols "
            f"{', '.join(self.symbols)}{padded}; compiled for {sizes or 'no sizes yet'}"
        )
