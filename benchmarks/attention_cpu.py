"""Causal attention on the CPU, one kernel against three: Hexir's `attention` op (hexir/ops/
attention.py, its CPU schedule in hexir/schedule/handwritten_attention.py) beside the same
attention as batch_matmul, scale, mask, softmax and batch_matmul (the way the zoo's GPT-2 and
ONNX exports write it; compiled with HEXIR_FUSE_ATTENTION off), beside what `hexir.compile`
makes of those parts (attention ops over blocks of queries, each reading only the keys they
see: hexir/graph/attention.py) and beside ONNX Runtime running Hexir's ONNX export of the
parts, in one run.

    python benchmarks/attention_cpu.py [--rounds 3] [--lengths 256,512,1024,2048]

Per length L: 12 heads, L queries against L keys, 64 wide, causal (GPT-2's -1e9 mask above
the diagonal), fresh random inputs. Times are medians over `--rounds` rounds that alternate
the four, each a median of repeats for about a second; "scores MB" is what the three-kernel
form writes for the scores and the probabilities (the one kernel and the blocks write
none). Outputs are checked against each other. numpy's matmul 1024^3 is printed first and
last: quote a run only when both are at the machine's quiet level.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
from models_cpu import THREADS, ms, onnxruntime_file, ratio, time_module
from quiet import numpy_matmul_line

import hexir
from hexir import knobs
from hexir.ir.graph import Graph
from hexir.ops.builder import GraphBuilder

HEADS, WIDTH = 12, 64


def parts(length: int) -> Graph:
    """softmax(q·kt/8 + mask)·v with a constant causal mask: the three-kernel form."""
    b = GraphBuilder(f"attention_parts_{length}")
    q, kt, v = _inputs(b, length)
    mask = np.triu(np.full((length, length), -1e9, np.float32), k=1)
    scores = b.mul(b.batch_matmul(q, kt), b.constant(np.array(0.125, np.float32)))
    probs = b.softmax(b.add(scores, b.constant(mask)), axis=2)
    return b.build([b.batch_matmul(probs, v, name="out")])


def fused(length: int) -> Graph:
    b = GraphBuilder(f"attention_{length}")
    q, kt, v = _inputs(b, length)
    return b.build([b.op("attention", q, kt, v, scale=0.125, causal=True, name="out")])


def _inputs(b: GraphBuilder, length: int):
    return (
        b.input("q", (HEADS, length, WIDTH)),
        b.input("kt", (HEADS, WIDTH, length)),
        b.input("v", (HEADS, length, WIDTH)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", default="256,512,1024,2048")
    args = parser.parse_args()
    print(numpy_matmul_line())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for length in map(int, args.lengths.split(",")):
            rows.append(_row(length, args.rounds, Path(tmp)))
    print(
        f"\ncausal attention, {HEADS} heads x {WIDTH} wide, {THREADS} threads (ms, medians); "
        "x = the other's time / the faster of one kernel and blocks"
    )
    print(
        f"{'length':>6} {'one kernel':>11} {'blocks':>9} {'three':>9} {'onnxruntime':>12} "
        f"{'x three':>8} {'x ORT':>6} {'scores MB':>10} {'max diff':>9}"
    )
    for length, one, blocks, three, peer, diff in rows:
        megabytes = 2 * HEADS * length * length * 4 / 1e6
        best = min(one, blocks)
        print(
            f"{length:>6} {ms(one):>11} {ms(blocks):>9} {ms(three):>9} {ms(peer):>12} "
            f"{ratio(three, best):>8} {ratio(peer, best):>6} {megabytes:>10.0f} {diff:>9.1e}"
        )
    print(numpy_matmul_line())


def _row(length: int, rounds: int, folder: Path) -> tuple[int, float, float, float, float, float]:
    rng = np.random.default_rng(length)
    graph = parts(length)
    inputs = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    one = hexir.compile(fused(length), "cpu")
    blocks = hexir.compile(graph, "cpu")
    with knobs.scope(fuse_attention=False):
        three = hexir.compile(graph, "cpu")
    model, feed = folder / f"{graph.name}.onnx", folder / f"{graph.name}.npz"
    hexir.export_onnx(graph, model)
    np.savez(feed, **{v.name: a for v, a in zip(graph.inputs, inputs, strict=True)})
    times: dict[str, list[float]] = {"one": [], "blocks": [], "three": [], "ort": []}
    for _ in range(rounds):
        times["one"].append(time_module(one, inputs))
        times["blocks"].append(time_module(blocks, inputs))
        times["three"].append(time_module(three, inputs))
        seconds, peer_out, _ = onnxruntime_file(model, feed, folder)
        times["ort"].append(seconds)
    got, want = one.run(inputs)[0], three.run(inputs)[0]
    diff = float(max(np.abs(got - want).max(), np.abs(got - peer_out[0]).max()))
    diff = max(diff, float(np.abs(blocks.run(inputs)[0] - want).max()))
    return length, *(statistics.median(times[k]) for k in ("one", "blocks", "three", "ort")), diff


if __name__ == "__main__":
    main()
