"""The GPU runner on hand-written CUDA C: copies, launch shape, dynamic shared memory,
timing, pickling and a CUBIN for the wrong arch (independent of the CUDA code generator),
through each driver binding installed (cuda-bindings always, pycuda where it imports)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hexir import knobs
from hexir.errors import TargetError
from hexir.ir.tir import Buffer, BufferStore, For, PrimFunc, Var
from hexir.runtime.cuda_kernel import CudaKernel, _gpu, _runs_on
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import CUDA_ARCHS, Target

pytestmark = pytest.mark.gpu

N = 1000
REVERSE = """\
extern "C" __global__ void reverse(const float* __restrict__ X, float* __restrict__ Y) {
  extern __shared__ float tile[];  // dynamic: N floats
  for (int i = threadIdx.x; i < %d; i += blockDim.x) tile[i] = X[i] * 2.0f;
  __syncthreads();
  for (int i = threadIdx.x; i < %d; i += blockDim.x) Y[i] = tile[%d - 1 - i];
}
"""


def _func(n: int) -> PrimFunc:
    i = Var("i")
    X, Y = Buffer("X", (n,)), Buffer("Y", (n,))
    return PrimFunc("reverse", (X, Y), For(i, n, "serial", BufferStore(Y, (i,), X[n - 1 - i])))


def _kernel(n: int, target: Target, shared: int) -> CudaKernel:
    source = REVERSE % (n, n, n)
    binary = compile_cuda(source, target, "reverse")
    return CudaKernel(_func(n), source, binary, target, "reverse", (1,), (256,), shared)


@pytest.fixture
def cache(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path)):
        yield


@pytest.mark.parametrize("n", [N, 20000])  # 20000 floats: 80 KB, past the 48 KB default
def test_hand_written_kernel_runs(cache, n, rng):
    kernel = _kernel(n, Target("cuda"), n * 4)
    x = rng.standard_normal(n, dtype=np.float32)
    y = np.full(n, np.nan, np.float32)
    kernel(x, y)
    np.testing.assert_array_equal(y, 2.0 * x[::-1])


def _bindings() -> list[str]:
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        return ["cuda-bindings"]
    return ["cuda-bindings", "pycuda"]


def test_each_installed_driver_binding_runs_and_times_the_same_kernel(cache, rng):
    kernel = _kernel(20000, Target("cuda"), 20000 * 4)  # past the 48 KB default: opted in
    x = rng.standard_normal(20000, dtype=np.float32)
    for binding in _bindings():
        y = np.full(20000, np.nan, np.float32)
        with knobs.scope(cuda_driver=binding, timing_warmup=1, timing_repeats=3,
                         timing_min_seconds=0.0):  # fmt: skip
            assert 0 < kernel.time(x, y) < 0.1, binding
        np.testing.assert_array_equal(y, 2.0 * x[::-1], err_msg=binding)


def test_time_and_pickle(cache, rng):
    kernel = _kernel(N, Target("cuda"), N * 4)
    x = rng.standard_normal(N, dtype=np.float32)
    y = np.full(N, np.nan, np.float32)
    with knobs.scope(timing_warmup=1, timing_repeats=5, timing_min_seconds=0.0):
        assert kernel.time(x, y) > 0
    np.testing.assert_array_equal(y, 2.0 * x[::-1])
    again = pickle.loads(pickle.dumps(kernel))
    y[:] = np.nan
    again(x, y)
    np.testing.assert_array_equal(y, 2.0 * x[::-1])


def test_a_cubin_for_another_arch_is_refused(cache):
    device = _gpu().arch
    foreign = [a for a in CUDA_ARCHS if not _runs_on(a, device)]
    if not foreign:
        pytest.skip(f"every arch Hexir knows runs on {device}")
    kernel = _kernel(N, Target(f"cuda -arch={foreign[0]}"), N * 4)
    x = np.ones(N, np.float32)
    with pytest.raises(TargetError, match=f"built for {foreign[0]}, but GPU 0"):
        kernel(x, np.empty_like(x))
