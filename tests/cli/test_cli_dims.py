"""`hexir run` of an ONNX model exported with dynamic axes: `--dim NAME=SIZE` sizes its
symbolic dims, or `--inputs` does by the arrays' shapes; unsized dims and bad --dim values are
refused in a paragraph, without a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_hexir

FIXTURES = Path(__file__).parents[1] / "frontend" / "fixtures"
VOCAB = 100  # scripts/export_hf_fixtures.py


@pytest.mark.slow  # two compiles of a model in subprocesses: 2.6 s
def test_hexir_run_sizes_a_dynamic_model_by_dim_or_by_its_inputs(tmp_path, rng):
    path = FIXTURES / "bert_tiny_dynamic.onnx"
    done = run_hexir(tmp_path, "run", str(path), "--dim", "batch=2", "--dim", "sequence=5")
    assert done.returncode == 0, done.stderr
    assert "hidden  2x5x32 float32" in done.stdout
    ids = rng.integers(0, VOCAB, (3, 9), np.int64)
    np.savez(tmp_path / "in.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    done = run_hexir(tmp_path, "run", str(path), "--inputs", "in.npz", "--check")
    assert done.returncode == 0, done.stderr
    assert "hidden  3x9x32 float32" in done.stdout and "matches numpy" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "input 'input_ids' has symbolic dims 'batch', 'sequence' not bound"),
        (["--dim", "batch=1", "--dim", "batch=2"], "--dim sizes batch more than once"),
        (["--dim", "sequence=x"], "'sequence=x' is not NAME=SIZE with a positive size"),
    ],
)
def test_hexir_run_refuses_unsized_dims_in_a_paragraph(tmp_path, args, message):
    done = run_hexir(tmp_path, "run", str(FIXTURES / "bert_tiny_dynamic.onnx"), *args)
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr


def test_hexir_run_refuses_dims_for_a_model_of_static_shapes(tmp_path):
    done = run_hexir(tmp_path, "run", "mlp", "--dim", "sequence=4")
    assert done.returncode != 0
    assert "mlp has static shapes" in done.stderr and "Traceback" not in done.stderr
