"""The `hexir` command.

    hexir run matmul:M=1024,N=1024,K=1024     # compile on the CPU, check against numpy, time
    hexir show matmul:M=64,N=64,K=64          # print the unscheduled hextir
    hexir show resnet18 --kernels --memory    # a model's fused kernels and memory plan

Errors print as one paragraph and exit with status 1; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from hexir import knobs
from hexir.errors import HexirError


def parse_workload_spec(spec: str) -> tuple[str, dict[str, object]]:
    """`"matmul:M=1024,N=1024,K=1024"` → `("matmul", {"M": 1024, "N": 1024, "K": 1024})`."""
    name, _, rest = spec.partition(":")
    if not name.isidentifier():
        raise HexirError(f"{spec!r} is not a workload: expected NAME:KEY=VALUE,... ")
    params: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise HexirError(
                f"workload {spec!r}: {item!r} is not KEY=VALUE "
                "(write e.g. matmul:M=1024,N=1024,K=1024)"
            )
        params[key] = _parse_value(value)
    return name, params


def _parse_value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", ""):
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _load_workload(spec: str):
    import hexir

    name, params = parse_workload_spec(spec)
    return hexir.workload(name, **params)


def _random_inputs(func, rng: np.random.Generator) -> list[np.ndarray]:
    from hexir.ir.dtype import numpy_dtype

    arrays = []
    for buf in func.inputs:
        dtype = numpy_dtype(buf.dtype)
        if buf.dtype == "bool":
            arrays.append(rng.random(buf.shape) < 0.5)
        elif buf.dtype.startswith("int"):
            arrays.append(rng.integers(1, 10, size=buf.shape).astype(dtype))
        else:
            arrays.append(rng.uniform(0.5, 1.5, size=buf.shape).astype(dtype))
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    import hexir
    from hexir.ir.analysis import flop_count
    from hexir.ir.dtype import numpy_dtype

    func = _load_workload(args.workload)
    start = time.perf_counter()
    kernel = hexir.build(func, target=args.target)
    build_s = time.perf_counter() - start
    inputs = _random_inputs(func, np.random.default_rng(args.seed))
    outputs = [np.full(b.shape, np.nan, dtype=numpy_dtype(b.dtype)) for b in func.outputs]
    kernel(*inputs, *outputs)
    expected = hexir.reference(func, inputs)
    ok = all(np.allclose(o, e, rtol=1e-4, atol=1e-5) for o, e in zip(outputs, expected))
    with knobs.scope(timing_warmup=1, timing_repeats=args.repeats, timing_min_seconds=0.0):
        seconds = kernel.time(*inputs, *outputs)
    print(f"workload   {args.workload}")
    print(f"key        {hexir.workload_key(func)}")
    print(f"target     {args.target} ({hexir.Target(args.target).key})")
    print(f"build      {build_s:.2f} s")
    print(f"check      {'matches numpy' if ok else 'DIFFERS FROM NUMPY'}")
    print(f"time       {seconds * 1e3:.3f} ms (median)")
    flops = flop_count(func)
    if flops:
        print(f"speed      {flops / seconds / 1e9:.2f} GFLOP/s")
    return 0 if ok else 1


def cmd_show(args: argparse.Namespace) -> int:
    import hexir

    if ":" in args.what:
        func = _load_workload(args.what)
        print(func)
        print(f"// workload key {hexir.workload_key(func)}")
        return 0
    graph = hexir.load_model(args.what)
    if not (args.kernels or args.memory):
        print(graph)
    if args.kernels:
        _print_kernels(graph)
    if args.memory:
        from hexir.runtime.executor import plan_graph

        print(plan_graph(graph).summary())
    return 0


def _print_kernels(graph) -> None:
    """One line per fused kernel: its ops, output shape and workload key."""
    from hexir.graph.fusion import partition
    from hexir.graph.lower import lower
    from hexir.ir.keys import workload_key
    from hexir.runtime.executor import simplify

    groups = partition(simplify(graph))
    ops = sum(1 for op in graph.ops if op.kind != "constant")
    print(f"{len(groups)} kernels for {ops} ops (fusion {'on' if knobs.get().fusion else 'off'})")
    for n, group in enumerate(groups):
        kinds = "+".join(op.kind for op in group.ops)
        shape = "x".join(map(str, group.outputs[0].type.shape)) or "scalar"
        key = workload_key(lower(group.graph()))[:12]
        print(f"  {n:3d}  {kinds:<44} {shape:<16} {key}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hexir", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    verbs = parser.add_subparsers(dest="verb", required=True)

    run = verbs.add_parser("run", help="compile a workload, check it against numpy, time it")
    run.add_argument("workload", help="e.g. matmul:M=1024,N=1024,K=1024")
    run.add_argument("--target", default="cpu", help="target (default: cpu)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--repeats", type=int, default=3, help="timed calls (median reported)")
    run.set_defaults(handler=cmd_run)

    show = verbs.add_parser("show", help="print a workload's hextir, or a model's graph")
    show.add_argument(
        "what", help="a workload (matmul:M=64,N=64,K=64), a zoo model, a .hexir or .onnx file"
    )
    show.add_argument("--kernels", action="store_true", help="list the fused kernels")
    show.add_argument("--memory", action="store_true", help="print the memory plan")
    show.set_defaults(handler=cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except HexirError as error:
        if args.debug:
            raise
        print(f"hexir: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
