"""The cost model (DESIGN.md §6): scores candidates so the search measures the promising ones.

    model = XGBModel(seed=0)                  # or RandomModel(seed=0), or your own CostModel
    scores = model.predict(candidates)        # higher is faster
    model.update(candidates, results)         # learn from measurements
    model.save("tuning_logs/cpu.model"); XGBModel.load("tuning_logs/cpu.model")

`features.extract(func, target)` turns a scheduled kernel into the fixed-length vector the
XGBoost model learns from (`features.FEATURE_NAMES` names every column).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from hexir.search.measure import Candidate, MeasureResult


class CostModel(Protocol):
    """What the search needs of a cost model. Scores compare candidates of one workload:
    only their order means something. A model never uses the global RNG."""

    def update(self, candidates: list[Candidate], results: list[MeasureResult]) -> None:
        """Learn from measured candidates (`results[i]` measures `candidates[i]`)."""
        ...

    def predict(self, candidates: list[Candidate]) -> np.ndarray:
        """One score per candidate, higher for a faster one (float array, in order)."""
        ...

    def save(self, path: str) -> None:
        """Write the model to `path` (no pickle), so a later tune can `load` it."""
        ...

    @classmethod
    def load(cls, path: str) -> CostModel:
        """The model `save` wrote to `path`."""
        ...


from hexir.costmodel.features import FEATURE_NAMES, extract  # noqa: E402
from hexir.costmodel.random_model import RandomModel  # noqa: E402
from hexir.costmodel.xgb import XGBModel  # noqa: E402

__all__ = ["FEATURE_NAMES", "CostModel", "RandomModel", "XGBModel", "extract"]
