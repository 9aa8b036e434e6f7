"""What `hexir db plot` draws and prints: the tuning curves of a workload's or a model's tasks.

    curves = tuning_curves(db, tasks, "cpu-avx2-fma", "mlp", model=True)
    print_summary(sys.stdout, curves, db.shown)  # per task: trials, best, speedup over the first
    draw(curves, "mlp.png")                      # needs matplotlib (pip install 'hexir[plot]')
    figure(curves)                               # the matplotlib Figure it writes

The values come from hexir/database/curves.py; this module only lays them out. matplotlib is
imported inside `draw` (with the Agg canvas, no pyplot state), so the rest of the command
line never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from hexir.cli.common import duration, ms, plural, ratio
from hexir.database.curves import Point, TaskCurve, estimate_curve, first_created, task_curve
from hexir.errors import HexirError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from hexir.database import Database
    from hexir.search.scheduler import Task

PLOT_INSTALL = "pip install 'hexir[plot]'"
LABEL_CHARS = 40
# A plot names at most this many tasks, the slowest (`_named`); the others are thin grey lines.
NAMED_TASKS = 12
DPI = 110


@dataclass(frozen=True)
class Curves:
    """A plot's data: a curve per task (with its weight, and whether it is only a conv's other
    form), and for a model the estimated end to end over the tasks the rule builds."""

    title: str
    target_key: str
    tasks: tuple[TaskCurve, ...]
    weights: tuple[int, ...]
    alternative: tuple[bool, ...]
    estimate: tuple[Point, ...] | None

    @property
    def trials(self) -> int:
        return sum(c.trials for c in self.tasks)

    @property
    def records(self) -> int:
        return sum(c.records for c in self.tasks)

    @property
    def span(self) -> float:
        """Seconds from the first record to the last."""
        return max((c.points[-1].seconds for c in self.tasks if c.points), default=0.0)


def require_matplotlib() -> None:
    """HexirError, naming the extra to install, where matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise HexirError(
            f"hexir db plot draws with matplotlib, which is not installed here: {PLOT_INSTALL} "
            "(or pip install matplotlib)"
        ) from e


def tuning_curves(
    db: Database,
    tasks: list[Task],
    target_key: str,
    title: str,
    *,
    model: bool,
    threshold: float,
) -> Curves:
    """Each task's curve from its records on the target, all from one origin (`threshold`:
    the calibration past which a record was timed under load); with `model`, the estimated
    end to end over the tasks that are not a conv's other form."""
    records = [db.records(t.workload_key, target_key) for t in tasks]
    origin = first_created(records)
    curves = tuple(
        task_curve(t.name, t.workload_key, rs, origin, threshold)
        for t, rs in zip(tasks, records, strict=True)
    )
    estimate = None
    if model:
        weights = {t.workload_key: t.weight for t in tasks if not t.alternative}
        estimate = estimate_curve(curves, weights)
    return Curves(
        title,
        target_key,
        curves,
        tuple(t.weight for t in tasks),
        tuple(t.alternative for t in tasks),
        estimate,
    )


def print_summary(out: TextIO, curves: Curves, shown: str) -> None:
    """A line per task (trials, errors, first and best latency, speedup), then a model's
    estimated end to end when it was first known and now."""
    again = curves.records - curves.trials
    print(
        f"tuning curves of {curves.title} on {curves.target_key} in {shown}: "
        f"{plural(len(curves.tasks), 'task')}, {plural(curves.trials, 'trial')}"
        f"{f' ({curves.records} records)' if again else ''} over {duration(curves.span)}",
        file=out,
    )
    print(
        f"  {'#':>3}  {'task':<40} {'weight':>6} {'trials':>6} {'errors':>6} {'first ms':>10} "
        f"{'best ms':>10} {'speedup':>8}  workload",
        file=out,
    )
    for i, (c, weight, other) in enumerate(
        zip(curves.tasks, curves.weights, curves.alternative, strict=True)
    ):
        name = f"{c.name[:38]} *" if other else c.name[:40]
        print(
            f"  {i:>3}  {name:<40} {weight:>6} {c.trials:>6} {c.errors:>6} {ms(c.first, 10)} "
            f"{ms(c.best, 10)} {ratio(c.first, c.best):>8}  {c.workload_key[:12]}",
            file=out,
        )
    if any(curves.alternative):
        print(
            "  * a kernel of a conv's other form (Winograd or direct), not in the estimate",
            file=out,
        )
    if again:
        print(
            f"  {plural(again, 'record')} measured a candidate again (timed under load, or "
            "confirming a best): not trials; a candidate stands at its records' median",
            file=out,
        )
    if curves.estimate is not None:
        print(_estimate_line(curves.estimate), file=out)


def _estimate_line(estimate: tuple[Point, ...]) -> str:
    known = [p for p in estimate if p.best is not None]
    head = "estimated end to end (sum of weight x best)"
    if not known:
        return f"{head}: unknown until every task has a valid trial"
    first, last = known[0], known[-1]
    return (
        f"{head}: {ms(first.best)} ms when every task had a valid trial (trial {first.trial}, "
        f"{duration(first.seconds)}), {ms(last.best)} ms after {plural(last.trial, 'trial')} "
        f"({ratio(first.best, last.best)})"
    )


def draw(curves: Curves, path: str) -> None:
    """`figure(curves)` written as an image (PNG, or what the file's suffix names)."""
    figure(curves).savefig(path, dpi=DPI)


def figure(curves: Curves) -> Figure:
    """Two panels, best latency so far against trials and against wall time (log scale): a
    line per task (the slowest NAMED_TASKS named in the legend, `_named`), and a model's
    estimated end to end thicker."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    by_trial, by_time = fig.subplots(1, 2, sharey=True)
    unit, per = _time_unit(curves.span)
    y_unit, y_scale = _latency_unit(curves)
    model = curves.estimate is not None
    named = _named(curves)
    rest = dict(color="0.7", linewidth=0.8)
    for i, (curve, weight, other) in enumerate(
        zip(curves.tasks, curves.weights, curves.alternative, strict=True)
    ):
        label = _label(curve, weight, other, model=model) if i in named else None
        style = {} if i in named else rest
        color = _line(by_trial, curve.points, lambda p: p.trial, y_scale, label, **style)
        style = {**style, "color": color}
        _line(by_time, curve.points, lambda p: p.seconds / per, y_scale, None, **style)
    if len(named) < len(curves.tasks):
        others = len(curves.tasks) - len(named)
        by_trial.plot([], [], label=f"{plural(others, 'other task')} (grey)", **rest)
    if curves.estimate is not None:
        style = dict(color="black", linewidth=3.0)
        label = "end to end (sum of weight x best)"
        _line(by_trial, curves.estimate, lambda p: p.trial, y_scale, label, **style)
        _line(by_time, curves.estimate, lambda p: p.seconds / per, y_scale, None, **style)
    by_trial.set_xlabel("trials (each task's own; end to end: the model's)" if model else "trials")
    by_time.set_xlabel(f"wall time since the first record ({unit})")
    by_trial.set_ylabel(f"best latency so far ({y_unit})")
    for axes in (by_trial, by_time):
        axes.set_yscale("log")
        _plain_log_labels(axes, curves)
        axes.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"tuning {curves.title} on {curves.target_key}")
    entries = len(by_trial.get_legend_handles_labels()[0])
    if entries:  # none where every trial failed
        columns = max(1, min(3, (entries + 5) // 6))
        fig.legend(loc="outside lower center", ncols=columns, fontsize="small")
    return fig


def _line(
    axes: Axes,
    points: Sequence[Point],
    x: Callable[[Point], float],
    y_scale: float,
    label: str | None,
    **style: Any,
) -> Any:
    """A best-so-far step line over the points that have a best, a dot on the last; its color."""
    shown = [(x(p), p.best * y_scale) for p in points if p.best is not None]
    if not shown:
        return style.get("color")
    xs, ys = [a for a, _ in shown], [b for _, b in shown]
    (line,) = axes.step(xs, ys, where="post", label=label, **style)
    axes.plot(xs[-1:], ys[-1:], "o", color=line.get_color())
    return line.get_color()


def _named(curves: Curves) -> set[int]:
    """The tasks drawn in colour with a name in the legend: all of them up to NAMED_TASKS,
    else the NAMED_TASKS that take the most time (weight x best; a model's tasks are tens,
    and a legend of them all is wider than the figure)."""
    if len(curves.tasks) <= NAMED_TASKS:
        return set(range(len(curves.tasks)))
    cost = [
        (weight * c.best if c.best is not None else 0.0)
        for c, weight in zip(curves.tasks, curves.weights, strict=True)
    ]
    return set(sorted(range(len(cost)), key=lambda i: -cost[i])[:NAMED_TASKS])


def _label(curve: TaskCurve, weight: int, other: bool, *, model: bool) -> str:
    name = curve.name if len(curve.name) <= LABEL_CHARS else curve.name[: LABEL_CHARS - 1] + "…"
    runs = f" x{weight}" if model else ""
    form = " (other form)" if other else ""
    return f"{name}{runs}{form} [{curve.workload_key[:8]}]"


def _latencies(curves: Curves) -> list[float]:
    lines = [c.points for c in curves.tasks] + [curves.estimate or ()]
    return [p.best for points in lines for p in points if p.best is not None]


def _latency_unit(curves: Curves) -> tuple[str, float]:
    """µs where every latency drawn is under a millisecond, else ms; and per second."""
    return ("µs", 1e6) if max(_latencies(curves), default=0.0) < 1e-3 else ("ms", 1e3)


def _plain_log_labels(axes: Axes, curves: Curves) -> None:
    """Tick labels as plain numbers (0.3, not 3x10^-1); the ticks between powers of ten
    labelled too where the latencies span less than a factor of 30, where there are few."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    latencies = _latencies(curves)
    narrow = bool(latencies) and max(latencies) < 30 * min(latencies)
    axes.yaxis.set_major_formatter(plain)
    axes.yaxis.set_minor_formatter(plain if narrow else NullFormatter())


def _time_unit(span: float) -> tuple[str, float]:
    """The unit of a wall-time axis that spans `span` seconds, and its length in seconds."""
    if span >= 3 * 3600:
        return "h", 3600.0
    if span >= 3 * 60:
        return "min", 60.0
    return "s", 1.0
