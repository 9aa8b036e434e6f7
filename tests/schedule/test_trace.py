"""Trace: printed Python, JSON, replay, decisions; the Schedule's handles and transactions."""

from __future__ import annotations

import json
import pickle
import random
import re

import pytest
from schedule_fixtures import check, raises_unchanged

import hexir
from hexir.errors import ScheduleError
from hexir.ir.keys import candidate_key, workload_key
from hexir.ir.tir import For, PrimFunc
from hexir.ir.visit import walk
from hexir.ops.parse import parse
from hexir.schedule import BlockRV, LoopRV, Schedule, Trace

DESIGN_TRACE = """\
b0 = sch.get_block(name="matmul")
l1, l2, l3 = sch.get_loops(block=b0)
v4, v5 = sch.sample_perfect_tile(loop=l1, n=2, max_innermost_factor=16, decision=[64, 16])
l6, l7 = sch.split(loop=l1, factors=[v4, v5])
sch.parallel(loop=l6)"""


@pytest.fixture(scope="module")
def before() -> PrimFunc:
    return hexir.workload("matmul", M=1024, N=16, K=8)


def schedule(func: PrimFunc) -> Schedule:
    sch = Schedule(func, seed=0)
    i, _, _ = sch.get_loops(sch.get_block("matmul"))
    factors = sch.sample_perfect_tile(i, n=2, max_innermost_factor=16, decision=[64, 16])
    i0, _ = sch.split(i, factors)
    sch.parallel(i0)
    return sch


def extents(func: PrimFunc) -> list[tuple[str, int, str]]:
    return [(n.var.name, n.extent, n.kind) for n in walk(func.body) if isinstance(n, For)]


def test_print_is_python_in_the_design_form(before: PrimFunc) -> None:
    sch = schedule(before)
    assert str(sch.trace) == DESIGN_TRACE
    assert extents(sch.func)[:2] == [("i0_0", 64, "parallel"), ("i0_1", 16, "serial")]
    check(sch, before)  # JSON, replay, exec of the printed Python, numerics


def test_json_is_plain_data(before: PrimFunc) -> None:
    trace = schedule(before).trace
    data = json.loads(trace.to_json())
    assert data["format"] == "hexir.trace" and data["version"] == 1
    assert data["instructions"][2] == {
        "kind": "sample_perfect_tile",
        "inputs": {"loop": {"rv": "l1"}},
        "attrs": {"n": 2, "max_innermost_factor": 16},
        "outputs": ["v4", "v5"],
        "decision": [64, 16],
    }
    assert data["instructions"][3]["inputs"] == {
        "loop": {"rv": "l1"},
        "factors": [{"rv": "v4"}, {"rv": "v5"}],
    }
    again = Trace.from_json(trace.to_json())
    assert again == trace and hash(again) == hash(trace) and str(again) == DESIGN_TRACE
    assert pickle.loads(pickle.dumps(trace)) == trace


def test_replay_on_the_same_structure_with_other_names(before: PrimFunc) -> None:
    sch = schedule(before)
    text = re.sub(r"%(i0|i1|k0)\b", lambda m: "%" + {"i0": "r", "i1": "c", "k0": "z"}[m[1]],
                  str(before))  # fmt: skip
    renamed = parse(text)
    assert renamed != before and workload_key(renamed) == workload_key(before)
    replayed = sch.trace.apply(renamed)
    assert candidate_key(replayed.func) == candidate_key(sch.func)
    assert extents(replayed.func)[0] == ("r_0", 64, "parallel")


def test_decisions_and_with_decision(before: PrimFunc) -> None:
    trace = schedule(before).trace
    assert trace.decisions == [(2, (64, 16))]
    changed = trace.with_decision(2, [128, 8])
    assert trace.decisions == [(2, (64, 16))] and changed.decisions == [(2, (128, 8))]
    assert "decision=[128, 8])" in str(changed)
    sch = changed.apply(before)
    assert extents(sch.func)[:2] == [("i0_0", 128, "parallel"), ("i0_1", 8, "serial")]
    check(sch, before)
    with pytest.raises(ValueError, match="makes no decision"):
        trace.with_decision(3, [1])
    with pytest.raises(IndexError):
        trace.with_decision(9, [1])


@pytest.mark.parametrize(
    "decision, reason",
    [
        ([64, 32], "multiply to 2048, not 1024"),
        ([32, 32], "exceeds max_innermost_factor=16"),
        ([1024], "expected 2 positive integers"),
        ([-64, -16], "expected 2 positive integers"),
    ],
)
def test_an_invalid_decision_raises_on_replay(before: PrimFunc, decision, reason) -> None:
    bad = schedule(before).trace.with_decision(2, decision)
    with pytest.raises(ScheduleError, match=reason) as info:
        bad.apply(before)
    assert info.value.brief().startswith("sample_perfect_tile: replaying `v4, v5 = ")
    assert "for %i0 in 0..1024 serial {  <-- here" in str(info.value)


def test_from_json_rejects_what_it_did_not_write(before: PrimFunc) -> None:
    good = json.loads(schedule(before).trace.to_json())
    for text, reason in [
        ("[]", "not a hexir trace"),
        (json.dumps({**good, "version": 7}), "unsupported"),
        (json.dumps({**good, "instructions": good["instructions"][1:]}), "refers to no earlier"),
        (json.dumps({**good, "instructions": [{"kind": "get_block", "outputs": ["b3"]}]}),
         "numbered by its position"),
        (json.dumps({**good, "instructions": [{"kind": "os.system"}]}), "not a primitive name"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=reason):
            Trace.from_json(text)
    for kind in ("copy", "describe", "_commit", "nonexistent"):
        trace = Trace.from_json(json.dumps({**good, "instructions": [{"kind": kind}]}))
        with pytest.raises(ScheduleError, match="unknown primitive"):
            trace.apply(before)


def test_handles_print_as_what_they_point_at(before: PrimFunc) -> None:
    sch = Schedule(before, seed=0)
    block = sch.get_block("matmul")
    i, j, k = sch.get_loops(block)
    assert [str(x) for x in (block, i, j, k)] == ["matmul", "i0", "i1", "k0"]
    assert isinstance(block, BlockRV) and isinstance(i, LoopRV) and i != j
    assert isinstance(sch.get(block), hexir.ir.tir.Block) and sch.get(i).extent == 1024
    assert [str(rv) for rv in sch.trace.instructions[1].outputs] == ["l1", "l2", "l3"]
    raises_unchanged(sch, lambda: sch.split(block, [2, None]), "expected a loop")  # type: ignore
    raises_unchanged(sch, lambda: sch.get_loops(i), "expected a block")  # type: ignore
    raises_unchanged(sch, lambda: sch.get_block("conv2d"), "no block named 'conv2d'")
    assert [str(b) for b in sch.get_child_blocks(i)] == ["matmul"]
    raises_unchanged(sch, lambda: sch.get_child_blocks(42), "not a handle")  # type: ignore
    other = Schedule(before, seed=0)
    raises_unchanged(other, lambda: other.parallel(i), "not a handle of this schedule")


def test_a_failed_primitive_leaves_no_trace(before: PrimFunc) -> None:
    sch = Schedule(before, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    raises_unchanged(sch, lambda: sch.split(i, [3, 5]), "less than the extent")
    io, ii = sch.split(i, [None, 4])
    assert (io.index, ii.index) == (4, 5)  # numbering continues as if the failure never was
    assert sch.trace.apply(before).func == sch.func


def test_copy_is_independent(before: PrimFunc) -> None:
    sch = Schedule(before, rng=random.Random(7))
    i, _, _ = sch.get_loops(sch.get_block("matmul"))
    fork = sch.copy()
    a = fork.sample_perfect_tile(i, n=2)
    b = sch.sample_perfect_tile(i, n=2)
    assert [fork.get(x) for x in a] == [sch.get(x) for x in b]  # same generator state
    fork.split(i, a)
    assert len(fork.trace) == 4 and len(sch.trace) == 3 and sch.func is before


def test_get_child_blocks() -> None:
    func = hexir.workload("softmax", M=4, N=8)
    sch = Schedule(func, seed=0)
    names = ["softmax_max", "softmax_exp", "softmax_sum", "softmax_norm"]
    assert [str(b) for b in (sch.get_block(n) for n in names)] == names
    norm = sch.get_block("softmax_norm")
    outer, _ = sch.get_loops(norm)
    assert [str(b) for b in sch.get_child_blocks(outer)] == ["softmax_norm"]
    assert sch.get_child_blocks(norm) == []
    assert "_ = sch.get_child_blocks(block_or_loop=b" in str(sch.trace)
    check(sch, func, numerics=False)


def conv2d_schedule(func: PrimFunc, decision: list[int]) -> Schedule:
    """A CPU-style conv2d schedule: tiled output channels, a cached input, a local tile."""
    sch = Schedule(func, seed=0)
    conv = sch.get_block("conv2d")
    n, k, h, w, c, r, s = sch.get_loops(conv)
    k0, k1 = sch.split(
        k, sch.sample_perfect_tile(k, n=2, max_innermost_factor=8, decision=decision)
    )
    sch.reorder(k0, n, h, k1)
    sch.parallel(k0)
    sch.unroll(s)
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, h)
    sch.decompose_reduction(conv, c)
    return sch


def test_conv2d_trace_prints_round_trips_replays_and_takes_new_decisions() -> None:
    before = hexir.workload("conv2d", N=1, C=4, H=10, W=10, K=8, R=3, S=3, padding=1)
    sch = conv2d_schedule(before, [2, 4])
    check(sch, before)  # print → exec, JSON, replay equal, numerics against the unscheduled
    trace = sch.trace
    assert "decision=[2, 4]" in str(trace)
    ((index, decision),) = trace.decisions
    assert decision == (2, 4)
    changed = trace.with_decision(index, [4, 2])
    assert changed.decisions == [(index, (4, 2))] and trace.decisions == [(index, (2, 4))]
    replayed = changed.apply(before).func
    assert replayed == conv2d_schedule(before, [4, 2]).func != sch.func
    # the output-channel tiles (loops i0..i3 are the padding stage's, i4..i7 the conv's)
    assert ("i5_0", 4, "parallel") in extents(replayed)
    with pytest.raises(ScheduleError, match="product|extent"):
        trace.with_decision(index, [3, 3]).apply(before)
