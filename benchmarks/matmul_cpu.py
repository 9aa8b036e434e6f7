"""float32 matmul 1024^3 on the CPU: a hand schedule against numpy, side by side in one run.

    python benchmarks/matmul_cpu.py [--mr 6] [--nr 16] [--rounds 3]   # AVX-512: --nr 64

Then, for 1024^3, 2048^3 and the transformer shapes (M x N x K, the weight B a constant), the
default schedule as a compiled model runs it: B laid out at compile time in the column panels
of its register tile (hexir/graph/layout.py, `weight_block`), against numpy's A @ B (a fresh
process per shape and round; `--no-shapes` skips this table).

The schedule is a Trace written with the public primitives: B packed per NR-column panel
(cache_read into a `global` buffer, compute_at the panel loop, so the panel [K][NR] sits in
L2), an MR x NR accumulator tile in vector registers (cache_write `local`, reverse_compute_at
the row-tile loop, decompose_reduction), the k loop outside the unrolled rows and the
vectorized columns, the panel loop parallel. numpy is timed in subprocesses: in the default
environment, and with OpenBLAS's AVX-512 (SkylakeX, where the CPU has it) and AVX2 (Haswell)
kernels. The default tile is 6 x 16 on AVX2 (12 accumulators of its 16 vector registers), 6 x
64 with AVX-512.
The last line is `ratio <scheduled GFLOP/s / numpy default-environment GFLOP/s>`.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
from quiet import has_avx512, numpy_matmul_gflops, numpy_matmul_seconds

import hexir
from hexir import knobs
from hexir.graph.fusion import fused_kernels
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.kernel import CpuKernel
from hexir.schedule.handwritten import cpu_schedule

SIZE = 1024
FLOP = 2 * SIZE**3
# M x N x K: the square sizes, and bert's and ViT's projections and MLP (128 or 197 tokens).
SHAPES = (
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (128, 768, 768),
    (128, 3072, 768),
    (128, 768, 3072),
    (197, 768, 768),
    (197, 3072, 768),
)


def schedule(func: hexir.PrimFunc, mr: int, nr: int) -> hexir.Schedule:
    return cpu_schedule(func, mr, nr)


def numpy_subprocess(coretype: str | None = None) -> float:
    """numpy's median seconds in a fresh process (benchmarks/quiet.py): the environment as it
    is, or with OPENBLAS_CORETYPE set. In-process, OpenBLAS's threads keep spinning after each
    call and halve the speed of whatever runs next on these 2 cores, so no peer runs here."""
    return FLOP / (numpy_matmul_gflops(coretype) * 1e9)


def gflops(seconds: float) -> float:
    return FLOP / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mr", type=int, default=6)
    parser.add_argument("--nr", type=int, default=16 if not has_avx512() else 64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-shapes", action="store_true", help="skip the table of shapes")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    b = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    c = np.full((SIZE, SIZE), np.nan, np.float32)
    expect = a @ b

    # OpenBLAS's AVX-512 kernel dies of SIGILL on a CPU without AVX-512.
    coretypes = ("SkylakeX", "Haswell") if has_avx512() else ("Haswell",)
    peers = {f"numpy, OPENBLAS_CORETYPE={t}": numpy_subprocess(t) for t in coretypes}

    func = hexir.workload("matmul", M=SIZE, N=SIZE, K=SIZE)
    sch = schedule(func, args.mr, args.nr)
    print(sch.trace)
    print()
    kernel = hexir.build(sch.func)
    kernel(a, b, c)
    np.testing.assert_allclose(c, expect, rtol=1e-3, atol=1e-3)
    print(f"scheduled kernel matches numpy (max abs error {np.abs(c - expect).max():.2e})")

    numpy_times, kernel_times = [], []
    for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both
        numpy_times.append(numpy_subprocess())
        # Buffers in fresh memory each round: placement alone can change a kernel's time.
        a2, b2, c2 = a.copy(), b.copy(), np.empty_like(c)
        kernel_times.append(kernel.time(a2, b2, c2))

    naive = hexir.build(func)
    c = np.full_like(c, np.nan)  # poisoned again: the scheduled kernel's C would pass for it
    naive(a, b, c)
    np.testing.assert_allclose(c, expect, rtol=1e-3, atol=1e-3)
    with knobs.scope(timing_warmup=0, timing_repeats=1, timing_min_seconds=0.0):
        naive_time = naive.time(a, b, c)

    rows = {
        "numpy, default environment": statistics.median(numpy_times),
        **peers,
        "hexir, unscheduled": naive_time,
        f"hexir, scheduled (MR={args.mr}, NR={args.nr})": statistics.median(kernel_times),
    }
    base = gflops(rows["numpy, default environment"])
    best = "SkylakeX" if has_avx512() else "Haswell"
    avx512 = gflops(rows[f"numpy, OPENBLAS_CORETYPE={best}"])
    print(
        f"\nfloat32 matmul {SIZE}^3, {knobs.get().num_threads or os.cpu_count()} threads, medians"
    )
    wide = "x AVX-512" if has_avx512() else "x AVX2"
    print(f"{'':40} {'ms':>9} {'GFLOP/s':>9} {'x numpy':>8} {wide:>10}")
    for name, seconds in rows.items():
        g = gflops(seconds)
        print(f"{name:40} {seconds * 1e3:9.2f} {g:9.1f} {g / base:8.2f} {g / avx512:10.2f}")
    print(f"ratio {gflops(rows[list(rows)[-1]]) / base:.3f}")
    if not args.no_shapes:
        shapes_table(args.rounds)


def compiled_kernel(m: int, n: int, k: int, b: np.ndarray) -> tuple[CpuKernel, np.ndarray]:
    """The default-schedule kernel of x @ B for a constant B, as a model compiles it, and the
    weight as that kernel reads it (laid out at compile time)."""
    builder = hexir.GraphBuilder("matmul")
    graph = builder.build(builder.matmul(builder.input("x", (m, k)), builder.constant(b)))
    laid_out, groups = fused_kernels(graph, hexir.Target("cpu"))
    ((_, func),) = groups
    (weight,) = (laid_out.constant(name) for name, _ in laid_out.constants)
    return hexir.build(default_schedule(func, "cpu").func), np.ascontiguousarray(weight)


def shapes_table(rounds: int) -> None:
    """The default schedule at each of SHAPES against numpy's default environment and, where
    the CPU has AVX-512, OpenBLAS's AVX-512 kernel (the bar: >= 0.95x the faster of the two)."""
    rng = np.random.default_rng(0)
    coretypes = (None, "SkylakeX") if has_avx512() else (None,)
    print("\nfloat32 matmul, default schedule with B laid out as compiled, against numpy (medians)")
    heads = ("hexir ms", "GFLOP/s", "numpy ms", "GFLOP/s", "x numpy")
    heads += ("AVX512 ms", "GFLOP/s", "x AVX-512") if has_avx512() else ()
    print(f"{'M x N x K':>18} " + " ".join(f"{h:>9}" for h in heads))
    below = []
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        kernel, weight = compiled_kernel(m, n, k, b)
        c = np.full((m, n), np.nan, np.float32)
        kernel(a, weight, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
        ours, theirs = [], {t: [] for t in coretypes}
        for _ in range(rounds):  # alternate, so drift on a shared machine hits both
            for t in coretypes:
                theirs[t].append(numpy_matmul_seconds(m, n, k, t))
            ours.append(kernel.time(a, weight, c))
        t = statistics.median(ours)
        flop = 2 * m * n * k
        cells = [f"{t * 1e3:9.3f} {flop / t / 1e9:9.1f}"]
        for peer in theirs.values():
            tn = statistics.median(peer)
            cells.append(f"{tn * 1e3:9.3f} {flop / tn / 1e9:9.1f} {tn / t:9.2f}")
        best = min(statistics.median(peer) for peer in theirs.values())
        name = f"{m} x {n} x {k}"
        if best / t < 0.95:
            below.append(f"{name} {best / t:.2f}")
        print(f"{name:>18} " + " ".join(cells))
    print(
        f"bar: >= 0.95x numpy's faster kernel: {len(SHAPES) - len(below)} of {len(SHAPES)} shapes"
        + (f"; below: {', '.join(below)}" if below else "")
    )


if __name__ == "__main__":
    main()
