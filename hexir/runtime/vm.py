"""A program with control flow: straight-line stretches of a model, each a graph compiled to a
module, between `If` and `Loop` steps that the program runs itself.

    program = import_program("model_with_loops.onnx")      # hexir/frontend/onnx_program.py
    compiled = program.compile("cpu")
    outputs = compiled.run({"trip_count": np.array(5), "cond": np.array(True), "y": y})

A program's steps, run in order over an environment of named arrays (its inputs first):
- `Run(graph, inputs, outputs)`: the graph's module on those values, its outputs bound to
  `outputs` (a graph with symbolic dimensions runs at its inputs' sizes: a SymbolicModule);
  where its graph needs the values of some small inputs as constants (a Slice's starts, a
  Resize's scales: `bound`), it is made and compiled for each distinct value of them as they
  come;
- `If(cond, then, else_, outputs)`: one of two programs, by a bool scalar; each reads what it
  needs of the environment by name and gives its outputs in order;
- `Loop(trip_count, cond, carried, body, outputs)`: ONNX's loop: the body runs while the
  iteration count is below `trip_count` (when given) and its condition holds (when given),
  taking (iteration, condition, carried values...) and giving (condition, carried values...,
  scan values...); the loop's outputs are the last carried values, then each scan value of
  every iteration stacked on a new first axis.
Names the environment does not hold are an error naming them. This is the VM's first form:
the program runs from Python between its compiled modules, and the artifact format does not
carry it yet (issue 16).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from hexir.errors import HexirError
from hexir.ir.graph import Graph
from hexir.runtime.target import Target

__all__ = ["CompiledProgram", "If", "Loop", "Program", "Run"]


@dataclass(frozen=True)
class Run:
    """A graph over named values. Where importing it needed some of its inputs' values (a
    Slice's starts, a Reshape's shape: `bound`), `graph` is None and `make(values)` gives the
    graph with those values as constants, made and compiled once per distinct values."""

    graph: Graph | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    bound: tuple[str, ...] = ()
    make: Callable[[dict[str, np.ndarray]], Graph] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class If:
    cond: str
    then: Program
    else_: Program
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Loop:
    trip_count: str | None
    cond: str | None
    carried: tuple[str, ...]
    body: Program
    outputs: tuple[str, ...]


Step = Union[Run, If, Loop]


@dataclass(frozen=True)
class Program:
    """Steps over named values: `inputs` bound first (a body's formal inputs), `outputs` read
    last; a step may read any name an enclosing program holds."""

    inputs: tuple[str, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]
    name: str = "program"

    def compile(self, target: Target | str = "cpu", database: object = None) -> CompiledProgram:
        """Each Run's graph compiled for `target` (nested programs too)."""
        return CompiledProgram(self, Target.of(target), database)


@dataclass
class CompiledProgram:
    program: Program
    target: Target
    database: object = None
    # Each Run's module by (step, its bound inputs' values): a plain step's, compiled here;
    # a bound step's, compiled as each new value comes.
    _modules: dict[tuple, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def visit(program: Program) -> None:
            for step in program.steps:
                if isinstance(step, Run):
                    if step.graph is not None:
                        self._module(step, {})
                elif isinstance(step, If):
                    visit(step.then)
                    visit(step.else_)
                else:
                    visit(step.body)

        visit(self.program)

    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The program's outputs on its inputs (a list in order or a dict by name)."""
        names = self.program.inputs
        if not isinstance(inputs, Mapping):
            if len(inputs) != len(names):
                raise HexirError(
                    f"{self.program.name} takes {len(names)} inputs, got {len(inputs)}"
                )
            inputs = dict(zip(names, inputs, strict=True))
        missing = [n for n in names if n not in inputs]
        if missing:
            raise HexirError(f"{self.program.name} needs inputs {', '.join(missing)}")
        return self._run(self.program, {n: np.asarray(a) for n, a in inputs.items()})

    def _run(self, program: Program, env: dict[str, np.ndarray]) -> list[np.ndarray]:
        env = dict(env)
        for step in program.steps:
            if isinstance(step, Run):
                module, inputs = self._module(step, env)
                outs = module.run([_get(env, n) for n in inputs])  # type: ignore[attr-defined]
                env.update(zip(step.outputs, outs, strict=True))
            elif isinstance(step, If):
                branch = step.then if bool(_get(env, step.cond)) else step.else_
                env.update(zip(step.outputs, self._run(branch, env), strict=True))
            else:
                env.update(zip(step.outputs, self._loop(step, env), strict=True))
        return [_get(env, n) for n in program.outputs]

    def _module(self, step: Run, env: Mapping[str, np.ndarray]) -> tuple[object, tuple[str, ...]]:
        """The step's module and the inputs it takes: for a step with bound inputs, the one
        made for their values in `env` (made and compiled on their first run)."""
        from hexir.runtime.executor import compile

        values = {n: np.asarray(_get(env, n)) for n in step.bound}
        key = (id(step), *((v.dtype.str, v.shape, v.tobytes()) for v in values.values()))
        if key not in self._modules:
            graph = step.graph if step.graph is not None else step.make(values)  # type: ignore[misc]
            self._modules[key] = compile(graph, self.target, self.database)  # type: ignore[arg-type]
        return self._modules[key], tuple(n for n in step.inputs if n not in step.bound)

    def _loop(self, step: Loop, env: dict[str, np.ndarray]) -> list[np.ndarray]:
        trips = int(_get(env, step.trip_count)) if step.trip_count else None
        going = bool(_get(env, step.cond)) if step.cond else True
        carried = [_get(env, n) for n in step.carried]
        scans: list[list[np.ndarray]] = []
        body = step.body
        iteration, condition, *formal = body.inputs
        i = 0
        while going and (trips is None or i < trips):
            inner = {**env, iteration: np.array(i, np.int64), condition: np.array(going)}
            inner.update(zip(formal, carried, strict=True))
            cond_out, *rest = self._run(body, inner)
            going = bool(cond_out)
            carried = rest[: len(carried)]
            scans.append(rest[len(carried) :])
            i += 1
        count = len(step.outputs) - len(carried)
        if not scans and count:
            raise HexirError("a Loop with scan outputs ran no iteration: their shapes are unknown")
        stacked = [np.stack([s[k] for s in scans]) for k in range(count)]
        return [*carried, *stacked]


def _get(env: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    try:
        return env[name]
    except KeyError:
        raise HexirError(f"the program reads {name!r}, which nothing before it defines") from None
