"""Every verb of the `hexir` command has --help, and the verbs that need no tuning work through
a subprocess: build with no database, run an artifact, export to ONNX and run that back, show
the default schedules. (Tuning, and the verbs on a tuned database: test_cli_tune.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import run_hexir, save_tiny_mlp

import hexir
from hexir.cli import main
from hexir.database import Database

VERBS = [["tune"], ["build"], ["export"], ["run"], ["show"], ["db"]] + [
    ["db", action] for action in ("list", "best", "stats", "export", "import", "plot")
]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_every_verb_has_help(verb, capsys):
    with pytest.raises(SystemExit) as exit:
        main([*verb, "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hexir {' '.join(verb)} ") and "--debug" in out


def test_the_command_lists_its_verbs(tmp_path):
    done = run_hexir(tmp_path, "--help")
    assert done.returncode == 0
    for verb in ("tune", "build", "export", "run", "db", "show"):
        assert f"    {verb} " in done.stdout


def test_build_without_a_database_uses_default_schedules_and_runs(tmp_path):
    save_tiny_mlp(tmp_path)
    done = run_hexir(tmp_path, "build", "tiny.hexir", "--target", "cpu", "--report", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["database"] is None and report["output"] == "tiny.hxa"
    assert [t["schedule"] for t in report["tasks"]] == ["default"] * 3
    assert not (tmp_path / "tuning_logs").exists()  # a build creates no database
    ran = run_hexir(tmp_path, "run", "tiny.hxa", "--check", "--bench", "--repeats", "3")
    assert ran.returncode == 0, ran.stderr
    assert "output     probs  4x8 float32" in ran.stdout and "matches numpy" in ran.stdout
    assert "0 tuned, 3 default" in ran.stdout and "(median of 3)" in ran.stdout


@pytest.mark.slow
def test_export_writes_onnx_that_runs_back_with_the_same_outputs(tmp_path, rng):
    save_tiny_mlp(tmp_path)
    done = run_hexir(tmp_path, "export", "tiny.hexir", "-o", "tiny.onnx")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote tiny.onnx: opset 17")
    graph = hexir.load_model(str(tmp_path / "tiny.hexir"))
    back = hexir.load_model(str(tmp_path / "tiny.onnx"))
    x = rng.standard_normal((4, 32)).astype("float32")
    (want,) = hexir.compile(graph, "cpu").run([x])
    (got,) = hexir.compile(back, "cpu").run([x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ran = run_hexir(tmp_path, "run", "tiny.onnx", "--target", "cpu", "--check")
    assert ran.returncode == 0 and "matches numpy" in ran.stdout


def test_show_prints_the_default_schedule_as_python(capsys):
    assert main(["show", "matmul:M=32,N=32,K=32", "--schedule", "default", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# the default schedule of @matmul on cpu-")
    assert 'sch.get_block(name="matmul")' in out


def test_run_a_zoo_model_on_random_inputs(capsys):
    assert main(["run", "mlp", "--target", "cpu", "--bench", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "model      mlp (mlp)" in out and "output     probs  64x10 float32" in out
    assert "mean 0.1 " in out  # rows of probabilities: 10 classes
    assert "ms end to end (median of 2)" in out


def test_run_profile_prints_a_row_per_command(tmp_path):
    done = run_hexir(tmp_path, "run", "mlp", "--profile", "--repeats", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("profile of @mlp on "))
    assert lines[start + 1].startswith("peak ") and "GFLOP/s fp32" in lines[start + 1]
    assert lines[start + 2].split()[:4] == ["#", "kernel", "ops", "output"]
    rows = [line.split() for line in lines[start + 3 : start + 7]]
    assert sorted(row[0] for row in rows) == ["0", "1", "2", "3"]
    assert sorted(row[2] for row in rows) == [
        "matmul+bias_add", "matmul+bias_add+relu", "matmul+bias_add+relu", "softmax"
    ]  # fmt: skip
    assert all(row[-1] == "default" for row in rows)
    assert lines[start + 7].split()[:3] == ["sum", "of", "commands"]
    assert lines[start + 8].split()[:3] == ["commands,", "a", "run"]
    assert lines[start + 9].split()[:3] == ["end", "to", "end"]
    assert lines[start + 10].startswith("in commands / end to end = ")


def test_run_compare_default_pairs_the_commands_of_the_two_builds(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Database(url).close()  # a database without records: both builds take default schedules
    assert main(["run", "mlp", "--target", "cpu", "--db", url, "--compare-default",
                 "--repeats", "2"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tuned against default"))
    assert "@mlp on cpu" in lines[start] and "2 runs each" in lines[start]
    assert lines[start + 1].split() == [
        "#", "kernel", "output", "default", "ms", "tuned", "ms", "speedup", "saved", "ms",
        "schedule",
    ]  # fmt: skip
    rows = [line.split() for line in lines[start + 2 : start + 6]]
    assert sorted(row[0] for row in rows) == ["0", "1", "2", "3"]
    assert all(row[-1] == "default" and float(row[5]) > 0 for row in rows)
    assert lines[start + 6].split()[:3] == ["sum", "of", "commands"]
    assert lines[start + 7] == "tuned commands faster than their default: 0 of 0"
    assert lines[start + 8].startswith("end to end: default ")


def test_run_profile_of_an_artifact(tmp_path, capsys):
    graph = hexir.load_model(str(save_tiny_mlp(tmp_path)))
    path = hexir.compile(graph, "cpu").save(tmp_path / "tiny.hxa")
    assert main(["run", str(path), "--profile", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "profile of @mlp on cpu" in out and "median of 2 runs each" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#  kernel"))
    rows = [line.split() for line in lines[header + 1 : header + 4]]  # three commands
    assert sorted(row[0] for row in rows) == ["0", "1", "2"]
    assert all(row[-1] == "default" for row in rows)
    assert lines[header + 4].split()[:3] == ["sum", "of", "commands"]


def test_db_shows_the_records_timed_under_load(tmp_path, capsys):
    import random

    from hexir.database import Database
    from hexir.search.measure import MeasureResult
    from hexir.search.space import SearchSpace

    func = hexir.workload("matmul", M=16, N=16, K=16)
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    db = Database(url)
    traces = SearchSpace().sample(func, "cpu", random.Random(0), 2)
    for trace, median, calibration in zip(traces, [1e-4, 1e-3], [40.0, 1.0], strict=True):
        result = MeasureResult((median,), build_info={"calibration": calibration})
        db.commit_record(func, "cpu", trace, result)
    with hexir.knobs.scope(measure_calibration_threshold=2.0):
        assert main(["db", "stats", "--db", url]) == 0
        assert "suspect       1 valid records timed under load" in capsys.readouterr().out
        assert main(["db", "best", hexir.workload_key(func)[:12], "--db", url, "-k", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("#   ")]
    assert "1.000 ms" in lines[0] and "suspect" not in lines[0]  # the quiet record first
    assert "suspect: timed under load (calibration 40.0x)" in lines[1]


def test_db_list_gives_the_fastest_record_of_a_kernel_alone(tmp_path, capsys):
    # A record timed inside a model's run (hexir/search/tune.py) is counted, not the best.
    import random

    from hexir.search.measure import MeasureResult
    from hexir.search.space import SearchSpace

    func = hexir.workload("matmul", M=16, N=16, K=16)
    url = f"sqlite:///{tmp_path / 'inside.db'}"
    db = Database(url)
    alone, inside = SearchSpace().sample(func, "cpu", random.Random(0), 2)
    db.commit_record(func, "cpu", alone, MeasureResult((2e-3,)))
    db.commit_record(func, "cpu", inside, MeasureResult((1e-3,), build_info={"in_model": "a"}))
    assert main(["db", "list", "--db", url]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "matmul" in x]
    assert line.split()[-3:] == ["2", "2", "2.000"]
