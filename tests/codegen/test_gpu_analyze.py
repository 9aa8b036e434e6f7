"""The static GPU analyzer (hexir/codegen/gpu_analyze.py): the bank model on access patterns
whose wavefronts are known, and its reading of the reference schedules, built with NVRTC (no
GPU needed)."""

from __future__ import annotations

import random

import pytest

import hexir
from hexir import knobs
from hexir.codegen.gpu_analyze import REGISTER_UNIT, _wavefronts, analyze
from hexir.schedule.handwritten import Tiling, gpu_schedule
from hexir.search.space import SearchSpace

SM90 = "cuda -arch=sm_90"


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


@pytest.mark.parametrize(
    "stride,width,expected",
    [
        (1, 1, (1, 1)),  # 32 lanes, 32 banks
        (0, 1, (1, 1)),  # one word for all: a broadcast
        (2, 1, (2, 1)),  # two lanes per bank, different words
        (32, 1, (32, 1)),  # every lane in bank 0
        (33, 1, (1, 1)),  # a row padded by a word
        (4, 4, (4, 4)),  # float4 of consecutive rows: 4 phases of 8 lanes, no conflict
        (8, 4, (8, 4)),  # float4 two apart: each phase 2-way
    ],
)
def test_wavefronts_of_a_warp_request(stride, width, expected):
    assert _wavefronts([lane * stride for lane in range(32)], width) == expected


@pytest.mark.parametrize("name", ["matmul", "dense"])
def test_the_reference_matmul_and_dense_read_shared_memory_without_conflicts(name):
    kernel = hexir.build(gpu_schedule(hexir.workload(name, M=4096, N=4096, K=4096)).func, SM90)
    report = analyze(kernel)
    assert report.conflict_free and report.spill_bytes == 0, report.accesses
    # per k step a warp issues 64 FMAs a thread (16 clocks) and 16 shared wavefronts: A's
    # eight broadcast words, and B's two float4 runs (matmul) or eight padded rows (dense)
    assert report.fma_clocks == 16 and report.memory_clocks == 16
    assert report.predicted == 1.0 >= 0.8  # the issue's bar
    assert "worst conflict 1-way" in str(report)
    assert kernel.resources["shared_bytes"] <= 48 * 1024  # the step shortened to fit (32)


def test_the_tile_it_replaced_reads_two_thirds_of_peak():
    """8 x 32 threads of 8 x 4 outputs (the reference until 2026-12-05, 0.76x cuBLAS on an
    H100): conflict-free, but 8 FMA clocks a step against 12 wavefronts."""
    func = hexir.workload("matmul", M=4096, N=4096, K=4096)
    report = analyze(hexir.build(gpu_schedule(func, Tiling(8, 32, 8, 4, 64)).func, SM90))
    assert report.conflict_free
    assert (report.fma_clocks, report.memory_clocks) == (8, 12)


def test_square_thread_blocks_read_a_two_ways():
    """16 x 16 threads of 8 x 8 outputs: a warp holds two rows of threads, whose A reads
    fall 8 rows apart in one bank (2-way); B's float4 runs stay conflict-free."""
    func = hexir.workload("matmul", M=4096, N=4096, K=4096)
    report = analyze(hexir.build(gpu_schedule(func, Tiling(16, 16, 8, 8, 8)).func, SM90))
    loads = {a.buffer: a for a in report.accesses if a.kind == "load"}
    assert loads["A_shared"].degree == 2 and loads["B_shared"].degree == 1
    assert loads["B_shared"].width == 4 and not report.conflict_free
    assert report.predicted == pytest.approx(16 / 24)


def test_occupancy_follows_registers_shared_memory_and_threads():
    kernel = hexir.build(gpu_schedule(hexir.workload("matmul", M=4096, N=4096, K=4096)).func, SM90)
    report = analyze(kernel)
    warps = kernel.block[0] * kernel.block[1] // 32
    per_warp = -(-kernel.resources["registers"] * 32 // REGISTER_UNIT) * REGISTER_UNIT
    shared = kernel.resources["shared_bytes"] + 1024
    expected = min(32, 2048 // (warps * 32), 65536 // (per_warp * warps), 228 * 1024 // shared)
    assert report.blocks_per_sm == expected and report.occupancy == expected * warps / 64


def test_the_issue_mix_counts_the_loops_auto_unroll_unrolls():
    """A sampled kernel's thread tile is serial loops under `pragma_auto_unroll_max_step`,
    which the printer unrolls (`#pragma unroll`) where the nest fits the step: the analyzer
    enumerates them as it does `unroll`ed loops; with the step 0 the same kernel's innermost
    rolled loop holds one multiply-add."""
    func = hexir.workload("matmul", M=1024, N=1024, K=1024)
    target = hexir.Target(SM90)
    rng = random.Random(3)
    step = next(  # a draw whose unroll step is the largest (512)
        s for s in (SearchSpace().sample_schedule(func, target, rng) for _ in range(40))
        if [i.decision for i in s.trace if i.kind == "sample_categorical"][-1] == 3
    )  # fmt: skip
    index = [n for n, i in enumerate(step.trace) if i.kind == "sample_categorical"][-1]
    rolled = step.trace.with_decision(index, 0).apply(func, target=target)
    unrolled_report = analyze(hexir.build(step.func, target))
    rolled_report = analyze(hexir.build(rolled.func, target))
    assert "#pragma unroll" in hexir.build(step.func, target).source
    assert rolled_report.fma_clocks == 32 / 128  # one FMA a warp: 1/4 clock
    assert unrolled_report.fma_clocks > rolled_report.fma_clocks
    assert unrolled_report.predicted > rolled_report.predicted


def test_the_analyzer_reads_every_sampled_kernel():
    """Any kernel the search space draws: every shared access evaluated, nothing raised."""
    func = hexir.workload("matmul", M=1024, N=1024, K=1024)
    rng = random.Random(0)
    for _ in range(4):
        sch = SearchSpace().sample_schedule(func, hexir.Target(SM90), rng)
        report = analyze(hexir.build(sch.func, SM90))
        assert 0 <= report.predicted <= 1 and 0 < report.occupancy <= 1
        assert all(a.wavefronts >= a.ideal >= 1 for a in report.accesses)
