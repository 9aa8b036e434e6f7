"""Vector math on the CPU: each function's vectorized kernel with the SIMD helpers
(hexir/codegen/c_math.py) against the scalar libm loop (the `vector_math` knob off, as
HEXIR_VECTOR_MATH=0) and numpy, side by side in one run; then dense+bias_add+gelu with its
default schedule, both ways.

    python benchmarks/math_cpu.py [--n 65536] [--rounds 5]

One core: a one-op kernel over n float32 values (in L2, so arithmetic, not memory, is
timed), its loop vectorized at the target's lanes; Gelem/s of medians, taken in rounds that
alternate the three so drift on a shared machine hits all. numpy has no erf (shown as -);
sigmoid and rsqrt in numpy are the expressions 1/(1+exp(-x)) and 1/sqrt(x). The error
column is the vector kernel's largest error in float32 ulp against float64 numpy, over
every 997th float32 bit pattern (pow: over random pairs). The dense rows use both cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

import hexir
from hexir import knobs
from hexir.ops.numeric import erf as erf64
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.kernel import CpuKernel

Ref = Callable[..., np.ndarray]


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1
    return np.reciprocal(out, out=out)


def _rsqrt(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.reciprocal(np.sqrt(x, out=out), out=out)


# numpy in float32, the peer: (inputs, out), so that no allocation is timed; in float64.
FUNCS: dict[str, tuple[Ref | None, Ref]] = {
    "exp": (np.exp, np.exp),
    "log": (np.log, np.log),
    "tanh": (np.tanh, np.tanh),
    "sigmoid": (_sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "erf": (None, lambda x: np.where(np.isfinite(x), erf64(np.nan_to_num(x)), np.sign(x))),
    "sqrt": (np.sqrt, np.sqrt),
    "rsqrt": (_rsqrt, lambda x: 1 / np.sqrt(x)),
    "power": (np.power, np.power),
}


def vectorized(op: str, n: int, vector_math: bool) -> CpuKernel:
    func = hexir.workload(op, shapes=[(n,)] * (2 if op == "power" else 1))
    sch = hexir.Schedule(func, seed=0)
    sch.vectorize(sch.get_loops(sch.get_block(op))[0])
    with knobs.scope(vector_math=vector_math):  # read where the build starts
        kernel = hexir.build(sch.func)
    assert isinstance(kernel, CpuKernel)
    return kernel


def inputs(op: str, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    if op in ("log", "sqrt", "rsqrt"):
        return [rng.uniform(1e-3, 100, n).astype(np.float32)]
    if op == "power":
        return [
            rng.uniform(0.1, 10, n).astype(np.float32),
            rng.uniform(-4, 4, n).astype(np.float32),
        ]
    return [rng.uniform(-10, 10, n).astype(np.float32)]


def numpy_seconds(fn: Ref, args: list[np.ndarray]) -> float:
    fn(*args)
    times = []
    while len(times) < 10 or sum(times) < 0.05:
        start = time.perf_counter()
        fn(*args)  # ufuncs take `out` positionally too
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ulp_error(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest |got - ref| in float32 ulp at ref (inf where inf or NaN disagree)."""
    with np.errstate(all="ignore"):
        exact = ref.astype(np.float32)
        exponent = np.maximum(np.frexp(ref)[1] - 1, -126)
        ulp = np.where(ref == 0, 2.0**-149, np.ldexp(1.0, exponent - 23))
        err = np.abs(got.astype(np.float64) - ref) / ulp
    special = ~np.isfinite(exact) | ~np.isfinite(got)
    same = (got == exact) | (np.isnan(got) & np.isnan(exact))
    return float(np.max(np.where(special, np.where(same, 0.0, np.inf), err)))


def max_error(op: str, rng: np.random.Generator) -> float:
    if op == "power":
        n = 1 << 20
        x = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
        y = rng.uniform(-30, 30, n).astype(np.float32)
        y[::2] = np.round(y[::2])
        args = [x, y]
    else:
        bits = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)[: len(bits) // 16 * 16]
        args = [x]
    kernel = vectorized(op, x.size, True)
    out = np.empty_like(x)
    kernel(*args, out)
    with np.errstate(all="ignore"):
        ref = FUNCS[op][1](*(a.astype(np.float64) for a in args))
    return ulp_error(out, ref)


def math_table(n: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    print(f"one core, {n} float32 values, lanes {hexir.Target('cpu').vector_width}; Gelem/s")
    header = f"{'function':10} {'vector':>8} {'scalar':>8} {'numpy':>8} {'x scalar':>9}"
    print(f"{header} {'x numpy':>8} {'max ulp':>8}")
    for op, (peer, _) in FUNCS.items():
        args = inputs(op, n, rng)
        out = np.empty(n, np.float32)
        kernels = {flag: vectorized(op, n, flag) for flag in (True, False)}
        seconds: dict[str, list[float]] = {"vector": [], "scalar": [], "numpy": []}
        for _ in range(rounds):
            seconds["vector"].append(kernels[True].time(*args, out))
            seconds["scalar"].append(kernels[False].time(*args, out))
            if peer is not None:
                seconds["numpy"].append(numpy_seconds(peer, [*args, out]))
        rate = {
            k: n / statistics.median(v) / 1e9 if v else float("nan") for k, v in seconds.items()
        }
        np_ratio = f"{rate['vector'] / rate['numpy']:8.2f}" if peer is not None else f"{'-':>8}"
        np_rate = f"{rate['numpy']:8.2f}" if peer is not None else f"{'-':>8}"
        print(
            f"{op:10} {rate['vector']:8.2f} {rate['scalar']:8.2f} {np_rate} "
            f"{rate['vector'] / rate['scalar']:9.1f} {np_ratio} {max_error(op, rng):8.2f}"
        )


def dense_table(rounds: int) -> None:
    rng = np.random.default_rng(0)
    shape = dict(M=128, N=3072, K=768)
    x = rng.standard_normal((128, 768), dtype=np.float32)
    w = rng.standard_normal((3072, 768), dtype=np.float32)
    b = rng.standard_normal(3072, dtype=np.float32)
    cases = {
        "dense+bias_add": (None, True),
        "dense+bias_add+gelu, vector math": ("gelu", True),
        "dense+bias_add+gelu, scalar math": ("gelu", False),
    }
    kernels = {}
    for name, (activation, flag) in cases.items():
        func = hexir.workload("dense", **shape, activation=activation)
        with knobs.scope(vector_math=flag):
            kernels[name] = hexir.build(default_schedule(func, "cpu").func)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            out = np.empty((128, 3072), np.float32)  # fresh memory each round
            times[name].append(kernel.time(x, w, b, out))
    threads = knobs.get().num_threads or os.cpu_count()
    print(f"\ndense {shape}, default schedule, {threads} threads; medians")
    base = statistics.median(times["dense+bias_add"])
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        print(f"{name:36} {ms:8.3f} ms  {ms / base / 1e3:5.2f}x dense+bias_add")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    math_table(args.n, args.rounds)
    dense_table(args.rounds)


if __name__ == "__main__":
    main()
