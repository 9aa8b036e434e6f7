"""Bad input through the `hexir` command, as a user meets it: a one-paragraph message, a
non-zero exit, no traceback (unless --debug), and the tuning database left as it was."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from cli_helpers import file_state, run_hexir, save_tiny_mlp

import hexir
from hexir.cli import main
from hexir.database import Database
from hexir.runtime.vm import Call, Program, Run


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """tiny.hexir, a real (empty) tuning database, bad model files and a CPU artifact."""
    import onnx
    from onnx import TensorProto, helper

    folder = tmp_path_factory.mktemp("bad")
    save_tiny_mlp(folder)
    Database(f"sqlite:///{folder / 'hexir.db'}").close()
    (folder / "garbage.onnx").write_bytes(b"\x08\x07not an onnx model at all")
    (folder / "notadb.db").write_text("these are not the bytes of a SQLite database\n")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    det = helper.make_graph([helper.make_node("Det", ["x"], ["y"], name="det")], "g", [x], [y])
    onnx.save(helper.make_model(det, opset_imports=[helper.make_opsetid("", 17)]),
              folder / "det.onnx")  # fmt: skip
    tiny = hexir.load_model(str(folder / "tiny.hexir"))
    hexir.compile(tiny, "cpu").save(folder / "tiny.hxa")
    ins, outs = (tuple(v.name for v in vs) for vs in (tiny.inputs, tiny.outputs))
    steps = (Run(tiny, ins, outs), Call("argmax", outs[:1], ("best",)))
    Program(ins, steps, ("best",)).compile("cpu").save(folder / "program.hxa")
    return folder


def _rewrite_manifest(src: Path, dst: Path, change) -> None:
    with zipfile.ZipFile(src) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    manifest = json.loads(entries["manifest.json"])
    change(manifest)
    entries["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


def _other_version(m: dict) -> None:
    m["hexir_version"] = "0.0.1"


def _missing_feature(m: dict) -> None:
    here = hexir.Target("cpu").features
    m["target"]["features"] = sorted([*m["target"]["features"], "sve" if "sve" not in here
                                      else "avx512f"])  # fmt: skip
    m["target"]["key"] = "-".join(["cpu", *m["target"]["features"]])


DB = "sqlite:///hexir.db"
CASES = [
    (["tune", "resnet19", "--trials", "4"], "Did you mean 'resnet18'"),
    (["build", "gtp2", "--db", DB], "Did you mean 'gpt2'"),
    (["tune", "garbage.onnx", "--trials", "4"], "garbage.onnx is not a readable ONNX model"),
    (["tune", "det.onnx", "--trials", "4"], "(Det): op type not supported"),
    (["build", "det.onnx", "--db", DB], "(Det): op type not supported"),
    (["tune", "tiny.hexir", "--trials", "4", "--target", "tpu"], "unknown target 'tpu'"),
    (["build", "tiny.hexir", "--target", "cuda -arch=sm_10", "--db", DB], "unknown CUDA arch"),
    (["tune", "tiny.hexir", "--trials", "4", "--db", "sqlite:///notadb.db"],
     "cannot open the tuning database sqlite:///notadb.db: file is not a database"),
    (["tune", "tiny.hexir", "--trials", "4", "--db", "postgresql://u@127.0.0.1:1/x"],
     "cannot open the tuning database"),  # nothing listens on port 1
    (["tune", "tiny.hexir", "--trials", "4", "--db", "postgresql+pg8000://u@127.0.0.1:1/x"],
     "its driver, the Python module pg8000, is not installed"),
    (["build", "tiny.hexir", "--db", "sqlite:///missing.db"], "no tuning database at"),
    (["db", "list", "--db", "sqlite:///missing.db"], "no tuning database at"),
    (["db", "best", "ffff", "--db", DB], "no workload whose key starts with 'ffff'"),
    (["run", "old.hxa"], "built by hexir 0.0.1; this is hexir"),
    (["run", "foreign.hxa"], "rebuild it on this machine"),
    (["run", "program.hxa"], "holds a program (steps over 1 module,"),
    (["run", "tiny.hexir", "--inputs", "garbage.onnx"], "cannot read inputs from garbage.onnx"),
    (["export", "matmul:M=4,N=4,K=4"], "is a single workload"),
    (["run", "matmul:M=4,N=4,K=4", "--profile"], "--profile times the commands of a whole model"),
    (["run", "tiny.hexir", "--profile", "--bench"], "--profile and --bench both time the model"),
]  # fmt: skip


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_bad_input_is_one_paragraph_and_leaves_the_database_alone(folder, argv, message):
    _rewrite_manifest(folder / "tiny.hxa", folder / "old.hxa", _other_version)
    _rewrite_manifest(folder / "tiny.hxa", folder / "foreign.hxa", _missing_feature)
    files = ["hexir.db", "notadb.db"]
    before = {name: file_state(folder / name) for name in files}
    done = run_hexir(folder, *argv)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("hexir: error: ") and message in done.stderr
    assert "Traceback" not in done.stderr
    assert {name: file_state(folder / name) for name in files} == before
    assert not (folder / "missing.db").exists() and not (folder / "tuning_logs").exists()
    assert Database(f"sqlite:///{folder / 'hexir.db'}").stats().records == 0


COMPARE_CASES = [
    (["matmul:M=4,N=4,K=4", "--db", DB], "--compare-default runs a model's two builds"),
    (["tiny.hexir"], "give the database (--db URL)"),
    (["tiny.hxa", "--db", DB], "tiny.hxa is an artifact"),
    (["tiny.hexir", "--db", DB, "--bench"], "--bench times one: drop one of the two flags"),
    (["tiny.hexir", "--db", DB, "--profile"], "--profile times one: drop one of the two flags"),
]


@pytest.mark.parametrize("argv, message", COMPARE_CASES, ids=[c[1][:24] for c in COMPARE_CASES])
def test_compare_default_refuses_what_has_no_two_builds_before_compiling(
    folder, monkeypatch, capsys, argv, message
):
    # In this process: the flags are checked before anything is loaded or compiled.
    monkeypatch.chdir(folder)
    assert main(["run", *argv, "--compare-default"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hexir: error: ") and message in err and err.count("\n") == 1
    assert Database(f"sqlite:///{folder / 'hexir.db'}").stats().records == 0


@pytest.mark.parametrize("trials", ["0", "-3", "abc", "2.5"])
def test_trials_must_be_a_positive_whole_number(folder, trials):
    before = file_state(folder / "hexir.db")
    done = run_hexir(folder, "tune", "tiny.hexir", "--trials", trials, "--db", DB)
    assert done.returncode == 2
    assert f"argument --trials: expected a positive whole number, got '{trials}'" in done.stderr
    assert "Traceback" not in done.stderr and file_state(folder / "hexir.db") == before


@pytest.mark.parametrize("span", ["0", "-3", "abc", "30x", "m"])
def test_a_time_budget_must_be_a_span_of_time(folder, span):
    before = file_state(folder / "hexir.db")
    done = run_hexir(folder, "tune", "tiny.hexir", "--time-budget", span, "--db", DB)
    assert done.returncode == 2
    assert "argument --time-budget: expected a span of time such as 90s" in done.stderr
    assert f"got '{span}'" in done.stderr
    assert "Traceback" not in done.stderr and file_state(folder / "hexir.db") == before


def test_a_tune_without_a_budget_is_refused(folder):
    before = file_state(folder / "hexir.db")
    done = run_hexir(folder, "tune", "tiny.hexir", "--db", DB)
    assert done.returncode == 2
    assert "a budget is needed: --trials N, --time-budget SPAN" in done.stderr
    assert "Traceback" not in done.stderr and file_state(folder / "hexir.db") == before


def test_debug_shows_the_traceback(folder):
    done = run_hexir(folder, "tune", "resnet19", "--trials", "4", "--debug")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ModelError: no model named 'resnet19'" in done.stderr
    assert not (folder / "tuning_logs").exists()


@pytest.mark.slow
def test_without_a_gpu_cuda_tunes_and_artifacts_are_refused(folder, tmp_path):
    from hexir.runtime.cuda_kernel import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    before = file_state(folder / "hexir.db")
    tune = run_hexir(folder, "tune", "tiny.hexir", "--trials", "4", "--target", "cuda",
                     "--db", DB, "--no-ray")  # fmt: skip
    assert tune.returncode == 1 and "cannot tune for cuda -arch=" in tune.stderr
    assert "Traceback" not in tune.stderr and file_state(folder / "hexir.db") == before
    built = run_hexir(folder, "build", "tiny.hexir", "--target", "cuda -arch=sm_90", "--db", DB,
                      "-o", str(tmp_path / "cuda.hxa"))  # fmt: skip
    assert built.returncode == 0, built.stderr
    done = run_hexir(folder, "run", str(tmp_path / "cuda.hxa"))
    assert done.returncode == 1 and "no CUDA GPU is visible here" in done.stderr
