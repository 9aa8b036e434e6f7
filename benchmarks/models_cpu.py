"""Whole models on the CPU: Hexir (default schedules, and tuned) against ONNX Runtime running
Hexir's own ONNX export of the very same model and weights, side by side in one run.

    python benchmarks/models_cpu.py --trials 600 [--db URL] [--models resnet18 gpt2]
    python benchmarks/models_cpu.py --trials 0          # no tuning: default schedules only

For each model (default: resnet18, resnet50, mobilenet-v2, mlp, bert-base, vit, gpt2,
gpt2-decode; `--models gpt2-small gpt2-small-decode` adds the whole GPT-2 small, 124M
parameters) it prints two tables:

- kernels and peak intermediate memory, with and without fusion and with and without memory
  planning (unplanned: every intermediate in a buffer of its own, their sum);
- end-to-end latency (median over `--rounds` rounds that alternate the peer and Hexir, each
  a median of repeats; batch 1 / one sequence) of Hexir with default
  schedules, Hexir with the database's best schedules (the two builds run in turn, a run of
  each at a time, and "tuned x default" is the median of those pairs' ratios, which the
  host's shifts of speed hit alike), and ONNX Runtime (CPU provider, 2
  intra-op threads, all graph optimizations) running `hexir.export_onnx` of the same graph,
  whose outputs are compared with Hexir's; ratios are ONNX Runtime's time over Hexir's (above
  1: Hexir is faster).

Tuning happens once: the database (default sqlite:///tuning_logs/hexir.db) is reused across
runs, and a model is tuned only for the trials it lacks there (`--trials N` means N trials of
that model's tasks in the database). ONNX Runtime is timed in a subprocess of its own, first,
because a runtime's spinning worker threads slow whatever is timed next (PERFORMANCE.md).
Needs `pip install onnxruntime` (the `bench` extra). numpy's matmul 1024^3 is printed first
and last (benchmarks/quiet.py): quote a run only when both are at the machine's quiet level.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from quiet import in_turn, numpy_matmul_line

import hexir
from hexir import knobs
from hexir.runtime.profile import run_seconds

MODELS = ("resnet18", "resnet50", "mobilenet-v2", "mlp", "bert-base", "vit", "gpt2", "gpt2-decode")
# The whole GPT-2 small (124M parameters, 500 MB of weights, a 500 MB ONNX file for the peer):
# on request, not by default.
LARGE = ("gpt2-small", "gpt2-small-decode")
MIB = 1024 * 1024
THREADS = 2


@dataclass(frozen=True)
class Memory:
    kernels: int
    planned: int  # bytes of the planned pool
    unplanned: int  # bytes: every intermediate in its own buffer


@dataclass(frozen=True)
class Latency:
    default: float
    tuned: float | None
    trials: int
    onnxruntime: float | None
    max_error: float | None  # largest |hexir - onnxruntime| over the outputs, relative
    gain: float | None  # the tuned build over the default one: the median of paired runs' ratios


def memory(graph: hexir.Graph, fusion: bool) -> Memory:
    from hexir.graph.fusion import fused_kernels
    from hexir.runtime.executor import plan_graph

    with knobs.scope(fusion=fusion):
        plan = plan_graph(graph)
        kernels = len(fused_kernels(graph)[1])  # what compile builds: views are no kernels
    return Memory(kernels, plan.peak_bytes, plan.total_bytes)


def inputs_of(graph: hexir.Graph, seed: int = 0) -> list[np.ndarray]:
    """Activations in [-1, 1], token ids among the first thousand."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 1000, v.type.shape)
        if v.type.dtype == "int64"
        else rng.uniform(-1, 1, v.type.shape).astype("float32")
        for v in graph.inputs
    ]


def time_module(module, inputs: list[np.ndarray], min_seconds: float = 1.0) -> float:
    """Median seconds of `module.run(inputs)`: at least 10 runs and `min_seconds`, after 3."""
    (times,) = in_turn([run_timer(module, inputs)], warmup=3, seconds=min_seconds)
    return statistics.median(times)


def run_timer(module, inputs: list[np.ndarray]):  # noqa: ANN001, ANN201
    """A timer of one `module.run(inputs)` (for `quiet.in_turn`)."""
    return functools.partial(run_seconds, module, inputs)


def tuned_trials(graph: hexir.Graph, db, target: hexir.Target) -> int:
    """Records of the model's tasks on the target in the database."""
    from hexir.search.scheduler import extract_tasks

    return sum(len(db.records(t.workload_key, target)) for t in extract_tasks(graph, target))


def tune_to(graph: hexir.Graph, db, target: hexir.Target, trials: int, seed: int) -> int:
    """Tune until the database holds `trials` records of the model's tasks; how many it holds."""
    from hexir.search.tune import tune

    have = tuned_trials(graph, db, target)
    if trials > have:
        print(f"  tuning: {trials - have} more trials (the database has {have})", flush=True)
        tune(graph, target, trials=trials - have, database=db, seed=seed, ray_address=None)
    return tuned_trials(graph, db, target)


ORT_CHILD = """
import json, statistics, sys, time
import numpy as np, onnxruntime as ort
model, inputs, outputs, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
options = ort.SessionOptions()
options.intra_op_num_threads = threads
options.inter_op_num_threads = 1
options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
with np.load(inputs) as f:
    feed = {i.name: f[i.name] for i in session.get_inputs()}
for _ in range(3):
    result = session.run(None, feed)
times, total = [], 0.0
while len(times) < 10 or total < 1.0:
    t = time.perf_counter(); session.run(None, feed); times.append(time.perf_counter() - t)
    total += times[-1]
np.savez(outputs, *result)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
memory = {k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM") if k in status}
print(json.dumps({"seconds": statistics.median(times), "version": ort.__version__, **memory}))
"""


def onnxruntime_run(
    graph: hexir.Graph, inputs: list[np.ndarray], folder: Path
) -> tuple[float, list[np.ndarray], str] | None:
    """ONNX Runtime's median seconds, outputs and version on Hexir's export of `graph`, in a
    subprocess; None where onnxruntime is not installed."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    model, feed = folder / "model.onnx", folder / "inputs.npz"
    hexir.export_onnx(graph, model)
    save_feed(graph, inputs, feed)
    return onnxruntime_file(model, feed, folder)


def save_feed(graph: hexir.Graph, inputs: list[np.ndarray], path: Path) -> None:
    """`inputs` as an .npz by the graph's input names, the names of its ONNX export."""
    np.savez(path, **{v.name: a for v, a in zip(graph.inputs, inputs, strict=True)})  # type: ignore[arg-type]


def onnxruntime_file(model: Path, feed: Path, folder: Path) -> tuple[float, list[np.ndarray], str]:
    """ONNX Runtime's median seconds, outputs and version on an ONNX file, fed the arrays of
    the .npz `feed` by input name, in a subprocess (its outputs written into `folder`)."""
    info, outputs = onnxruntime_info(model, feed, folder)
    return float(info["seconds"]), outputs, str(info["version"])


def onnxruntime_info(model: Path, feed: Path, folder: Path) -> tuple[dict, list[np.ndarray]]:
    """As `onnxruntime_file`, the child's report whole: its seconds, version, and its resident
    memory in MiB after the runs (VmRSS) and at its peak (VmHWM), where Linux reports them."""
    out = folder / f"{model.stem}.outputs.npz"
    done = subprocess.run(
        [sys.executable, "-c", ORT_CHILD, str(model), str(feed), str(out), str(THREADS)],
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(out) as f:
        outputs = [f[f"arr_{i}"] for i in range(len(f.files))]
    return info, outputs


def relative_error(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """The largest |ours - theirs| over the outputs, relative to the largest |theirs|."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        scale = max(float(np.abs(b).max(initial=0.0)), 1e-30)
        worst = max(worst, float(np.abs(a.astype(np.float64) - b).max(initial=0.0)) / scale)
    return worst


def bench_model(name: str, args: argparse.Namespace, db) -> tuple[Memory, Memory, Latency, str]:
    target = hexir.Target("cpu")
    graph = hexir.load_model(name)
    fused, unfused = memory(graph, True), memory(graph, False)
    inputs = inputs_of(graph)
    trials = tune_to(graph, db, target, args.trials, args.seed) if args.trials else 0
    if not args.trials:
        trials = tuned_trials(graph, db, target)
    default = hexir.compile(graph, target)
    tuned = hexir.compile(graph, target, database=db) if trials else None
    outputs = [default.run(inputs)] + ([tuned.run(inputs)] if tuned else [])
    # Rounds alternate the peer and Hexir, so that a noisy spell hits both; medians. The two
    # builds run in turn, one run each at a time, and the gain is the median of the pairs'.
    ort_s: list[float] = []
    pairs: list[float] = []
    default_s: list[float] = []
    tuned_s: list[float] = []
    ort = None
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            ort = onnxruntime_run(graph, inputs, Path(tmp))
        if ort:
            ort_s.append(ort[0])
        if tuned:
            # Runs in turn: a ResNet-18 default build read 8.4 to 16.5 ms in one sitting.
            timers = [run_timer(m, inputs) for m in (default, tuned)]
            d, t = in_turn(timers, warmup=3, seconds=1.0)
            default_s.append(statistics.median(d))
            tuned_s.append(statistics.median(t))
            pairs += [a / b for a, b in zip(d, t, strict=True)]
        else:
            default_s.append(time_module(default, inputs))
    error = max(relative_error(o, ort[1]) for o in outputs) if ort else None
    latency = Latency(
        statistics.median(default_s),
        statistics.median(tuned_s) if tuned_s else None,
        trials,
        statistics.median(ort_s) if ort_s else None,
        error,
        statistics.median(pairs) if pairs else None,
    )
    return fused, unfused, latency, ort[2] if ort else "not installed"


def print_memory(rows: dict[str, tuple[Memory, Memory]]) -> None:
    print("\nkernels and peak intermediate memory (MiB): fused / unfused, planned / unplanned")
    print(
        f"{'model':<12} {'kernels fused':>13} {'unfused':>8} {'fused planned':>14} "
        f"{'fused unplanned':>16} {'unfused planned':>16} {'unfused unplanned':>18}"
    )
    for name, (f, u) in rows.items():
        print(
            f"{name:<12} {f.kernels:>13} {u.kernels:>8} {f.planned / MIB:>14.3f} "
            f"{f.unplanned / MIB:>16.3f} {u.planned / MIB:>16.3f} {u.unplanned / MIB:>18.3f}"
        )


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def ratio(peer: float | None, ours: float | None) -> str:
    return "-" if peer is None or ours is None else f"{peer / ours:.2f}"


def print_latency(rows: dict[str, Latency], version: str) -> None:
    print(
        f"\nend-to-end latency (ms, medians; {THREADS} threads); x ORT = ONNX Runtime's time / "
        f"Hexir's (above 1: Hexir is faster); ONNX Runtime {version}"
    )
    print(
        f"{'model':<12} {'hexir default':>13} {'hexir tuned':>12} {'trials':>7} "
        f"{'onnxruntime':>12} {'default x ORT':>14} {'tuned x ORT':>12} {'max rel err':>12} "
        f"{'tuned x default':>16}"
    )
    for name, r in rows.items():
        error = "-" if r.max_error is None else f"{r.max_error:.1e}"
        gain = "-" if r.gain is None else f"{r.gain:.3f}"
        print(
            f"{name:<12} {ms(r.default):>13} {ms(r.tuned):>12} {r.trials:>7} "
            f"{ms(r.onnxruntime):>12} {ratio(r.onnxruntime, r.default):>14} "
            f"{ratio(r.onnxruntime, r.tuned):>12} {error:>12} {gain:>16}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=0, help="trials per model (0: no tuning)")
    parser.add_argument("--db", default="sqlite:///tuning_logs/hexir.db", help="database URL")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS + LARGE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    args = parser.parse_args()
    from hexir.database import Database

    print(numpy_matmul_line(), flush=True)

    db = Database(args.db)
    memory_rows, latency_rows, version = {}, {}, "-"
    for name in args.models:
        print(f"{name} ...", flush=True)
        fused, unfused, latency, version = bench_model(name, args, db)
        memory_rows[name] = (fused, unfused)
        latency_rows[name] = latency
    print(f"\nwhole models on the CPU ({os.cpu_count()} cores), float32, batch 1")
    print_memory(memory_rows)
    print_latency(latency_rows, version)
    print(numpy_matmul_line())


if __name__ == "__main__":
    main()
