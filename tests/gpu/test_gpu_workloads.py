"""The seven workloads on the GPU: each builds with its hand GPU schedule, runs, and matches
numpy on fresh random inputs, the output poisoned with NaN before every run (so an element the
kernel never writes fails the check)."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.ir.dtype import numpy_dtype
from hexir.ir.tir import PrimFunc
from hexir.schedule.handwritten import gpu_schedule

pytestmark = pytest.mark.gpu

WORKLOADS = [
    ("matmul", dict(M=256, N=192, K=128)),
    ("matmul", dict(M=100, N=60, K=36)),  # tiles that do not divide: predicated
    ("batch_matmul", dict(B=3, M=64, N=96, K=80)),
    ("dense", dict(M=64, N=200, K=96, bias=True, activation="relu")),
    ("conv2d", dict(N=2, C=16, H=14, W=14, K=32, R=3, S=3, padding=1)),
    ("matmul", dict(M=1, N=600, K=96)),  # one row: columns over blocks and threads
    ("dense", dict(M=1, N=300, K=130, bias=True)),
    ("softmax", dict(M=48, N=300)),
    ("log_softmax", dict(M=48, N=197)),
    ("layer_norm", dict(M=48, N=300)),
    ("reduce_sum", dict(M=48, N=300)),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def _inputs(func: PrimFunc, rng: np.random.Generator) -> list[np.ndarray]:
    n_in = len(func.params) - func.num_outputs
    return [rng.standard_normal(b.shape).astype(numpy_dtype(b.dtype)) for b in func.params[:n_in]]


def _poisoned(func: PrimFunc) -> list[np.ndarray]:
    n_in = len(func.params) - func.num_outputs
    return [np.full(b.shape, np.nan, numpy_dtype(b.dtype)) for b in func.params[n_in:]]


@pytest.mark.parametrize(
    "name,shape", WORKLOADS, ids=[f"{n}-{'x'.join(map(str, s.values()))}" for n, s in WORKLOADS]
)
def test_workload_matches_numpy_on_the_gpu(cache, name, shape, rng):
    func = hexir.workload(name, **shape)
    kernel = hexir.build(gpu_schedule(func).func, target="cuda")  # the visible GPU's arch
    assert kernel.resources["spill_bytes"] == 0
    for _ in range(2):  # fresh inputs, fresh poison
        inputs, outputs = _inputs(func, rng), _poisoned(func)
        kernel(*inputs, *outputs)
        for out, ref in zip(outputs, hexir.reference(func, inputs), strict=True):
            assert not np.isnan(out).any(), "the kernel left elements unwritten"
            np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4)


def test_timing_a_workload_leaves_its_result(cache, rng):
    func = hexir.workload("matmul", M=256, N=256, K=256)
    kernel = hexir.build(gpu_schedule(func).func, target="cuda")
    inputs, (out,) = _inputs(func, rng), _poisoned(func)
    with knobs.scope(timing_warmup=2, timing_repeats=5, timing_min_seconds=0.0):
        seconds = kernel.time(*inputs, out)
    assert seconds > 0
    np.testing.assert_allclose(out, inputs[0] @ inputs[1], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize(
    "name,shape,dtype",
    [
        ("matmul", dict(M=256, N=256, K=128), "float16"),
        ("matmul", dict(M=128, N=256, K=192), "bfloat16"),
        ("batch_matmul", dict(B=2, M=128, N=128, K=64), "float16"),
        ("dense", dict(M=128, N=256, K=128), "float16"),
    ],
)
def test_tensor_core_workloads_match_numpy_on_the_gpu(cache, name, shape, dtype, rng):
    """float16/bfloat16 contractions take mma.sync (handwritten_mma.py) by default."""
    func = hexir.workload(name, dtype=dtype, **shape)
    kernel = hexir.build(gpu_schedule(func).func, target="cuda")
    assert "mma.sync" in kernel.source and kernel.resources["spill_bytes"] == 0
    for _ in range(2):
        inputs, outputs = _inputs(func, rng), _poisoned(func)
        kernel(*inputs, *outputs)
        (out,) = outputs
        (ref,) = hexir.reference(func, inputs)
        got, want = out.astype(np.float32), np.asarray(ref).astype(np.float32)
        assert not np.isnan(got).any(), "the kernel left elements unwritten"
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
