"""Winograd or direct: each conv's form, measured (hexir/graph/forms.py)."""

from __future__ import annotations

import numpy as np
import pytest
from small_search import reading_executor

import hexir
from hexir import knobs
from hexir.costmodel import RandomModel
from hexir.database import Database
from hexir.graph.evaluate import evaluate
from hexir.graph.forms import form_variants, measured_forms, mixed_forms, winograd_choices
from hexir.ops.builder import GraphBuilder
from hexir.runtime.target import Target
from hexir.search.scheduler import extract_tasks
from hexir.search.tune import tune


def _conv(b: GraphBuilder, x, rng: np.random.Generator, channels: int):
    weight = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(
        np.float32
    )
    y = b.conv2d(x, b.constant(weight), padding=1)
    return b.relu(b.bias_add(y, b.constant(rng.standard_normal(channels).astype(np.float32))))


def _one_conv(rng: np.random.Generator, size: int = 28) -> hexir.Graph:
    b = GraphBuilder("one_conv")
    return b.build(_conv(b, b.input("x", (1, 8, size, size)), rng, 8))


def _two_convs(rng: np.random.Generator) -> hexir.Graph:
    # 28x28: 49 tiles of 4x4, the rule's F(4, 3); 7x7: too few tiles, the rule's direct conv.
    b = GraphBuilder("two_convs")
    big = _conv(b, b.input("x", (1, 8, 28, 28)), rng, 8)
    small = _conv(b, b.input("y", (1, 8, 7, 7)), rng, 8)
    return b.build([big, small])


def _conv_names(graph: hexir.Graph) -> list[str]:
    from hexir.graph.rewrite import simplify_graph

    return [op.result.name for op in simplify_graph(graph).ops if op.kind == "conv2d"]


def test_each_conv_has_the_rules_form_and_the_other(rng):
    graph = _two_convs(rng)
    big, small = _conv_names(graph)
    assert winograd_choices(graph) == {big: (4, 0), small: (0, 2)}
    assert form_variants(graph) == [{big: 4, small: 0}, {big: 0, small: 2}]
    with knobs.scope(winograd="0"):  # a forced tile leaves nothing to choose
        assert winograd_choices(graph) == {} and form_variants(graph) == [{}]
    assert winograd_choices(graph, "cuda -arch=sm_90") == {}


def test_tuning_tasks_cover_both_forms_of_each_conv(rng):
    graph = _two_convs(rng)
    names = [t.func.name for t in extract_tasks(graph, "cpu")]
    # The 28x28 conv: its Winograd kernels (the rule's) and its direct kernel (the other
    # form); the 7x7 conv: its direct kernel and its F(2, 3) kernels.
    assert names.count("fused_conv2d_bias_add_relu") == 2
    assert names.count("winograd_input") == 2 and names.count("winograd_output") == 2
    with knobs.scope(winograd="0"):
        assert [t.func.name for t in extract_tasks(graph, "cpu")] == [
            "fused_conv2d_bias_add_relu"
        ] * 2


def test_without_measurements_of_both_forms_the_rule_stands(rng, tmp_path):
    graph = _two_convs(rng)
    big, small = _conv_names(graph)
    db = Database(f"sqlite:///{tmp_path / 'empty.db'}")
    assert measured_forms(graph, "cpu", db) == {big: 4, small: 0}
    module = hexir.compile(graph, "cpu", database=db)
    assert sum(r.ops[0] == "winograd_input" for r in module.report) == 1


def _total(graph: hexir.Graph, db: Database, winograd: str) -> float:
    """The sum of the best times `db` holds for the kernels of `graph` with every conv's form
    forced by the knob (none chosen from the database)."""
    with knobs.scope(winograd=winograd):
        module = hexir.compile(graph, "cpu", database=db)
    assert {r.schedule for r in module.report} == {"tuned"}
    return sum(db.best(r.workload_key, "cpu", k=1)[0].median for r in module.report)


@pytest.mark.slow
def test_compile_gives_a_conv_the_form_its_measured_kernels_make_faster(rng, tmp_path):
    graph = _one_conv(rng)
    (conv,) = _conv_names(graph)
    db = Database(f"sqlite:///{tmp_path / 'tune.db'}")
    tasks = extract_tasks(graph, "cpu")
    # (The times alone; those inside the model are tested below.)
    with knobs.scope(search_population=16, search_generations=1, search_measure_per_round=2,
                     timing_repeats=3, timing_min_seconds=0.002,
                     tune_time_in_model=False):  # fmt: skip
        tune(graph, "cpu", trials=len(tasks), database=db, seed=0, model=RandomModel(0))
    winograd, direct = _total(graph, db, "4"), _total(graph, db, "0")
    chosen = measured_forms(graph, "cpu", db)
    assert chosen == {conv: 4 if winograd < direct else 0}
    module = hexir.compile(graph, "cpu", database=db)
    assert any(r.ops[0] == "winograd_input" for r in module.report) == (chosen[conv] == 4)
    x = rng.standard_normal((1, 8, 28, 28), dtype=np.float32)
    (want,) = evaluate(graph, [x])
    np.testing.assert_allclose(module.run([x])[0], want, rtol=1e-4, atol=1e-4)


def test_the_tune_report_estimates_the_model_without_the_other_forms(rng):
    # The default estimate sums the rule's kernels only; the tuned one the kernels a build
    # with the database compiles (the forms it chose), each as often as it runs.
    from hexir.cli.tune import TaskRow, estimate

    tasks = extract_tasks(_two_convs(rng), "cpu")
    rows = [TaskRow(t.name, t.workload_key, t.weight, 1, 2e-3 * (i + 1), 1e-3 * (i + 1),
                    t.alternative) for i, t in enumerate(tasks)]  # fmt: skip
    rule = [(r.weight, r) for r in rows if not r.alternative]
    assert 0 < len(rule) < len(rows)
    assert estimate(rows, "default_latency") == pytest.approx(
        sum(w * r.default_latency for w, r in rule)
    )
    chosen = {rows[-1].workload_key: 3}  # one kernel of the other forms, run three times
    assert estimate(rows, "best_latency", chosen) == pytest.approx(3 * rows[-1].best_latency)
    assert estimate(rows, "best_latency", {"not a workload": 1}) is None


# The chains' channels: half a vector, so that no conv's weight is laid out in blocks of a
# vector's filters (a blocked conv reads NCHW in every form: no kernel of a mix of forms
# would be one that neither variant has).
CHAIN = Target("cpu").vector_width // 2


def _chain(rng: np.random.Generator) -> hexir.Graph:
    # A 28x28 conv (the rule's F(4, 3)), a 4x4 max pool, a 7x7 conv (the rule's direct): with
    # both convs direct, the second reads the first's layout, a kernel neither variant has.
    b = GraphBuilder("chain")
    first = _conv(b, b.input("x", (1, CHAIN, 28, 28)), rng, CHAIN)
    return b.build(_conv(b, b.max_pool2d(first, 4, 4), rng, CHAIN))


def test_within_keeping_each_weight_is_transformed_once_for_the_lowerings_that_share_it(
    rng, monkeypatch
):
    import hexir.graph.layout as layout
    from hexir.graph.fusion import fused_kernels
    from hexir.ir.kept import keeping

    graph = _chain(rng)
    big, small = _conv_names(graph)
    made: list[tuple[int, int]] = []

    def counted(w: np.ndarray, m: int) -> np.ndarray:
        made.append((id(w), m))
        return winograd_weight(w, m)

    winograd_weight = layout.winograd_weight
    monkeypatch.setattr(layout, "winograd_weight", counted)
    forms = [{big: 4, small: 0}, {big: 0, small: 2}, {big: 4, small: 2}]  # both variants, a mix
    lowered = [fused_kernels(graph, "cpu", f) for f in forms]
    # Outside: each lowering transforms its Winograd convs' weights.
    assert len(made) >= 4 and len(set(made)) == 2
    made.clear()
    with keeping():  # as a build with a database weighs them (hexir/graph/forms.py)
        kept = [fused_kernels(graph, "cpu", f) for f in forms]
    assert len(made) == len(set(made)) == 2  # each weight once, for its tile
    # The same kernels and weights as made apart.
    for (g, kernels), (h, again) in zip(lowered, kept, strict=True):
        assert [hexir.workload_key(f) for _, f in kernels] == [
            hexir.workload_key(f) for _, f in again
        ]
        ours, theirs = g.constant_arrays(), h.constant_arrays()
        assert ours.keys() == theirs.keys()
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert sum("_wino" in k for k in kept[2][0].constant_arrays()) == 2  # the mix's two


def _record(db: Database, func: hexir.PrimFunc, seconds: float) -> None:
    from hexir.runtime.default_schedule import default_schedule
    from hexir.search.measure import MeasureResult

    db.commit_record(func, "cpu", default_schedule(func, "cpu").trace, MeasureResult((seconds,)))


def _variants_recorded(
    graph: hexir.Graph, db: Database, seconds: float, times: dict[str, float] | None = None
) -> None:
    """Records of every kernel of both variants: its time in `times` (by workload key), else
    `seconds` for each kernel only one variant has, a tenth of it for the kernels both have."""
    from hexir.graph.fusion import fused_kernels
    from hexir.ir.keys import workload_key

    kernels = [
        {workload_key(f): f for _, f in fused_kernels(graph, "cpu", forms)[1]}
        for forms in form_variants(graph)
    ]
    both = kernels[0].keys() & kernels[1].keys()
    for key, func in (kernels[0] | kernels[1]).items():
        default = seconds / 10 if key in both else seconds
        _record(db, func, (times or {}).get(key, default))


@pytest.mark.slow
def test_a_mix_of_forms_stands_only_once_its_own_kernels_are_timed(rng, tmp_path):
    from hexir.graph.forms import conv_forms
    from hexir.search.scheduler import mixed_tasks

    graph = _chain(rng)
    big, small = _conv_names(graph)
    db = Database(f"sqlite:///{tmp_path / 'mix.db'}")
    _variants_recorded(graph, db, 1e-3)
    # Each conv's own kernels pick direct (the big conv's five Winograd kernels against one
    # direct; the small conv's one direct kernel against its F(2, 3) ones): a mix.
    assert mixed_forms(graph, "cpu", db) == {big: 0, small: 0}
    (task,) = mixed_tasks(graph, "cpu", db, known=set())
    assert task.name == "fused_conv2d_bias_add_relu" and task.alternative and task.weight == 1
    # Untimed, the mix's own conv is not built: the variant that sums lower is, the rule's.
    assert measured_forms(graph, "cpu", db) == {big: 4, small: 0}
    assert [c.chosen for c in conv_forms(graph, "cpu", db)] == [4, 0]
    assert {r.schedule for r in hexir.compile(graph, "cpu", database=db).report} == {"tuned"}
    # Timed slower than what it saves, the rule's forms still stand; timed fast, the mix does.
    slow = Database(f"sqlite:///{tmp_path / 'slow.db'}")
    _variants_recorded(graph, slow, 1e-3)
    _record(slow, task.func, 1e-2)
    assert measured_forms(graph, "cpu", slow) == {big: 4, small: 0}
    _record(db, task.func, 1e-5)
    assert mixed_tasks(graph, "cpu", db, known=set()) == []
    assert measured_forms(graph, "cpu", db) == {big: 0, small: 0}
    module = hexir.compile(graph, "cpu", database=db)
    assert {r.schedule for r in module.report} == {"tuned"}
    assert not any(r.ops[0] == "winograd_input" for r in module.report)
    x = rng.standard_normal((1, CHAIN, 28, 28), dtype=np.float32)
    (want,) = evaluate(graph, [x])
    np.testing.assert_allclose(module.run([x])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_tune_times_the_kernels_of_the_mix_its_measurements_pick(rng, tmp_path):
    from small_search import SMALL_SEARCH

    graph = _chain(rng)
    db = Database(f"sqlite:///{tmp_path / 'mix.db'}")
    # Times no candidate beats, that pick the mix (the test above); the tune finds its kernel.
    _variants_recorded(graph, db, 1e-9)
    tasks = extract_tasks(graph, "cpu")
    with knobs.scope(**SMALL_SEARCH):
        result = tune(graph, "cpu", trials=len(tasks) + 2, database=db, seed=0,
                      model=RandomModel(0))  # fmt: skip
    added = result.tasks[len(tasks) :]
    assert [(t.name, t.alternative) for t in added] == [("fused_conv2d_bias_add_relu", True)]
    assert added[0].trials >= 1 and added[0].best_latency is not None
    assert sum(t.trials for t in result.tasks) <= len(tasks) + 2
    # Every kernel a build with the database compiles has a time there.
    module = hexir.compile(graph, "cpu", database=db)
    assert all(db.best(r.workload_key, "cpu", k=1) for r in module.report)


@pytest.mark.slow
def test_a_mix_picked_when_the_budget_is_spent_has_its_kernels_timed_at_the_end(rng, tmp_path):
    from small_search import SMALL_SEARCH

    graph = _chain(rng)
    db = Database(f"sqlite:///{tmp_path / 'mix.db'}")
    _variants_recorded(graph, db, 1e-9)  # as above: the measurements pick the mix
    tasks = extract_tasks(graph, "cpu")
    with knobs.scope(**SMALL_SEARCH):  # the first rounds spend the budget: no round is left
        result = tune(graph, "cpu", trials=len(tasks), database=db, seed=0,
                      model=RandomModel(0))  # fmt: skip
    added = result.tasks[len(tasks) :]
    assert [(t.name, t.trials) for t in added] == [("fused_conv2d_bias_add_relu", 0)]
    assert result.trials == len(tasks) and result.mix_timed == 1
    # (Timed alone once; the end's runs inside the model may time it there too.)
    (record,) = [r for r in db.records(added[0].workload_key, "cpu") if not r.in_model]
    assert record.is_valid and added[0].best_latency == record.median
    module = hexir.compile(graph, "cpu", database=db)
    assert all(db.best(r.workload_key, "cpu", k=1) for r in module.report)


def _third_alone(rng: np.random.Generator, db: Database) -> tuple[hexir.Graph, dict[str, int]]:
    """A chain of three convs, the third with a residual add, and records in `db` under
    which a build gives the third conv alone its other form (F(2, 3)): the graph and those
    forms. Moving the third conv alone makes no kernel that neither variant has; moving the
    first conv does."""
    from hexir.graph.fusion import fused_kernels
    from hexir.graph.rewrite import simplify_graph
    from hexir.ir.keys import workload_key

    b = GraphBuilder("chain3")
    first = _conv(b, b.input("x", (1, CHAIN, 28, 28)), rng, CHAIN)
    second = _conv(b, b.max_pool2d(first, 4, 4), rng, CHAIN)
    graph = simplify_graph(b.build(b.add(_conv(b, second, rng, CHAIN), second)))
    big, middle, third = _conv_names(graph)
    rule, other = form_variants(graph)

    def keys(forms: dict[str, int]) -> set[str]:
        return {workload_key(f) for _, f in fused_kernels(graph, "cpu", forms)[1]}

    alone = rule | {third: 2}
    third_winograd = keys(alone) - keys(rule)
    # The first conv direct saves most, the third in F(2, 3) saves too, and the middle conv's
    # own F(2, 3) kernels are slow, so the other variant sums higher than the rule's.
    times = dict.fromkeys(third_winograd, 1e-5)
    times |= dict.fromkeys(keys(rule | {middle: 2}) - keys(rule) - third_winograd, 1e-2)
    times |= dict.fromkeys(keys(rule | {big: 0}) & keys(other) - keys(rule), 5e-4)
    _variants_recorded(graph, db, 1e-3, times)
    return graph, alone


@pytest.mark.slow
def test_where_the_whole_mix_is_untimed_a_convs_pick_alone_can_stand(rng, tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'mix.db'}")
    graph, alone = _third_alone(rng, db)
    big, middle, third = _conv_names(graph)
    # The picks: {big: 0, middle: 0, third: 2}, whose middle conv after a direct first one
    # is a kernel no variant has, untimed; the first conv alone makes it too; the third
    # alone stands.
    assert mixed_forms(graph, "cpu", db) == {big: 0, middle: 0, third: 2}
    assert measured_forms(graph, "cpu", db) == alone
    module = hexir.compile(graph, "cpu", database=db)
    assert all(db.best(r.workload_key, "cpu", k=1) for r in module.report)
    assert sum(r.ops[0] == "winograd_input" for r in module.report) == 2
    x = rng.standard_normal((1, CHAIN, 28, 28), dtype=np.float32)
    (want,) = evaluate(graph, [x])
    np.testing.assert_allclose(module.run([x])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compile_takes_the_forms_it_is_given(rng, tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'mix.db'}")
    graph, alone = _third_alone(rng, db)
    x = rng.standard_normal((1, CHAIN, 28, 28), dtype=np.float32)
    (want,) = evaluate(graph, [x])
    for forms, winograd in [(alone, 2), (dict.fromkeys(alone, 0), 0)]:
        module = hexir.compile(graph, "cpu", forms=forms)  # default schedules, these forms
        assert {r.schedule for r in module.report} == {"default"}
        assert sum(r.ops[0] == "winograd_input" for r in module.report) == winograd
        np.testing.assert_allclose(module.run([x])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compare_default_pairs_the_commands_of_the_tuned_forms(rng, tmp_path, capsys):
    from hexir.cli import main
    from hexir.frontend.load import save_model

    url = f"sqlite:///{tmp_path / 'mix.db'}"
    graph, _ = _third_alone(rng, Database(url))
    save_model(graph, tmp_path / "chain3.hexir")
    assert main(["run", str(tmp_path / "chain3.hexir"), "--target", "cpu", "--db", url,
                 "--compare-default", "--repeats", "2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    first, second = out.split("the default schedules in the forms the tuned build takes:")
    assert "do not pair up: end to end only" in first
    lines = second.strip().splitlines()
    assert lines[0].startswith("tuned against default schedules, @chain3 on cpu")
    assert lines[1].split()[:2] == ["#", "kernel"]
    commands = len(hexir.compile(graph, "cpu", database=url).commands)
    assert lines[2 + commands].split()[:3] == ["sum", "of", "commands"]
    assert lines[-1].startswith("end to end: default ")


@pytest.mark.slow
def test_a_tune_confirms_the_kernels_of_a_convs_two_forms_together(rng, tmp_path):
    """A host whose speed shifts from one batch to the next, in spells: a build's pick of a
    conv's form still follows its kernels' times, because the tune's confirmation times the
    kernels of both forms in turn, in the same batches."""
    import dataclasses

    from small_search import SMALL_SEARCH

    from hexir.graph.forms import form_kernels
    from hexir.search.executor import LocalExecutor

    graph = _one_conv(rng)  # 28x28: the rule's F(4, 3), the other form direct
    (name,) = _conv_names(graph)
    tasks = extract_tasks(graph, "cpu")
    # Made-up times: the direct conv 2 ms; each of the Winograd form's six kernels 0.25 ms,
    # 1.5 ms in all: Winograd is the faster form.
    times = {t.workload_key: 2e-3 if t.alternative else 2.5e-4 for t in tasks}
    assert set(times) == form_kernels(graph)[name]

    class Shifting(LocalExecutor):
        """Reads each kernel at its made-up time: its trials at the host's quiet speed, and
        what it times in turn at its moment's, four times slower in every other spell of
        three batches (the confirmation's rounds of one batch)."""

        batches: list[set[str]] = []

        def measure_each(self, candidates):
            for c, r in zip(candidates, super().measure_each(candidates), strict=True):
                yield _at(c, r, 1.0)

        def measure_in_turn(self, candidates):
            slow = 4.0 if len(self.batches) // 3 % 2 else 1.0
            self.batches.append({c.workload_key for c in candidates})
            results = super().measure_in_turn(candidates)
            return [_at(c, r, slow) for c, r in zip(candidates, results, strict=True)]

    def _at(candidate, result, slow):
        latencies = (times[candidate.workload_key] * slow,) * len(result.latencies)
        return dataclasses.replace(result, latencies=latencies) if result.ok else result

    db = Database(f"sqlite:///{tmp_path / 'shifting.db'}")
    # (Not timed inside the model after: the made-up times alone pick the form here.)
    scope = knobs.scope(**SMALL_SEARCH, tune_confirm_best=2, tune_time_in_model=False)
    with scope, Shifting("cpu") as executor:
        tune(graph, "cpu", trials=3 * len(tasks), database=db, seed=0, model=RandomModel(0),
             executor=executor)  # fmt: skip
    # The kernels of both forms were timed in one batch, and stand at one moment's speed.
    assert any(batch == set(times) for batch in executor.batches)
    moments = {db.best(key, "cpu", k=1)[0].median / seconds for key, seconds in times.items()}
    assert len({round(m, 6) for m in moments}) == 1
    assert measured_forms(graph, "cpu", db) == {name: 4}


@pytest.mark.slow
def test_a_convs_two_forms_confirmed_under_a_load_are_confirmed_again_together(rng, tmp_path):
    """The confirmation's first batch of a conv's two forms timed while a load came and went:
    its runs are suspect, and the kernels of both forms are timed again in one batch, as the
    confirmation timed them, not a task at a time (each form's kernels at another moment of
    the host's speed)."""
    import dataclasses

    from small_search import SMALL_SEARCH

    from hexir.search.calibration import load
    from hexir.search.executor import LocalExecutor
    from hexir.search.tune import CONFIRM_ROUNDS

    graph = _one_conv(rng)
    tasks = extract_tasks(graph, "cpu")
    times = {t.workload_key: 2e-3 if t.alternative else 2.5e-4 for t in tasks}

    def _read(candidate, result, slow: float = 1.0):
        """`result` at its kernel's made-up time, its calls after the first `slow` times
        slower, with the figure the worker gives such runs after a quiet calibration."""
        if not result.ok:
            return result
        seconds = times[candidate.workload_key]
        latencies = tuple(seconds * (slow if n else 1.0) for n in range(len(result.latencies)))
        info = {**result.build_info, "calibration": load(1.0, latencies)}
        return dataclasses.replace(result, latencies=latencies, build_info=info)

    class Loaded(LocalExecutor):
        """Reads each kernel at its made-up time, quietly, but in the first batch timed in
        turn that holds both forms: a load came and went in each of its runs."""

        batches: list[set[str]] = []

        def measure_each(self, candidates):
            for c, r in zip(candidates, super().measure_each(candidates), strict=True):
                yield _read(c, r)

        def measure_in_turn(self, candidates):
            keys = {c.workload_key for c in candidates}
            slow = 10.0 if keys == set(times) and keys not in self.batches else 1.0
            self.batches.append(keys)
            results = super().measure_in_turn(candidates)
            return [_read(c, r, slow) for c, r in zip(candidates, results, strict=True)]

    db = Database(f"sqlite:///{tmp_path / 'loaded.db'}")
    settings = {**SMALL_SEARCH, "tune_confirm_best": 2, "tune_time_in_model": False,
                "measure_calibration_threshold": 4.0}  # fmt: skip
    with knobs.scope(**settings), Loaded("cpu") as executor:
        result = tune(graph, "cpu", trials=2 * len(tasks), database=db, seed=0,
                      model=RandomModel(0), executor=executor)  # fmt: skip
    whole = [n for n, keys in enumerate(executor.batches) if keys == set(times)]
    # The confirmation's rounds, then the suspect first round's runs again, in one batch.
    assert len(whole) == CONFIRM_ROUNDS + 1, executor.batches
    assert result.remeasured >= len(tasks)
    for key in times:  # each kernel's last confirmation quiet, where the database ranks it
        confirmed = [r for r in db.records(key, "cpu") if r.confirmed]
        assert confirmed and not confirmed[-1].suspect(4.0)


@pytest.mark.slow
def test_a_tune_spends_no_rounds_on_a_form_too_far_behind_to_be_picked(rng, tmp_path):
    """Made-up times: the direct conv 20 ms, each of the Winograd form's six kernels 0.25 ms.
    After its first trial the direct conv's gains could not make its form the faster one, so
    the tune's other trials go to the Winograd form's kernels, which the build runs
    (hexir/search/scheduler.py `form_gains`)."""
    import dataclasses

    from small_search import SMALL_SEARCH

    graph = _one_conv(rng)  # 28x28: the rule's F(4, 3), the other form direct
    tasks = extract_tasks(graph, "cpu")
    times = {t.workload_key: 20e-3 if t.alternative else 2.5e-4 for t in tasks}

    def _made_up(candidate, result):
        latencies = (times[candidate.workload_key],) * len(result.latencies)
        return dataclasses.replace(result, latencies=latencies) if result.ok else result

    db = Database(f"sqlite:///{tmp_path / 'behind.db'}")
    scope = knobs.scope(**SMALL_SEARCH, tune_confirm_best=0, tune_time_in_model=False)
    trials = len(tasks) + 5 * SMALL_SEARCH["search_measure_per_round"]
    with scope, reading_executor(_made_up)("cpu") as executor:
        result = tune(graph, "cpu", trials=trials, database=db, seed=0, model=RandomModel(0),
                      executor=executor)  # fmt: skip
    (direct,) = [t for t in result.tasks if t.alternative]
    assert result.trials == trials
    assert direct.trials == 1  # its first round (of one trial: the budget's first-round share)


def _inside(db: Database, func: hexir.PrimFunc, seconds: float, sitting: str) -> None:
    """A record of `func`'s default schedule timed inside a model's run, in `sitting`."""
    from hexir.runtime.default_schedule import default_schedule
    from hexir.search.measure import MeasureResult

    trace = default_schedule(func, "cpu").trace
    result = MeasureResult((seconds, seconds), build_info={"in_model": sitting})
    db.commit_record(func, "cpu", trace, result)


@pytest.mark.slow
def test_a_convs_form_follows_its_kernels_times_inside_the_model_where_one_sitting_has_them(
    rng, tmp_path
):
    from hexir.graph.forms import conv_forms

    graph = _one_conv(rng)
    (name,) = _conv_names(graph)
    tasks = extract_tasks(graph, "cpu")
    direct = next(t for t in tasks if t.alternative)
    winograd = [t for t in tasks if not t.alternative]
    # Alone, the direct conv reads faster than the Winograd form's six kernels together...
    dbs = [Database(f"sqlite:///{tmp_path / f'{n}.db'}") for n in range(3)]
    for db in dbs:
        _record(db, direct.func, 1e-3)
        for task in winograd:
            _record(db, task.func, 5e-4)
        assert measured_forms(graph, "cpu", db) == {name: 0}
    # ... and inside the model's runs, one sitting, slower than they: Winograd is built, and
    # the times inside leave the database's best times alone as they were.
    _inside(dbs[0], direct.func, 3e-3, "one")
    for task in winograd:
        _inside(dbs[0], task.func, 2e-4, "one")
    assert measured_forms(graph, "cpu", dbs[0]) == {name: 4}
    (conv,) = conv_forms(graph, "cpu", dbs[0])
    assert conv.rule.inside and conv.other.inside
    assert (conv.rule.seconds, conv.other.seconds) == pytest.approx((6 * 2e-4, 3e-3))
    assert dbs[0].best(direct.workload_key, "cpu")[0].median == 1e-3
    assert dbs[0].in_model(direct.workload_key, "cpu").median == 3e-3
    best = dbs[0].best(direct.workload_key, "cpu")[0]
    assert dbs[0].standing(direct.workload_key, "cpu", best.candidate_key).median == 1e-3
    # Two sittings are not one footing: the times alone decide.
    _inside(dbs[1], direct.func, 3e-3, "one")
    for task in winograd:
        _inside(dbs[1], task.func, 2e-4, "two")
    assert measured_forms(graph, "cpu", dbs[1]) == {name: 0}
    assert not conv_forms(graph, "cpu", dbs[1])[0].rule.inside
    # A kernel measured alone since the sitting (a better candidate may have come): the same.
    _inside(dbs[2], direct.func, 3e-3, "one")
    for task in winograd:
        _inside(dbs[2], task.func, 2e-4, "one")
    assert measured_forms(graph, "cpu", dbs[2]) == {name: 4}
    _record(dbs[2], direct.func, 1e-3)
    assert measured_forms(graph, "cpu", dbs[2]) == {name: 0}


@pytest.mark.slow
def test_a_tune_whose_picks_differ_from_the_rule_times_both_builds_inside_the_model(rng, tmp_path):
    import dataclasses

    from small_search import SMALL_SEARCH

    from hexir.search.tune import IN_MODEL_RUNS

    graph = _one_conv(rng)
    (name,) = _conv_names(graph)
    tasks = extract_tasks(graph, "cpu")
    direct = next(t for t in tasks if t.alternative)

    def _lucky(candidate, result):
        """The direct conv read 100 times faster than it runs, alone and in turn: a build by
        those reads would take it."""
        if candidate.workload_key != direct.workload_key or not result.ok:
            return result
        return dataclasses.replace(result, latencies=tuple(x / 100 for x in result.latencies))

    db = Database(f"sqlite:///{tmp_path / 'lucky.db'}")
    with knobs.scope(**SMALL_SEARCH), reading_executor(_lucky)("cpu") as executor:
        result = tune(graph, "cpu", trials=2 * len(tasks), database=db, seed=0,
                      model=RandomModel(0), executor=executor)  # fmt: skip
    # Both builds ran inside the model: every kernel of both forms has its time there, of one
    # sitting, and none of those records moved a best.
    inside = {t.workload_key: db.in_model(t.workload_key, "cpu") for t in tasks}
    assert None not in inside.values() and result.in_model == len(tasks)
    assert len({r.build_info["in_model"] for r in inside.values()}) == 1
    assert len(inside[direct.workload_key].latencies) == IN_MODEL_RUNS  # in one build of two
    lucky = db.best(direct.workload_key, "cpu")[0].median
    assert lucky < inside[direct.workload_key].median / 10
    # The build follows the times inside: the form whose kernels there sum lower.
    winograd = sum(r.median for k, r in inside.items() if k != direct.workload_key)
    chosen = 4 if winograd < inside[direct.workload_key].median else 0
    assert measured_forms(graph, "cpu", db) == {name: chosen}
