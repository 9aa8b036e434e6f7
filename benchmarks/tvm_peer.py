"""TVM's MetaSchedule on one of tune_cpu.py's workloads, at a given number of trials: the peer
that `python benchmarks/tune_cpu.py --peer tvm` runs beside Hexir's tune.

    /work/tvmvenv/bin/python benchmarks/tvm_peer.py matmul [--trials 64] [--work-dir DIR]
                                                          [--threads 2] [--small]

It writes the workload in TE (matmul 1024^3; dense 512x1024x1024 + bias + relu; conv2d
1x64x56x56 with 64 3x3 filters, padding 1; conv2d_res, that conv + bias[k] + r, then relu),
tunes it for this CPU with MetaSchedule's defaults (XGBoost model, evolutionary search) and
at most `--trials` measured candidates, compiles the database's best schedule, checks it
against numpy on random inputs and prints one JSON line:

    {"workload": "matmul", "trials": 64, "measured": 64, "threads": 2, "tuned_ms": 7.1,
     "tune_seconds": 95.0, "tvm": "0.27.0.post1"}

"measured" counts the candidates that built and ran. The kernel runs on `--threads` threads
(default: every CPU; TVM's own default is half of them on x86, for hyper-threading), set
through TVM_NUM_THREADS before anything runs, so the tuning workers inherit it. `--small`
shrinks every dimension 4x (8x for matmul's), for a quick check of the plumbing.

It does not import hexir, so it runs in whichever Python has TVM (`pip install
'hexir[peers]'`: apache-tvm 0.27.0.post1 with apache-tvm-ffi 0.1.14.post1, as a newer ffi
crashes, and psutil and cloudpickle, which MetaSchedule's workers import).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import tvm
from numpy.lib.stride_tricks import sliding_window_view
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.target import codegen

# Each workload: TE builder over its sizes, and numpy's reference over the inputs.
SIZES = {
    "matmul": dict(M=1024, N=1024, K=1024),
    "dense": dict(M=512, N=1024, K=1024),
    "conv2d": dict(C=64, H=56, W=56, K=64),
    "conv2d_res": dict(C=64, H=56, W=56, K=64),
}


def matmul(M: int, N: int, K: int) -> list[te.Tensor]:
    a, b = te.placeholder((M, K), name="A"), te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    c = te.compute((M, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return [a, b, c]


def dense(M: int, N: int, K: int) -> list[te.Tensor]:
    x, w = te.placeholder((M, K), name="x"), te.placeholder((N, K), name="w")
    bias = te.placeholder((N,), name="bias")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="y")
    out = te.compute((M, N), lambda i, j: te.max(y[i, j] + bias[j], 0.0), name="out")
    return [x, w, bias, out]


def conv(C: int, H: int, W: int, K: int) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    """x (1, C, H, W) conv w (K, C, 3, 3), padding 1, stride 1."""
    x, w = te.placeholder((1, C, H, W), name="x"), te.placeholder((K, C, 3, 3), name="w")
    inside = lambda h, v: tvm.tirx.all(h >= 1, h <= H, v >= 1, v <= W)  # noqa: E731
    pad = te.compute(
        (1, C, H + 2, W + 2),
        lambda n, c, h, v: tvm.tirx.if_then_else(inside(h, v), x[n, c, h - 1, v - 1], 0.0),
        name="pad",
    )
    c, r, s = (te.reduce_axis((0, e), name=n) for n, e in (("c", C), ("r", 3), ("s", 3)))
    out = te.compute(
        (1, K, H, W),
        lambda n, k, h, v: te.sum(pad[n, c, h + r, v + s] * w[k, c, r, s], axis=[c, r, s]),
        name="conv",
    )
    return x, w, out


def conv2d(C: int, H: int, W: int, K: int) -> list[te.Tensor]:
    return list(conv(C, H, W, K))


def conv2d_res(C: int, H: int, W: int, K: int) -> list[te.Tensor]:
    x, w, y = conv(C, H, W, K)
    bias, r = te.placeholder((K,), name="bias"), te.placeholder((1, K, H, W), name="r")
    out = te.compute(
        (1, K, H, W),
        lambda n, k, h, v: te.max(y[n, k, h, v] + bias[k] + r[n, k, h, v], 0.0),
        name="out",
    )
    return [x, w, bias, r, out]


def numpy_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = sliding_window_view(p, (3, 3), axis=(2, 3))  # N, C, H, W, R, S
    return np.einsum("nchwrs,kcrs->nkhw", cols, w)


REFERENCE = {
    "matmul": lambda a, b: a @ b,
    "dense": lambda x, w, bias: np.maximum(x @ w.T + bias, 0),
    "conv2d": numpy_conv,
    "conv2d_res": lambda x, w, bias, r: np.maximum(
        numpy_conv(x, w) + bias[None, :, None, None] + r, 0
    ),
}
BUILD = {"matmul": matmul, "dense": dense, "conv2d": conv2d, "conv2d_res": conv2d_res}


def host_target(threads: int) -> tvm.target.Target:
    # 0.27 takes no "llvm -mcpu=native" string, and its LLVM refuses "native" under the
    # wheel's conda triple (falls back to generic, no AVX): name the host CPU instead.
    cpu = codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": threads})


def import_intrinsics() -> None:
    """Each build worker's first step, outside the builder's 30 s timeout: MetaSchedule's
    default build imports TVM's tensor intrinsics (20 s on a loaded 2-core machine), which
    made a build time out, and the candidate count as failed."""
    import tvm.s_tir.tensor_intrin  # noqa: F401


def tune(name: str, trials: int, work_dir: str, small: bool, threads: int) -> dict:
    sizes = SIZES[name]
    if small:
        sizes = {k: v // (8 if name == "matmul" else 4) for k, v in sizes.items()}
    tensors = BUILD[name](**sizes)
    func = te.create_prim_func(tensors).with_attr("global_symbol", "main")
    target = host_target(threads)
    start = time.perf_counter()
    db = ms.tir_integration.tune_tir(
        func, target, work_dir, max_trials_global=trials,
        num_trials_per_iter=min(64, trials), seed=0,
        builder=ms.builder.LocalBuilder(initializer=import_intrinsics),
    )  # fmt: skip
    tune_seconds = time.perf_counter() - start
    sch = ms.tir_integration.compile_tir(db, func, target)
    if sch is None:
        raise SystemExit(f"{name}: no valid schedule in {trials} trials (see {work_dir}/logs)")
    kernel = tvm.compile(sch.mod, target=target).jit()
    return {
        "workload": name,
        "trials": trials,
        "measured": sum(valid(r) for r in db.get_all_tuning_records()),
        "threads": tvm.runtime.num_threads(),
        "tuned_ms": round(check_and_time(name, kernel, tensors) * 1e3, 4),
        "tune_seconds": round(tune_seconds, 1),
        "tvm": tvm.__version__,
    }


def valid(record: ms.database.TuningRecord) -> bool:
    """Whether a record was built and run (MetaSchedule records failures as 1e10 s)."""
    return bool(record.run_secs) and max(float(t) for t in record.run_secs) < 1e9


def check_and_time(name: str, kernel: tvm.runtime.Module, tensors: list[te.Tensor]) -> float:
    """Check `kernel` against numpy on random inputs; its median seconds."""
    rng = np.random.default_rng(0)
    shapes = [tuple(int(d) for d in t.shape) for t in tensors]
    ins = [rng.standard_normal(s, dtype=np.float32) for s in shapes[:-1]]
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, dtype=np.float32), dev)
    args = [tvm.runtime.tensor(a, dev) for a in ins] + [out]
    kernel(*args)
    expect = REFERENCE[name](*(a.astype(np.float64) for a in ins))
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-3, atol=1e-3)
    timer = kernel.time_evaluator(kernel.entry_name, dev, number=1, repeat=10, min_repeat_ms=100)
    return timer(*args).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(BUILD))
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--work-dir", help="MetaSchedule's logs and database (default: a temp)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--small", action="store_true", help="shrunk shapes, for a quick check")
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory(prefix="hexir-tvm-peer-") as tmp:
        work_dir = args.work_dir or tmp
        print(json.dumps(tune(args.workload, args.trials, work_dir, args.small, args.threads)))


if __name__ == "__main__":
    main()
