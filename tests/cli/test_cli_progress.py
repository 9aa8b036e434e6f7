"""The progress of `hexir tune`: the plain line per round (logs) and the live table (terminals),
fed with the Progress values a tune hands its callbacks, over a real database."""

from __future__ import annotations

import dataclasses
import io

import pytest

import hexir
from hexir.cli.progress import DefaultLatencies, LiveDisplay, PlainDisplay, make_display
from hexir.database import Database
from hexir.frontend.zoo import mlp
from hexir.ir.keys import candidate_key
from hexir.runtime.default_schedule import default_schedule
from hexir.search.measure import MeasureResult
from hexir.search.scheduler import extract_tasks
from hexir.search.tune import Progress, TaskProgress


@pytest.fixture
def setup(tmp_path, rng):
    """Three tasks; the first one's default schedule measured for real into the database."""
    target = hexir.Target("cpu")
    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    tasks = extract_tasks(mlp(batch=4, sizes=(32, 16, 8)))
    sch = default_schedule(tasks[0].func, target)
    kernel = hexir.build(sch.func, target)
    args = [rng.uniform(0.5, 1.5, b.shape).astype("float32") for b in tasks[0].func.params]
    seconds = kernel.time(*args)
    db.commit_record(tasks[0].func, target, sch.trace, MeasureResult(latencies=(seconds,)),
                     candidate_key=candidate_key(sch.func))  # fmt: skip
    return db, tasks, target, seconds


def _progress(tasks, best, done, task):
    rows = tuple(
        TaskProgress(t.name, t.workload_key, t.weight, t.flops, b, 4 if b else 0, t.alternative)
        for t, b in zip(tasks, best, strict=True)
    )
    return Progress(done, 12, rows, elapsed=3.0, eta=6.0, task=task)


def test_default_latencies_come_from_the_database(setup):
    db, tasks, target, seconds = setup
    defaults = DefaultLatencies(db, tasks, target)
    assert defaults.get(0) == pytest.approx(seconds) and defaults.get(1) is None


def test_a_default_first_timed_under_load_moves_once_measured_quietly(setup):
    db, tasks, target, seconds = setup
    sch = default_schedule(tasks[1].func, target)
    loaded = MeasureResult(latencies=(50 * seconds,), build_info={"calibration": 9.0})
    db.commit_record(
        tasks[1].func, target, sch.trace, loaded, candidate_key=candidate_key(sch.func)
    )
    defaults = DefaultLatencies(db, tasks, target)
    assert defaults.get(1) == pytest.approx(50 * seconds)
    quiet = MeasureResult(latencies=(seconds,), build_info={"calibration": 1.1})
    db.commit_record(tasks[1].func, target, sch.trace, quiet, candidate_key=candidate_key(sch.func))
    assert defaults.refresh(1) == pytest.approx(seconds) == defaults.get(1)


def test_the_default_on_the_best_footing_is_shown_where_the_tune_knows_it(setup):
    # The database holds the default's one run; the tune read its gain over the default in
    # turn (TaskProgress.default_latency): that ratio is what the line shows.
    db, tasks, target, seconds = setup
    out = io.StringIO()
    progress = _progress(tasks, [seconds / 2, seconds, seconds], 12, 0)
    rows = list(progress.tasks)
    rows[0] = dataclasses.replace(rows[0], default_latency=1.25 * seconds / 2)
    with make_display(out, tasks, DefaultLatencies(db, tasks, target)) as display:
        display.update(dataclasses.replace(progress, tasks=tuple(rows)))
        display.update(progress)  # the tune does not know it: as the database stands
    first, second = out.getvalue().splitlines()
    assert "1.25x over default" in first and "2.00x over default" not in first
    assert "2.00x over default" in second


def test_a_plain_line_per_round_with_speedup_and_eta(setup):
    db, tasks, target, seconds = setup
    out = io.StringIO()
    display = make_display(out, tasks, DefaultLatencies(db, tasks, target))
    assert isinstance(display, PlainDisplay)  # a StringIO is no terminal
    with display:
        display.update(_progress(tasks, [seconds / 2, None, None], 4, 0))
        display.update(_progress(tasks, [seconds / 2, seconds, seconds], 12, 2))
    first, last = out.getvalue().splitlines()
    assert first.startswith("[ 4/12] 3s ETA 6s | task 0 fused_matmul_bias_add_relu (x1)")
    assert "2.00x over default" in first and "(2 tasks without a valid measurement yet)" in first
    assert last.startswith("[12/12]") and "model est." in last
    assert display.trials == {tasks[0].workload_key: 4, tasks[1].workload_key: 4,
                              tasks[2].workload_key: 4}  # fmt: skip


def test_the_live_table_shows_every_task(setup):
    from rich.console import Console

    db, tasks, target, seconds = setup
    display = LiveDisplay(io.StringIO(), tasks, DefaultLatencies(db, tasks, target))
    console = Console(file=io.StringIO(), width=120, record=True)
    console.print(display._render(_progress(tasks, [seconds / 4, None, None], 4, 0)))
    text = console.export_text()
    assert "trials 4/12" in text and "ETA 6s" in text
    for task in tasks:
        assert task.name in text
    assert "4.00x" in text


def test_the_model_estimate_leaves_out_a_convs_other_form(setup):
    import dataclasses

    db, tasks, target, seconds = setup
    # The last task made a conv's other form: not in the model as the rule builds it.
    marked = [*tasks[:-1], dataclasses.replace(tasks[-1], alternative=True)]
    out = io.StringIO()
    with PlainDisplay(out, marked, DefaultLatencies(db, marked, target)) as display:
        display.update(_progress(marked, [seconds / 2, seconds, None], 8, 1))  # other: unknown
        display.update(_progress(marked, [seconds / 2, seconds, 100 * seconds], 12, 2))
    first, last = out.getvalue().splitlines()
    assert "model est. " + hexir.cli.common.ms(seconds / 2 + seconds) + " ms" in first
    assert "model est. " + hexir.cli.common.ms(seconds / 2 + seconds) + " ms" in last
