"""The numerics a measurement checks a candidate with: fresh random inputs (seeded per workload,
never zeros), outputs poisoned before every run, and the comparison with the reference.

    inputs = random_inputs(func, workload_seed(key))
    outputs = poisoned_outputs(func)          # NaN (floats): anything left unwritten shows
    kernel(*inputs, *outputs)
    problem = mismatch(outputs, expected, rtol, atol)   # None when they agree
    inputs, expected = reference(workload, key)          # the unscheduled kernel's answer
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexir.ir.arrays import aligned, aligned_empty
from hexir.ir.dtype import numpy_dtype
from hexir.ir.tir import PrimFunc
from hexir.runtime.build import build
from hexir.runtime.target import Target

Arrays = list[np.ndarray]


def reference(
    workload: PrimFunc, workload_key: str, target: Target | str = "cpu"
) -> tuple[Arrays, Arrays]:
    """The workload's inputs and the outputs its unscheduled kernel computes from them."""
    inputs = random_inputs(workload, workload_seed(workload_key))
    outputs = poisoned_outputs(workload)
    build(workload, target)(*inputs, *outputs)
    return inputs, outputs


def workload_seed(workload_key: str) -> int:
    """The seed of a workload's inputs: the same in every process for the same workload."""
    return int(workload_key[:12], 16)


def random_inputs(func: PrimFunc, seed: int) -> Arrays:
    """Random arrays for `func`'s input params: standard normal floats, small integers."""
    rng = np.random.default_rng(seed)
    arrays = []
    for buffer in func.inputs:
        dtype = numpy_dtype(buffer.dtype)
        shape = tuple(buffer.shape)
        if dtype.kind == "b":
            values = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            values = rng.integers(1, 50, size=shape).astype(dtype)
        else:
            values = rng.standard_normal(shape).astype(dtype)
        arrays.append(aligned(values))  # as the model's buffers: timed at the same alignment
    return arrays


def poisoned_outputs(func: PrimFunc) -> Arrays:
    """Fresh output arrays holding a value no kernel computes: NaN, or the integer minimum."""
    return [poison(aligned_empty(b.shape, numpy_dtype(b.dtype))) for b in func.outputs]


def poison(array: np.ndarray) -> np.ndarray:
    """Fill `array` in place with its poison value; returns it."""
    if array.dtype.kind == "f":
        array.fill(np.nan)
    elif array.dtype.kind in "iu":
        array.fill(np.iinfo(array.dtype).min)
    else:
        array.fill(True)
    return array


def mismatch(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float
) -> str | None:
    """None when every output is close to the reference, else what differs, in one line."""
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.dtype.kind == "b":
            bad = g != w
        else:
            bad = ~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if not bad.any():
            continue
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        return (
            f"output {n} differs from the unscheduled kernel's at {int(bad.sum())} of "
            f"{bad.size} elements (rtol={rtol}, atol={atol}); first at {list(where)}: "
            f"got {g[where].item()!r}, expected {w[where].item()!r}"
        )
    return None
