"""Cost models: the protocol, seeded random scores, save/load, retraining, the database, and
XGBoost learning an order of candidates that their schedules determine, where the random model
cannot."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.costmodel import CostModel, RandomModel, XGBModel
from hexir.costmodel.dataset import normalized_labels
from hexir.costmodel.features import FEATURE_NAMES
from hexir.database import Database
from hexir.errors import CostModelError
from hexir.ir.tir import For
from hexir.ir.visit import walk
from hexir.runtime.target import Target
from hexir.search import Candidate, MeasureResult
from hexir.search.space import SearchSpace


def sample(func, n: int, seed: int) -> list[Candidate]:
    schedules = SearchSpace().sample_schedules(func, "cpu", random.Random(seed), n)
    unique = {}
    for sch in schedules:
        cand = Candidate.from_schedule(func, sch, "cpu")
        unique.setdefault(cand.candidate_key, cand)
    return list(unique.values())


@pytest.fixture(scope="module")
def tiny():
    """A few dozen tiny matmul kernels with the latencies `scaled` gives them: the cheap
    dataset of the quick tests (nothing is compiled)."""
    cands = sample(hexir.workload("matmul", M=48, N=64, K=64), 28, seed=1)
    return cands, scaled(cands)


def labels_of(cands: list[Candidate], results: list[MeasureResult]) -> np.ndarray:
    latencies = np.array([np.nan if r.median is None else r.median for r in results])
    groups = np.unique([c.workload_key for c in cands], return_inverse=True)[1]
    return normalized_labels(latencies, groups)


def pair_accuracy(scores: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """(pairs ordered right, pairs) among pairs with different labels."""
    dl = np.sign(labels[:, None] - labels[None, :])
    ds = np.sign(scores[:, None] - scores[None, :])
    mask = np.triu(dl != 0, 1)
    return int((dl[mask] == ds[mask]).sum()), int(mask.sum())


def cross_validated(make_model, cands, results, folds: int = 4) -> float:
    """Pairwise accuracy within each workload, every candidate scored by a model that was
    not trained on it."""
    rng = np.random.default_rng(0)
    right = total = 0
    for fold in np.array_split(rng.permutation(len(cands)), folds):
        test = set(fold.tolist())
        train = [i for i in range(len(cands)) if i not in test]
        model: CostModel = make_model()
        model.update([cands[i] for i in train], [results[i] for i in train])
        for key in {cands[i].workload_key for i in fold}:
            rows = [i for i in fold if cands[i].workload_key == key]
            scores = model.predict([cands[i] for i in rows])
            r, t = pair_accuracy(
                scores, labels_of([cands[i] for i in rows], [results[i] for i in rows])
            )
            right, total = right + r, total + t
    return right / total


def xgb() -> XGBModel:
    return XGBModel(seed=0, retrain_growth=0.0)


def test_random_model_is_seeded_and_leaves_the_global_rngs_alone(tiny, tmp_path):
    cands, _ = tiny
    np_state, py_state = np.random.get_state()[1].copy(), random.getstate()
    a, b = RandomModel(7), RandomModel(7)
    assert np.array_equal(a.predict(cands), b.predict(cands))
    assert not np.array_equal(a.predict(cands), RandomModel(8).predict(cands))
    a.save(str(tmp_path / "random.json"))
    loaded = RandomModel.load(str(tmp_path / "random.json"))
    assert np.array_equal(loaded.predict(cands), a.predict(cands))  # it goes on where it was
    assert np.array_equal(np.random.get_state()[1], np_state) and random.getstate() == py_state


def test_untrained_xgb_scores_at_random_with_its_seed(tiny):
    cands, _ = tiny
    assert np.array_equal(xgb().predict(cands), xgb().predict(cands))
    assert XGBModel(seed=0).booster is None


def parallel_iterations(cand: Candidate) -> int:
    """How many iterations the candidate's parallel loops share out (1 without any)."""
    loops = [n for n in walk(cand.func.body) if isinstance(n, For) and n.kind == "parallel"]
    return math.prod(loop.extent for loop in loops)


def scaled(cands: list[Candidate]) -> list[MeasureResult]:
    """The latencies of a machine with a core for every parallel iteration: the order of the
    candidates is a function of their schedules alone, with no noise to learn around."""
    return [MeasureResult((1e-3 / parallel_iterations(c),)) for c in cands]


@pytest.mark.slow
def test_xgb_learns_an_order_the_schedules_determine():
    # How well the model ranks real, noisy timings is benchmarks/costmodel_quality.py's.
    cands = sample(hexir.workload("matmul", M=48, N=64, K=64), 40, seed=1)
    cands += sample(hexir.workload("dense", M=32, N=64, K=48, activation="relu"), 40, seed=11)
    results = scaled(cands)
    assert len({r.latencies for r in results}) >= 10
    learned = cross_validated(xgb, cands, results)
    guessed = cross_validated(lambda: RandomModel(0), cands, results)
    # XGBoost orders 0.93-0.96 of the held-out pairs right on such data, random about half.
    assert learned >= 0.85 and guessed <= 0.65, (learned, guessed)


def test_save_and_load_give_identical_predictions(tiny, tmp_path):
    cands, results = tiny
    model = xgb()
    model.update(cands[:20], results[:20])
    assert model.booster is not None
    model.save(str(tmp_path / "model"))
    loaded = XGBModel.load(str(tmp_path / "model"))
    assert np.array_equal(loaded.predict(cands), model.predict(cands))
    assert len(loaded.data) == 20 and loaded.trained_rows == 20
    # The loaded model keeps learning from its saved rows plus the new ones.
    loaded.update(cands[20:], results[20:])
    model.update(cands[20:], results[20:])
    assert np.allclose(loaded.predict(cands), model.predict(cands))


def test_load_refuses_what_is_not_a_saved_model(tmp_path):
    with pytest.raises(CostModelError, match="XGBModel.save"):
        XGBModel.load(str(tmp_path / "missing"))
    RandomModel(0).save(str(tmp_path / "random.json"))
    with pytest.raises(CostModelError, match="RandomModel"):
        RandomModel.load(str(tmp_path / "missing.json"))


def test_retrains_only_when_the_data_grew_enough(tiny):
    cands, results = tiny
    model = XGBModel(seed=0, retrain_growth=0.5)
    model.update(cands[:4], results[:4])
    assert model.booster is None  # too few rows to learn from
    model.update(cands[4:10], results[4:10])
    assert model.trained_rows == 10
    model.update(cands[10:14], results[10:14])
    assert model.trained_rows == 10  # 14 < 10 * 1.5
    model.update(cands[14:15], results[14:15])
    assert model.trained_rows == 15
    with knobs.scope(costmodel_retrain_growth=0.0):
        default = XGBModel(seed=0)
        default.update(cands[:10], results[:10])
        default.update(cands[10:11], results[10:11])
        assert default.trained_rows == 11


def test_one_model_per_target(tiny):
    cands, results = tiny
    model = xgb()
    model.update(cands[:10], results[:10])
    gpu = dataclasses.replace(cands[0], target=Target("cuda -arch=sm_90"))
    with pytest.raises(CostModelError, match="one model per target"):
        model.predict([gpu])


def test_failed_candidates_label_zero():
    latencies = np.array([2.0, 1.0, np.nan, 4.0, 3.0])
    groups = np.array([0, 0, 0, 1, 1])
    assert np.allclose(normalized_labels(latencies, groups), [0.5, 1.0, 0.0, 0.75, 1.0])


def test_from_database_learns_every_record(tiny, tmp_path):
    cands, results = tiny
    db = Database(f"sqlite:///{tmp_path / 'tune.db'}")
    for cand, result in zip(cands, results, strict=True):
        db.commit_record(cand.workload, "cpu", cand.trace, result, candidate_key=cand.candidate_key)
    model = XGBModel.from_database(db, "cpu", seed=0)
    assert len(model.data) == len(cands) and model.trained_rows == len(cands)
    direct = xgb()
    direct.update(cands, results)
    assert np.allclose(model.predict(cands), direct.predict(cands))
    assert XGBModel.from_database(db, "cpu", workloads={"no such key"}).booster is None


def under_load(result: MeasureResult, calibration: float) -> MeasureResult:
    """`result` as if the calibration kernel timed right after it ran `calibration` times
    slower than when the machine was quiet."""
    return dataclasses.replace(result, build_info={**result.build_info, "calibration": calibration})


def test_results_measured_under_load_are_not_learned_from(tiny):
    cands, results = tiny
    marked = [under_load(r, 50.0 if i % 3 == 0 else 1.1) for i, r in enumerate(results)]
    quiet = sum(1 for i in range(len(cands)) if i % 3 != 0)
    model = XGBModel(seed=0, retrain_growth=0.0, calibration_threshold=2.0)
    model.update(cands, marked)
    assert len(model.data) == quiet and model.trained_rows == quiet
    with knobs.scope(measure_calibration_threshold=0.0):  # 0: no result is suspect
        everything = XGBModel(seed=0, retrain_growth=0.0)
        everything.update(cands, marked)
        assert len(everything.data) == len(cands)


def test_from_database_leaves_out_records_measured_under_load(tiny, tmp_path):
    cands, results = tiny
    db = Database(f"sqlite:///{tmp_path / 'tune.db'}")
    for i, (cand, result) in enumerate(zip(cands, results, strict=True)):
        result = under_load(result, 50.0 if i < 5 else 1.0)
        db.commit_record(cand.workload, "cpu", cand.trace, result, candidate_key=cand.candidate_key)
    model = XGBModel.from_database(db, "cpu", seed=0, calibration_threshold=2.0)
    assert len(model.data) == len(cands) - 5


def test_the_trees_start_from_the_analytic_estimate(tiny):
    """With no trees the scores are the prior: the estimate's order, fastest first."""
    cands, results = tiny
    model = XGBModel(seed=0, rounds=0, retrain_growth=0.0)
    model.update(cands, results)
    estimate = model.features(cands)[:, FEATURE_NAMES.index("kernel.time.total")]
    scores = model.predict(cands)
    assert np.array_equal(np.argsort(scores, kind="stable"), np.argsort(-estimate, kind="stable"))
    trained, plain = xgb(), XGBModel(seed=0, retrain_growth=0.0, prior_weight=0.0)
    trained.update(cands, results)
    plain.update(cands, results)
    assert not np.allclose(trained.predict(cands), plain.predict(cands))


def test_load_refuses_a_model_saved_with_other_features(tiny, tmp_path):
    cands, results = tiny
    model = xgb()
    model.update(cands, results)
    model.save(str(tmp_path / "model"))
    sidecar = tmp_path / "model" / "costmodel.json"
    meta = json.loads(sidecar.read_text())
    meta["feature_names"] = meta["feature_names"][:-1]  # a version with one column fewer
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(CostModelError, match="its features differ"):
        XGBModel.load(str(tmp_path / "model"))
