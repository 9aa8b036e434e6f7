"""CUDA candidates measured on the GPU: by the CudaRunner's worker process, which a faulting or
hanging kernel costs one record, and on a Ray cluster's GPU runners."""

from __future__ import annotations

import dataclasses

import pytest

import hexir
from hexir import knobs
from hexir.ir.keys import candidate_key
from hexir.ir.tir import PrimFunc
from hexir.ops.parse import parse
from hexir.runtime.cuda_kernel import CudaKernel
from hexir.runtime.nvrtc import compile_cuda
from hexir.schedule import Schedule, Trace
from hexir.search import BuildResult, Candidate, CudaBuilder, CudaRunner, measure

pytestmark = pytest.mark.gpu

WORKLOAD = hexir.workload("matmul", M=64, N=48, K=32)
TARGET = "cuda"


def bound(func: PrimFunc) -> Schedule:
    sch = Schedule(func, seed=0)
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    return sch


def candidates() -> list[Candidate]:
    """A thread-bound schedule of WORKLOAD, and the same schedule of a wrong kernel."""
    good = Candidate.from_schedule(WORKLOAD, bound(WORKLOAD), TARGET)
    wrong = parse(str(WORKLOAD).replace("= 0.0", "= 1.0"))
    assert isinstance(wrong, PrimFunc)
    func = bound(wrong).func
    return [good, Candidate(WORKLOAD, Trace(), func, good.target, candidate_key(func))]


def test_cuda_candidates_are_checked_and_timed():
    results = measure(candidates(), CudaBuilder(), CudaRunner())
    assert len(results) == 2
    assert results[0].ok and results[0].median is not None and results[0].median > 0
    assert results[1].error_kind == "wrong_result"


def test_a_cuda_candidate_slower_than_its_cutoff_is_timed_by_one_launch():
    """As on the CPU: past the tune's cutoff (the `measure_cutoff` knob times its task's
    best) a candidate is timed by one warm launch and its record says so."""
    good = candidates()[0]
    (full,) = measure([good], CudaBuilder(), CudaRunner())
    assert full.ok and "cut" not in full.build_info
    cut = dataclasses.replace(good, cutoff=full.median / 100)
    (result,) = measure([cut], CudaBuilder(), CudaRunner())
    assert result.ok and result.build_info["cut"] is True and len(result.latencies) == 1


# A kernel that writes where no memory is (an illegal address: the context's sticky error),
# and one that never ends; both take the place of WORKLOAD's kernel.
FAULT = """extern "C" __global__ void matmul(const float* A, const float* B, float* C) {
  float* wild = (float*)(0x10ull + 4096ull * threadIdx.x);
  *wild = A[0];
}
"""
HANG = """extern "C" __global__ void matmul(const float* A, const float* B, float* C) {
  volatile float* c = C;
  for (;;) c[threadIdx.x] = c[threadIdx.x] + 1.0f;
}
"""


def hand_written(good: BuildResult, source: str) -> BuildResult:
    kernel = good.kernel
    binary = compile_cuda(source, kernel.target, "matmul")
    bad = CudaKernel(kernel.func, source, binary, kernel.target, "matmul", (1,), (32,))
    return BuildResult(source=source, kernel=bad)


def test_a_faulting_or_hanging_kernel_costs_one_record_and_the_next_is_measured():
    good = candidates()[0]
    (build,) = CudaBuilder().build([good])
    builds = [build, hand_written(build, FAULT), build, hand_written(build, HANG), build]
    with knobs.scope(measure_timeout=5.0), CudaRunner() as runner:
        results = runner.run([good] * 5, builds)
    kinds = [r.error_kind for r in results]
    assert kinds == [None, "run", None, "timeout", None], [r.error_message for r in results]
    assert "ILLEGAL_ADDRESS" in results[1].error_message
    assert all(r.median is not None and r.median > 0 for r in results[::2])
    pids = [r.build_info["worker_pid"] for r in results]
    assert pids[0] != pids[2] != pids[4]  # a new worker after the fault, and after the hang


def test_cuda_candidates_are_measured_on_gpu_runners():
    pytest.importorskip("ray", reason="Ray is not installed on this GPU machine")
    from hexir.search.distributed import RayExecutor

    cand = candidates()[0]
    with RayExecutor(cand.target) as executor:
        (result,) = executor.measure([cand])
    assert result.ok and result.median is not None and result.median > 0, result.error_message
    assert "registers" in result.build_info["resources"]
