"""split, fuse, reorder: expected IR, trace round trips, replay, numerics, illegal uses."""

from __future__ import annotations

import pytest
from schedule_fixtures import (
    ADD_1D,
    ADD_2D,
    MATMUL,
    TWO_STAGE,
    check,
    func,
    raises_unchanged,
)

from hexir.errors import ScheduleError
from hexir.ir.tir import Binary, Block, For, IfThenElse, IntImm
from hexir.ir.verify import verify
from hexir.ir.visit import walk
from hexir.ops.parse import parse
from hexir.schedule import Schedule
from hexir.schedule.loops import add_predicate, reorder_loops


def loops(sch: Schedule, block: str) -> list:
    return sch.get_loops(sch.get_block(block))


# ---------------------------------------------------------------------------------------------
# split


def test_split_non_dividing_adds_a_predicate() -> None:
    before = func(ADD_1D)
    sch = Schedule(before, seed=0)
    (i,) = loops(sch, "add")
    i0, i1 = sch.split(i, [None, 32])
    assert (str(i0), str(i1)) == ("i_0", "i_1")
    assert sch.func == parse("""\
hextir.func @add(%A: buffer<1000xf32>, %B: buffer<1000xf32>, %C: buffer<1000xf32>) {
  for %i_0 in 0..32 serial {
    for %i_1 in 0..32 serial {
      block @add(vi = spatial(1000) %i_0 * 32 + %i_1) reads(%A[vi], %B[vi]) writes(%C[vi]) where %i_0 * 32 + %i_1 < 1000 {
        %C[vi] = %A[vi] + %B[vi]
      }
    }
  }
}""")  # noqa: E501
    check(sch, before)


def test_split_three_ways_with_expr_factors_then_reorder() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=1)
    i, j, k = loops(sch, "matmul")
    factors = sch.sample_perfect_tile(k, n=3, max_innermost_factor=4, decision=[2, 4, 4])
    k0, k1, k2 = sch.split(k, factors)
    sch.reorder(k0, i, j)
    assert sch.func == parse("""\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  for %k_0 in 0..2 serial {
    for %i in 0..64 serial {
      for %j in 0..48 serial {
        for %k_1 in 0..4 serial {
          for %k_2 in 0..4 serial {
            block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k_0 * 16 + %k_1 * 4 + %k_2) reads(%A[vi, vk], %B[vk, vj]) writes(%C[vi, vj]) {
              init {
                %C[vi, vj] = 0.0
              }
              %C[vi, vj] = %C[vi, vj] + %A[vi, vk] * %B[vk, vj]
            }
          }
        }
      }
    }
  }
}""")  # noqa: E501
    check(sch, before)


def test_split_names_stay_unique() -> None:
    # A buffer already named i_0 (vars and buffers share the `%` namespace).
    before = func(ADD_1D.replace("%A", "%i_0"))
    sch = Schedule(before, seed=0)
    (i,) = loops(sch, "add")
    a, b = sch.split(i, [8, None])
    assert (str(a), str(b)) == ("i_0_1", "i_1")
    check(sch, before, numerics=False)


def test_split_illegal() -> None:
    sch = Schedule(func(ADD_1D), seed=0)
    (i,) = loops(sch, "add")
    err = raises_unchanged(sch, lambda: sch.split(i, [None, None]), "at most one")
    assert "for %i in 0..1000 serial {  <-- here" in str(err)
    raises_unchanged(sch, lambda: sch.split(i, [10, 10]), "multiply to 100, less than")
    raises_unchanged(sch, lambda: sch.split(i, [0, None]), "positive")
    raises_unchanged(sch, lambda: sch.split(i, []), "no factors")
    sch.split(i, [None, 10])
    raises_unchanged(sch, lambda: sch.split(i, [None, 10]), "no longer exists")


def test_predicate_guards_stores_outside_blocks() -> None:
    loop = func(ADD_1D).body
    assert isinstance(loop, For) and isinstance(loop.body, Block)
    store = loop.body.body
    cond = Binary("<", loop.var, IntImm(500))
    guarded = add_predicate(For(loop.var, 1000, "serial", store), cond)
    assert guarded == For(loop.var, 1000, "serial", IfThenElse(cond, store))


# ---------------------------------------------------------------------------------------------
# fuse


def test_fuse() -> None:
    before = func(ADD_2D)
    sch = Schedule(before, seed=0)
    i, j = loops(sch, "add")
    fused = sch.fuse(i, j)
    assert str(fused) == "i_j_fused"
    assert sch.func == parse("""\
hextir.func @add(%A: buffer<64x48xf32>, %B: buffer<48x64xf32>, %C: buffer<64x48xf32>) {
  for %i_j_fused in 0..3072 serial {
    block @add(vi = spatial(64) floordiv(%i_j_fused, 48), vj = spatial(48) floormod(%i_j_fused, 48)) reads(%A[vi, vj], %B[vj, vi]) writes(%C[vi, vj]) {
      %C[vi, vj] = %A[vi, vj] + %B[vj, vi]
    }
  }
}""")  # noqa: E501
    sch.split(fused, [None, 100])  # 3072 = 30 * 100 + 72: a fused, predicated nest
    assert "sch.fuse(l1, l2)" in str(sch.trace)
    check(sch, before)


def test_fuse_three_loops_of_a_reduction() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    sch.fuse(*loops(sch, "matmul"))
    (fused,) = [n for n in walk(sch.func.body) if isinstance(n, For)]
    assert fused.extent == 64 * 48 * 32 and fused.var.name == "i_j_k_fused"
    check(sch, before)


def test_fuse_illegal() -> None:
    sch = Schedule(func(MATMUL), seed=0)
    i, j, k = loops(sch, "matmul")
    raises_unchanged(sch, lambda: sch.fuse(i, k), "not directly inside")
    raises_unchanged(sch, lambda: sch.fuse(j, i), "not directly inside")
    raises_unchanged(sch, lambda: sch.fuse(i, i), "given twice")
    raises_unchanged(sch, lambda: sch.fuse(), "no loops")
    two = Schedule(func(TWO_STAGE), seed=0)
    i, j = loops(two, "scale")
    raises_unchanged(two, lambda: two.fuse(i, j), "not directly inside")


# ---------------------------------------------------------------------------------------------
# reorder


def test_reorder() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    i, j, k = loops(sch, "matmul")
    sch.reorder(k, j, i)
    nest = [n for n in walk(sch.func.body) if isinstance(n, For)]
    assert [(f.var.name, f.extent) for f in nest] == [("k", 32), ("j", 48), ("i", 64)]
    check(sch, before)


def test_reorder_keeps_kinds_and_unnamed_loops() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    i, j, k = loops(sch, "matmul")
    sch.parallel(i)
    sch.reorder(k, i)  # j stays in the middle
    nest = [n for n in walk(sch.func.body) if isinstance(n, For)]
    kinds = [(f.var.name, f.kind) for f in nest]
    assert kinds == [("k", "serial"), ("j", "serial"), ("i", "parallel")]
    check(sch, before)


def test_reorder_over_a_predicate() -> None:
    before = func(ADD_2D)
    sch = Schedule(before, seed=0)
    i, j = loops(sch, "add")
    j0, j1 = sch.split(j, [None, 10])  # 48 = 4 * 10 + 8: predicated
    sch.reorder(j1, i, j0)
    (block,) = [n for n in walk(sch.func.body) if isinstance(n, Block)]
    assert block.predicate is not None
    check(sch, before)


def test_reorder_illegal() -> None:
    sch = Schedule(func(TWO_STAGE), seed=0)
    i, j = loops(sch, "scale")
    (_, j2) = loops(sch, "shift")
    err = raises_unchanged(sch, lambda: sch.reorder(j, i), "perfectly nested")
    assert "for %i in 0..16 serial {  <-- here" in str(err)
    raises_unchanged(sch, lambda: sch.reorder(j, j2), "not in the nest")
    raises_unchanged(sch, lambda: sch.reorder(i, i), "given twice")


def test_reorder_refuses_a_loop_carried_dependence() -> None:
    # A running sum along %j, stored outside any block: the store reads another element of
    # what it writes, so reorder must refuse (the pure rewrite: no block, no handles).
    scan = func("""\
hextir.func @scan(%A: buffer<8x9xf32>, %S: buffer<8x9xf32>) {
  for %i in 0..8 serial {
    for %j in 0..8 serial {
      %S[%i, %j + 1] = %S[%i, %j] + %A[%i, %j]
    }
  }
}""")
    verify(scan)
    i, j = [n for n in walk(scan.body) if isinstance(n, For)]
    with pytest.raises(ScheduleError, match="reads another element"):
        reorder_loops(scan, [j, i])
