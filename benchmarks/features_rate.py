"""How many candidates per second the cost model's feature extractor reads, on one core.

    python benchmarks/features_rate.py [--n 200] [--rounds 3] [--seed 0]

For each workload, --n schedules sampled from the CPU search space go through
`hexir.costmodel.features.extract` (no cache) --rounds times; the table shows the best
round's rate beside the bar of 1,000 candidates per second (the rate the search needs to
score a population of thousands each generation without waiting on it).
"""

from __future__ import annotations

import argparse
import random
import time

import hexir
from hexir.cli import parse_workload_spec
from hexir.costmodel.features import extract
from hexir.runtime.target import Target
from hexir.search.space import SearchSpace

WORKLOADS = (
    "matmul:M=512,N=512,K=512",
    "dense:M=256,N=512,K=512,bias=true,activation=relu",
    "conv2d:N=1,C=32,H=28,W=28,K=32,R=3,S=3,padding=1",
    "softmax:M=256,N=1024",
)
BAR = 1000.0


def sampled(spec: str, n: int, seed: int) -> list[hexir.PrimFunc]:
    name, params = parse_workload_spec(spec)
    func = hexir.workload(name, **params)
    schedules = SearchSpace().sample_schedules(func, "cpu", random.Random(seed), n)
    return [s.func for s in schedules]


def best_rate(funcs: list[hexir.PrimFunc], target: Target, rounds: int) -> float:
    """Candidates per second in the best of `rounds` passes (the machine may be shared)."""
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for func in funcs:
            extract(func, target)
        best = max(best, len(funcs) / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    target = Target("cpu")
    print(f"{'workload':52} {'n':>5} {'cand/s':>9} {'x bar':>6}")
    for spec in WORKLOADS:
        funcs = sampled(spec, args.n, args.seed)
        rate = best_rate(funcs, target, args.rounds)
        print(f"{spec:52} {len(funcs):>5} {rate:>9.0f} {rate / BAR:>6.2f}")
    print(f"bar: {BAR:.0f} candidates/s on one core")


if __name__ == "__main__":
    main()
