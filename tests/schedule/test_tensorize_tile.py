"""sch.tensorize with a tile intrinsic (x86's AMX): a matmul's rows x panels nest over its
whole reduction, structurally checked, printed as one helper call holding the accumulators in
tile registers where the compiler targets AMX and as the loops elsewhere (the same numbers
either way: both are run here), and chosen by the default schedule on a CPU with AMX."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.errors import ScheduleError
from hexir.graph.lower import lower_op
from hexir.ops.contraction import group_matmul_weight
from hexir.runtime.target import Target
from hexir.schedule import Schedule, Trace

BF16, INT8 = "x86_amx_bf16_f32", "x86_amx_u8s8"
GROUP = {"bfloat16": 2, "uint8": 4, "int8": 4}
NO_AMX = "-O3 -mno-amx-tile -mno-amx-bf16 -mno-amx-int8"  # the nest's loops, on any CPU


def grouped_matmul(m: int, k: int, n: int, a_dtype: str, w_dtype: str):
    b = hexir.GraphBuilder("t")
    group = GROUP[a_dtype]
    x = b.input("x", (m, k), a_dtype)
    w = b.input("w", (n // 16, k // group, 16, group), w_dtype)
    matmul = b.op("matmul", x, w, weight_block=16, weight_kgroup=group)
    return lower_op(b.build(matmul).ops[-1])


def tiled(func, rows: int = 32, panels: int = 2, group: int = 4) -> tuple[Schedule, object]:
    """The AMX sketch's loops (hexir/search/sketch_dot.py), the rows loop not yet tensorized."""
    sch = Schedule(func)
    block = sch.get_block("matmul")
    i, j, k = sch.get_loops(block)
    writeback = sch.cache_write(block, 0, "local")
    i0, i1 = sch.split(i, [None, rows])
    j0, j1, j2 = sch.split(j, [None, panels, 16])
    k0, k1 = sch.split(k, [None, group])
    sch.reorder(i0, j0, i1, j1, j2, k0, k1)
    outer = sch.fuse(i0, j0)
    sch.parallel(outer)
    sch.reverse_compute_at(writeback, outer, True)
    sch.decompose_reduction(block, i1)
    return sch, i1


def integers(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def run_both_ways(func, *args, out_dtype):
    """The kernel's outputs as built (AMX where this CPU has it) and built without AMX."""
    outs = []
    for cflags in (knobs.get().cflags, NO_AMX):
        with knobs.scope(cflags=cflags):
            kernel = hexir.build(func, target="cpu")
        out = np.full((args[0].shape[0], args[1].shape[0] * 16), 7, out_dtype)
        kernel(*args, out)
        outs.append((kernel.source, out))
    return outs


@pytest.mark.parametrize(
    "a_dtype, w_dtype, m, n", [("uint8", "int8", 37, 48), ("int8", "uint8", 64, 64)]
)
def test_an_8bit_tile_nest_computes_the_integer_reference(rng, a_dtype, w_dtype, m, n):
    # 37 rows: a full tile of 32 and one of 5 under the rows guard; 48 columns: panels of one.
    k = 128
    panels = 2 if n % 32 == 0 else 1
    sch, rows = tiled(grouped_matmul(m, k, n, a_dtype, w_dtype), panels=panels)
    sch.tensorize(rows, INT8)
    a, w = integers(rng, (m, k), a_dtype), integers(rng, (k, n), w_dtype)
    a[0], w[:, 0] = np.iinfo(a_dtype).max, np.iinfo(w_dtype).min  # the largest products
    want = a.astype(np.int64) @ w.astype(np.int64)
    helper = "hx_amx_u8s8(" if a_dtype == "uint8" else "hx_amx_s8u8("
    (source, out), (plain, looped) = run_both_ways(
        sch.func, a, group_matmul_weight(w, 16, 4), out_dtype=np.int32
    )
    assert helper in source and "#if defined(__AMX_TILE__) && defined(__AMX_INT8__)" in source
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(looped, want)


def test_a_bfloat16_tile_nest_computes_the_products_to_float32_rounding(rng):
    m, k, n = 20, 96, 64
    sch, rows = tiled(grouped_matmul(m, k, n, "bfloat16", "bfloat16"), group=2)
    sch.tensorize(rows, BF16)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ w.astype(np.float64)
    (source, out), (_, looped) = run_both_ways(
        sch.func, a, group_matmul_weight(w, 16, 2), out_dtype=np.float32
    )
    assert "hx_amx_bf16(" in source
    for got in (out, looped):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_the_trace_prints_and_replays_a_tile_tensorize():
    func = grouped_matmul(32, 64, 32, "uint8", "int8")
    sch, rows = tiled(func)
    sch.tensorize(rows, INT8)
    assert f'intrinsic="{INT8}")' in str(sch.trace)
    again = Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func


def test_a_nest_that_is_not_a_tile_multiply_is_refused_with_the_reason():
    sch, rows = tiled(grouped_matmul(32, 96, 32, "uint8", "int8"))  # 24 groups of 4
    before, trace = sch.func, str(sch.trace)
    with pytest.raises(ScheduleError, match="24 iterations, not a multiple of 16"):
        sch.tensorize(rows, INT8)
    assert sch.func == before and str(sch.trace) == trace  # a refusal changes nothing
    sch, rows = tiled(grouped_matmul(64, 64, 32, "uint8", "int8"), rows=64)
    with pytest.raises(ScheduleError, match="64 rows x 2 panels: at most 32 x 2"):
        sch.tensorize(rows, INT8)
    sch, rows = tiled(grouped_matmul(32, 64, 32, "uint8", "int8"))
    with pytest.raises(ScheduleError, match="not uint8 and int8|bfloat16"):
        sch.tensorize(rows, BF16)
    sch, rows = tiled(grouped_matmul(32, 64, 32, "uint8", "int8"))
    lanes, steps = sch.get_loops(sch.get_block("matmul"))[-3:-1]
    sch.reorder(steps, lanes)  # the reduction outside the lanes
    with pytest.raises(ScheduleError, match="not contiguous along the lanes"):
        sch.tensorize(rows, INT8)


@pytest.mark.parametrize("dtype", ["bfloat16", "uint8"])
def test_the_default_schedule_tiles_a_matmul_of_a_constant_for_amx(rng, dtype):
    m, k, n = 40, 128, 96
    b = hexir.GraphBuilder("t")
    if dtype == "bfloat16":
        a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        w = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    else:
        a, w = integers(rng, (m, k), "uint8"), integers(rng, (k, n), "int8")
    graph = b.build(b.relu(b.matmul(b.input("x", (m, k), dtype), b.constant(w))))
    module = hexir.compile(graph, target="cpu")
    source = module.kernels[module.commands[0].kernel].source
    target = Target("cpu")
    if target.amx_bf16 if dtype == "bfloat16" else target.amx_int8:
        assert ("hx_amx_bf16(" if dtype == "bfloat16" else "hx_amx_u8s8(") in source
    want = np.maximum(a.astype(np.float64) @ w.astype(np.float64), 0)
    got = module.run({"x": a})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_described_cpu_has_no_amx():
    described = Target("cpu -features=avx2,avx512f,fma -cores=2")
    assert not described.amx_bf16 and not described.amx_int8


def test_the_jobs_run_the_weight_in_blocks_every_row_tile_passes_over(rng, monkeypatch, tmp_path):
    # A 4 KB block: 2 of the 4 panel pairs of a 128 x 128 int8 weight; the rows inside.
    import hexir.search.sketch_dot as sketch_dot

    monkeypatch.setattr(sketch_dot, "AMX_WEIGHT_BLOCK_BYTES", 2 * 128 * 32)
    m, k, n = 70, 128, 128
    a, w = integers(rng, (m, k), "uint8"), integers(rng, (k, n), "int8")
    b = hexir.GraphBuilder("t")
    graph = b.build(b.matmul(b.input("x", (m, k), "uint8"), b.constant(w)))
    # A build cache of its own: one that scheduled this kernel before the patch would keep
    # the schedule it made then (hexir/runtime/build_cache.py).
    with hexir.knobs.scope(cache_dir=str(tmp_path)):
        module = hexir.compile(graph)
    source = module.kernels[module.commands[0].kernel].source
    jobs = 2 * 3 * 2  # weight blocks x row tiles (32, 32, 6) x panel pairs in a block
    if Target("cpu").amx_int8:
        assert f"_fused < {jobs}; " in source
    np.testing.assert_array_equal(module.run({"x": a})[0], a.astype(np.int64) @ w)
