import dataclasses
import json
import os
import pickle
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from db_fixtures import POSTGRES_URL, POSTGRES_VARIABLE, Result, timed, tiny_func, traces

import hexir
from hexir.database import CODEGEN_VERSION, Database, Record
from hexir.errors import DatabaseError
from hexir.runtime.target import Target


def test_a_record_carries_every_key_and_value(db) -> None:
    func, [trace] = tiny_func(), traces(1)
    before = datetime.now(UTC)
    record = db.commit_record(func, "cpu", trace, Result((3e-3, 1e-3, 2e-3), build_info={"cc": 1}))
    assert record.workload_key == hexir.workload_key(func)
    assert record.candidate_key == hexir.candidate_key(trace.apply(func).func)
    assert record.target_key == Target("cpu").key
    assert record.trace == trace.to_json()
    assert (record.latencies, record.median) == ((3e-3, 1e-3, 2e-3), 2e-3)
    assert (record.error_kind, record.error_message, record.build_info) == (None, None, {"cc": 1})
    assert (record.hexir_version, record.codegen_version) == (hexir.__version__, CODEGEN_VERSION)
    assert before <= record.created <= datetime.now(UTC)
    assert len(record.id) == 32 and record.is_valid
    [stored] = db.records(record.workload_key, "cpu")
    assert stored == record
    assert hexir.candidate_key(stored.load_trace().apply(func).func) == record.candidate_key
    with pytest.raises(dataclasses.FrozenInstanceError):
        stored.median = 0.0  # type: ignore[misc]


def test_best_is_the_fastest_valid_candidates_of_the_target(db) -> None:
    func, ts, rng = tiny_func(), traces(6, seed=1), random.Random(0)
    key = hexir.workload_key(func)
    medians = [rng.uniform(1e-4, 1e-2) for _ in ts]
    for trace, median in zip(ts, medians, strict=True):
        db.commit_record(func, "cpu", trace, Result((median,)))
    fastest = min(medians)
    # Faster than all of them, but failed; and faster, but on another target.
    db.commit_record(func, "cpu", ts[0], Result((fastest / 10,), "wrong_result", "differs"))
    db.commit_record(func, "cuda -arch=sm_80", ts[0], Result((fastest / 10,)))
    best = db.best(key, "cpu", k=3)
    assert [r.median for r in best] == sorted(medians)[:3]
    assert len({r.candidate_key for r in best}) == 3
    assert db.best(key, Target("cpu")) == best[:1] == db.best(key, Target("cpu").key)
    assert db.best(key, "cuda -arch=sm_80")[0].median == fastest / 10
    # The fastest candidate measured again, much slower: a lucky run alone does not make the
    # best; it stands at the slower of its two, listed once. A third run decides: the median.
    first = ts[medians.index(fastest)]
    db.commit_record(func, "cpu", first, Result((1.0,)))
    again = db.best(key, "cpu", k=6)
    assert [r.median for r in again] == sorted(medians)[1:] + [1.0]
    db.commit_record(func, "cpu", first, Result((fastest * 1.01,)))
    assert db.best(key, "cpu")[0].median == fastest * 1.01
    assert db.best(key, "cuda -arch=sm_90") == [] and db.best("0" * 64, "cpu") == []
    assert len(db.best(key, "cpu", k=100)) == 6 and db.best(key, "cpu", k=0) == []


def test_records_keep_errors_and_the_search_never_remeasures(db) -> None:
    func, ts = tiny_func(), traces(3, seed=2)
    key, keys = hexir.workload_key(func), [hexir.candidate_key(t.apply(func).func) for t in ts]
    db.commit_record(func, "cpu", ts[0], Result((1e-3,)))
    db.commit_record(func, "cpu", ts[1], Result((), "build", "cc: error: no"))
    records = db.records(key, "cpu")
    assert [(r.candidate_key, r.error_kind) for r in records] == [
        (keys[0], None),
        (keys[1], "build"),
    ]
    assert records[1].error_message == "cc: error: no" and records[1].median is None
    assert db.measured_keys(key, "cpu") == set(keys[:2])
    assert db.has_candidate(key, "cpu", keys[1]) and not db.has_candidate(key, "cpu", keys[2])
    assert not db.has_candidate(key, "cuda -arch=sm_80", keys[0])


def test_a_workload_is_stored_once_and_rebuilds(db) -> None:
    func, rng = tiny_func(), random.Random(3)
    for trace in traces(3, seed=3):
        db.commit_record(func, "cpu", trace, timed(rng))
    other = hexir.workload("softmax", M=8, N=16)
    db.commit_record(other, "cpu", hexir.Schedule(other, seed=0).trace, timed(rng))
    workloads = db.workloads()
    assert [w.key for w in workloads] == [hexir.workload_key(func), hexir.workload_key(other)]
    assert workloads[0].load_func() == func and workloads[1].load_func() == other
    stats = db.stats()
    assert (stats.workloads, stats.records, stats.valid, stats.errors) == (2, 4, 4, {})
    assert stats.targets == {Target("cpu").key: 4}


def test_stats_count_errors_by_kind(db) -> None:
    func, ts = tiny_func(), traces(4, seed=4)
    for trace, kind in zip(ts, ["timeout", "crash", "timeout", None], strict=True):
        db.commit_record(func, "cpu", trace, Result(() if kind else (1e-3,), kind, kind and "!"))
    stats = db.stats()
    assert (stats.records, stats.valid, stats.errors) == (4, 1, {"timeout": 2, "crash": 1})


def test_a_given_candidate_key_is_used_without_replay(db) -> None:
    func, [trace] = tiny_func(), traces(1)
    record = db.commit_record(func, "cpu", trace, Result((1e-3,)), candidate_key="c" * 64)
    assert record.candidate_key == "c" * 64


@pytest.mark.parametrize(
    "result",
    [
        Result(()),
        Result((-1.0,)),
        Result((float("nan"),)),
        Result((1e-3,), build_info={"x": {1j}}),
        Result((), "k" * 65, "an error kind longer than its column"),
    ],
)
def test_a_result_that_says_nothing_usable_is_refused(db, result) -> None:
    with pytest.raises(ValueError):
        db.commit_record(tiny_func(), "cpu", traces(1)[0], result)
    assert db.stats().records == 0


def test_any_text_reads_back_alike_on_every_backend(db, new_url, tmp_path) -> None:
    # PostgreSQL's text holds no NUL character (SQLite's does): every backend stores U+FFFD.
    func, [first, second] = tiny_func(), traces(2, seed=10)
    message = "cc: error: \x00 ✓ \U0001f600 " + "long log line\n" * 50_000
    build_info = {"log": "a\x00b", "big": 2**70, "nested": [1.5, {"none": None}]}
    record = db.commit_record(func, "cpu", first, Result((), "build", message, build_info))
    assert record.error_message == message.replace("\x00", "\ufffd")
    assert record.build_info == build_info
    assert db.records(record.workload_key, "cpu") == [record]
    path = tmp_path / "export.jsonl"
    db.commit_record(func, "cpu", second, Result((1.2345678901234567e-300, 0.1 + 0.2)))
    db.export_jsonl(path)
    lines = path.read_text().splitlines()
    line = json.loads(lines[-1])
    line["error_message"] = "imported \x00"  # as an export from an older Hexir may hold
    path.write_text("\n".join([*lines[:-1], json.dumps(line)]) + "\n")
    fresh = Database(new_url("fresh"))
    assert fresh.import_jsonl(path) == 2
    [_, imported] = fresh.records(record.workload_key, "cpu")
    assert imported.error_message == "imported \ufffd"
    assert imported.latencies == (1.2345678901234567e-300, 0.1 + 0.2)


def test_ci_runs_the_database_tests_on_postgresql() -> None:
    # Without the variable the PostgreSQL cases are not generated (conftest.py); on CI,
    # .ci/run starts a server and sets it, so they must be there.
    if os.environ.get("CI"):
        assert POSTGRES_URL, f"CI is set but {POSTGRES_VARIABLE} is not: see .ci/postgres.sh"


def test_the_default_url_creates_its_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = Database()
    db.commit_record(tiny_func(), "cpu", traces(1)[0], Result((1e-3,)))
    assert (tmp_path / "tuning_logs" / "hexir.db").is_file()
    assert Database().stats().records == 1


def test_a_database_pickles_as_its_url(db) -> None:
    db.commit_record(tiny_func(), "cpu", traces(1)[0], Result((1e-3,)))
    again = pickle.loads(pickle.dumps(db))
    assert again.url == db.url and again.stats().records == 1


def _fill(db: Database, seed: int) -> None:
    rng = random.Random(seed)
    func, other = tiny_func(), hexir.workload("reduce_sum", M=8, N=32)
    for n, trace in enumerate(traces(12, seed=seed)):
        kind = "crash" if n % 4 == 0 else None
        latencies = () if kind else tuple(rng.uniform(1e-4, 1e-2) for _ in range(3))
        db.commit_record(func, "cpu", trace, Result(latencies, kind, kind, {"n": n}))
    db.commit_record(other, "cuda -arch=sm_90", hexir.Schedule(other, seed=0).trace, timed(rng))


def test_export_then_import_gives_the_same_answers(db, new_url, tmp_path) -> None:
    _fill(db, seed=5)
    path = tmp_path / "export.jsonl"
    assert db.export_jsonl(path) == 13
    fresh = Database(new_url("fresh"))
    assert fresh.import_jsonl(path) == 13
    for w in db.workloads():
        for target in ("cpu", "cuda -arch=sm_90"):
            assert fresh.best(w.key, target, k=5) == db.best(w.key, target, k=5)
            assert fresh.records(w.key, target) == db.records(w.key, target)
    assert fresh.workloads() == db.workloads()
    assert fresh.stats() == dataclasses.replace(db.stats(), url=fresh.stats().url)


def test_import_merges_without_duplicates(db, new_url, tmp_path) -> None:
    _fill(db, seed=6)
    db.export_jsonl(tmp_path / "a.jsonl")
    other = Database(new_url("other"))
    _fill(other, seed=7)
    assert other.import_jsonl(tmp_path / "a.jsonl") == 13
    assert other.import_jsonl(tmp_path / "a.jsonl") == 0
    assert other.stats().records == 26 and other.stats().workloads == 2
    other.export_jsonl(tmp_path / "b.jsonl")
    assert db.import_jsonl(tmp_path / "b.jsonl") == 13
    assert db.stats().records == 26


def test_a_bad_export_line_is_named(db, tmp_path) -> None:
    _fill(db, seed=8)
    path = tmp_path / "export.jsonl"
    db.export_jsonl(path)
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    record["trace"] = '{"format": "pickle"}'
    path.write_text("\n".join([*lines[:-1], json.dumps(record)]) + "\n")
    with pytest.raises(DatabaseError, match=f"line {len(lines)}: not a hexir trace"):
        db.import_jsonl(path)
    workload = json.loads(lines[1])
    workload["key"] = "f" * 64
    path.write_text("\n".join([lines[0], json.dumps(workload)]) + "\n")
    with pytest.raises(DatabaseError, match="line 2: .* has another workload key"):
        db.import_jsonl(path)
    assert db.stats().records == 13


def test_records_are_ordered_oldest_first(db) -> None:
    func, rng = tiny_func(), random.Random(9)
    for trace in traces(5, seed=9):
        db.commit_record(func, "cpu", trace, timed(rng))
    created = [r.created for r in db.records(hexir.workload_key(func), "cpu")]
    assert created == sorted(created) and created[-1] - created[0] < timedelta(minutes=1)


def test_import_hexir_does_not_import_sqlalchemy() -> None:
    code = (
        "import sys, hexir; hexir.Schedule(hexir.workload('matmul', M=4, N=4, K=4), seed=0); "
        "assert 'sqlalchemy' not in sys.modules, 'imported'; "
        "import hexir.database; assert 'sqlalchemy' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_records_are_plain_values(db) -> None:
    record = db.commit_record(tiny_func(), "cpu", traces(1)[0], Result((1e-3,)))
    assert type(record) is Record and dataclasses.is_dataclass(record)
    assert pickle.loads(pickle.dumps(record)) == record


def test_best_prefers_records_measured_quietly(db) -> None:
    # Three candidates: one timed only under load (the fastest figure), one timed under load
    # and again quietly, one quiet. The quiet records rank first; a suspect one fills in.
    func, key = tiny_func(), hexir.workload_key(tiny_func())
    loaded, both, quiet = traces(3)
    for trace, median, calibration in [
        (loaded, 1e-4, 40.0), (both, 9e-3, 300.0), (both, 2e-3, 1.1), (quiet, 1e-3, 1.0)
    ]:  # fmt: skip
        info = {"calibration": calibration}
        db.commit_record(func, "cpu", trace, Result((median,), build_info=info))
    ranked = db.best(key, "cpu", k=3, threshold=2.0)
    assert [(r.median, r.calibration) for r in ranked] == [(1e-3, 1.0), (2e-3, 1.1), (1e-4, 40.0)]
    assert not ranked[0].suspect(2.0) and ranked[2].suspect(2.0)
    assert db.best(key, "cpu", k=1, threshold=0.0)[0].median == 1e-4  # 0: no calibration
    with hexir.knobs.scope(measure_calibration_threshold=2.0):
        assert db.best(key, "cpu")[0].median == 1e-3
        assert db.stats().suspect == 2


def test_best_ranks_the_candidates_a_tune_confirmed_first(db) -> None:
    # A tune's best few, confirmed in a slow spell of the host, read slower than a candidate
    # timed once in a fast one: the confirmed rank first, the one timed once after them.
    func, key = tiny_func(), hexir.workload_key(tiny_func())
    once, confirmed, also = traces(3)
    db.commit_record(func, "cpu", once, Result((1.0e-3,)))
    for trace, first, later in [(confirmed, 0.9e-3, 1.5e-3), (also, 0.95e-3, 1.6e-3)]:
        db.commit_record(func, "cpu", trace, Result((first,)))
        for _ in range(3):
            db.commit_record(func, "cpu", trace, Result((later,), build_info={"confirmed": True}))
    ranked = db.best(key, "cpu", k=3)
    assert [r.median for r in ranked] == [1.5e-3, 1.6e-3, 1.0e-3]
    assert ranked[0].confirmed and ranked[1].confirmed and not ranked[2].confirmed
    # By their runs alone, as a tune picks the candidates to confirm.
    plain = db.best(key, "cpu", k=3, confirmed_first=False)
    assert [r.median for r in plain] == [1.0e-3, 1.5e-3, 1.6e-3]
    # A run under load does not move a confirmed candidate: its quiet runs decide.
    db.commit_record(func, "cpu", confirmed, Result((1e-4,), build_info={"calibration": 50.0}))
    assert db.best(key, "cpu", k=1, threshold=2.0)[0].median == 1.5e-3
    # A confirmed candidate stands at its confirmations alone: runs timed alone, in a slow
    # spell (four, more than its three confirmations), do not move it.
    for _ in range(4):
        db.commit_record(func, "cpu", also, Result((9e-3,)))
    assert db.standing(key, "cpu", ranked[1].candidate_key).median == 1.6e-3
    assert [r.median for r in db.best(key, "cpu", k=2)] == [1.5e-3, 1.6e-3]


def test_best_ranks_the_candidates_a_tune_checked_after_the_confirmed(db) -> None:
    # A tune checks a claimed gain by timing it in turn with the best: a checked candidate
    # stands at its checks alone, after the confirmed ones and ahead of those timed alone.
    func, key = tiny_func(), hexir.workload_key(tiny_func())
    once, checked, confirmed = traces(3)
    db.commit_record(func, "cpu", once, Result((1.0e-3,)))
    for _ in range(3):
        db.commit_record(func, "cpu", checked, Result((0.5e-3,)))  # lucky reads, alone
    db.commit_record(func, "cpu", checked, Result((1.2e-3,), build_info={"checked": True}))
    db.commit_record(func, "cpu", confirmed, Result((1.4e-3,), build_info={"confirmed": True}))
    ranked = db.best(key, "cpu", k=3)
    assert [r.median for r in ranked] == [1.4e-3, 1.2e-3, 1.0e-3]
    assert ranked[1].checked and not ranked[1].confirmed and not ranked[0].checked
    assert db.standing(key, "cpu", ranked[1].candidate_key).median == 1.2e-3
    # Confirmed later, it stands at its confirmations alone, not at the check's moment.
    db.commit_record(func, "cpu", checked, Result((1.3e-3,), build_info={"confirmed": True}))
    assert [r.median for r in db.best(key, "cpu", k=2)] == [1.3e-3, 1.4e-3]
    assert db.best(key, "cpu", k=3, confirmed_first=False)[0].median == 0.5e-3


def test_records_timed_inside_a_model_are_left_out_of_the_ranking(db) -> None:
    # A tune times kernels inside runs of the model (hexir/search/tune.py): such a record is
    # read by `in_model`, its latest valid one, and never by `best` or `standing`.
    func, key = tiny_func(), hexir.workload_key(tiny_func())
    alone, other = traces(2)
    assert db.in_model(key, "cpu") is None
    db.commit_record(func, "cpu", alone, Result((1.0e-3,)))
    db.commit_record(func, "cpu", other, Result((2.0e-3,)))
    for seconds, sitting in [(5e-4, "first"), (4e-3, "second")]:
        db.commit_record(func, "cpu", alone, Result((seconds,), build_info={"in_model": sitting}))
    db.commit_record(func, "cpu", other, Result((1e-5,), build_info={"in_model": "second"}))
    db.commit_record(func, "cpu", other, Result((), "run", "", {"in_model": "third"}))
    inside = db.in_model(key, "cpu")
    assert inside.median == 1e-5 and inside.in_model and inside.build_info["in_model"] == "second"
    assert [r.median for r in db.best(key, "cpu", k=2)] == [1.0e-3, 2.0e-3]
    assert db.standing(key, "cpu", inside.candidate_key).median == 2.0e-3
    assert not any(r.in_model for r in db.best(key, "cpu", k=2, confirmed_first=False))


def test_a_candidate_stands_where_best_ranks_it(db) -> None:
    func, key = tiny_func(), hexir.workload_key(tiny_func())
    one, other, never = traces(3)
    rng = random.Random()
    quiet = sorted(rng.uniform(1e-3, 2e-3) for _ in range(3))
    runs = [(quiet[2], 1.0), (9e-3, 50.0), (quiet[0], 1.0), (quiet[1], 1.2)]  # one under load
    for median, calibration in runs:
        db.commit_record(
            func, "cpu", one, Result((median,), build_info={"calibration": calibration})
        )
    db.commit_record(func, "cpu", other, Result((3e-3,)))
    db.commit_record(func, "cpu", never, Result((), "build", "cc: refused"))
    candidate = db.records(key, "cpu")[0].candidate_key
    stands = db.standing(key, "cpu", candidate, threshold=2.0)
    assert stands.median == quiet[1]  # the median of its quiet runs, not its fastest
    assert db.best(key, "cpu", k=1, threshold=2.0)[0].id == stands.id
    # Every run counted (no calibration threshold): the slower middle one of four.
    assert db.standing(key, "cpu", candidate, threshold=0.0).median == quiet[2]
    failed = db.records(key, "cpu")[-1].candidate_key
    assert db.standing(key, "cpu", failed) is None


def test_export_and_import_keep_the_calibration(db, new_url, tmp_path) -> None:
    db.commit_record(tiny_func(), "cpu", traces(1)[0],
                     Result((1e-3,), build_info={"calibration": 2.5}))  # fmt: skip
    db.export_jsonl(tmp_path / "out.jsonl")
    other = Database(new_url("imported"))
    other.import_jsonl(tmp_path / "out.jsonl")
    (record,) = other.records(hexir.workload_key(tiny_func()), "cpu")
    assert record.calibration == 2.5
