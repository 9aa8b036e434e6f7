"""Arrays on cache lines: what kernels read in the model is aligned as what a tune times."""

import numpy as np
import pytest

import hexir
from hexir.ir.arrays import ALIGN, aligned, aligned_empty
from hexir.ir.graph import ConstantData
from hexir.search.check import poisoned_outputs, random_inputs


@pytest.mark.parametrize(
    "shape, dtype", [((), "float32"), ((7,), "float64"), ((3, 5, 17), "int32"), ((9, 4), "bool")]
)
def test_aligned_empty_starts_on_a_cache_line(shape, dtype):
    for _ in range(8):  # a fresh allocation each time, wherever malloc puts it
        array = aligned_empty(shape, dtype)
        assert array.shape == shape and array.dtype == np.dtype(dtype)
        assert array.flags.c_contiguous and array.flags.writeable
        assert array.ctypes.data % ALIGN == 0


def test_aligned_copies_only_what_is_off_a_line(rng):
    values = rng.standard_normal(1000).astype(np.float32)
    off = aligned_empty((1001,), np.float32)[1:]  # 4 bytes past a line
    off[...] = values
    copy = aligned(off)
    assert copy is not off and copy.ctypes.data % ALIGN == 0
    np.testing.assert_array_equal(copy, values)
    assert aligned(copy) is copy
    strided = aligned(aligned_empty((10, 10), np.float32)[:, ::2])
    assert strided.flags.c_contiguous and strided.ctypes.data % ALIGN == 0


def test_constants_and_measured_arrays_are_aligned(rng):
    data = rng.standard_normal((64, 3, 7, 7)).astype(np.float32)
    constant = ConstantData(data[:, 1:])  # a view off the line
    assert constant.array.ctypes.data % ALIGN == 0
    np.testing.assert_array_equal(constant.array, data[:, 1:])
    assert not constant.array.flags.writeable
    func = hexir.workload("dense", M=37, N=53, K=29)
    for array in [*random_inputs(func, seed=1), *poisoned_outputs(func)]:
        assert array.ctypes.data % ALIGN == 0
