"""Run a whole graph: fold its constants, lower each op to a kernel, call them in order.

    module = hexir.compile(graph, target="cpu")
    outputs = module.run([x])          # or module.run({"x": x})

The module holds a flat, static command list: (kernel, argument value names), with the
constants embedded. One op is one kernel (fusion comes with the whole-models work).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hexir.errors import HexirError
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph, Value
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target


@dataclass(frozen=True)
class Command:
    """Call `kernel` on the arrays named `args` (inputs first, the result last)."""

    kernel: int
    args: tuple[str, ...]


class Module:
    """A compiled graph: kernels, the command list that calls them, and the constants."""

    def __init__(
        self,
        graph: Graph,
        target: Target,
        kernels: list,
        commands: list[Command],
        constants: dict[str, np.ndarray],
    ):
        self.graph = graph
        self.target = target
        self.kernels = kernels
        self.commands = commands
        self.constants = constants

    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run the graph on numpy inputs (a list in graph order, or a dict by name)."""
        env: dict[str, np.ndarray] = dict(self.constants)
        env.update(_bind_inputs(self.graph, inputs))
        types = {op.result.name: op.result.type for op in self.graph.ops}
        for command in self.commands:
            result = types[command.args[-1]]
            out = np.empty(result.shape, dtype=numpy_dtype(result.dtype))
            env[command.args[-1]] = out
            self.kernels[command.kernel](*(env[name] for name in command.args[:-1]), out)
        return [env[v.name] for v in self.graph.outputs]

    def __repr__(self) -> str:
        lines = [f"Module @{self.graph.name} on {self.target}: {len(self.kernels)} kernels"]
        for c in self.commands:
            lines.append(f"  {self.kernels[c.kernel].func.name}({', '.join(c.args)})")
        return "\n".join(lines)


def compile(graph: Graph, target: Target | str = "cpu", database: object = None) -> Module:
    """Compile `graph` for `target`: constants folded, one kernel per remaining op.

    `database` is accepted for the API of DESIGN.md §9; tuned schedules are applied once the
    tuning database exists. Identical kernels (same lowered function) are built once.
    """
    from hexir.graph.fold import fold_constants
    from hexir.graph.lower import lower_op
    from hexir.runtime.build import build

    target = target if isinstance(target, Target) else Target(target)
    graph = fold_constants(graph)
    kernels: list = []
    index: dict[PrimFunc, int] = {}
    commands: list[Command] = []
    for op in graph.ops:
        if op.name == "hexir.constant":
            continue
        func = lower_op(op)
        if func not in index:
            index[func] = len(kernels)
            kernels.append(build(func, target))
        args = tuple(v.name for v in op.operands) + (op.result.name,)
        commands.append(Command(index[func], args))
    constants = {op.result.name: graph.constant(str(op.attr("name"))) for op in graph.ops
                 if op.name == "hexir.constant"}  # fmt: skip
    return Module(graph, target, kernels, commands, constants)


def _bind_inputs(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    if isinstance(inputs, Mapping):
        missing = [v.name for v in graph.inputs if v.name not in inputs]
        if missing:
            raise HexirError(f"graph @{graph.name}: missing inputs {', '.join(missing)}")
        arrays = [inputs[v.name] for v in graph.inputs]
    else:
        arrays = list(inputs)
        if len(arrays) != len(graph.inputs):
            raise HexirError(
                f"graph @{graph.name} takes {len(graph.inputs)} inputs, got {len(arrays)}"
            )
    return {v.name: _check_input(v, a) for v, a in zip(graph.inputs, arrays)}


def _check_input(value: Value, array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    want = numpy_dtype(value.type.dtype)
    if array.shape != value.type.shape or array.dtype != want:
        raise HexirError(
            f"input %{value.name} must be {want} of shape {value.type.shape}, "
            f"got {array.dtype} of shape {array.shape}"
        )
    return np.ascontiguousarray(array)
