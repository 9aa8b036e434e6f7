"""Running a compiled module on the GPU, and CUDA kernels loaded back from an artifact.

The first run allocates every device buffer once — one allocation per storage of the memory
plan, with each intermediate at its offset in one, and one per graph input, graph output and
constant — and uploads the constants. Every run then copies the inputs in, launches the
kernels of the command list in order on precomputed device pointers, and copies the outputs
out. Without a GPU (or without pycuda) the first run raises `TargetError` saying so; building
needs neither (NVRTC compiles anywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hexir.errors import TargetError
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Value
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target

if TYPE_CHECKING:
    from hexir.runtime.cuda_kernel import CudaKernel
    from hexir.runtime.module import Module

__all__ = ["kernel_launch", "load_kernel", "run_cuda"]


def run_cuda(module: Module, bound: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run `module` (a CUDA target) on bound inputs; the outputs as numpy arrays."""
    state = getattr(module, "_cuda_buffers", None)
    if state is None:
        state = _CudaBuffers(module)
        module._cuda_buffers = state  # type: ignore[attr-defined]
    return state.run(bound, module.graph.outputs)


class _CudaBuffers:
    """Device memory for every value, allocated once, and each command's launch."""

    def __init__(self, module: Module):
        from hexir.runtime.cuda_kernel import _gpu, _load, _runs_on

        self.gpu = gpu = _gpu()  # TargetError here without a GPU: "no GPU to run on: ..."
        for kernel in module.kernels:
            if not _runs_on(kernel.binary.arch, gpu.arch):
                raise TargetError(
                    f"module @{module.graph.name} was built for {kernel.binary.arch}, but GPU 0 "
                    f"({gpu.name}) is {gpu.arch}: compile it for target 'cuda' (the visible "
                    f"GPU's arch) or 'cuda -arch={gpu.arch}'"
                )
        driver = gpu.driver
        self.allocations: list[Any] = []
        with gpu.current():
            self.pointers = self._allocate(module, driver)
            functions = [_load(k, driver) for k in module.kernels]
        self.calls = [
            (functions[c.kernel], module.kernels[c.kernel], [self.pointers[n] for n in c.args])
            for c in module.commands
        ]
        self.types = {v.name: v.type for v in module.graph.outputs}

    def _allocate(self, module: Module, driver: Any) -> dict[str, int]:
        def alloc(nbytes: int) -> int:
            self.allocations.append(driver.mem_alloc(max(nbytes, 1)))
            return int(self.allocations[-1])

        storages = [alloc(n) for n in module.plan.storage_sizes]
        placed = module.plan.as_dict()
        pointers: dict[str, int] = {}
        for v in module.graph.inputs:
            pointers[v.name] = alloc(_nbytes(v))
        for name, data in module.constants.items():
            array = np.ascontiguousarray(data)
            pointers[name] = alloc(array.nbytes)
            driver.memcpy_htod(pointers[name], array)
        for command in module.commands:
            for name in command.outputs:
                p = placed.get(name)
                if p is not None:
                    pointers[name] = storages[p.storage] + p.offset
                else:
                    t = module.value_type(name)
                    pointers[name] = alloc(t.size * np.dtype(numpy_dtype(t.dtype)).itemsize)
        return pointers

    def run(self, bound: dict[str, np.ndarray], outputs: Sequence[Value]) -> list[np.ndarray]:
        driver = self.gpu.driver
        with self.gpu.current():
            for name, array in bound.items():
                driver.memcpy_htod(self.pointers[name], array)
            for function, kernel, pointers in self.calls:
                function.prepared_call(
                    kernel.grid, kernel.block, *pointers, shared_size=kernel.shared_bytes
                )
            driver.Context.synchronize()
            results = []
            for v in outputs:
                out = np.empty(v.type.shape, numpy_dtype(v.type.dtype))
                driver.memcpy_dtoh(out, self.pointers[v.name])
                results.append(out)
        return results


def _nbytes(v: Value) -> int:
    return v.type.size * np.dtype(numpy_dtype(v.type.dtype)).itemsize


def kernel_launch(kernel: CudaKernel) -> dict[str, object]:
    """What an artifact keeps of a CUDA kernel beside its CUBIN, to launch it again."""
    return {
        "name": kernel.name,
        "grid": list(kernel.grid),
        "block": list(kernel.block),
        "shared_bytes": kernel.shared_bytes,
        "arch": kernel.binary.arch,
        "resources": dict(kernel.binary.resources),
    }


def load_kernel(
    func: PrimFunc, source: str, cubin: bytes, target: Target, launch: dict
) -> CudaKernel:
    """A CudaKernel from an artifact's CUBIN and launch data (no compiler involved)."""
    from hexir.runtime.cuda_kernel import CudaKernel
    from hexir.runtime.nvrtc import CudaBinary

    binary = CudaBinary(
        cubin=cubin,
        ptx=None,
        log="",
        resources={str(k): int(v) for k, v in dict(launch["resources"]).items()},
        arch=str(launch["arch"]),
    )
    return CudaKernel(
        func,
        source,
        binary,
        target,
        str(launch["name"]),
        tuple(int(d) for d in launch["grid"]),
        tuple(int(d) for d in launch["block"]),
        int(launch["shared_bytes"]),
    )
