"""`hexir.compile`: a whole graph to a module that runs it.

    module = hexir.compile(graph, target="cpu", database="sqlite:///tuning_logs/hexir.db")
    outputs = module.run([x])          # or module.run({"x": x})
    module.kernels, module.commands, module.plan, module.report

The pipeline (DESIGN.md §1): simplify the graph (compile-time evaluation and exact rewrites),
lay out its constant weights (with a database, each conv that has a Winograd and a direct
form takes the one its measured kernels make faster: hexir/graph/forms.py), partition it
into fusion groups (the `fusion` knob turns fusion off), lower each group to one PrimFunc,
schedule it — the database's best record for its (workload key, target key) where
there is one and it beats the default's own records there by more than TUNED_MARGIN, else a
default schedule — build it (kernels with the same candidate key are
built once), and lay the groups out as a flat static command list whose intermediates the
memory plan places. A lone reshape is no command: it is a view, its operand's buffer under
another shape (`Module.views`), and the memory plan aliases the two.

The default schedules (hexir/runtime/default_schedule.py) are simple and never fail a compile;
a database trace that no longer replays falls back to the default too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hexir.errors import HexirError
from hexir.graph.memory import MemoryPlan
from hexir.ir.dtype import itemsize
from hexir.ir.graph import Graph, Op, Value
from hexir.ir.kept import keeping
from hexir.ir.keys import candidate_key, workload_key
from hexir.ir.tir import PrimFunc
from hexir.ops import op_def
from hexir.runtime.build_cache import cached_default_schedule, cached_replay
from hexir.runtime.module import Command, Module, TaskReport, plan_commands
from hexir.runtime.target import Target
from hexir.schedule import Trace

__all__ = [
    "Command",
    "Module",
    "TaskReport",
    "TuningDatabase",
    "compile",
    "plan_graph",
    "plan_module",
    "simplify",
]


class TuningDatabase(Protocol):
    """What `compile` needs of a tuning database (`hexir.database.Database` is one)."""

    def best(self, workload_key: str, target: Target | str, k: int = 1) -> list: ...

    def standing(self, workload_key: str, target: Target | str, candidate_key: str): ...


# How much faster than the default schedule, as the database measured both, a record must be
# for a build to take it. Picked among hundreds of candidates each timed once or twice, the
# best is the luckiest as much as the fastest (gpt2-decode's 768 -> 768 projection with its
# residual: picked at 0.0233 ms against the default's 0.0242, it ran 0.054 ms in the model
# against the default's 0.042); a gain inside the timing noise is no gain.
TUNED_MARGIN = 0.05


@dataclass(frozen=True)
class _Task:
    """One fusion group, lowered: its func and the graph values bound to its params."""

    func: PrimFunc
    args: tuple[str, ...]
    num_outputs: int
    inplace: tuple[tuple[str, str], ...]
    ops: tuple[str, ...]


def compile(
    graph: Graph,
    target: Target | str = "cpu",
    database: TuningDatabase | str | None = None,
    *,
    dynamic: bool = False,
    forms: Mapping[str, int] | None = None,
) -> Module:
    """Compile `graph` for `target` into a Module (see the module docstring for the steps).

    `database` is a URL or a database object; each kernel uses the fastest valid record of its
    workload on this target, or a default schedule where there is none. A graph with symbolic
    dimensions gives a SymbolicModule, which compiles this way per size of its symbols (per
    bucket of sizes where it can), or with `dynamic=True` a DynamicModule, compiled once: its
    kernels take the sizes as arguments (hexir/runtime/dynamic_module.py).

    `forms` gives the convs with a Winograd and a direct form theirs (result name -> tile, 0:
    direct; hexir/graph/forms.py) instead of the rule's or the database's choice: the
    default schedules of a tuned build's kernels (`hexir run --compare-default`).
    """
    from hexir.graph.specialize import graph_symbols

    target = Target.of(target)
    if graph_symbols(graph) and dynamic:  # compiled once, for every size
        from hexir.runtime.dynamic_module import DynamicModule

        return DynamicModule(graph, target, _open_database(database))  # type: ignore[return-value]
    if graph_symbols(graph):  # compiled per size of its symbols, as it runs
        from hexir.runtime.symbolic_module import SymbolicModule

        return SymbolicModule(graph, target, database)  # type: ignore[return-value]
    with keeping():  # measured_kernels keys its kernels, and so does the loop below
        return _compile(graph, target, _open_database(database), forms)


def _compile(
    graph: Graph, target: Target, db: TuningDatabase | None, forms: Mapping[str, int] | None
) -> Module:
    """`compile` of a graph of known sizes."""
    from hexir.graph.forms import measured_kernels
    from hexir.graph.fusion import fused_kernels
    from hexir.runtime.build import build_all

    if forms is not None:
        graph, kernels_of_groups = fused_kernels(graph, target, forms)
    elif db is None:
        graph, kernels_of_groups = fused_kernels(graph, target)
    else:  # each conv with two forms in the one its measured kernels make faster
        graph, kernels_of_groups = measured_kernels(graph, target, db)
    tasks = [_bind_group(group.graph(), func) for group, func in kernels_of_groups]
    to_build: list[PrimFunc] = []
    built: dict[str, int] = {}  # candidate key -> kernel index
    schedules: dict[str, tuple[PrimFunc, str, Trace]] = {}  # workload key -> its schedule
    commands: list[Command] = []
    report: list[TaskReport] = []
    for task in tasks:
        key = workload_key(task.func)
        if key not in schedules:
            schedules[key] = _schedule(task.func, key, target, db)
        func, how, trace = schedules[key]
        candidate = candidate_key(func)
        if candidate not in built:
            built[candidate] = len(to_build)
            to_build.append(func)
        commands.append(Command(built[candidate], task.args, task.num_outputs))
        report.append(TaskReport(func.name, key, how, trace, built[candidate], task.ops))
    kernels = build_all(to_build, target)
    plan = plan_module(graph, commands, [t.inplace for t in tasks])
    constants = graph.constant_arrays()
    return Module(graph, target, kernels, commands, constants, plan, tuple(report))


def simplify(graph: Graph) -> Graph:
    """The graph with constant subgraphs evaluated and exact rewrites applied."""
    from hexir.graph.rewrite import simplify_graph

    return simplify_graph(graph)


def plan_graph(graph: Graph, target: Target | str = "cpu") -> MemoryPlan:
    """The memory plan `compile` makes for `graph` on `target`, without lowering or building
    a kernel (for `hexir show MODEL --memory`): the same simplified graph, its weights laid
    out for the target (hexir.graph.layout), the same groups."""
    from hexir.graph.fusion import compiled_graph, is_view, partition

    graph = compiled_graph(graph, target)
    commands, inplace = [], []
    for group in (g for g in partition(graph) if not is_view(g)):
        args = tuple(v.name for v in (*group.inputs, *group.outputs))
        commands.append(Command(0, args, len(group.outputs)))
        inplace.append(_inplace_pairs(group.graph()))
    return plan_module(graph, commands, inplace)


def plan_module(
    graph: Graph, commands: Sequence[Command], inplace: Sequence[tuple[tuple[str, str], ...]]
) -> MemoryPlan:
    """The memory plan of a command list: its intermediates (values some command writes that
    the graph does not return) placed in a storage pool, and its views (reshapes no command
    computes) where their values are (`hexir.runtime.module.plan_commands`)."""
    return plan_commands(graph, commands, inplace)


def _open_database(database: TuningDatabase | str | None) -> TuningDatabase | None:
    if database is None or not isinstance(database, str):
        return database
    from hexir.database import Database  # SQLAlchemy loads only when a database is used

    return Database(database)


# -- lowering ---------------------------------------------------------------------------------


def _bind_group(sub: Graph, func: PrimFunc) -> _Task:
    """A fusion group's graph and the PrimFunc it lowers to, with the values bound to its
    params."""
    # lower() takes the graph's inputs, then the constants it uses in order of first use.
    constants = [op.result for op in sub.ops if op.kind == "constant"]
    used = {v.name for op in sub.ops for v in op.operands} | {v.name for v in sub.outputs}
    params = [*sub.inputs, *(v for v in constants if v.name in used), *sub.outputs]
    if len(params) != len(func.params):
        raise HexirError(
            f"lowering group {func.name} gave {len(func.params)} params for {len(params)} values"
        )
    ops = tuple(op.kind for op in sub.ops if op.kind != "constant")
    return _Task(
        func,
        tuple(v.name for v in params),
        len(sub.outputs),
        _inplace_pairs(sub),
        ops,
    )


def _inplace_pairs(sub: Graph) -> tuple[tuple[str, str], ...]:
    """(output, input) pairs the kernel may share: a kernel of pointwise ops (elementwise and
    broadcast, `OpDef.pointwise`) with one output may overwrite an input of the output's shape
    and byte size (each element is read before the same element is written, and by nothing
    else)."""
    ops = [op for op in sub.ops if op.kind != "constant"]
    if len(sub.outputs) != 1 or not ops or not all(_pointwise(op) for op in ops):
        return ()
    (out,) = sub.outputs
    return tuple((out.name, v.name) for v in sub.inputs if _same_layout(v, out))


def _pointwise(op: Op) -> bool:
    d = op_def(op.kind)
    return d is not None and d.pointwise


def _same_layout(a: Value, b: Value) -> bool:
    return a.type.shape == b.type.shape and itemsize(a.type.dtype) == itemsize(b.type.dtype)


# -- scheduling -------------------------------------------------------------------------------


def _schedule(
    func: PrimFunc, key: str, target: Target, db: TuningDatabase | None
) -> tuple[PrimFunc, str, Trace]:
    """(the scheduled func, "tuned" | "default", the trace that made it): the database's best
    record, unless the default schedule's own records there stand within TUNED_MARGIN of it."""
    default = None
    if db is not None:
        for record in db.best(key, target, k=1):
            try:
                tuned, trace = cached_replay(func, record.load_trace())
            except HexirError:
                continue  # a record that no longer replays: use the default
            default = cached_default_schedule(func, target)
            mine = db.standing(key, target, candidate_key(default[0]))
            faster = mine is None or record.median < (1 - TUNED_MARGIN) * mine.median
            if faster or mine.candidate_key == record.candidate_key:
                return tuned, "tuned", trace
    scheduled, trace = default or cached_default_schedule(func, target)
    return scheduled, "default", trace
