"""GPT-2 small prefill and decode on the CPU, Hexir beside ONNX Runtime, at the prompt and
cache lengths of the LLM-serving issue, in one run.

    python benchmarks/decode_cpu.py [--rounds 3] [--prompts 128,512] [--caches 128,1023]

The zoo's whole GPT-2 small (124M parameters, seeded random weights; hexir/frontend/
zoo_transformer.py): a prefill of each prompt length (token ids to logits and every layer's
presents) and one decode step after each cache length (one token's logits and the presents,
from every layer's past). Each is a static graph of its length, compiled with default
schedules, and ONNX Runtime (CPU provider, 2 intra-op threads, all graph optimizations) runs
Hexir's ONNX export of the same graph in a subprocess: this measures the kernels of a
serving loop, not the loop itself (Hexir has no symbolic lengths yet: one module a length).
Times are medians over `--rounds` rounds that alternate the two; decode is also given as
tokens per second; "planned MB" is the peak of Hexir's memory plan (intermediates; the
weights are 500 MB more). Outputs are compared. numpy's matmul 1024^3 is printed first and
last: quote a run only when both are at the machine's quiet level.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
from models_cpu import THREADS, inputs_of, ms, onnxruntime_run, ratio, relative_error, time_module
from quiet import numpy_matmul_line

import hexir
from hexir.frontend.zoo import gpt2_small, gpt2_small_decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", default="128,512")
    parser.add_argument("--caches", default="128,1023")  # GPT-2's positions: 0..1023
    args = parser.parse_args()
    print(numpy_matmul_line())
    rows = []
    for length in map(int, args.prompts.split(",")):
        rows.append(("prefill", length, *_row(gpt2_small(seq=length), args.rounds)))
    for length in map(int, args.caches.split(",")):
        rows.append(("decode", length, *_row(gpt2_small_decode(past=length), args.rounds)))
    print(
        f"\nGPT-2 small, {THREADS} threads (ms, medians); x ORT = ONNX Runtime's time / Hexir's; "
        "decode: one token after `length` cached"
    )
    print(
        f"{'step':<8} {'length':>6} {'hexir':>9} {'onnxruntime':>12} {'x ORT':>6} "
        f"{'hexir tok/s':>12} {'ORT tok/s':>10} {'planned MB':>11} {'max rel err':>12}"
    )
    for step, length, ours, theirs, planned, error in rows:
        rate = step == "decode"
        print(
            f"{step:<8} {length:>6} {ms(ours):>9} {ms(theirs):>12} {ratio(theirs, ours):>6} "
            f"{1 / ours if rate else 0:>12.1f} {1 / theirs if rate and theirs else 0:>10.1f} "
            f"{planned / 2**20:>11.1f} {error:>12.1e}"
        )
    print(numpy_matmul_line())


def _row(graph: hexir.Graph, rounds: int) -> tuple[float, float | None, int, float]:
    inputs = inputs_of(graph)
    module = hexir.compile(graph, "cpu")
    ours, theirs, peer = [], [], None
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            peer = onnxruntime_run(graph, inputs, Path(tmp))
        if peer:
            theirs.append(peer[0])
        ours.append(time_module(module, inputs))
    error = relative_error(module.run(inputs), peer[1]) if peer else float("nan")
    peer_s = statistics.median(theirs) if theirs else None
    return statistics.median(ours), peer_s, module.plan.peak_bytes, error


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
