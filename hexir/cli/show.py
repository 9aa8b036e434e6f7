"""`hexir show MODEL|WORKLOAD`: the graph or the hextir, the fused kernels, the memory plan,
and the best (or default) schedule of each kernel as Python.

    hexir show matmul:M=64,N=64,K=64                  # the unscheduled hextir and its key
    hexir show resnet18 --kernels --memory            # the fused kernels and the memory plan
    hexir show resnet18 --forms --db URL              # each conv's Winograd or direct form
    hexir show matmul:M=1024,N=1024,K=1024 --schedule best --db URL
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hexir import knobs
from hexir.cli.common import (
    DEFAULT_DB,
    MODEL_HELP,
    add_dim_argument,
    load_subject,
    ms,
    require_database,
    resolve_target,
)
from hexir.errors import HexirError

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.ir.graph import Graph
    from hexir.ir.tir import PrimFunc
    from hexir.runtime.target import Target


def add_parser(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "show",
        parents=[parent],
        help="print a workload's hextir or a model's graph, kernels, memory plan, schedules",
        description="Print a workload's unscheduled hextir and key, or a model's graph; with "
        "--kernels its fused kernels, with --memory its memory plan, with --schedule the "
        "trace (as Python) each kernel is built with.",
    )
    p.add_argument("what", metavar="MODEL|WORKLOAD", help=MODEL_HELP)
    p.add_argument("--kernels", action="store_true", help="list the fused kernels")
    p.add_argument("--memory", action="store_true", help="print the memory plan")
    p.add_argument(
        "--forms", action="store_true",
        help="each conv with a Winograd and a direct form: both forms' best measured times in "
        "the database (--db), inside the model's runs where a tune timed them there, and the "
        "form a build takes",
    )  # fmt: skip
    p.add_argument(
        "--schedule", choices=("best", "default"),
        help="print each kernel's schedule as Python: the database's best, or the default",
    )  # fmt: skip
    p.add_argument(
        "--target", metavar="TARGET",
        help="the target of --schedule (default: cuda when a GPU is usable, else cpu)",
    )  # fmt: skip
    p.add_argument("--db", default=DEFAULT_DB, metavar="URL", help=f"default: {DEFAULT_DB}")
    add_dim_argument(p)
    p.set_defaults(handler=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    import hexir

    target = resolve_target(args.target) if args.schedule else None
    subject = load_subject(args.what, args.dim)
    if subject.func is not None:
        if target is not None:
            db = require_database(args.db) if args.schedule == "best" else None
            print_schedule(subject.func, target, db)
            return 0
        print(subject.func)
        print(f"// workload key {hexir.workload_key(subject.func)}")
        return 0
    graph = subject.model
    if not (args.kernels or args.memory or args.schedule or args.forms):
        print(graph)
    if args.kernels:
        print_kernels(graph)
    if args.memory:
        from hexir.runtime.executor import plan_graph

        print(plan_graph(graph, target or "cpu").summary())
    if args.forms:
        print_forms(graph, require_database(args.db))
    if target is not None:
        from hexir.search.scheduler import extract_tasks

        db = require_database(args.db) if args.schedule == "best" else None
        for i, task in enumerate(extract_tasks(graph, target)):
            print(f"# task {i}: @{task.name}, runs {task.weight}x, workload {task.workload_key}")
            print_schedule(task.func, target, db)
    return 0


def print_kernels(graph: Graph) -> None:
    """One line per fused kernel: its ops, output shape and workload key."""
    from hexir.graph.fusion import fused_kernels
    from hexir.ir.keys import workload_key

    _, kernels = fused_kernels(graph)
    ops = sum(1 for op in graph.ops if op.kind != "constant")
    print(f"{len(kernels)} kernels for {ops} ops (fusion {'on' if knobs.get().fusion else 'off'})")
    for n, (group, func) in enumerate(kernels):
        kinds = "+".join(op.kind for op in group.ops)
        shape = "x".join(map(str, group.outputs[0].type.shape)) or "scalar"
        key = workload_key(func)[:12]
        print(f"  {n:3d}  {kinds:<44} {shape:<16} {key}")


def print_schedule(func: PrimFunc, target: Target, db: Database | None) -> None:
    """The database's best trace of `func` on `target` (with `db`), or its default schedule."""
    from hexir.ir.keys import workload_key
    from hexir.runtime.default_schedule import default_schedule

    if db is not None:
        key = workload_key(func)
        for record in db.best(key, target, k=1):
            try:
                trace = record.load_trace()
                trace.apply(func, target=target)
            except HexirError:
                continue
            n = len(db.records(key, target))
            print(
                f"# the best of {n} records of @{func.name} on {target.key}: "
                f"{ms(record.median)} ms (candidate {record.candidate_key[:12]})"
            )
            print(trace)
            return
        print(f"# no valid record of @{func.name} on {target.key} in {db.shown}: the default")
    else:
        print(f"# the default schedule of @{func.name} on {target.key}")
    print(default_schedule(func, target).trace)


def print_forms(graph: Graph, db: Database) -> None:
    """One line per conv with two forms (hexir/graph/forms.py): the rule's form and the
    other, each with its kernels' summed best times in `db` (marked "in model" where they are
    their times inside the model's runs), and the form a build takes."""
    from hexir.graph.forms import Form, conv_forms

    def form(f: Form) -> str:
        name = f"F({f.tile},3)" if f.tile else "direct"
        time = "unmeasured" if f.seconds is None else f"{ms(f.seconds)} ms"
        where = " in model" if f.inside else ""
        return f"{name:>7} {f.kernels:>2} kernels {time:>12}{where}"

    convs = conv_forms(graph, "cpu", db)
    print(f"{len(convs)} convs with a Winograd and a direct form; database {db.shown}")
    for c in convs:
        chosen = f"F({c.chosen},3)" if c.chosen else "direct"
        print(f"  conv {c.name:>6} {'x'.join(map(str, c.shape)):>14}  rule {form(c.rule)}  |  "
              f"other {form(c.other)}  |  built {chosen}")  # fmt: skip
