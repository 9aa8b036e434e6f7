"""The analytic estimate of a kernel's time: which loop runs as SIMD (printed or GCC's), the
register tile, what the accumulator costs, parallel regions, and the time columns it fills."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hexir
from hexir.costmodel.estimate import STORE_COLUMNS, TIME_COLUMNS, context, store_estimate
from hexir.costmodel.features import FEATURE_NAMES, LOG_COLUMNS, extract
from hexir.costmodel.locality import cache_traffic
from hexir.costmodel.walk import walk_kernel
from hexir.runtime.target import Target
from hexir.schedule import Schedule

CPU = Target("cpu")
LANES = CPU.vector_width
MATMUL = hexir.workload("matmul", M=64, N=64, K=64)


def raw(vec: np.ndarray, name: str) -> float:
    i = FEATURE_NAMES.index(name)
    return float(2.0 ** float(vec[i]) - 1.0) if LOG_COLUMNS[i] else float(vec[i])


def register_tile(rows: int, *, vectorize: bool = True, unroll: bool = True, rows_inside=False):
    """i and j split, `rows` x LANES tiles of C in the inner loops with k around them (the
    rows' loop innermost if `rows_inside`)."""
    sch = Schedule(MATMUL, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    i0, i1 = sch.split(i, [None, rows])
    j0, j1 = sch.split(j, [None, LANES])
    sch.reorder(i0, j0, k, *((j1, i1) if rows_inside else (i1, j1)))
    if unroll:
        sch.unroll(i1)
    if vectorize:
        sch.vectorize(j1)
    return sch.func


def column_major():
    """k, j, i with i innermost: C and A move a row per step, B not at all."""
    sch = Schedule(MATMUL, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    sch.reorder(k, j, i)
    return sch.func


def main_estimate(func, **changes):
    """The estimate of the matmul update (the store doing the arithmetic)."""
    kernel = walk_kernel(func)
    ctx = dataclasses.replace(context(kernel, CPU), **changes)
    store = next(s for s in kernel.stores if s.in_reduction and not s.in_init)
    return store, store_estimate(store, cache_traffic(store), ctx)


def test_a_register_tile_runs_as_printed_simd_with_its_sums_in_registers():
    vec = extract(register_tile(4), CPU)
    assert raw(vec, "main.est.lanes") == LANES
    assert raw(vec, "main.est.simd.explicit") == 1 and raw(vec, "main.est.simd.compiler") == 0
    assert raw(vec, "main.est.body") == pytest.approx(4 * LANES)  # the unrolled rows x lanes
    assert raw(vec, "main.est.accumulators") == pytest.approx(4)  # vectors of C
    assert raw(vec, "main.est.in_registers") == 1
    # Per FMA: one vector of B, and a broadcast of A per row: (4 + 1) / 4.
    assert raw(vec, "main.est.loads_per_op") == pytest.approx(5 / 4)


def test_gcc_vectorizes_a_unit_stride_innermost_loop_itself():
    vec = extract(register_tile(4, vectorize=False), CPU)
    assert raw(vec, "main.est.simd.explicit") == 0 and raw(vec, "main.est.simd.compiler") == 1
    assert raw(vec, "main.est.lanes") == LANES


def test_gcc_vectorizes_the_loop_around_a_reduction_loop():
    """In i, j, k order the innermost k is a reduction; j around it moves C and B by one and
    A not at all: outer-loop vectorization, one sum per vector kept in a register across k."""
    _, est = main_estimate(MATMUL)
    assert est.compiler and not est.explicit and est.lanes == LANES
    assert est.accumulators == 1 and est.in_registers


def test_gcc_leaves_a_heap_output_scalar_unless_it_can_check_the_overlap():
    """A heap buffer might overlap the inputs: GCC checks at run time for a few pairs of
    accesses (one statement, three reads), not for four unrolled rows' twelve."""
    func = register_tile(4, vectorize=False, rows_inside=True)
    store, est = main_estimate(func)
    heap = frozenset({store.accesses[0].buffer})
    _, on_heap = main_estimate(func, heap=heap)
    assert est.compiler and est.in_registers
    assert not on_heap.compiler and on_heap.lanes == 1 and not on_heap.in_registers
    _, checked = main_estimate(MATMUL, heap=heap)
    assert checked.compiler and not checked.in_registers  # vectorized, its sums in memory


def test_strided_innermost_loops_stay_scalar():
    vec = extract(column_major(), CPU)
    assert raw(vec, "main.est.lanes") == 1
    assert raw(vec, "main.est.simd.explicit") == 0 == raw(vec, "main.est.simd.compiler")


def test_faster_schedules_get_smaller_time_estimates():
    tiled = extract(register_tile(4), CPU)
    scalar = extract(column_major(), CPU)
    # A chain of dependent adds in memory: one tile row, nothing unrolled.
    chained = extract(register_tile(1, vectorize=False, unroll=False), CPU)
    total = FEATURE_NAMES.index("kernel.time.total")
    assert tiled[total] < chained[total] and tiled[total] < scalar[total]
    # At best the estimate reaches the ideal time: ratios of at least about 1.
    assert raw(tiled, "kernel.time.total") >= 0.9


def test_a_parallel_loop_inside_a_serial_one_starts_a_region_per_iteration():
    def split_parallel(outer_first: bool):
        sch = Schedule(MATMUL, seed=0)
        i, j, k = sch.get_loops(sch.get_block("matmul"))
        i0, i1 = sch.split(i, [4, None])
        if outer_first:
            sch.parallel(i0)
        else:
            sch.parallel(i1)
        return sch.func

    outermost, nested = extract(split_parallel(True), CPU), extract(split_parallel(False), CPU)
    assert raw(nested, "kernel.time.fork") == pytest.approx(4 * raw(outermost, "kernel.time.fork"))
    _, est = main_estimate(split_parallel(True))
    _, serial = main_estimate(MATMUL)
    # 4 iterations on the target's cores, each running a quarter of the work.
    cores = CPU.num_cores
    speedup = 4 / -(-4 // cores)
    assert est.issue == pytest.approx(serial.issue / speedup)


def test_time_columns_are_finite_and_zero_off_the_cpu():
    for func in (MATMUL, register_tile(4), column_major()):
        vec = extract(func, CPU)
        times = [raw(vec, f"kernel.{n}") for n in TIME_COLUMNS]
        assert np.isfinite(times).all() and min(times) >= 0
    gpu = extract(MATMUL, Target("cuda -arch=sm_90"))
    for name in [f"kernel.{n}" for n in TIME_COLUMNS] + [f"main.{n}" for n in STORE_COLUMNS]:
        assert raw(gpu, name) == 0, name
