"""`hexir db plot`: tuning curves from a database a real small tune filled, as a PNG that
matplotlib reads back and a summary on stdout; without matplotlib, or with nothing to plot, a
one-paragraph error and a non-zero exit."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_hexir, save_tiny_mlp
from small_search import SMALL_SEARCH

import hexir
from hexir.cli import main
from hexir.cli.common import ms
from hexir.database import Database
from hexir.search.measure import MeasureResult
from hexir.search.scheduler import extract_tasks

MATMUL = "matmul:M=16,N=16,K=16"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The tunes in this process: a small search and quick timing (cli_helpers.SMALL_ENV as knobs),
# but with the best confirmed at the end: records that are not trials, which the plot tells.
SMALL = SMALL_SEARCH


# Tuned databases and matplotlib renders, 2-3 s a test: in the slow suite (CI runs it).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, str]:
    """A folder with tiny.hexir (three tasks) and the database a tune of it and of MATMUL
    filled: (folder, URL)."""
    folder = tmp_path_factory.mktemp("plot")
    model = save_tiny_mlp(folder)
    url = f"sqlite:///{folder / 'tune.db'}"
    with hexir.knobs.scope(**SMALL), Database(url) as db:
        hexir.tune(hexir.load_model(str(model)), "cpu", trials=8, database=db, seed=0)
        hexir.tune(hexir.workload("matmul", M=16, N=16, K=16), "cpu", trials=4, database=db)
    return folder, url


def _check_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    assert height >= 300 and width >= 600
    assert np.ptp(pixels[..., :3]) > 0.5  # lines on a background, not one flat color


def test_a_model_plot_writes_a_png_and_prints_each_task(tuned, tmp_path):
    folder, url = tuned
    out = tmp_path / "curve.png"
    done = run_hexir(folder, "db", "plot", "tiny.hexir", "--db", url, "--target", "cpu",
                     "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    _check_png(out)
    lines = done.stdout.splitlines()
    db = Database(url)
    tasks = extract_tasks(hexir.load_model(str(folder / "tiny.hexir")), "cpu")
    assert lines[0].startswith("tuning curves of tiny.hexir on ") and ", 8 trials" in lines[0]
    records = sum(len(db.records(t.workload_key, "cpu")) for t in tasks)
    if records > 8:  # the tune measured its best candidates again
        assert f"8 trials ({records} records)" in lines[0]
    for task in tasks:
        (row,) = [line for line in lines if f" {task.workload_key[:12]}" in line]
        (best,) = db.best(task.workload_key, "cpu", threshold=0)
        trials = len(db.measured_keys(task.workload_key, "cpu"))  # measured again: no trial
        assert task.name in row and f" {trials} " in row and ms(best.median, 10) in row
    total = sum(t.weight * db.best(t.workload_key, "cpu", threshold=0)[0].median for t in tasks)
    assert lines[-2].startswith("estimated end to end") and f"{ms(total)} ms after 8 trials" in (
        lines[-2]
    )  # fmt: skip
    assert lines[-1] == f"wrote {out}"


@pytest.mark.parametrize("what", [MATMUL, "key"])
def test_a_workload_plot_by_spec_or_key_prefix(tuned, tmp_path, monkeypatch, capsys, what):
    folder, url = tuned
    key = hexir.workload_key(hexir.workload("matmul", M=16, N=16, K=16))
    monkeypatch.chdir(tmp_path)
    assert main(["db", "plot", key[:8] if what == "key" else what, "--db", url]) == 0
    _check_png(tmp_path / "matmul-tuning.png")  # the default name: the workload's
    out = capsys.readouterr().out
    assert "1 task, 4 trials" in out and "estimated end to end" not in out
    (best,) = Database(url).best(key, "cpu", threshold=0)
    assert ms(best.median, 10) in out and key[:12] in out


def test_without_matplotlib_the_verb_names_the_extra(tuned, tmp_path, monkeypatch, capsys):
    folder, url = tuned
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    out = tmp_path / "curve.png"
    assert main(["db", "plot", MATMUL, "--db", url, "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    (line,) = captured.err.splitlines()
    assert line.startswith("hexir: error: ") and "pip install 'hexir[plot]'" in line


CASES = [
    (["matmul:M=8,N=8,K=8"], "has no records of matmul:M=8,N=8,K=8"),
    (["mlp"], "tasks of mlp on target cpu-"),
    ([MATMUL, "--target", "cuda-sm_90"], "on target cuda-sm_90, so nothing to plot; it has "
     "records of it on cpu-"),
    (["ffff"], "no workload whose key starts with 'ffff'"),
]  # fmt: skip


@pytest.mark.parametrize("argv, message", CASES, ids=[c[0][0] for c in CASES])
def test_nothing_to_plot_is_one_paragraph(tuned, tmp_path, monkeypatch, capsys, argv, message):
    folder, url = tuned
    monkeypatch.chdir(tmp_path)
    assert main(["db", "plot", *argv, "--db", url]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hexir: error: ") and message in line
    assert list(tmp_path.iterdir()) == []


def test_a_missing_database_is_refused_and_not_created(tmp_path):
    done = run_hexir(tmp_path, "db", "plot", MATMUL, "--db", "sqlite:///missing.db")
    assert done.returncode == 1 and "no tuning database at sqlite:///missing.db" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_workload_whose_every_trial_failed_still_plots(tmp_path, monkeypatch, capsys):
    func = hexir.workload("matmul", M=8, N=8, K=8)
    url = f"sqlite:///{tmp_path / 'failed.db'}"
    with Database(url) as db:
        failed = MeasureResult.error("build", "cc: refused")
        db.commit_record(func, "cpu", hexir.Schedule(func).trace, failed)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no artists with labels" from an empty legend
        assert main(["db", "plot", "matmul:M=8,N=8,K=8", "--db", url, "--target", "cpu"]) == 0
    assert (tmp_path / "matmul-tuning.png").read_bytes()[:8] == PNG_MAGIC
    (row,) = [line for line in capsys.readouterr().out.splitlines() if " matmul " in line]
    assert row.split()[2:8] == ["1", "1", "1", "-", "-", "-"]  # weight, trials, errors, ...


def test_a_model_of_many_tasks_names_its_slowest_and_its_legend_fits_the_figure():
    from hexir.cli.plot import NAMED_TASKS, Curves, figure
    from hexir.database.curves import Point, TaskCurve

    rng = np.random.default_rng()
    n = 54  # ResNet-18's tasks, both forms of its convs
    tasks, weights = [], []
    for i in range(n):
        best = float(rng.uniform(1e-5, 1e-3))
        points = tuple(Point(t + 1, 10.0 * t, best * (1 + 1 / (t + 1))) for t in range(5))
        tasks.append(TaskCurve(f"fused_conv2d_bias_add_add_relu_{i}", f"{i:064x}", points, 0))
        weights.append(int(rng.integers(1, 5)))
    ends = tuple(Point(t + 1, 10.0 * t, 1e-2) for t in range(5))
    curves = Curves("resnet18", "cpu-x", tuple(tasks), tuple(weights), (False,) * n, ends)
    fig = figure(curves)
    fig.canvas.draw()
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    slowest = sorted(range(n), key=lambda i: -weights[i] * tasks[i].best)[:NAMED_TASKS]
    assert len(labels) == NAMED_TASKS + 2  # and one entry for the others, one for end to end
    assert {label.split(" x")[0] for label in labels[:NAMED_TASKS]} == {
        tasks[i].name for i in slowest
    }
    assert labels[NAMED_TASKS] == f"{n - NAMED_TASKS} other tasks (grey)"
    box, page = legend.get_window_extent(), fig.bbox
    assert 0 <= box.x0 and box.x1 <= page.x1 and 0 <= box.y0
