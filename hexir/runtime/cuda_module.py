"""Running a compiled module on the GPU, and CUDA kernels loaded back from an artifact.

The first run allocates every device buffer once — one allocation per storage of the memory
plan, with each intermediate at its offset in one, and one per graph input, graph output and
constant — and uploads the constants; a view (`Module.views`) is its value's pointer. Every
run then copies the inputs in, launches the kernels of the command list in order on
precomputed device pointers, and copies the outputs out. Where the driver binding has CUDA
graphs (cuda-bindings; knob `cuda_graphs`), the first run captures the launches as a graph on
a stream of its own and every run replays it with one call, with no Python between kernels; a
timed run (`Module.run_timed`, for profiles) launches one by one, with a CUDA event after each.
Without a GPU (or a driver) the first run raises `TargetError` saying so; building
needs neither (NVRTC compiles anywhere).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from hexir import knobs
from hexir.errors import TargetError
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Value
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target

if TYPE_CHECKING:
    from hexir.runtime.cuda_driver import Driver
    from hexir.runtime.cuda_kernel import CudaKernel, _Gpu
    from hexir.runtime.module import Module

__all__ = ["cuda_buffers", "kernel_launch", "load_kernel"]


def cuda_buffers(module: Module) -> _CudaBuffers:
    """The device buffers of `module` (a CUDA target), allocated on first use; `.run(bound,
    outputs)` runs it, `.run_timed(bound, outputs)` also times each launch."""
    state = getattr(module, "_cuda_buffers", None)
    if state is None:
        state = _CudaBuffers(module)
        module._cuda_buffers = state  # type: ignore[attr-defined]
    return state


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
        self.allocations: list[int] = []
        with gpu.current():
            self.pointers = self._allocate(module, driver)
            functions = [_load(k, driver) for k in module.kernels]
        self.calls = [
            (functions[c.kernel], module.kernels[c.kernel], [self.pointers[n] for n in c.args])
            for c in module.commands
        ]
        self.types = {v.name: v.type for v in module.graph.outputs}
        self.graph: Any = None  # the command list as a CUDA graph, after the first run
        weakref.finalize(self, _free, gpu, self.allocations)

    def _allocate(self, module: Module, driver: Driver) -> dict[str, int]:
        def alloc(nbytes: int) -> int:
            self.allocations.append(driver.alloc(nbytes))
            return self.allocations[-1]

        storages = [alloc(n) for n in module.plan.storage_sizes]
        placed = module.plan.as_dict()
        pointers: dict[str, int] = {}
        for v in module.graph.inputs:
            pointers[v.name] = alloc(_nbytes(v))
        for name, data in module.constants.items():
            array = np.ascontiguousarray(data)
            pointers[name] = alloc(array.nbytes)
            driver.htod(pointers[name], array)
        for command in module.commands:
            for name in command.outputs:
                p = placed.get(name)
                if p is not None:
                    pointers[name] = storages[p.storage] + p.offset
                else:
                    t = module.value_type(name)
                    pointers[name] = alloc(t.size * np.dtype(numpy_dtype(t.dtype)).itemsize)
        for view, root in module.views.items():
            pointers[view] = pointers[root]  # a reshape: the same contiguous bytes
        return pointers

    def run(self, bound: dict[str, np.ndarray], outputs: Sequence[Value]) -> list[np.ndarray]:
        driver = self.gpu.driver
        with self.gpu.current():
            self._copy_in(bound)
            if knobs.get().cuda_graphs and driver.supports_graphs:
                if self.graph is None:  # the first run captures the launches, then replays them
                    self.graph = driver.capture(self._launch_all)
                driver.replay(self.graph)
            else:
                self._launch_all()
                driver.synchronize()
            return self._copy_out(outputs)

    def _launch_all(self, stream: Any = None) -> None:
        for call in self.calls:
            _launch(self.gpu.driver, *call, stream)

    def run_timed(
        self, bound: dict[str, np.ndarray], outputs: Sequence[Value]
    ) -> tuple[list[np.ndarray], list[float]]:
        """As `run`, with each launch's seconds between the CUDA events around it."""
        driver = self.gpu.driver
        with self.gpu.current():
            events = [driver.event() for _ in range(len(self.calls) + 1)]
            self._copy_in(bound)
            driver.record(events[0])
            for call, event in zip(self.calls, events[1:], strict=True):
                _launch(driver, *call)
                driver.record(event)
            seconds = [driver.elapsed(start, end) for start, end in pairwise(events)]
            return self._copy_out(outputs), seconds

    def _copy_in(self, bound: dict[str, np.ndarray]) -> None:
        for name, array in bound.items():
            self.gpu.driver.htod(self.pointers[name], array)

    def _copy_out(self, outputs: Sequence[Value]) -> list[np.ndarray]:
        results = []
        for v in outputs:
            out = np.empty(v.type.shape, numpy_dtype(v.type.dtype))
            self.gpu.driver.dtoh(out, self.pointers[v.name])
            results.append(out)
        return results


def _free(gpu: _Gpu, allocations: list[int]) -> None:
    """Frees a module's device buffers once it is collected (or at exit, where the driver may
    already be gone: then the process's end frees them)."""
    with contextlib.suppress(Exception), gpu.current():
        for pointer in allocations:
            gpu.driver.free(pointer)


def _launch(
    driver: Driver, function: Any, kernel: CudaKernel, pointers: list[int], stream: Any = None
) -> None:
    driver.launch(function, kernel.grid, kernel.block, kernel.shared_bytes, pointers, stream)


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
