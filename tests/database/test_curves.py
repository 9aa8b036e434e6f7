"""Tuning curves (hexir/database/curves.py) from the records of real small tunes: a trial per
candidate, errors included; a point per record; the best so far falls with trials and ends at
the database's best, also where a candidate measured again stands slower; a model's end to
end appears once every task has a valid trial and ends at Σ weight × best."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from db_fixtures import Result, tiny_func, traces
from small_search import SMALL_SEARCH

import hexir
from hexir.database import Record
from hexir.database.curves import Point, estimate_curve, first_created, task_curve
from hexir.frontend.zoo import mlp
from hexir.search.scheduler import extract_tasks

# A small search and quick timing, no re-measurement under load; the confirmation of the best
# at the end (HEXIR_TUNE_CONFIRM_BEST) stays on: records of candidates measured again.
SMALL = SMALL_SEARCH


@pytest.fixture(autouse=True)
def small():
    with hexir.knobs.scope(**SMALL):
        yield


def _non_increasing(points: tuple[Point, ...]) -> None:
    bests = [p.best for p in points]
    known = [b for b in bests if b is not None]
    assert bests[len(bests) - len(known) :] == known  # once known, never unknown again
    assert all(a >= b for a, b in pairwise(known))


def _until_a_repeat(records: list[Record], points: tuple[Point, ...]) -> tuple[Point, ...]:
    """The points before the first record of a candidate measured before."""
    seen: set[str] = set()
    for n, record in enumerate(records):
        if record.candidate_key in seen:
            return points[:n]
        seen.add(record.candidate_key)
    return points


@pytest.mark.slow
def test_a_workload_curve_counts_every_candidate_and_ends_at_the_best(db):
    func = tiny_func()
    key = hexir.workload_key(func)
    hexir.tune(func, "cpu", trials=3, database=db, seed=0)
    measured = db.measured_keys(key, "cpu")
    new = next(t for t in traces(40) if hexir.candidate_key(t.apply(func).func) not in measured)
    db.commit_record(func, "cpu", new, Result(error_kind="build", error_message="refused"))
    hexir.tune(func, "cpu", trials=3, database=db, seed=1)  # continues: 3 more candidates
    records = db.records(key, "cpu")
    curve = task_curve("matmul", key, records)

    assert curve.records == len(records) and curve.trials == len(measured) + 4 == 7
    assert curve.errors == sum(not r.is_valid for r in records) >= 1
    seconds = [p.seconds for p in curve.points]
    assert seconds[0] == 0 and seconds == sorted(seconds)
    assert seconds[-1] == (records[-1].created - records[0].created).total_seconds()
    trials = [p.trial for p in curve.points]
    assert trials[0] == 1 and all(b - a in (0, 1) for a, b in pairwise(trials))
    error = next(i for i, r in enumerate(records) if r.error_kind == "build")
    assert curve.points[error].best == curve.points[error - 1].best
    assert curve.points[error].trial == curve.points[error - 1].trial + 1
    _non_increasing(_until_a_repeat(records, curve.points))
    first = next(r for r in records if r.is_valid)
    (best,) = db.best(key, "cpu", k=1, threshold=0)
    assert curve.first == first.median and curve.best == best.median
    assert curve.speedup == pytest.approx(first.median / best.median)


@pytest.mark.slow
def test_a_candidate_measured_again_stands_where_the_database_puts_it(db):
    func = tiny_func()
    key = hexir.workload_key(func)
    hexir.tune(func, "cpu", trials=4, database=db, seed=0)
    (best,) = db.best(key, "cpu", k=1, threshold=0)
    records = db.records(key, "cpu")
    runs = [r for r in records if r.candidate_key == best.candidate_key]
    # Confirmed again, slower: a candidate a tune confirmed stands at its confirmations.
    slow = 10 * max(r.median for r in records if r.is_valid)
    slower = Result(latencies=(slow,), build_info={"confirmed": True})
    for _ in range(len(runs) + 1):  # more slow records than fast ones: its median is slow
        db.commit_record(func, "cpu", best.load_trace(), slower)
    curve = task_curve("matmul", key, db.records(key, "cpu"))
    (now,) = db.best(key, "cpu", k=1, threshold=0)
    assert now.candidate_key != best.candidate_key
    assert curve.best == now.median > best.median  # the best rose
    assert curve.points[-1].trial == curve.points[-3].trial  # measuring again is no trial


@pytest.mark.slow
def test_a_model_estimate_starts_when_every_task_has_a_valid_trial(db):
    graph = mlp(batch=4, sizes=(32, 16, 8))
    tasks = extract_tasks(graph, "cpu")
    result = hexir.tune(graph, "cpu", trials=8, database=db, seed=0)
    records = [db.records(t.workload_key, "cpu") for t in tasks]
    origin = first_created(records)
    curves = [
        task_curve(t.name, t.workload_key, rs, origin) for t, rs in zip(tasks, records, strict=True)
    ]
    weights = {t.workload_key: t.weight for t in tasks}
    estimate = estimate_curve(curves, weights)

    tuned = {t.workload_key: t.trials for t in result.tasks}
    assert {c.workload_key: c.trials for c in curves} == tuned
    assert len(estimate) == sum(c.records for c in curves) == db.stats().records
    assert estimate[-1].trial == sum(c.trials for c in curves) == result.trials == 8
    assert min(p.seconds for c in curves for p in c.points) == estimate[0].seconds == 0
    assert [p.seconds for p in estimate] == sorted(p.seconds for c in curves for p in c.points)
    for curve, rs in zip(curves, records, strict=True):
        _non_increasing(_until_a_repeat(rs, curve.points))
    # Known from the moment the last task got its first valid trial, not before.
    starts = [next(p.seconds for p in c.points if p.best is not None) for c in curves]
    first = next(p for p in estimate if p.best is not None)
    assert first.seconds == max(starts)
    assert all(p.best is None for p in estimate if p.seconds < max(starts))
    bests = {t.workload_key: db.best(t.workload_key, "cpu", threshold=0)[0].median for t in tasks}
    assert estimate[-1].best == pytest.approx(sum(weights[k] * b for k, b in bests.items()))


ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


def _record(
    minutes: float, median: float | None, candidate: str = "", calibration: float | None = None
) -> Record:
    """A record `minutes` after ORIGIN, of its own candidate unless `candidate` names one."""
    return Record(
        id=f"{minutes:08.3f}", workload_key="w", target_key="cpu-generic",
        candidate_key=candidate or f"c{minutes}", trace="[]",
        latencies=() if median is None else (median,), median=median,
        error_kind=None if median is not None else "build", error_message=None, build_info={},
        hexir_version="0", codegen_version="1", created=ORIGIN + timedelta(minutes=minutes),
        calibration=calibration,
    )  # fmt: skip


def test_records_in_any_order_and_errors_only():
    records = [_record(2, 3e-3), _record(0, 5e-3), _record(1, None), _record(3, 4e-3)]
    curve = task_curve("f", "w", records)
    assert [(p.trial, p.seconds, p.best) for p in curve.points] == [
        (1, 0.0, 5e-3), (2, 60.0, 5e-3), (3, 120.0, 3e-3), (4, 180.0, 3e-3),
    ]  # fmt: skip
    assert (curve.errors, curve.first, curve.best, curve.speedup) == (1, 5e-3, 3e-3, 5 / 3)
    failed = task_curve("f", "w", [_record(0, None), _record(1, None)])
    assert failed.trials == failed.errors == 2 and failed.best is failed.first is None
    assert failed.speedup is None
    empty = task_curve("f", "w", [])
    assert empty.points == () and empty.best is None and first_created([[], []]) is None


def test_an_estimate_needs_a_curve_of_every_weighted_workload():
    a = task_curve("a", "a", [_record(0, 1e-3)], ORIGIN)
    b = task_curve("b", "b", [_record(1, 2e-3)], ORIGIN)
    assert [p.best for p in estimate_curve([a, b], {"a": 3, "b": 1})] == [None, 5e-3]
    assert [p.best for p in estimate_curve([a], {"a": 1, "b": 1})] == [None]
    # A curve not in the weights (a conv's other form) counts as a trial only.
    assert [p.best for p in estimate_curve([a, b], {"a": 2})] == [2e-3, 2e-3]


def test_a_candidate_measured_again_stands_at_its_median_quiet_records_first():
    again = [_record(0, 1.0, "a"), _record(1, 1.2, "b"), _record(2, 1.6, "a"), _record(3, 1.1, "a")]
    # a: 1.0; then 1.0 and 1.6 stand at the slower middle, 1.6 (b leads); then 1.1.
    assert [(p.trial, p.best) for p in task_curve("f", "w", again).points] == [
        (1, 1.0), (2, 1.0), (2, 1.2), (2, 1.1),
    ]  # fmt: skip
    loaded = [_record(0, 2.0, "q"), _record(1, 1.0, "l", calibration=3.0)]
    assert task_curve("f", "w", loaded, threshold=2.0).best == 2.0  # quiet candidates first
    assert task_curve("f", "w", loaded).best == 1.0  # threshold 0: none is loaded
    mixed = [*loaded, _record(2, 1.5, "l")]  # l's quiet record is what it stands at
    assert task_curve("f", "w", mixed, threshold=2.0).best == 1.5
    # A tune's confirmation: c's confirmed runs (1.3) put it first, ahead of u timed once at
    # 1.0, and its run before them (0.9) counts no more, as in Database.best.
    runs = [
        _record(0, 0.9, "c"),
        _record(1, 1.0, "u"),
        *[_record(2 + i, 1.3, "c") for i in range(3)],
    ]
    runs[2:] = [dataclasses.replace(r, build_info={"confirmed": True}) for r in runs[2:]]
    assert [p.best for p in task_curve("f", "w", runs).points] == [0.9, 0.9, 1.3, 1.3, 1.3]
