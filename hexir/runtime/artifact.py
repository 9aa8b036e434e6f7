"""Artifacts: a compiled module as one file, and back.

    module.save("resnet18.hxa")                 # = save(module, "resnet18.hxa")
    module = hexir.runtime.load("resnet18.hxa")

An artifact is a zip archive (no pickle anywhere) holding:

    manifest.json          format, hexir version, target (text, key, kind, features, arch),
                           kernels, command list, constants' entries, memory plan, report
    graph.hexir            the compiled graph in hexir text (constants by name)
    kernels/<i>.hextir     each scheduled kernel, in hextir text
    kernels/<i>.c|.cu      its generated source
    kernels/<i>.so|.cubin  its device image
    runner/runner.c|.so    on the CPU, the native command runner (hexir/runtime/native.py)
    runner/binder.so       and the native binder (binder.py), used where the interpreter's
                           ABI and numpy's version are those of the manifest's "binder"
    constants/<i>.npy      each constant blob of the graph (numpy format, allow_pickle=False)

`load` refuses an artifact written by another hexir version (the kernels' calling convention
and the manifest may differ) and one whose target this machine lacks: on the CPU, an
instruction-set feature of the artifact's target key missing here; on CUDA, no GPU visible or
a GPU of another arch. It does not need the build cache: each device image is written to a
file named by its digest under `<cache_dir>/artifacts/` (once) and loaded from there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from hexir import knobs
from hexir.errors import ArtifactError, TargetError
from hexir.graph.memory import MemoryPlan
from hexir.runtime import binder
from hexir.runtime.module import Command, Module, TaskReport
from hexir.runtime.target import Target

__all__ = ["FORMAT", "FORMAT_VERSION", "load", "save"]

FORMAT = "hexir-artifact"
FORMAT_VERSION = 2  # 2: views (reshapes no command computes) and the plan's "views"


def save(module: Module, path: str | Path) -> Path:
    """Write `module` to `path` as one artifact file; the path written."""
    path = Path(path)
    entries: dict[str, bytes] = {"graph.hexir": str(module.graph).encode()}
    blobs: dict[str, str] = {}
    for i, (name, data) in enumerate(module.graph.constants):
        blobs[name] = f"constants/{i}.npy"
        entries[blobs[name]] = _npy(data.array)
    kernels = [
        _kernel_entry(i, kernel, module.target, entries) for i, kernel in enumerate(module.kernels)
    ]
    manifest = _manifest(module, kernels, blobs)
    if module.target.kind == "cpu":
        manifest["runner"] = _runner_entry(module, entries)
        if module.binder_library is not None:
            entries["runner/binder.so"] = module.binder_library.read_bytes()
            manifest["binder"] = {"image": "runner/binder.so", "abi": binder.abi()}
    entries["manifest.json"] = json.dumps(manifest, indent=1).encode()
    _write_zip(path, entries)
    return path


def load(path: str | Path) -> Module:
    """The module in the artifact at `path`, checked against this hexir and this machine."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ArtifactError(f"cannot read artifact {path}: {e}") from e
    with archive:
        manifest = _read_manifest(archive, path)
        target = _check_target(manifest["target"], path)
        blobs = {name: _read_npy(archive, entry) for name, entry in manifest["blobs"].items()}
        from hexir.ops.parse import parse_graph

        graph = parse_graph(archive.read("graph.hexir").decode(), constants=blobs)
        kernels = [_load_kernel(archive, k, target) for k in manifest["kernels"]]
        runner = manifest.get("runner")  # absent on a GPU
        runner_image = archive.read(runner["image"]) if runner else None
        entry = manifest.get("binder")  # built against this interpreter and numpy, or unused
        usable = entry is not None and entry.get("abi") == binder.abi()
        binder_image = archive.read(entry["image"]) if usable else None
    commands = [Command(int(k), tuple(args), int(n)) for k, args, n in manifest["commands"]]
    constants = {
        op.result.name: graph.constant(str(op.attr("name")))
        for op in graph.ops
        if op.kind == "constant"
    }
    plan = MemoryPlan.from_json(json.dumps(manifest["plan"]))
    report = tuple(_report_from_json(r) for r in manifest["report"])
    runner_library = _image_file(runner_image, ".so") if runner_image is not None else None
    binder_library = _image_file(binder_image, ".so") if binder_image is not None else None
    return Module(
        graph, target, kernels, commands, constants, plan, report, runner_library, binder_library
    )


# -- writing ----------------------------------------------------------------------------------


def _manifest(module: Module, kernels: list[dict], blobs: dict[str, str]) -> dict[str, object]:
    import hexir

    t = module.target
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "hexir_version": hexir.__version__,
        "target": {
            "text": str(t),
            "key": t.key,
            "kind": t.kind,
            "arch": t.arch,
            "features": list(t.features),
        },
        "graph": module.graph.name,
        "kernels": kernels,
        "commands": [[c.kernel, list(c.args), c.num_outputs] for c in module.commands],
        "blobs": blobs,
        "plan": json.loads(module.plan.to_json()),
        "report": [_report_to_json(r) for r in module.report],
    }


def _runner_entry(module: Module, entries: dict[str, bytes]) -> dict[str, str]:
    """Add the native command runner's source and image (hexir/runtime/native.py) to
    `entries`; its manifest entry."""
    from hexir.runtime.native import RUNNER_SOURCE, runner_library

    library = module.runner_library or runner_library(module.target)  # the knob was off
    entries["runner/runner.c"] = RUNNER_SOURCE.encode()
    entries["runner/runner.so"] = library.read_bytes()
    return {"source": "runner/runner.c", "image": "runner/runner.so"}


def _kernel_entry(i: int, kernel: object, target: Target, entries: dict[str, bytes]) -> dict:
    """Add kernel `i`'s files to `entries`; its manifest entry."""
    entry: dict[str, object] = {"func": f"kernels/{i}.hextir"}
    if target.kind == "cuda":
        from hexir.runtime.cuda_module import kernel_launch

        entry.update(source=f"kernels/{i}.cu", image=f"kernels/{i}.cubin")
        entry["launch"] = kernel_launch(kernel)  # type: ignore[arg-type]
        image = kernel.binary.cubin  # type: ignore[attr-defined]
    else:
        entry.update(source=f"kernels/{i}.c", image=f"kernels/{i}.so")
        image = Path(kernel.path).read_bytes()  # type: ignore[attr-defined]
    entries[str(entry["func"])] = str(kernel.func).encode()  # type: ignore[attr-defined]
    entries[str(entry["source"])] = kernel.source.encode()  # type: ignore[attr-defined]
    entries[str(entry["image"])] = bytes(image)
    return entry


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    return out.getvalue()


def _write_zip(path: Path, entries: dict[str, bytes]) -> None:
    # Written beside the destination and renamed: a reader never sees half an artifact.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            for name in sorted(entries):
                z.writestr(name, entries[name])
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _report_to_json(r: TaskReport) -> dict[str, object]:
    return {
        "name": r.name,
        "workload_key": r.workload_key,
        "schedule": r.schedule,
        "trace": r.trace.to_json(),
        "kernel": r.kernel,
        "ops": list(r.ops),
    }


# -- reading ----------------------------------------------------------------------------------


def _read_manifest(archive: zipfile.ZipFile, path: Path) -> dict:
    import hexir

    try:
        manifest = json.loads(archive.read("manifest.json"))
    except (KeyError, ValueError) as e:
        raise ArtifactError(f"{path} is not a hexir artifact: no readable manifest.json") from e
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} is not a hexir artifact of format {FORMAT} {FORMAT_VERSION} "
            f"(found {manifest.get('format')} {manifest.get('format_version')})"
        )
    version = manifest.get("hexir_version")
    if version != hexir.__version__:
        raise ArtifactError(
            f"artifact {path} was built by hexir {version}; this is hexir {hexir.__version__}. "
            "Kernels are not portable between versions: rebuild it with this version "
            "(hexir.compile(...).save(path))"
        )
    return manifest


def _check_target(data: dict, path: Path) -> Target:
    """This machine's Target for the artifact's, or TargetError saying what is missing."""
    if data["kind"] == "cpu":
        here = Target("cpu")
        missing = sorted(set(data["features"]) - set(here.features))
        if missing:
            raise TargetError(
                f"artifact {path} targets {data['key']}, but this CPU ({here.key}) lacks "
                f"{', '.join(missing)}: rebuild it on this machine, or run it on one with "
                "those instruction-set features"
            )
        return here
    from hexir.runtime.target import visible_cuda_arch

    arch = visible_cuda_arch()
    if arch is None:
        raise TargetError(
            f"artifact {path} targets {data['key']}, but no CUDA GPU is visible here: run it "
            "on a machine with an NVIDIA GPU of that arch"
        )
    if arch != data["arch"]:
        raise TargetError(
            f"artifact {path} targets {data['key']}, but the GPU here is {arch}: rebuild it "
            f"for target 'cuda -arch={arch}'"
        )
    return Target(str(data["text"]))


def _read_npy(archive: zipfile.ZipFile, entry: str) -> np.ndarray:
    return np.load(io.BytesIO(archive.read(entry)), allow_pickle=False)


def _load_kernel(archive: zipfile.ZipFile, entry: dict, target: Target) -> object:
    from hexir.ir.tir_text import parse_func

    func = parse_func(archive.read(entry["func"]).decode())
    source = archive.read(entry["source"]).decode()
    image = archive.read(entry["image"])
    if target.kind == "cuda":
        from hexir.runtime.cuda_module import load_kernel

        return load_kernel(func, source, image, target, entry["launch"])
    from hexir.runtime.kernel import CpuKernel

    return CpuKernel(func, source, _image_file(image, ".so"), target)


def _image_file(image: bytes, suffix: str) -> Path:
    """A file holding `image`, named by its digest (written once, atomically)."""
    digest = hashlib.sha256(image).hexdigest()[:32]
    directory = Path(knobs.get().cache_dir).expanduser() / "artifacts"
    path = directory / f"{digest}{suffix}"
    if path.exists() and path.stat().st_size == len(image):
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".load-", suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(image)
    os.replace(tmp, path)
    return path


def _report_from_json(data: dict) -> TaskReport:
    from hexir.schedule.trace import Trace

    return TaskReport(
        str(data["name"]),
        str(data["workload_key"]),
        str(data["schedule"]),
        Trace.from_json(str(data["trace"])),
        int(data["kernel"]),
        tuple(str(o) for o in data["ops"]),
    )
