"""GPT-2 small prefill and decode on the CPU, Hexir beside ONNX Runtime, at the prompt and
cache lengths of the LLM-serving issue, in one run.

    python benchmarks/decode_cpu.py [--rounds 3] [--prompts 128,512] [--caches 128,1023]

The zoo's whole GPT-2 small (124M parameters, seeded random weights; hexir/frontend/
zoo_transformer.py): a prefill of each prompt length (token ids to logits and every layer's
presents) and one decode step after each cache length (one token's logits and the presents,
from every layer's past). Each is a static graph of its length, compiled with default
schedules, and ONNX Runtime (CPU provider, 2 intra-op threads, all graph optimizations) runs
Hexir's ONNX export of the same graph in a subprocess.

Hexir's serving path decodes over a paged KV cache instead (hexir/serve/generate.py): one
`gpt2_small_paged_decode` module per bucket of cache lengths, its keys and values read in
pages through a block table and nothing copied into presents. "paged" times that step on a
cache holding the same past (its logits are compared with the static module's: "paged
err"), and its "x ORT" is ONNX Runtime's static step over that time. Last, a
`hexir.generate` run of `--new` tokens after a prompt of the first `--prompts` length prints
its decode rate and the KV cache pages in use as the tokens arrive, and how many of its token
ids a float64 numpy GPT-2 with the same weights gives too (hexir/serve/reference.py).
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
from hexir.runtime.kv_cache import PagedKVCache
from hexir.serve.generate import Generator
from hexir.serve.reference import gpt2_weights, numpy_greedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", default="128,512")
    parser.add_argument("--caches", default="128,1023")  # GPT-2's positions: 0..1023
    parser.add_argument("--new", type=int, default=64, help="tokens the generation run makes")
    args = parser.parse_args()
    print(numpy_matmul_line())
    rows = []
    for length in map(int, args.prompts.split(",")):
        rows.append(("prefill", length, *_row(gpt2_small(seq=length), args.rounds), None, None))
    generator = Generator()
    for length in map(int, args.caches.split(",")):
        graph = gpt2_small_decode(past=length)
        ours, theirs, planned, error = _row(graph, args.rounds)
        paged, paged_error = _paged(generator, graph, args.rounds)
        rows.append(("decode", length, ours, theirs, planned, error, paged, paged_error))
    print(
        f"\nGPT-2 small, {THREADS} threads (ms, medians); x ORT = ONNX Runtime's time / Hexir's; "
        "decode: one token after `length` cached"
    )
    print(
        f"{'step':<8} {'length':>6} {'hexir':>9} {'onnxruntime':>12} {'x ORT':>6} "
        f"{'hexir tok/s':>12} {'ORT tok/s':>10} {'planned MB':>11} {'max rel err':>12} "
        f"{'paged':>9} {'x ORT':>6} {'tok/s':>7} {'paged err':>10}"
    )
    for step, length, ours, theirs, planned, error, paged, paged_error in rows:
        rate = step == "decode"
        line = (
            f"{step:<8} {length:>6} {ms(ours):>9} {ms(theirs):>12} {ratio(theirs, ours):>6} "
            f"{1 / ours if rate else 0:>12.1f} {1 / theirs if rate and theirs else 0:>10.1f} "
            f"{planned / 2**20:>11.1f} {error:>12.1e}"
        )
        if paged is not None:
            line += (
                f" {ms(paged):>9} {ratio(theirs, paged):>6} {1 / paged:>7.1f} {paged_error:>10.1e}"
            )
        print(line)
    _generation(generator, int(args.prompts.split(",")[0]), args.new)
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


def _paged(generator: Generator, graph: hexir.Graph, rounds: int) -> tuple[float, float]:
    """The paged decode step's median seconds on a cache holding the static graph's past, and
    the relative error of its logits against the static module's."""
    inputs = inputs_of(graph)
    ids, pasts = inputs[0], inputs[1:]
    length = pasts[0].shape[1]
    layers, (heads, _, head_dim) = len(pasts) // 2, pasts[0].shape
    pages = -(-(length + 1) // generator.page_size)
    width = generator.table_pages(length + 1)
    cache = PagedKVCache(
        layers=layers, heads=heads, head_dim=head_dim, pages=pages,
        page_size=generator.page_size, max_pages=width,
    )  # fmt: skip
    seq = cache.add()
    cache.extend(seq, np.stack(pasts[0::2]), np.stack(pasts[1::2]))
    feeds = [ids, np.array([length]), cache.block_table([seq]), cache.lengths([seq])]
    for layer in range(layers):
        feeds += [cache.keys[layer], cache.values[layer]]
    module = generator.decode_module(1, pages, width)
    seconds = statistics.median(time_module(module, feeds) for _ in range(rounds))
    want = hexir.compile(graph, "cpu").run(inputs)[0]
    return seconds, relative_error([module.run(feeds)[0]], [want])


def _generation(generator: Generator, prompt: int, new: int) -> None:
    ids = np.random.default_rng(0).integers(0, 1000, prompt).tolist()
    result = generator.generate([ids], new)
    pages = result.pages_in_use
    print(
        f"\nhexir.generate: {new} tokens after a prompt of {prompt}: prefill "
        f"{result.prefill_seconds * 1e3:.1f} ms, decode {result.decode_tokens_per_second:.1f} "
        f"tokens/s; KV pages in use ({generator.page_size} tokens each) after steps 1, "
        f"{len(pages) // 2} and {len(pages)}: {pages[0]}, {pages[len(pages) // 2 - 1]}, "
        f"{pages[-1]}"
    )
    want = numpy_greedy(ids, new, gpt2_weights(**generator.size), generator.size["heads"])
    same = sum(a == b for a, b in zip(result.tokens[0], want, strict=True))
    print(f"token ids equal to a float64 numpy GPT-2's (hexir/serve/reference.py): {same} of {new}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
