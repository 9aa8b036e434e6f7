"""The `hexir` command: run and show, and one-paragraph errors with a non-zero exit."""

import os
import subprocess
import sys

import numpy as np
import pytest

import hexir
from hexir.cli import main, parse_workload_spec


def test_workload_spec_parses_typed_values():
    assert parse_workload_spec("conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,padding=1") == (
        "conv2d",
        {"N": 1, "C": 3, "H": 8, "W": 8, "K": 4, "R": 3, "S": 3, "padding": 1},
    )
    assert parse_workload_spec("dense:M=2,N=3,K=4,bias=false,activation=gelu")[1] == {
        "M": 2, "N": 3, "K": 4, "bias": False, "activation": "gelu",
    }  # fmt: skip
    assert parse_workload_spec("layer_norm:M=4,N=8,eps=0.001")[1]["eps"] == 0.001


@pytest.mark.parametrize("bad", ["matmul:M", "matmul:M=1,=2", "1abc:M=1"])
def test_bad_workload_spec_is_a_clear_error(bad):
    with pytest.raises(hexir.HexirError, match="KEY=VALUE|not a workload"):
        parse_workload_spec(bad)


def test_run_checks_against_numpy_and_times(capsys):
    assert main(["run", "matmul:M=48,N=40,K=24", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "matches numpy" in out
    assert "GFLOP/s" in out and "ms (median)" in out
    assert hexir.workload_key(hexir.workload("matmul", M=48, N=40, K=24)) in out


def test_show_prints_parsable_hextir(capsys):
    assert main(["show", "softmax:M=4,N=16"]) == 0
    text = capsys.readouterr().out
    func = hexir.parse(text.split("// workload key")[0])
    assert func == hexir.workload("softmax", M=4, N=16)


def test_show_reads_a_hexir_file_with_its_constants(tmp_path, capsys, rng):
    g = hexir.GraphBuilder("tiny")
    x = g.input("x", (4, 32))
    w = g.constant(rng.standard_normal((8, 32)).astype("float32"), name="w")
    graph = g.build([g.relu(g.dense(x, w))])
    (tmp_path / "tiny.hexir").write_text(str(graph))
    np.savez(tmp_path / "tiny.npz", w=graph.constant("w"))
    assert main(["show", str(tmp_path / "tiny.hexir")]) == 0
    assert hexir.parse(capsys.readouterr().out, constants={"w": graph.constant("w")}) == graph
    assert main(["show", str(tmp_path / "tiny.hexir"), "--kernels"]) == 0
    out = capsys.readouterr().out
    assert "1 kernels for 2 ops (fusion on)" in out and "matmul+relu" in out  # w laid out


@pytest.mark.slow  # 1.9 s
def test_show_lists_a_models_kernels_and_memory_plan(capsys):
    # Direct convs: the Winograd form makes each 3x3 conv six kernels by design.
    with hexir.knobs.scope(winograd="0"):
        assert main(["show", "resnet18", "--kernels", "--memory"]) == 0
    out = capsys.readouterr().out
    fused = int(out.split(" kernels for ")[0])
    ops = int(out.split(" kernels for ")[1].split()[0])
    assert fused < ops / 2  # the whole-models bar: fewer than half as many kernels
    assert "conv2d+bias_add+add+relu" in out
    assert "planned peak" in out and "liveness lower bound" in out
    with hexir.knobs.scope(fusion=False, winograd="0"):
        assert main(["show", "resnet18", "--kernels"]) == 0
    # Every op is a kernel but the flatten before the classifier (a reshape is a view), and
    # one more: the slice of the pixels the 1x1 conv of stride 2 on 56x56 keeps (layout.py).
    assert f"{ops} kernels for {ops} ops (fusion off)" in capsys.readouterr().out


@pytest.mark.slow
def test_show_forms_lists_each_convs_two_forms_and_the_one_built(capsys, tmp_path):
    from hexir.database import Database

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Database(url)  # an empty database: nothing measured, so every conv keeps the rule's form
    assert main(["show", "resnet18", "--forms", "--db", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("13 convs with a Winograd and a direct form")
    rows = lines[1:]
    assert len(rows) == 13 and all("unmeasured" in row for row in rows)
    assert sum(row.endswith("built F(4,3)") for row in rows) == 7  # 56x56 and 28x28
    assert sum(row.endswith("built F(2,3)") for row in rows) == 3  # 14x14
    assert sum(row.endswith("built direct") for row in rows) == 3  # 7x7
    assert main(["show", "resnet18", "--forms", "--db", f"sqlite:///{tmp_path / 'no.db'}"]) != 0
    assert "no tuning database" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "nosuch:M=1"], "unknown workload 'nosuch'"),
        (["run", "matmul:M=4"], "missing keyword"),
        (["show", "missing.hexir"], "missing.hexir"),
        (["show", "resnet19"], "resnet18"),
        (["run", "matmul:M=4,N=4,K=4", "--target", "tpu"], "tpu"),
    ],
)
def test_errors_are_one_paragraph_and_exit_nonzero(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("hexir: error:") and message in err
    assert "Traceback" not in err


def test_console_script_and_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "hexir", "show", "reduce_sum:M=2,N=8"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "block @reduce_sum" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "hexir", "run", "matmul:M=oops"], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "variable,value", [("HEXIR_NUM_THREADS", "abc"), ("HEXIR_MEASURE_TIMEOUT", "-1")]
)
def test_a_knob_that_does_not_parse_is_a_clear_error(variable, value):
    env = {**os.environ, variable: value}
    done = subprocess.run(
        [sys.executable, "-m", "hexir", "run", "mlp"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("hexir: error:") and f"{variable}={value!r}" in done.stderr
