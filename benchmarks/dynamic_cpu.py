"""GPT-2 small's prefill over prompts of several lengths, compiled once
(`hexir.compile(graph, dynamic=True)`, a DynamicModule: kernels of symbolic extents, the
contractions per bucket) beside the per-bucket SymbolicModule (`hexir.compile(graph)`): the
first run at each length (what it compiles then, with an empty build cache) and the median
steady run.

    python benchmarks/dynamic_cpu.py [--lengths 17,30,128,200] [--layers 12] [--rounds 5]

Each module is made in its own process with a build cache of its own (a fresh temporary
folder), so neither reuses the other's kernels; the lengths run in the order given (30 after
17 shares 17's bucket, 32). Seeded random weights, the zoo's `gpt2_small(seq="seq")`; the
logits of the two modules are compared at every length. numpy's matmul 1024^3 is printed
beside (benchmarks/quiet.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from quiet import numpy_matmul_line

CHILD = """
import json, statistics, sys, time
import numpy as np
import hexir
from hexir.frontend.zoo_transformer import gpt2_small
dynamic, lengths, layers, rounds = {dynamic}, {lengths}, {layers}, {rounds}
graph = gpt2_small(seq="seq", layers=layers)
start = time.perf_counter()
module = hexir.compile(graph, dynamic=dynamic)
made = time.perf_counter() - start
rng = np.random.default_rng(0)
found = {{}}
for n in lengths:
    ids = rng.integers(0, 50257, n).astype(np.int64)
    start = time.perf_counter()
    logits = module.run([ids])[0]
    first = time.perf_counter() - start
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        module.run([ids])
        times.append(time.perf_counter() - start)
    np.save(sys.argv[1] + f"/{{n}}.npy", logits)
    found[n] = (first, statistics.median(times))
print(json.dumps({{"made": made, "runs": found}}))
"""


def run_child(dynamic: bool, lengths: list[int], layers: int, rounds: int, out: str) -> dict:
    code = CHILD.format(dynamic=dynamic, lengths=lengths, layers=layers, rounds=rounds)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "HEXIR_CACHE_DIR": cache}
        done = subprocess.run(
            [sys.executable, "-c", code, out], env=env, capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="17,30,128,200")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    import numpy as np

    print(numpy_matmul_line())
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        bucketed = run_child(False, lengths, args.layers, args.rounds, a)
        dynamic = run_child(True, lengths, args.layers, args.rounds, b)
        print(f"gpt2-small ({args.layers} layers) prefill; ms; first run includes its compile")
        print(f"made in: buckets {bucketed['made']:.2f} s, dynamic {dynamic['made']:.2f} s")
        print(f"{'tokens':>6} | {'buckets first':>13} {'steady':>8} | {'dynamic first':>13} "
              f"{'steady':>8} | dynamic x buckets | max |logits diff|")  # fmt: skip
        for n in lengths:
            bf, bs = bucketed["runs"][str(n)]
            df, ds = dynamic["runs"][str(n)]
            diff = float(np.abs(np.load(f"{a}/{n}.npy") - np.load(f"{b}/{n}.npy")).max())
            print(
                f"{n:>6} | {bf * 1e3:>13.0f} {bs * 1e3:>8.2f} | {df * 1e3:>13.0f} "
                f"{ds * 1e3:>8.2f} | {bs / ds:>17.2f} | {diff:.2e}"
            )


if __name__ == "__main__":
    main()
