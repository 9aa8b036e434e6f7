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
- `Call(builtin, inputs, outputs, attrs)`: one of the VM's builtins (`BUILTINS`) on those
  values: small host computations between modules (an argmax, a cast) and the operations of
  runtime objects a program is given as inputs, such as a `PagedKVCache` (hexir/runtime/
  kv_cache.py): its pools, a block table, appending a step's keys and values. A builtin that
  updates an object does so in place: a KV cache's pools, which the next Run reads.
Names the environment does not hold are an error naming them. The program is interpreted
from Python; each Run is one call of a compiled module (on the CPU, one native call for its
whole command list). `CompiledProgram.save(path)` writes the program and its modules as one
artifact (hexir/runtime/artifact.py) and `hexir.runtime.load` gives it back; a program whose
steps are made per value (`bound`) or run at their inputs' sizes (symbolic dimensions) is
compiled as it runs, so it has no artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from hexir.errors import HexirError
from hexir.ir.graph import Graph
from hexir.runtime.target import Target

__all__ = ["BUILTINS", "Call", "CompiledProgram", "If", "Loop", "Program", "Run"]


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


@dataclass(frozen=True)
class Call:
    """`BUILTINS[builtin](inputs, attrs)`, its results bound to `outputs`."""

    builtin: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    attrs: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.builtin not in BUILTINS:
            raise HexirError(
                f"unknown VM builtin {self.builtin!r}; the builtins are "
                f"{', '.join(sorted(BUILTINS))}"
            )


Step = Union[Run, If, Loop, Call]


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

    def runs(self) -> list[Run]:
        """Every Run step, nested programs' too, in order."""
        found: list[Run] = []
        for step in self.steps:
            if isinstance(step, Run):
                found.append(step)
            elif isinstance(step, If):
                found += step.then.runs() + step.else_.runs()
            elif isinstance(step, Loop):
                found += step.body.runs()
        return found

    def to_json(self) -> dict[str, object]:
        """The program as JSON data, each Run as its number in `runs()` (the order
        `from_json` takes the graphs in)."""
        numbers = {id(step): i for i, step in enumerate(self.runs())}

        def step_json(step: Step) -> dict[str, object]:
            if isinstance(step, Run):
                return {
                    "run": numbers[id(step)],
                    "inputs": list(step.inputs),
                    "outputs": list(step.outputs),
                }
            if isinstance(step, If):
                return {
                    "if": step.cond,
                    "then": program_json(step.then),
                    "else": program_json(step.else_),
                    "outputs": list(step.outputs),
                }
            if isinstance(step, Loop):
                return {
                    "loop": {
                        "trip_count": step.trip_count,
                        "cond": step.cond,
                        "carried": list(step.carried),
                        "body": program_json(step.body),
                    },
                    "outputs": list(step.outputs),
                }
            return {
                "call": step.builtin,
                "inputs": list(step.inputs),
                "outputs": list(step.outputs),
                "attrs": dict(step.attrs),
            }

        def program_json(program: Program) -> dict[str, object]:
            return {
                "name": program.name,
                "inputs": list(program.inputs),
                "steps": [step_json(s) for s in program.steps],
                "outputs": list(program.outputs),
            }

        return program_json(self)

    @staticmethod
    def from_json(data: Mapping, graphs: Sequence[Graph]) -> Program:
        """The program `to_json` wrote, its Runs over `graphs` by number."""

        def names(key: str, d: Mapping = data) -> tuple[str, ...]:
            return tuple(str(n) for n in d[key])

        def step(d: Mapping) -> Step:
            if "run" in d:
                return Run(graphs[int(d["run"])], names("inputs", d), names("outputs", d))
            if "if" in d:
                then, else_ = (Program.from_json(d[k], graphs) for k in ("then", "else"))
                return If(str(d["if"]), then, else_, names("outputs", d))
            if "loop" in d:
                loop = d["loop"]
                return Loop(
                    loop["trip_count"],
                    loop["cond"],
                    names("carried", loop),
                    Program.from_json(loop["body"], graphs),
                    names("outputs", d),
                )
            attrs = tuple(sorted(dict(d.get("attrs", {})).items()))
            return Call(str(d["call"]), names("inputs", d), names("outputs", d), attrs)

        return Program(
            names("inputs"),
            tuple(step(d) for d in data["steps"]),
            names("outputs"),
            str(data.get("name", "program")),
        )


@dataclass
class CompiledProgram:
    program: Program
    target: Target
    database: object = None
    # Each Run's module by (step, its bound inputs' values): a plain step's, compiled here
    # (unless given, as `hexir.runtime.load` gives them); a bound step's, compiled as each
    # new value comes.
    _modules: dict[tuple, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for step in self.program.runs():
            if step.graph is not None:
                self._module(step, {})

    @staticmethod
    def of_modules(program: Program, target: Target, modules: Sequence[object]) -> CompiledProgram:
        """`program` with its Runs' modules given, in `program.runs()` order."""
        runs = program.runs()
        return CompiledProgram(
            program,
            target,
            None,
            {(id(step),): module for step, module in zip(runs, modules, strict=True)},
        )

    def modules(self) -> list[object]:
        """Each Run's module in `program.runs()` order; a HexirError naming the step where a
        Run has no one module (made per value of its inputs, or per size of its symbols)."""
        from hexir.runtime.module import Module

        found = []
        for step in self.program.runs():
            module = self._modules.get((id(step),))
            if step.graph is None or not isinstance(module, Module):
                why = (
                    f"reads the values of {', '.join(step.bound)} as constants"
                    if step.graph is None
                    else "has symbolic dimensions"
                )
                raise HexirError(
                    f"the step computing {', '.join(step.outputs)} {why}, so it is compiled "
                    "as the program runs; an artifact holds compiled modules only"
                )
            found.append(module)
        return found

    def save(self, path: object):  # -> Path
        """Write the program and its modules as one artifact (hexir/runtime/artifact.py)."""
        from hexir.runtime.artifact import save

        return save(self, path)  # type: ignore[arg-type]

    def run(self, inputs: Sequence[object] | Mapping[str, object]) -> list[np.ndarray]:
        """The program's outputs on its inputs (a list in order or a dict by name): arrays,
        or the runtime objects its builtins take (a PagedKVCache)."""
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
        return self._run(self.program, {n: _value(a) for n, a in inputs.items()})

    def _run(self, program: Program, env: dict[str, object]) -> list:
        env = dict(env)
        for step in program.steps:
            if isinstance(step, Run):
                module, inputs = self._module(step, env)
                outs = module.run([_get(env, n) for n in inputs])  # type: ignore[attr-defined]
                env.update(zip(step.outputs, outs, strict=True))
            elif isinstance(step, If):
                branch = step.then if bool(_get(env, step.cond)) else step.else_
                env.update(zip(step.outputs, self._run(branch, env), strict=True))
            elif isinstance(step, Loop):
                env.update(zip(step.outputs, self._loop(step, env), strict=True))
            else:
                outs = BUILTINS[step.builtin]([_get(env, n) for n in step.inputs], dict(step.attrs))
                if len(outs) != len(step.outputs):
                    raise HexirError(
                        f"builtin {step.builtin} gave {len(outs)} values for "
                        f"{len(step.outputs)} names ({', '.join(step.outputs) or 'none'})"
                    )
                env.update(zip(step.outputs, outs, strict=True))
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


def _value(a: object) -> object:
    """An input as the program holds it: an array, or a runtime object as it is."""
    from hexir.runtime.kv_cache import PagedKVCache

    return a if isinstance(a, PagedKVCache) else np.asarray(a)


# --- builtins ----------------------------------------------------------------------------------
# Each takes its input values and the step's attributes and gives its output values.

Builtin = Callable[[list, dict], Sequence[object]]


def _argmax(xs: list, attrs: dict) -> list[np.ndarray]:
    """The index of each row's largest value along `axis` (default the last), int64; ties go
    to the lowest index."""
    return [np.argmax(xs[0], axis=int(attrs.get("axis", -1))).astype(np.int64)]


def sample(
    logits: np.ndarray, step: int, *, seed: int, temperature: float = 1.0, top_k: int = 0
) -> np.ndarray:
    """A token id for each row of `logits` [rows, vocab], drawn from softmax(logits /
    temperature) over the row's `top_k` largest logits (0: all of them), int64. The draw is a
    function of (seed, step) alone, so a generation with a seed is reproducible; top_k=1 is
    the argmax."""
    z = np.asarray(logits, np.float64) / temperature
    if 0 < top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[..., -top_k, None]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p, axis=-1)
    u = np.random.default_rng([seed, step]).random(z.shape[0]) * cdf[:, -1]
    picks = np.sum(cdf <= u[:, None], axis=-1)  # each row's searchsorted(side="right")
    return np.minimum(picks, z.shape[-1] - 1).astype(np.int64)


def _sample(xs: list, attrs: dict) -> list[np.ndarray]:
    """`sample` of the logits at the step given as the second input plus attr `offset`;
    attrs seed, temperature, top_k."""
    logits, step = xs
    attrs = dict(attrs)
    return [sample(logits, int(step) + int(attrs.pop("offset", 0)), **attrs)]


def _cast(xs: list, attrs: dict) -> list[np.ndarray]:
    return [np.asarray(xs[0]).astype(str(attrs["dtype"]))]


def _kv_pools(xs: list, attrs: dict) -> list[np.ndarray]:
    """A KV cache's page pools, layer by layer: keys 0, values 0, keys 1, ... (the cache's
    own arrays: `kv_append` writes into them)."""
    cache = xs[0]
    return [
        pool[layer] for layer in range(cache.keys.shape[0]) for pool in (cache.keys, cache.values)
    ]


def _kv_lengths(xs: list, attrs: dict) -> list[np.ndarray]:
    """The tokens held for each of the sequences `seqs` (int32)."""
    cache, seqs = xs
    return [cache.lengths([int(s) for s in seqs])]


def _kv_table(xs: list, attrs: dict) -> list[np.ndarray]:
    """The block table of the sequences `seqs`, `width` pages wide (int32)."""
    cache, seqs = xs
    return [cache.block_table([int(s) for s in seqs], int(attrs["width"]))]


def _kv_append(xs: list, attrs: dict) -> list[np.ndarray]:
    """One more token's keys and values for each sequence of `seqs`, given per layer (keys 0,
    values 0, keys 1, ...; each [sequences, heads, head_dim]), taking pages as they fill."""
    cache, seqs, *news = xs
    keys, values = np.stack(news[0::2], axis=1), np.stack(news[1::2], axis=1)
    for row, seq in enumerate(seqs):
        cache.append(int(seq), keys[row], values[row])
    return []


def _kv_pages_in_use(xs: list, attrs: dict) -> list[np.ndarray]:
    return [np.array(xs[0].pages_in_use, np.int64)]


BUILTINS: dict[str, Builtin] = {
    "argmax": _argmax,
    "cast": _cast,
    "kv_append": _kv_append,
    "kv_lengths": _kv_lengths,
    "kv_pages_in_use": _kv_pages_in_use,
    "kv_pools": _kv_pools,
    "kv_table": _kv_table,
    "sample": _sample,
}
