"""`hexir run FILE|MODEL|WORKLOAD`: run an artifact, a model or one workload's kernel.

    hexir run resnet18.hxa --bench            # the artifact `hexir build` wrote, timed end to end
    hexir run resnet18 --db URL --bench       # compiled here with the database's best schedules
    hexir run resnet18 --profile              # per command: time, share, GFLOP/s, of peak
    hexir run resnet18 --db URL --compare-default   # per command: tuned against default
    hexir run matmul:M=1024,N=1024,K=1024     # one kernel, checked against numpy and timed

Inputs are random (seeded, never zeros) or read from an .npz file by input name.
"""

from __future__ import annotations

import argparse
import statistics
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hexir import knobs
from hexir.cli.common import (
    add_dim_argument,
    is_workload_spec,
    load_graph,
    load_workload,
    ms,
    positive_int,
    require_database,
    resolve_target,
)
from hexir.errors import HexirError
from hexir.ir.dtype import random_array

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.ir.graph import Graph
    from hexir.ir.tir import PrimFunc
    from hexir.runtime.module import Module
    from hexir.runtime.target import Target


def add_parser(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "run",
        parents=[parent],
        help="run an artifact, a model or a workload, on random or given inputs",
        description="Run an artifact written by `hexir build`, a model (compiled here, with "
        "the database's best schedules when --db is given, else default schedules), or one "
        "workload's kernel (checked against numpy and timed). Prints each output's shape "
        "and a summary of its values.",
    )
    p.add_argument(
        "what", metavar="FILE|MODEL",
        help="an artifact (.hxa), a zoo model, a .hexir or .onnx file, or a workload such as "
        "matmul:M=1024,N=1024,K=1024",
    )  # fmt: skip
    p.add_argument(
        "--target", metavar="TARGET",
        help="a model: default cuda when a GPU is usable, else cpu; a workload: default cpu "
        "(an artifact carries its own)",
    )  # fmt: skip
    p.add_argument(
        "--db", metavar="URL",
        help="use the database's best schedules (default: none, i.e. default schedules for a "
        "model, the unscheduled kernel for a workload)",
    )  # fmt: skip
    p.add_argument(
        "--inputs", metavar="FILE.npz",
        help="inputs by name (or arr_0, arr_1, ... in order); default: random, seeded",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--bench", action="store_true", help="time end to end: median of repeats")
    p.add_argument(
        "--profile", action="store_true",
        help="a model or an artifact: time every command in place, inside real runs, and print "
        "a table, slowest first: kernel, the ops it fuses, output shape, median ms, share, "
        "GFLOP/s, fraction of the target's peak, tuned or default schedule; then the sum of "
        "the commands against the end-to-end time of the same sitting",
    )  # fmt: skip
    p.add_argument(
        "--compare-default", action="store_true",
        help="a model with --db: run its build with the database's schedules and its build "
        "with default schedules in turn, and print per command the default and tuned medians, "
        "the median of the paired runs' ratios and the time saved, most saved first; then the "
        "end-to-end speedup, paired the same way. Where the database gives some convs their "
        "other form (Winograd or direct), the two builds pair end to end only, and a third, "
        "default schedules in the tuned build's forms, pairs command by command",
    )  # fmt: skip
    p.add_argument(
        "--repeats", type=positive_int, metavar="N",
        help="timed runs (default: 10 with --bench or --profile; 3 for a workload)",
    )  # fmt: skip
    p.add_argument(
        "--check", action="store_true", help="compare a model's outputs with numpy's evaluation"
    )
    add_dim_argument(p)
    p.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    _check_flags(args)
    if is_workload_spec(args.what):
        return _run_workload(args)
    from hexir.runtime.dynamic_module import DynamicModule
    from hexir.runtime.symbolic_module import SymbolicModule

    module = _module(args)
    if isinstance(module, DynamicModule):  # an artifact compiled once for every size
        return _run_dynamic(module, args)
    if isinstance(module, SymbolicModule):  # sizes neither given by --dim nor by --inputs
        dims = " ".join(f"--dim {s}=SIZE" for s in module.symbols)
        raise HexirError(
            f"{args.what} has symbolic dims ({', '.join(module.symbols)}): give the sizes to run "
            f"at ({dims}) or the inputs (--inputs FILE.npz), or build it for every size "
            f"(hexir build {args.what} --dynamic)"
        )
    inputs = _graph_inputs(module.graph, args)
    outputs = module.run(inputs)
    tuned = sum(r.schedule == "tuned" for r in module.report)
    line = (
        f"kernels    {len(module.kernels)} for {len(module.commands)} commands; schedules: "
        f"{tuned} tuned, {len(module.report) - tuned} default"
    )
    ok = _report_run(module, args, line, inputs, outputs, module.graph)
    if args.profile:
        print()
        print(module.profile(inputs, repeats=args.repeats or 10))
    if args.compare_default:
        from hexir.runtime.profile import compare

        print()
        default = _compiled(args, database=None)
        comparison = compare(default, module, inputs, repeats=args.repeats or 10)
        print(comparison)
        if comparison.forms_differ:  # the schedules' part, command by command
            print()
            print("the default schedules in the forms the tuned build takes:")
            in_forms = _compiled(args, database=None, forms_of=require_database(args.db))
            print(compare(in_forms, module, inputs, repeats=args.repeats or 10))
    return 0 if ok else 1


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that do not go together, before anything is compiled."""
    if args.profile and is_workload_spec(args.what):
        raise HexirError(
            f"--profile times the commands of a whole model, and {args.what!r} is a single "
            f"workload, one kernel: `hexir run {args.what}` already times it (add --repeats N), "
            "or profile a model (a zoo name, a .hexir or .onnx file, or an .hxa artifact)."
        )
    if args.compare_default:
        _check_compare(args)
    if args.profile and args.bench:
        raise HexirError(
            "--profile and --bench both time the model end to end: the profile's last lines "
            "give the end-to-end median of plain runs (what --bench prints) beside the sum of "
            "the commands; drop --bench."
        )


def _check_compare(args: argparse.Namespace) -> None:
    """--compare-default runs a model's two builds: refuse what has no two builds."""
    if is_workload_spec(args.what):
        raise HexirError(
            f"--compare-default runs a model's two builds, and {args.what!r} is a single "
            f"workload: `hexir run {args.what} --db URL` times its best kernel, or tune and "
            "time it beside numpy with benchmarks/tune_cpu.py"
        )
    if _is_artifact(Path(args.what)):
        raise HexirError(
            f"{args.what} is an artifact, built once with the schedules chosen then: compare "
            "the model it was built from (hexir run MODEL --db URL --compare-default)"
        )
    if args.db is None:
        raise HexirError(
            "--compare-default runs the build with the database's schedules beside the one "
            "with default schedules: give the database (--db URL)"
        )
    if args.profile or args.bench:
        flag = "--profile" if args.profile else "--bench"
        raise HexirError(
            f"--compare-default times both builds, command by command and end to end; "
            f"{flag} times one: drop one of the two flags"
        )


def _is_artifact(path: Path) -> bool:
    return path.suffix == ".hxa" or (path.is_file() and zipfile.is_zipfile(path))


def _module(args: argparse.Namespace) -> Module:
    path = Path(args.what)
    if _is_artifact(path):
        if args.target is not None or args.db is not None:
            raise HexirError(
                f"{path} is an artifact: it holds its kernels, built for its own target with "
                "the schedules chosen when it was built; drop --target and --db, or run the "
                "model (not the artifact) to compile it again"
            )
        import hexir.runtime
        from hexir.runtime.dynamic_module import DynamicModule
        from hexir.runtime.module import Module

        loaded = hexir.runtime.load(path)
        if isinstance(loaded, DynamicModule):
            return loaded  # type: ignore[return-value]
        if not isinstance(loaded, Module):
            count = len(loaded.modules())
            raise HexirError(
                f"{path} holds a program (steps over {count} module{'s' * (count != 1)}, with "
                "branches, loops or builtins), which takes named inputs the command line does "
                "not know how to make: run it from Python, "
                "hexir.runtime.load(path).run({name: array, ...})"
            )
        return loaded
    return _compiled(args, database=require_database(args.db) if args.db else None)


def _compiled(
    args: argparse.Namespace, database: Database | None, forms_of: Database | None = None
) -> Module:
    """The model compiled for --target with `database`'s schedules (None: default ones), its
    convs in the forms a build with `forms_of` takes (hexir/graph/forms.py) where given."""
    import hexir
    from hexir.graph.forms import measured_forms

    target = resolve_target(args.target)
    subject = load_graph(args.what, "run", args.dim, _input_shapes(args))
    forms = None if forms_of is None else measured_forms(subject.model, target, forms_of)
    return hexir.compile(subject.model, target, database=database, forms=forms)


def _run_dynamic(module, args: argparse.Namespace) -> int:  # noqa: ANN001
    """An artifact `hexir build --dynamic` wrote: run at the sizes --dim gives its symbols
    (or the --inputs' shapes give them)."""
    from hexir.graph.specialize import specialize
    from hexir.ir.symbolic import shape_at

    if args.profile:
        raise HexirError(
            f"{args.what} is compiled once for every size of {', '.join(module.symbols)}; "
            "--profile times a module of fixed sizes: use --bench, or build and profile the "
            "model at its sizes (hexir run MODEL --dim NAME=SIZE --profile)"
        )
    sizes = dict(args.dim)
    if args.inputs is None:
        missing = [s for s in module.symbols if s not in sizes]
        if missing:
            dims = " ".join(f"--dim {s}=SIZE" for s in missing)
            raise HexirError(
                f"{args.what} runs at any size of {', '.join(module.symbols)}: give the "
                f"sizes to run at ({dims}), or the inputs (--inputs FILE.npz)"
            )
        rng = np.random.default_rng(args.seed)
        inputs = [
            random_array(shape_at(v.type.shape, sizes), v.type.dtype, rng)
            for v in module.graph.inputs
        ]
    else:
        inputs = read_inputs(args.inputs, [v.name for v in module.graph.inputs])
    outputs = module.run(inputs)
    from hexir.graph.evaluate import input_sizes

    sizes = input_sizes(module.graph, inputs)
    counts = {how: sum(s.how == how for s in module.steps) for how in ("kernel", "buckets")}
    line = (
        f"dynamic    {counts['kernel']} kernels compiled once, {counts['buckets']} contraction "
        f"groups per bucket; run at {', '.join(f'{k} = {v}' for k, v in sorted(sizes.items()))}"
    )
    ok = _report_run(module, args, line, inputs, outputs, specialize(module.graph, sizes))
    return 0 if ok else 1


def _report_run(
    module,  # noqa: ANN001 - a Module or a DynamicModule
    args: argparse.Namespace,
    line: str,
    inputs: list[np.ndarray],
    outputs: list[np.ndarray],
    reference: Graph,
) -> bool:
    """Print a run: the model, its target, `line` (how it is compiled), the inputs and each
    output; with --check, against numpy's evaluation of `reference`; with --bench, timed.
    Whether the check passed (True without one)."""
    print(f"model      {module.graph.name} ({args.what})")
    print(f"target     {module.target} ({module.target.key})")
    print(line)
    print(f"inputs     {args.inputs or f'random, seed {args.seed}'}")
    for value, array in zip(module.graph.outputs, outputs, strict=True):
        print(f"output     {value.name}  {summary(array)}")
    ok = _check(reference, inputs, outputs) if args.check else True
    if args.bench:
        seconds = bench(module, inputs, args.repeats or 10)
        print(f"bench      {seconds * 1e3:.3f} ms end to end (median of {args.repeats or 10})")
    return ok


def _input_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]] | None:
    """An .onnx or .hexir model run on --inputs: each input's shape, from its array; they
    size the model's symbolic dims (hexir.frontend.load)."""
    path = Path(args.what)
    suffix = path.suffix.lower()
    if args.inputs is None or suffix not in (".onnx", ".hexir") or not path.is_file():
        return None
    if suffix == ".hexir":
        import hexir

        names = [v.name for v in hexir.load_model(path).inputs]
    else:
        from hexir.frontend.onnx_import import input_names

        names = input_names(path)
    return {n: a.shape for n, a in zip(names, read_inputs(args.inputs, names), strict=True)}


def _graph_inputs(graph: Graph, args: argparse.Namespace) -> list[np.ndarray]:
    if args.inputs is None:
        rng = np.random.default_rng(args.seed)
        return [random_array(v.type.shape, v.type.dtype, rng) for v in graph.inputs]
    return read_inputs(args.inputs, [v.name for v in graph.inputs])


def read_inputs(path: str, names: list[str]) -> list[np.ndarray]:
    """The arrays named `names` in an .npz file (or arr_0, arr_1, ... in order)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            found = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise HexirError(f"cannot read inputs from {path}: {e}; pass an .npz file") from e
    arrays = []
    for i, name in enumerate(names):
        array = found.get(name, found.get(f"arr_{i}"))
        if array is None:
            raise HexirError(
                f"{path} has no input {name!r} (it holds {', '.join(found) or 'nothing'}); "
                f"save the inputs by name: np.savez(path, {', '.join(f'{n}=...' for n in names)})"
            )
        arrays.append(array)
    return arrays


def summary(array: np.ndarray) -> str:
    """Shape, dtype and a few statistics of an output."""
    shape = "x".join(map(str, array.shape)) or "scalar"
    head = f"{shape} {array.dtype}"
    if array.size == 0 or array.dtype == bool:
        return head
    values = array.astype(np.float64)
    return (
        f"{head}  mean {values.mean():.6g}  std {values.std():.6g}  min {values.min():.6g}  "
        f"max {values.max():.6g}"
    )


def _check(graph: Graph, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> bool:
    from hexir.graph.evaluate import evaluate

    expected = evaluate(graph, inputs)
    ok = all(
        np.allclose(o, e, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(e).max(initial=0))))
        for o, e in zip(outputs, expected, strict=True)
    )
    print(f"check      {'matches numpy' if ok else 'DIFFERS FROM NUMPY'}")
    return ok


def bench(module: Module, inputs: list[np.ndarray], repeats: int, warmup: int = 2) -> float:
    """Median seconds of one end-to-end `module.run`."""
    from hexir.runtime.profile import run_seconds

    for _ in range(warmup):
        module.run(inputs)
    return statistics.median(run_seconds(module, inputs) for _ in range(repeats))


def _run_workload(args: argparse.Namespace) -> int:
    import hexir
    from hexir.ir.analysis import flop_count
    from hexir.ir.dtype import numpy_dtype

    func = load_workload(args.what)
    target = resolve_target(args.target or "cpu")
    scheduled, how = _workload_schedule(func, target, args.db)
    start = time.perf_counter()
    kernel = hexir.build(scheduled, target=target)
    build_s = time.perf_counter() - start
    if args.inputs is not None:
        inputs = read_inputs(args.inputs, [b.name for b in func.inputs])
    else:
        rng = np.random.default_rng(args.seed)
        inputs = [random_array(b.shape, b.dtype, rng) for b in func.inputs]
    outputs = [np.full(b.shape, np.nan, dtype=numpy_dtype(b.dtype)) for b in func.outputs]
    kernel(*inputs, *outputs)
    expected = hexir.reference(func, inputs)
    ok = all(
        np.allclose(o, e, rtol=1e-4, atol=1e-5) for o, e in zip(outputs, expected, strict=True)
    )
    with knobs.scope(timing_warmup=1, timing_repeats=args.repeats or 3, timing_min_seconds=0.0):
        seconds = kernel.time(*inputs, *outputs)
    print(f"workload   {args.what}")
    print(f"key        {hexir.workload_key(func)}")
    print(f"target     {target} ({target.key})")
    print(f"schedule   {how}")
    print(f"build      {build_s:.2f} s")
    print(f"check      {'matches numpy' if ok else 'DIFFERS FROM NUMPY'}")
    print(f"time       {seconds * 1e3:.3f} ms (median)")
    flops = flop_count(func)
    if flops:
        print(f"speed      {flops / seconds / 1e9:.2f} GFLOP/s")
    return 0 if ok else 1


def _workload_schedule(func: PrimFunc, target: Target, url: str | None) -> tuple[PrimFunc, str]:
    """The database's best schedule of `func` when `url` is given and has one, else `func`."""
    if url is None:
        return func, "unscheduled"
    import hexir

    db = require_database(url)
    for record in db.best(hexir.workload_key(func), target, k=1):
        try:
            sch = record.load_trace().apply(func, target=target)
        except HexirError:
            continue
        return sch.func, f"tuned (the database's best, measured {ms(record.median)} ms)"
    return func, f"unscheduled (no valid record in {db.shown} for {target.key})"
