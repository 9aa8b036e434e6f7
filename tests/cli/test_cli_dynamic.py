"""`hexir build MODEL --dynamic`: a model with symbolic dims compiled once into an artifact
that `hexir run FILE --dim NAME=SIZE` runs at any size; what it cannot do is refused in a
paragraph, without a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_hexir, save_tiny_mlp

import hexir
from hexir.frontend.load import save_model


def slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """block.hexir: x [1, {seq}, 64] -> matmul -> softmax -> layer_norm, built --dynamic into
    block.hxa; tiny.hexir, a model of fixed sizes."""
    folder = tmp_path_factory.mktemp("dynamic")
    rng = np.random.default_rng(0)
    b = hexir.GraphBuilder("block")
    x = b.input("x", (1, "seq", 64))
    w = b.constant(rng.standard_normal((64, 64)).astype(np.float32))
    gamma, beta = (b.constant(rng.standard_normal(64).astype(np.float32)) for _ in range(2))
    y = b.softmax(b.matmul(b.reshape(x, (-1, 64)), w))
    save_model(b.build(b.layer_norm(y, gamma, beta, epsilon=1e-5)), folder / "block.hexir")
    save_tiny_mlp(folder)
    done = run_hexir(folder, "build", "block.hexir", "--dynamic", "--target", "cpu")
    assert done.returncode == 0, done.stderr
    assert "dynamic in seq" in done.stdout and "wrote block.hxa" in done.stdout
    assert "2 kernels compiled once for every size; 1 contraction groups" in done.stdout
    return folder


@pytest.mark.slow  # three runs in subprocesses, each compiling a bucket: 2-3 s
def test_the_artifact_runs_any_size_and_matches_numpy(folder):
    for n in (17, 300):
        done = run_hexir(folder, "run", "block.hxa", "--dim", f"seq={n}", "--check")
        assert done.returncode == 0, done.stderr
        assert f"run at seq = {n}" in done.stdout and "matches numpy" in done.stdout
        assert f"{n}x64 float32" in done.stdout
    np.savez(folder / "in.npz", x=np.random.default_rng().random((1, 5, 64), np.float32))
    done = run_hexir(folder, "run", "block.hxa", "--inputs", "in.npz", "--check", "--bench")
    assert done.returncode == 0, done.stderr
    assert "run at seq = 5" in done.stdout and "bench" in done.stdout


@pytest.mark.slow  # two compiles in subprocesses: 2-3 s
def test_the_model_file_itself_runs_at_the_sizes_given(folder):
    done = run_hexir(folder, "run", "block.hexir", "--dim", "seq=6", "--check")
    assert done.returncode == 0, done.stderr
    assert "6x64 float32" in done.stdout and "matches numpy" in done.stdout
    np.savez(folder / "in3.npz", x=np.random.default_rng().random((1, 3, 64), np.float32))
    done = run_hexir(folder, "run", "block.hexir", "--inputs", "in3.npz", "--check")
    assert done.returncode == 0, done.stderr
    assert "3x64 float32" in done.stdout and "matches numpy" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "block.hxa"], "runs at any size of seq: give the sizes to run at (--dim seq"),
        (["run", "block.hexir"], "has symbolic dims (seq): give the sizes to run at (--dim seq"),
        # the rest in the slow suite: a subprocess each, 0.4 s
        slow(["run", "block.hexir", "--dim", "len=3"], "has the symbolic dims seq: it has no len"),
        slow(["run", "tiny.hexir", "--dim", "seq=3"], "tiny.hexir has static shapes"),
        slow(["run", "block.hxa", "--dim", "seq=4", "--profile"], "--profile times a module of"),
        slow(["build", "tiny.hexir", "--dynamic"], "has no symbolic dims"),
    ],
)
def test_what_a_dynamic_build_cannot_do_is_refused_in_a_paragraph(folder, args, message):
    done = run_hexir(folder, *args)
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr
