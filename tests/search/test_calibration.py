"""Measurements on a shared machine: the calibration kernel timed beside every CPU candidate
(hexir/search/calibration.py) tells a time measured under load, and a tune measures such a
candidate again once the machine is quiet. The load is real: busy processes on every core."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import hexir
from hexir.database import Database
from hexir.search.calibration import STALE_SECONDS, Calibration, load
from hexir.search.tune import tune

# Under the load below a calibration reads hundreds of times its quiet time; a quiet one
# reads up to 2.4 times it on a host whose own speed shifts that much (a 2-core EPYC VM, numpy
# 72-170 GFLOP/s): a CI run there read both re-measurements of a loaded candidate past 2.0.
THRESHOLD = 4.0


# What loads the machine: multithreaded numpy matmuls in a loop (OpenBLAS threads on every
# core, as another tune or a test run would be), two processes of them. Plain spinning
# processes do not slow an OpenMP kernel here: its threads wake ahead of them. These slow it
# now and then: a time is either its quiet one or hundreds of times that.
LOAD = """
import numpy as np
a = np.ones((1024, 1024), np.float32)
a @ a
print("busy", flush=True)
while True:
    a @ a
"""


@contextlib.contextmanager
def busy() -> Iterator[list[subprocess.Popen]]:
    """A process keeping every core busy until the block ends (or the list is emptied)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "busy\n"
        yield procs
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen]) -> None:
    while procs:
        proc = procs.pop()
        proc.kill()
        proc.wait()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A kernel cache of the test's own, whose calibration knows its quiet time."""
    with hexir.knobs.scope(cache_dir=str(tmp_path / "cache")):
        calibration = Calibration(hexir.Target("cpu"), tmp_path / "cache")
        for _ in range(5):
            calibration.ratio()
        yield calibration


@pytest.mark.serial
def test_the_calibration_kernel_runs_slower_under_load(cache):
    quiet = min(cache.ratio() for _ in range(3))
    loaded = []
    with busy():
        while len(loaded) < 200 and max(loaded, default=0.0) <= THRESHOLD:
            loaded.append(cache.ratio())
    assert 1.0 <= quiet < THRESHOLD < max(loaded), loaded
    # Its quiet time is kept for the next process, keyed by the kernel's source.
    again = Calibration(hexir.Target("cpu"), cache.file.parents[1])
    assert again.file == cache.file and again.quiet == cache.quiet


def test_a_run_whose_own_calls_spread_is_loaded_though_the_calibration_after_it_is_quiet():
    # ResNet-18's first conv (ms), timed in turn with its default in a 2000-trial tune while a
    # load came and went: the calibration kernel right after read 1.04. And its quiet run.
    loaded = [3.24, 5.2, 8.12, 2.27, 15.69, 6.59, 3.96, 2.02, 13.84, 3.82]
    quiet = [1.84, 1.94, 1.82, 1.76, 1.81, 1.87, 1.81, 1.81, 1.92, 1.88]
    assert load(1.04, loaded) == pytest.approx(4.58 / 2.02)  # its median over its fastest
    assert load(1.04, loaded) > 2.0  # past the `measure_calibration_threshold` knob's 2
    assert load(1.04, quiet) == pytest.approx(1.04, rel=0.01)
    assert load(5.0, quiet) == 5.0  # the calibration's figure, where it reads the load
    assert load(1.3, []) == 1.3 and load(1.0, [2.0]) == 1.0


def test_a_new_calibration_settles_its_quiet_time(tmp_path):
    calibration = Calibration(hexir.Target("cpu"), tmp_path)
    kept = json.loads(calibration.file.read_text())["quiet_seconds"]
    assert kept == calibration.quiet and calibration.ratio() >= 1.0
    # One kept is taken as it is, not timed again, while it is recent.
    calibration.file.write_text(json.dumps({"quiet_seconds": 1e-9, "settled": time.time()}))
    assert Calibration(hexir.Target("cpu"), tmp_path).quiet == 1e-9


def test_a_quiet_time_not_bettered_for_long_is_settled_again(tmp_path):
    """A machine's speed drifts: a quiet time from a faster hour would call every later time
    loaded."""
    first = Calibration(hexir.Target("cpu"), tmp_path)
    old = time.time() - STALE_SECONDS - 1
    first.file.write_text(json.dumps({"quiet_seconds": 1e-9, "settled": old}))
    again = Calibration(hexir.Target("cpu"), tmp_path)
    kept = json.loads(again.file.read_text())
    assert again.quiet > 1e-9 and kept["quiet_seconds"] == again.quiet and kept["settled"] > old
    # A file without the time it was settled (written before it was kept) is settled again too.
    first.file.write_text(json.dumps({"quiet_seconds": 1e-9}))
    assert Calibration(hexir.Target("cpu"), tmp_path).quiet > 1e-9


def test_a_ray_executor_settles_the_quiet_time_before_its_cluster_starts(tmp_path, monkeypatch):
    """The first candidates are timed while the cluster's workers start: a quiet time read
    then would be a loaded one. The executor settles it before it starts the cluster."""
    from hexir.search import distributed

    seen = []

    def connect(*args):
        seen.append(list((tmp_path / "calibration").glob("*.json")))
        raise KeyboardInterrupt  # the order is what is tested: no cluster is needed

    monkeypatch.setattr(distributed, "_connect", connect)
    with hexir.knobs.scope(cache_dir=str(tmp_path)), pytest.raises(KeyboardInterrupt):
        distributed.RayExecutor("cpu")
    assert len(seen) == 1 and len(seen[0]) == 1
    assert json.loads(seen[0][0].read_text())["quiet_seconds"] > 0


@pytest.mark.slow
@pytest.mark.serial
def test_a_tune_measures_again_what_it_timed_under_load(cache, tmp_path):
    func = hexir.workload("matmul", M=64, N=64, K=64)
    settings = dict(search_measure_per_round=12, search_population=24, search_generations=1,
                    timing_repeats=3, timing_min_seconds=0.002, tune_first_round_share=1.0,
                    measure_calibration_threshold=THRESHOLD)  # fmt: skip
    # The first round (12 trials) runs under load, which ends when the round is reported. The
    # load hits a calibration now and then, not always: a tune whose round it missed (one CI
    # run in many: every batch calibrated at 1.1-1.3), or whose re-measurement a busy host hit
    # too (once, on a host running at half its speed), is tried again, up to three times.
    for attempt in range(3):
        db = Database(f"sqlite:///{tmp_path / f'loaded{attempt}.db'}")
        with busy() as procs, hexir.knobs.scope(**settings):
            result = tune(func, "cpu", trials=20, database=db, seed=attempt,
                          callbacks=[lambda _, procs=procs: stop(procs)])  # fmt: skip
        records = db.records(hexir.workload_key(func), "cpu")
        timed = [r for r in records if r.is_valid]
        suspect = [r for r in timed if r.build_info["calibration"] > THRESHOLD]
        later = {
            r.candidate_key: [t for t in timed if t.candidate_key == r.candidate_key
                              and t.created > r.created]
            for r in suspect
        }  # fmt: skip
        if suspect and all(
            any(t.build_info["calibration"] <= THRESHOLD for t in ts) for ts in later.values()
        ):
            break
    assert suspect, [r.build_info["calibration"] for r in timed]
    assert result.trials == 20 and result.remeasured >= len({r.candidate_key for r in suspect})
    for key, ts in later.items():  # each suspect record measured again, quietly
        assert any(t.build_info["calibration"] <= THRESHOLD for t in ts), key
    # The records the tune reports are quiet ones (quiet at the tune's threshold: outside its
    # knobs, the product's 2 would rank a record calibrated at 2-4 after the others).
    (best,) = db.best(hexir.workload_key(func), "cpu", k=1, threshold=THRESHOLD)
    assert best.build_info["calibration"] <= THRESHOLD
    assert result.tasks[0].best_latency == best.median
