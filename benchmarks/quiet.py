"""Is the machine quiet? numpy's float32 matmul 1024^3, timed in a fresh process, to print
beside a benchmark's figures (a figure is quoted only from a run whose numpy line is at its
usual level).

    from quiet import numpy_matmul_line   # a benchmark runs as a script: benchmarks/ is on sys.path
    print(numpy_matmul_line())

In-process, OpenBLAS's threads keep spinning after each call and slow whatever runs next on a
2-core machine, so numpy runs in a subprocess of its own. With AVX-512 the line also gives
OpenBLAS's SkylakeX kernel (PERFORMANCE.md's reference); on an AVX2-only machine that kernel
does not run (SIGILL), and the line says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import hexir

SIZE = 1024
SHAPED = """
import time, statistics, numpy as np
rng = np.random.default_rng(1)
a = rng.standard_normal(({m}, {k}), dtype=np.float32)
b = rng.standard_normal(({k}, {n}), dtype=np.float32)
c = a @ b; np.matmul(a, b, out=c)
times = []
while len(times) < 10 or sum(times) < 0.3:
    t = time.perf_counter(); np.matmul(a, b, out=c); times.append(time.perf_counter() - t)
print(statistics.median(times))
"""
CHILD = SHAPED.format(m=SIZE, n=SIZE, k=SIZE)


def in_turn(
    timers: Sequence[Callable[[], float]], warmup: int, seconds: float, at_least: int = 10
) -> list[list[float]]:
    """The seconds each of `timers` reports, called in turn (one call of each, then the next
    of each) until each was called `at_least` times and all took `seconds` together, after
    `warmup` calls of each: one list per timer. This host's speed shifts by a third from one
    second to the next (the same kernel 0.82 ms, then 1.1); calls taken in turn see the same
    shifts, where one's calls after the other's need not."""
    for _ in range(warmup):
        for timer in timers:
            timer()
    times: list[list[float]] = [[] for _ in timers]
    total = 0.0
    while len(times[0]) < at_least or total < seconds:
        for timer, column in zip(timers, times, strict=True):
            column.append(timer())
            total += column[-1]
    return times


def has_avx512() -> bool:
    return "avx512f" in hexir.Target("cpu").features


def numpy_matmul_gflops(coretype: str | None = None) -> float:
    """numpy's float32 matmul 1024^3 in GFLOP/s, median, in a fresh process (with
    OPENBLAS_CORETYPE set when `coretype` is given)."""
    env = dict(os.environ)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return 2 * SIZE**3 / float(out.stdout.strip()) / 1e9


def numpy_matmul_seconds(m: int, n: int, k: int, coretype: str | None = None) -> float:
    """numpy's median seconds for a float32 (m x k) @ (k x n), in a fresh process."""
    env = dict(os.environ)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    child = SHAPED.format(m=m, n=n, k=k)
    out = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def numpy_matmul_line() -> str:
    default = numpy_matmul_gflops()
    if has_avx512():
        avx512 = numpy_matmul_gflops("SkylakeX")
        return (
            f"numpy matmul 1024^3 (quiet machine check): {default:.0f} GFLOP/s default, "
            f"{avx512:.0f} GFLOP/s AVX-512 (SkylakeX)"
        )
    return (
        f"numpy matmul 1024^3 (quiet machine check): {default:.0f} GFLOP/s "
        "(no AVX-512 on this CPU: OpenBLAS's AVX2 kernel)"
    )
