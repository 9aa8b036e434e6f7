"""CUDA kernels on a machine without a GPU: they build (NVRTC), and only calling one says that
there is no GPU to run on. The GPU side runs in tests/gpu."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.errors import HexirError, ResourceError, TargetError
from hexir.ir.tir import Binary, Buffer, BufferStore, FloatImm, For, PrimFunc, Var
from hexir.runtime import cuda_driver, cuda_kernel
from hexir.runtime.cuda_kernel import CudaKernel, gpu_unavailable_reason
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule.handwritten import gpu_schedule

needs_no_gpu = pytest.mark.skipif(
    gpu_unavailable_reason() is None, reason="a GPU is present: tests/gpu covers it"
)

i = Var("i")
N = 256

AXPY = """\
extern "C" __global__ void axpy(const float* __restrict__ X, const float* __restrict__ Y,
                                float* __restrict__ Z) {
  int i = blockIdx.x * 128 + threadIdx.x;
  Z[i] = X[i] * 2.0f + Y[i];
}
"""


def axpy() -> PrimFunc:
    X, Y, Z = Buffer("X", (N,)), Buffer("Y", (N,)), Buffer("Z", (N,))
    return PrimFunc("axpy", (X, Y, Z), For(i, N, "serial", BufferStore(Z, (i,), Binary(
        "+", X[i] * FloatImm(2.0), Y[i]))))  # fmt: skip


@pytest.fixture
def cache(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path)):
        yield tmp_path


@pytest.fixture
def kernel(cache):
    target = Target("cuda -arch=sm_90")
    binary = compile_cuda(AXPY, target, "axpy")
    return CudaKernel(axpy(), AXPY, binary, target, "axpy", (N // 128,), (128,))


@pytest.fixture
def arrays(rng):
    return [rng.standard_normal(N, dtype=np.float32) for _ in range(3)]


def test_kernel_holds_its_build(kernel):
    assert kernel.grid == (2, 1, 1) and kernel.block == (128, 1, 1)
    assert kernel.resources["registers"] > 0 and kernel.resources["spill_bytes"] == 0
    assert kernel.source == AXPY and kernel.func == axpy()
    assert kernel.target == Target("cuda -arch=sm_90") and kernel.binary.arch == "sm_90"
    assert "axpy" in repr(kernel)


@needs_no_gpu
def test_calling_without_a_gpu_says_so(kernel, arrays):
    with pytest.raises(TargetError, match="no GPU to run on") as info:
        kernel(*arrays)
    message = str(info.value)
    assert "NVIDIA driver" in message and "\n" not in message  # one paragraph: what is missing
    with pytest.raises(TargetError, match="no GPU to run on"):
        kernel.time(*arrays)
    assert gpu_unavailable_reason() == message


@needs_no_gpu
def test_the_driver_binding_follows_the_knob_without_a_gpu():
    """pycuda where it imports, else cuda-bindings; either, asked for, says why it cannot run."""
    expected = "pycuda" if cuda_driver._imports("pycuda.driver") else "cuda-bindings"
    with knobs.scope(cuda_driver="auto"):
        assert cuda_driver.load().name == expected
    with knobs.scope(cuda_driver="cuda-bindings"):
        assert cuda_driver.load().name == "cuda-bindings"
        reason = gpu_unavailable_reason()
        assert reason.startswith("no GPU to run on: ") and "\n" not in reason
    if not cuda_driver._imports("pycuda.driver"):
        with knobs.scope(cuda_driver="pycuda"):
            assert "pycuda is not installed" in gpu_unavailable_reason()


def test_arguments_are_checked_before_the_gpu(kernel, arrays):
    with pytest.raises(HexirError, match=r"takes 3 arrays \(X, Y, Z\), got 2"):
        kernel(*arrays[:2])
    with pytest.raises(HexirError, match=r"parameter Y .* got a float64"):
        kernel(arrays[0], arrays[1].astype(np.float64), arrays[2])
    arrays[2].flags.writeable = False
    with pytest.raises(HexirError, match="output Z is read-only"):
        kernel(*arrays)


def test_too_many_registers_per_block_is_a_resource_error(cache):
    target = Target("cuda -arch=sm_90")
    binary = compile_cuda(AXPY, target, "axpy")
    threads = cuda_kernel.REGISTERS_PER_BLOCK // binary.resources["registers"] + 1
    block = (threads, 1, 1)
    with pytest.raises(ResourceError, match="registers per block, over the limit of 65536"):
        CudaKernel(axpy(), AXPY, binary, target, "axpy", (1,), block)


def test_too_much_shared_memory_is_a_resource_error(cache):
    target = Target("cuda -arch=sm_80")
    binary = compile_cuda(AXPY, target, "axpy")
    with pytest.raises(ResourceError, match="bytes of shared memory per block, over the limit"):
        CudaKernel(axpy(), AXPY, binary, target, "axpy", (2,), (128,), 164 * 1024)


@pytest.mark.parametrize(
    "built,device,runs",
    [("sm_80", "sm_80", True), ("sm_80", "sm_86", True), ("sm_86", "sm_80", False),
     ("sm_80", "sm_90", False), ("sm_90", "sm_90", True)],
)  # fmt: skip
def test_cubin_arch_compatibility(built, device, runs):
    assert cuda_kernel._runs_on(built, device) is runs


def test_kernel_pickles_without_a_gpu(kernel):
    again = pickle.loads(pickle.dumps(kernel))
    assert again.binary == kernel.binary and again.grid == kernel.grid
    assert again.resources == kernel.resources and again.func == kernel.func


@needs_no_gpu
def test_hexir_build_for_cuda_succeeds_and_calling_says_no_gpu(cache, rng):
    func = hexir.workload("matmul", M=64, N=64, K=64)
    kernel = hexir.build(gpu_schedule(func).func, target="cuda -arch=sm_90")
    assert isinstance(kernel, CudaKernel) and "__global__" in kernel.source
    assert kernel.resources["registers"] > 0 and kernel.resources["spill_bytes"] == 0
    assert math.prod(kernel.block) > 1  # a GPU schedule: threads, not one serial loop
    a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in "ab")
    with pytest.raises(TargetError, match="no GPU to run on"):
        kernel(a, b, np.empty((64, 64), np.float32))


def test_the_cuda_path_imports_no_heavy_dependency(tmp_path):
    """`import hexir`, a CUDA build and a call need numpy and cuda-bindings only
    (scripts/gpu_check.sh runs where Ray, SQLAlchemy, XGBoost and onnx are not installed)."""
    script = textwrap.dedent(f"""
        import sys
        for name in ("ray", "sqlalchemy", "xgboost", "onnx", "rich"):
            sys.modules[name] = None  # importing any of them now fails
        import numpy as np
        import hexir
        from hexir import knobs
        from hexir.errors import TargetError
        from hexir.runtime.cuda_kernel import gpu_unavailable_reason
        from hexir.schedule.handwritten import gpu_schedule
        func = gpu_schedule(hexir.workload("softmax", M=4, N=64)).func
        with knobs.scope(cache_dir={str(tmp_path)!r}):
            kernel = hexir.build(func, "cuda -arch=sm_90")
        if gpu_unavailable_reason() is None:
            x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)
            kernel(x, np.empty_like(x))
        heavy = [m for m in sys.modules if m.split(".")[0] in ("ray", "sqlalchemy", "xgboost",
                 "onnx", "rich") and sys.modules[m] is not None]
        assert not heavy, heavy
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
