"""XGBModel: gradient-boosted trees over kernel features, trained on measured candidates.

    model = XGBModel(seed=0)
    model.predict(cands)                      # random (seeded) until it has data
    model.update(cands, results)              # trains once there is enough, then as it grows
    model.save("tuning_logs/cpu.model")       # a directory: XGBoost JSON, sidecar, data
    model = XGBModel.load("tuning_logs/cpu.model")
    model = XGBModel.from_database(db, "cpu") # learn from every quiet record of a target

**Objective.** `rank:pairwise` (LambdaMART's pairwise loss) with one query group per
workload, on labels best latency / latency. The search only ever compares candidates of one
workload, so order within a workload is all a score needs to get right; a pairwise loss
spends the model's capacity on exactly that, and is blind to how fast one workload is
compared to another, which is what lets a model trained on some workloads rank the
candidates of another (benchmarks/costmodel_quality.py measures both). A pack-sum objective
(MetaSchedule's) needs per-store vectors; ours pools stores into one kernel vector, so the
ranking loss is the one that fits. `objective="reg:squarederror"` regresses the labels
instead (kept for comparison).

**Prior.** The trees start from the analytic estimate of the kernel's time (estimate.py,
the feature `kernel.time.total`): every score is `-prior_weight * kernel.time.total` (log2 of
1 + the estimate over the ideal time) plus the trees' sum, which is then what they learn to
correct, rather than rediscover the roofline from raw counts. On the few hundred records of
benchmarks/costmodel_quality.py the estimate alone ranks about as well as the trees on top of
it (it prints both); the trees are there for what it misses, which a tune's thousands of rows
can show them. Ranking objectives only (a regression fits the labels themselves);
`prior_weight=0` turns it off.

**What it learns from.** A result timed while something else ran on the machine (suspect:
its calibration past `calibration_threshold`, by default the `measure_calibration_threshold`
knob; hexir/search/calibration.py) is not learned from: such a time is the other job's as
much as the kernel's (a busy machine's conv2d records cluster at 7.3, 11.3 and 15.5 ms, whole
multiples of a time slice), and one in three records of its database taught the model noise.

**When it trains.** Training restarts from scratch on every row (a few thousand rows train
in well under a second), but only once the rows have grown by `knobs.costmodel_retrain_growth`
since the last training, so a long tune does not retrain after every small batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hexir import knobs
from hexir.costmodel.dataset import TrainingSet
from hexir.costmodel.features import FEATURE_NAMES, NUM_FEATURES, extract
from hexir.errors import CostModelError, ResourceError, ScheduleError
from hexir.runtime.target import Target

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.database.record import Record
    from hexir.ir.tir import PrimFunc
    from hexir.search.measure import Candidate, MeasureResult

FORMAT = "hexir-xgb-model"
FORMAT_VERSION = 2  # 2: the prior (prior_weight) and the calibration threshold
# Rows before the first training (below it, scores stay random).
MIN_TRAIN_ROWS = 8
# Feature vectors kept per model, by candidate key; the cache starts over beyond it.
FEATURE_CACHE_LIMIT = 200_000
DEFAULT_PARAMS: dict[str, Any] = {
    "max_depth": 6,
    "eta": 0.1,
    "min_child_weight": 0.0,
    "subsample": 0.9,
    "colsample_bytree": 0.8,
    "lambdarank_pair_method": "mean",
    "lambdarank_num_pair_per_sample": 16,
    "tree_method": "hist",
    # The data is small (hundreds to thousands of rows): threads cost more than they save,
    # and on a busy machine OpenMP threads wait on each other.
    "nthread": 1,
}
DEFAULT_ROUNDS = 200
# The column the prior reads, and its weight per doubling of the estimated time.
PRIOR_COLUMN = FEATURE_NAMES.index("kernel.time.total")
DEFAULT_PRIOR_WEIGHT = 2.0


class XGBModel:
    """The XGBoost cost model (see the module docstring); implements `CostModel`.

    It trains on candidates of one target only (the first it is given); `params` override
    XGBoost's training parameters, `retrain_growth` and `calibration_threshold` the knobs
    (`costmodel_retrain_growth`, `measure_calibration_threshold`); `prior_weight` weighs the
    analytic estimate the trees start from."""

    def __init__(
        self,
        seed: int | None = 0,
        *,
        objective: str = "rank:pairwise",
        rounds: int = DEFAULT_ROUNDS,
        params: dict[str, Any] | None = None,
        retrain_growth: float | None = None,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        calibration_threshold: float | None = None,
    ) -> None:
        self.seed = seed
        self.objective = objective
        self.rounds = rounds
        self.params = {**DEFAULT_PARAMS, **(params or {})}
        self.retrain_growth = retrain_growth
        self.prior_weight = prior_weight
        self.calibration_threshold = calibration_threshold
        self.rng = np.random.default_rng(seed)
        self.data = TrainingSet()
        self.target_key: str | None = None
        self.booster: Any = None  # xgboost.Booster once trained
        self.trained_rows = 0
        self._features: dict[str, np.ndarray] = {}

    def update(self, candidates: list[Candidate], results: list[MeasureResult]) -> None:
        """Add the measured candidates (a failure labels 0; a suspect result is left out) and
        retrain if the data grew enough."""
        if len(candidates) != len(results):
            raise ValueError(f"{len(candidates)} candidates but {len(results)} results")
        threshold = self._threshold()
        pairs = zip(candidates, results, strict=True)
        kept = [(c, r) for c, r in pairs if not r.suspect(threshold)]
        vectors = self.features([c for c, _ in kept])
        for (cand, result), vector in zip(kept, vectors, strict=True):
            self.data.add(cand.workload_key, cand.candidate_key, vector, fastest(result))
        if self._should_train():
            self.train()

    def _threshold(self) -> float:
        if self.calibration_threshold is not None:
            return self.calibration_threshold
        return knobs.get().measure_calibration_threshold

    @property
    def informed(self) -> bool:
        """Whether the scores mean something: False (random scores) before training."""
        return self.booster is not None

    def predict(self, candidates: list[Candidate]) -> np.ndarray:
        """Scores, higher for faster; seeded random ones before the model has trained."""
        if self.booster is None:
            return self.rng.random(len(candidates))
        if not candidates:
            return np.zeros(0)
        x = self.features(candidates)
        return self.booster.inplace_predict(x, base_margin=self.prior(x)).astype(np.float64)

    def prior(self, x: np.ndarray) -> np.ndarray:
        """The scores the trees start from: the analytic estimate, faster higher."""
        weight = self.prior_weight if self.objective.startswith("rank:") else 0.0
        return -weight * x[:, PRIOR_COLUMN].astype(np.float64)

    def features(self, candidates: list[Candidate]) -> np.ndarray:
        """The feature matrix of `candidates` (rows cached by candidate key)."""
        out = np.empty((len(candidates), NUM_FEATURES), dtype=np.float32)
        for i, cand in enumerate(candidates):
            self._check_target(cand.target)
            vector = self._features.get(cand.candidate_key)
            if vector is None:
                if len(self._features) >= FEATURE_CACHE_LIMIT:
                    self._features.clear()
                vector = extract(cand.func, cand.target)
                self._features[cand.candidate_key] = vector
            out[i] = vector
        return out

    def train(self) -> None:
        """Train on every row now (the first training, or a forced retraining)."""
        import xgboost as xgb

        x, labels, groups = self.data.arrays()
        matrix = xgb.DMatrix(x, label=labels, qid=groups, base_margin=self.prior(x))
        params = {**self.params, "objective": self.objective, "verbosity": 0}
        if self.seed is not None:
            params["seed"] = self.seed
        self.booster = xgb.train(params, matrix, num_boost_round=self.rounds)
        self.trained_rows = len(self.data)

    def _should_train(self) -> bool:
        n = len(self.data)
        if self.booster is None:
            return n >= MIN_TRAIN_ROWS and self.data.learnable()
        growth = self.retrain_growth
        if growth is None:
            growth = knobs.get().costmodel_retrain_growth
        return n > self.trained_rows and n >= self.trained_rows * (1.0 + growth)

    def _check_target(self, target: Target) -> None:
        if self.target_key is None:
            self.target_key = target.key
        elif target.key != self.target_key:
            raise CostModelError(
                f"this cost model learns target {self.target_key} and was given a candidate "
                f"for {target.key}; use one model per target"
            )

    def save(self, path: str) -> None:
        """Write the model to the directory `path`: `model.json` (XGBoost's JSON format, absent
        before training), `costmodel.json` (settings, feature names, the generator's state)
        and `data.npz` (the training rows, so a loaded model keeps learning)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        if self.booster is not None:
            self.booster.save_model(str(folder / "model.json"))
        else:
            (folder / "model.json").unlink(missing_ok=True)
        self.data.save(folder / "data.npz")
        (folder / "costmodel.json").write_text(json.dumps(self._sidecar(), indent=1))

    def _sidecar(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "seed": self.seed,
            "objective": self.objective,
            "rounds": self.rounds,
            "params": self.params,
            "retrain_growth": self.retrain_growth,
            "prior_weight": self.prior_weight,
            "calibration_threshold": self.calibration_threshold,
            "target_key": self.target_key,
            "trained_rows": self.trained_rows,
            "rng_state": self.rng.bit_generator.state,
            "feature_names": list(FEATURE_NAMES),
        }

    @classmethod
    def load(cls, path: str) -> XGBModel:
        """The model `save` wrote to the directory `path`."""
        folder = Path(path)
        meta = _read_sidecar(folder)
        model = cls(
            meta["seed"],
            objective=meta["objective"],
            rounds=meta["rounds"],
            params=meta["params"],
            retrain_growth=meta["retrain_growth"],
            prior_weight=meta["prior_weight"],
            calibration_threshold=meta["calibration_threshold"],
        )
        model.rng.bit_generator.state = meta["rng_state"]
        model.target_key = meta["target_key"]
        model.data = TrainingSet.load(folder / "data.npz")
        model.trained_rows = meta["trained_rows"]
        if (folder / "model.json").exists():
            import xgboost as xgb

            model.booster = xgb.Booster(model_file=str(folder / "model.json"))
        return model

    @classmethod
    def from_database(
        cls,
        db: Database,
        target: Target | str,
        workloads: set[str] | None = None,
        **options: Any,
    ) -> XGBModel:
        """A model trained on every record of `target` in `db` (only the workload keys in
        `workloads` when given); `options` go to the constructor. Records whose traces no
        longer replay are skipped."""
        model = cls(**options)
        target = Target.of(target)
        for workload in db.workloads():
            if workloads is None or workload.key in workloads:
                model.add_records(workload.load_func(), db.records(workload.key, target), target)
        if len(model.data) >= MIN_TRAIN_ROWS and model.data.learnable():
            model.train()
        return model

    def add_records(self, func: PrimFunc, records: list[Record], target: Target) -> int:
        """Add database records of the unscheduled `func` (without training); how many. Records
        measured while something else ran (suspect), or inside a model's run, are left out."""
        from hexir.search.measure import Candidate

        added = 0
        threshold = self._threshold()
        for record in records:
            if record.suspect(threshold) or record.in_model:
                continue
            try:
                cand = Candidate.from_trace(func, record.load_trace(), target)
            except (ScheduleError, ResourceError):
                continue
            vector = self.features([cand])[0]
            latency = min(record.latencies) if record.is_valid else None
            self.data.add(cand.workload_key, cand.candidate_key, vector, latency)
            added += 1
        return added

    def __repr__(self) -> str:
        state = f"trained on {self.trained_rows} rows" if self.booster else "untrained"
        return f"XGBModel(seed={self.seed}, {self.objective}, {state})"


def fastest(result: MeasureResult) -> float | None:
    """The latency a candidate is labelled with: its fastest run. On a shared machine other
    jobs only ever add time, so the minimum is the steadiest estimate; None when it failed."""
    return min(result.latencies) if result.ok and result.latencies else None


def _read_sidecar(folder: Path) -> dict[str, Any]:
    try:
        meta = json.loads((folder / "costmodel.json").read_text())
    except (OSError, ValueError) as e:
        raise CostModelError(
            f"cannot read a saved XGBModel from {folder}: {e}; pass the directory that "
            "XGBModel.save wrote"
        ) from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CostModelError(f"{folder}/costmodel.json is not a saved XGBModel")
    if meta.get("version") != FORMAT_VERSION or meta.get("feature_names") != list(FEATURE_NAMES):
        raise CostModelError(
            f"the cost model in {folder} was saved by another version of Hexir (its format or "
            "its features differ from this one's); retrain it from the tuning database with "
            "XGBModel.from_database(db, target)"
        )
    return meta
