"""The progress of `hexir tune`: a live rich table on a terminal, a plain line per round in a log.

Both show the trials done of the budget, each task's best latency and its speedup over the
task's default schedule (the tune measures that first), the model's estimated end-to-end
latency, and the time left.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol, Self, TextIO

from hexir.cli.common import duration, ms, plural, ratio

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.runtime.target import Target
    from hexir.search.scheduler import Task
    from hexir.search.tune import Progress


class DefaultLatencies:
    """Each task's default schedule's latency as the database stands, looked up again at each
    of the task's rounds: a first reading timed under load, measured again quietly, moves."""

    def __init__(self, db: Database, tasks: list[Task], target: Target) -> None:
        from hexir.errors import HexirError
        from hexir.ir.keys import candidate_key
        from hexir.runtime.default_schedule import default_schedule

        self.db, self.tasks, self.target = db, tasks, target
        self.keys: list[str | None] = []
        for task in tasks:
            try:
                self.keys.append(candidate_key(default_schedule(task.func, target).func))
            except HexirError:
                self.keys.append(None)
        self.known: dict[int, float] = {}
        for i in range(len(tasks)):
            self.refresh(i)

    def refresh(self, i: int) -> float | None:
        """Task `i`'s default latency, read from the database (None while it has no valid
        record, and for a task the tune added: `hexir.search.scheduler.mixed_tasks`)."""
        if i < len(self.keys) and (key := self.keys[i]) is not None:
            record = self.db.standing(self.tasks[i].workload_key, self.target, key)
            if record is not None:
                self.known[i] = record.median
        return self.known.get(i)

    def get(self, i: int) -> float | None:
        return self.known.get(i)


class Display(Protocol):
    trials: dict[str, int]  # trials this call, by workload key
    elapsed: float

    def update(self, progress: Progress) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


def make_display(out: TextIO, tasks: list[Task], defaults: DefaultLatencies) -> Display:
    """A live table when `out` is a terminal, else a plain line per round."""
    if out.isatty():
        return LiveDisplay(out, tasks, defaults)
    return PlainDisplay(out, tasks, defaults)


class _Base:
    def __init__(self, out: TextIO, tasks: list[Task], defaults: DefaultLatencies) -> None:
        self.out, self.tasks, self.defaults = out, tasks, defaults
        self.trials: dict[str, int] = {}
        self.start = time.perf_counter()
        self.elapsed = 0.0

    def _note(self, progress: Progress) -> None:
        self.defaults.refresh(progress.task)
        self.trials = {t.workload_key: t.trials for t in progress.tasks}
        self.elapsed = progress.elapsed

    def _default(self, progress: Progress, i: int) -> float | None:
        """Task `i`'s default latency: on its best's footing where the tune knows it (gains
        timed in turn: `TaskProgress.default_latency`), else as the database stands."""
        known = progress.tasks[i].default_latency
        return known if known is not None else self.defaults.get(i)

    def _model(self, progress: Progress) -> str:
        """The model's estimated latency, default and best, or how many tasks are unknown:
        over the kernels the rule builds, as the final report's estimate (a conv's other form
        is not in the model as the rule builds it)."""
        built = [i for i, t in enumerate(progress.tasks) if not t.alternative]
        best = {i: progress.tasks[i].best_latency for i in built}
        missing = sum(b is None for b in best.values())
        if missing:
            return f"model est. - ({plural(missing, 'task')} without a valid measurement yet)"
        after = sum(progress.tasks[i].weight * (best[i] or 0.0) for i in built)
        default = {i: self._default(progress, i) for i in built}
        if any(d is None for d in default.values()):
            return f"model est. {ms(after)} ms"
        before = sum(progress.tasks[i].weight * (default[i] or 0.0) for i in built)
        return f"model est. {ms(after)} ms, {ratio(before, after)} over default"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def trials_text(progress: Progress, pad: bool = False) -> str:
    """`12/600` (` 12/600` padded), or `12` where a time budget alone bounds the tune."""
    done, total = progress.trials_done, progress.trials_total
    if total is None:
        return str(done)
    return f"{done:>{len(str(total)) if pad else 0}}/{total}"


def fraction_done(progress: Progress) -> float:
    """How much of the budget is spent: of the trials or of the time, whichever is further."""
    done = 0.0
    if progress.trials_total:
        done = progress.trials_done / progress.trials_total
    if progress.time_budget:
        done = max(done, progress.elapsed / progress.time_budget)
    return min(1.0, done)


class PlainDisplay(_Base):
    """One line per round, for logs: trials, the round's task, the model, the time left."""

    def update(self, progress: Progress) -> None:
        self._note(progress)
        i = progress.task
        task = progress.tasks[i]
        line = (
            f"[{trials_text(progress, pad=True)}] {duration(progress.elapsed)} "
            f"ETA {duration(progress.eta)} | task {i} {task.name} (x{task.weight}): best "
            f"{ms(task.best_latency)} ms, {ratio(self._default(progress, i), task.best_latency)} "
            f"over default, {task.trials} trials | {self._model(progress)}"
        )
        print(line, file=self.out, flush=True)


class LiveDisplay(_Base):
    """A rich table redrawn after every round, removed when the tune ends."""

    def __init__(self, out: TextIO, tasks: list[Task], defaults: DefaultLatencies) -> None:
        super().__init__(out, tasks, defaults)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out)
        self.live = Live(console=self.console, transient=True, auto_refresh=False)

    def __enter__(self) -> Self:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def update(self, progress: Progress) -> None:
        self._note(progress)
        self.live.update(self._render(progress), refresh=True)

    def _render(self, progress: Progress):  # noqa: ANN202 - a rich renderable
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for name, justify in [("#", "right"), ("task", "left"), ("weight", "right")]:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for name in ("trials", "default ms", "best ms", "speedup"):
            table.add_column(name, justify="right")
        for i, t in enumerate(progress.tasks):
            default = self._default(progress, i)
            style = "bold" if i == progress.task else None
            table.add_row(
                str(i), t.name, str(t.weight), str(t.trials), ms(default), ms(t.best_latency),
                ratio(default, t.best_latency), style=style,
            )  # fmt: skip
        head = (
            f"trials {trials_text(progress)}  elapsed "
            f"{duration(progress.elapsed)}  ETA {duration(progress.eta)}  {self._model(progress)}"
        )
        bar = ProgressBar(total=1000, completed=round(1000 * fraction_done(progress)), width=60)
        return Group(head, bar, table)
