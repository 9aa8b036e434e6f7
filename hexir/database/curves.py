"""Tuning curves: each task's best latency so far after every trial and over wall time, and a
model's estimated end to end, Σ weight × best so far (`hexir db plot` draws them).

    origin = first_created([a_records, b_records])      # db.records(key, target) of each task
    a = task_curve("matmul", a_key, a_records, origin)
    a.best == db.best(a_key, target, threshold=0)[0].median
    total = estimate_curve([a, b], {a_key: 1, b_key: 2})  # known once both have a valid record

A point per record. A record of a candidate not measured before is a trial, an error too
(which never improves the best); one of a candidate measured before (a suspect time measured
again, the tune's confirmation of its best) is not a trial, but moves where that candidate
stands. The best so far is what `Database.best` would have answered then: each candidate
stands at the median of its quiet records (of all, where none is quiet; the slower of two
middle ones), quiet candidates before loaded ones. So it falls with trials, and rises only
where a candidate measured again turns out slower than its first, lucky run. Plain values,
no plotting here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from hexir.database.record import Record, confirmed_runs, footing, standing

# Where a candidate stands, as Database.best ranks them: (measured under load, its footing:
# confirmed, checked or neither, median, the middle record's created and id).
Standing = tuple[int, int, float, datetime, str]  # loaded, footing, median, created, id


@dataclass(frozen=True)
class Point:
    """After `trial` trials, `seconds` after the origin: the best latency so far in seconds
    (None while no candidate is valid)."""

    trial: int
    seconds: float
    best: float | None


@dataclass(frozen=True)
class TaskCurve:
    """One workload's records in the order they were measured, a point each; `trial` counts
    this task's candidates, `errors` its records with an error."""

    name: str
    workload_key: str
    points: tuple[Point, ...]
    errors: int

    @property
    def trials(self) -> int:
        return self.points[-1].trial if self.points else 0

    @property
    def records(self) -> int:
        return len(self.points)

    @property
    def best(self) -> float | None:
        return self.points[-1].best if self.points else None

    @property
    def first(self) -> float | None:
        """The latency of the first valid trial (usually the default schedule's)."""
        return next((p.best for p in self.points if p.best is not None), None)

    @property
    def speedup(self) -> float | None:
        """The first valid trial's latency over the best."""
        first, best = self.first, self.best
        return None if first is None or best is None else first / best


class _Standings:
    """Where each candidate stands after the records so far, and the best of them."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.runs: dict[str, list[Record]] = {}
        self.standing: dict[str, Standing] = {}
        self.top: Standing | None = None

    def add(self, record: Record) -> None:
        if not record.is_valid or record.median is None:
            return
        key = record.candidate_key
        runs = self.runs.setdefault(key, [])
        runs.append(record)
        before, now = self.standing.get(key), _standing(runs, self.threshold)
        self.standing[key] = now
        if self.top is None or now <= self.top:
            self.top = now
        elif before == self.top:  # the best candidate stands slower now: look again
            self.top = min(self.standing.values())

    @property
    def best(self) -> float | None:
        return None if self.top is None else self.top[2]


def _standing(runs: list[Record], threshold: float) -> Standing:
    """As Database.best ranks a candidate: quiet first, then by `footing` (confirmed, checked,
    neither), at its runs of its lowest footing alone (`confirmed_runs`)."""
    runs = confirmed_runs(runs)
    quietest, middle = standing(runs, [int(r.suspect(threshold)) for r in runs])
    assert middle.median is not None
    return quietest, footing(middle), middle.median, middle.created, middle.id


def first_created(records: Iterable[Sequence[Record]]) -> datetime | None:
    """The time of the earliest record of any of the lists (None when all are empty): the
    common origin of the wall-time axis."""
    return min((r.created for rs in records for r in rs), default=None)


def task_curve(
    name: str,
    workload_key: str,
    records: Sequence[Record],
    origin: datetime | None = None,
    threshold: float = 0.0,
) -> TaskCurve:
    """The curve of one workload's records on one target; `origin` defaults to its first, and
    `threshold` tells records timed under load (`Record.suspect`; 0: none is)."""
    ordered = sorted((r for r in records if not r.in_model), key=lambda r: (r.created, r.id))
    if not ordered:
        return TaskCurve(name, workload_key, (), 0)
    start = ordered[0].created if origin is None else origin
    standings = _Standings(threshold)
    seen: set[str] = set()
    points: list[Point] = []
    for record in ordered:
        seen.add(record.candidate_key)
        standings.add(record)
        seconds = (record.created - start).total_seconds()
        points.append(Point(len(seen), seconds, standings.best))
    errors = sum(not r.is_valid or r.median is None for r in ordered)
    return TaskCurve(name, workload_key, tuple(points), errors)


def estimate_curve(curves: Sequence[TaskCurve], weights: Mapping[str, int]) -> tuple[Point, ...]:
    """Σ weight × best so far over the workloads `weights` names, at every point of any of the
    curves (from one origin); `trial` counts all their trials, and `best` is None until every
    weighted workload has a valid candidate (or for good, where one has no curve)."""
    current: dict[str, float | None] = dict.fromkeys(weights, None)
    trials = [0] * len(curves)
    merged = heapq.merge(
        *([(p.seconds, i, p) for p in c.points] for i, c in enumerate(curves)),
        key=lambda item: (item[0], item[1]),
    )
    points: list[Point] = []
    for seconds, i, point in merged:
        trials[i] = point.trial
        if curves[i].workload_key in current:
            current[curves[i].workload_key] = point.best
        points.append(Point(sum(trials), seconds, _weighted(current, weights)))
    return tuple(points)


def _weighted(latencies: Mapping[str, float | None], weights: Mapping[str, int]) -> float | None:
    total = 0.0
    for key, latency in latencies.items():
        if latency is None:
            return None
        total += weights[key] * latency
    return total
