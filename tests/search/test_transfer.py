"""Transfer tuning: a new workload's first population takes the best records of the same op at
other sizes, replayed with adapted decisions, from a real tune into a real SQLite database."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from small_search import SMALL_SEARCH

import hexir
from hexir.costmodel import RandomModel
from hexir.database import Database
from hexir.errors import ScheduleError
from hexir.search.evolutionary import EvolutionarySearch
from hexir.search.transfer import adapt_tile, similar_workloads, skeleton, transfer
from hexir.search.tune import tune

SMALL = {**SMALL_SEARCH, "search_population": 16, "search_generations": 1,
         "search_measure_per_round": 6, "tune_confirm_best": 0}  # fmt: skip


@pytest.fixture(autouse=True)
def small():
    with hexir.knobs.scope(**SMALL):
        yield


def _matmul(m, n, k):
    return hexir.workload("matmul", M=m, N=n, K=k)


def test_a_tile_keeps_its_shape_on_another_extent():
    assert adapt_tile([4, 8, 2, 16], 48) == [1, 1, 3, 16]
    assert adapt_tile([8, 8, 16], 1024) == [8, 8, 16]  # it fits: unchanged
    assert adapt_tile([64, 16], 1000) == [100, 10]  # 10 is the divisor closest to 16 ≤ 16
    assert adapt_tile([1, 32], 7, max_inner=16) == [1, 7]
    for factors, extent in [([4, 8, 2, 16], 96), ([2, 3, 5], 7), ([16, 4], 1)]:
        out = adapt_tile(factors, extent)
        assert math.prod(out) == extent and len(out) == len(factors) and out[-1] <= 16


def test_the_skeleton_is_the_op_without_its_sizes_or_names():
    a, b = _matmul(32, 48, 16), _matmul(64, 64, 128)
    assert skeleton(str(a)) == skeleton(str(b))
    conv = hexir.workload("conv2d", N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1)
    assert skeleton(str(a)) != skeleton(str(conv))
    dense = hexir.workload("dense", M=32, N=48, K=16, activation="relu")
    assert skeleton(str(a)) != skeleton(str(dense))
    renamed = str(a).replace("%A", "%lhs").replace("@matmul(%", "@mm(%")
    assert skeleton(renamed) == skeleton(str(a))


def test_a_new_shape_starts_from_the_best_of_another(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'transfer.db'}")
    old, new = _matmul(64, 64, 64), _matmul(96, 64, 48)
    tune(old, "cpu", trials=10, database=db, seed=0, model=RandomModel(seed=0))
    assert similar_workloads(db, new, "cpu") == [hexir.workload_key(old)]
    assert similar_workloads(db, old, "cpu") == []  # only itself so far
    # Not another op: a dense of the same sizes takes nothing from the matmul.
    dense = hexir.workload("dense", M=96, N=64, K=48)
    assert similar_workloads(db, dense, "cpu") == []

    search = EvolutionarySearch(new, "cpu", rng=random.Random(0), database=db)
    population = search.best_candidates()
    assert search.transferred and all(c in population for c in search.transferred)
    best = db.best(hexir.workload_key(old), "cpu", k=len(search.transferred))
    # Each is the new workload, its tiles adapted to its extents, and computes the product.
    rng = np.random.default_rng(3)
    a = rng.standard_normal((96, 48)).astype(np.float32)
    b = rng.standard_normal((48, 64)).astype(np.float32)
    for candidate in search.transferred:
        assert candidate.workload_key == hexir.workload_key(new)
        for n, decision in candidate.trace.decisions:
            if candidate.trace.instructions[n].kind == "sample_perfect_tile":
                assert any(e % math.prod(decision) == 0 for e in (96, 64, 48))
        c = np.full((96, 64), np.nan, np.float32)
        hexir.build(candidate.func, "cpu")(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # The best of the old shape transfers: its parallel and vector choices stand.
    first = transfer(best[0].load_trace(), new, "cpu")
    assert first is not None
    kinds = [i.kind for i in first.trace.instructions]
    assert kinds == [i.kind for i in best[0].load_trace().instructions]
    # Adapted: the old trace does not replay on the new shape as it is.
    with pytest.raises(ScheduleError):
        best[0].load_trace().apply(new, target=hexir.Target("cpu"))
    assert first.trace.decisions != best[0].load_trace().decisions
    # Once only, and never where the task has records of its own.
    assert search.best_candidates() == []  # the new shape has no records yet
    again = EvolutionarySearch(old, "cpu", rng=random.Random(0), database=db)
    again.best_candidates()
    with hexir.knobs.scope(search_population=4, search_init_best_fraction=0.5):
        again.best_candidates()
    assert again.transferred == []


def test_the_knob_turns_transfer_off(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'transfer.db'}")
    tune(_matmul(64, 64, 64), "cpu", trials=4, database=db, seed=0, model=RandomModel(seed=0))
    with hexir.knobs.scope(search_transfer=False):
        search = EvolutionarySearch(_matmul(32, 64, 64), "cpu", rng=random.Random(0), database=db)
        assert search.best_candidates() == [] and search.transferred == []


@pytest.mark.slow
def test_a_tune_of_a_new_shape_measures_transferred_candidates(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'transfer.db'}")
    tune(_matmul(64, 64, 64), "cpu", trials=10, database=db, seed=0, model=RandomModel(seed=0))
    new = _matmul(128, 64, 32)
    probe = EvolutionarySearch(new, "cpu", rng=random.Random(0), database=db)
    probe.best_candidates()
    transferred = {c.candidate_key for c in probe.transferred}
    assert transferred
    # With a model that ranks the transferred candidates first, the first round measures them.
    result = tune(new, "cpu", trials=6, database=db, seed=0, model=Favours(transferred))
    measured = {r.candidate_key for r in db.records(hexir.workload_key(new), "cpu")}
    assert transferred & measured and result.tasks[0].best_latency is not None


class Favours:
    """A cost model that scores the given candidates first, the rest at random."""

    informed = True

    def __init__(self, keys: set[str]) -> None:
        self.keys, self.rng = keys, np.random.default_rng(0)

    def predict(self, candidates):  # noqa: ANN001, ANN201 - the Predictor protocol
        noise = self.rng.random(len(candidates))
        return np.array([2.0 + x if c.candidate_key in self.keys else x
                         for c, x in zip(candidates, noise, strict=True)])  # fmt: skip

    def update(self, candidates, results) -> None:  # noqa: ANN001
        pass
