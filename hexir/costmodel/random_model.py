"""RandomModel: the cost model that knows nothing, the baseline every learned model must beat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hexir.errors import CostModelError

if TYPE_CHECKING:
    from hexir.search.measure import Candidate, MeasureResult

FORMAT = "hexir-random-model"


class RandomModel:
    """Scores every candidate uniformly at random from its own seeded generator (never the
    global RNG): a seeded search with it is reproducible. `update` learns nothing."""

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    informed = False  # its scores are noise: the search does not evolve on them

    def update(self, candidates: list[Candidate], results: list[MeasureResult]) -> None:
        if len(candidates) != len(results):
            raise ValueError(f"{len(candidates)} candidates but {len(results)} results")

    def predict(self, candidates: list[Candidate]) -> np.ndarray:
        return self.rng.random(len(candidates))

    def save(self, path: str) -> None:
        """A JSON file holding the seed and the generator's state (it goes on where it was)."""
        state = {"format": FORMAT, "seed": self.seed, "state": self.rng.bit_generator.state}
        Path(path).write_text(json.dumps(state))

    @classmethod
    def load(cls, path: str) -> RandomModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise CostModelError(f"cannot read a RandomModel from {path}: {e}") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CostModelError(
                f"{path} is not a saved RandomModel (no {FORMAT!r} format field); load it with "
                "the class that saved it (XGBModel.load for an XGBoost model)"
            )
        model = cls(data["seed"])
        model.rng.bit_generator.state = data["state"]
        return model

    def __repr__(self) -> str:
        return f"RandomModel(seed={self.seed})"
