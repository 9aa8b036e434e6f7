"""Randomized semantics: seeded random traces composed from every primitive, on the seven
workloads of DESIGN.md §9, CPU-style and GPU-style. Every trace replays to the same function
and every scheduled kernel computes what the unscheduled one computes.

A primitive that refuses (ScheduleError) must leave the schedule as it was; any other
exception is a bug and fails the test.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from schedule_fixtures import assert_same_numerics

import hexir
from hexir.errors import ScheduleError
from hexir.ir.tir import PrimFunc
from hexir.ir.verify import verify
from hexir.schedule import Schedule, Trace
from hexir.schedule.common import all_blocks

WORKLOADS: dict[str, Callable[[], PrimFunc]] = {
    "matmul": lambda: hexir.workload("matmul", M=24, N=40, K=20),
    "batch_matmul": lambda: hexir.workload("batch_matmul", B=2, M=12, N=16, K=10),
    "conv2d": lambda: hexir.workload("conv2d", N=1, C=4, H=9, W=9, K=6, R=3, S=3, padding=1),
    "dense": lambda: hexir.workload("dense", M=12, N=20, K=16, bias=True, activation="relu"),
    "softmax": lambda: hexir.workload("softmax", M=6, N=40),
    "layer_norm": lambda: hexir.workload("layer_norm", M=6, N=48),
    "reduce_sum": lambda: hexir.workload("reduce_sum", M=8, N=36),
}
THREAD_AXES = ("blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y", "vthread")


def attempt(sch: Schedule, primitive: Callable, *args: object) -> object:
    """Apply one primitive; a refusal must leave the function and the trace as they were."""
    func, count = sch.func, len(sch.trace.instructions)
    try:
        return primitive(*args)
    except ScheduleError:
        assert sch.func == func and len(sch.trace.instructions) == count
        raise


def _block(sch: Schedule, rng: random.Random):
    names = [b.name for b in all_blocks(sch.func.body)]
    return sch.get_block(rng.choice(names))


def _loop(sch: Schedule, rng: random.Random, block=None):
    block = block if block is not None else _block(sch, rng)
    loops = sch.get_loops(block)
    if not loops:
        raise ScheduleError("no loop around the block", "test")
    return rng.choice(loops)


def m_split(sch, rng, gpu):
    loop = _loop(sch, rng)
    if rng.random() < 0.3:
        attempt(sch, sch.split, loop, [None, rng.choice([3, 5, 8])])  # non-dividing: a predicate
    else:
        n = rng.choice([2, 3])
        attempt(sch, sch.split, loop, sch.sample_perfect_tile(loop, n=n, max_innermost_factor=8))


def m_reorder(sch, rng, gpu):
    loops = sch.get_loops(_block(sch, rng))
    if len(loops) >= 2:
        a, b = sorted(rng.sample(range(len(loops)), 2))
        attempt(sch, sch.reorder, loops[b], loops[a])


def m_fuse(sch, rng, gpu):
    loops = sch.get_loops(_block(sch, rng))
    if len(loops) >= 2:
        i = rng.randrange(len(loops) - 1)
        attempt(sch, sch.fuse, loops[i], loops[i + 1])


def m_kind(sch, rng, gpu):
    loop = _loop(sch, rng)
    if gpu:
        attempt(sch, sch.bind, loop, rng.choice(THREAD_AXES))
    else:
        attempt(sch, rng.choice([sch.parallel, sch.vectorize, sch.unroll]), loop)


def m_cache_read(sch, rng, gpu):
    block = _block(sch, rng)
    copy = attempt(sch, sch.cache_read, block, 0, rng.choice(["shared", "local", "global"]))
    if rng.random() < 0.7:
        attempt(sch, sch.compute_at, copy, _loop(sch, rng, block))


def m_cache_write(sch, rng, gpu):
    block = _block(sch, rng)
    back = attempt(sch, sch.cache_write, block, 0, "local")
    if rng.random() < 0.7:
        attempt(sch, sch.reverse_compute_at, back, _loop(sch, rng, block))


def m_reduction(sch, rng, gpu):
    block = _block(sch, rng)
    loop = _loop(sch, rng, block)
    if rng.random() < 0.5:
        attempt(sch, sch.decompose_reduction, block, loop)
    else:
        attempt(sch, sch.rfactor, loop, 0)


def m_location(sch, rng, gpu):
    block = _block(sch, rng)
    match rng.randrange(4):
        case 0:
            attempt(sch, sch.compute_inline, block)
        case 1:
            attempt(sch, sch.reverse_compute_inline, block)
        case 2:
            attempt(sch, sch.compute_at, block, sch.sample_compute_location(block))
        case _:
            attempt(sch, sch.reverse_compute_at, block, _loop(sch, rng))


MOVES = [m_split, m_split, m_reorder, m_fuse, m_kind, m_kind, m_cache_read, m_cache_write,
         m_reduction, m_location]  # fmt: skip


def random_schedule(func: PrimFunc, seed: int, gpu: bool) -> Schedule:
    rng = random.Random(seed)
    sch = Schedule(func, seed=seed)
    for _ in range(rng.randint(3, 8)):
        try:
            rng.choice(MOVES)(sch, rng, gpu)
        except ScheduleError:
            pass  # refused, and `attempt` checked that nothing changed
    return sch


def check_traces(name: str, seeds: range) -> int:
    func = WORKLOADS[name]()
    changed = 0
    for seed in seeds:
        sch = random_schedule(func, seed, gpu=seed % 2 == 1)
        trace = Trace.from_json(sch.trace.to_json())
        assert trace.apply(func).func == sch.func, f"seed {seed}: replay differs\n{sch.trace}"
        verify(sch.func)
        try:
            assert_same_numerics(func, sch.func)
        except AssertionError as e:
            raise AssertionError(f"{name}, seed {seed}:\n{sch.trace}\n{sch.func}") from e
        changed += sch.func != func
    return changed


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_few_random_traces(name):
    check_traces(name, range(4))


@pytest.mark.slow
@pytest.mark.parametrize("name", WORKLOADS)
def test_fifty_random_traces(name):
    changed = check_traces(name, range(100, 150))
    # The generator must actually schedule: most traces change the function.
    assert changed >= 40, f"only {changed} of 50 random traces changed {name}"


def test_random_schedules_are_reproducible():
    func = WORKLOADS["matmul"]()
    assert random_schedule(func, 7, False).trace == random_schedule(func, 7, False).trace
    assert np.any([random_schedule(func, s, False).func != func for s in range(5)])
