"""sch.blockize: a loop nest made a block of its own, the inner block bound through the new
block's iter vars (TVM's scoping, checked by hexir.verify), its regions the inner block's
over the nest; the result prints, parses, replays from its trace and computes the same
values; nests it cannot take are refused with the reason and leave the schedule as it was."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import ScheduleError
from hexir.schedule import Schedule, Trace


def tiled_matmul() -> tuple[hexir.PrimFunc, Schedule, list]:
    func = hexir.workload("matmul", M=64, N=48, K=32)
    sch = Schedule(func)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    io, ii = sch.split(i, [None, 16])
    jo, ji = sch.split(j, [None, 16])
    ko, ki = sch.split(k, [None, 4])
    sch.reorder(io, jo, ko, ii, ji, ki)
    return func, sch, [io, jo, ko, ii, ji, ki]


def run(func: hexir.PrimFunc, rng: np.random.Generator) -> None:
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 48)).astype(np.float32)
    out = np.full((64, 48), np.nan, np.float32)
    hexir.build(func, "cpu")(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_a_tile_becomes_a_block_over_the_tiles_place(rng):
    func, sch, loops = tiled_matmul()
    outer = sch.blockize(loops[3])
    block = sch.get(outer)
    assert block.name == "matmul_o"
    doms = [(iv.var.name, iv.kind, iv.dom) for iv in block.iter_vars]
    assert doms == [("vi0_o", "spatial", 4), ("vi1_o", "spatial", 3), ("vk0_o", "reduce", 8)]
    text = str(sch.func)
    assert "vi0 = spatial(64) vi0_o * 16 + %i0_1" in text  # bound through the new block
    assert "writes(%C[vi0_o * 16:vi0_o * 16 + 16, vi1_o * 16:vi1_o * 16 + 16])" in text
    hexir.verify(sch.func)
    assert hexir.parse(text) == sch.func
    again = Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func
    run(sch.func, rng)


def test_the_rest_of_a_schedule_works_around_a_blockized_nest(rng):
    func, sch, loops = tiled_matmul()
    sch.blockize(loops[4])  # one row of the tile: 16 columns by 4 products
    outer = sch.fuse(loops[0], loops[1])
    sch.parallel(outer)
    sch.unroll(loops[3])
    hexir.verify(sch.func)
    run(sch.func, rng)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda s, lp: s.split(lp[2], [None, 3]), "predicate"),  # 8 by 3 does not divide
        # j's inner part outside the nest, its outer part inside: no multiple of a span
        (lambda s, lp: s.reorder(lp[4], lp[1]), "not a multiple"),
    ],
)
def test_nests_it_cannot_take_are_refused_and_nothing_changes(make, reason):
    func, sch, loops = tiled_matmul()
    make(sch, loops)
    before, trace = sch.func, str(sch.trace)
    target = sch.get_loops(sch.get_block("matmul"))[-3]
    with pytest.raises(ScheduleError, match=reason):
        sch.blockize(target)
    assert sch.func == before and str(sch.trace).startswith(trace)
