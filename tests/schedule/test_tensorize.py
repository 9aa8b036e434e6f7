"""sch.tensorize: a loop nest replaced by one instruction where it computes what the
instruction does (structurally checked, refused with the reason otherwise), printed as the
instruction where the compiler targets it and as the nest elsewhere, the same numbers either
way; and the 8-bit matmuls that the layout pass and the default schedule send to it."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import ScheduleError
from hexir.graph.lower import lower_op
from hexir.ops.contraction import group_matmul_weight
from hexir.runtime.target import Target
from hexir.schedule import Schedule, Trace
from hexir.search.sketch_dot import AMX_MIN_ROWS

VNNI = "x86_vnni_dot_u8s8"


def grouped_matmul(m: int, k: int, n: int, a_dtype: str = "uint8", w_dtype: str = "int8"):
    b = hexir.GraphBuilder("t")
    x = b.input("x", (m, k), a_dtype)
    w = b.input("w", (n // 16, k // 4, 16, 4), w_dtype)
    return lower_op(b.build(b.op("matmul", x, w, weight_block=16, weight_kgroup=4)).ops[-1])


def tiled(func, rows: int = 2, panels: int = 2) -> tuple[Schedule, object]:
    sch = Schedule(func)
    block = sch.get_block("matmul")
    i, j, k = sch.get_loops(block)
    writeback = sch.cache_write(block, 0, "local")
    i0, i1 = sch.split(i, [None, rows])
    j0, j1, j2 = sch.split(j, [None, panels, 16])
    k0, k1 = sch.split(k, [None, 4])
    sch.reorder(i0, j0, k0, i1, j1, j2, k1)
    outer = sch.fuse(i0, j0)
    sch.parallel(outer)
    sch.reverse_compute_at(writeback, outer, True)
    sch.decompose_reduction(block, k0)
    sch.unroll(i1)
    return sch, j2


def operands(rng, m, k, n, a_dtype="uint8", w_dtype="int8"):
    a = rng.integers(np.iinfo(a_dtype).min, np.iinfo(a_dtype).max, (m, k), endpoint=True)
    w = rng.integers(np.iinfo(w_dtype).min, np.iinfo(w_dtype).max, (k, n), endpoint=True)
    a, w = a.astype(a_dtype), w.astype(w_dtype)
    return a, w, a.astype(np.int64) @ w.astype(np.int64)


@pytest.mark.parametrize("a_dtype, w_dtype", [("uint8", "int8"), ("int8", "uint8")])
def test_a_tensorized_matmul_computes_the_reference_at_the_ends_of_the_ranges(
    rng, a_dtype, w_dtype
):
    func = grouped_matmul(6, 64, 64, a_dtype, w_dtype)
    sch, lanes = tiled(func)
    sch.tensorize(lanes, VNNI)
    kernel = hexir.build(sch.func, target="cpu")
    assert "#if defined(__AVX512VNNI__)" in kernel.source
    assert f"hx_dpbusd_{'u' if a_dtype == 'uint8' else 's'}(" in kernel.source
    a, w, want = operands(rng, 6, 64, 64, a_dtype, w_dtype)
    a[0], w[:, 0] = np.iinfo(a_dtype).max, np.iinfo(w_dtype).min  # the largest products
    want = a.astype(np.int64) @ w.astype(np.int64)
    out = np.empty((6, 64), np.int32)
    kernel(a, group_matmul_weight(w, 16, 4), out)
    np.testing.assert_array_equal(out, want)


def test_the_trace_prints_and_replays_tensorize():
    func = grouped_matmul(4, 32, 32)
    sch, lanes = tiled(func)
    sch.tensorize(lanes, VNNI)
    assert f'sch.tensorize(loop=l9, intrinsic="{VNNI}")' in str(sch.trace)
    again = Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func
    assert f'tensorize = "{VNNI}"' in str(sch.func)


def test_a_nest_that_is_not_the_instruction_is_refused_with_the_reason():
    func = grouped_matmul(4, 32, 32)
    sch, lanes = tiled(func)
    inner = sch.get_loops(sch.get_block("matmul"))[-1]
    before, trace = sch.func, str(sch.trace)
    with pytest.raises(ScheduleError, match="the loop has 4 iterations, the intrinsic 16"):
        sch.tensorize(inner, VNNI)
    assert sch.func == before and str(sch.trace) == trace  # a refusal changes nothing
    with pytest.raises(ScheduleError, match="unknown intrinsic 'mma'"):
        sch.tensorize(lanes, "mma")
    b = hexir.GraphBuilder("t")
    x, w = b.input("x", (4, 32), "int8"), b.input("w", (2, 8, 16, 4), "int8")
    signed = lower_op(b.build(b.op("matmul", x, w, weight_block=16, weight_kgroup=4)).ops[-1])
    sch, lanes = tiled(signed)
    with pytest.raises(ScheduleError, match="not one int8 and one uint8"):
        sch.tensorize(lanes, VNNI)
    sch, lanes = tiled(func)
    k1 = sch.get_loops(sch.get_block("matmul"))[-1]
    sch.reorder(k1, lanes)  # the 4 products outside the 16 lanes
    with pytest.raises(ScheduleError, match="is not one loop of 4 iterations"):
        sch.tensorize(lanes, VNNI)


@pytest.mark.parametrize("m, k, n", [(1, 768, 96), (5, 64, 48), (13, 128, 256)])
def test_an_8bit_matmul_of_a_constant_runs_tensorized_by_default(rng, m, k, n):
    """The layout pass groups the weight; the default schedule tiles and tensorizes; an
    epilogue (the zero point's correction) fuses into the write-back."""
    a, w, want = operands(rng, m, k, n)
    b = hexir.GraphBuilder("t")
    x = b.input("x", (m, k), "uint8")
    correction = rng.integers(-1000, 1000, n).astype(np.int32)
    graph = b.build(b.sub(b.matmul(x, b.constant(w)), b.constant(correction)))
    module = hexir.compile(graph, target="cpu")
    assert len(module.commands) == 1
    source = module.kernels[module.commands[0].kernel].source
    target = Target("cpu")
    if target.amx_int8 and m >= AMX_MIN_ROWS and k % 64 == 0:  # AMX's tiles: one of 13 x 128
        assert "hx_amx_u8s8(" in source
    elif target.int8_dot:
        assert "hx_dpbusd_u(" in source
    np.testing.assert_array_equal(module.run({"x": a})[0], want - correction)


def test_a_ragged_row_tile_runs_the_instruction_under_its_guard(rng):
    """13 rows in tiles of 6: the last tile's rows past 13 are guarded, not computed."""
    func = grouped_matmul(13, 64, 64)
    sch, lanes = tiled(func, rows=6)
    sch.tensorize(lanes, VNNI)
    source = hexir.build(sch.func, target="cpu").source
    assert "if (" in source.split("#if defined(__AVX512VNNI__)")[-1].split("#else")[0]
    a, w, want = operands(rng, 13, 64, 64)
    out = np.full((13, 64), 7, np.int32)
    hexir.build(sch.func, target="cpu")(a, group_matmul_weight(w, 16, 4), out)
    np.testing.assert_array_equal(out, want)


def test_a_blockized_nest_is_tensorized_as_a_block_and_replays(rng):
    # blockize makes the 16 x 4 nest a block of its own (its iter vars the tile's place, the
    # inner block bound through them); tensorize takes that block for the nest it holds.
    func = grouped_matmul(6, 64, 64)
    sch, lanes = tiled(func)
    nest = sch.blockize(lanes)
    assert sch.get(nest).name == "matmul_o"
    sch.tensorize(nest, VNNI)
    hexir.verify(sch.func)
    assert hexir.parse(str(sch.func)) == sch.func
    again = Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func and "sch.blockize(loop=" in str(sch.trace)
    kernel = hexir.build(sch.func, target="cpu")
    assert "hx_dpbusd_u(" in kernel.source
    a, w, want = operands(rng, 6, 64, 64)
    out = np.empty((6, 64), np.int32)
    kernel(a, group_matmul_weight(w, 16, 4), out)
    np.testing.assert_array_equal(out, want)
