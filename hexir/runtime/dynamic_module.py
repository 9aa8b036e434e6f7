"""A graph with symbolic dimensions compiled once: `hexir.compile(graph, dynamic=True)`.

    module = hexir.compile(graph, dynamic=True)      # a DynamicModule
    module.run([x17]); module.run([x200])           # the same kernels, no compile between
    module.steps                                    # per fusion group, how it runs
    module.slots                                    # the memory plan over symbolic sizes

The graph is simplified, laid out and partitioned once, at its symbols' names, as `compile`
does at numbers (a weight whose layout depends on a size known only at run time stays as it
is), and each fusion group becomes a step:
- **kernel**: the group lowered at symbolic sizes to one kernel, compiled once; the sizes are
  its arguments, read from the arrays it is given (hexir/runtime/kernel.py checks them). Its
  schedule is the default schedule of symbolic kernels (rows in parallel, the row vectorized).
- **buckets**: a group with a contraction (a block that reuses what it reads: a matmul, a
  conv, attention), where the speed of a tiled kernel needs fixed sizes, runs as a
  `SymbolicModule` of its own (its inputs padded to the bucket of each size, its outputs cut
  back: hexir/graph/buckets.py), compiled on the first run in each bucket, with the weights
  laid out and the database's records, as any graph. So does a group that does not lower at
  symbolic sizes (an op that needs a number where a symbol stands); a group that reads across
  a symbol's positions runs at the exact sizes instead.
- **view**: a lone reshape, its operand's storage under the shape evaluated at run time.

**Memory.** A plan over symbolic sizes, made once: each intermediate a kernel step writes
gets a slot, and two intermediates share a slot when one is dead (no later step reads it or
a view of it) before the other is written. Each run evaluates every intermediate's shape at
the sizes its inputs give (the shape functions: the values' symbolic types), sizes each slot
to its largest member, and places the slots one after another in an arena, a buffer kept from
one run to the next and grown when a run needs more; bucketed steps return arrays of their
own. Outputs are fresh arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hexir.errors import HexirError
from hexir.graph.evaluate import inputs_by_name
from hexir.graph.specialize import graph_symbols, symbol_sizes
from hexir.ir.dtype import itemsize, numpy_dtype
from hexir.ir.graph import Graph, Value
from hexir.ir.symbolic import Dim, SymbolicError, format_dim, shape_at
from hexir.runtime.target import Target

__all__ = ["DynamicModule"]

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]
ALIGNMENT = 64  # bytes between slots in the arena


@dataclass(frozen=True)
class Step:
    """One fusion group: `how` it runs ("kernel", "buckets", "exact" or "view"), the values
    it reads (`inputs`, constants included) and writes (`outputs`), and what runs it (a
    CpuKernel, a SymbolicModule; None for a view)."""

    how: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    runner: object = None


class DynamicModule:
    """A graph with symbolic dimensions, compiled once for every size of them (see the
    module docstring)."""

    def __init__(self, graph: Graph, target: Target | str = "cpu", database: object = None):
        from hexir.graph.fusion import compiled_graph, is_view, partition

        self.graph = graph
        self.target = Target.of(target)
        if self.target.kind != "cpu":
            raise HexirError(
                f"a dynamic module runs on the CPU (kernels of symbolic extents), not on "
                f"{self.target}; compile without dynamic=True to run per size"
            )
        self.database = database
        self._compiled(compiled_graph(graph, self.target))
        self.steps = [self._step(group, is_view(group)) for group in partition(self.compiled)]
        self._planned()

    @classmethod
    def of_steps(
        cls, compiled: Graph, target: Target, steps: list[Step], database: object = None
    ) -> DynamicModule:
        """A module of steps already made (an artifact's, hexir/runtime/artifact.py): its
        graph is the compiled one, whose inputs and outputs are the original graph's."""
        module = cls.__new__(cls)
        module.graph, module.target, module.database = compiled, target, database
        module._compiled(compiled)
        module.steps = steps
        module._planned()
        return module

    def _compiled(self, compiled: Graph) -> None:
        """What the module reads of its compiled graph: its symbols, values and constants."""
        self.compiled = compiled
        self.symbols = tuple(sorted(graph_symbols(compiled)))
        self.values = _values(compiled)
        self.constants = compiled.constant_arrays()
        self._constant_ops = {op.result.name: op for op in compiled.ops if op.kind == "constant"}

    def _planned(self) -> None:
        self.slots, self.slot_of = _plan(self.steps, {v.name for v in self.compiled.outputs})
        self._arena = np.empty(0, np.uint8)

    # -- compiling ------------------------------------------------------------------------

    def _step(self, group, view: bool) -> Step:  # group: hexir.graph.fusion.Group
        inputs = tuple(v.name for v in group.inputs)
        outputs = tuple(v.name for v in group.outputs)
        name = "_".join(op.kind for op in group.ops)
        if view:
            return Step("view", name, inputs, outputs)
        sub = self._group_graph(group)
        kernel = self._kernel(sub)
        if kernel is not None:
            from hexir.runtime.executor import _bind_group

            args = _bind_group(sub, kernel.func).args  # lower's order: inputs, constants, outputs
            reads = args[: len(args) - len(outputs)]
            return Step("kernel", kernel.func.name, reads, args[len(reads) :], kernel)
        from hexir.runtime.symbolic_module import SymbolicModule

        module = SymbolicModule(sub, self.target, self.database)
        how = "buckets" if module.padded and not module.exact else "exact"
        runs = tuple(v.name for v in sub.inputs)  # the constants are the group graph's own
        return Step(how, name, runs, outputs, module)

    def _kernel(self, sub: Graph):  # -> CpuKernel | None
        """The group as one kernel of symbolic extents; None where an op does not lower so,
        or where the kernel contracts (a block reuses what it reads: its tiles need sizes)."""
        from hexir.graph.lower import lower
        from hexir.runtime.build import build
        from hexir.runtime.default_schedule import default_schedule
        from hexir.schedule.common import all_blocks
        from hexir.search.analysis import has_reuse

        try:
            func = lower(sub)
        except HexirError:
            return None
        if any(has_reuse(block) for block in all_blocks(func.body)):
            return None
        return build(default_schedule(func, self.target).func, self.target)

    def _group_graph(self, group) -> Graph:
        """The group as a graph of its own: its non-constant inputs, then its constants as
        constant ops (so that a bucketed group lays its weights out), then its ops."""
        constant_ops = self._constant_ops
        used = [constant_ops[v.name] for v in group.inputs if v.name in constant_ops]
        names = {str(op.attr("name")) for op in used}
        data = tuple((k, d) for k, d in self.compiled.constants if k in names)
        inputs = tuple(v for v in group.inputs if v.name not in constant_ops)
        return Graph("group", inputs, (*used, *group.ops), group.outputs, data)

    # -- running --------------------------------------------------------------------------

    def run(self, inputs: Inputs, *, plan: bool = True) -> list[np.ndarray]:
        """The graph's outputs on `inputs` (a list in graph order or a dict by name), at the
        sizes their shapes give the symbols; fresh output arrays. `plan=False` gives every
        value a buffer of its own (for checking the plan: the same results)."""
        given = inputs_by_name(self.graph, inputs)
        sizes = symbol_sizes(self.graph, {name: a.shape for name, a in given.items()})
        env: dict[str, np.ndarray] = dict(self.constants)
        env.update((v.name, np.ascontiguousarray(given[v.name])) for v in self.graph.inputs)
        storage = self._slots_at(sizes) if plan else None
        for step in self.steps:
            if step.how == "view":
                (src,), (dst,) = step.inputs, step.outputs
                env[dst] = env[src].reshape(self._shape(dst, sizes))
            elif step.how == "kernel":
                outs = [self._buffer(name, sizes, storage) for name in step.outputs]
                step.runner(*(env[n] for n in step.inputs), *outs, sizes=sizes)  # type: ignore[operator]
                env.update(zip(step.outputs, outs, strict=True))
            else:  # a SymbolicModule of the group's, its bucket's or its exact sizes'
                group = step.runner.run([env[n] for n in step.inputs], sizes=sizes)  # type: ignore[attr-defined]
                env.update(zip(step.outputs, group, strict=True))
        return [np.array(env[v.name]) for v in self.compiled.outputs]

    def _shape(self, name: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """A value's shape at these sizes: its symbolic type evaluated (its shape function)."""
        return shape_at(self.values[name].type.shape, sizes)

    def _buffer(
        self, name: str, sizes: Mapping[str, int], storage: dict[int, np.ndarray] | None
    ) -> np.ndarray:
        dtype = numpy_dtype(self.values[name].type.dtype)
        shape = self._shape(name, sizes)
        slot = self.slot_of.get(name)
        if storage is None or slot is None:  # a graph output, or unplanned: its own
            return np.empty(shape, dtype)
        count = int(np.prod(shape, dtype=np.int64))
        return storage[slot][: count * dtype.itemsize].view(dtype).reshape(shape)

    def _slots_at(self, sizes: Mapping[str, int]) -> dict[int, np.ndarray]:
        """Each slot's bytes in the arena at these sizes (the arena grown if it must)."""
        nbytes, offsets, total = self._layout(sizes)
        if self._arena.nbytes < total + ALIGNMENT:
            self._arena = np.empty(total + ALIGNMENT, np.uint8)
        base = -self._arena.ctypes.data % ALIGNMENT
        return {
            k: self._arena[base + o : base + o + n]
            for k, (o, n) in enumerate(zip(offsets, nbytes, strict=True))
        }

    def _layout(self, sizes: Mapping[str, int]) -> tuple[list[int], list[int], int]:
        """(each slot's bytes, its offset in the arena, the arena's bytes) at these sizes:
        each slot its largest member's bytes, the slots one after another, aligned."""
        nbytes = [max(self._nbytes(n, sizes) for n in members) for members in self.slots]
        offsets, total = [], 0
        for n in nbytes:
            offsets.append(total)
            total += -(-max(n, 1) // ALIGNMENT) * ALIGNMENT
        return nbytes, offsets, total

    def _nbytes(self, name: str, sizes: Mapping[str, int]) -> int:
        t = self.values[name].type
        return int(np.prod(self._shape(name, sizes), dtype=np.int64)) * itemsize(t.dtype)

    def arena_bytes(self, sizes: Mapping[str, int]) -> int:
        """The arena's bytes at these sizes of the symbols (the plan evaluated)."""
        return self._layout(sizes)[2]

    def save(self, path: str | Path) -> Path:
        """Write the module to `path` as one artifact (hexir/runtime/artifact.py): its kernels
        of symbolic extents, and each bucketed step's graph with the buckets compiled so far;
        loaded, it runs every size, compiling only a bucket that no run had reached."""
        from hexir.runtime.artifact import save

        return save(self, path)

    def program(self) -> str:
        """The module as it runs, one line a step: each value it writes, with its shape (a
        shape function of the symbols) and, for an intermediate, its memory slot; then each
        slot's size, the largest of its members' (evaluated at every run)."""
        lines = [f"dynamic module @{self.graph.name} ({', '.join(self.symbols)})"]
        for i, step in enumerate(self.steps):
            outs = ", ".join(f"%{n}" for n in step.outputs)
            args = ", ".join(f"%{n}" for n in step.inputs if n not in self.constants)
            where = [
                f"%{n}: {'x'.join(map(format_dim, self.values[n].type.shape))}"
                + (f" @slot{self.slot_of[n]}" if n in self.slot_of else "")
                for n in step.outputs
            ]
            lines.append(
                f"  {i:>3}  {step.how:<7} {outs} = {step.name}({args})  {'; '.join(where)}"
            )
        for k, members in enumerate(self.slots):
            sizes = ", ".join(self._bytes(n) for n in members)
            lines.append(f"  slot{k}: max({sizes}) bytes")
        return "\n".join(lines)

    def _bytes(self, name: str) -> str:
        """A value's bytes as an expression of the symbols."""
        t = self.values[name].type
        total: Dim = itemsize(t.dtype)
        try:
            for d in t.shape:
                total = total * d
        except SymbolicError:  # a product of two symbols: written out
            return "*".join([str(itemsize(t.dtype)), *(str(d) for d in t.shape)])
        return str(total)

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[step.how] = counts.get(step.how, 0) + 1
        how = ", ".join(f"{n} {k}" for k, n in counts.items())
        return (
            f"DynamicModule @{self.graph.name} on {self.target}: symbols "
            f"{', '.join(self.symbols)}; steps: {how}; {len(self.slots)} memory slots"
        )


def _values(graph: Graph) -> dict[str, Value]:
    found = {v.name: v for v in graph.inputs}
    found.update((op.result.name, op.result) for op in graph.ops)
    return found


def _plan(steps: list[Step], outputs: set[str]) -> tuple[list[list[str]], dict[str, int]]:
    """Slots of the intermediates kernel steps write (not graph outputs): (each slot's
    members, the slot of each), a value sharing a slot whose members are all dead before the
    step that writes it. A view keeps its operand alive as long as itself."""
    root: dict[str, str] = {}  # a view -> the value whose storage it is
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.how == "view":
            root[step.outputs[0]] = root.get(step.inputs[0], step.inputs[0])
        for name in step.inputs:
            last[root.get(name, name)] = i
    for name in outputs:  # returned: alive to the end (a view of an intermediate too)
        last[root.get(name, name)] = len(steps)
    slots: list[list[str]] = []
    slot_of: dict[str, int] = {}
    free_at: list[int] = []  # each slot's first step after its members' last use
    for i, step in enumerate(steps):
        if step.how != "kernel":
            continue
        for name in step.outputs:  # a kernel's: storage of its own, never a view
            if name in outputs:
                continue
            end = last.get(name, i)
            k = next((k for k, f in enumerate(free_at) if f <= i), None)
            if k is None:
                slots.append([])
                free_at.append(0)
                k = len(slots) - 1
            slots[k].append(name)
            slot_of[name] = k
            free_at[k] = max(free_at[k], end + 1)
    return slots, slot_of
