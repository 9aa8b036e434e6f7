"""`hexir tune MODEL --trials N`: tune every task of a model (or one workload) into the database.

A live table on a terminal (rich), a plain line per round otherwise; a table per task at the
end with the model's estimated end-to-end latency, Σ weight × latency, with the default
schedules and with the best found. Ctrl-C stops after what was measured is committed; the same
command again continues from the database.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TextIO

from hexir import knobs
from hexir.cli.common import (
    DEFAULT_DB,
    MODEL_HELP,
    add_dim_argument,
    duration,
    load_subject,
    ms,
    open_database,
    plural,
    positive_float,
    positive_int,
    ratio,
    resolve_target,
    time_span,
)
from hexir.cli.progress import DefaultLatencies, Display, make_display
from hexir.errors import TargetError

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.ir.graph import Graph
    from hexir.ir.tir import PrimFunc
    from hexir.runtime.target import Target
    from hexir.search.executor import MeasureExecutor
    from hexir.search.scheduler import Task
    from hexir.search.tune import TuneResult

EXAMPLES = """examples:
  hexir tune mlp --trials 64
  hexir tune resnet18 --trials 600 --db sqlite:///tuning_logs/hexir.db
  hexir tune resnet18 --time-budget 30m         # as many trials as 30 minutes hold
  hexir tune matmul:M=1024,N=1024,K=1024 --trials 64 --no-ray
"""


def add_parser(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "tune",
        parents=[parent],
        help="search schedules for every task of a model, recording them in the database",
        description=textwrap.fill(
            "Tune every fused kernel (task) of a model, or one workload, spending --trials "
            "measurements in all (or --time-budget, or whichever ends first) where the "
            "end-to-end gain promises most; every measurement is committed to the database as "
            "it is made. Ctrl-C stops cleanly; the same command again continues, never "
            "measuring a candidate twice.",
            width=78,
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument(
        "--trials", type=positive_int, metavar="N",
        help="measurements in all, shared by every task",
    )  # fmt: skip
    p.add_argument(
        "--time-budget", type=time_span, metavar="SPAN",
        help="wall-clock time the tune may take: 90s, 30m, 1.5h, 1h30m; it stops when what "
        "is left would not hold another trial (with --trials: whichever ends first)",
    )  # fmt: skip
    p.add_argument(
        "--target", metavar="TARGET",
        help='cpu, cuda or "cuda -arch=sm_90" (default: cuda when a GPU is usable, else cpu)',
    )  # fmt: skip
    p.add_argument("--db", default=DEFAULT_DB, metavar="URL", help=f"default: {DEFAULT_DB}")
    ray = p.add_mutually_exclusive_group()
    ray.add_argument(
        "--ray-address", default="local", metavar="ADDR",
        help="'local' (default) starts a local Ray cluster; 'auto' joins the one running on "
        "this machine; 'ray://host:port' a remote one",
    )  # fmt: skip
    ray.add_argument("--no-ray", action="store_true", help="measure in this process, no Ray")
    p.add_argument(
        "--workers", type=positive_int, metavar="N", help="parallel builds (default: one per CPU)"
    )
    p.add_argument("--seed", type=int, metavar="S", help="seed of the search (reproducible)")
    p.add_argument(
        "--timeout", type=positive_float, metavar="S",
        help="seconds one candidate may run (check and timing) before it is killed "
        f"(default: HEXIR_MEASURE_TIMEOUT, {knobs.get().measure_timeout:g})",
    )  # fmt: skip
    p.add_argument(
        "--report", choices=("text", "json"), default="text",
        help="json: the final report as one JSON object on stdout (progress goes to stderr)",
    )  # fmt: skip
    add_dim_argument(p)
    p.set_defaults(handler=cmd_tune, usage_error=p.error)  # exits with status 2


@dataclass(frozen=True)
class TaskRow:
    """One task in the final report: latencies in seconds (None: no valid measurement)."""

    name: str
    workload_key: str
    weight: int
    trials: int
    default_latency: float | None
    best_latency: float | None
    alternative: bool = False  # a kernel only of a conv's other form (scheduler.Task)


def cmd_tune(args: argparse.Namespace) -> int:
    from hexir.search.scheduler import extract_tasks

    # Everything that can be refused is checked before the database is opened.
    if args.trials is None and args.time_budget is None:
        args.usage_error("a budget is needed: --trials N, --time-budget SPAN (30m, 1h), or both")
    target = resolve_target(args.target)
    _check_device(target, args)
    subject = load_subject(args.model, args.dim)
    tasks = extract_tasks(subject.tunable, target)
    db = open_database(args.db, create=True)
    assert db is not None
    out = sys.stderr if args.report == "json" else sys.stdout
    defaults = DefaultLatencies(db, tasks, target)
    print(
        f"tuning {subject.text}: {len(tasks)} tasks, {_budget(args)}, target {target} "
        f"({target.key}), database {db.shown}",
        file=out,
        flush=True,
    )
    display = make_display(out, tasks, defaults)
    records_before = db.stats().records
    result, interrupted = _run(args, subject.tunable, target, db, display)
    if result is not None:
        rows = [
            TaskRow(
                t.name,
                t.workload_key,
                t.weight,
                t.trials,
                t.default_latency,
                t.best_latency,
                t.alternative,
            )  # fmt: skip
            for t in result.tasks
        ]
        elapsed = result.elapsed
        again = {
            "checking claimed gains in turn": result.checked,
            "confirming the best": result.confirmed,
            "re-measuring loaded ones": result.remeasured,
            "timing the mix's defaults": result.mix_timed,
            "timing kernels inside the model": result.in_model,
        }
        if any(again.values()):
            runs = ", ".join(f"{n} {what}" for what, n in again.items() if n)
            print(f"runs besides the trials: {runs}", file=out)
        if result.out_of_time:
            print(
                f"the time budget ({duration(args.time_budget)}) ended the tune after "
                f"{plural(result.trials, 'trial')}",
                file=out,
            )
    else:
        rows = _rows_from_database(db, tasks, target, display.trials, defaults)
        elapsed = display.elapsed
    tuned = _tuned_model(subject.tunable, target, db)
    out_of_time = result is not None and result.out_of_time
    _report(args, subject.text, target, db, rows, tuned, elapsed, interrupted, out_of_time)
    if interrupted:
        measured = db.stats().records - records_before
        print(
            f"interrupted after {plural(measured, 'measurement')}, all committed to "
            f"{db.shown}; run the same command again to continue.",
            file=sys.stderr,
        )
        return 130
    return 0


def _budget(args: argparse.Namespace) -> str:
    """`600 trials`, `a time budget of 30m00s`, or both."""
    parts = []
    if args.trials is not None:
        parts.append(plural(args.trials, "trial"))
    if args.time_budget is not None:
        parts.append(f"a time budget of {duration(args.time_budget)}")
    return " or ".join(parts)


def _check_device(target: Target, args: argparse.Namespace) -> None:
    """Refuse to tune for a GPU this machine lacks, when the measurements would run here."""
    if target.kind != "cuda" or not (args.no_ray or args.ray_address == "local"):
        return
    from hexir.runtime.cuda_kernel import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is not None:
        raise TargetError(
            f"cannot tune for {target} here, measuring needs the GPU: {reason} Tune on a "
            "machine with the GPU (or join a cluster that has one with --ray-address), or "
            "tune for --target cpu."
        )


def _run(
    args: argparse.Namespace,
    tunable: Graph | PrimFunc,
    target: Target,
    db: Database,
    display: Display,
) -> tuple[TuneResult | None, bool]:
    """Tune; (the result, False), or (None, True) after a Ctrl-C."""
    from hexir.search.tune import tune

    changes: dict[str, object] = {}
    if args.timeout is not None:
        changes["measure_timeout"] = args.timeout
    if args.workers is not None and args.no_ray:
        changes["measure_build_workers"] = args.workers
    with knobs.scope(**changes):
        executor = _executor(target, args)
        try:
            with display:
                result = tune(
                    tunable, target, trials=args.trials, database=db, seed=args.seed,
                    callbacks=[display.update], executor=executor,
                    time_budget=args.time_budget,
                )  # fmt: skip
            return result, False
        except KeyboardInterrupt:
            return None, True
        finally:
            executor.close()


def _executor(target: Target, args: argparse.Namespace) -> MeasureExecutor:
    if args.no_ray:
        from hexir.search.executor import LocalExecutor

        return LocalExecutor(target)
    from hexir.search.distributed import RayExecutor

    address = None if args.ray_address == "local" else args.ray_address
    return RayExecutor(target, address=address, num_builders=args.workers)


def _rows_from_database(
    db: Database,
    tasks: list[Task],
    target: Target,
    trials: dict[str, int],
    defaults: DefaultLatencies,
) -> list[TaskRow]:
    """The report of an interrupted tune: each task's best in the database."""
    rows = []
    for i, task in enumerate(tasks):
        best = db.best(task.workload_key, target, k=1)
        rows.append(
            TaskRow(
                task.name,
                task.workload_key,
                task.weight,
                trials.get(task.workload_key, 0),
                defaults.refresh(i),
                best[0].median if best else None,
                task.alternative,
            )  # fmt: skip
        )
    return rows


def estimate(rows: list[TaskRow], attr: str, counts: dict[str, int] | None = None) -> float | None:
    """Σ weight × latency over the tasks of the model as the rule builds it (`counts`: over
    these workloads, run this often, instead), or None while one's latency is unknown."""
    if counts is None:
        counts = {r.workload_key: r.weight for r in rows if not r.alternative}
    latency = {r.workload_key: getattr(r, attr) for r in rows}
    values = [latency.get(key) for key in counts]
    if not counts or any(v is None for v in values):
        return None
    return sum(n * v for n, v in zip(counts.values(), values, strict=True))


def _tuned_model(tunable: Graph | PrimFunc, target: Target, db: Database) -> dict[str, int]:
    """The workloads of the model as a build with the database compiles it (each conv in the
    form its measured kernels make faster), each with how often it runs."""
    from hexir.graph.forms import measured_kernels
    from hexir.ir.keys import workload_key
    from hexir.ir.tir import PrimFunc

    if isinstance(tunable, PrimFunc):
        return {workload_key(tunable): 1}
    counts: dict[str, int] = {}
    for _, func in measured_kernels(tunable, target, db)[1]:
        key = workload_key(func)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _report(
    args: argparse.Namespace,
    model: str,
    target: Target,
    db: Database,
    rows: list[TaskRow],
    tuned: dict[str, int],
    elapsed: float,
    interrupted: bool,
    out_of_time: bool,
) -> None:
    before, after = estimate(rows, "default_latency"), estimate(rows, "best_latency", tuned)
    if args.report == "json":
        data = {
            "model": model,
            "target": str(target),
            "target_key": target.key,
            "database": db.shown,
            "interrupted": interrupted,
            "time_budget": args.time_budget,
            "out_of_time": out_of_time,
            "trials": sum(r.trials for r in rows),
            "elapsed": elapsed,
            "tasks": [asdict(r) for r in rows],
            "latency_default": before,
            "latency_tuned": after,
        }
        print(json.dumps(data, indent=1))
    else:
        print_table(sys.stdout, model, target, rows, elapsed, before, after)


def print_table(
    out: TextIO,
    model: str,
    target: Target,
    rows: list[TaskRow],
    elapsed: float,
    before: float | None,
    after: float | None,
) -> None:
    trials = sum(r.trials for r in rows)
    print(
        f"tuned {model} on {target} ({target.key}): {trials} trials in {duration(elapsed)}",
        file=out,
    )
    print(
        f"  {'#':>3}  {'task':<40} {'weight':>6} {'trials':>6} {'default ms':>11} "
        f"{'tuned ms':>10} {'speedup':>8}  workload",
        file=out,
    )
    for i, r in enumerate(rows):
        name = f"{r.name[:38]} *" if r.alternative else r.name[:40]
        print(
            f"  {i:>3}  {name:<40} {r.weight:>6} {r.trials:>6} "
            f"{ms(r.default_latency, 11)} {ms(r.best_latency, 10)} "
            f"{ratio(r.default_latency, r.best_latency):>8}  {r.workload_key[:12]}",
            file=out,
        )
    if any(r.alternative for r in rows):
        print(
            "  * a kernel of a conv's other form (Winograd or direct), measured so that a build "
            "can choose it",
            file=out,
        )
    unknown = sum(r.default_latency is None for r in rows if not r.alternative)
    note = f" (the default schedule of {plural(unknown, 'task')} not measured)" if unknown else ""
    print(
        f"estimated end to end (sum of weight x latency): default {_ms(before)}, "
        f"tuned {_ms(after)}, speedup {ratio(before, after)}{note}",
        file=out,
    )


def _ms(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{ms(seconds)} ms"
