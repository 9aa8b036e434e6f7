"""Artifacts: one file per module, through save and load, and the refusals."""

import json
import zipfile

import numpy as np
import pytest

import hexir
import hexir.runtime
from hexir.errors import ArtifactError, TargetError
from hexir.frontend import zoo
from hexir.runtime import cc


def small_bert() -> hexir.Graph:
    return zoo.bert(seq=8, hidden=32, heads=2, ffn=64)


def rewrite_manifest(path, change) -> None:
    """Rewrite the artifact at `path` with `change(manifest)` applied."""
    with zipfile.ZipFile(path) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    manifest = json.loads(entries["manifest.json"])
    change(manifest)
    entries["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A compiled small BERT layer (unfused: in-place steps too) and its artifact."""
    with hexir.knobs.scope(fusion=False):
        module = hexir.compile(small_bert())
    path = module.save(tmp_path_factory.mktemp("artifact") / "bert.hxa")
    return module, path


def test_a_module_round_trips_through_one_file(saved, tmp_path, monkeypatch, rng):
    module, path = saved
    assert path.is_file() and zipfile.is_zipfile(path)
    # Loading must not compile anything nor need the build cache.
    monkeypatch.setattr(cc, "_invoke", lambda command: pytest.fail(f"compiler run: {command}"))
    with hexir.knobs.scope(cache_dir=str(tmp_path / "fresh-cache")):
        loaded = hexir.runtime.load(path)
        inputs = [rng.standard_normal((8, 32)).astype("float32")]
        for out, again in zip(module.run(inputs), loaded.run(inputs), strict=True):
            np.testing.assert_array_equal(out, again)
        np.testing.assert_array_equal(loaded.run(inputs, plan=False)[0], module.run(inputs)[0])
        # The native command runner came from the artifact too, and the binder.
        assert loaded._cpu_buffers().runner is not None
        assert loaded.runner_library.is_relative_to(tmp_path / "fresh-cache")
        assert loaded._cpu_buffers().binder is not None
        assert loaded.binder_library.is_relative_to(tmp_path / "fresh-cache")
    assert loaded.commands == module.commands
    assert loaded.plan == module.plan and loaded.plan.inplace
    assert [str(k.func) for k in loaded.kernels] == [str(k.func) for k in module.kernels]
    assert [(r.workload_key, r.schedule, r.trace.to_json()) for r in loaded.report] == [
        (r.workload_key, r.schedule, r.trace.to_json()) for r in module.report
    ]
    assert str(loaded.graph) == str(module.graph)


def test_an_artifact_binder_of_another_interpreter_is_left_unused(saved, tmp_path, rng):
    # Its image is built against one CPython ABI and numpy: elsewhere, Python binds, and
    # loading still compiles nothing.
    module, path = saved
    other = tmp_path / "other.hxa"
    other.write_bytes(path.read_bytes())
    rewrite_manifest(other, lambda m: m["binder"].update(abi="cpython-39-x86_64-linux-gnu"))
    loaded = hexir.runtime.load(other)
    assert loaded.binder_library is None and loaded._cpu_buffers().binder is None
    inputs = [rng.standard_normal((8, 32)).astype("float32")]
    np.testing.assert_array_equal(loaded.run(inputs)[0], module.run(inputs)[0])


def test_the_artifact_holds_images_commands_constants_plan_and_keys(saved):
    module, path = saved
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("manifest.json"))
        (part,) = manifest["modules"]
        blobs = {k: np.load(z.open(v), allow_pickle=False) for k, v in part["blobs"].items()}
    assert manifest["hexir_version"] == hexir.__version__
    assert manifest["target"]["key"] == hexir.Target("cpu").key
    # a module alone: a program of one step that runs it, with the graph's inputs and outputs
    assert manifest["kind"] == "module"
    assert manifest["program"]["steps"] == [{
        "run": 0, "inputs": [v.name for v in module.graph.inputs],
        "outputs": [v.name for v in module.graph.outputs],
    }]  # fmt: skip
    assert len(part["commands"]) == len(module.commands)
    assert part["plan"]["storage_sizes"] == list(module.plan.storage_sizes)
    assert {"manifest.json", "modules/0/graph.hexir"} <= names
    assert all(k["image"].endswith(".so") and k["image"] in names for k in part["kernels"])
    assert {manifest["runner"]["source"], manifest["runner"]["image"]} <= names
    for name, data in module.graph.constants:
        np.testing.assert_array_equal(blobs[name], data.array)
    assert not any(n.endswith((".pkl", ".pickle")) for n in names)


def test_an_artifact_of_another_hexir_version_is_refused(saved, tmp_path):
    _, path = saved
    old = tmp_path / "old.hxa"
    old.write_bytes(path.read_bytes())
    rewrite_manifest(old, lambda m: m.update(hexir_version="0.0.1"))
    with pytest.raises(
        ArtifactError, match=f"built by hexir 0.0.1; this is hexir {hexir.__version__}"
    ):
        hexir.runtime.load(old)


@pytest.mark.parametrize(
    "version, message",
    [
        # format 2 held one module's kernels and no program
        (2, "format 2, from before artifacts carried a program"),
        # format 1 ran every reshape as a command (format 2 keeps views in the plan)
        (1, "of format hexir-artifact 3 .found hexir-artifact 1"),
    ],
)
def test_an_artifact_of_an_older_format_is_refused(saved, tmp_path, version, message):
    _, path = saved
    old = tmp_path / f"format{version}.hxa"
    old.write_bytes(path.read_bytes())
    rewrite_manifest(old, lambda m: m.update(format_version=version))
    with pytest.raises(ArtifactError, match=message):
        hexir.runtime.load(old)


def test_an_artifact_for_missing_cpu_features_is_refused(saved, tmp_path):
    _, path = saved
    foreign = tmp_path / "arm.hxa"
    foreign.write_bytes(path.read_bytes())
    here = hexir.Target("cpu")
    missing = "sve" if "sve" not in here.features else "avx512f"

    def other_cpu(manifest: dict) -> None:
        manifest["target"]["features"] = sorted([*manifest["target"]["features"], missing])
        manifest["target"]["key"] = "-".join(["cpu", *manifest["target"]["features"]])

    rewrite_manifest(foreign, other_cpu)
    with pytest.raises(TargetError, match=f"this CPU \\({here.key}\\) lacks {missing}"):
        hexir.runtime.load(foreign)


def test_a_cuda_artifact_is_refused_without_a_gpu(tmp_path):
    from hexir.runtime.target import visible_cuda_arch

    if visible_cuda_arch() is not None:
        pytest.skip("a GPU is visible here")
    g = hexir.GraphBuilder("g")
    x = g.input("x", (4, 8))
    module = hexir.compile(g.build([g.softmax(g.exp(x))]), target="cuda -arch=sm_90")
    path = module.save(tmp_path / "gpu.hxa")
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        (part,) = manifest["modules"]
        assert all(z.read(k["image"]) for k in part["kernels"])
    assert manifest["target"]["key"] == "cuda-sm_90"
    assert part["kernels"][0]["image"].endswith(".cubin")
    with pytest.raises(TargetError, match="targets cuda-sm_90, but no CUDA GPU is visible"):
        hexir.runtime.load(path)


def test_a_file_that_is_not_an_artifact_is_refused(tmp_path):
    junk = tmp_path / "junk.hxa"
    junk.write_text("hello")
    with pytest.raises(ArtifactError, match="cannot read artifact"):
        hexir.runtime.load(junk)
    empty = tmp_path / "empty.hxa"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("x", "y")
    with pytest.raises(ArtifactError, match="no readable manifest.json"):
        hexir.runtime.load(empty)
