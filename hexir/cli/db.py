"""`hexir db list|best|stats|export|import|plot`: what the tuning database knows.

hexir db list                          # one line per workload and target
hexir db best 2b0fedea4db0             # a workload's best records and best trace, as Python
hexir db best matmul:M=1024,N=1024,K=1024
hexir db stats
hexir db export records.jsonl          # JSON lines; `import` merges them into another
hexir db plot mlp -o mlp.png           # tuning curves: best latency against trials and time
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hexir import knobs
from hexir.cli.common import (
    DEFAULT_DB,
    MODEL_HELP,
    is_workload_spec,
    load_subject,
    load_workload,
    ms,
    open_database,
    positive_int,
    require_database,
    resolve_target,
)
from hexir.errors import DatabaseError

if TYPE_CHECKING:
    from hexir.database import Database, Workload
    from hexir.runtime.target import Target
    from hexir.search.scheduler import Task

_NAME = re.compile(r"hextir\.func @([\w.]+)")
_KEY_PREFIX = re.compile(r"[0-9a-fA-F]+")
_TARGET_KEY = re.compile(r"(cpu|cuda)-\S+")


def add_parser(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    db = verbs.add_parser(
        "db",
        parents=[parent],
        help="list, query, export, import and plot the tuning database",
        description="What the tuning database knows: its workloads, their best schedules, "
        "counts, and a portable JSON-lines export.",
    )
    common = argparse.ArgumentParser(add_help=False, parents=[parent])
    common.add_argument("--db", default=DEFAULT_DB, metavar="URL", help=f"default: {DEFAULT_DB}")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = actions.add_parser("list", parents=[common], help="one line per workload and target")
    p.set_defaults(handler=cmd_list)

    p = actions.add_parser(
        "best", parents=[common], help="a workload's best records and its best trace as Python"
    )
    p.add_argument(
        "workload", metavar="WORKLOAD",
        help="a workload key or its first characters (see `hexir db list`), or a workload "
        "such as matmul:M=1024,N=1024,K=1024",
    )  # fmt: skip
    p.add_argument("--target", metavar="TARGET", help="a target or target key (default: all)")
    p.add_argument("-k", type=positive_int, default=3, help="records to list (default: 3)")
    p.set_defaults(handler=cmd_best)

    p = actions.add_parser("stats", parents=[common], help="counts of workloads and records")
    p.set_defaults(handler=cmd_stats)

    p = actions.add_parser("export", parents=[common], help="write every record as JSON lines")
    p.add_argument("file", metavar="FILE", help="the JSON-lines file to write")
    p.set_defaults(handler=cmd_export)

    p = actions.add_parser("import", parents=[common], help="merge a JSON-lines export")
    p.add_argument("file", metavar="FILE", help="a file `hexir db export` wrote")
    p.set_defaults(handler=cmd_import)

    p = actions.add_parser(
        "plot", parents=[common],
        help="draw tuning curves: best latency so far against trials and wall time",
        description="Draw the tuning curves of a workload or of every task of a model from the "
        "records in the database: the best latency so far against trials and against wall "
        "time, and for a model the estimated end to end (sum of weight x best). Prints each "
        "task's trials, best and speedup too. Needs matplotlib: pip install 'hexir[plot]'.",
    )  # fmt: skip
    p.add_argument(
        "what", metavar="WORKLOAD|MODEL",
        help=f"{MODEL_HELP}, or a workload key or its first characters",
    )  # fmt: skip
    p.add_argument(
        "-o", "--output", metavar="FILE",
        help="the image to write, PNG unless its suffix names another kind "
        "(default: NAME-tuning.png)",
    )  # fmt: skip
    p.add_argument(
        "--target", metavar="TARGET",
        help="the target whose records to plot: cpu, cuda, \"cuda -arch=sm_90\", or a target "
        "key as `hexir db list` shows it (default: cuda when a GPU is usable, else cpu)",
    )  # fmt: skip
    p.set_defaults(handler=cmd_plot)


def workload_name(workload: Workload) -> str:
    found = _NAME.search(workload.text)
    return found.group(1) if found else "?"


def cmd_list(args: argparse.Namespace) -> int:
    db = require_database(args.db)
    workloads = db.workloads()
    targets = sorted(db.stats().targets)
    print(f"{len(workloads)} workloads in {db.shown}")
    head = f"  {'workload':<12}  {'name':<36} {'target':<24} {'records':>7} {'valid':>6}"
    print(f"{head} {'best ms':>10}")
    for w in workloads:
        for target in targets:
            records = db.records(w.key, target)
            if not records:
                continue
            valid = [r for r in records if r.is_valid]
            alone = [r.median for r in valid if not r.in_model]
            print(
                f"  {w.key[:12]:<12}  {workload_name(w)[:36]:<36} {target[:24]:<24} "
                f"{len(records):>7} {len(valid):>6} {ms(min(alone, default=None), 10)}"
            )
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    db = require_database(args.db)
    workload = _find_workload(db, args.workload)
    targets = [args.target] if args.target else sorted(db.stats().targets)
    print(f"# workload {workload.key} @{workload_name(workload)}")
    shown = 0
    for target in targets:
        best = db.best(workload.key, target, k=args.k)
        if not best:
            continue
        shown += 1
        print(f"# target {best[0].target_key}: {len(db.records(workload.key, target))} records")
        threshold = knobs.get().measure_calibration_threshold
        for rank, r in enumerate(best):
            when = f"{r.created:%Y-%m-%d %H:%M}"
            load = f"  suspect: timed under load (calibration {r.calibration:.1f}x)" if (
                r.suspect(threshold)
            ) else ""  # fmt: skip
            print(f"#   {rank}  {ms(r.median, 10)} ms  candidate {r.candidate_key[:12]}  {when}"
                  f"{load}")  # fmt: skip
        print(f"# the best trace ({ms(best[0].median)} ms):")
        print(best[0].load_trace())
    if not shown:
        where = f"target {args.target}" if args.target else "any target"
        print(f"# no valid record for {where}")
    return 0


def _find_workload(db: Database, text: str) -> Workload:
    """The workload a key, a key prefix or a workload spec names."""
    if is_workload_spec(text):
        import hexir

        key = hexir.workload_key(load_workload(text))
        matches = [w for w in db.workloads() if w.key == key]
        if not matches:
            raise DatabaseError(
                f"{db.shown} has no records of {text} (workload key {key[:12]}); tune it with "
                f"`hexir tune {text} --trials N`"
            )
        return matches[0]
    matches = [w for w in db.workloads() if w.key.startswith(text.lower())]
    if len(matches) == 1 and text:
        return matches[0]
    if not matches or not text:
        raise DatabaseError(
            f"{db.shown} has no workload whose key starts with {text!r}; `hexir db list` shows "
            "the keys it has"
        )
    shown = ", ".join(f"{w.key[:12]} (@{workload_name(w)})" for w in matches[:5])
    raise DatabaseError(
        f"{text!r} starts {len(matches)} workload keys ({shown}, ...); give more characters"
    )


def cmd_stats(args: argparse.Namespace) -> int:
    stats = require_database(args.db).stats()
    print(f"database        {stats.url} (schema {stats.schema_version})")
    print(f"workloads       {stats.workloads}")
    print(f"records         {stats.records} ({stats.valid} valid)")
    if stats.suspect:
        threshold = knobs.get().measure_calibration_threshold
        print(f"  suspect       {stats.suspect} valid records timed under load (calibration "
              f"over {threshold:g}x: HEXIR_MEASURE_CALIBRATION_THRESHOLD); builds prefer the "
              "others")  # fmt: skip
    for kind, n in sorted(stats.errors.items()):
        print(f"  errors        {kind}: {n}")
    for key, n in sorted(stats.targets.items()):
        print(f"  target        {key}: {n}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    db = require_database(args.db)
    n = db.export_jsonl(args.file)
    print(f"wrote {n} records of {len(db.workloads())} workloads to {args.file}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    if not Path(args.file).is_file():
        raise DatabaseError(f"no export file {args.file}: pass a file `hexir db export` wrote")
    db = open_database(args.db, create=True)
    assert db is not None
    n = db.import_jsonl(args.file)
    print(f"added {n} records to {db.shown} ({db.stats().records} in all)")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from hexir.cli import plot

    plot.require_matplotlib()  # before anything slow
    target, key = _plot_target(args.target)
    db = require_database(args.db)
    stem, title, tasks, model = _plot_tasks(db, args.what, target)
    threshold = knobs.get().measure_calibration_threshold
    curves = plot.tuning_curves(db, tasks, key, title, model=model, threshold=threshold)
    if not curves.records:
        raise DatabaseError(_nothing_to_plot(db, args.what, tasks, key))
    plot.print_summary(sys.stdout, curves, db.shown)
    output = args.output or f"{stem}-tuning.png"
    plot.draw(curves, output)
    print(f"wrote {output}")
    return 0


def _plot_target(text: str | None) -> tuple[Target, str]:
    """The target to find a model's tasks for, and the target key of the records to plot (a
    key given as it is: records measured on another machine)."""
    from hexir.runtime.target import Target

    if text is not None and _TARGET_KEY.fullmatch(text):
        kind, _, arch = text.partition("-")
        return Target("cpu" if kind == "cpu" else f"cuda -arch={arch}"), text
    target = resolve_target(text)
    return target, target.key


def _plot_tasks(db: Database, text: str, target: Target) -> tuple[str, str, list[Task], bool]:
    """A file name stem, a title, the tasks to plot, and whether they are a model's."""
    from hexir.search.scheduler import extract_tasks

    if is_workload_spec(text) or (_KEY_PREFIX.fullmatch(text) and not Path(text).exists()):
        workload = _find_workload(db, text)
        name = workload_name(workload)
        title = text if is_workload_spec(text) else f"@{name} ({workload.key[:12]})"
        return name, title, extract_tasks(workload.load_func(), target), False
    subject = load_subject(text)
    return subject.stem, text, extract_tasks(subject.model, target), True


def _nothing_to_plot(db: Database, text: str, tasks: list[Task], key: str) -> str:
    keys = [t.workload_key for t in tasks]
    others = sorted(k for k in db.stats().targets if any(db.records(w, k) for w in keys))
    what = f"{text} (workload {keys[0][:12]})" if len(tasks) == 1 else (
        f"any of the {len(tasks)} tasks of {text}"
    )  # fmt: skip
    them = "it" if len(tasks) == 1 else "them"
    where = (
        f"it has records of {them} on {', '.join(others)}: pass --target {others[0]}"
        if others
        else f"tune it first with `hexir tune {text} --trials N --db {db.shown}`"
    )
    return f"{db.shown} has no records of {what} on target {key}, so nothing to plot; {where}"
