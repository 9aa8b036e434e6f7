"""Sampling: decisions drawn from the schedule's own generator, checked when given."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from schedule_fixtures import MATMUL, check, func, raises_unchanged

import hexir
from hexir.ir.tir import For
from hexir.schedule import INLINE, ROOT, LoopRV, Schedule, compute_location_candidates


def loops(sch: Schedule, block: str) -> list:
    return sch.get_loops(sch.get_block(block))


@pytest.mark.parametrize("n, max_inner", [(1, 0), (2, 16), (3, 4), (4, 1), (3, 0)])
def test_perfect_tiles_multiply_to_the_extent(n: int, max_inner: int) -> None:
    before = func(MATMUL)
    state = random.getstate()
    for seed in range(20):
        sch = Schedule(before, seed=seed)
        i, _, _ = loops(sch, "matmul")
        tile = [sch.get(v) for v in sch.sample_perfect_tile(i, n=n, max_innermost_factor=max_inner)]
        assert len(tile) == n and math.prod(tile) == 64  # type: ignore[arg-type]
        assert max_inner < 1 or n == 1 or tile[-1] <= max_inner  # type: ignore[operator]
        assert sch.trace.decisions == [(2, tuple(tile))]
    assert random.getstate() == state  # never the global generator


def test_a_seed_reproduces_every_decision() -> None:
    def decisions(seed: int) -> list:
        sch = Schedule(func(MATMUL), seed=seed)
        i, j, k = loops(sch, "matmul")
        for loop in (i, j, k):
            sch.split(loop, sch.sample_perfect_tile(loop, n=3))
        sch.sample_categorical([1, 2, 3], [0.2, 0.3, 0.5])
        return sch.trace.decisions

    assert decisions(5) == decisions(5)
    assert len({str(decisions(s)) for s in range(10)}) > 1


def test_sampled_tiles_drive_split() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=11)
    i, j, k = loops(sch, "matmul")
    tiles = sch.sample_perfect_tile(j, n=3, max_innermost_factor=8)
    j0, j1, j2 = sch.split(j, tiles)
    assert [sch.get(x).extent for x in (j0, j1, j2)] == [sch.get(v) for v in tiles]
    check(sch, before)


def test_invalid_tile_decisions() -> None:
    sch = Schedule(func(MATMUL), seed=0)
    i, _, _ = loops(sch, "matmul")
    tile = sch.sample_perfect_tile
    raises_unchanged(sch, lambda: tile(i, n=2, decision=[8, 4]), "multiply to 32, not 64")
    raises_unchanged(sch, lambda: tile(i, n=2, decision=[2, 32]), "max_innermost_factor=16")
    raises_unchanged(sch, lambda: tile(i, n=3, decision=[8, 8]), "3 positive integers")
    raises_unchanged(sch, lambda: tile(i, n=2, decision=[8.0, 8]), "positive integers")
    raises_unchanged(sch, lambda: tile(i, n=0), "n must be positive")
    raises_unchanged(sch, lambda: tile(i, n=1, max_innermost_factor=8), "max_innermost_factor=8")


def test_sample_categorical() -> None:
    sch = Schedule(func(MATMUL), seed=0)
    draws = Counter(
        sch.get(sch.sample_categorical([0, 16, 64], [0.1, 0.0, 0.9])) for _ in range(300)
    )
    assert draws[16] == 0 and draws[64] > draws[0] > 0
    v = sch.sample_categorical([0, 16, 64], [0.1, 0.0, 0.9], decision=1)
    assert sch.get(v) == 16 and str(v) == "16"
    assert str(sch.trace.instructions[-1]) == (
        f"v{v.index} = sch.sample_categorical(candidates=[0, 16, 64], probs=[0.1, 0.0, 0.9], "
        "decision=1)"
    )
    cat = sch.sample_categorical
    raises_unchanged(sch, lambda: cat([1, 2], [0.5, 0.5], decision=2), "not an index")
    raises_unchanged(sch, lambda: cat([1, 2], [0.5]), "2 candidates and 1 probabilities")
    raises_unchanged(sch, lambda: cat([1, 2], [-1.0, 2.0]), "non-negative")
    raises_unchanged(sch, lambda: cat([1.5, 2], [1.0, 1.0]), "integers")  # type: ignore[list-item]


def test_sample_compute_location() -> None:
    before = hexir.workload("softmax", M=4, N=8)
    sch = Schedule(before, seed=0)
    # softmax_max (a reduction) is read by softmax_exp under %i1, %i2: root or those loops.
    loc = sch.sample_compute_location(sch.get_block("softmax_max"), decision=2)
    assert isinstance(loc, LoopRV) and str(loc) == "i2"
    node = sch.get(loc)
    assert isinstance(node, For) and node.var.name == "i2"
    assert sch.get(sch.sample_compute_location(sch.get_block("softmax_max"), decision=0)) is ROOT
    # softmax_exp is elementwise into an intermediate: inlinable; its two readers share no loop.
    exp = sch.get_block("softmax_exp")
    assert sch.get(sch.sample_compute_location(exp, decision=1)) is INLINE
    raises_unchanged(sch, lambda: sch.sample_compute_location(exp, decision=2), "not an index")
    root = sch.sample_compute_location(exp, decision=0)
    raises_unchanged(sch, lambda: sch.split(root, [2, None]), "expected a loop, got root")
    block = sch.get(sch.get_block("softmax_max"))
    candidates = compute_location_candidates(sch.func, block)  # type: ignore[arg-type]
    assert [str(c) for c in candidates] == ["root", "%i1", "%i2"]
    drawn = set()
    for _ in range(40):
        where = sch.get(sch.sample_compute_location(sch.get_block("softmax_max")))
        drawn.add(where.var.name if isinstance(where, For) else str(where))
    assert drawn == {"root", "i1", "i2"}
    assert "= sch.sample_compute_location(block=b0, decision=2)" in str(sch.trace)
    assert sch.trace.apply(before).trace == sch.trace
    check(sch, before, numerics=False)
