"""CUDA candidates measured on the GPU, in-process and on a Ray cluster's GPU runners."""

from __future__ import annotations

import pytest

import hexir
from hexir.ir.keys import candidate_key
from hexir.ir.tir import PrimFunc
from hexir.ops.parse import parse
from hexir.schedule import Schedule, Trace
from hexir.search import Candidate, CudaBuilder, CudaRunner, measure

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


def test_cuda_candidates_are_measured_on_gpu_runners():
    pytest.importorskip("ray", reason="Ray is not installed on this GPU machine")
    from hexir.search.distributed import RayExecutor

    cand = candidates()[0]
    with RayExecutor(cand.target) as executor:
        (result,) = executor.measure([cand])
    assert result.ok and result.median is not None and result.median > 0, result.error_message
    assert "registers" in result.build_info["resources"]
