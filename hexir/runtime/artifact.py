"""Artifacts: a compiled module, or a compiled program of several, as one file, and back.

    module.save("resnet18.hxa")                 # = save(module, "resnet18.hxa")
    module = hexir.runtime.load("resnet18.hxa")
    program.compile("cpu").save("loop.hxa")     # a CompiledProgram (hexir/runtime/vm.py)
    compiled = hexir.runtime.load("loop.hxa")   # a CompiledProgram again

An artifact is a zip archive (no pickle anywhere) holding:

    manifest.json          format, hexir version, target (text, key, kind, features, arch),
                           kind ("module" or "program"), the program, and per module its
                           kernels, command list, constants' entries, memory plan, report
    modules/<m>/graph.hexir          module m's compiled graph in hexir text (constants by name)
    modules/<m>/kernels/<i>.hextir   each scheduled kernel, in hextir text
    modules/<m>/kernels/<i>.c|.cu    its generated source
    modules/<m>/kernels/<i>.so|.cubin  its device image
    modules/<m>/constants/<i>.npy    each constant blob of its graph (numpy format,
                                     allow_pickle=False)
    runner/runner.c|.so    on the CPU, the native command runner (hexir/runtime/native.py)
    runner/binder.so       and the native binder (binder.py), used where the interpreter's
                           ABI and numpy's version are those of the manifest's "binder"

A module compiled once for every size of its symbols (a DynamicModule, kind "dynamic")
holds its compiled graph under dynamic/ (graph.hexir, constants/), and per step under
dynamic/steps/<i>/ its kernel of symbolic extents (kernel.hextir, .c, .so), or its group's
graph (group.hexir) and the modules of the buckets compiled so far (buckets/<k>/, laid out as
a module's entries); loaded, a bucket no run had reached compiles on its first run.

The program (`Program.to_json`) is the VM's: steps that run a module (by number), branch,
loop or call a builtin. A module saved alone is a program of one step that runs it, and loads
as a Module; a CompiledProgram loads as one. `load` refuses an artifact of an earlier format
(format 2 held one module and no program), one written by another hexir version (the
kernels' calling convention and the manifest may differ) and one whose target this machine
lacks: on the CPU, an instruction-set feature of the artifact's target key missing here; on
CUDA, no GPU visible or a GPU of another arch. It does not need the build cache: each device
image is written to a file named by its digest under `<cache_dir>/artifacts/` (once) and
loaded from there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hexir import knobs
from hexir.errors import ArtifactError, TargetError
from hexir.graph.memory import MemoryPlan
from hexir.ir.graph import Graph
from hexir.runtime import binder
from hexir.runtime.dynamic_module import DynamicModule
from hexir.runtime.module import Command, Module, TaskReport
from hexir.runtime.target import Target

if TYPE_CHECKING:
    from hexir.runtime.vm import CompiledProgram

__all__ = ["FORMAT", "FORMAT_VERSION", "load", "save"]

FORMAT = "hexir-artifact"
# 3: a program over one or more modules (each under modules/<m>/); 2: views (reshapes no
# command computes) and the plan's "views"
FORMAT_VERSION = 3


def save(subject: Module | CompiledProgram | DynamicModule, path: str | Path) -> Path:
    """Write a module, or a compiled program and its modules, to `path` as one artifact file;
    the path written."""
    from hexir.runtime.vm import Program, Run

    path = Path(path)
    if isinstance(subject, DynamicModule):
        return _save_dynamic(subject, path)
    if isinstance(subject, Module):
        graph = subject.graph
        inputs, outputs = (tuple(v.name for v in vs) for vs in (graph.inputs, graph.outputs))
        program = Program(inputs, (Run(graph, inputs, outputs),), outputs, graph.name)
        modules, kind = [subject], "module"
    else:
        program, modules, kind = subject.program, subject.modules(), "program"
    target = subject.target
    entries: dict[str, bytes] = {}
    manifest = _header(target)
    manifest.update(
        kind=kind,
        program=program.to_json(),
        modules=[_module_entries(m, f"modules/{i}/", entries) for i, m in enumerate(modules)],
    )
    _native_entries(modules, target, manifest, entries)
    entries["manifest.json"] = json.dumps(manifest, indent=1).encode()
    _write_zip(path, entries)
    return path


def _native_entries(
    modules: list[Module], target: Target, manifest: dict, entries: dict[str, bytes]
) -> None:
    """On the CPU, the command runner and the binder the modules run with."""
    if target.kind != "cpu":
        return
    manifest["runner"] = _runner_entry(modules, target, entries)
    library = next((m.binder_library for m in modules if m.binder_library is not None), None)
    if library is not None:
        entries["runner/binder.so"] = library.read_bytes()
        manifest["binder"] = {"image": "runner/binder.so", "abi": binder.abi()}


def _save_dynamic(module: DynamicModule, path: Path) -> Path:
    """A module compiled once for every size (kind "dynamic"): its compiled graph and
    constants, and per step its kernel of symbolic extents, or its group's graph and the
    modules of the buckets compiled so far (each as a module's entries)."""
    entries: dict[str, bytes] = {}
    manifest = _header(module.target)
    blobs = _graph_entries(module.compiled, "dynamic/", entries)
    steps, modules = [], []
    for i, step in enumerate(module.steps):
        part: dict[str, object] = {
            "how": step.how, "name": step.name,
            "inputs": list(step.inputs), "outputs": list(step.outputs),
        }  # fmt: skip
        prefix = f"dynamic/steps/{i}/"
        if step.how == "kernel":
            part["kernel"] = _kernel_entry(f"{prefix}kernel", step.runner, module.target, entries)
        elif step.how != "view":
            runner = step.runner  # a SymbolicModule
            entries[f"{prefix}group.hexir"] = str(runner.graph).encode()  # type: ignore[attr-defined]
            part["group"] = f"{prefix}group.hexir"
            part["buckets"] = []
            for k, (key, compiled) in enumerate(runner.specializations.items()):  # type: ignore[attr-defined]
                entry = _module_entries(compiled, f"{prefix}buckets/{k}/", entries)
                part["buckets"].append({"sizes": [list(kv) for kv in key], "module": entry})  # type: ignore[union-attr]
                modules.append(compiled)
        steps.append(part)
    manifest.update(kind="dynamic", graph="dynamic/graph.hexir", blobs=blobs, steps=steps)
    if modules:
        _native_entries(modules, module.target, manifest, entries)
    entries["manifest.json"] = json.dumps(manifest, indent=1).encode()
    _write_zip(path, entries)
    return path


def _graph_entries(graph: Graph, prefix: str, entries: dict[str, bytes]) -> dict[str, str]:
    """Add `graph` (hexir text, constants by name) and its constants' blobs to `entries`
    under `prefix`; each constant's entry by name."""
    entries[f"{prefix}graph.hexir"] = str(graph).encode()
    blobs: dict[str, str] = {}
    for i, (name, data) in enumerate(graph.constants):
        blobs[name] = f"{prefix}constants/{i}.npy"
        entries[blobs[name]] = _npy(data.array)
    return blobs


def _load_dynamic(
    archive: zipfile.ZipFile,
    manifest: dict,
    target: Target,
    runner_library: Path | None,
    binder_library: Path | None,
) -> DynamicModule:
    from hexir.ops.parse import parse_graph
    from hexir.runtime.dynamic_module import Step
    from hexir.runtime.symbolic_module import SymbolicModule

    compiled, blobs = _read_graph(archive, manifest)
    steps = []
    for part in manifest["steps"]:
        how, runner = part["how"], None
        if how == "kernel":
            runner = _load_kernel(archive, part["kernel"], target)
        elif how != "view":
            group = parse_graph(archive.read(part["group"]).decode(), constants=blobs)
            runner = SymbolicModule(group, target)
            for bucket in part["buckets"]:
                key = tuple((str(n), int(size)) for n, size in bucket["sizes"])
                runner.specializations[key] = _load_module(
                    archive, bucket["module"], target, runner_library, binder_library
                )
        inputs, outputs = tuple(part["inputs"]), tuple(part["outputs"])
        steps.append(Step(how, part["name"], inputs, outputs, runner))
    return DynamicModule.of_steps(compiled, target, steps)


def load(path: str | Path) -> Module | CompiledProgram | DynamicModule:
    """The module or compiled program in the artifact at `path`, checked against this hexir
    and this machine."""
    from hexir.runtime.vm import CompiledProgram, Program

    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ArtifactError(f"cannot read artifact {path}: {e}") from e
    with archive:
        manifest = _read_manifest(archive, path)
        target = _check_target(manifest["target"], path)
        runner = manifest.get("runner")  # absent on a GPU
        runner_image = archive.read(runner["image"]) if runner else None
        entry = manifest.get("binder")  # built against this interpreter and numpy, or unused
        usable = entry is not None and entry.get("abi") == binder.abi()
        binder_image = archive.read(entry["image"]) if usable else None
        runner_library = _image_file(runner_image, ".so") if runner_image is not None else None
        binder_library = _image_file(binder_image, ".so") if binder_image is not None else None
        if manifest["kind"] == "dynamic":
            return _load_dynamic(archive, manifest, target, runner_library, binder_library)
        modules = [
            _load_module(archive, part, target, runner_library, binder_library)
            for part in manifest["modules"]
        ]
    if manifest["kind"] == "module":
        return modules[0]
    program = Program.from_json(manifest["program"], [m.graph for m in modules])
    return CompiledProgram.of_modules(program, target, modules)


def _load_module(
    archive: zipfile.ZipFile,
    part: dict,
    target: Target,
    runner_library: Path | None,
    binder_library: Path | None,
) -> Module:
    graph, _ = _read_graph(archive, part)
    kernels = [_load_kernel(archive, k, target) for k in part["kernels"]]
    commands = [Command(int(k), tuple(args), int(n)) for k, args, n in part["commands"]]
    constants = graph.constant_arrays()
    plan = MemoryPlan.from_json(json.dumps(part["plan"]))
    report = tuple(_report_from_json(r) for r in part["report"])
    return Module(
        graph, target, kernels, commands, constants, plan, report, runner_library, binder_library
    )


# -- writing ----------------------------------------------------------------------------------


def _header(t: Target) -> dict[str, object]:
    import hexir

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
    }


def _module_entries(module: Module, prefix: str, entries: dict[str, bytes]) -> dict[str, object]:
    """Add `module`'s graph, constants and kernels to `entries` under `prefix`; its part of
    the manifest."""
    blobs = _graph_entries(module.graph, prefix, entries)
    kernels = [
        _kernel_entry(f"{prefix}kernels/{i}", kernel, module.target, entries)
        for i, kernel in enumerate(module.kernels)
    ]
    return {
        "graph": f"{prefix}graph.hexir",
        "name": module.graph.name,
        "kernels": kernels,
        "commands": [[c.kernel, list(c.args), c.num_outputs] for c in module.commands],
        "blobs": blobs,
        "plan": json.loads(module.plan.to_json()),
        "report": [_report_to_json(r) for r in module.report],
    }


def _runner_entry(
    modules: list[Module], target: Target, entries: dict[str, bytes]
) -> dict[str, str]:
    """Add the native command runner's source and image (hexir/runtime/native.py) to
    `entries`; its manifest entry."""
    from hexir.runtime.native import RUNNER_SOURCE, runner_library

    built = next((m.runner_library for m in modules if m.runner_library is not None), None)
    library = built or runner_library(target)  # the knob was off
    entries["runner/runner.c"] = RUNNER_SOURCE.encode()
    entries["runner/runner.so"] = library.read_bytes()
    return {"source": "runner/runner.c", "image": "runner/runner.so"}


def _kernel_entry(stem: str, kernel: object, target: Target, entries: dict[str, bytes]) -> dict:
    """Add a kernel's files to `entries`, named `stem` and their suffixes; its manifest
    entry."""
    entry: dict[str, object] = {"func": f"{stem}.hextir"}
    if target.kind == "cuda":
        from hexir.runtime.cuda_module import kernel_launch

        entry.update(source=f"{stem}.cu", image=f"{stem}.cubin")
        entry["launch"] = kernel_launch(kernel)  # type: ignore[arg-type]
        image = kernel.binary.cubin  # type: ignore[attr-defined]
    else:
        entry.update(source=f"{stem}.c", image=f"{stem}.so")
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
    if manifest.get("format") == FORMAT and manifest.get("format_version") == 2:
        raise ArtifactError(
            f"{path} is a hexir artifact of format 2, from before artifacts carried a program "
            f"(format {FORMAT_VERSION}: the VM's steps over one or more modules); its kernels "
            "cannot be read into this version: rebuild it from the model with this hexir "
            "(hexir build MODEL -o FILE, or hexir.compile(...).save(path))"
        )
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


def _read_graph(archive: zipfile.ZipFile, part: dict) -> tuple[Graph, dict[str, np.ndarray]]:
    """The graph a part of the manifest names (`graph`, its constants' `blobs`), and the
    blobs by constant name."""
    from hexir.ops.parse import parse_graph

    blobs = {name: _read_npy(archive, entry) for name, entry in part["blobs"].items()}
    return parse_graph(archive.read(part["graph"]).decode(), constants=blobs), blobs


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
