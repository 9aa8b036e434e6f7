"""`hexir tune`, then `hexir build`, `run`, `db` and `show` on what it recorded, each in a new
process as a user would call them: a build reuses the tuned schedules without searching or
measuring, for the tuned target only; Ctrl-C stops a tune that the same command continues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import SMALL_ENV, run_hexir, save_tiny_mlp
from tuned_rule import expected_schedule

import hexir
from hexir.database import Database
from hexir.graph.fusion import fused_kernels

pytestmark = pytest.mark.slow

TRIALS = 9


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, str, dict]:
    """A folder with tiny.hexir tuned into a fresh database: (folder, URL, the JSON report)."""
    folder = tmp_path_factory.mktemp("tuned")
    save_tiny_mlp(folder)
    url = f"sqlite:///{folder / 'tune.db'}"
    done = run_hexir(
        folder, "tune", "tiny.hexir", "--trials", str(TRIALS), "--target", "cpu",
        "--db", url, "--no-ray", "--seed", "0", "--report", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return folder, url, json.loads(done.stdout)


def _db(url: str) -> Database:
    return Database(url)


def test_tune_reports_each_task_and_the_model_before_and_after(tuned):
    folder, url, report = tuned
    tasks = report["tasks"]
    assert [t["name"] for t in tasks] == ["fused_matmul_bias_add_relu", "fused_matmul_bias_add",
                                          "softmax"]  # fmt: skip
    assert report["trials"] == sum(t["trials"] for t in tasks) == TRIALS
    assert _db(url).stats().records == TRIALS  # every trial committed
    for t in tasks:
        assert t["best_latency"] <= t["default_latency"]  # the default is measured first
    before = sum(t["weight"] * t["default_latency"] for t in tasks)
    after = sum(t["weight"] * t["best_latency"] for t in tasks)
    assert report["latency_default"] == pytest.approx(before)
    assert report["latency_tuned"] == pytest.approx(after) and after <= before
    assert not report["interrupted"] and report["target_key"] == hexir.Target("cpu").key


def test_build_in_a_new_process_reuses_the_database_without_search(tuned, tmp_path):
    folder, url, _ = tuned
    db = _db(url)
    before = db.stats().records
    done = run_hexir(folder, "build", "tiny.hexir", "--target", "cpu", "--db", url,
                     "-o", str(tmp_path / "tiny.hxa"), "--report", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["records_before"] == report["records_after"] == before == db.stats().records
    # No search ran (the records are as they were: nothing measured either). The default
    # schedule, which a record must beat by TUNED_MARGIN, loads the search package's sketch
    # rules, so only the search proper is checked for.
    searching = {"hexir.search.tune", "hexir.search.evolutionary", "hexir.costmodel"}
    assert not searching & set(report["search_modules_loaded"])
    assert len(report["tasks"]) == 3
    module = hexir.runtime.load(tmp_path / "tiny.hxa")
    graph = hexir.load_model(str(folder / "tiny.hexir"))
    for task, r in zip(report["tasks"], module.report, strict=True):
        schedule, best = expected_schedule(db, graph, task["workload_key"])  # all were tuned
        assert task["schedule"] == r.schedule == schedule
        if schedule == "tuned":  # the artifact holds the best record's trace
            assert r.trace == best.load_trace()
    tuned = sum(r.schedule == "tuned" for r in module.report)
    ran = run_hexir(folder, "run", str(tmp_path / "tiny.hxa"), "--check", "--bench")
    assert ran.returncode == 0, ran.stderr
    assert "matches numpy" in ran.stdout and f"{tuned} tuned, {3 - tuned} default" in ran.stdout
    assert "ms end to end (median of 10)" in ran.stdout


def test_a_database_tuned_for_the_cpu_is_not_applied_to_cuda(tuned, tmp_path):
    folder, url, _ = tuned
    done = run_hexir(folder, "build", "tiny.hexir", "--target", "cuda -arch=sm_90",
                     "--db", url, "-o", str(tmp_path / "cuda.hxa"), "--report", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # NVRTC builds it here, GPU or not
    assert report["target_key"] == "cuda-sm_90"
    assert [t["schedule"] for t in report["tasks"]] == ["default"] * 3
    assert report["records_before"] == report["records_after"] == TRIALS
    text = run_hexir(folder, "build", "tiny.hexir", "--target", "cpu", "--db", url,
                     "-o", str(tmp_path / "cpu.hxa"), "--report", "json")  # fmt: skip
    cpu = json.loads(text.stdout)
    # The CPU build takes the CPU records: a task's best record, unless the default's own
    # stand within the margin of it (the timings decide which; tests/tuned_rule.py)
    graph, db = hexir.load_model(str(folder / "tiny.hexir")), _db(url)
    want = [expected_schedule(db, graph, t["workload_key"])[0] for t in cpu["tasks"]]
    assert [t["schedule"] for t in cpu["tasks"]] == want and len(want) == 3
    assert cpu["records_before"] == cpu["records_after"] == TRIALS


def test_run_a_model_with_the_database_and_given_inputs(tuned, tmp_path, rng):
    folder, url, _ = tuned
    x = rng.uniform(-1, 1, (4, 32)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    done = run_hexir(folder, "run", "tiny.hexir", "--target", "cpu", "--db", url,
                     "--inputs", str(tmp_path / "in.npz"), "--check")  # fmt: skip
    assert done.returncode == 0, done.stderr
    # each task tuned unless its default's records stand within the margin of its best (the
    # tune's timings decide which; tests/tuned_rule.py)
    graph, db = hexir.load_model(str(folder / "tiny.hexir")), _db(url)
    keys = {hexir.workload_key(f) for _, f in fused_kernels(graph)[1]}
    tuned = sum(expected_schedule(db, graph, key)[0] == "tuned" for key in keys)
    assert len(keys) == 3 and f"{tuned} tuned, {3 - tuned} default" in done.stdout
    assert "matches numpy" in done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("output"))
    words = line.split()
    assert words[1:3] == ["probs", "4x8"]
    stats = {words[i]: float(words[i + 1]) for i in range(4, len(words) - 1, 2)}
    expected = _evaluate(folder, x)
    for name, value in [("mean", expected.mean()), ("std", expected.std()),
                        ("min", expected.min()), ("max", expected.max())]:  # fmt: skip
        assert stats[name] == pytest.approx(value, rel=1e-4)


def _evaluate(folder: Path, x: np.ndarray) -> np.ndarray:
    from hexir.graph.evaluate import evaluate

    return evaluate(hexir.load_model(str(folder / "tiny.hexir")), [x])[0].astype(np.float64)


def test_db_verbs_list_best_stats_export_import(tuned, tmp_path):
    folder, url, report = tuned
    listed = run_hexir(folder, "db", "list", "--db", url)
    assert listed.returncode == 0 and "3 workloads" in listed.stdout
    for task in report["tasks"]:
        line = next(x for x in listed.stdout.splitlines() if task["workload_key"][:12] in x)
        assert task["name"] in line and f"{task['trials']:>7}" in line
    key = report["tasks"][2]["workload_key"]
    best = run_hexir(folder, "db", "best", key[:8], "--db", url)
    assert best.returncode == 0, best.stderr
    (record,) = _db(url).best(key, "cpu", k=1)
    assert str(record.load_trace()) in best.stdout
    stats = run_hexir(folder, "db", "stats", "--db", url)
    assert f"records         {TRIALS} ({TRIALS} valid)" in stats.stdout
    exported = tmp_path / "records.jsonl"
    assert run_hexir(folder, "db", "export", str(exported), "--db", url).returncode == 0
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    first = run_hexir(folder, "db", "import", str(exported), "--db", copy)
    again = run_hexir(folder, "db", "import", str(exported), "--db", copy)
    assert f"added {TRIALS} records" in first.stdout and "added 0 records" in again.stdout
    assert _db(copy).best(key, "cpu", k=1)[0].id == record.id


def test_show_and_run_a_workload_with_its_best_schedule(tmp_path):
    spec = "matmul:M=32,N=32,K=32"
    url = f"sqlite:///{tmp_path / 'mm.db'}"
    done = run_hexir(tmp_path, "tune", spec, "--trials", "4", "--target", "cpu", "--db", url,
                     "--no-ray", "--seed", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[4/4]" in done.stdout and "ETA" in done.stdout  # a plain line per round
    key = hexir.workload_key(hexir.workload("matmul", M=32, N=32, K=32))
    (record,) = _db(url).best(key, "cpu", k=1)
    shown = run_hexir(tmp_path, "show", spec, "--schedule", "best", "--target", "cpu", "--db", url)
    assert shown.returncode == 0 and str(record.load_trace()) in shown.stdout
    ran = run_hexir(tmp_path, "run", spec, "--db", url)
    assert ran.returncode == 0 and "tuned (the database's best" in ran.stdout
    assert "matches numpy" in ran.stdout


def test_tune_says_how_many_runs_it_made_besides_the_trials(tmp_path):
    url = f"sqlite:///{tmp_path / 'again.db'}"
    argv = ["tune", "matmul:M=32,N=32,K=32", "--trials", "4", "--target", "cpu", "--db", url]
    done = run_hexir(tmp_path, *argv, "--no-ray", env={"HEXIR_TUNE_CONFIRM_BEST": "2"})
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("runs besides the trials: ")]
    confirmed = int(line.removeprefix("runs besides the trials: ").split()[0])
    assert line.endswith(f"{confirmed} confirming the best")  # nothing else here
    assert Database(url).stats().records == 4 + confirmed


def test_ctrl_c_stops_cleanly_and_the_same_command_continues(tmp_path):
    save_tiny_mlp(tmp_path)
    url = f"sqlite:///{tmp_path / 'int.db'}"
    argv = ["tune", "tiny.hexir", "--trials", "400", "--target", "cpu", "--db", url, "--no-ray",
            "--seed", "0"]  # fmt: skip
    # Ctrl-C reaches the tune even where this test runs in a background job (`cmd &` in a
    # script), whose children start with SIGINT ignored.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hexir", *argv], cwd=tmp_path, text=True,
        env={**os.environ, **SMALL_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("tuning tiny.hexir: 3 tasks")
    assert proc.stdout.readline().startswith("[  4/400]")  # the first round is committed
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "run the same command again to continue" in err
    db = _db(url)
    measured = db.stats().records
    assert f"interrupted after {measured} measurement" in err and measured >= 4
    # The same command again (with a smaller budget: `--trials` is each call's own) goes on
    # from the database: 4 more trials, and no candidate measured twice.
    again = run_hexir(tmp_path, *[a if a != "400" else "4" for a in argv])
    assert again.returncode == 0, again.stderr
    assert db.stats().records == measured + 4
    for workload in db.workloads():
        records = db.records(workload.key, "cpu")
        assert len({r.candidate_key for r in records}) == len(records)


@pytest.mark.serial
def test_a_time_budget_alone_ends_the_tune_and_keeps_every_measurement(tmp_path):
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    began = time.monotonic()
    done = run_hexir(tmp_path, "tune", "matmul:M=32,N=32,K=32", "--time-budget", "6s",
                     "--target", "cpu", "--db", url, "--no-ray", "--report", "json")  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["time_budget"] == 6.0 and report["out_of_time"] is True
    assert "a time budget of 6s" in done.stderr  # the first line (json: progress on stderr)
    assert f"the time budget (6s) ended the tune after {report['trials']} trials" in done.stderr
    (task,) = report["tasks"]
    assert task["trials"] == report["trials"] > 0 and task["best_latency"] is not None
    assert _db(url).stats().records == report["trials"]
    # Starting the process and its build pool is not the tune's; the budget is.
    assert report["elapsed"] < 6.0 + 3.0 and took < 60


@pytest.mark.serial
def test_tune_on_a_local_ray_cluster_by_default(tmp_path):
    url = f"sqlite:///{tmp_path / 'ray.db'}"
    done = run_hexir(tmp_path, "tune", "softmax:M=8,N=64", "--trials", "3", "--target", "cpu",
                     "--db", url, "--workers", "2", "--seed", "0", "--report", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    (task,) = json.loads(done.stdout)["tasks"]
    assert task["trials"] == 3 and task["best_latency"] is not None
    assert _db(url).stats().records == 3
