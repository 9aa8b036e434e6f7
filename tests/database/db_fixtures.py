"""Small real records for the database tests: traces of a tiny matmul with distinct decisions.

The writer functions are top level so that spawned processes can run them.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass, field

import hexir
from hexir.database import Database
from hexir.ir.tir import PrimFunc
from hexir.schedule.trace import Trace

SIZE = 64
# A PostgreSQL database whose role may create databases: the tests run there too (conftest.py).
POSTGRES_VARIABLE = "HEXIR_TEST_POSTGRES_URL"
POSTGRES_URL = os.environ.get(POSTGRES_VARIABLE) or None


@dataclass(frozen=True)
class Result:
    """What a measurement hands the database (the search's MeasureResult has these fields)."""

    latencies: tuple[float, ...] = ()
    error_kind: str | None = None
    error_message: str | None = None
    build_info: dict = field(default_factory=dict)


def tiny_func() -> PrimFunc:
    return hexir.workload("matmul", M=SIZE, N=SIZE, K=SIZE)


def _tiles() -> list[tuple[int, int, int]]:
    """Every 3-way split of SIZE with an innermost factor of at most 16."""
    divisors = [d for d in range(1, SIZE + 1) if SIZE % d == 0]
    return [
        (SIZE // (b * c), b, c)
        for b, c in itertools.product(divisors, divisors)
        if SIZE % (b * c) == 0 and c <= 16
    ]


def traces(n: int, seed: int = 0) -> list[Trace]:
    """n traces of tiny_func() with distinct tilings of i and j, so distinct candidate keys."""
    sch = hexir.Schedule(tiny_func(), seed=0)
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.split(i, sch.sample_perfect_tile(i, n=3))
    sch.split(j, sch.sample_perfect_tile(j, n=3))
    base = sch.trace
    (ti, _), (tj, _) = base.decisions
    pairs = list(itertools.product(_tiles(), _tiles()))
    random.Random(seed).shuffle(pairs)
    assert n <= len(pairs)
    return [base.with_decision(ti, a).with_decision(tj, b) for a, b in pairs[:n]]


def timed(rng: random.Random, **build_info: object) -> Result:
    latencies = tuple(rng.uniform(1e-4, 1e-2) for _ in range(3))
    return Result(latencies=latencies, build_info=dict(build_info))


def write_records(url: str, writer: int, n: int, barrier=None) -> None:  # noqa: ANN001
    """Open the database and commit n records as writer `writer`, all at once with the other
    writers (the first to open a new database creates its tables)."""
    func, rng = tiny_func(), random.Random(writer)
    todo = traces(n, seed=writer)
    if barrier is not None:
        barrier.wait()
    db = Database(url)
    for number, trace in enumerate(todo):
        db.commit_record(func, "cpu", trace, timed(rng, writer=writer, number=number))


def write_until_killed(url: str, pipe) -> None:  # noqa: ANN001
    """Commit records without end, sending each id once its commit has returned."""
    db = Database(url)
    func, rng = tiny_func(), random.Random(7)
    for trace in itertools.cycle(traces(400, seed=7)):
        record = db.commit_record(func, "cpu", trace, timed(rng))
        pipe.send(record.id)
