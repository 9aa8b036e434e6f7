"""`hexir.tune` end to end on the CPU: real builds, the real runner, a real SQLite database
(and a real local Ray cluster): records written, best traces that replay to right answers, a
stopped tune that resumes without re-measuring, seeded reproducibility."""

from __future__ import annotations

import random

import numpy as np
import pytest
from small_search import SMALL_SEARCH, reading_executor
from tuned_rule import expected_schedule

import hexir
from hexir.costmodel import RandomModel, XGBModel
from hexir.database import Database
from hexir.frontend.zoo import mlp
from hexir.graph.evaluate import evaluate
from hexir.search.tune import CONFIRM_ROUNDS, DISAGREE, Progress, tune

# A small search and quick timing; these tests count records: no confirmation of the best
# at the end either, nor of a claimed gain as a tune goes (their own tests turn them on).
SMALL = {**SMALL_SEARCH, "tune_confirm_best": 0, "tune_check_gain": 0}


@pytest.fixture(autouse=True)
def small():
    with hexir.knobs.scope(**SMALL):
        yield


@pytest.fixture
def db(tmp_path):
    return Database(f"sqlite:///{tmp_path / 'tune.db'}")


def _matmul():
    return hexir.workload("matmul", M=64, N=64, K=64)


def _check_matmul(trace):
    func = _matmul()
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((64, 64)).astype("float32") for _ in range(2))
    c = np.full((64, 64), np.nan, "float32")
    hexir.build(trace.apply(func).func, "cpu")(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def _keys(db, func):
    return [r.candidate_key for r in db.records(hexir.workload_key(func), "cpu")]


@pytest.mark.serial
def test_a_tiny_tune_end_to_end_in_this_process(db, rng):
    # The quick loop's (`-m "not slow"`) one whole tune: search, build, check, time, record,
    # then the best record replayed and compiled into a model. No Ray: LocalExecutor.
    func = hexir.workload("matmul", M=16, N=16, K=16)
    result = hexir.tune(func, "cpu", trials=4, database=db, seed=0)
    (task,) = result.tasks
    records = db.records(hexir.workload_key(func), "cpu")
    assert result.trials == task.trials == 4
    assert len({r.candidate_key for r in records}) == len(records) == 4
    (best,) = db.best(task.workload_key, "cpu", k=1)
    replayed = task.best_trace.apply(func).func
    assert hexir.candidate_key(replayed) == best.candidate_key and task.best_latency == best.median
    a, b = (rng.standard_normal((16, 16)).astype("float32") for _ in range(2))
    c = np.full((16, 16), np.nan, "float32")
    hexir.build(replayed, "cpu")(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    builder = hexir.GraphBuilder("one_matmul")
    x, y = builder.input("a", (16, 16)), builder.input("b", (16, 16))
    graph = builder.build(builder.matmul(x, y))
    module = hexir.compile(graph, "cpu", database=db)
    assert [r.schedule for r in module.report] == ["tuned"]
    (out,) = module.run([a, b])
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tune_a_matmul_records_every_trial_and_its_best_replays(db):
    seen: list[Progress] = []
    result = tune(_matmul(), "cpu", trials=10, database=db, seed=0, callbacks=[seen.append])
    (task,) = result.tasks
    assert result.trials == task.trials == 10
    keys = _keys(db, _matmul())
    assert len(keys) == 10 == len(set(keys))
    assert task.best_latency == min(r.median for r in db.best(task.workload_key, "cpu", k=10))
    assert task.default_latency is not None and task.best_latency <= task.default_latency
    _check_matmul(task.best_trace)
    # A first round of a quarter of the trials (tune_first_round_share), then rounds of 4.
    assert [p.trials_done for p in seen] == [2, 6, 10] and seen[-1].eta == 0
    assert seen[-1].best == {task.workload_key: task.best_latency}
    assert result.profile["building"] > 0 and result.profile["measuring"] > 0


@pytest.mark.slow
def test_tune_a_graph_spends_the_budget_across_its_tasks(db):
    graph = mlp(batch=4, sizes=(16, 16, 8))
    result = tune(graph, "cpu", trials=9, database=db, seed=0, model=XGBModel(seed=0))
    assert [t.weight for t in result.tasks] == [1, 1, 1]
    # A first round of one trial each (a quarter of 9 is under one per task), then rounds
    # where the gain is.
    assert all(t.trials >= 1 for t in result.tasks) and result.trials == 9
    assert sum(t.trials for t in result.tasks) == 9
    assert all(t.best_trace is not None for t in result.tasks)
    module = hexir.compile(graph, "cpu", database=db)
    for r in module.report:  # tuned unless the default stands within the margin of the best
        schedule, best = expected_schedule(db, graph, r.workload_key)
        assert r.schedule == schedule
        if schedule == "tuned":
            assert r.trace == best.load_trace()
    x = np.random.default_rng(2).standard_normal((4, 16)).astype("float32")
    (out,) = module.run([x])
    (expected,) = evaluate(graph, [x])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_stopped_tune_resumes_without_measuring_anything_twice(db):
    def stop(progress: Progress) -> None:
        if progress.trials_done >= 3:  # after the first round: a quarter of 12
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(_matmul(), "cpu", trials=12, database=db, seed=1, model=RandomModel(1),
             callbacks=[stop])  # fmt: skip
    before = _keys(db, _matmul())
    assert len(before) == 3
    result = tune(_matmul(), "cpu", trials=6, database=db, seed=1, model=RandomModel(1))
    after = _keys(db, _matmul())
    assert result.trials == 6 and len(after) == 9 == len(set(after))
    assert after[:3] == before


@pytest.mark.slow
@pytest.mark.serial
def test_a_seeded_tune_proposes_the_same_candidates(tmp_path):
    def run(name):
        db = Database(f"sqlite:///{tmp_path / name}")
        tune(_matmul(), "cpu", trials=8, database=db, seed=3, model=RandomModel(3))
        return _keys(db, _matmul())

    assert run("a.db") == run("b.db")


@pytest.mark.slow
@pytest.mark.serial
def test_tune_on_a_local_ray_cluster(db):
    result = tune(_matmul(), "cpu", trials=6, database=db, seed=0, ray_address="local")
    (task,) = result.tasks
    assert task.trials == 6 and len(_keys(db, _matmul())) == 6
    _check_matmul(task.best_trace)


@pytest.mark.slow
@pytest.mark.serial
def test_a_time_budget_ends_the_tune_where_it_has_no_room_for_another_trial(db):
    func = _matmul()
    seen: list[Progress] = []
    result = tune(func, "cpu", trials=None, time_budget=5.0, database=db, seed=0,
                  callbacks=[seen.append])  # fmt: skip
    assert result.out_of_time and result.trials > 0
    # A slice stops when the budget is spent, and none starts that it has no room for: the
    # overrun is at most one slice's builds (one per worker, each well under a second here).
    assert result.elapsed < 5.0 + 3.0
    assert len(_keys(db, func)) == result.trials  # every measurement committed
    assert seen and all(p.trials_total is None and p.time_budget == 5.0 for p in seen)
    assert all(p.eta is not None and p.eta <= max(0.0, 5.0 - p.elapsed) + 1e-6 for p in seen)
    _check_matmul(result.tasks[0].best_trace)


def test_trials_end_a_tune_before_its_time_budget_does(db):
    result = tune(_matmul(), "cpu", trials=4, time_budget=600.0, database=db, seed=0)
    assert result.trials == 4 and not result.out_of_time


@pytest.mark.parametrize(
    "trials, budget, message",
    [(None, None, "needs a budget"), (4, 0.0, "time_budget must be"), (-1, None, "trials must")],
)
def test_a_tune_needs_a_budget_it_can_spend(db, trials, budget, message):
    with pytest.raises(ValueError, match=message):
        tune(_matmul(), "cpu", trials=trials, time_budget=budget, database=db)
    assert db.stats().records == 0


class Informed:
    """A cost model whose scores count as informed from the first round (a fixed order by
    candidate key), so that every round evolves; it counts its calls."""

    informed = True

    def __init__(self):
        self.calls = 0

    def predict(self, candidates):
        self.calls += 1
        return np.array([int(c.candidate_key[:8], 16) for c in candidates], dtype=float)

    def update(self, candidates, results):
        pass


@pytest.mark.parametrize("ratio, later", [pytest.param(0.0, 3, marks=pytest.mark.slow), (1e-9, 1)])
def test_a_round_searches_for_a_share_of_the_time_its_measurements_take(db, ratio, later):
    # A round scores its population once per generation (SMALL: 2) and once more. From the
    # second round on the task's pace is known: a ratio that leaves no time stops the search
    # at its first samples, scored once and never bred; 0 is no limit.
    model, calls = Informed(), []
    with hexir.knobs.scope(
        search_time_ratio=ratio, search_measure_per_round=2, tune_first_round_share=1.0
    ):
        result = tune(_matmul(), "cpu", trials=6, database=db, seed=0, model=model,
                      callbacks=[lambda _: calls.append(model.calls)])  # fmt: skip
    assert result.trials == 6
    assert np.diff([0, *calls]).tolist() == [3, later, later]


def test_a_tasks_first_round_searches_at_the_pace_of_the_tasks_before_it(db):
    # The model counts as informed from the start, so every round would evolve (SMALL: two
    # generations, three scorings). The first task's first round has no pace to go by and
    # evolves in full; the next tasks' first rounds go by the first task's trials, and a
    # ratio that leaves no time stops them at their first samples, scored once.
    graph = mlp(batch=4, sizes=(16, 16, 8))
    model, calls = Informed(), []
    with hexir.knobs.scope(
        search_time_ratio=1e-9, search_measure_per_round=2, tune_first_round_share=1.0
    ):
        result = tune(graph, "cpu", trials=6, database=db, seed=0, model=model,
                      callbacks=[lambda _: calls.append(model.calls)])  # fmt: skip
    assert [t.trials for t in result.tasks] == [2, 2, 2]
    assert np.diff([0, *calls]).tolist() == [3, 1, 1]


def test_the_best_few_and_the_default_are_measured_again_at_the_end(db):
    func = _matmul()
    with hexir.knobs.scope(tune_confirm_best=2):
        result = tune(func, "cpu", trials=6, database=db, seed=0, model=RandomModel(seed=0))
    records = db.records(hexir.workload_key(func), "cpu")
    assert result.trials == 6 and len(records) == 6 + result.confirmed
    first = records[:6]  # the trials, in the order measured; then the confirmations
    runs: dict[str, list[float]] = {}
    for r in records:
        runs.setdefault(r.candidate_key, []).append(r.median)
    again = {r.candidate_key for r in records[6:]}
    # The two fastest of the trials and the default (the first trial), in rounds: each of
    # them once a round.
    fastest = sorted(first, key=lambda r: r.median)[:2]
    assert again == {r.candidate_key for r in fastest} | {first[0].candidate_key}
    n = 1 + CONFIRM_ROUNDS  # once more each round; once more still where the middle two of
    for k in again:  # those runs disagreed (tune.DISAGREE)
        first_n = sorted(runs[k][:n])
        middle = first_n[n // 2 - 1 : n // 2 + 1]
        assert len(runs[k]) == (n + 1 if middle[1] > DISAGREE * middle[0] else n)
    assert result.confirmed == sum(len(runs[k]) - 1 for k in again)
    # Each round timed them in turn, a call of each then the next of each.
    rounds = records[6 : 6 + len(again) * CONFIRM_ROUNDS]
    assert all(r.build_info["in_turn"] == len(again) for r in rounds)
    # The best is the confirmed one that stands fastest, at the median of its confirmations
    # (the slower of two middle ones), which were timed in turn with its rivals: not its
    # trial, timed alone at another time.
    (best,) = db.best(hexir.workload_key(func), "cpu", k=1)
    standing = {k: sorted(runs[k][1:])[len(runs[k][1:]) // 2] for k in again}
    assert best.confirmed and all(r.confirmed for r in records[6:])
    assert best.median == min(standing.values()) == result.tasks[0].best_latency
    # The default stands the same way, not at its luckier run.
    assert result.tasks[0].default_latency == standing[first[0].candidate_key]
    _check_matmul(best.load_trace())


@pytest.mark.serial
def test_a_confirmed_candidate_whose_middle_runs_disagree_is_measured_once_more(db):
    import dataclasses

    from hexir.search.executor import LocalExecutor

    class Disturbed(LocalExecutor):
        """The default schedule's first two runs (the tune's first result, and its first
        confirmation) timed 20x too slow, as by a load the calibration missed."""

        default, slowed = None, 0

        def measure_each(self, candidates):
            yield from self._disturbed(candidates, super().measure_each(candidates))

        def measure_in_turn(self, candidates):
            return list(self._disturbed(candidates, super().measure_in_turn(candidates)))

        def _disturbed(self, candidates, results):
            for c, r in zip(candidates, results, strict=True):
                self.default = self.default or c.candidate_key  # measured first
                if c.candidate_key == self.default and self.slowed < 2 and r.latencies:
                    self.slowed += 1
                    r = dataclasses.replace(r, latencies=tuple(20 * x for x in r.latencies))
                yield r

    func = _matmul()
    with hexir.knobs.scope(tune_confirm_best=2), Disturbed("cpu") as executor:
        result = tune(func, "cpu", trials=6, database=db, seed=0, model=RandomModel(seed=0),
                      executor=executor)  # fmt: skip
    records = db.records(hexir.workload_key(func), "cpu")
    default = records[0].candidate_key
    runs = sorted(r.median for r in records if r.candidate_key == default)
    # Two slow runs and two quiet ones: the middle two disagree, and a fifth run decides.
    n = 1 + CONFIRM_ROUNDS
    assert len(runs) == n + 1 and runs[-1] > 5 * runs[0] and runs[-2] > 5 * runs[0]
    # The median of the five, a quiet run, not a slow one (on a noisy host a quiet run itself
    # may read a few times another: 41 against 6 us once, so no ratio to the slow ones).
    assert result.tasks[0].default_latency == runs[n // 2] < runs[-2]
    # The others once a round: once more only where their middle runs disagreed too.
    again = [k for k in {r.candidate_key for r in records[6:]} if k != default]
    assert again
    for k in again:
        first_n = sorted([r.median for r in records if r.candidate_key == k][:n])
        middle = first_n[n // 2 - 1 : n // 2 + 1]
        ran = sum(r.candidate_key == k for r in records)
        assert ran == n or (ran == n + 1 and middle[1] > DISAGREE * middle[0])


@pytest.mark.serial
@pytest.mark.parametrize("check", [1.03, 0])
def test_a_gain_read_once_is_timed_beside_the_best_before_the_tune_credits_it(db, check):
    import dataclasses

    from hexir.search.executor import LocalExecutor

    class Lucky(LocalExecutor):
        """Every trial but the first (the default schedule) reads 100x faster than it ran: a
        host's fast second, larger than life. Timed in turn, they read as they ran."""

        default = None

        def measure_each(self, candidates):
            for c, r in zip(candidates, super().measure_each(candidates), strict=True):
                self.default = self.default or c.candidate_key
                if c.candidate_key != self.default and r.latencies:
                    r = dataclasses.replace(r, latencies=tuple(x / 100 for x in r.latencies))
                yield r

    func, seen = _matmul(), []
    # The calibration on (as the other tests of loads): a check timed while the host ran
    # something else judges nothing, it is timed again (a loaded host once read the best 360x
    # slower than a claim in turn, uncalibrated, and the best fell below a lucky read).
    threshold = 4.0
    settings = {"tune_check_gain": check, "measure_calibration_threshold": threshold}
    with hexir.knobs.scope(**settings), Lucky("cpu") as executor:
        result = tune(func, "cpu", trials=8, database=db, seed=0, model=RandomModel(seed=0),
                      executor=executor, callbacks=[seen.append])  # fmt: skip
    records = db.records(hexir.workload_key(func), "cpu")
    default = records[0].candidate_key
    trials = [r for r in records if not r.checked and not r.suspect(threshold)]
    lucky = min(r.median for r in trials if r.candidate_key != default)
    best = [p.tasks[0].best_latency for p in seen]
    if not check:  # credited as read: a lucky read is the best, as it goes and at the end
        # (which: one timed again quietly may have replaced a loaded one since the last report)
        assert result.checked == 0 and max(best[-1], result.tasks[0].best_latency) < 10 * lucky
        assert seen[-1].tasks[0].default_latency is None  # the tune cannot tell the gain
        return
    # Each claim was timed in turn with the best's holder (the default at first), and the
    # tune's best moved by the ratio read there, not to a read 100x too fast.
    checks = [r for r in records if r.checked]
    assert not any(r.confirmed for r in records)  # (the end's confirmation is off)
    assert len(checks) >= result.checked > 0  # (and those timed again, where loaded)
    assert len(records) == result.trials + result.checked + result.remeasured
    assert default in {r.candidate_key for r in checks}
    assert sum(r.build_info.get("in_turn", 0) >= 2 for r in checks) >= result.checked
    assert all(b > 10 * lucky for b in best)
    # The default's time on the best's footing: the gains timed in turn over it, from 1 (its
    # first run held the best), never a lucky read's 100.
    over = [p.tasks[0].default_latency / p.tasks[0].best_latency for p in seen]
    assert all(1 <= x < 10 for x in over)
    # The end too: the database ranks the checked candidates, at their checks, first.
    assert result.tasks[0].best_latency > 10 * lucky
    _check_matmul(result.tasks[0].best_trace)


@pytest.mark.serial
def test_the_best_is_a_confirmed_candidate_though_the_host_slowed_for_the_confirmation(db):
    import dataclasses

    from hexir.search.executor import LocalExecutor

    class SlowAtTheEnd(LocalExecutor):
        """The confirmation's rounds timed 1000x slower: a slow spell of the host, larger
        than life, so that every trial timed once reads faster than the confirmed."""

        def measure_in_turn(self, candidates):
            slow = super().measure_in_turn(candidates)
            return [dataclasses.replace(r, latencies=tuple(1000 * x for x in r.latencies))
                    for r in slow]  # fmt: skip

    func = _matmul()
    with hexir.knobs.scope(tune_confirm_best=2), SlowAtTheEnd("cpu") as executor:
        result = tune(func, "cpu", trials=6, database=db, seed=0, model=RandomModel(seed=0),
                      executor=executor)  # fmt: skip
    key = hexir.workload_key(func)
    records = db.records(key, "cpu")
    confirmed = {r.candidate_key for r in records if r.confirmed}
    assert confirmed and not any(r.confirmed for r in records[: result.trials])
    # The trials not confirmed read faster than the confirmed (one run against three runs
    # 1000x slower); the best is still a confirmed one, the fastest of them.
    (best,) = db.best(key, "cpu", k=1)
    assert best.candidate_key in confirmed
    standings = {k: db.standing(key, "cpu", k).median for k in confirmed}
    assert best.median == min(standings.values()) == result.tasks[0].best_latency
    assert db.best(key, "cpu", k=1, confirmed_first=False)[0].candidate_key not in confirmed


def _under_a_passing_load(result):
    """`result` as a run timed while a load came and went reads: its first latency quiet, the
    others 10x slower, the calibration kernel right after it quiet; with the figure the
    worker then gives it (`load`)."""
    import dataclasses

    from hexir.search.calibration import load

    latencies = tuple(x * (10 if n else 1) for n, x in enumerate(result.latencies))
    figure = load(result.build_info.get("calibration_kernel", 1.0), latencies)
    info = {**result.build_info, "calibration": figure}
    return dataclasses.replace(result, latencies=latencies, build_info=info)


@pytest.mark.serial
def test_a_check_whose_holder_read_under_a_load_moves_no_best(db):
    import dataclasses

    from hexir.search.evolutionary import EvolutionarySearch

    func = _matmul()
    default = EvolutionarySearch(func, "cpu", rng=random.Random(0)).default.candidate_key

    def read(c, r):
        """Every trial but the default's reads 100x faster than it ran (as above); the default,
        timed in turn beside a claim, reads 1000x slower under a load its calibration sees."""
        if not r.latencies:
            return r
        if c.candidate_key != default and "in_turn" not in r.build_info:
            return _quiet(dataclasses.replace(r, latencies=tuple(x / 100 for x in r.latencies)))
        if c.candidate_key == default and "in_turn" in r.build_info:
            info = {**r.build_info, "calibration": 50.0}
            return dataclasses.replace(r, latencies=tuple(x * 1000 for x in r.latencies),
                                       build_info=info)  # fmt: skip
        return _quiet(r)

    seen: list = []
    settings = {"tune_check_gain": 1.03, "measure_calibration_threshold": 4.0}
    with hexir.knobs.scope(**settings), reading_executor(read)("cpu") as executor:
        result = tune(func, "cpu", trials=8, database=db, seed=0, model=RandomModel(seed=0),
                      executor=executor, callbacks=[seen.append])  # fmt: skip
    records = db.records(hexir.workload_key(func), "cpu")
    lucky = min(r.median for r in records if r.candidate_key != default and not r.checked)
    assert result.checked > 0 and result.remeasured > 0  # checked, and the loaded reads again
    # A claim against a holder read 1000x slow would have moved the best 1000x down, below
    # the lucky reads; a loaded read judges nothing, so the best stays the default's.
    assert all(p.tasks[0].best_latency > 10 * lucky for p in seen)


def _quiet(result):
    """`result` as the worker reads it on a quiet host: its calibration at 1. The tests that
    spoil some runs read the others so, whatever this host's load while they run (a CI host
    at half speed read the real ones loaded, and the tune put off what they test)."""
    import dataclasses

    if result.calibration is None:
        return result
    return dataclasses.replace(result, build_info={**result.build_info, "calibration": 1.0})


@pytest.mark.serial
def test_a_confirmation_timed_under_a_load_is_confirmed_again_in_turn(db):
    spoiled: list[str] = []

    def spoil(c, r):
        """The confirmation's first round timed under a passing load: each candidate's first
        run in turn."""
        if "in_turn" not in r.build_info or c.candidate_key in spoiled or not r.latencies:
            return _quiet(r)
        spoiled.append(c.candidate_key)
        return _under_a_passing_load(r)

    func = _matmul()
    threshold = 4.0  # a quiet calibration reads up to 2.4 on a host whose speed shifts so
    settings = {"tune_confirm_best": 2, "measure_calibration_threshold": threshold}
    with hexir.knobs.scope(**settings), reading_executor(spoil)("cpu") as executor:
        result = tune(func, "cpu", trials=6, database=db, seed=0, model=RandomModel(seed=0),
                      executor=executor)  # fmt: skip
    records = db.records(hexir.workload_key(func), "cpu")
    assert len(spoiled) >= 2 and result.remeasured >= len(spoiled)
    for key in spoiled:
        runs = [r for r in records if r.candidate_key == key]
        first = next(r for r in runs if r.confirmed)
        assert first.suspect(threshold)  # 10x its fastest call, the calibration notwithstanding
        # Measured again last, as a confirmation: where the database ranks it.
        assert runs[-1].confirmed and runs[-1].created > first.created


@pytest.mark.serial
def test_a_candidate_whose_trial_runs_spent_their_tries_still_has_its_confirmation_timed_again(
    db,
):
    from hexir.search.evolutionary import EvolutionarySearch

    func = _matmul()
    default = EvolutionarySearch(func, "cpu", rng=random.Random(0)).default.candidate_key
    spoiled: list = []  # the runs it spoiled

    def spoil(c, r):
        """The default's runs timed under a passing load: its trial and each time it is
        timed again as one, and its three confirmations."""
        confirmations = sum("in_turn" in x.build_info for x in spoiled)
        if c.candidate_key != default or confirmations == CONFIRM_ROUNDS or not r.latencies:
            return _quiet(r)
        spoiled.append(_under_a_passing_load(r))
        return spoiled[-1]

    threshold = 4.0  # as above
    settings = {"tune_confirm_best": 2, "measure_calibration_threshold": threshold}
    with hexir.knobs.scope(**settings), reading_executor(spoil)("cpu") as executor:
        tune(func, "cpu", trials=6, database=db, seed=0, model=RandomModel(seed=0),
             executor=executor)  # fmt: skip
    trials = [r for r in spoiled if "in_turn" not in r.build_info]
    assert len(trials) >= 2 and len(spoiled) - len(trials) == CONFIRM_ROUNDS
    runs = [r for r in db.records(hexir.workload_key(func), "cpu") if r.candidate_key == default]
    # Its trial's two tries are spent; its confirmations have their own: one more confirmation,
    # quiet, where the database ranks it.
    confirmations = [r for r in runs if r.confirmed]
    assert len(confirmations) > CONFIRM_ROUNDS and not confirmations[-1].suspect(threshold)


def test_candidates_slower_than_the_cutoff_are_timed_by_one_call(db):
    # A ratio so small that every candidate is past it once the task has a best: each is
    # timed by one warm call; the first (no best yet) and the confirmations in full.
    func = _matmul()
    with hexir.knobs.scope(measure_cutoff=1e-6, tune_confirm_best=2):
        result = tune(func, "cpu", trials=5, database=db, seed=0, model=RandomModel(seed=0))
    records = db.records(hexir.workload_key(func), "cpu")
    trials, confirmed = records[: result.trials], records[result.trials :]
    assert len(trials[0].latencies) == SMALL["timing_repeats"]
    assert all(len(r.latencies) == 1 for r in trials[1:] if r.is_valid)
    assert confirmed and all(len(r.latencies) == SMALL["timing_repeats"] for r in confirmed)


def test_candidates_too_long_to_propose_teach_the_model_they_are_the_worst(db, monkeypatch):
    # A source limit of the default's own length: about half of the samples print longer.
    # They are never measured, and the model learns each one as a failure.
    from hexir.search.evolutionary import EvolutionarySearch
    from hexir.search.tune import TOO_LONG

    func = _matmul()
    limit = EvolutionarySearch(func, "cpu", rng=random.Random(0)).default.c_lines
    monkeypatch.setattr(EvolutionarySearch, "source_limit", property(lambda self: limit))

    class Recording(RandomModel):
        def update(self, candidates, results):
            seen.extend(zip(candidates, results, strict=True))

    seen = []
    result = tune(func, "cpu", trials=12, database=db, seed=0, model=Recording(seed=0))
    refused = [c for c, r in seen if r is TOO_LONG]
    assert refused and all(c.longer_than(limit) for c in refused)
    assert TOO_LONG.error_kind == "build" and not TOO_LONG.ok
    assert {c.candidate_key for c in refused}.isdisjoint(_keys(db, func))
    measured = [c for c, r in seen if r is not TOO_LONG]
    assert len(measured) == result.trials and all(c.c_lines <= limit for c in measured)


def test_a_trials_cost_is_its_own_run_and_a_share_of_the_builds():
    from hexir.search.measure import MeasureResult
    from hexir.search.tune import _costs

    timed = [
        MeasureResult((1e-3,), build_info={"run_start": 10.0, "run_end": 10.5}),
        MeasureResult((1e-3,), build_info={"run_start": 11.0, "run_end": 13.0}),
        MeasureResult.error("build", "no such intrinsic", {}),
    ]
    # 2.5 s of runs in 4 s: 1.5 s of builds, 0.5 s each.
    assert _costs(timed, 4.0) == pytest.approx([1.0, 2.5, 0.5])
    assert _costs([], 1.0) == []


@pytest.mark.slow
def test_a_tasks_first_slice_is_one_build_per_worker_and_sets_the_cutoff_of_the_rest(db):
    from hexir.search.executor import LocalExecutor
    from hexir.search.measure import Candidate

    slices: list[list[Candidate]] = []

    class Slicing(LocalExecutor):
        def measure_each(self, candidates):
            slices.append(list(candidates))
            return super().measure_each(candidates)

    knobs = dict(search_measure_per_round=8, tune_first_round_share=1.0,
                 measure_build_workers=2, measure_batch_per_worker=3)  # fmt: skip
    with hexir.knobs.scope(**knobs), Slicing("cpu") as executor:
        result = tune(_matmul(), "cpu", trials=8, database=db, seed=0, executor=executor,
                      model=RandomModel(seed=0))  # fmt: skip
    assert result.trials == 8
    assert [len(s) for s in slices] == [2, 6]
    assert all(c.cutoff is None and c.near is None for c in slices[0])
    best = min(r.median for r in db.records(hexir.workload_key(_matmul()), "cpu")[:2])
    for c in slices[1]:
        assert c.cutoff == pytest.approx(3 * best) and c.near == pytest.approx(1.5 * best)
