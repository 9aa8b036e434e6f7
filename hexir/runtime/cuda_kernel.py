"""A compiled CUDA kernel, run and timed on the GPU through pycuda, called on numpy arrays.

    kernel = hexir.build(func, target="cuda -arch=sm_90")   # NVRTC: works without a GPU
    kernel(a, b, c)         # copies in, launches, copies out: outputs are written in place
    kernel.time(a, b, c)    # median seconds per launch, CUDA events, after warm-up
    kernel.resources        # {"registers", "spill_bytes", "shared_bytes", "stack_bytes"}

pycuda (the optional `cuda` extra) is imported on the first call, not at build: a GPU-less
machine builds CUDA kernels, and only calling one says there is no GPU to run on. Kernels run
in the device's primary context (the one the CUDA runtime, CuPy and PyTorch use), made current
for the length of each call.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexir import knobs
from hexir.errors import HexirError, MeasureError, ResourceError, TargetError
from hexir.ir.dtype import numpy_dtype
from hexir.ir.tir import PrimFunc
from hexir.runtime.kernel import _problem
from hexir.runtime.nvrtc import CudaBinary
from hexir.runtime.target import Target

# Registers per block on every arch Hexir targets (sm_80 ... sm_90).
REGISTERS_PER_BLOCK = 65536
# Dynamic shared memory beyond this needs the kernel's opt-in attribute.
_DEFAULT_DYNAMIC_SHARED = 48 * 1024

_NO_GPU = "no GPU to run on: "
_HOW = (
    "Run CUDA kernels on a machine with an NVIDIA GPU, its driver and pycuda "
    "(`pip install 'hexir[cuda]'`, or `pip install pycuda`, which builds against the CUDA "
    "toolkit; scripts/gpu_check.sh installs it from a wheelhouse where no registry can be "
    "reached). Building needs none of them: hexir.build compiles CUDA with NVRTC anywhere."
)

Dim3 = tuple[int, int, int]


class CudaKernel:
    """A PrimFunc built for a CUDA target: `func`, `source`, `target`, `binary` (the CUBIN),
    `resources` (ptxas's report), and the launch shape `grid`, `block`, `shared_bytes`."""

    def __init__(
        self,
        func: PrimFunc,
        source: str,
        binary: CudaBinary,
        target: Target,
        name: str,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        shared_bytes: int = 0,
    ):
        self.func = func
        self.source = source
        self.binary = binary
        self.target = target
        self.name = name
        self.grid = _dim3(grid)
        self.block = _dim3(block)
        self.shared_bytes = shared_bytes
        self.resources = dict(binary.resources)
        self._dtypes = [numpy_dtype(b.dtype) for b in func.params]
        self._function: Any = None  # the loaded pycuda Function, after the first call
        check_launch(self)

    def __call__(self, *arrays: np.ndarray) -> None:
        self._check(arrays)
        with _launcher(self, arrays) as launch:
            launch()

    def time(self, *arrays: np.ndarray) -> float:
        """Median seconds per launch, measured with CUDA events after the knobs' warm-up
        launches, over at least `timing_repeats` launches and `timing_min_seconds` in all.
        The outputs hold the kernel's result afterwards, as after a call."""
        k = knobs.get()
        self._check(arrays)
        with _launcher(self, arrays) as launch:
            for _ in range(k.timing_warmup):
                launch()
            driver = _gpu().driver
            start, end = driver.Event(), driver.Event()
            times: list[float] = []
            while len(times) < max(k.timing_repeats, 1) or sum(times) < k.timing_min_seconds:
                start.record()
                launch()
                end.record()
                end.synchronize()
                times.append(end.time_since(start) * 1e-3)
        return statistics.median(times)

    def _check(self, arrays: tuple[np.ndarray, ...]) -> None:
        params = self.func.params
        if len(arrays) != len(params):
            names = ", ".join(b.name for b in params)
            raise HexirError(
                f"kernel {self.func.name} takes {len(params)} arrays ({names}), got {len(arrays)}"
            )
        for buffer, dtype, array in zip(params, self._dtypes, arrays, strict=True):
            problem = _problem(array, buffer.shape, dtype)
            if problem:
                raise HexirError(
                    f"kernel {self.func.name}: parameter {buffer.name} expects a C-contiguous "
                    f"{dtype} array of shape {tuple(buffer.shape)}, got {problem}"
                )
        n_in = len(params) - self.func.num_outputs
        for buffer, array in zip(params[n_in:], arrays[n_in:], strict=True):
            if not array.flags.writeable:
                raise HexirError(f"kernel {self.func.name}: output {buffer.name} is read-only")

    def __reduce__(self):
        args = (self.func, self.source, self.binary, self.target, self.name, self.grid,
                self.block, self.shared_bytes)  # fmt: skip
        return (type(self), args)

    def __repr__(self) -> str:
        return (
            f"CudaKernel({self.func.name!r}, target={str(self.target)!r}, grid={self.grid}, "
            f"block={self.block}, registers={self.resources.get('registers')})"
        )


def check_launch(kernel: CudaKernel) -> None:
    """ResourceError where the launch cannot fit one multiprocessor: registers per block, or
    static plus dynamic shared memory over the target's opt-in limit."""
    threads = math.prod(kernel.block)
    registers = kernel.resources.get("registers", 0) * threads
    if registers > REGISTERS_PER_BLOCK:
        raise ResourceError(
            f"kernel {kernel.name!r} uses {kernel.resources['registers']} registers per thread "
            f"x {threads} threads = {registers} registers per block, over the limit of "
            f"{REGISTERS_PER_BLOCK}: use fewer threads per block or smaller per-thread tiles"
        )
    shared = kernel.resources.get("shared_bytes", 0) + kernel.shared_bytes
    limit = kernel.target.max_shared_memory_per_block_optin
    if limit is not None and shared > limit:
        raise ResourceError(
            f"kernel {kernel.name!r} needs {shared} bytes of shared memory per block, over the "
            f"limit of {limit} bytes of target {kernel.target}: make the cached tiles smaller"
        )


def gpu_unavailable_reason() -> str | None:
    """Why CUDA kernels cannot run here (no pycuda, no driver, no GPU), or None when they can.
    Cheap: it initializes the driver and counts devices, but creates no context."""
    try:
        driver = _import_driver()
        _init(driver)
    except TargetError as e:
        return str(e)
    return None


@dataclass
class _Gpu:
    """Device 0, its primary context (retained once per process) and its arch."""

    driver: Any  # the pycuda.driver module
    context: Any
    arch: str
    name: str

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        self.context.push()
        try:
            yield
        finally:
            self.driver.Context.pop()


@functools.cache
def _gpu() -> _Gpu:
    driver = _import_driver()
    device = _init(driver)
    major, minor = device.compute_capability()
    context = device.retain_primary_context()
    return _Gpu(driver, context, f"sm_{major}{minor}", device.name())


def _import_driver() -> Any:
    try:
        import pycuda.driver as driver
    except ModuleNotFoundError as e:
        raise TargetError(f"{_NO_GPU}pycuda is not installed ({e}). {_HOW}") from e
    except ImportError as e:  # pycuda is there, the driver library (libcuda) is not
        raise TargetError(
            f"{_NO_GPU}pycuda cannot load the CUDA driver ({e}): this machine has no NVIDIA "
            f"driver. {_HOW}"
        ) from e
    return driver


def _init(driver: Any) -> Any:
    """Device 0, after initializing the driver; TargetError where there is none."""
    try:
        driver.init()
        if driver.Device.count() == 0:
            raise TargetError(f"{_NO_GPU}the CUDA driver sees no GPU. {_HOW}")
        return driver.Device(0)
    except driver.Error as e:
        raise TargetError(f"{_NO_GPU}the CUDA driver did not start ({e}). {_HOW}") from e


def _runs_on(binary_arch: str, device_arch: str) -> bool:
    """A CUBIN for sm_XY runs on GPUs of the same major version X and minor at least Y."""
    b, d = int(binary_arch.removeprefix("sm_")), int(device_arch.removeprefix("sm_"))
    return b // 10 == d // 10 and d % 10 >= b % 10


@contextlib.contextmanager
def _launcher(kernel: CudaKernel, arrays: tuple[np.ndarray, ...]) -> Iterator[Callable[[], None]]:
    """Inside: device buffers hold copies of the arrays (outputs too, so a kernel that skips an
    element leaves what the caller put there), and the function launches the kernel on them.
    On leaving: the outputs are copied back and the buffers freed."""
    gpu = _gpu()
    if not _runs_on(kernel.binary.arch, gpu.arch):
        raise TargetError(
            f"kernel {kernel.name!r} was built for {kernel.binary.arch}, but GPU 0 ({gpu.name})"
            f" is {gpu.arch}: build it for target 'cuda' (the visible GPU's arch) or "
            f"'cuda -arch={gpu.arch}'"
        )
    driver = gpu.driver
    with gpu.current(), _driver_errors(kernel, driver):
        function = _load(kernel, driver)
        buffers = [driver.mem_alloc(max(a.nbytes, 1)) for a in arrays]
        try:
            for buffer, array in zip(buffers, arrays, strict=True):
                driver.memcpy_htod(buffer, array)
            pointers = [int(b) for b in buffers]

            def launch() -> None:
                function.prepared_call(
                    kernel.grid, kernel.block, *pointers, shared_size=kernel.shared_bytes
                )

            yield launch
            driver.Context.synchronize()
            n_in = len(arrays) - kernel.func.num_outputs
            for buffer, array in zip(buffers[n_in:], arrays[n_in:], strict=True):
                driver.memcpy_dtoh(array, buffer)
        finally:
            for buffer in buffers:
                with contextlib.suppress(driver.Error):  # keep the error that got us here
                    buffer.free()


def _load(kernel: CudaKernel, driver: Any) -> Any:
    """The kernel's pycuda Function, loading its CUBIN into the context on first use."""
    if kernel._function is None:
        module = driver.module_from_buffer(kernel.binary.cubin)
        function = module.get_function(kernel.name)  # keeps the module alive
        function.prepare([np.uintp] * len(kernel.func.params))
        if kernel.shared_bytes > _DEFAULT_DYNAMIC_SHARED:
            attribute = driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
            function.set_attribute(attribute, kernel.shared_bytes)
        kernel._function = function
    return kernel._function


@contextlib.contextmanager
def _driver_errors(kernel: CudaKernel, driver: Any) -> Iterator[None]:
    """pycuda's errors as MeasureError, naming the kernel and its launch."""
    try:
        yield
    except driver.Error as e:
        raise MeasureError(
            f"kernel {kernel.name!r} failed on the GPU (grid {kernel.grid}, block "
            f"{kernel.block}, {kernel.shared_bytes} bytes of dynamic shared memory): {e}. "
            f"To reproduce: hexir.build(func, {str(kernel.target)!r}) and call it on the same "
            "arrays; kernel.source holds the CUDA C"
        ) from e


def _dim3(shape: tuple[int, ...]) -> Dim3:
    if not 1 <= len(shape) <= 3 or any(int(d) < 1 for d in shape):
        raise HexirError(f"a launch dimension is 1 to 3 positive ints, got {shape}")
    x, y, z = (*(int(d) for d in shape), 1, 1)[:3]
    return (x, y, z)
