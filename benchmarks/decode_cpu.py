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
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from models_cpu import (
    THREADS,
    inputs_of,
    ms,
    onnxruntime_info,
    ratio,
    relative_error,
    save_feed,
    time_module,
)
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
    print(
        "\nmemory (MiB, each in a process of its own): resident after the runs / peak; ONNX "
        "Runtime's static decode step, Hexir's paged one"
    )
    for length in map(int, args.caches.split(",")):
        ort = MEMORY.get(("gpt2-small-decode", length), {})
        ours = _hexir_memory(length)
        print(
            f"decode {length:>6}: onnxruntime {ort.get('VmRSS', 0):.0f} / "
            f"{ort.get('VmHWM', 0):.0f}, hexir paged {ours['VmRSS']:.0f} / {ours['VmHWM']:.0f}"
        )
    _generation(generator, int(args.prompts.split(",")[0]), args.new)
    print(numpy_matmul_line())


def _row(graph: hexir.Graph, rounds: int) -> tuple[float, float | None, int, float]:
    inputs = inputs_of(graph)
    module = hexir.compile(graph, "cpu")
    ours, theirs, peer = [], [], None
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            hexir.export_onnx(graph, Path(tmp) / "model.onnx")
            save_feed(graph, inputs, Path(tmp) / "inputs.npz")
            peer = onnxruntime_info(Path(tmp) / "model.onnx", Path(tmp) / "inputs.npz", Path(tmp))
        theirs.append(peer[0]["seconds"])
        ours.append(time_module(module, inputs))
    MEMORY[graph.name, inputs[1].shape[1] if len(inputs) > 1 else len(inputs[0])] = peer[0]
    error = relative_error(module.run(inputs), peer[1])
    return statistics.median(ours), statistics.median(theirs), module.plan.peak_bytes, error


# ONNX Runtime's memory report (MiB) per (graph, length), from its last round.
MEMORY: dict[tuple[str, int], dict] = {}

HEXIR_CHILD = """
import json, sys
import numpy as np
from decode_cpu import paged_step
from hexir.serve.generate import Generator
length = int(sys.argv[1])
rng = np.random.default_rng(0)
pasts = [rng.uniform(-1, 1, (12, length, 64)).astype("float32") for _ in range(24)]
module, feeds = paged_step(Generator(), np.array([5]), pasts)
for _ in range(10):
    module.run(feeds)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}))
"""


def _hexir_memory(length: int) -> dict:
    """Resident MiB after 10 paged decode steps after `length` tokens, and at the peak, in a
    process of its own (the peak includes drawing and laying out the weights)."""
    done = subprocess.run(
        [sys.executable, "-c", HEXIR_CHILD, str(length)],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parent,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def paged_step(generator: Generator, ids: np.ndarray, pasts: list[np.ndarray]) -> tuple:
    """The paged decode module and its feeds for one token `ids` after a cache holding
    `pasts` (each layer's key and value, [heads, length, head_dim])."""
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
    return generator.decode_module(1, pages, width), feeds


def _paged(generator: Generator, graph: hexir.Graph, rounds: int) -> tuple[float, float]:
    """The paged decode step's median seconds on a cache holding the static graph's past, and
    the relative error of its logits against the static module's."""
    inputs = inputs_of(graph)
    module, feeds = paged_step(generator, inputs[0], inputs[1:])
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
