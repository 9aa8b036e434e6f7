"""What building a model costs: `hexir.compile` of zoo models (default schedules) from an
empty build cache, again with the kernels' libraries cached but the kernels scheduled and
their C printed anew (the cache's `schedules/` and `src/` emptied first,
hexir/runtime/build_cache.py), and again with everything cached, side by side in one run.

    python benchmarks/build_cpu.py [--rounds 3] [--models resnet18 mobilenet-v2 bert-base]

Each round builds every model in the three ways into a fresh cache directory; the table
gives the medians over rounds, and the second way over the third is what the schedules and
C kept in the build cache save a model built again (`hexir run MODEL` with its libraries
cached). numpy's matmul 1024^3 is printed first and last (benchmarks/quiet.py): quote a run
only when both are at the machine's quiet level.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from quiet import numpy_matmul_line

import hexir
from hexir import knobs
from hexir.frontend import zoo

WAYS = ("empty cache", "libraries cached", "all cached")


def build_times(graph: hexir.Graph) -> tuple[float, float, float]:
    """Seconds to compile `graph` in each of WAYS, into a cache directory of its own."""
    cache = Path(tempfile.mkdtemp(prefix="hexir-build-bench-"))
    times = []
    try:
        with knobs.scope(cache_dir=str(cache)):
            for way in WAYS:
                if way == "libraries cached":
                    shutil.rmtree(cache / "schedules")
                    shutil.rmtree(cache / "src")
                start = time.perf_counter()
                hexir.compile(graph, "cpu")
                times.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return tuple(times)  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet-v2", "bert-base"])
    args = parser.parse_args()
    print(numpy_matmul_line())
    graphs = {name: zoo.zoo_model(name) for name in args.models}
    seconds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, graph in graphs.items():
            seconds[name].append(build_times(graph))
    print(f"\n{'model':14s}" + "".join(f"{way:>18s}" for way in WAYS) + "   made / kept")
    for name, rows in seconds.items():
        medians = [statistics.median(r[k] for r in rows) for k in range(len(WAYS))]
        cells = "".join(f"{m:16.2f} s" for m in medians)
        print(f"{name:14s}{cells}   {medians[1] / medians[2]:.2f}x")
    print(numpy_matmul_line())


if __name__ == "__main__":
    main()
