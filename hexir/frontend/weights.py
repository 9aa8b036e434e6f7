"""Seeded random weights for the model zoo, scaled so activations stay of order one."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hexir.ir.graph import Value
from hexir.ops.builder import GraphBuilder


class Weights:
    """Draws every weight of one model from `numpy.random.default_rng(seed)`, in build order,
    and adds it to the builder as a named constant, so a zoo model is the same on every run."""

    def __init__(self, builder: GraphBuilder, seed: int):
        self.builder = builder
        self.rng = np.random.default_rng(seed)

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> Value:
        return self.builder.constant(normal(self.rng, shape, std, mean), name=name)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> Value:
        return self.builder.constant(uniform(self.rng, shape, low, high), name=name)

    def dense(self, name: str, n_in: int, n_out: int) -> tuple[Value, Value]:
        """A linear layer in PyTorch's layout: weight [out, in] (for `dense`), bias [out]."""
        weight = self.normal(f"{name}.weight", (n_out, n_in), 1.0 / math.sqrt(n_in))
        return weight, self.normal(f"{name}.bias", (n_out,), 0.02)

    def norm(self, name: str, channels: int) -> tuple[Value, Value]:
        """The gamma and beta of a layer norm: near one and near zero."""
        gamma = self.uniform(f"{name}.gamma", (channels,), 0.9, 1.1)
        return gamma, self.normal(f"{name}.beta", (channels,), 0.02)


def normal(rng: np.random.Generator, shape: Sequence[int], std: float, mean: float = 0.0):
    """float32 samples of N(mean, std²)."""
    array = rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)
    return array + np.float32(mean)


def uniform(rng: np.random.Generator, shape: Sequence[int], low: float, high: float):
    """float32 samples of U(low, high)."""
    return rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
