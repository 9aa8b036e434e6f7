"""`hexir quantize MODEL -o OUT.hexir`: a model's linear layers in 8-bit integers
(`hexir.quantize`), written as a .hexir file (and the .npz of its constants), with a report of
its error against the float32 model on held-out inputs."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hexir.cli.common import MODEL_HELP, add_dim_argument, load_graph
from hexir.cli.run import read_inputs
from hexir.errors import HexirError
from hexir.ir.dtype import random_array
from hexir.ir.graph import Graph


def add_parser(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "quantize",
        parents=[parent],
        help="a model's linear layers in int8 (weights per column; activations per run or "
        "calibrated), int4 (weights only) or bfloat16, as a .hexir file",
        description="Quantize every matmul and dense of a float32 activation by a constant "
        "weight: the weight to int8 (symmetric, one scale per output column, computed now: "
        "no data needed), the activation to uint8 at every run from its own range, or, with "
        "--activations int8 --calibrate FILE, from the range it takes on calibration inputs. "
        "Writes OUT (.hexir) and its constants (.npz) and prints the error against the "
        "float32 model on held-out random inputs. --weights bfloat16 casts both operands to "
        "bfloat16 instead (no scales; AVX512_BF16 where the CPU has it); --weights int4 "
        "quantizes the weights only, to int4 packed two a byte with a scale per 32 rows of a "
        "column (the activations stay float32).",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT.hexir",
        help="default: MODEL-int8.hexir (MODEL-int4.hexir, MODEL-bfloat16.hexir)",
    )
    p.add_argument(
        "--weights", default="int8", metavar="TYPE",
        help="int8 (the default), int4 (weight-only, a scale per 32 rows) or bfloat16 (bf16: "
        "activations cast at every run)",
    )  # fmt: skip
    p.add_argument(
        "--activations", default="dynamic", choices=("dynamic", "int8"),
        help="dynamic: quantized at every run from their own range (the default); int8: "
        "fixed scales from --calibrate",
    )  # fmt: skip
    p.add_argument(
        "--calibrate", metavar="FILE.npz",
        help="calibration inputs by input name, each one input set or a stack of them "
        "(a leading axis of sets)",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the held-out random inputs of the report"
    )
    add_dim_argument(p)
    p.set_defaults(handler=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    import hexir
    from hexir.frontend.quantize import quantization_error

    subject = load_graph(args.model, "quantize", args.dim)
    graph = subject.model
    if args.weights == "int4" and args.activations != "dynamic":
        raise HexirError(
            "--weights int4 quantizes the weights only: the activations stay float32 (leave "
            "out --activations and --calibrate)"
        )
    if args.calibrate and args.activations != "int8":
        raise HexirError(
            "--calibrate fixes the activations' scales: give it with --activations int8 "
            "(without it, activations are quantized at every run and need no data)"
        )
    calibration = _calibration(graph, args.calibrate) if args.calibrate else []
    activations = "static" if args.activations == "int8" else "dynamic"
    quantized, layers = hexir.quantize(graph, args.weights, activations, calibration)
    if not layers:
        raise HexirError(
            f"{args.model} has no linear layer to quantize (a matmul or dense of a float32 "
            "activation by a constant 2-D float32 weight of at least 4096 elements)"
        )
    kind = "bfloat16" if args.weights in ("bf16", "bfloat16") else args.weights
    output = Path(args.output or f"{subject.stem}-{kind}.hexir")
    hexir.save_model(quantized, output)
    rng = np.random.default_rng(args.seed)
    held_out = [random_array(v.type.shape, v.type.dtype, rng) for v in graph.inputs]
    errors = quantization_error(graph, quantized, held_out)
    before = sum(4 * n * k for n, k in (layer.shape for layer in layers))
    after = before * {"bfloat16": 1 / 2, "int4": 1 / 8 + 1 / 32}.get(kind, 1 / 4)
    source = f"from calibration ({len(calibration)} sets)" if calibration else "at every run"
    source = "float32 (weight-only)" if kind == "int4" else source
    print(
        f"wrote {output} (and {output.with_suffix('.npz').name}): {len(layers)} linear layers "
        f"in {kind}, weights {before / 2**20:.2f} -> {after / 2**20:.2f} MiB; activations "
        f"{source}"
    )
    worst = max(layers, key=lambda layer: layer.weight_error)
    print(f"largest weight rounding error: {worst.weight_error:.2e} of its layer's largest |w|")
    for value, error in zip(graph.outputs, errors, strict=True):
        print(
            f"output %{value.name}: largest |{kind} - float32| = {error:.2e} of the largest "
            f"|float32| (held-out random inputs, seed {args.seed})"
        )
    return 0


def _calibration(graph: Graph, path: str) -> list[list[np.ndarray]]:
    """Input sets from an .npz: per input, one set (its shape) or a stack of them."""
    arrays = read_inputs(path, [v.name for v in graph.inputs])
    counts = set()
    for value, array in zip(graph.inputs, arrays, strict=True):
        shape = value.type.shape
        if array.shape == shape:
            counts.add(1)
        elif array.shape[1:] == shape:
            counts.add(array.shape[0])
        else:
            raise HexirError(
                f"{path}: input {value.name!r} has shape {array.shape}; the model takes "
                f"{shape}, or a stack of such sets ({('S', *shape)})"
            )
    if len(counts) != 1:
        raise HexirError(f"{path}: the inputs hold different numbers of sets ({sorted(counts)})")
    (sets,) = counts
    stacks = [
        a if a.shape != v.type.shape else a[None] for a, v in zip(arrays, graph.inputs, strict=True)
    ]
    return [[stack[s] for stack in stacks] for s in range(sets)]
