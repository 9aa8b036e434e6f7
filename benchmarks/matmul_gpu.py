"""matmul 4096^3 on the GPU: a hand schedule against cuBLAS, side by side in one run.

    python benchmarks/matmul_gpu.py [--size 4096] [--op matmul|dense] [--rounds 3]
                                    [--dtype float32|float16] [--tiling 8,32,8,4,64]
                                    [--summary FILE]

float16 runs the tensor-core schedule (`hexir.schedule.handwritten_mma`: mma.sync and
ldmatrix, float32 accumulation) against cuBLAS's float16 GEMM (float32 accumulation too).

The schedule is `hexir.schedule.handwritten.gpu_schedule` (the public primitives: a thread
block's output tile in a `local` accumulator, each operand's tile for a reduction step in
`shared` memory fetched cooperatively with float4 loads, threads over ty x tx, mi x nj outputs
per thread). The peer is cuBLAS through CuPy (float32, no TF32) or, without CuPy, through
PyTorch. Both are timed with CUDA events, in alternating rounds, on the same inputs; the hexir
result is checked against the peer's. The last line is `ratio <hexir TFLOP/s / peer TFLOP/s>`;
`--summary FILE` also writes the figures as JSON (scripts/gpu_check.sh reads it). Without a
GPU it says why and exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import numpy as np

import hexir
from hexir import knobs
from hexir.runtime.cuda_kernel import CudaKernel, gpu_unavailable_reason
from hexir.schedule.handwritten import Tiling, gpu_schedule
from hexir.schedule.handwritten_mma import MmaTiling


def vendor_peer(a: np.ndarray, b: np.ndarray) -> tuple[str, Callable[[], float], np.ndarray]:
    """(name, a function timing one product in seconds, the product) from the first vendor
    library found: cuBLAS through CuPy, else through PyTorch."""
    try:
        import cupy as cp
    except ImportError:
        return _torch_peer(a, b)
    da, db = cp.asarray(a), cp.asarray(b)
    dc = cp.empty((a.shape[0], b.shape[1]), a.dtype)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def run() -> float:
        start.record()
        cp.matmul(da, db, out=dc)
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e-3

    run()
    return f"cuBLAS (CuPy {cp.__version__})", run, cp.asnumpy(dc)


def _torch_peer(a: np.ndarray, b: np.ndarray) -> tuple[str, Callable[[], float], np.ndarray]:
    try:
        import torch
    except ImportError:
        sys.exit("matmul_gpu.py: no vendor library to compare with: install CuPy (or PyTorch)")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 against float32
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # sums in float32
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    tc = torch.empty((a.shape[0], b.shape[1]), dtype=ta.dtype, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run() -> float:
        start.record()
        torch.matmul(ta, tb, out=tc)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    run()
    return f"cuBLAS (PyTorch {torch.__version__})", run, tc.cpu().numpy()


def median_of(run: Callable[[], float], warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        run()
    return statistics.median(run() for _ in range(repeats))


def parse_tiling(text: str | None) -> Tiling | None:
    if text is None:
        return None
    ty, tx, mi, nj, bk = (int(v) for v in text.split(","))
    return Tiling(ty, tx, mi, nj, bk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--op", choices=("matmul", "dense"), default="matmul",
                        help="dense: Y = X W^T with W stored [N][K] (cuBLAS gets W^T)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    parser.add_argument("--tiling", help="ty,tx,mi,nj,bk (default: the schedule's own)")
    parser.add_argument("--summary", help="write the figures to this JSON file")
    args = parser.parse_args()
    reason = gpu_unavailable_reason()
    if reason is not None:
        sys.exit(f"matmul_gpu.py: {reason}")

    n = args.size
    flop = 2.0 * n**3
    extra = {"bias": False} if args.op == "dense" else {}
    func = hexir.workload(args.op, M=n, N=n, K=n, dtype=args.dtype, **extra)
    sch = gpu_schedule(func, parse_tiling(args.tiling))
    print(sch.trace, end="\n\n")
    kernel = hexir.build(sch.func, target="cuda")  # the visible GPU's arch
    assert isinstance(kernel, CudaKernel)
    print(f"{kernel}: {kernel.resources}")

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32).astype(args.dtype)
    b = rng.standard_normal((n, n), dtype=np.float32).astype(args.dtype)
    c = np.full((n, n), np.nan, args.dtype)
    vendor, vendor_run, expect = vendor_peer(a, b if args.op == "matmul" else b.T.copy())
    kernel(a, b, c)
    # K products of unit normals: |c| ~ sqrt(K); summation orders differ between the two, and
    # float16 results round to 11 bits.
    tol = 1e-3 if args.dtype == "float32" else 2e-3
    c32, expect32 = c.astype(np.float32), expect.astype(np.float32)
    np.testing.assert_allclose(c32, expect32, rtol=tol, atol=tol * np.sqrt(n))
    print(f"hexir matches {vendor} (max abs difference {np.abs(c32 - expect32).max():.2e})")

    hexir_times, vendor_times = [], []
    with knobs.scope(timing_warmup=3, timing_repeats=10, timing_min_seconds=0.0):
        for _ in range(args.rounds):  # alternate, so clock drift hits both
            vendor_times.append(median_of(vendor_run))
            hexir_times.append(kernel.time(a, b, c))
    seconds = {vendor: statistics.median(vendor_times), "hexir": statistics.median(hexir_times)}
    report(args, kernel, vendor, seconds, flop)


def report(
    args: argparse.Namespace,
    kernel: CudaKernel,
    vendor: str,
    seconds: dict[str, float],
    flop: float,
) -> None:
    tflops = {name: flop / s / 1e12 for name, s in seconds.items()}
    ratio = tflops["hexir"] / tflops[vendor]
    t = parse_tiling(args.tiling) or Tiling()
    label = f"hexir, hand schedule ({t.ty}x{t.tx} threads, {t.mi}x{t.nj} per thread, bk {t.bk})"
    if args.dtype == "float16":
        m = MmaTiling()
        label = (
            f"hexir, mma.sync ({m.block[0]}x{m.block[1]} a block, {m.warp[0]}x{m.warp[1]} a warp)"
        )
    gpu = kernel.target.arch
    print(f"\n{args.dtype} {args.op} {args.size}^3 on {gpu}, medians of CUDA-event timings")
    print(f"{'':58} {'ms':>8} {'TFLOP/s':>8} {'x cuBLAS':>9}")
    for name, shown in ((vendor, vendor), ("hexir", label)):
        s, tf = seconds[name], tflops[name]
        print(f"{shown:58} {s * 1e3:8.3f} {tf:8.2f} {tf / tflops[vendor]:9.3f}")
    if args.summary:
        summary = {
            "size": f"{args.size}^3",
            "dtype": args.dtype,
            "arch": gpu,
            "hexir_ms": seconds["hexir"] * 1e3,
            "hexir_tflops": tflops["hexir"],
            "vendor": vendor,
            "vendor_ms": seconds[vendor] * 1e3,
            "vendor_tflops": tflops[vendor],
            "ratio": ratio,
        }
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
