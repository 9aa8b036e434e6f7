"""Kernel features: fixed length, finite, deterministic, and telling schedules apart."""

from __future__ import annotations

import random

import numpy as np
import pytest

import hexir
from hexir.costmodel.features import FEATURE_NAMES, LOG_COLUMNS, NUM_FEATURES, extract
from hexir.runtime.target import Target
from hexir.schedule import Schedule
from hexir.schedule.compact import compact_buffers
from hexir.search.space import SearchSpace

CPU = Target("cpu")
MATMUL = hexir.workload("matmul", M=64, N=64, K=64)


def column(vec: np.ndarray, name: str) -> float:
    return float(vec[FEATURE_NAMES.index(name)])


def raw(vec: np.ndarray, name: str) -> float:
    """A column's value before the log2(1 + x) scaling."""
    i = FEATURE_NAMES.index(name)
    value = float(2.0 ** float(vec[i]) - 1.0) if LOG_COLUMNS[i] else float(vec[i])
    return round(value, 2) if value < 1e4 else value  # float32 keeps about 7 digits


def tiled(i_factor: int, j_factor: int, vectorize: bool = True, parallel: bool = True):
    """A matmul schedule: i and j split, the outer i parallel, the inner j vectorized."""
    sch = Schedule(MATMUL, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    i0, i1 = sch.split(i, [None, i_factor])
    j0, j1 = sch.split(j, [None, j_factor])
    sch.reorder(i0, j0, k, i1, j1)
    if parallel:
        sch.parallel(i0)
    if vectorize:
        sch.vectorize(j1)
    return sch.func


def sampled(func, target: str, n: int, seed: int = 0):
    return [s.func for s in SearchSpace().sample_schedules(func, target, random.Random(seed), n)]


def test_names_are_unique_and_match_the_length():
    assert len(set(FEATURE_NAMES)) == NUM_FEATURES == len(LOG_COLUMNS)
    vec = extract(MATMUL, CPU)
    assert vec.shape == (NUM_FEATURES,) and vec.dtype == np.float32


@pytest.mark.parametrize(
    "workload",
    [
        MATMUL,
        # 2^27 trips: the large counts of the workloads the search tunes stay finite.
        hexir.workload("matmul", M=512, N=512, K=512),
        hexir.workload("dense", M=32, N=64, K=48, activation="relu"),
        hexir.workload("softmax", M=16, N=128),
        hexir.workload("conv2d", N=1, C=8, H=10, W=10, K=8, R=3, S=3, padding=1),
    ],
    ids=lambda f: f"{f.name}-{f.params[0].shape[0]}",
)
def test_sampled_schedules_give_finite_deterministic_vectors(workload):
    funcs = [workload, *sampled(workload, "cpu", 6)]
    vectors = [extract(f, CPU) for f in funcs]
    for func, vec in zip(funcs, vectors, strict=True):
        assert np.isfinite(vec).all() and (vec >= 0).all()
        assert np.array_equal(vec, extract(hexir.parse(str(func)), CPU))
    distinct = {v.tobytes() for v in vectors}
    assert len(distinct) >= len(vectors) - 1  # different schedules, different vectors


def test_vectorizing_shows_in_the_vector_columns():
    plain, vectorized = extract(tiled(4, 16, vectorize=False), CPU), extract(tiled(4, 16), CPU)
    assert not np.array_equal(plain, vectorized)
    assert raw(vectorized, "main.vector.lanes") == 16
    assert column(vectorized, "main.innermost.vectorized") == 1
    assert column(plain, "main.vector.lanes") == 0 == column(plain, "main.innermost.vectorized")
    assert column(vectorized, "main.vector.lanes_per_target") == 16 / CPU.vector_width
    assert column(vectorized, "kernel.share.vectorized_flops") == 1
    assert column(plain, "kernel.share.vectorized_flops") == 0


def test_tile_sizes_show_in_the_loop_and_memory_columns():
    small, large = extract(tiled(4, 16), CPU), extract(tiled(16, 32), CPU)
    assert not np.array_equal(small, large)
    assert raw(small, "main.loops.parallel.extent") == 16
    assert raw(large, "main.loops.parallel.extent") == 4
    assert raw(small, "main.vector.lanes") == 16 and raw(large, "main.vector.lanes") == 32
    # The same work and the same unique bytes either way.
    for name in ("main.trips", "main.arith.float_fma", "main.out.unique_bytes"):
        assert column(small, name) == column(large, name)


def test_arithmetic_and_memory_of_an_unscheduled_matmul():
    vec = extract(MATMUL, CPU)
    trips = 64**3
    assert raw(vec, "main.trips") == pytest.approx(trips)
    assert raw(vec, "main.arith.float_fma") == pytest.approx(trips)
    assert raw(vec, "main.arith.float_mul") == pytest.approx(trips)
    assert raw(vec, "main.arith.float_div") == 0
    # A, B and C each 64 x 64 floats; C read and written by the update.
    assert raw(vec, "main.mem.param.unique_bytes") == pytest.approx(3 * 64 * 64 * 4, rel=1e-4)
    assert raw(vec, "main.mem.param.bytes") == pytest.approx(4 * trips * 4, rel=1e-4)
    assert raw(vec, "aux.trips") == pytest.approx(64 * 64)  # the init
    assert column(vec, "main.flags.reduction") == 1 and column(vec, "aux.flags.init") == 1


def test_strides_and_reuse_of_the_innermost_loop():
    """In i, j, k order the innermost k walks A along a row (stride 1), B down a column
    (stride N) and C not at all (reused K times)."""
    vec = extract(MATMUL, CPU)
    assert raw(vec, "main.out.stride") == 0  # C: the accumulator
    assert sorted([raw(vec, "main.in0.stride"), raw(vec, "main.in1.stride")]) == [1.0, 64.0]
    assert raw(vec, "main.out.reuse.count") == 64  # reused along k
    assert raw(vec, "main.out.reuse.distance_iters") == 1  # one accumulator: a chain of adds
    assert column(vec, "main.out.read") == 1 == column(vec, "main.out.write")


def test_allocations_are_sized_like_compact_buffers():
    """The allocation columns estimate what compact_buffers makes of each cache."""
    for func in sampled(hexir.workload("matmul", M=128, N=128, K=128), "cpu", 8, seed=3):
        vec = extract(func, CPU)
        compacted = compact_buffers(func)
        for scope in ("global", "local"):
            allocs = [
                n.buffer
                for n in hexir.ir.visit.walk(compacted.body)
                if isinstance(n, hexir.ir.tir.Allocate) and n.buffer.scope == scope
            ]
            size = sum(b.size * 4 for b in allocs)
            assert raw(vec, f"kernel.alloc.{scope}.count") == len(allocs)
            assert raw(vec, f"kernel.alloc.{scope}.bytes") == pytest.approx(size, rel=0.3)


def test_gpu_schedules_fill_the_binding_columns_and_resources():
    target = Target("cuda -arch=sm_90")
    funcs = sampled(hexir.workload("matmul", M=64, N=64, K=64), target.text, 3)
    for func in funcs:
        vec = extract(func, target)
        assert np.isfinite(vec).all()
        assert column(vec, "main.loops.blockIdx.count") >= 1
        assert column(vec, "main.loops.threadIdx.count") >= 1
        assert column(vec, "kernel.cuda.has_resources") == 0
    report = {"registers": 40, "spill_bytes": 0, "shared_bytes": 8192}
    vec = extract(funcs[0], target, resources=report)
    assert column(vec, "kernel.cuda.has_resources") == 1
    assert raw(vec, "kernel.cuda.registers") == 40
    assert raw(vec, "kernel.cuda.shared_bytes") == 8192


def test_gpu_schedules_carry_the_analyzers_reading_before_a_build():
    """`kernel.cuda.worst_conflict` and `kernel.cuda.predicted_peak` are the static analyzer's
    reading of the schedule, the same as the built kernel's report: the conflict-free reference
    tile and a 16 x 16 thread block whose A reads are 2-way tell apart; off the GPU, 1 and 0."""
    from hexir.codegen.gpu_analyze import analyze
    from hexir.schedule.handwritten import Tiling, gpu_schedule

    target = Target("cuda -arch=sm_90")
    func = hexir.workload("matmul", M=4096, N=4096, K=4096)
    readings = []
    for tiling in (None, Tiling(16, 16, 8, 8, 8)):
        scheduled = gpu_schedule(func, tiling).func
        vec = extract(scheduled, target)
        report = analyze(hexir.build(scheduled, target))
        assert raw(vec, "kernel.cuda.worst_conflict") == pytest.approx(report.worst)
        assert column(vec, "kernel.cuda.predicted_peak") == pytest.approx(report.predicted)
        readings.append((report.worst, report.predicted))
    assert readings == [(1, 1.0), (2, pytest.approx(16 / 24))]
    cpu = extract(tiled(8, 16), CPU)
    assert raw(cpu, "kernel.cuda.worst_conflict") == 1
    assert column(cpu, "kernel.cuda.predicted_peak") == 0
