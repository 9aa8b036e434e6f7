"""Measure randomly sampled schedules of one workload on the CPU into a tuning database, and
print the distribution: best, median and worst GFLOP/s, errors by kind, the best against numpy.

    python benchmarks/measure_random.py --workload matmul:M=1024,N=1024,K=1024 --n 150 \
        [--db sqlite:///tuning_logs/hexir.db] [--seed 0] [--batch 16]

Schedules come from the search space (hexir/search/space.py); each is built in parallel and
measured one at a time (hexir/search/measure.py), checked against the unscheduled kernel, and
committed to the database as soon as it is measured (a killed run keeps what it measured). A
candidate the database already holds is not measured again: its record is counted. numpy is
timed in subprocesses, as the environment has it and with OpenBLAS's AVX-512 kernels
(PERFORMANCE.md): `A @ B` in float32 for matmul and batch_matmul, `hexir.reference`'s float64
evaluation otherwise. The cost-model issue trains on such databases.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter

import hexir
from hexir import knobs
from hexir.cli import parse_workload_spec
from hexir.database import Database
from hexir.ir.analysis import flop_count
from hexir.ir.tir import PrimFunc
from hexir.search import Candidate, CpuBuilder, CpuRunner, MeasureResult, measure
from hexir.search.space import SearchSpace

TARGET = "cpu"

NUMPY_CHILD = """
import statistics, sys, time
import numpy as np
import hexir
from hexir.cli import parse_workload_spec
from hexir.graph.evaluate import evaluate
from hexir.graph.reference import source_graph
name, params = parse_workload_spec(sys.argv[1])
func = hexir.workload(name, **params)
rng = np.random.default_rng(1)
inputs = [rng.standard_normal(p.shape).astype(np.float32) for p in func.inputs]
if name in ("matmul", "batch_matmul"):
    run = lambda: np.matmul(inputs[0], inputs[1])  # numpy's A @ B, in float32
else:
    graph = source_graph(func)  # hexir.reference's semantics (it computes in float64)
    run = lambda: evaluate(graph, inputs)
run(); run()
times = []
while len(times) < 10 or sum(times) < 0.3:
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
print(statistics.median(times))
"""


def numpy_seconds(spec: str, coretype: str | None = None) -> float:
    """numpy's median seconds for the workload, in a fresh process (OpenBLAS's spinning
    threads would slow whatever this process times next)."""
    env = dict(os.environ)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run(
        [sys.executable, "-c", NUMPY_CHILD, spec],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def sample_candidates(func: PrimFunc, n: int, seed: int) -> list[Candidate]:
    """`n` sampled schedules as candidates, duplicates (one candidate key) dropped."""
    start = time.perf_counter()
    schedules = SearchSpace().sample_schedules(func, TARGET, random.Random(seed), n)
    unique = {}
    for sch in schedules:
        cand = Candidate.from_schedule(func, sch, TARGET)
        unique.setdefault(cand.candidate_key, cand)
    print(
        f"sampled {n} schedules in {time.perf_counter() - start:.1f} s: "
        f"{len(unique)} distinct candidates"
    )
    return list(unique.values())


def measure_all(
    func: PrimFunc, candidates: list[Candidate], db: Database, batch: int
) -> list[MeasureResult | None]:
    """Measure what the database lacks, in batches (built in parallel, run one at a time),
    committing each result; None for a candidate the database already had."""
    known = db.measured_keys(hexir.workload_key(func), TARGET)
    todo = [c for c in candidates if c.candidate_key not in known]
    print(f"{len(candidates) - len(todo)} already in {db.url}; measuring {len(todo)}")
    results: dict[str, MeasureResult] = {}
    builder = CpuBuilder()
    with CpuRunner() as runner:
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            for cand, result in zip(chunk, measure(chunk, builder, runner), strict=True):
                db.commit_record(func, TARGET, cand.trace, result, candidate_key=cand.candidate_key)
                results[cand.candidate_key] = result
            print(f"  measured {min(start + batch, len(todo))}/{len(todo)}", flush=True)
    return [results.get(c.candidate_key) for c in candidates]


def distribution(func: PrimFunc, db: Database, keys: set[str]) -> tuple[list[float], Counter]:
    """Seconds of every valid record of these candidates, and error counts by kind."""
    errors: Counter[str] = Counter()
    seconds = []
    for record in db.records(hexir.workload_key(func), TARGET):
        if record.candidate_key not in keys:
            continue
        keys = keys - {record.candidate_key}
        if record.error_kind is not None:
            errors[record.error_kind] += 1
        elif record.median is not None:
            seconds.append(record.median)
    return sorted(seconds), errors


def report(spec: str, func: PrimFunc, seconds: list[float], errors: Counter, peers: dict) -> None:
    flop = flop_count(func)

    def gflops(s: float) -> float:
        return flop / s / 1e9

    print(f"\n{spec}, target {TARGET}, {knobs.get().num_threads or os.cpu_count()} threads")
    print(f"valid {len(seconds)}, errors {sum(errors.values())}: {dict(errors) or 'none'}")
    if not seconds:
        return
    rows = {"best": seconds[0], "median": statistics.median(seconds), "worst": seconds[-1]}
    rows |= peers
    base = peers["numpy, default environment"]
    print(f"{'':36} {'ms':>10} {'GFLOP/s':>9} {'x numpy':>8}")
    for name, s in rows.items():
        print(f"{name:36} {s * 1e3:10.3f} {gflops(s):9.1f} {base / s:8.3f}")
    print(f"best / numpy {base / seconds[0]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="matmul:M=1024,N=1024,K=1024")
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--db", default="sqlite:///tuning_logs/hexir.db")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    name, params = parse_workload_spec(args.workload)
    func = hexir.workload(name, **params)
    peers = {"numpy, default environment": numpy_seconds(args.workload)}
    peers["numpy, OPENBLAS_CORETYPE=SkylakeX"] = numpy_seconds(args.workload, "SkylakeX")
    candidates = sample_candidates(func, args.n, args.seed)
    db = Database(args.db)
    # Fewer repeats than the defaults: a poor random schedule of a large workload is slow.
    with knobs.scope(timing_warmup=1, timing_repeats=3, timing_min_seconds=0.0):
        measure_all(func, candidates, db, args.batch)
    # Timed before and twice after the candidates: the median resists a noisy neighbour.
    again = [numpy_seconds(args.workload) for _ in range(2)]
    peers["numpy, default environment"] = statistics.median(
        [peers["numpy, default environment"], *again]
    )
    seconds, errors = distribution(func, db, {c.candidate_key for c in candidates})
    report(args.workload, func, seconds, errors, peers)


if __name__ == "__main__":
    main()
