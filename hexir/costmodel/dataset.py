"""The cost model's training data: one row per measured candidate, grouped by workload.

A row holds the candidate's feature vector and its latency (None when it failed). Labels are
made per workload when the model trains: best latency / latency, so the fastest candidate of
each workload scores 1 whatever its size, and a failed one 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hexir.costmodel.features import NUM_FEATURES


class TrainingSet:
    """Rows keyed by (workload key, candidate key): a candidate measured again keeps its best
    latency (noise only ever adds time), and a valid measurement beats a failure."""

    def __init__(self) -> None:
        self.workloads: list[str] = []
        self._workload_index: dict[str, int] = {}
        self._rows: dict[tuple[str, str], int] = {}
        self.candidate_keys: list[str] = []
        self.vectors: list[np.ndarray] = []
        self.latencies: list[float] = []  # nan: failed
        self.groups: list[int] = []  # index into self.workloads

    def __len__(self) -> int:
        return len(self.vectors)

    def add(self, workload: str, candidate: str, vector: np.ndarray, latency: float | None) -> None:
        """Add (or update) the row of one measured candidate; latency None when it failed."""
        seconds = math.nan if latency is None else float(latency)
        row = self._rows.get((workload, candidate))
        if row is not None:
            old = self.latencies[row]
            if math.isnan(old) or seconds < old:
                self.latencies[row] = seconds
            return
        if workload not in self._workload_index:
            self._workload_index[workload] = len(self.workloads)
            self.workloads.append(workload)
        self._rows[(workload, candidate)] = len(self.vectors)
        self.candidate_keys.append(candidate)
        self.vectors.append(np.asarray(vector, dtype=np.float32))
        self.latencies.append(seconds)
        self.groups.append(self._workload_index[workload])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Features, labels (best / latency per workload, failed 0) and group ids, rows sorted
        by group (as XGBoost's ranking objectives want them)."""
        groups = np.asarray(self.groups, dtype=np.int64)
        order = np.argsort(groups, kind="stable")
        x = np.stack(self.vectors)[order] if self.vectors else np.zeros((0, NUM_FEATURES))
        return x, normalized_labels(np.asarray(self.latencies), groups)[order], groups[order]

    def learnable(self) -> bool:
        """Whether some workload has two rows with different labels (something to learn)."""
        _, labels, groups = self.arrays()
        for g in np.unique(groups):
            if np.ptp(labels[groups == g]) > 0:
                return True
        return False

    def save(self, path: Path) -> None:
        """An .npz of plain arrays (loads without pickle)."""
        np.savez_compressed(
            path,
            vectors=np.stack(self.vectors) if self.vectors else np.zeros((0, NUM_FEATURES)),
            latencies=np.asarray(self.latencies, dtype=np.float64),
            groups=np.asarray(self.groups, dtype=np.int64),
            workloads=np.asarray(self.workloads, dtype=np.str_),
            candidates=np.asarray(self.candidate_keys, dtype=np.str_),
        )

    @classmethod
    def load(cls, path: Path) -> TrainingSet:
        data = np.load(path, allow_pickle=False)
        out = cls()
        workloads = [str(w) for w in data["workloads"]]
        for vector, latency, group, candidate in zip(
            data["vectors"], data["latencies"], data["groups"], data["candidates"], strict=True
        ):
            seconds = None if math.isnan(latency) else float(latency)
            out.add(workloads[int(group)], str(candidate), vector, seconds)
        return out


def normalized_labels(latencies: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """best latency / latency within each group; 0 where the latency is nan (a failure)."""
    labels = np.zeros(len(latencies))
    for g in np.unique(groups):
        rows = groups == g
        valid = rows & ~np.isnan(latencies)
        if valid.any():
            labels[valid] = latencies[valid].min() / latencies[valid]
    return labels
