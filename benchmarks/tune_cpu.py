"""Tuning on the CPU: matmul, dense+bias+relu, conv2d and ResNet-18's residual conv tuned by
`hexir.tune`, against numpy.

    python benchmarks/tune_cpu.py [--trials 200] [--workloads matmul,dense,conv2d,conv2d_res]
                                  [--compare-models | --compare-only] [--compare-trials 100]
                                  [--seeds 3] [--peer tvm [--tvm-python PATH]]

Each workload is tuned from an empty database (a fresh SQLite file) with the XGBoost model,
then its best kernel is timed beside numpy in one run: numpy in subprocesses (the environment
as it is, and with OpenBLAS's AVX2 "Haswell" and AVX-512 "SkylakeX" kernels; conv2d as
im2col + matmul), the unscheduled kernel, the default schedule, and the tuned kernel; the
last two by single calls taken in turn, `--rounds` times a second, so that the host's shifts
of speed hit both, and the tuned kernel's gain is the median of the pairs' ratios. The
tuning wall time is split into the search's own time (sampling, mutation, features,
prediction, model updates), building, measuring and the database, in all and per trial. The
tunes build into an empty kernel cache (a fresh HEXIR_CACHE_DIR), as a first tune does.

With --compare-models it also tunes matmul and dense with the random model and with XGBoost,
`--compare-trials` trials each, for `--seeds` seeds, and prints the best latencies and their
medians; there the default schedule is not measured, so that the search alone is compared.
Bars (ISSUE 6): tuned matmul and dense >= 0.8x numpy's default environment; XGBoost beats
random on the median; the search's time below building + measuring.

With --peer tvm each workload is also tuned by TVM's MetaSchedule at the same trials, after
Hexir's tune: `benchmarks/tvm_peer.py` in a subprocess of `--tvm-python` (default: the Python
of /work/tvmvenv where it exists, else this one; `pip install 'hexir[peers]'`), on as many
threads as Hexir's kernels. Its tuned kernel (timed in its own process) is a row of the table,
with its latency over Hexir's tuned one and its tuning wall time per trial; where that Python
cannot import TVM, the run says so and carries on without it. TVM / hexir above 1: Hexir's
kernel is the faster.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import hexir
from hexir import knobs
from hexir.costmodel import RandomModel, XGBModel
from hexir.ir.analysis import flop_count
from hexir.ir.arrays import aligned_copy
from hexir.runtime.default_schedule import default_schedule
from hexir.search.tune import TuneResult, tune

sys.path.insert(0, str(Path(__file__).parent))
from quiet import has_avx512, in_turn  # noqa: E402 - benchmarks/ on the path first

COMMON = """
import time, statistics, numpy as np
rng = np.random.default_rng(1)
def bench(f):
    f(); f()
    times = []
    while len(times) < 10 or sum(times) < 0.3:
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    print(statistics.median(times))
"""

PEERS = {
    "matmul": """
a = rng.standard_normal((1024, 1024), dtype=np.float32)
b = rng.standard_normal((1024, 1024), dtype=np.float32)
bench(lambda: a @ b)
""",
    "dense": """
x = rng.standard_normal((512, 1024), dtype=np.float32)
w = rng.standard_normal((1024, 1024), dtype=np.float32)
bias = rng.standard_normal(1024, dtype=np.float32)
bench(lambda: np.maximum(x @ w.T + bias, 0))
""",
    "conv2d": """
from numpy.lib.stride_tricks import sliding_window_view
x = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32).reshape(64, -1)
def conv():
    p = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    cols = sliding_window_view(p, (3, 3), axis=(1, 2))          # C, H, W, R, S
    cols = np.ascontiguousarray(cols.transpose(0, 3, 4, 1, 2)).reshape(64 * 9, 56 * 56)
    return w @ cols
bench(conv)
""",
}
# ResNet-18's residual conv: the conv as above, then its bias, the shortcut and relu.
PEERS["conv2d_res"] = PEERS["conv2d"].replace(
    "bench(conv)",
    """bias = rng.standard_normal((64, 1), dtype=np.float32)
r = rng.standard_normal((64, 56 * 56), dtype=np.float32)
bench(lambda: np.maximum(conv() + bias + r, 0))""",
)


WIDTH = {"Haswell": "AVX2", "SkylakeX": "AVX-512"}
TVM_VENV_PYTHON = Path("/work/tvmvenv/bin/python")
# Seconds of the default and the tuned kernel's calls in turn, each round (`alternated_times`).
ALTERNATED_SECONDS = 1.0


@dataclass(frozen=True)
class Workload:
    name: str
    func: hexir.PrimFunc
    flops: int


def workloads() -> dict[str, Workload]:
    funcs = {
        "matmul": hexir.workload("matmul", M=1024, N=1024, K=1024),
        "dense": hexir.workload("dense", M=512, N=1024, K=1024, activation="relu"),
        "conv2d": hexir.workload("conv2d", N=1, C=64, H=56, W=56, K=64, R=3, S=3, padding=1),
        "conv2d_res": residual_conv(),
    }
    return {name: Workload(name, f, flop_count(f)) for name, f in funcs.items()}


def residual_conv() -> hexir.PrimFunc:
    """The direct conv kernel of relu(conv(x, w) + bias + r), 1x64x56x56 with 64 3x3 filters,
    as `hexir.compile` fuses it (its weight blocked by the vector width); on a CPU where
    the 3x3 conv's rule is Winograd, it is the conv's other form."""
    from hexir.ops.builder import GraphBuilder
    from hexir.search.scheduler import extract_tasks

    rng = np.random.default_rng(0)
    b = GraphBuilder("residual")
    x, r = b.input("x", (1, 64, 56, 56)), b.input("r", (1, 64, 56, 56))
    w = b.constant(rng.standard_normal((64, 64, 3, 3), dtype=np.float32), name="w")
    bias = b.constant(rng.standard_normal(64, dtype=np.float32), name="bias")
    graph = b.build(b.relu(b.add(b.bias_add(b.conv2d(x, w, padding=1), bias, axis=1), r)))
    (task,) = (t for t in extract_tasks(graph, "cpu") if t.name.startswith("fused_conv2d"))
    return task.func


def numpy_subprocess(name: str, coretype: str | None = None) -> float:
    """numpy's median seconds in a fresh process (OpenBLAS's spinning threads would slow
    whatever runs next in this one); with OPENBLAS_CORETYPE set when `coretype` is given."""
    env = dict(os.environ)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    code = COMMON + PEERS[name]
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


class TimedModel:
    """A cost model that times its feature extraction apart from its predictions."""

    def __init__(self, inner: XGBModel | RandomModel) -> None:
        self.inner = inner
        self.features_seconds = 0.0

    @property
    def informed(self) -> bool:
        return getattr(self.inner, "informed", True)

    def predict(self, candidates):  # noqa: ANN001, ANN201 - the CostModel protocol
        features = getattr(self.inner, "features", None)
        if features is not None and getattr(self.inner, "booster", None) is not None:
            start = time.perf_counter()
            features(candidates)  # cached by candidate key: predict then reuses the rows
            self.features_seconds += time.perf_counter() - start
        return self.inner.predict(candidates)

    def update(self, candidates, results) -> None:  # noqa: ANN001
        self.inner.update(candidates, results)


def fresh_db(folder: Path, name: str) -> str:
    return f"sqlite:///{folder / (name + '.db')}"


def inputs(func: hexir.PrimFunc) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(p.shape).astype(p.dtype) for p in func.params]


def kernel_time(func: hexir.PrimFunc, args: list[np.ndarray], once: bool = False) -> float:
    """Median seconds of `func`'s kernel on fresh copies of `args`, each starting on a 64-byte
    boundary as a model's buffers and the tuner's inputs do (numpy's own large arrays start
    16 bytes into a page, and a kernel's 512-bit loads of them split cache lines)."""
    kernel = hexir.build(func, "cpu")
    copies = [aligned_copy(a) for a in args]
    if once:
        with knobs.scope(timing_warmup=0, timing_repeats=1, timing_min_seconds=0.0):
            return kernel.time(*copies)
    return kernel.time(*copies)


def alternated_times(
    funcs: list[hexir.PrimFunc], args: list[np.ndarray], seconds: float
) -> list[list[float]]:
    """Single calls of each of `funcs`' kernels in turn (`quiet.in_turn`), for about `seconds`
    in all, after one warm-up call each: their times, one list per kernel."""
    kernels = [hexir.build(f, "cpu") for f in funcs]
    copies = [aligned_copy(a) for a in args]
    timers = [functools.partial(k.time, *copies) for k in kernels]
    with knobs.scope(timing_warmup=0, timing_repeats=1, timing_min_seconds=0.0):
        return in_turn(timers, warmup=1, seconds=seconds)


def check(func: hexir.PrimFunc, workload: hexir.PrimFunc, args: list[np.ndarray]) -> None:
    n_out = workload.num_outputs
    expect = hexir.reference(workload, args[:-n_out])
    out = [np.full_like(a, np.nan) for a in args[-n_out:]]
    hexir.build(func, "cpu")(*args[:-n_out], *out)
    for o, e in zip(out, expect, strict=True):
        np.testing.assert_allclose(o, e, rtol=1e-3, atol=1e-3)


def tune_one(w: Workload, trials: int, folder: Path, seed: int, model) -> tuple[TuneResult, float]:  # noqa: ANN001
    """Tune `w` into a fresh database, its kernels built into an empty cache."""
    cache = folder / f"cache-{w.name}-{seed}"
    start = time.perf_counter()
    with knobs.scope(cache_dir=str(cache)):
        result = tune(w.func, "cpu", trials=trials, database=fresh_db(folder, w.name),
                      seed=seed, model=model)  # fmt: skip
    return result, time.perf_counter() - start


@dataclass(frozen=True)
class Outcome:
    """A workload's figures: the tuned kernel's speed over numpy's default environment's and
    over its default schedule's (paired calls), the tune's seconds per trial, TVM's result."""

    vs_numpy: float
    vs_default: float
    seconds_per_trial: float
    peer: dict | None


def report_workload(
    w: Workload, trials: int, folder: Path, seed: int, rounds: int, tvm_python: str | None
) -> Outcome:
    """Tune `w` (and with `tvm_python`, have TVM tune it), print its table; its Outcome."""
    model = TimedModel(XGBModel(seed=seed))
    result, wall = tune_one(w, trials, folder, seed, model)
    (task,) = result.tasks
    assert task.best_trace is not None, f"{w.name}: no valid candidate in {trials} trials"
    tuned = task.best_trace.apply(w.func).func
    args = inputs(w.func)
    check(tuned, w.func, args)
    peer = tvm_tune(w.name, trials, tvm_python, folder) if tvm_python else None
    # OpenBLAS's AVX-512 kernel dies of SIGILL on a CPU without AVX-512.
    coretypes = ("Haswell", "SkylakeX") if has_avx512() else ("Haswell",)
    peers = {t: numpy_subprocess(w.name, t) for t in coretypes}
    default = default_schedule(w.func, "cpu").func
    numpy_times, default_times, tuned_times = [], [], []
    for _ in range(rounds):  # alternate, so drift on a shared machine hits all three
        numpy_times.append(numpy_subprocess(w.name))
        d, t = alternated_times([default, tuned], args, ALTERNATED_SECONDS)
        default_times += d
        tuned_times += t
    # The gain: the median of each call pair's ratio, both taken within a millisecond or so.
    gain = statistics.median(d / t for d, t in zip(default_times, tuned_times, strict=True))
    rows = {
        "numpy, default environment": statistics.median(numpy_times),
        **{f"numpy, OPENBLAS_CORETYPE={t} ({WIDTH[t]})": peers[t] for t in coretypes},
        "hexir, unscheduled": kernel_time(w.func, args, once=True),
        "hexir, default schedule": statistics.median(default_times),
        f"hexir, tuned ({result.trials} trials)": statistics.median(tuned_times),
    }
    if peer is not None:
        rows[f"TVM MetaSchedule, tuned ({peer['trials']} trials)"] = peer["tuned_ms"] / 1e3
    print_table(w, rows)
    print(f"tuned over default: {gain:.3f}x faster (the median of {len(tuned_times)} pairs of "
          "calls, taken in turn)")  # fmt: skip
    print_split(result, wall, model.features_seconds)
    hexir_tuned = rows[f"hexir, tuned ({result.trials} trials)"]
    if peer is not None:
        peer["vs_hexir"] = peer["tuned_ms"] / 1e3 / hexir_tuned
        print_peer(peer, wall / result.trials)
    vs_numpy = rows["numpy, default environment"] / hexir_tuned
    return Outcome(vs_numpy, gain, wall / result.trials, peer)


def tvm_importable(python: str) -> bool:
    """Whether `python` has TVM and what MetaSchedule's workers import lazily."""
    probe = [python, "-c", "import tvm.s_tir.meta_schedule, psutil, cloudpickle, xgboost"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def tvm_tune(name: str, trials: int, python: str, folder: Path) -> dict | None:
    """TVM's MetaSchedule on `name` at `trials` trials (benchmarks/tvm_peer.py's JSON line), on
    as many threads as Hexir's kernels; None, with its log's tail printed, where it fails."""
    threads = knobs.get().num_threads or os.cpu_count()
    script = Path(__file__).parent / "tvm_peer.py"
    command = [python, str(script), name, "--trials", str(trials), "--threads", str(threads),
               "--work-dir", str(folder / f"tvm-{name}")]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stdout + out.stderr).strip().splitlines()[-15:]
        print(f"TVM failed on {name} ({' '.join(command)}):\n" + "\n".join(tail))
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_peer(peer: dict, hexir_per_trial: float) -> None:
    print(
        f"TVM {peer['tvm']} / hexir tuned latency: {peer['vs_hexir']:.2f}; TVM tuning "
        f"{peer['tune_seconds']:.0f} s, {peer['tune_seconds'] / peer['trials']:.2f} s per trial "
        f"(hexir {hexir_per_trial:.2f}), {peer['measured']} of {peer['trials']} candidates valid"
    )


def print_table(w: Workload, rows: dict[str, float]) -> None:
    base = w.flops / rows["numpy, default environment"] / 1e9
    widest = "SkylakeX" if has_avx512() else "Haswell"
    best = w.flops / rows[f"numpy, OPENBLAS_CORETYPE={widest} ({WIDTH[widest]})"] / 1e9
    threads = knobs.get().num_threads or os.cpu_count()
    print(f"\n{w.name}: {w.func.name} {[p.shape for p in w.func.params]}, {threads} threads")
    print(f"{'':46} {'ms':>9} {'GFLOP/s':>9} {'x numpy':>8} {'x ' + WIDTH[widest]:>10}")
    for name, seconds in rows.items():
        g = w.flops / seconds / 1e9
        print(f"{name:46} {seconds * 1e3:9.2f} {g:9.1f} {g / base:8.2f} {g / best:10.2f}")


def print_split(result: TuneResult, wall: float, features: float) -> None:
    p = result.profile
    search = p["sampling"] + p["mutation"] + p["prediction"] + p["model_update"]
    measure = p["building"] + p["measuring"]
    print(
        f"tuning {wall:.0f} s: search {search:.0f} s (sampling {p['sampling']:.0f}, mutation "
        f"{p['mutation']:.0f}, features {features:.0f}, prediction "
        f"{p['prediction'] - features:.0f}, model updates {p['model_update']:.0f}), building "
        f"{p['building']:.0f} s, measuring {p['measuring']:.0f} s, database "
        f"{p['database']:.0f} s; search / (building + measuring) = {search / measure:.2f}"
    )
    n = result.trials
    other = wall - search - measure - p["database"]
    print(
        f"per trial: {wall / n:.2f} s (search {search / n:.2f}, building "
        f"{p['building'] / n:.2f}, measuring {p['measuring'] / n:.2f}, other {other / n:.2f})"
    )


def compare_models(ws: list[Workload], trials: int, seeds: int, folder: Path) -> None:
    """Best latency after `trials` trials, random model against XGBoost, per seed."""
    print(f"\ncost models, {trials} trials each, best latency in ms")
    print(f"{'':10} {'model':8} " + " ".join(f"{'seed ' + str(s):>9}" for s in range(seeds))
          + f" {'median':>9}")  # fmt: skip
    for w in ws:
        medians = {}
        for label, make in (("random", RandomModel), ("xgboost", XGBModel)):
            best = []
            for seed in range(seeds):
                sub = folder / f"{w.name}-{label}-{seed}"
                sub.mkdir()
                # The search alone: the default schedule (measured first in a real tune, and as
                # good as the search's best on matmul) would make both models tie.
                with knobs.scope(tune_measure_default=False):
                    result, _ = tune_one(w, trials, sub, seed, make(seed=seed))
                best.append(result.tasks[0].best_latency or float("inf"))
            medians[label] = statistics.median(best)
            cells = " ".join(f"{b * 1e3:9.3f}" for b in best)
            print(f"{w.name:10} {label:8} {cells} {medians[label] * 1e3:9.3f}")
        verdict = "beats" if medians["xgboost"] < medians["random"] else "does NOT beat"
        print(f"{w.name}: XGBoost {verdict} random on the median")


def print_peer_summary(done: dict[str, Outcome]) -> None:
    """TVM's latency over Hexir's tuned one (above 1: Hexir's kernel is faster), and TVM's
    tuning seconds per trial."""
    peers = {n: o.peer for n, o in done.items() if o.peer is not None}
    if not peers:
        return
    ratios = ", ".join(f"{n} {p['vs_hexir']:.2f}" for n, p in peers.items())
    pace = ", ".join(f"{n} {p['tune_seconds'] / p['trials']:.2f}" for n, p in peers.items())
    print(f"TVM / hexir tuned latency: {ratios}; TVM seconds per trial: {pace}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--workloads", default="matmul,dense,conv2d,conv2d_res")
    parser.add_argument("--compare-models", action="store_true")
    parser.add_argument("--compare-only", action="store_true", help="skip the tuning tables")
    parser.add_argument("--compare-trials", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer", choices=["tvm"], help="also tune with TVM's MetaSchedule")
    default_tvm = TVM_VENV_PYTHON if TVM_VENV_PYTHON.exists() else Path(sys.executable)
    parser.add_argument("--tvm-python", default=str(default_tvm), help="a Python with TVM")
    args = parser.parse_args()
    tvm_python = args.tvm_python if args.peer == "tvm" else None
    if tvm_python is not None and not tvm_importable(tvm_python):
        print(f"TVM is not importable by {tvm_python}: pip install 'hexir[peers]' (or give "
              "--tvm-python a Python that has it); carrying on without TVM")  # fmt: skip
        tvm_python = None
    all_workloads = workloads()
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in all_workloads]
    if unknown:
        parser.error(
            f"unknown workload {', '.join(unknown)}: choose from {', '.join(all_workloads)}"
        )
    chosen = [all_workloads[n] for n in names]
    with tempfile.TemporaryDirectory(prefix="hexir-tune-bench-") as tmp:
        folder = Path(tmp)
        if not args.compare_only:
            done = {w.name: report_workload(w, args.trials, folder, args.seed, args.rounds,
                                            tvm_python)
                    for w in chosen}  # fmt: skip
            print("\nx numpy (default environment): "
                  + ", ".join(f"{n} {o.vs_numpy:.2f}" for n, o in done.items()))  # fmt: skip
            print("tuned over default (paired calls): "
                  + ", ".join(f"{n} {o.vs_default:.3f}" for n, o in done.items()))  # fmt: skip
            pace = {n: o.seconds_per_trial for n, o in done.items()}
            print("seconds per trial: " + ", ".join(f"{n} {s:.2f}" for n, s in pace.items())
                  + f"; median {statistics.median(pace.values()):.2f}")  # fmt: skip
            print_peer_summary(done)
        if args.compare_models or args.compare_only:
            compare = [w for w in chosen if w.name in ("matmul", "dense")]
            compare_models(compare, args.compare_trials, args.seeds, folder)


if __name__ == "__main__":
    main()
