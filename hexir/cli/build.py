"""`hexir build MODEL -o FILE`: compile with the database's best schedules, no search at all;
`hexir export MODEL -o FILE.onnx`: the same model as ONNX, for peers to run.

The build report says, per task, whether its schedule came from the database ("tuned") or is
the default, and proves that building searched and measured nothing: the database's record
count before and after, and which search modules the process loaded (none).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hexir.cli.common import (
    DEFAULT_DB,
    add_dim_argument,
    load_graph,
    open_database,
    require_database,
    resolve_target,
)

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.runtime.module import Module

MODEL_HELP = "a zoo model (mlp, resnet18, ...), a .hexir or an .onnx file"
# Modules that only a search or a measurement loads: a build must load none of them.
SEARCH_MODULES = (
    "hexir.search.tune",
    "hexir.search.evolutionary",
    "hexir.search.measure",
    "hexir.search.runners",
    "hexir.search.distributed",
    "hexir.costmodel",
)


def add_parsers(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "build",
        parents=[parent],
        help="compile a model with the database's best schedules (no search) into an artifact",
        description="Compile MODEL with the fastest valid database record of each task for "
        "the target (a default schedule where there is none), without searching or measuring "
        "anything, and write the artifact that `hexir run FILE` runs.",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("-o", "--output", metavar="FILE", help="the artifact (default: MODEL.hxa)")
    p.add_argument(
        "--target", metavar="TARGET",
        help='cpu, cuda or "cuda -arch=sm_90" (default: cuda when a GPU is usable, else cpu)',
    )  # fmt: skip
    p.add_argument(
        "--db", metavar="URL",
        help=f"the tuning database (default: {DEFAULT_DB}, where it exists)",
    )  # fmt: skip
    p.add_argument(
        "--report", choices=("text", "json"), default="text",
        help="json: the build report as one JSON object on stdout",
    )  # fmt: skip
    p.add_argument(
        "--dynamic", action="store_true",
        help="compile once for every size of the model's symbolic dims (an .onnx model's "
        "dim_params not given by --dim, a .hexir's {seq}): kernels that take the sizes at run "
        "time, contractions per bucket of them (`hexir run FILE --dim NAME=SIZE` runs it)",
    )  # fmt: skip
    add_dim_argument(p)
    p.set_defaults(handler=cmd_build)

    e = verbs.add_parser(
        "export",
        parents=[parent],
        help="write a model as ONNX (opset 17), weights included",
        description="Write MODEL as an ONNX file, so that other runtimes run the very model "
        "Hexir compiles.",
    )
    e.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    e.add_argument("-o", "--output", metavar="FILE", help="the ONNX file (default: MODEL.onnx)")
    add_dim_argument(e)
    e.set_defaults(handler=cmd_export)


@dataclass(frozen=True)
class TaskLine:
    """One distinct kernel workload of the build: how it was scheduled and how often it runs."""

    name: str
    workload_key: str
    schedule: str  # "tuned" | "default"
    weight: int
    ops: tuple[str, ...]


def cmd_build(args: argparse.Namespace) -> int:
    import hexir

    target = resolve_target(args.target)
    subject = load_graph(args.model, "build", args.dim, symbolic=args.dynamic)
    output = Path(args.output or f"{subject.stem}.hxa")
    if args.dynamic:
        return _build_dynamic(subject, target, output, args)
    # An explicit --db must exist; the default one is used where a tune made it.
    db = require_database(args.db) if args.db else open_database(DEFAULT_DB, create=False)
    before = _record_count(db)
    module = hexir.compile(subject.model, target, database=db)
    path = module.save(output)
    after = _record_count(db)
    tasks = task_lines(module)
    loaded = sorted(m for m in SEARCH_MODULES if m in sys.modules)
    if args.report == "json":
        data = {
            "model": subject.text,
            "target": str(target),
            "target_key": target.key,
            "database": db.shown if db is not None else None,
            "output": str(path),
            "kernels": len(module.kernels),
            "commands": len(module.commands),
            "tuned": sum(t.schedule == "tuned" for t in tasks),
            "default": sum(t.schedule == "default" for t in tasks),
            "tasks": [t.__dict__ | {"ops": list(t.ops)} for t in tasks],
            "records_before": before,
            "records_after": after,
            "search_modules_loaded": loaded,
        }
        print(json.dumps(data, indent=1))
        return 0
    where = db.shown if db is not None else f"none ({DEFAULT_DB} does not exist)"
    print(f"built {subject.text} for {target} ({target.key}); database {where}")
    print_tasks(tasks)
    tuned = sum(t.schedule == "tuned" for t in tasks)
    print(
        f"{tuned} of {len(tasks)} tasks tuned, {len(tasks) - tuned} default; "
        f"{len(module.kernels)} kernels, {len(module.commands)} commands; no search, "
        f"{'no' if after == before else after - before} measurements"
    )
    print(f"wrote {path}")
    return 0


def _build_dynamic(subject, target, output: Path, args: argparse.Namespace) -> int:  # noqa: ANN001
    """`hexir build --dynamic`: a DynamicModule, saved; its steps summed up."""
    import hexir
    from hexir.errors import HexirError
    from hexir.graph.specialize import graph_symbols

    if not graph_symbols(subject.model):
        raise HexirError(
            f"{subject.text} has no symbolic dims (every size is fixed, or given by --dim), so "
            "there is nothing to compile for every size: drop --dynamic"
        )
    db = require_database(args.db) if args.db else open_database(DEFAULT_DB, create=False)
    module = hexir.compile(subject.model, target, database=db, dynamic=True)
    path = module.save(output)
    counts = {
        how: sum(s.how == how for s in module.steps) for how in ("kernel", "buckets", "exact")
    }
    summary = {
        "model": subject.text,
        "target": str(target),
        "symbols": list(module.symbols),
        "kernels": counts["kernel"],
        "bucketed": counts["buckets"],
        "exact": counts["exact"],
        "memory_slots": len(module.slots),
        "output": str(path),
    }
    if args.report == "json":
        print(json.dumps(summary, indent=1))
        return 0
    print(
        f"built {subject.text} for {target} ({target.key}), dynamic in {', '.join(module.symbols)}"
    )
    print(
        f"{counts['kernel']} kernels compiled once for every size; {counts['buckets']} "
        f"contraction groups compiled per bucket of their sizes as they run, "
        f"{counts['exact']} per exact size; {len(module.slots)} memory slots"
    )
    print(f"wrote {path}")
    return 0


def task_lines(module: Module) -> list[TaskLine]:
    """The module's report grouped by workload, in order of first use."""
    found: dict[str, TaskLine] = {}
    for r in module.report:
        seen = found.get(r.workload_key)
        weight = seen.weight + 1 if seen else 1
        found[r.workload_key] = TaskLine(r.name, r.workload_key, r.schedule, weight, r.ops)
    return list(found.values())


def print_tasks(tasks: list[TaskLine]) -> None:
    print(f"  {'#':>3}  {'task':<44} {'weight':>6}  {'schedule':<8}  workload")
    for i, t in enumerate(tasks):
        print(f"  {i:>3}  {t.name[:44]:<44} {t.weight:>6}  {t.schedule:<8}  {t.workload_key[:12]}")


def _record_count(db: Database | None) -> int:
    return 0 if db is None else db.stats().records


def cmd_export(args: argparse.Namespace) -> int:
    import hexir

    subject = load_graph(args.model, "export", args.dim)
    output = Path(args.output or f"{subject.stem}.onnx")
    model = hexir.export_onnx(subject.model, output)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    print(
        f"wrote {output}: opset {opset}, {len(model.graph.node)} nodes, "
        f"{len(model.graph.initializer)} initializers"
    )
    return 0
