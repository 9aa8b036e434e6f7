"""Checks shared by the row ops' tests (rms_norm, log_softmax): a schedule's root loops, the
hand-written GPU schedule and the GPU search space on one-row-per-block kernels, each result
run on the CPU."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from hexir.codegen.cuda import generate_cuda
from hexir.ir.tir import For, PrimFunc
from hexir.ir.visit import walk
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule import Trace
from hexir.schedule.handwritten import gpu_schedule
from hexir.search.space import SearchSpace

SM90 = "cuda -arch=sm_90"
RunOnCpu = Callable[[PrimFunc, PrimFunc, np.random.Generator], None]


def root_loops(func: PrimFunc) -> list[For]:
    """The loops of `func` that no other loop encloses."""
    top = [n for n in walk(func.body) if isinstance(n, For)]
    return [lp for lp in top if not any(lp is not o and lp in list(walk(o.body)) for o in top)]


def check_hand_gpu_schedule(
    func: PrimFunc, rows: int, calls: tuple[str, ...], run_on_cpu: RunOnCpu, rng
) -> None:
    """One thread block per row; it replays, NVRTC compiles it for sm_90 with the math
    `calls` in its source, the GPU default takes it, and on the CPU it computes numpy's
    answer (`run_on_cpu`)."""
    sch = gpu_schedule(func)
    assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
    bound = {lp.kind: lp.extent for lp in walk(sch.func.body) if isinstance(lp, For)}
    assert bound["blockIdx.x"] == rows and "threadIdx.x" in bound
    cuda = generate_cuda(sch.func, Target(SM90))
    assert cuda.source.count("__global__") == 1
    assert all(call in cuda.source for call in calls)
    assert compile_cuda(cuda.source, Target(SM90), cuda.name).resources["registers"] > 0
    assert default_schedule(func, SM90).func == sch.func
    run_on_cpu(func, sch.func, rng)


def check_gpu_sketch_samples(func: PrimFunc, run_on_cpu: RunOnCpu, samples: int = 4) -> None:
    """Schedules drawn from the GPU search space replay, bind blocks and threads, and compute
    numpy's answer on the CPU."""
    schedules = SearchSpace().sample_schedules(func, SM90, random.Random(0), samples)
    for k, sch in enumerate(schedules):
        assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
        kinds = {lp.kind for lp in walk(sch.func.body) if isinstance(lp, For)}
        assert {"blockIdx.x", "threadIdx.x"} <= kinds
        run_on_cpu(func, sch.func, np.random.default_rng(k))
