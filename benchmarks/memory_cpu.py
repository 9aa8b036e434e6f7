"""Memory bandwidth on the CPU, and how near it Hexir's row reductions and decode GEMVs run:
STREAM-like loops, then each kernel's GB/s beside numpy's, in one run.

    python benchmarks/memory_cpu.py [--rounds 3]

First the machine's bandwidth, both cores: copy (a = b), triad (a = b + s*c) and sum (s +=
a, read only) over arrays well inside the L2 (a quarter of both cores' L2 per array), inside
the L3 (an eighth of it) and well beyond it (64 MiB, or twice the L3), in GB/s of bytes read
+ written (STREAM's count, no write-allocate traffic). The loops are C in this file, built
with `hexir.runtime.cc.compile_c` (cached), each thread over the same share of the arrays
on every repetition so that a share that fits stays in its core's cache.

Then softmax, layer_norm and reduce_sum / reduce_mean / reduce_max over the last axis, each
at a transformer shape and at shapes in the L3 and beyond it, and gpt2's decode GEMVs x @ W
(x 1 x K, W a constant K x N): each a one-op graph through `hexir.compile` with its default
schedule, the module's one kernel timed on its own arrays (`Kernel.time`; the weight as the
layout pass left it in the module). GB/s counts the bytes a kernel must move at least once
(input and output; the GEMVs: the weight), and `of bw` divides it by the loop that moves
data the same way, at the size class of those bytes: copy for softmax and layer_norm, sum
for the reductions and the GEMVs. A weight that fits in the L3 stays there from call to
call; in a model's decode step each comes from DRAM, as the logits' 147 MiB does. numpy
(float32, one core, into preallocated buffers; `x @ W` in a fresh process, since OpenBLAS's
spinning threads slow whatever runs next) is timed beside it; `x numpy` is numpy's time over
Hexir's.

The bar (issue 13): at least 60% of the measured bandwidth for data beyond the L2 (size
classes L3 and DRAM), measured at each kernel's own size: `of size` divides its GB/s by the
same loop's over arrays of its bytes (copy: its input and output as two arrays; sum: one),
so that a kernel between two classes (96 MiB where a VM reports 480 MiB of L3 and the loops
read 44 GB/s at 60 MiB, 27 at 960) is compared with what the machine moves at that size;
the last line counts the kernels that meet it. Medians over
`--rounds` rounds that alternate the sides; numpy's matmul 1024^3 is printed first and last:
quote a run only when both are at the machine's quiet level.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from quiet import numpy_matmul_line, numpy_matmul_seconds

import hexir
from hexir import knobs
from hexir.runtime.cc import compile_c
from hexir.runtime.kernel import CpuKernel

BAR = 0.6
EPSILON = 1e-5
MIB = 1 << 20
LOOPS = ("copy", "triad", "sum")
# Floats read + written per element, STREAM's count.
LOOP_FLOATS = {"copy": 2, "triad": 3, "sum": 1}
# The stream loop that moves data as each op does: reads one array and writes one, or reads.
BOUND = {
    "softmax": "copy",
    "layer_norm": "copy",
    "reduce_sum": "sum",
    "reduce_mean": "sum",
    "reduce_max": "sum",
    "matmul": "sum",
}
NUMPY_REDUCE = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}
ROWS = (
    ("softmax", (12, 128, 128)),  # bert-base attention, 128 tokens
    ("softmax", (12, 256, 256)),
    ("softmax", (12, 1024, 1024)),  # gpt2 attention, 1024 tokens
    ("layer_norm", (128, 768)),  # bert-base, 128 tokens
    ("layer_norm", (2048, 1024)),
    ("layer_norm", (16384, 1024)),
    *(
        (op, shape)
        for op in ("reduce_sum", "reduce_mean", "reduce_max")
        for shape in ((128, 768), (4096, 1024), (16384, 1024))
    ),
)
# K x N of x @ W: gpt2's MLP in and out, its attention projection, its logits.
GEMVS = ((768, 3072), (3072, 768), (768, 768), (768, 50257))

STREAM_C = """
#include <omp.h>
#define EXPORT __attribute__((visibility("default")))
typedef float f32x8 __attribute__((vector_size(32)));

/* Thread t's share, whole blocks of 64 floats, the same on every call and repetition. */
static void share(long n, long *lo, long *hi) {
  long blocks = n / 64, t = omp_get_thread_num(), nt = omp_get_num_threads();
  *lo = blocks * t / nt * 64;
  *hi = t == nt - 1 ? n : blocks * (t + 1) / nt * 64;
}

EXPORT void stream_copy(float *restrict a, const float *restrict b, long n, int reps,
                        int threads) {
  #pragma omp parallel num_threads(threads)
  {
    long lo, hi;
    share(n, &lo, &hi);
    for (int r = 0; r < reps; ++r) {
      #pragma omp simd
      for (long i = lo; i < hi; ++i) a[i] = b[i];
    }
  }
}

EXPORT void stream_triad(float *restrict a, const float *restrict b, const float *restrict c,
                         long n, int reps, int threads) {
  #pragma omp parallel num_threads(threads)
  {
    long lo, hi;
    share(n, &lo, &hi);
    for (int r = 0; r < reps; ++r) {
      #pragma omp simd
      for (long i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
    }
  }
}

static inline f32x8 load8(const float *p) {
  f32x8 v;
  __builtin_memcpy(&v, p, 32);
  return v;
}

/* Eight accumulators: one would bound the loop by the add's latency, not by memory. */
EXPORT float stream_sum(const float *restrict a, long n, int reps, int threads) {
  float total = 0.0f;
  #pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    long lo, hi, i = 0;
    share(n, &lo, &hi);
    f32x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
    for (int r = 0; r < reps; ++r)
      for (i = lo; i + 64 <= hi; i += 64) {
        s0 += load8(a + i), s1 += load8(a + i + 8), s2 += load8(a + i + 16);
        s3 += load8(a + i + 24), s4 += load8(a + i + 32), s5 += load8(a + i + 40);
        s6 += load8(a + i + 48), s7 += load8(a + i + 56);
      }
    for (; i < hi; ++i) total += a[i];
    f32x8 sum = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    for (int l = 0; l < 8; ++l) total += sum[l];
  }
  return total;
}
"""


def cache_bytes(level: int) -> int:
    """The size of this machine's level-`level` data cache as one core sees it (the L3: the
    whole shared cache), from sysfs: Target holds no cache sizes."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        kind = (index / "type").read_text().strip()
        if int((index / "level").read_text()) == level and kind != "Instruction":
            size = (index / "size").read_text().strip()
            return int(size[:-1]) * {"K": 1 << 10, "M": MIB}[size[-1]]
    raise RuntimeError(f"no L{level} cache in sysfs")


class Classes:
    """The size classes: L2 (both cores' L2), L3, DRAM; a stream array size for each."""

    def __init__(self, threads: int):
        self.l2 = cache_bytes(2) * threads
        self.l3 = cache_bytes(3)
        dram = max(64 * MIB, 2 * self.l3)
        self.array_bytes = {"L2": self.l2 // 4, "L3": self.l3 // 8, "DRAM": dram}

    def of(self, nbytes: int) -> str:
        return "L2" if nbytes <= self.l2 else "L3" if nbytes <= self.l3 else "DRAM"


def warm(fn: Callable[[], object], seconds: float = 0.05) -> None:
    """Call `fn` for `seconds` before it is timed: the OpenMP threads awake and spinning,
    the data in the caches it fits in, both sides alike."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()


def median_seconds(fn: Callable[[], object], min_calls: int = 5) -> float:
    warm(fn)
    times: list[float] = []
    while len(times) < min_calls or sum(times) < 0.05:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernel_seconds(kernel: CpuKernel, arrays: list[np.ndarray]) -> float:
    warm(lambda: kernel(*arrays))
    return kernel.time(*arrays)


class Stream:
    """STREAM_C's loops over three arrays of each size class; one call repeats a loop until
    it has moved about 64 MiB an array, so that a call into the L2 is not all overhead."""

    def __init__(self, threads: int, classes: Classes):
        self.threads = threads
        self.lib = ctypes.CDLL(str(compile_c(STREAM_C, hexir.Target("cpu"))))
        p, n, i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
        self.lib.stream_copy.argtypes = [p, p, n, i, i]
        self.lib.stream_triad.argtypes = [p, p, p, n, i, i]
        self.lib.stream_sum.argtypes = [p, n, i, i]
        self.lib.stream_sum.restype = ctypes.c_float
        self.arrays = {size: _arrays(nbytes) for size, nbytes in classes.array_bytes.items()}

    def rate_over(self, loop: str, nbytes: int) -> float:
        """GB/s of `loop` over arrays holding `nbytes` in all (copy: two arrays, in and out;
        sum: one; each is an element's float read or written): the measured bandwidth at
        exactly a kernel's size."""
        arrays = _arrays(nbytes // LOOP_FLOATS[loop])
        return self.gbps(loop, arrays, median_seconds(self.call(loop, arrays)))

    @staticmethod
    def reps(arrays: list[np.ndarray]) -> int:
        return max(1, 64 * MIB // arrays[0].nbytes)

    def call(self, loop: str, arrays: list[np.ndarray]) -> Callable[[], object]:
        a, b, c = (x.ctypes.data for x in arrays)
        n, reps, threads = arrays[0].size, self.reps(arrays), self.threads
        calls = {
            "copy": lambda: self.lib.stream_copy(a, b, n, reps, threads),
            "triad": lambda: self.lib.stream_triad(a, b, c, n, reps, threads),
            "sum": lambda: self.lib.stream_sum(a, n, reps, threads),
        }
        return calls[loop]

    def gbps(self, loop: str, arrays: list[np.ndarray], seconds: float) -> float:
        moved = LOOP_FLOATS[loop] * arrays[0].nbytes * self.reps(arrays)
        return moved / seconds / 1e9


def _arrays(nbytes: int) -> list[np.ndarray]:
    """A stream loop's three arrays, `nbytes` each."""
    return [np.full(nbytes // 4, 1.0, np.float32) for _ in range(3)]


def bandwidth_table(
    stream: Stream, threads: int, classes: Classes, rounds: int
) -> dict[tuple[str, str], float]:
    """GB/s per (loop, class), medians over rounds that alternate every loop and class."""
    keys = [(loop, size) for size in classes.array_bytes for loop in LOOPS]
    times: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
    for _ in range(rounds):
        for key in keys:
            loop, size = key
            times[key].append(median_seconds(stream.call(loop, stream.arrays[size])))
    rates = {
        (loop, size): stream.gbps(loop, stream.arrays[size], statistics.median(ts))
        for (loop, size), ts in times.items()
    }
    print(f"\nmemory bandwidth, STREAM-like loops, {threads} threads; GB/s read + written, medians")
    print(f"{'class':6} {'array MiB':>10} " + " ".join(f"{loop:>8}" for loop in LOOPS))
    for size, nbytes in classes.array_bytes.items():
        row = " ".join(f"{rates[loop, size]:8.1f}" for loop in LOOPS)
        print(f"{size:6} {nbytes / MIB:10.2f} {row}")
    return rates


def one_op_graph(op: str, x: np.ndarray) -> tuple[hexir.Graph, tuple[np.ndarray, ...]]:
    """The graph of `op` over the last axis of an input `x`, and its constant parameters."""
    builder = hexir.GraphBuilder(op)
    xv = builder.input("x", x.shape)
    params: tuple[np.ndarray, ...] = ()
    if op == "layer_norm":
        rng = np.random.default_rng(1)
        params = tuple(rng.standard_normal(x.shape[-1], dtype=np.float32) for _ in range(2))
        y = builder.layer_norm(xv, *(builder.constant(p) for p in params), epsilon=EPSILON)
    elif op == "softmax":
        y = builder.softmax(xv)
    else:
        y = builder.op(op, xv, axes=(x.ndim - 1,))
    return builder.build(y), params


def numpy_peer(op: str, x: np.ndarray, params: tuple[np.ndarray, ...]) -> Callable[[], object]:
    """`op` over x's last axis in float32 numpy, into buffers allocated here so that no
    allocation is timed; a call returns the result."""
    out = np.empty_like(x)
    m, s = (np.empty((*x.shape[:-1], 1), np.float32) for _ in range(2))

    def softmax() -> np.ndarray:
        np.exp(np.subtract(x, np.max(x, axis=-1, keepdims=True, out=m), out=out), out=out)
        return np.divide(out, np.sum(out, axis=-1, keepdims=True, out=s), out=out)

    def layer_norm() -> np.ndarray:
        np.subtract(x, np.mean(x, axis=-1, keepdims=True, out=m), out=out)
        np.einsum("...i,...i->...", out, out, out=s[..., 0])  # no temporary the size of x
        np.sqrt(np.add(np.divide(s, x.shape[-1], out=s), EPSILON, out=s), out=s)
        np.divide(out, s, out=out)
        return np.add(np.multiply(out, params[0], out=out), params[1], out=out)

    if op == "softmax":
        return softmax
    if op == "layer_norm":
        return layer_norm
    rows = np.empty(x.shape[:-1], np.float32)
    return lambda: NUMPY_REDUCE[op](x, axis=-1, out=rows)


def compiled(graph: hexir.Graph, feeds: dict[str, np.ndarray]) -> tuple[CpuKernel, list]:
    """The one kernel `hexir.compile` makes of a one-op graph, and its arguments: the feeds
    and the constants as the module holds them (laid out), then a fresh output."""
    module = hexir.compile(graph)
    (command,) = module.commands
    arrays = [feeds[n] if n in feeds else module.constants[n] for n in command.inputs]
    arrays += [np.empty(module.value_type(n).shape, np.float32) for n in command.outputs]
    return module.kernels[command.kernel], arrays


class Table:
    """The kernel rows, printed as they are measured; `beyond_l2` keeps what the bar needs."""

    HEADER = (
        f"{'':11} {'shape':>14} {'MiB':>7} {'class':>5} {'hexir ms':>9} {'GB/s':>7} "
        f"{'of bw':>6} {'bw':>5} {'numpy ms':>9} {'GB/s':>7} {'x numpy':>8} {'of size':>8}"
    )

    def __init__(self, rates: dict[tuple[str, str], float], classes: Classes, stream: Stream):
        self.rates, self.classes, self.stream = rates, classes, stream
        self.beyond_l2: list[tuple[str, float]] = []

    def row(self, op: str, shape: tuple[int, ...], nbytes: int, ours: float, numpy: float) -> None:
        size, loop = self.classes.of(nbytes), BOUND[op]
        fraction = nbytes / ours / 1e9 / self.rates[loop, size]
        name = "x".join(map(str, shape))
        here = ""
        if size != "L2":  # the bar: against the same loop over the kernel's own bytes
            at_size = nbytes / ours / 1e9 / self.stream.rate_over(loop, nbytes)
            self.beyond_l2.append((f"{op} {name}", at_size))
            here = f"{at_size:8.2f}"
        print(
            f"{op:11} {name:>14} {nbytes / MIB:7.2f} {size:>5} {ours * 1e3:9.3f} "
            f"{nbytes / ours / 1e9:7.1f} {fraction:6.2f} {loop:>5} {numpy * 1e3:9.3f} "
            f"{nbytes / numpy / 1e9:7.1f} {numpy / ours:8.2f} {here:>8}"
        )


def reductions_table(table: Table, threads: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    print(
        f"\nrow reductions, last axis, default schedules, {threads} threads (numpy: one core); "
        "GB/s of in + out"
    )
    print(Table.HEADER)
    for op, shape in ROWS:
        x = rng.standard_normal(shape, dtype=np.float32)
        graph, params = one_op_graph(op, x)
        kernel, arrays = compiled(graph, {"x": x})
        peer = numpy_peer(op, x, params)
        kernel(*arrays)
        np.testing.assert_allclose(arrays[-1], peer(), rtol=1e-3, atol=1e-4)
        ours, theirs = [], []
        for _ in range(rounds):  # alternate, so drift on a shared machine hits both
            theirs.append(median_seconds(peer))
            ours.append(kernel_seconds(kernel, arrays))
        nbytes = x.nbytes + arrays[-1].nbytes + sum(p.nbytes for p in params)
        table.row(op, shape, nbytes, statistics.median(ours), statistics.median(theirs))


def gemv_table(table: Table, threads: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    print(
        f"\ndecode GEMVs 1xK @ KxN, W constant, laid out as compiled, {threads} threads "
        "(numpy: own process); GB/s of W"
    )
    print(Table.HEADER.replace("shape", "K x N"))
    for k, n in GEMVS:
        w = rng.standard_normal((k, n), dtype=np.float32)
        builder = hexir.GraphBuilder("gemv")
        graph = builder.build(builder.matmul(builder.input("x", (1, k)), builder.constant(w)))
        x = rng.standard_normal((1, k), dtype=np.float32)
        kernel, arrays = compiled(graph, {"x": x})
        kernel(*arrays)
        # einsum, not @: OpenBLAS's threads would spin on in this process.
        expect = np.einsum("mk,kn->mn", x.astype(np.float64), w.astype(np.float64))
        np.testing.assert_allclose(arrays[-1], expect, rtol=1e-3, atol=1e-3)
        ours, theirs = [], []
        for _ in range(rounds):  # alternate, so drift on a shared machine hits both
            theirs.append(numpy_matmul_seconds(1, n, k))
            ours.append(kernel_seconds(kernel, arrays))
        table.row("matmul", (k, n), w.nbytes, statistics.median(ours), statistics.median(theirs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    threads = knobs.get().num_threads or os.cpu_count() or 1
    classes = Classes(threads)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(numpy_matmul_line())
    print(
        f"caches: L2 {cache_bytes(2) // 1024} KiB a core, L3 {classes.l3 // MIB} MiB; a "
        f"kernel's class by the bytes it moves: L2 up to {classes.l2 // 1024} KiB (both "
        f"cores), L3 up to {classes.l3 // MIB} MiB, DRAM beyond"
    )
    stream = Stream(threads, classes)
    table = Table(bandwidth_table(stream, threads, classes, args.rounds), classes, stream)
    reductions_table(table, threads, args.rounds)
    gemv_table(table, threads, args.rounds)
    below = [f"{name} {f:.2f}" for name, f in table.beyond_l2 if f < BAR]
    met = len(table.beyond_l2) - len(below)
    print(
        f"\nbar: >= {BAR:.0%} of the bandwidth measured at the kernel's size, beyond the L2: "
        f"{met} of {len(table.beyond_l2)} kernels"
        + (f"; below: {', '.join(below)}" if below else "")
    )
    print(numpy_matmul_line())


if __name__ == "__main__":
    main()
