"""merge (compute_with): the second of two adjacent loops run in the first, where it reads of
the first's writes only what the same iteration wrote; its refusals; trace round trips and
numerics (the `check` fixture)."""

from __future__ import annotations

import numpy as np
from schedule_fixtures import TWO_STAGE, check, func, raises_unchanged

import hexir
from hexir.ir.tir import For
from hexir.ir.visit import walk
from hexir.schedule import Schedule


def loops(sch: Schedule, block: str) -> list:
    return sch.get_loops(sch.get_block(block))


def test_merge_runs_the_consumer_in_the_producers_loop() -> None:
    before = func(TWO_STAGE)
    sch = Schedule(before, seed=0)
    _, j = loops(sch, "scale")
    _, j2 = loops(sch, "shift")
    sch.merge(j, j2)
    assert [str(lp) for lp in loops(sch, "shift")] == ["i", "j"]
    (inner,) = [n for n in walk(sch.func.body) if isinstance(n, For) and n.var.name == "j"]
    assert [b.name for b in walk(inner) if type(b).__name__ == "Block"] == ["scale", "shift"]
    check(sch, before)


def _softmax_schedule() -> tuple[Schedule, object]:
    b = hexir.GraphBuilder("s")
    graph = b.build(b.softmax(b.input("x", (4, 256))))
    before = hexir.lower(graph)
    sch = Schedule(before, seed=0)
    rows = loops(sch, "softmax_norm")[0]
    for name in ("softmax_sum", "softmax_exp", "softmax_max"):
        sch.compute_at(sch.get_block(name), rows)
    return sch, before


def test_a_sum_merged_into_its_exps_loop_accumulates_as_they_are_made() -> None:
    sch, before = _softmax_schedule()
    _, lane = sch.split(loops(sch, "softmax_sum")[-1], [None, 16])
    partial = sch.rfactor(lane, -1)
    stretch, _ = sch.split(loops(sch, "softmax_exp")[-1], [None, 16])
    sch.merge(stretch, sch.get_loops(partial)[-2])
    sch.decompose_reduction(partial, stretch)
    check(sch, before)
    kernel = hexir.build(sch.func, "cpu")
    x = np.random.default_rng().standard_normal((4, 256)).astype(np.float32)
    out = np.empty_like(x)
    kernel(x, out)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_the_exps_and_their_sum_in_one_loop_over_the_row() -> None:
    sch, before = _softmax_schedule()
    sch.merge(loops(sch, "softmax_exp")[-1], loops(sch, "softmax_sum")[-1])
    check(sch, before)


def test_merge_refuses_what_would_change_the_result() -> None:
    sch, _ = _softmax_schedule()
    sum_loop, norm_loop = loops(sch, "softmax_sum")[-1], loops(sch, "softmax_norm")[-1]
    # the norm reads the sum each iteration writes again: the whole sum, not a partial one
    raises_unchanged(sch, lambda: sch.merge(sum_loop, norm_loop), "may write an element")
    # not adjacent: the max's loop is not right before the sum's
    max_loop = loops(sch, "softmax_max")[-1]
    raises_unchanged(sch, lambda: sch.merge(max_loop, sum_loop), "does not come right after")
    sch2 = Schedule(func(TWO_STAGE), seed=0)
    _, j = loops(sch2, "scale")
    _, j2 = loops(sch2, "shift")
    short, _ = sch2.split(j2, [None, 4])
    raises_unchanged(sch2, lambda: sch2.merge(j, short), "extents 8 and 2 differ")
    # a loop after which one that reads what it writes: the first reads what the second writes
    raises_unchanged(sch2, lambda: sch2.merge(short, j), "does not come right after")


def test_merge_refuses_a_read_of_what_another_iteration_writes() -> None:
    reversed_read = TWO_STAGE.replace("%T[vi2, vj2]", "%T[vi2, 7 - vj2]")
    assert reversed_read != TWO_STAGE
    sch = Schedule(func(reversed_read), seed=0)
    _, j = loops(sch, "scale")
    _, j2 = loops(sch, "shift")
    raises_unchanged(sch, lambda: sch.merge(j, j2), "beyond what the first writes")
