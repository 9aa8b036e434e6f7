"""Printing a batch of candidates' C with a helper process: the same C as printed here, and
a helper that dies costs nothing but its share's speed."""

from __future__ import annotations

import random

import pytest

import hexir
from hexir import knobs
from hexir.runtime.build import c_source
from hexir.search import sources
from hexir.search.evolutionary import EvolutionarySearch
from hexir.search.measure import Candidate
from hexir.search.sources import print_sources

CPU = hexir.Target("cpu")


def _fresh(seed: int, n: int) -> list[Candidate]:
    matmul = hexir.workload("matmul", M=64, N=48, K=32)
    return EvolutionarySearch(matmul, CPU, rng=random.Random(seed)).sample(n)


@pytest.mark.slow
def test_a_helper_prints_the_c_this_process_would_and_a_dead_one_is_replaced(monkeypatch):
    kept = []
    keep = Candidate.keep_source
    monkeypatch.setattr(Candidate, "keep_source", lambda c, s: (kept.append(c), keep(c, s)))
    print_sources(_fresh(0, 4), helpers=1)  # starts the helper
    helper = sources._helpers[0]
    assert helper is not None and helper._proc.poll() is None
    batch = _fresh(1, 16)
    assert not any(c.has_source for c in batch)
    kept.clear()
    with knobs.scope(vector_math=False):  # the helper prints under this context's knobs
        print_sources(batch, helpers=1)
        assert all(c.has_source for c in batch)
        assert [c.c_source for c in batch] == [c_source(c.func, CPU) for c in batch]
    assert kept and all(c in batch for c in kept)  # a share came from the helper
    assert sources._helpers[0] is helper  # kept for the next batch
    helper._proc.kill()
    helper._proc.wait()
    again = _fresh(2, 6)
    print_sources(again, helpers=1)  # the dead helper's share is printed here
    assert all(c.has_source for c in again)
    assert [c.c_source for c in again] == [c_source(c.func, CPU) for c in again]
    print_sources(_fresh(3, 4), helpers=1)  # and a new helper starts
    assert sources._helpers[0] is not None and sources._helpers[0]._proc.poll() is None
    sources.close_helpers()
    assert sources._helpers == []


def test_a_batch_printed_to_a_line_limit_keeps_the_c_that_fits_and_marks_the_rest(monkeypatch):
    batch = _fresh(4, 16)
    lines = sorted(c_source(c.func, CPU).count("\n") for c in batch)
    limit = lines[len(lines) // 2]  # about half of them print longer
    marked = []
    mark = Candidate.mark_longer
    monkeypatch.setattr(Candidate, "mark_longer", lambda c, n: (marked.append(c), mark(c, n)))
    print_sources(batch, helpers=1, max_lines=limit)
    for c in batch:
        full = c_source(c.func, CPU)
        if c.has_source:  # its C whole, as printed without a limit
            assert c.c_source == full and c.fits(limit) == (full.count("\n") <= limit)
        else:  # printed no further than the limit: longer, and so it stays
            assert full.count("\n") > limit and c.longer_than(limit) and not c.fits(limit)
    assert marked and any(not c.has_source for c in batch)
    sources.close_helpers()
