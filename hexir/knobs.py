"""Every setting of Hexir, typed, each with its environment variable, and a scope for tests.

from hexir import knobs
knobs.get().cc                       # the C compiler
with knobs.scope(num_threads=1):     # any knob, for one block
    ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _int(name: str, default: str) -> int:
    return _number(name, default, int, "an integer")


def _float(name: str, default: str) -> float:
    return _number(name, default, float, "a number")


def _number(name: str, default: str, kind: type, what: str):
    text = _env(name, default)
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < 0:
        from hexir.errors import KnobError

        raise KnobError(
            f"the environment variable {name}={text!r} is not {what} of at least 0; unset it "
            f"for the default ({default}) or set it to {what} (hexir/knobs.py lists every knob)"
        )
    return value


FLAGS = {"1": True, "true": True, "yes": True, "on": True,
         "0": False, "false": False, "no": False, "off": False}  # fmt: skip


def _flag(name: str, default: str) -> bool:
    text = _env(name, default)
    if text.strip().lower() not in FLAGS:
        from hexir.errors import KnobError

        raise KnobError(
            f"the environment variable {name}={text!r} is not 1 or 0 (also true/false, yes/no, "
            f"on/off); unset it for the default ({default}) (hexir/knobs.py lists every knob)"
        )
    return FLAGS[text.strip().lower()]


def _choice(name: str, default: str, options: tuple[str, ...]) -> str:
    text = _env(name, default)
    if text not in options:
        from hexir.errors import KnobError

        raise KnobError(
            f"the environment variable {name}={text!r} is not one of {', '.join(options)}; "
            f"unset it for the default ({default}) (hexir/knobs.py lists every knob)"
        )
    return text


_CUDA_DRIVERS = ("auto", "pycuda", "cuda-bindings")
_LAYOUTS = ("auto", "nchw", "nhwc")
_WINOGRAD = ("auto", "0", "2", "4")


def _default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "hexir")


@dataclass(frozen=True)
class Knobs:
    # The C compiler for CPU kernels and its optimization flags.
    cc: str = field(default_factory=lambda: _env("HEXIR_CC", "cc"))
    cflags: str = field(default_factory=lambda: _env("HEXIR_CFLAGS", "-O3"))
    # Seconds one C compile may take before it fails (a tuning build gets
    # measure_build_timeout instead: a candidate that slow to compile is not worth waiting for).
    cc_timeout: float = field(default_factory=lambda: _float("HEXIR_CC_TIMEOUT", "600"))
    # `hexir.compile`: C compiles of a module's kernels at once (0 = one per core).
    build_workers: int = field(default_factory=lambda: _int("HEXIR_BUILD_WORKERS", "0"))
    # OpenMP threads for `parallel` loops; 0 means every core.
    num_threads: int = field(default_factory=lambda: _int("HEXIR_NUM_THREADS", "0"))
    # Where built kernels are cached, keyed by source, flags and compiler version.
    cache_dir: str = field(default_factory=lambda: _env("HEXIR_CACHE_DIR", _default_cache()))
    # Kernel timing: warm-up calls, then repeats until both counts are met.
    timing_warmup: int = field(default_factory=lambda: _int("HEXIR_TIMING_WARMUP", "2"))
    timing_repeats: int = field(default_factory=lambda: _int("HEXIR_TIMING_REPEATS", "10"))
    # Measurement only (hexir/search/worker.py): a candidate's repeats stop after this many
    # seconds in all (at least three), so a slow candidate costs a few calls, not ten.
    timing_max_seconds: float = field(
        default_factory=lambda: _float("HEXIR_TIMING_MAX_SECONDS", "1.0")
    )
    # A tune times a candidate slower than this many times its task's best so far by one warm
    # call, not in full (hexir/search/tune.py); 0: every candidate in full.
    measure_cutoff: float = field(default_factory=lambda: _float("HEXIR_MEASURE_CUTOFF", "3"))
    # ... and a CPU candidate whose first three latencies read slower than this many times
    # that best by those three, not ten (hexir/search/worker.py); 0: every candidate in full.
    measure_near: float = field(default_factory=lambda: _float("HEXIR_MEASURE_NEAR", "1.5"))
    timing_min_seconds: float = field(
        default_factory=lambda: _float("HEXIR_TIMING_MIN_SECONDS", "0.05")
    )
    # The CPU's fp32 peak in GFLOP/s, the ceiling a profile's "of peak" column divides by;
    # 0 means derive it, with the clock measured once per machine (hexir/runtime/peak.py).
    cpu_peak_gflops: float = field(default_factory=lambda: _float("HEXIR_CPU_PEAK_GFLOPS", "0"))
    # Measurement (hexir/search/measure.py): parallel builds (0 = one per core); seconds one
    # candidate may run (check and timing) before it is killed; seconds the unscheduled
    # reference kernel may take; tolerances of the check against it.
    measure_build_workers: int = field(
        default_factory=lambda: _int("HEXIR_MEASURE_BUILD_WORKERS", "0")
    )
    measure_timeout: float = field(default_factory=lambda: _float("HEXIR_MEASURE_TIMEOUT", "30"))
    measure_build_timeout: float = field(
        default_factory=lambda: _float("HEXIR_MEASURE_BUILD_TIMEOUT", "60")
    )
    # Candidates a tune builds before it times them, per parallel build: the compiles of a
    # batch keep every core busy until its last one or two, where a batch of one per core
    # waits for its slowest (their times vary tenfold). Each result is committed as it is
    # timed, so a batch's size risks builds, never measurements.
    measure_batch_per_worker: int = field(
        default_factory=lambda: _int("HEXIR_MEASURE_BATCH_PER_WORKER", "4")
    )
    # A CPU candidate's time is suspect where the calibration kernel timed right after it ran
    # this many times slower than its quiet time, or its own median this many times its
    # fastest latency (hexir/search/calibration.py `load`): something else ran on the
    # machine. The tune measures it again later, and a build prefers quiet records. 0: no
    # calibration.
    measure_calibration_threshold: float = field(
        default_factory=lambda: _float("HEXIR_MEASURE_CALIBRATION_THRESHOLD", "2")
    )
    measure_reference_timeout: float = field(
        default_factory=lambda: _float("HEXIR_MEASURE_REFERENCE_TIMEOUT", "600")
    )
    measure_rtol: float = field(default_factory=lambda: _float("HEXIR_MEASURE_RTOL", "1e-3"))
    measure_atol: float = field(default_factory=lambda: _float("HEXIR_MEASURE_ATOL", "1e-3"))
    # CPU builds: exp, log, erf, tanh, sigmoid, sqrt, rsqrt and pow in vectorized loops as SIMD
    # helpers (hexir/codegen/c_math.py); off, such a loop runs libm's scalar calls (to compare).
    vector_math: bool = field(default_factory=lambda: _flag("HEXIR_VECTOR_MATH", "1"))
    # Compile time: constant weights laid out for the kernels that read them (dense of a
    # constant weight as a matmul of its transpose: hexir/graph/layout.py); off, as given.
    pack_weights: bool = field(default_factory=lambda: _flag("HEXIR_PACK_WEIGHTS", "1"))
    # Compile time, CPU: attention of at least 1024 keys (batch_matmul, scale, mask, softmax,
    # batch_matmul) as one `attention` op and kernel (hexir/graph/attention.py); off, as given.
    fuse_attention: bool = field(default_factory=lambda: _flag("HEXIR_FUSE_ATTENTION", "1"))
    # Compile time, CPU: 3x3 convs of stride 1 in the Winograd form F(m, 3) where their output
    # tiles are many enough (hexir/graph/layout.py, `winograd_tile`): "auto"; "0" keeps every
    # conv direct, "2" or "4" forces F(2, 3) or F(4, 3) on every conv that has the form.
    winograd: str = field(default_factory=lambda: _choice("HEXIR_WINOGRAD", "auto", _WINOGRAD))
    # Compile time, CPU: activation layouts chosen for the whole graph (hexir/graph/layout.py):
    # "auto" keeps a ResNet stage in NHWC between its layout_transforms; "nchw" keeps every
    # activation between kernels in NCHW, each op that computes in NHWC transforming its own
    # input and output; "nhwc" takes the NHWC plan wherever there is one (both to compare).
    layout: str = field(default_factory=lambda: _choice("HEXIR_LAYOUT", "auto", _LAYOUTS))
    # CPU modules: a planned run calls every command from one native function
    # (hexir/runtime/native.py); off, Python calls each kernel in turn (to compare).
    native_run: bool = field(default_factory=lambda: _flag("HEXIR_NATIVE_RUN", "1"))
    # ... and binds the caller's arrays and returns the outputs from C too (binder.py), where
    # Python's headers are there to build it; off, Python binds them (to compare).
    native_bind: bool = field(default_factory=lambda: _flag("HEXIR_NATIVE_BIND", "1"))
    # CUDA builds: NVRTC's --use_fast_math (approximate exp, division, ...), and keeping the PTX.
    cuda_fast_math: bool = field(default_factory=lambda: _flag("HEXIR_CUDA_FAST_MATH", "0"))
    cuda_keep_ptx: bool = field(default_factory=lambda: _flag("HEXIR_CUDA_KEEP_PTX", "0"))
    # Running CUDA kernels: the driver API through pycuda where it imports, else through
    # cuda-bindings ("auto"), or the one named (hexir/runtime/cuda_driver.py).
    cuda_driver: str = field(
        default_factory=lambda: _choice("HEXIR_CUDA_DRIVER", "auto", _CUDA_DRIVERS)
    )
    # GPU modules: a planned run's launches captured once as a CUDA graph and replayed with one
    # call (where the driver binding has graphs: cuda-bindings); off, launched one by one.
    cuda_graphs: bool = field(default_factory=lambda: _flag("HEXIR_CUDA_GRAPHS", "1"))
    # Fuse ops into one kernel per group (the whole-models issue); off means one op per kernel.
    fusion: bool = field(default_factory=lambda: _flag("HEXIR_FUSION", "1"))
    # Cost model (hexir/costmodel/xgb.py): retrain only once the training data has grown by
    # this fraction since the last training (0 = after every update).
    costmodel_retrain_growth: float = field(
        default_factory=lambda: _float("HEXIR_COSTMODEL_RETRAIN_GROWTH", "0.2")
    )
    # Evolutionary search (hexir/search/evolutionary.py): candidates per generation; the share
    # of the initial population taken from the database's best; generations of mutation per
    # round; the chance a child is mutated (else copied); the share of each measured batch
    # picked at random; candidates measured per round; failed tries per child before a copy.
    # A round measuring fewer than search_measure_per_round shrinks its population in
    # proportion, down to search_min_population.
    search_population: int = field(default_factory=lambda: _int("HEXIR_SEARCH_POPULATION", "512"))
    search_min_population: int = field(
        default_factory=lambda: _int("HEXIR_SEARCH_MIN_POPULATION", "64")
    )
    search_init_best_fraction: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_INIT_BEST_FRACTION", "0.2")
    )
    search_generations: int = field(default_factory=lambda: _int("HEXIR_SEARCH_GENERATIONS", "4"))
    search_mutation_probability: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_MUTATION_PROBABILITY", "0.85")
    )
    search_epsilon: float = field(default_factory=lambda: _float("HEXIR_SEARCH_EPSILON", "0.05"))
    search_measure_per_round: int = field(
        default_factory=lambda: _int("HEXIR_SEARCH_MEASURE_PER_ROUND", "64")
    )
    # A new task's first population takes the best records of similar workloads (the same op
    # at other sizes) where the database has few of its own (hexir/search/transfer.py).
    search_transfer: bool = field(default_factory=lambda: _flag("HEXIR_SEARCH_TRANSFER", "1"))
    # A CPU candidate whose C is longer than this (or than twice its default schedule's C,
    # where that is longer) is not proposed: slow to compile and slow to run; 0: no limit
    # (hexir/search/evolutionary.py: SOURCE_LIMIT_FACTOR).
    search_max_source_lines: int = field(
        default_factory=lambda: _int("HEXIR_SEARCH_MAX_SOURCE_LINES", "400")
    )
    # The share of an informed round's batch taken from the neighbours of the task's best
    # record (one tile factor moved, or one other choice), best scored first.
    search_climb_share: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_CLIMB_SHARE", "0.25")
    )
    search_mutation_tries: int = field(
        default_factory=lambda: _int("HEXIR_SEARCH_MUTATION_TRIES", "4")
    )
    # A tune's round of a task may search (sample and evolve) for at most this multiple of
    # the time its batch should take to build and time, at the task's pace so far; 0: no
    # limit. A conv's candidate costs about 0.05 s to replay in Python, so a full informed
    # round (512 candidates, 4 generations) took longer than measuring its 64 trials. At 0.25
    # rather than 0.5, 64-trial tunes of conv2d, its residual form and dense took 0.99, 0.83
    # and 0.51 s a trial (were 1.29, 1.10, 0.64) and each still beat its default schedule
    # (0.52 / 0.58 ms, 0.59 / 0.64, 2.86 / 3.26): the climb from the incumbent found those.
    search_time_ratio: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_TIME_RATIO", "0.25")
    )
    # Relative weights of the mutators (hexir/search/mutators.py), among those that apply.
    search_mutate_tile: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_MUTATE_TILE", "0.8")
    )
    search_mutate_unroll: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_MUTATE_UNROLL", "0.08")
    )
    search_mutate_compute_location: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_MUTATE_COMPUTE_LOCATION", "0.05")
    )
    search_mutate_parallel: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_MUTATE_PARALLEL", "0.04")
    )
    search_mutate_thread_binding: float = field(
        default_factory=lambda: _float("HEXIR_SEARCH_MUTATE_THREAD_BINDING", "0.03")
    )
    # Task scheduler (hexir/search/scheduler.py): the weight of the recent improvement against
    # the optimistic forward estimate, and how many rounds back the recent improvement looks.
    tune_gradient_alpha: float = field(
        default_factory=lambda: _float("HEXIR_TUNE_GRADIENT_ALPHA", "0.2")
    )
    tune_gradient_window: int = field(
        default_factory=lambda: _int("HEXIR_TUNE_GRADIENT_WINDOW", "3")
    )
    # The share of a tune's trials its first round (every task once) takes at most: each task
    # gets search_measure_per_round trials, or fewer, but at least one (hexir/search/scheduler.py).
    tune_first_round_share: float = field(
        default_factory=lambda: _float("HEXIR_TUNE_FIRST_ROUND_SHARE", "0.25")
    )
    # At the end of a tune, measure again each task's best this many candidates and its default
    # schedule (the database ranks a candidate by the median of its records); 0: none.
    tune_confirm_best: int = field(default_factory=lambda: _int("HEXIR_TUNE_CONFIRM_BEST", "3"))
    # A result faster than its task's best by more than this factor is timed again in turn with
    # the candidate that holds the best before the tune credits the gain; 0: credited as read.
    tune_check_gain: float = field(default_factory=lambda: _float("HEXIR_TUNE_CHECK_GAIN", "1.03"))
    # At the end of a tune of a model whose convs have two forms, time its builds in each form
    # inside the model's runs, for a build's pick of the forms (hexir/search/tune.py).
    tune_time_in_model: bool = field(default_factory=lambda: _flag("HEXIR_TUNE_TIME_IN_MODEL", "1"))
    # Measure each task's default schedule in its first round (the baseline a tune must beat).
    tune_measure_default: bool = field(
        default_factory=lambda: _flag("HEXIR_TUNE_MEASURE_DEFAULT", "1")
    )


_current: Knobs | None = None


def get() -> Knobs:
    """The knobs in force: the environment's, or those of the innermost `scope`."""
    global _current
    if _current is None:
        _current = Knobs()
    return _current


@contextlib.contextmanager
def scope(**changes: object) -> Iterator[Knobs]:
    """Change some knobs for one block: `with knobs.scope(num_threads=1): ...`."""
    global _current
    previous = get()
    unknown = set(changes) - {f.name for f in dataclasses.fields(Knobs)}
    if unknown:
        raise TypeError(f"unknown knobs: {', '.join(sorted(unknown))}")
    _current = dataclasses.replace(previous, **changes)  # type: ignore[arg-type]
    try:
        yield _current
    finally:
        _current = previous
