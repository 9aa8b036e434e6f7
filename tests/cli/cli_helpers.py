"""Helpers of the CLI tests: the `hexir` command as a user calls it, a subprocess in a folder
of its own, and the tiny model it works on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hexir.frontend.load import save_model
from hexir.frontend.zoo import mlp

# A small search and quick timing: the tests check the command, not the speed.
SMALL_ENV = {
    "HEXIR_SEARCH_POPULATION": "24",
    "HEXIR_SEARCH_GENERATIONS": "2",
    "HEXIR_SEARCH_MEASURE_PER_ROUND": "4",
    "HEXIR_TIMING_REPEATS": "3",
    "HEXIR_TIMING_MIN_SECONDS": "0.002",
    # The tests count records: no second measurement of a time measured under load
    # (tests/search/test_calibration.py tests that).
    "HEXIR_MEASURE_CALIBRATION_THRESHOLD": "0",
    # Nor the best measured again at the end (tests/search/test_tune.py tests that).
    "HEXIR_TUNE_CONFIRM_BEST": "0",
}


def run_hexir(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m hexir ARGS` in `cwd`, with the small search; output captured as text."""
    env = {**os.environ, **SMALL_ENV}
    return subprocess.run(
        [sys.executable, "-m", "hexir", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def save_tiny_mlp(folder: Path) -> Path:
    """A three-task MLP (dense+bias+relu, dense+bias, softmax: matmuls once the weights are laid
    out) as tiny.hexir + tiny.npz."""
    path = folder / "tiny.hexir"
    save_model(mlp(batch=4, sizes=(32, 16, 8)), path)
    return path


def file_state(path: Path) -> tuple[bytes, int] | None:
    """A file's bytes and modification time (None when it does not exist)."""
    if not path.exists():
        return None
    return path.read_bytes(), path.stat().st_mtime_ns
