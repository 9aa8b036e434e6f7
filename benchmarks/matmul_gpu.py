"""matmul 4096^3 on the GPU: a hand schedule against cuBLAS, side by side in one run.

    python benchmarks/matmul_gpu.py [--size 4096] [--op matmul|dense] [--rounds 3]
                                    [--dtype float32|float16] [--tiling 8,32,8,8,32]
                                    [--also 8,32,8,4,64 ...] [--summary FILE]
                                    [--peer auto|cublas|cupy|torch]

float16 runs the tensor-core schedule (`hexir.schedule.handwritten_mma`: mma.sync and
ldmatrix, float32 accumulation) against cuBLAS's float16 GEMM (float32 accumulation too).

The schedule is `hexir.schedule.handwritten.gpu_schedule` (the public primitives: a thread
block's output tile in a `local` accumulator, each operand's tile for a reduction step in
`shared` memory fetched cooperatively with float4 loads, threads over ty x tx, mi x nj outputs
per thread). The peer is cuBLAS (float32, no TF32), called through ctypes from the
nvidia-cublas wheel where it is installed (no CuPy or PyTorch needed), else through CuPy,
else through PyTorch. Both are timed with CUDA events, in alternating rounds, on the same
inputs; the hexir result is checked against the peer's. The last line is
`ratio <hexir TFLOP/s / peer TFLOP/s>`; `--summary FILE` also writes the figures as JSON
(scripts/gpu_check.sh reads it). Without a GPU it says why and exits 1.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from collections.abc import Callable

import numpy as np

import hexir
from hexir import knobs
from hexir.runtime import cuda_driver
from hexir.runtime.cuda_kernel import CudaKernel, gpu_unavailable_reason
from hexir.schedule.handwritten import Tiling, gpu_schedule
from hexir.schedule.handwritten_mma import MmaTiling


def vendor_peer(
    a: np.ndarray, b: np.ndarray, peer: str = "auto"
) -> tuple[str, Callable[[], float], np.ndarray]:
    """(name, a function timing one product in seconds, the product) from cuBLAS: called
    directly from the nvidia-cublas wheel where it is installed ("cublas"), else through CuPy,
    else through PyTorch ("auto"; or the one `peer` names)."""
    order = {"auto": (_cublas_peer, _cupy_peer, _torch_peer), "cublas": (_cublas_peer,),
             "cupy": (_cupy_peer,), "torch": (_torch_peer,)}[peer]  # fmt: skip
    missing = []
    for make in order:
        try:
            return make(a, b)
        except ImportError as e:
            missing.append(str(e))
    sys.exit(f"matmul_gpu.py: no cuBLAS to compare with ({'; '.join(missing)})")


# cuBLAS's enums, from cublas_api.h and library_types.h.
CUBLAS_OP_N = 0
CUDA_R_16F = 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1


def _cublas_peer(a: np.ndarray, b: np.ndarray) -> tuple[str, Callable[[], float], np.ndarray]:
    """cuBLAS's GEMM through ctypes, on buffers of Hexir's driver binding, in the device's
    primary context (the one cuBLAS's runtime uses), timed with the same CUDA events."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception as e:  # noqa: BLE001 - no wheel, or no such library in it
        raise ImportError(f"cannot load libcublas from the nvidia-cublas wheel: {e}") from e
    driver = cuda_driver.load()
    device = driver.device()
    (m, k), n = a.shape, b.shape[1]
    c = np.empty((m, n), a.dtype)
    handle = ctypes.c_void_p()
    version = ctypes.c_int()
    with driver.current(device):
        pa, pb, pc = (ctypes.c_void_p(driver.alloc(x.nbytes)) for x in (a, b, c))
        driver.htod(pa.value, a)
        driver.htod(pb.value, b)
        _cublas(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        _cublas(lib.cublasGetVersion_v2(handle, ctypes.byref(version)), "cublasGetVersion")
        start, end = driver.event(), driver.event()  # in the context, as every driver call
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    one, zero = ctypes.byref(alpha), ctypes.byref(beta)

    def gemm() -> None:
        # Row-major C = A B is column-major C^T = B^T A^T: B first, then A.
        if a.dtype == np.float32:  # the default math mode: float32 throughout, no TF32
            status = lib.cublasSgemm_v2(
                handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, one, pb, n, pa, k, zero, pc, n
            )
        else:  # float16 operands and result, float32 sums: tensor cores
            status = lib.cublasGemmEx(
                handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, one, pb, CUDA_R_16F, n, pa,
                CUDA_R_16F, k, zero, pc, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
            )  # fmt: skip
        _cublas(status, "cublasGemm")

    def run() -> float:
        with driver.current(device):
            driver.record(start)
            gemm()
            driver.record(end)
            return driver.elapsed(start, end)

    run()
    with driver.current(device):
        driver.dtoh(c, pc.value)
    v = version.value
    return f"cuBLAS {v // 10000}.{v // 100 % 100}.{v % 100} (ctypes)", run, c


def _cublas(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed: cublasStatus_t {status}")


def _cupy_peer(a: np.ndarray, b: np.ndarray) -> tuple[str, Callable[[], float], np.ndarray]:
    import cupy as cp

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
    import torch

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
    parser.add_argument("--also", action="append", default=[], metavar="TILING",
                        help="also time the hand schedule with this tiling (float32)")  # fmt: skip
    parser.add_argument("--summary", help="write the figures to this JSON file")
    parser.add_argument("--peer", choices=("auto", "cublas", "cupy", "torch"), default="auto",
                        help="how cuBLAS is called (auto: directly where the nvidia-cublas "
                        "wheel is installed, else CuPy, else PyTorch)")  # fmt: skip
    args = parser.parse_args()
    reason = gpu_unavailable_reason()
    if reason is not None:
        sys.exit(f"matmul_gpu.py: {reason}")

    n = args.size
    flop = 2.0 * n**3
    extra = {"bias": False} if args.op == "dense" else {}
    func = hexir.workload(args.op, M=n, N=n, K=n, dtype=args.dtype, **extra)
    kernels = {}  # label -> kernel: the schedule's (or --tiling's) first, then each --also
    for text in [args.tiling, *(args.also if args.dtype == "float32" else [])]:
        sch = gpu_schedule(func, parse_tiling(text))
        print(sch.trace, end="\n\n")
        kernel = hexir.build(sch.func, target="cuda")  # the visible GPU's arch
        assert isinstance(kernel, CudaKernel)
        print(f"{kernel}: {kernel.resources}")
        kernels[label(args.dtype, text, kernel)] = kernel

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32).astype(args.dtype)
    b = rng.standard_normal((n, n), dtype=np.float32).astype(args.dtype)
    c = np.full((n, n), np.nan, args.dtype)
    vendor, vendor_run, expect = vendor_peer(a, b if args.op == "matmul" else b.T.copy(), args.peer)
    # K products of unit normals: |c| ~ sqrt(K); summation orders differ between the two, and
    # float16 results round to 11 bits.
    tol = 1e-3 if args.dtype == "float32" else 2e-3
    expect32 = expect.astype(np.float32)
    for name, kernel in kernels.items():
        c[...] = np.nan
        kernel(a, b, c)
        c32 = c.astype(np.float32)
        np.testing.assert_allclose(c32, expect32, rtol=tol, atol=tol * np.sqrt(n))
        print(f"{name} matches {vendor} (max abs difference {np.abs(c32 - expect32).max():.2e})")

    times: dict[str, list[float]] = {vendor: [], **{name: [] for name in kernels}}
    with knobs.scope(timing_warmup=3, timing_repeats=10, timing_min_seconds=0.0):
        for _ in range(args.rounds):  # alternate, so clock drift hits all
            times[vendor].append(median_of(vendor_run))
            for name, kernel in kernels.items():
                times[name].append(kernel.time(a, b, c))
    seconds = {name: statistics.median(t) for name, t in times.items()}
    report(args, next(iter(kernels.values())), vendor, seconds, flop)


def label(dtype: str, tiling: str | None, kernel: CudaKernel) -> str:
    if dtype == "float16":
        m = MmaTiling()
        return (
            f"hexir, mma.sync ({m.block[0]}x{m.block[1]} a block, {m.warp[0]}x{m.warp[1]} a warp)"
        )
    t = parse_tiling(tiling)
    threads = f"{kernel.block[1]}x{kernel.block[0]} threads"
    if t is None:
        blocks = f"{kernel.grid[0]}x{kernel.grid[1]} blocks"
        return f"hexir, hand schedule (its own tiles: {threads}, {blocks})"
    return f"hexir, hand schedule ({threads}, {t.mi}x{t.nj} per thread, bk {t.bk})"


def report(
    args: argparse.Namespace,
    kernel: CudaKernel,
    vendor: str,
    seconds: dict[str, float],
    flop: float,
) -> None:
    """The table (the vendor first, then each hexir kernel); the summary and the `ratio`
    line are the first hexir kernel's (the schedule's own, or --tiling's)."""
    tflops = {name: flop / s / 1e12 for name, s in seconds.items()}
    first = next(name for name in seconds if name != vendor)
    ratio = tflops[first] / tflops[vendor]
    gpu = kernel.target.arch
    print(f"\n{args.dtype} {args.op} {args.size}^3 on {gpu}, medians of CUDA-event timings")
    print(f"{'':70} {'ms':>8} {'TFLOP/s':>8} {'x cuBLAS':>9}")
    for name, s in seconds.items():
        tf = tflops[name]
        print(f"{name:70} {s * 1e3:8.3f} {tf:8.2f} {tf / tflops[vendor]:9.3f}")
    if args.summary:
        summary = {
            "size": f"{args.size}^3",
            "dtype": args.dtype,
            "arch": gpu,
            "hexir_ms": seconds[first] * 1e3,
            "hexir_tflops": tflops[first],
            "vendor": vendor,
            "vendor_ms": seconds[vendor] * 1e3,
            "vendor_tflops": tflops[vendor],
            "ratio": ratio,
            "also": {
                name: tflops[name] / tflops[vendor]
                for name in seconds
                if name not in (vendor, first)
            },  # fmt: skip
        }
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
