"""The fp32 peak of a target: the ceiling a profile's "of peak" column divides by.

    Target("cpu").peak()               # Peak(flops=1.96e11, how="2 cores x 8 lanes x ...")
    Target("cuda -arch=sm_90").peak()  # from the table below: 66.9 TFLOP/s
    cpu_peak(target, override_gflops=0, cache_dir="~/.cache/hexir")

CPU: cores x fp32 lanes x 2 FMA pipes x 2 FLOP per FMA x clock. The clock under load is not
known portably (/proc/cpuinfo shows the nominal one, not what runs), so it is measured once per
machine: a generated C kernel of independent FMA chains, built through the project's C path
(hexir/runtime/cc.py) and run on one thread, gives its best FLOP/s over a few calls; divided by
lanes x 2 pipes x 2 FLOP that is the clock. One thread, so a busy second core cannot halve the
figure; the peak is then the one-core rate times the cores (on a CPU with a single FMA pipe the
clock shown is half the real one, and the peak still right). The clock is cached in
`<cache_dir>/peak/`, keyed by the target key, the core count and the CPU's model name;
`HEXIR_CPU_PEAK_GFLOPS` overrides the whole derivation.

CUDA: SM count x boost clock x fp32 lanes per SM x 2 FLOP per FMA, from one reference GPU per
arch (the non-tensor-core fp32 rate; another GPU of the same arch differs in SMs and clock).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hexir.runtime.target import Target

__all__ = [
    "CUDA_BANDWIDTHS",
    "CUDA_PEAKS",
    "Bandwidth",
    "Peak",
    "bandwidth",
    "cpu_peak",
    "cuda_peak",
    "measure_cpu_bandwidth",
    "measure_cpu_clock",
]

FMA_PIPES = 2  # 256- or 512-bit FMA units per core: Zen 2-5, Intel since Haswell
FLOP_PER_FMA = 2


@dataclass(frozen=True)
class Peak:
    """Peak fp32 FLOP/s and how the figure was obtained, in words."""

    flops: float
    how: str

    def __str__(self) -> str:
        return f"{self.flops / 1e9:.1f} GFLOP/s fp32 = {self.how}"


@dataclass(frozen=True)
class Bandwidth:
    """Bytes a second a target moves and how the figure was obtained, in words."""

    bytes_per_s: float
    how: str

    def __str__(self) -> str:
        return f"{self.bytes_per_s / 1e9:.0f} GB/s = {self.how}"


@dataclass(frozen=True)
class GpuPeak:
    """The fp32 rate of one reference GPU of an arch."""

    gpu: str
    sms: int
    clock_ghz: float  # boost clock
    lanes_per_sm: int  # fp32 FMA lanes per SM

    @property
    def flops(self) -> float:
        return self.sms * self.clock_ghz * 1e9 * self.lanes_per_sm * FLOP_PER_FMA


# One reference GPU per arch (NVIDIA's data sheets; fp32 without tensor cores).
CUDA_PEAKS: dict[str, GpuPeak] = {
    "sm_80": GpuPeak("A100 SXM", 108, 1.410, 64),  # 19.5 TFLOP/s
    "sm_86": GpuPeak("A10", 72, 1.695, 128),  # 31.2 TFLOP/s
    "sm_89": GpuPeak("L4", 58, 2.040, 128),  # 30.3 TFLOP/s
    "sm_90": GpuPeak("H100/H200 SXM", 132, 1.980, 128),  # 66.9 TFLOP/s
}


def cuda_peak(arch: str) -> Peak:
    """The reference GPU's fp32 peak for `arch`."""
    g = CUDA_PEAKS[arch]
    how = (
        f"{arch} as the {g.gpu}: {g.sms} SMs x {g.clock_ghz:.3f} GHz x {g.lanes_per_sm} fp32 "
        f"lanes x {FLOP_PER_FMA} FLOP"
    )
    return Peak(g.flops, how)


# Memory bandwidth of the same reference GPUs, bytes a second (data sheets: HBM or GDDR).
CUDA_BANDWIDTHS: dict[str, float] = {
    "sm_80": 2.039e12,  # A100 SXM 80 GB
    "sm_86": 600e9,  # A10
    "sm_89": 300e9,  # L4
    "sm_90": 3.35e12,  # H100 SXM (an H200 has 4.8 TB/s)
}
# The buffer a CPU's bandwidth is measured on: cache-sized, as candidates are timed with warm
# inputs (a kernel that streams from L3 or DRAM is slower than this rate, never faster), a
# slice a core: 1 MiB, whose slices stay in a core's L2. Here (AMD EPYC, 2 MB L2 a core, two
# cores) the copy runs at 219 GB/s; 2 MiB at 156, 4 MiB at 148, 16 MiB at 92.
BANDWIDTH_BYTES = 1 << 20
# The buffer of the memory bandwidth (`bandwidth(..., memory=True)`): past any L3 of ours (32
# MiB), the rate of a kernel timed cold (hexir/search/worker.py: COLD_BYTES).
MEMORY_BANDWIDTH_BYTES = 128 << 20
# A round of a bandwidth measurement copies at least this many bytes (`measure_cpu_bandwidth`).
COPY_ROUND_BYTES = 64 << 20


def bandwidth(target: Target, cache_dir: str, memory: bool = False) -> Bandwidth:
    """Bytes a second the target moves: on CUDA the reference GPU's memory (data sheet); on
    the CPU a copy of a cache-sized buffer, or with `memory` of one four times a large L3 (the
    rate of a kernel whose data comes from DRAM), measured once per machine and cached."""
    if target.kind == "cuda":
        return Bandwidth(CUDA_BANDWIDTHS[target.arch], f"{target.arch} memory (data sheet)")
    size = MEMORY_BANDWIDTH_BYTES if memory else BANDWIDTH_BYTES
    suffix = ".bandwidth-memory.json" if memory else ".bandwidth-cache.json"
    path = _clock_path(target, cache_dir).with_suffix(suffix)
    rate, how = _cached(path, "bytes_per_s"), "cached"
    if rate is None:
        rate, how = measure_cpu_bandwidth(size=size), "measured now"
        _write(path, "bytes_per_s", rate)
    return Bandwidth(rate, f"a {size >> 20} MiB copy, read and written ({how})")


def measure_cpu_bandwidth(trials: int = 20, size: int = BANDWIDTH_BYTES) -> float:
    """Bytes read and written a second by numpy's copy of a `size`-byte buffer, a slice per
    core on a thread each (numpy copies without the GIL; a kernel runs on every core, and one
    core alone draws neither all of the caches' nor all of memory's bandwidth): the best of
    `trials` rounds after a warm-up one, each thread copying its slice over and over until
    the round has moved COPY_ROUND_BYTES (so that starting the threads is not what is timed)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    src = np.ones(size // 4, np.float32)
    dst = np.empty_like(src)
    cores = max(1, os.cpu_count() or 1)
    parts = list(zip(np.array_split(dst, cores), np.array_split(src, cores), strict=True))
    repeats = max(1, COPY_ROUND_BYTES // size)

    def copies(part: tuple[np.ndarray, np.ndarray]) -> None:
        for _ in range(repeats):
            np.copyto(*part)

    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(copies, parts))
        best = math.inf
        for _ in range(trials):
            start = time.perf_counter()
            list(pool.map(copies, parts))
            best = min(best, time.perf_counter() - start)
    return 2 * size * repeats / max(best, 1e-9)


def cpu_peak(target: Target, override_gflops: float, cache_dir: str) -> Peak:
    """The CPU's fp32 peak: `override_gflops` when above 0, else derived from the clock
    (measured once, then read from `cache_dir`)."""
    if override_gflops > 0:
        return Peak(override_gflops * 1e9, "HEXIR_CPU_PEAK_GFLOPS (given)")
    path = _clock_path(target, cache_dir)
    clock, how = _cached(path, "clock_hz"), "cached"
    if clock is None:
        clock, how = measure_cpu_clock(target), "measured now"
        _write(path, "clock_hz", clock)
    per_cycle = target.num_cores * target.vector_width * FMA_PIPES * FLOP_PER_FMA
    text = (
        f"{target.num_cores} cores x {target.vector_width} lanes x {FMA_PIPES} FMA pipes x "
        f"{FLOP_PER_FMA} FLOP x {clock / 1e9:.2f} GHz (clock: FMA chains on one thread, {how})"
    )
    return Peak(per_cycle * clock, text)


def measure_cpu_clock(target: Target, trials: int = 7, seconds: float = 0.02) -> float:
    """The clock in Hz that one thread's FMA throughput implies: the best of `trials` calls of
    about `seconds` each, after a warm-up call, over lanes x FMA pipes x 2 FLOP."""
    from hexir.runtime.cc import compile_c

    chains = _chains(target)
    lib = ctypes.CDLL(str(compile_c(fma_chains_source(target.vector_width, chains), target)))
    fn = lib.hexir_fma_chains
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p]
    fn.restype = None
    sink = ctypes.c_float(0.0)
    # About 2 FMAs a cycle at 2-5 GHz: size the calls from a guess, then from the warm-up.
    iterations = int(seconds * 4e9 / chains)
    start = time.perf_counter()
    fn(iterations, ctypes.byref(sink))
    iterations = max(1000, int(iterations * seconds / max(time.perf_counter() - start, 1e-6)))
    best = 0.0
    for _ in range(trials):
        start = time.perf_counter()
        fn(iterations, ctypes.byref(sink))
        best = max(best, iterations * chains / (time.perf_counter() - start))
    return best / FMA_PIPES  # vector FMAs a second, over the pipes: cycles a second


def fma_chains_source(lanes: int, chains: int) -> str:
    """C for `hexir_fma_chains(iterations, sink)`: `chains` independent chains of vector FMAs
    (a = a * m + c, contracted to FMAs by GCC's default -ffp-contract=fast), enough to keep
    every FMA pipe busy through the FMA latency, all in registers."""
    body = "\n".join(f"      a{c} = a{c} * m + k;" for c in range(chains))
    init = "\n".join(f"  vec a{c} = m * (float)({c + 1});" for c in range(chains))
    total = " + ".join(f"a{c}" for c in range(chains))
    return f"""typedef float vec __attribute__((vector_size({lanes * 4})));

__attribute__((visibility("default"))) void hexir_fma_chains(long iterations, float *sink) {{
  vec m, k;
  for (int l = 0; l < {lanes}; l++) {{ m[l] = 0.999999f; k[l] = 1e-7f * (float)(l + 1); }}
{init}
  for (long i = 0; i < iterations; i++) {{
{body}
  }}
  vec t = {total};
  for (int l = 0; l < {lanes}; l++) *sink += t[l];
}}
"""


def _chains(target: Target) -> int:
    # 2 pipes x 4-5 cycles of latency want 8-10 chains; leave registers for m and k
    # (16 vector registers with AVX2 and NEON, 32 with AVX-512).
    return 24 if target.vector_width >= 16 else 12


def _clock_path(target: Target, cache_dir: str) -> Path:
    machine = hashlib.sha256(_cpu_model().encode()).hexdigest()[:12]
    name = f"{target.key}-{target.num_cores}c-{machine}.json"
    return Path(cache_dir).expanduser() / "peak" / name


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "CPU part"):
                    return value.strip()
    except OSError:
        pass
    return os.uname().machine


def _cached(path: Path, name: str) -> float | None:
    try:
        value = float(json.loads(path.read_text())[name])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if value > 0 else None


def _write(path: Path, name: str, value: float) -> None:
    # Written under a temporary name and renamed: a concurrent reader sees all or nothing.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({name: value, "cpu": _cpu_model()}) + "\n")
    os.replace(tmp, path)
