"""`hexir.tune`: search schedules for a PrimFunc or a whole model and record every measurement.

    result = hexir.tune(graph, target="cpu", trials=200,
                        database="sqlite:///tuning_logs/hexir.db")
    for task in result.tasks:
        print(task.name, task.weight, task.best_latency, task.default_latency, task.trials)
    module = hexir.compile(graph, "cpu", database=...)   # uses the best records

A model's tasks (hexir/search/scheduler.py) share the call's `trials`: a first round for every
task (a share of the budget), then rounds where the end-to-end gain promises most, within each
task's headroom over its roofline. Each round of a task is an
evolutionary search (hexir/search/evolutionary.py) guided by the cost model; the executor
measures its candidates, and each result is committed to the database as soon as it is
measured (batches of the executor's parallel builds), so an interrupted tune keeps everything
it measured. Calling the same tune again continues from the database: the best records seed
the search, and no candidate measured before is measured again. A round's search (sampling and
evolution) stops after the `search_time_ratio` share of the time its batch should take to
measure, at the median cost of the task's trials so far, within a generation too: in Python a
conv's candidate costs about 0.05 s to replay, and a full round's evolution, unchecked,
outlasted the measurements it chose. Candidates the search refused for their C's length
(`EvolutionarySearch.take_refused`) teach the model they are the worst (`TOO_LONG`).

A candidate slower than the `measure_cutoff` knob (3) times its task's best so far is timed by
one warm call, not in full (`Candidate.cutoff`): most of a first round's random samples are
ten times slower than the best, and timing each in full cost more than building it. A CPU
candidate whose first three latencies read slower than `measure_near` (1.5) times it is timed
by those three (`Candidate.near`), and a task's first slice is one build per worker, so that
the default's time sets the others' bounds.

A CPU result timed while something else ran on the machine (its calibration, hexir/search/
calibration.py, past the `measure_calibration_threshold` knob) is suspect: its candidate is
measured again once a round ends on a quiet result, and at the end of the tune (REMEASURE_TRIES
times at most; `TuneResult.remeasured` counts them), and the database prefers quiet records.
A suspect confirmation or check (below) is timed again as one, in turn with its task's other
suspect ones (a suspect confirmation of a conv's two forms, below, with those of all their
kernels' tasks: one batch, as they were confirmed) and marked so: the database ranks a
confirmed candidate at its confirmations alone, and a quiet run of another kind would not
count there (ResNet-18's first conv and its default, both confirmed under a load, stood at 5.9
and 7.2 ms where their quiet runs read 1.96 and 1.83, and the build took the slower).

A result that reads faster than its task's best by more than the `tune_check_gain` knob
(1.03) claims a gain, which is checked before the tune credits it: a two-core VM's speed shifts
by a third from one second to the next, and the fastest of many single reads is the luckiest
(BERT's 768x768 projection: candidates read 0.46-0.56 ms against the default's 0.70, and all
0.69-0.72 timed in turn with it; credited as read, those gains drew 68 of 200 trials to a task
that had none). After its round, a task's claims (CHECKED_CLAIMS, the fastest) are timed in
turn with the candidate that holds its best, and the best moves by the ratio read there (or to
the winner's time there, where that is lower), never up (`TuneResult.checked` counts these
runs; the database marks them "checked" and ranks a checked candidate after the confirmed
ones, ahead of the rest, at its checks alone: `footing` in hexir/database/record.py; a
candidate confirmed at the end stands at the confirmation's runs alone, not at checks of
other moments). A lower read within the margin moves nothing. So the best a tune reports as
it goes, the task scheduler's split of the budget (which follows each task's gains) and the
cutoff for slow candidates rest on gains timed side by side. And
from when the default held a task's best, the gains over it multiply into the default's time
on the best's footing (`TaskProgress.default_latency`, which the live progress divides by the
best: a default whose runs in turn read 1.79 and 1.21 ms, each beating the claims beside it,
stood at 1.79 ms in the database against its best, its first run of 1.09 ms, and the progress
read "1.65x over default" for a task that had gained nothing).

At the end, each task's best few candidates (by their runs alone) and its default schedule
are measured again, in three rounds (`tune_confirm_best`, CONFIRM_ROUNDS;
`TuneResult.confirmed`). Each round times them in turn where the executor can
(`measure_in_turn`: a call of each, then the next of each), so that a host whose speed shifts
from one second to the next (a two-core VM's, by a third to a half) shifts them alike, and
marks them "confirmed". The database ranks a candidate by the median of its records, the
confirmed ahead of the rest and each at its confirmations alone (`Database.best`): a candidate
whose first run was lucky does not stay the best, nor does one timed once in a faster spell
than the confirmation's. The tasks of the kernels of both forms of a conv (hexir/graph/
forms.py) are confirmed together, one batch in turn, since a build picks a conv's form by the
sums of its kernels' confirmed times, which must then be of the same moments.

A time budget (`time_budget` seconds, alone or with `trials`) ends the tune when what is left
of it would not hold another trial at the pace of the tune so far: no round, and no slice of
one, starts that the budget has no room for, and a slice stops as soon as the budget is spent.
What was measured is committed; `TuneResult.out_of_time` says the budget ended it.

A model whose convs have two forms (Winograd and direct, hexir/graph/forms.py) is tuned in
both; where each conv's own best times then pick a mix of the two, the mix has kernels of its
own (a layout change between a Winograd conv and a direct one), which a build may only take
once they are timed (`measured_forms`). After the first rounds, and then at every
MIX_CHECKS-th of the budget, the tune looks at the mix its measurements pick, and those of its
kernels that no task covers and the database has no time for join the tune as tasks
(`mixed_tasks`: a first round, then their share of the gradient phase). A kernel of a conv's
form that sums higher than the other gains the model nothing until its form overtakes: after
each round the scheduler is told each task's runs in such forms and the gaps (`_losing`), and
counts its gain there beyond the gap only (hexir/search/scheduler.py). The confirmation at
the end can move the picks, so the tune looks once more after it: each added task still
without a time (added then, or too late in the budget for a round) has its default schedule
timed, no search and not a trial, so that a build can judge the mix
(`TuneResult.mix_timed` counts them), before the last re-measurement of suspect results.

A kernel timed alone is not the kernel in the model: one whose arrays pass the cache is timed
cold, its arrays flushed to memory, where in a run of the model its input is the last
kernel's fresh output and its weight may sit in the last-level cache (ResNet-18's 7x7x512
direct conv: 1.3-2.3 ms cold alone, 0.8-1.4 ms in the model's runs), and not every kernel
gains alike. So the tune ends by running the model built in each form it measured (the
rule's; the other for every such conv; the mix the measurements pick, where it is neither) in
turn (`time_in_model`: IN_MODEL_RUNS runs of each, each command's seconds read in place,
`Module.run_timed`; the `tune_time_in_model` knob), and commits each kernel's seconds there
as a record marked "in_model" with the sitting's name (`TuneResult.in_model` counts them).
The database leaves such records out of its ranking and the cost model out of its training;
a build's pick of a conv's form sums them where one sitting timed every kernel of both forms
since their best records (hexir/graph/forms.py).

Progress: every callback is called after every round with a `Progress` (trials done, the
budget, each task's best latency and trials, elapsed seconds, an estimate of the seconds left).
A KeyboardInterrupt (Ctrl-C, or raised by a callback) stops the tune after closing what it
opened; what was measured is in the database, and the exception propagates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from hexir import knobs
from hexir.ir.dtype import random_array
from hexir.ir.graph import Graph
from hexir.ir.keys import candidate_key
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target
from hexir.schedule import Trace
from hexir.search.evolutionary import EvolutionarySearch, Predictor, SearchProfile
from hexir.search.measure import Candidate, MeasureResult
from hexir.search.scheduler import Task, TaskScheduler, extract_tasks, losing_forms, roofline

if TYPE_CHECKING:
    from hexir.costmodel import CostModel
    from hexir.database import Database, Record
    from hexir.search.executor import MeasureExecutor

__all__ = ["Progress", "ProgressCallback", "TaskProgress", "TaskResult", "TuneResult", "tune"]

DEFAULT_DATABASE = "sqlite:///tuning_logs/hexir.db"
# The trial budget of a tune that only a time budget bounds.
UNBOUNDED = sys.maxsize
# Times a candidate whose measurement is suspect (hexir/search/calibration.py) is measured
# again, at most, in one tune.
REMEASURE_TRIES = 2
# Under a time budget, a slice of a round's batch (built whole, then timed) takes at most this
# share of the time left at the pace so far: the slices shrink toward the end, so that one
# slower than its pace (a loaded machine) runs past the budget by a fraction of a slice.
SLICE_SHARE = 0.5
# A confirmed candidate whose two middle runs differ by more than this factor is measured once
# more (`_Tuner.confirm`): timing the same kernel twice on a quiet machine differs by percents.
DISAGREE = 1.5
# Rounds of the confirmation at the end of a tune: each round times every confirmed candidate,
# the default among them, in turn, and a confirmed candidate stands at the median of its
# confirmations alone (Database.best). One round would leave a candidate to one run's luck (a
# 200-trial residual conv's pick read 0.80 ms against the default's 1.06 in a tune, and timed
# within 5% of it, either way, in four alternated runs after); three make it a median.
CONFIRM_ROUNDS = 3
# Runs of each build, in turn, that time the kernels inside the model at the end of a tune (see
# the module), after IN_MODEL_WARMUP runs of each.
IN_MODEL_RUNS = 10
IN_MODEL_WARMUP = 2
# A round's claims of a gain (see the module) timed in turn with the best's holder, at most:
# the fastest of them.
CHECKED_CLAIMS = 3
# How often, over the budget, a tune of a model looks for kernels of the mix of conv forms its
# measurements pick (see the module): the lowering it takes is seconds for ResNet-18.
MIX_CHECKS = 8


@dataclass(frozen=True)
class TaskProgress:
    """One task's state during a tune: best latency in seconds (None: no valid one yet)."""

    name: str
    workload_key: str
    weight: int
    flops: int
    best_latency: float | None
    trials: int
    alternative: bool = False  # a kernel of other conv forms than the rule's (scheduler.Task)
    # The default schedule's time on the best's footing: the best times the gains over it timed
    # in turn (see the module); None where the tune does not know it (the default has not held
    # the best in this call).
    default_latency: float | None = None


@dataclass(frozen=True)
class Progress:
    """What a progress callback gets after every round."""

    trials_done: int
    trials_total: int | None  # None: a time budget alone bounds the tune
    tasks: tuple[TaskProgress, ...]
    elapsed: float
    eta: float | None  # seconds left: from the time per trial so far, at most the time budget's
    task: int  # index of the task the round just tuned
    time_budget: float | None = None  # seconds

    @property
    def best(self) -> dict[str, float | None]:
        """Best latency so far per task, by workload key."""
        return {t.workload_key: t.best_latency for t in self.tasks}


class ProgressCallback(Protocol):
    def __call__(self, progress: Progress) -> None: ...


@dataclass(frozen=True)
class TaskResult:
    """A tuned task: its best trace and latency in the database after the tune (from any tune,
    this one or earlier), the default schedule's latency if it was ever measured, and the
    trials this call spent on it."""

    name: str
    workload_key: str
    weight: int
    flops: int
    func: PrimFunc = field(repr=False)
    best_trace: Trace | None = field(repr=False)
    best_latency: float | None
    default_latency: float | None
    trials: int
    alternative: bool = False  # a kernel of other conv forms than the rule's (scheduler.Task)


@dataclass(frozen=True)
class TuneResult:
    """What `tune` did: per task results, trials measured by this call, wall seconds, the
    seconds by activity (`SearchProfile.as_dict()`: sampling, mutation, prediction, ...), and
    whether the time budget ended it."""

    tasks: tuple[TaskResult, ...]
    trials: int
    elapsed: float
    profile: dict[str, float] = field(default_factory=dict)
    out_of_time: bool = False
    remeasured: int = 0  # suspect results measured again (not trials: no new candidate)
    confirmed: int = 0  # the best candidates measured again at the end (not trials either)
    mix_timed: int = 0  # default schedules of the mix's kernels timed at the end (neither)
    checked: int = 0  # runs timed in turn to check a claimed gain (see the module; neither)
    in_model: int = 0  # kernels timed inside the model's runs at the end (see the module)

    @property
    def latency(self) -> float | None:
        """Σ weight × best latency over the tasks: the kernels' time per inference (None
        while a task has no valid record)."""
        if any(t.best_latency is None for t in self.tasks):
            return None
        return sum(t.weight * (t.best_latency or 0.0) for t in self.tasks)


def tune(
    func_or_graph: PrimFunc | Graph,
    target: Target | str = "cpu",
    trials: int | None = 64,
    database: Database | str = DEFAULT_DATABASE,
    ray_address: str | None = None,
    seed: int | None = None,
    model: CostModel | None = None,
    callbacks: Sequence[ProgressCallback] = (),
    executor: MeasureExecutor | None = None,
    time_budget: float | None = None,
) -> TuneResult:
    """Tune `func_or_graph` for `target` with `trials` measurements in all, in at most
    `time_budget` seconds (see the module); either may be None, not both.

    `database`: a URL or a Database. `ray_address`: None measures in this process; "local"
    starts a local Ray cluster; any other address ("auto", "ray://host:port") joins one.
    `executor`, when given, is used instead (and not closed). `seed` makes the search
    reproducible. `model` defaults to an XGBoost model trained on the database's records of
    this target."""
    if trials is None and time_budget is None:
        raise ValueError("a tune needs a budget: trials, time_budget or both")
    if trials is not None and trials < 0:
        raise ValueError(f"trials must be zero or more, got {trials}")
    if time_budget is not None and not 0 < time_budget < math.inf:
        raise ValueError(f"time_budget must be a positive number of seconds, got {time_budget}")
    from hexir.graph.fusion import lowering_once
    from hexir.graph.rewrite import simplify_graph
    from hexir.graph.specialize import require_sizes

    target = Target.of(target)
    db = _database(database)
    if isinstance(func_or_graph, Graph):
        # Simplified once: each lowering of the tune then finds this same graph simplified,
        # and lowers it once for each set of forms (`lowering_once`).
        require_sizes(func_or_graph, "tuning")
        func_or_graph = simplify_graph(func_or_graph)
    with lowering_once():
        tasks = extract_tasks(func_or_graph, target)
        model = model if model is not None else _default_model(db, target)
        own = executor is None
        executor = executor if executor is not None else _executor(target, ray_address)
        try:
            # A model with two forms of its convs: the mix its measurements pick is looked for.
            mixes = isinstance(func_or_graph, Graph) and any(t.alternative for t in tasks)
            graph = func_or_graph if mixes else None
            tuner = _Tuner(
                tasks, target, db, executor, model, seed, tuple(callbacks), time_budget, graph
            )
            return tuner.run(trials)
        finally:
            if own:
                executor.close()


def _database(database: Database | str) -> Database:
    if isinstance(database, str):
        from hexir.database import Database

        return Database(database)
    return database


def _form_counts(graph: Graph, target: Target) -> list[tuple[Counter[str], Counter[str]]]:
    from hexir.graph.forms import form_counts

    return list(form_counts(graph, target).values())


def _default_model(db: Database, target: Target) -> CostModel:
    from hexir.costmodel.xgb import XGBModel

    return XGBModel.from_database(db, target)


def _executor(target: Target, ray_address: str | None) -> MeasureExecutor:
    if ray_address is None:
        from hexir.search.executor import LocalExecutor

        return LocalExecutor(target)
    from hexir.search.distributed import RayExecutor

    return RayExecutor(target, address=None if ray_address == "local" else ray_address)


class _Model(Predictor, Protocol):
    def update(self, candidates: list[Candidate], results: list[MeasureResult]) -> None: ...


class _Tuner:
    """The state of one `tune` call: per task, its search, best latency and trials."""

    def __init__(
        self,
        tasks: list[Task],
        target: Target,
        db: Database,
        executor: MeasureExecutor,
        model: _Model,
        seed: int | None,
        callbacks: tuple[ProgressCallback, ...],
        time_budget: float | None = None,
        graph: Graph | None = None,
    ) -> None:
        self.tasks, self.target, self.db = list(tasks), target, db
        self.executor, self.model, self.callbacks = executor, model, callbacks
        self.profile = SearchProfile()
        self.seed = seed
        self.searches = [self._search(t) for t in tasks]
        # Each task's best time, and the candidate whose time it is (where a tune goes on from
        # the database: its best record's, replayed; None where that no longer replays); the
        # round's claims of a gain, each (task, candidate, result), to check in turn with the
        # holder (see the module).
        records = [self._db_record(t) for t in tasks]
        self.best = [None if r is None else r.median for r in records]
        self.holders = [
            None if r is None else s.replay(r.load_trace())
            for r, s in zip(records, self.searches, strict=True)
        ]
        self.claims: list[tuple[int, Candidate, MeasureResult]] = []
        # Each task's default time over its best, as the checks in turn read it, from when the
        # default held the best (None: unknown).
        self.gains: list[float | None] = [None] * len(self.tasks)
        self.checked = 0
        self.trials = [0] * len(tasks)
        # Each of this call's trials' seconds of building and timing, per task (`_costs`).
        self.costs: list[list[float]] = [[] for _ in tasks]
        # The model whose convs' mixed forms are looked for (see the module), and when next.
        self.graph = graph
        self.next_mix_check = 0.0
        self.rule_tasks = len(self.tasks)  # the tasks after these joined for the mix
        # Each conv with two forms: the keys of its kernels in each (the scheduler's gaps).
        self.forms = [] if graph is None else _form_counts(graph, target)
        self.mix_timed = 0
        # Suspect results to measure again (task, candidate, the run's mark or None), the
        # tries of each candidate and mark, whether the last result was timed quietly, and
        # the measurements made again.
        self.suspects: list[tuple[int, Candidate, str | None]] = []
        self.tries: dict[tuple[str, str | None], int] = {}
        self.quiet_now = False
        self.remeasured = 0
        self.confirmed = 0
        self.in_model = 0
        self.start = time.perf_counter()
        self.time_budget = time_budget
        self.deadline = None if time_budget is None else self.start + time_budget
        self.out_of_time = False

    def run(self, trials: int | None) -> TuneResult:
        self.bounded = trials is not None
        budget = trials if trials is not None else UNBOUNDED
        weights = [t.weight for t in self.tasks]
        floors = [roofline(t, self.target) for t in self.tasks]
        scheduler = TaskScheduler(weights, budget, initial=self.best, floors=floors)
        while (step := scheduler.next()) is not None:
            i, n = step
            measured = self.round(i, n, first=scheduler.rounds[i] == 0)
            if measured and self._mix_due(scheduler):
                self.add_mixed(scheduler)
            if measured:
                scheduler.record(i, measured, self.best[i])
                scheduler.weigh_forms(self._losing())
                self._report(i, scheduler)
            if self.out_of_time:
                break
            if measured == 0:
                scheduler.exhaust(i)
            elif self.quiet_now:
                self.remeasure()
        if not self.out_of_time:
            self.confirm()
            self.time_mix(scheduler)
            self.time_in_model()
            self.remeasure()  # what is still suspect, one last time
        return self.result()

    def _losing(self) -> list[list[tuple[int, float]]]:
        """Per task, its runs in the conv forms whose kernels' best times now sum higher than
        the other form's, and by how much (`losing_forms`)."""
        best = {t.workload_key: b for t, b in zip(self.tasks, self.best, strict=True)}
        losing = losing_forms(self.forms, best)
        return [losing.get(t.workload_key, []) for t in self.tasks]

    def _search(self, task: Task) -> EvolutionarySearch:
        rng = _task_rng(self.seed, task.workload_key)
        return EvolutionarySearch(task.func, self.target, rng=rng, database=self.db,
                                  profile=self.profile)  # fmt: skip

    def _mix_due(self, scheduler: TaskScheduler) -> bool:
        """Whether to look for the kernels of mixed conv forms now: a model with two forms,
        past the first rounds, at the next MIX_CHECKS-th of the budget."""
        if self.graph is None or scheduler.in_first_rounds:
            return False
        spent = scheduler.used / scheduler.trials if self.bounded else 0.0
        if self.deadline is not None and self.time_budget:
            spent = max(spent, (time.perf_counter() - self.start) / self.time_budget)
        if spent < self.next_mix_check:
            return False
        self.next_mix_check = spent + 1.0 / MIX_CHECKS
        return True

    def add_mixed(self, scheduler: TaskScheduler) -> None:
        """The kernels of the mix of conv forms the measurements pick that no task covers
        and the database has no time for, as new tasks (see the module)."""
        from hexir.search.scheduler import mixed_tasks

        assert self.graph is not None
        known = {t.workload_key for t in self.tasks}
        for task in mixed_tasks(self.graph, self.target, self.db, known):
            self.tasks.append(task)
            self.searches.append(self._search(task))
            self.best.append(None)
            self.holders.append(None)
            self.gains.append(None)
            self.trials.append(0)
            self.costs.append([])
            scheduler.add(task.weight, roofline(task, self.target))

    def time_mix(self, scheduler: TaskScheduler) -> None:
        """The mix the confirmed times pick, timed: its kernels no task covers as tasks, and
        the default schedule of each added task without a time (see the module)."""
        if self.graph is None:
            return
        self.add_mixed(scheduler)
        for i in range(self.rule_tasks, len(self.tasks)):
            default = self.searches[i].default
            if self.best[i] is None and default is not None and self.room(1) > 0:
                self.mix_timed += len(self._again(i, [default], mark=None))

    def time_in_model(self) -> None:
        """The model built in each variant of its convs' forms the tune measures (the rule's,
        and the other for every such conv), and in the forms the measurements pick where that
        is neither, run in turn, IN_MODEL_RUNS times each, and each kernel's seconds in those
        runs committed as a record (see the module), what a build's pick of the forms then
        weighs. Not where the time budget is spent, or the `tune_time_in_model` knob is off."""
        from hexir.graph.forms import form_variants, measured_forms
        from hexir.runtime.executor import compile as compile_graph

        if self.graph is None or self._spent() or not knobs.get().tune_time_in_model:
            return
        variants = form_variants(self.graph, self.target)
        picked = measured_forms(self.graph, self.target, self.db)
        forms = variants if picked in variants else [*variants, picked]
        builds = [compile_graph(self.graph, self.target, self.db, forms=f) for f in forms]
        inputs = _model_inputs(self.graph)
        for _ in range(IN_MODEL_WARMUP):
            for module in builds:
                module.run_timed(inputs)
        seconds: dict[str, list[float]] = {}  # workload key -> its commands' seconds
        ran: dict[str, tuple[Trace, str]] = {}  # workload key -> (trace, candidate key)
        for _ in range(IN_MODEL_RUNS):
            for module in builds:
                _, timed = module.run_timed(inputs)
                for command, report, s in zip(module.commands, module.report, timed, strict=True):
                    seconds.setdefault(report.workload_key, []).append(s)
                    func = module.kernels[command.kernel].func
                    ran[report.workload_key] = (report.trace, candidate_key(func))
        sitting = f"{self.graph.name} {uuid.uuid4().hex[:12]}"
        tasks = {t.workload_key: t for t in self.tasks}
        for key, times in seconds.items():
            if key not in tasks:
                continue  # a kernel no task covers: nothing to weigh it against
            trace, candidate = ran[key]
            info = {"in_model": sitting, "model": self.graph.name, "builds": len(builds)}
            result = MeasureResult(tuple(times), build_info=info)
            with self.profile.timing("database"):
                self.db.commit_record(tasks[key].func, self.target, trace, result,
                                      candidate_key=candidate)  # fmt: skip
            self.in_model += 1

    def round(self, i: int, n: int, first: bool) -> int:
        """One round of task `i`: propose up to `n` candidates, measure and commit them, and
        update the model; the number measured (0 also where the time budget has no room)."""
        room = self.room(n)
        if room == 0:
            self.out_of_time = True
            return 0
        search = self.searches[i]
        batch = []
        # The default schedule first, even in a round of one: the baseline every other
        # candidate (and the other form of a conv: hexir/graph/forms.py) is judged against.
        if first and knobs.get().tune_measure_default:
            default = search.default
            if default is not None and default.candidate_key not in search.measured_keys():
                batch.append(default)
        taken = {c.candidate_key for c in batch}
        proposed = search.propose(self.model, room - len(batch), self._search_deadline(i, room))
        batch += [c for c in proposed if c.candidate_key not in taken]
        results = self.measure(i, batch)
        refused = search.take_refused()
        if results or refused:
            with self.profile.timing("model_update"):
                self.model.update(
                    batch[: len(results)] + refused, results + [TOO_LONG] * len(refused)
                )
        self.check_claims(i)
        return len(results)

    def measure(self, i: int, batch: list[Candidate]) -> list[MeasureResult]:
        """Measure `batch` in slices of `measure_batch_per_worker` candidates per parallel
        build of the executor (each slice built in full, then timed), committing each result
        as soon as it is timed; under a time budget, only what it has room for. A task's
        first slice is one build per worker: its first time (the default's) sets the cutoffs
        of the rest (`_cut`)."""
        results: list[MeasureResult] = []
        workers = max(1, self.executor.workers)
        step = workers * max(1, knobs.get().measure_batch_per_worker)
        start = 0
        while start < len(batch):
            # No pace known yet (a budget's), or no best: one build per worker.
            first = self.best[i] is None or (self.deadline is not None and sum(self.trials) == 0)
            size = self.room(workers if first else step, SLICE_SHARE)
            if size == 0:
                self.out_of_time = True
                break
            chunk, start = batch[start : start + size], start + size
            with contextlib.closing(self._committed(i, chunk, trials=True)) as committed:
                for c, r in committed:
                    self._count(i, c, r)
                    self._watch(i, c, r)
                    results.append(r)
                    if self._spent():
                        self.out_of_time = True
                        break
            if self.out_of_time:
                break
        return results

    def _committed(
        self, i: int | list[int], chunk: list[Candidate], trials: bool, mark: str | None = None
    ) -> Iterator[tuple[Candidate, MeasureResult]]:
        """Measure `chunk` of task `i` (a list: each candidate's task, where a batch timed in
        turn holds several tasks' candidates), committing each result as soon as it is timed,
        and yield it with its candidate. Its wall time, less committing, is split into
        building and measuring (also where the caller stops early: close it), and counts
        toward the task's pace where the results are `trials`. `mark` ("confirmed" or
        "checked"): timed in turn, a call of each then the next of each, where the executor
        can (`measure_in_turn`), and marked so in their build_info (the database ranks a
        confirmed candidate first, at its confirmations alone: `Record.confirmed`)."""
        owners = [i] * len(chunk) if isinstance(i, int) else i
        began, committing = time.perf_counter(), self.profile.database
        out: list[MeasureResult] = []
        measuring: Iterator[MeasureResult]
        if mark is not None:
            in_turn = getattr(self.executor, "measure_in_turn", self.executor.measure)
            measuring = iter([_marked(r, mark) for r in in_turn(chunk)])
        elif trials and isinstance(i, int):
            measuring = self.executor.measure_each(self._cut(i, chunk))
        else:
            measuring = self.executor.measure_each(chunk)
        try:
            for c, r, owner in zip(chunk, measuring, owners, strict=False):
                with self.profile.timing("database"):
                    self.db.commit_record(self.tasks[owner].func, self.target, c.trace, r,
                                          candidate_key=c.candidate_key)  # fmt: skip
                out.append(r)
                yield c, r
        finally:
            close = getattr(measuring, "close", None)
            if close is not None:
                close()
            wall = time.perf_counter() - began - (self.profile.database - committing)
            self._account(out, wall)
            if trials and isinstance(i, int):
                self.costs[i] += _costs(out, wall)

    def _cut(self, i: int, chunk: list[Candidate]) -> list[Candidate]:
        """`chunk` with the cutoff of task `i` (the `measure_cutoff` knob times its best so
        far): a candidate slower than that is timed by one warm call, not in full; and its
        `near` (the `measure_near` knob times it): one slower than that, by three calls."""
        k, best = knobs.get(), self.best[i]
        if best is None:
            return chunk
        cutoff = k.measure_cutoff * best if k.measure_cutoff > 0 else None
        near = k.measure_near * best if k.measure_near > 0 else None
        return [dataclasses.replace(c, cutoff=cutoff, near=near) for c in chunk]

    def _watch(self, i: int, candidate: Candidate, result: MeasureResult) -> None:
        """Note a suspect result (timed while something else ran) of task `i`, to measure its
        candidate again once the machine is quiet, REMEASURE_TRIES times at most for each
        mark (its trials' and its confirmations' apart)."""
        suspect = result.suspect(self._threshold())
        self.quiet_now = result.calibration is not None and not suspect
        tried = (candidate.candidate_key, _mark(result))  # a confirmation's own tries
        if suspect and self.tries.get(tried, 0) < REMEASURE_TRIES:
            self.tries[tried] = self.tries.get(tried, 0) + 1
            self.suspects.append((i, candidate, tried[1]))

    def remeasure(self) -> None:
        """Measure the suspect results' candidates again (new records; the database prefers
        quiet ones), each task's together, while the time budget has room: its suspect
        confirmations (or checks) in turn and marked so, as they were (see the module); those
        of the tasks `confirm` times together (a conv's two forms, `_together`) in one batch,
        so that they stand at one moment's speed again."""
        pending, self.suspects = self.suspects, []
        for group, mark in self._suspect_batches(pending):
            suspects = {(j, c.candidate_key): (j, c) for j, c, m in pending
                        if j in group and m == mark}  # fmt: skip
            owners = [j for j, _ in suspects.values()]
            batch = [c for _, c in suspects.values()]
            done = self._again(owners, batch, mark, consider=True)
            self.remeasured += len(done)
            if done:  # the model skips the loaded first time; it learns the quiet one
                with self.profile.timing("model_update"):
                    self.model.update([c for c, _ in done], [r for _, r in done])
            for i in group:
                self.check_claims(i)

    def _suspect_batches(
        self, pending: list[tuple[int, Candidate, str | None]]
    ) -> list[tuple[list[int], str | None]]:
        """The batches `remeasure` times, in order of their first suspect: each task's suspects
        of one mark, but the confirmations of the tasks `confirm` times together, one batch."""
        marks = dict.fromkeys((i, mark) for i, _, mark in pending)
        together = self._together([i for i, mark in marks if mark == "confirmed"])
        joined = {i: group for group in together for i in group}
        batches = dict.fromkeys(
            (tuple(joined[i]) if mark == "confirmed" else (i,), mark) for i, mark in marks
        )
        return [(list(group), mark) for group, mark in batches]

    def check_claims(self, i: int) -> None:
        """Time task `i`'s claims of a gain in turn with the candidate that holds its best, and
        move the best by the ratio read there (see the module); what the time budget has room
        for."""
        mine = sorted((x for x in self.claims if x[0] == i), key=lambda x: x[2].median or 0.0)
        self.claims = [x for x in self.claims if x[0] != i]
        holder, best = self.holders[i], self.best[i]
        if not mine or holder is None or best is None:
            return
        claims = {c.candidate_key: c for _, c, _ in mine[:CHECKED_CLAIMS]}
        batch = [holder, *(c for k, c in claims.items() if k != holder.candidate_key)]
        batch = batch[: self.room(len(batch))]
        if len(batch) < 2:
            return
        times: dict[str, float] = {}
        for c, r in self._committed(i, batch, trials=False, mark="checked"):
            self.checked += 1
            self._watch(i, c, r)
            if r.ok and r.median is not None and not r.suspect(self._threshold()):
                times[c.candidate_key] = r.median  # a loaded read judges nothing: timed again
        base = times.get(holder.candidate_key)
        if base is None:
            return  # the holder did not run: nothing to judge the claims against
        winner = min(batch, key=lambda c: times.get(c.candidate_key, math.inf))
        fastest = times[winner.candidate_key]
        # By the ratio read in turn; or to the winner's own time there, where that is lower (the
        # holder's read, or the one it was credited from, was the slower for the host).
        self.best[i] = min(best * fastest / base, fastest)
        self.holders[i] = winner
        gain = self.gains[i]
        self.gains[i] = None if gain is None else gain * base / fastest

    def confirm(self) -> None:
        """Measure again, one after another, in CONFIRM_ROUNDS rounds, the
        `tune_confirm_best` best candidates of every task this call tuned, and its default
        schedule: the database ranks a candidate by the median of its records, so a lucky
        first run is put right before the tune reports (and a build picks) the best. The
        tasks of a conv's two forms are confirmed together (`_together`). What the time
        budget has room for."""
        k = knobs.get().tune_confirm_best
        tuned = [i for i in range(len(self.tasks)) if k > 0 and self.trials[i] > 0]
        batches = {i: self._confirm_batch(i, k) for i in tuned}
        for group in self._together(tuned):
            # A task alone needs two candidates to rank; beside other tasks, one stands too.
            group = [i for i in group if len(batches[i]) >= (2 if len(group) == 1 else 1)]
            owners = [i for i in group for _ in batches[i]]
            batch = [c for i in group for c in batches[i]]
            if len(batch) < 2:
                continue  # nothing to rank against
            for _ in range(CONFIRM_ROUNDS):
                self.confirmed += len(self._again(owners, batch, mark="confirmed"))
            # Middle two runs apart by more than DISAGREE: runs were timed under a load the
            # calibration missed (a 0.015 ms kernel read 5.1 ms once); one more run decides
            # where it stands.
            for i in group:
                records = self.db.records(self.tasks[i].workload_key, self.target)  # once
                split = [c for c in batches[i] if self._split(records, c)]
                if split:
                    self.confirmed += len(self._again(i, split, mark="confirmed"))

    def _confirm_batch(self, i: int, k: int) -> list[Candidate]:
        """What the confirmation times of task `i`: its `k` best candidates by their runs alone
        (a candidate found since the last confirmation competes) and its default schedule,
        where measured."""
        records = self.db.best(self.tasks[i].workload_key, self.target, k=k,
                               confirmed_first=False)  # fmt: skip
        batch = [self.searches[i].replay(r.load_trace()) for r in records]
        default = self.searches[i].default
        if default is not None and default.candidate_key in self.searches[i].measured_keys():
            batch.append(default)
        return list({c.candidate_key: c for c in batch if c is not None}.values())

    def _together(self, tasks: list[int]) -> list[list[int]]:
        """`tasks` in the groups the confirmation times in turn: the tasks of the kernels of
        both forms of a conv (hexir/graph/forms.py `form_counts`) are one group, joined where
        two convs share a kernel; every other task is a group of its own. A build picks a
        conv's form by the sums of its kernels' confirmed times, and kernels confirmed apart
        stand at different moments of a host whose speed shifts: after a 100-trial tune of
        ResNet-18, its 7x7x512 direct convs stood at 1.62-1.66 ms (they run in 0.81-0.85)
        against 1.19-1.21 ms for F(2, 3), and the build that took F(2, 3) ran 0.95x the
        default's speed."""
        groups = {i: [i] for i in tasks}
        index = {self.tasks[i].workload_key: i for i in tasks}
        for rule, other in self.forms:
            keys = set(rule) | set(other)
            joined = sorted({j for k in keys if k in index for j in groups[index[k]]})
            for j in joined:
                groups[j] = joined
        return list({id(g): g for g in groups.values()}.values())

    def _again(
        self, i: int | list[int], batch: list[Candidate], mark: str | None, consider: bool = False
    ) -> list[tuple[Candidate, MeasureResult]]:
        """Measure task `i`'s `batch` (a list: each candidate's task) again, not as trials
        (`mark`: in turn, marked so), what the time budget has room for: each result watched
        for load and, timed quietly, taken for its task's best (`consider`: considered for it,
        a gain then checked first, `_consider`); the results, with their candidates."""
        owners = [i] * len(batch) if isinstance(i, int) else i
        chunk = batch[: self.room(len(batch))]
        done: list[tuple[Candidate, MeasureResult]] = []
        for c, r in self._committed(owners[: len(chunk)], chunk, trials=False, mark=mark):
            owner = owners[len(done)]
            done.append((c, r))
            self._watch(owner, c, r)
            if r.suspect(self._threshold()):
                continue
            if consider:
                self._consider(owner, c, r)
            else:
                self._improve(owner, r, c)
        return done

    def _split(self, records: list[Record], candidate: Candidate) -> bool:
        """Whether the middle two of the candidate's quiet valid runs among its task's
        `records`, an even number of them, are more than DISAGREE apart (where it stands would
        be the slower's luck)."""
        runs = sorted(
            r.median
            for r in records
            if r.candidate_key == candidate.candidate_key
            and r.is_valid
            and not r.in_model
            and not r.suspect(self._threshold())
        )
        half = len(runs) // 2
        return bool(runs) and len(runs) % 2 == 0 and runs[half] > DISAGREE * runs[half - 1]

    @staticmethod
    def _threshold() -> float:
        return knobs.get().measure_calibration_threshold

    def room(self, n: int, share: float = 1.0) -> int:
        """How many of `n` more trials the time budget has room for in `share` of the time
        left, at this tune's pace so far (all `n` without a budget, or before the first
        trial)."""
        if self.deadline is None:
            return n
        left = self.deadline - time.perf_counter()
        if left <= 0:
            return 0
        pace = self._pace()
        if pace is None:
            return n
        # share of the time left, but at least one trial where one still fits
        return min(n, max(int(share * left / pace), min(int(left / pace), 1)))

    def _pace(self) -> float | None:
        """Wall seconds per trial so far, everything included (None before the first)."""
        done = sum(self.trials)
        return (time.perf_counter() - self.start) / done if done else None

    def _search_deadline(self, i: int, n: int) -> float | None:
        """When a round of task `i` measuring `n` must stop searching: after the
        `search_time_ratio` share of the time measuring them should take (at the median cost
        of the task's trials so far: the mean, with a first round's reference computation and
        its random samples of seconds a call, doubled matmul's next search; before the task's
        first trial, of the tune's), and before the time budget's end, less one trial's time
        to measure. A task's first round searches with the model the other tasks trained
        (informed, so it evolves): unbounded, it spent 8-19 s on each of ResNet-18's Winograd
        transforms, a fifth of its first 100 seconds."""
        ends = []
        ratio = knobs.get().search_time_ratio
        costs = self.costs[i] or [c for task in self.costs for c in task]
        if ratio > 0 and costs:
            pace = statistics.median(costs)
            ends.append(time.perf_counter() + ratio * n * pace)
        if self.deadline is not None:
            ends.append(self.deadline - (self._pace() or 0.0))
        return min(ends, default=None)

    def _spent(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def _count(self, i: int, candidate: Candidate, result: MeasureResult) -> None:
        """One committed result of task `i`: a trial, and its best time."""
        self.searches[i].mark_measured([candidate])
        self.trials[i] += 1
        self._consider(i, candidate, result)

    def _consider(self, i: int, candidate: Candidate, result: MeasureResult) -> None:
        """Task `i`'s best with `result`'s: the first time, or the holder's own again (a quiet
        re-measure), or one that claims a gain, kept to check after the round (`check_claims`)
        where a holder of the best can be timed beside it; a lower read of another candidate
        within the margin moves nothing (see the module)."""
        margin, best, holder = knobs.get().tune_check_gain, self.best[i], self.holders[i]
        if margin <= 0 or best is None or holder is None:
            self._improve(i, result, candidate)
        elif not result.ok or result.median is None:
            return
        elif candidate.candidate_key == holder.candidate_key:
            self.best[i] = min(best, result.median)
        elif result.median * margin < best:
            self.claims.append((i, candidate, result))

    def _improve(self, i: int, result: MeasureResult, candidate: Candidate) -> None:
        """Task `i`'s best time, with `result`'s (of `candidate`, then the best's holder)."""
        if result.ok and result.median is not None:
            best = self.best[i]
            if best is None or result.median < best:
                self.best[i] = result.median
                self.holders[i] = candidate
                default = self.searches[i].default
                is_default = (
                    default is not None and default.candidate_key == candidate.candidate_key
                )
                self.gains[i] = 1.0 if is_default else None

    def _account(self, results: list[MeasureResult], wall: float) -> None:
        """Split a measurement's wall time: running (the runners' own spans, a span that
        candidates timed in turn share counted once) and building."""
        spans = {span for r in results if (span := _run_span(r)) is not None}
        running = sum(max(0.0, end - start) for start, end in spans)
        running = min(running, wall)
        self.profile.measuring += running
        self.profile.building += wall - running

    def _report(self, task: int, scheduler: TaskScheduler) -> None:
        if not self.callbacks:
            return
        elapsed = time.perf_counter() - self.start
        done = scheduler.used
        eta = elapsed / done * scheduler.left if done and self.bounded else None
        if self.deadline is not None:
            left = max(0.0, self.deadline - time.perf_counter())
            eta = left if eta is None else min(eta, left)
        total = scheduler.trials if self.bounded else None
        progress = Progress(
            done, total, self._progress(), elapsed, eta, task, time_budget=self.time_budget
        )
        for callback in self.callbacks:
            callback(progress)

    def _progress(self) -> tuple[TaskProgress, ...]:
        rows = []
        for t, b, n, g in zip(self.tasks, self.best, self.trials, self.gains, strict=True):
            default = None if b is None or g is None else b * g
            rows.append(TaskProgress(t.name, t.workload_key, t.weight, t.flops, b, n,
                                     t.alternative, default_latency=default))  # fmt: skip
        return tuple(rows)

    def _db_record(self, task: Task) -> Record | None:
        records = self.db.best(task.workload_key, self.target, k=1)
        return records[0] if records else None

    def result(self) -> TuneResult:
        out = []
        for task, search, n in zip(self.tasks, self.searches, self.trials, strict=True):
            records = self.db.best(task.workload_key, self.target, k=1)
            trace = records[0].load_trace() if records else None
            latency = records[0].median if records else None
            default = _default_latency(self.db, task, self.target, search.default)
            out.append(
                TaskResult(
                    task.name,
                    task.workload_key,
                    task.weight,
                    task.flops,
                    task.func,
                    trace,
                    latency,
                    default,
                    n,
                    task.alternative,
                )  # fmt: skip
            )
        elapsed = time.perf_counter() - self.start
        return TuneResult(
            tuple(out),
            sum(self.trials),
            elapsed,
            self.profile.as_dict(),
            self.out_of_time,
            self.remeasured,
            self.confirmed,
            self.mix_timed,
            self.checked,
            self.in_model,
        )


# What the model learns of a candidate whose C was too long to propose (a failure: the worst).
TOO_LONG = MeasureResult.error("build", "its C is longer than the search's source limit")


def _costs(results: list[MeasureResult], wall: float) -> list[float]:
    """Each of `results`' share of the `wall` seconds that building and timing them took: its
    own run's span, and an even share of the rest (the builds, in parallel)."""
    spans = [max(0.0, span[1] - span[0]) if (span := _run_span(r)) else 0.0 for r in results]
    rest = max(0.0, wall - sum(spans)) / max(1, len(results))
    return [span + rest for span in spans]


def _run_span(result: MeasureResult) -> tuple[float, float] | None:
    """When `result`'s run started and ended (its runner's build_info), or None."""
    info = result.build_info
    if "run_start" not in info or "run_end" not in info:
        return None
    return float(info["run_start"]), float(info["run_end"])


def _mark(result: MeasureResult) -> str | None:
    """The mark a run was timed with ("confirmed", "checked"), None for a trial's."""
    return next((m for m in ("confirmed", "checked") if result.build_info.get(m)), None)


def _marked(result: MeasureResult, mark: str) -> MeasureResult:
    """`result` marked in its build_info: "confirmed" (`Record.confirmed`) or "checked"."""
    return dataclasses.replace(result, build_info={**result.build_info, mark: True})


def _model_inputs(graph: Graph) -> list:
    """Random inputs of `graph`, as `hexir run` draws them (seed 0)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [random_array(tuple(v.type.shape), v.type.dtype, rng) for v in graph.inputs]


def _task_rng(seed: int | None, key: str) -> random.Random:
    # Per task, so that a task's proposals do not depend on the order tasks are tuned in.
    return random.Random() if seed is None else random.Random(f"hexir.tune:{seed}:{key}")


def _default_latency(
    db: Database, task: Task, target: Target, default: Candidate | None
) -> float | None:
    """Where task's `default` schedule candidate stands (`Database.standing`: its best
    against the tune's best on one footing); None where it was never measured."""
    record = (
        None if default is None else db.standing(task.workload_key, target, default.candidate_key)
    )
    return None if record is None else record.median
