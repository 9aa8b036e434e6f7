"""Hooks for the whole suite.

GPU tests: marked `gpu`, they all live in tests/gpu (a `gpu` test elsewhere is a collection
error, so `scripts/gpu_check.sh`, which runs `pytest -m gpu tests/gpu`, runs every one of
them), and are skipped cleanly where CUDA kernels cannot run. The probe is cheap (import
pycuda, initialize the driver, count devices; no context) and runs once per session; on the
GPU machine gpu_check.sh fails on any skip, so a skip cannot pass for a success there.

Serial tests: the suite runs on two xdist workers, `pytest -n 2 -m "not serial"`, then the
tests marked `serial` alone, `pytest -m serial`. A serial test times kernels and asserts on the
times (an OpenMP kernel beside another busy process can read a hundred times its time), loads
the machine itself or starts a Ray cluster; `-n` without `-m "not serial"` is a usage error,
not a flaky run.

Random inputs: the `rng` fixture is a numpy Generator seeded from the test's node id (crc32,
so a test draws the same inputs in every run and alone or in the suite); module-level
helpers get the same generator from `seeding.current_rng()` (tests/seeding.py). The
environment variable HEXIR_TEST_SEED=<int> seeds every test with that one seed instead. A
failing test that drew from its generator prints its seed and the command that reruns it:
`seed 123 (rerun: HEXIR_TEST_SEED=123 pytest 'tests/x.py::test_y')`.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import seeding

GPU_DIR = Path(__file__).parent / "gpu"
SEED = pytest.StashKey[int]()


@functools.cache
def _reason() -> str | None:
    from hexir.runtime.cuda_kernel import gpu_unavailable_reason

    return gpu_unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    stray = [item.nodeid for item in gpu_items if GPU_DIR not in item.path.parents]
    if stray:
        raise pytest.UsageError(
            f"gpu-marked tests outside tests/gpu, which scripts/gpu_check.sh would not run: {stray}"
        )
    reason = _reason() if gpu_items else None
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason.split(". ")[0])
    for item in gpu_items:
        item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    workers = getattr(config.option, "numprocesses", None)
    if workers and "not serial" not in (config.option.markexpr or ""):
        raise pytest.UsageError(
            f"-n {workers} would run the tests marked serial beside other xdist workers, which "
            'disturb what they time: run `pytest -n 2 -m "not serial"`, then `pytest -m serial`'
        )


@pytest.fixture(autouse=True)
def _test_seed(request: pytest.FixtureRequest) -> Iterator[None]:
    seed = seeding.seed_for(request.node.nodeid)
    request.node.stash[SEED] = seed
    seeding.start(seed)
    yield
    seeding.stop()


@pytest.fixture
def rng(_test_seed: None) -> np.random.Generator:
    """This test's seeded generator (see the module docstring)."""
    return seeding.current_rng()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    seed = item.stash.get(SEED, None)
    if report.failed and seed is not None and seeding.drawn():
        command = f"{seeding.SEED_VARIABLE}={seed} pytest {shlex.quote(item.nodeid)}"
        report.sections.append(("seed", f"seed {seed} (rerun: {command})"))
    return report
