"""Helpers of the CLI tests: the `hexir` command as a user calls it, a subprocess in a folder
of its own, and the tiny model it works on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from small_search import SMALL_SEARCH, as_environment

from hexir.frontend.load import save_model
from hexir.frontend.zoo import mlp

# A small search and quick timing: the tests check the command, not the speed.
# The tests count records: no confirmation of the best at the end, nor of a claimed gain as
# a tune goes (test_tune.py tests them).
SMALL_ENV = as_environment({**SMALL_SEARCH, "tune_confirm_best": 0, "tune_check_gain": 0})


def run_hexir(
    cwd: Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m hexir ARGS` in `cwd`, with the small search (and `env` over it); output
    captured as text."""
    env = {**os.environ, **SMALL_ENV, **(env or {})}
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
