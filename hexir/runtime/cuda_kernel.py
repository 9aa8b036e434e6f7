"""A compiled CUDA kernel, run and timed on the GPU, called on numpy arrays.

    kernel = hexir.build(func, target="cuda -arch=sm_90")   # NVRTC: works without a GPU
    kernel(a, b, c)         # copies in, launches, copies out: outputs are written in place
    kernel.time(a, b, c)    # median seconds per launch: CUDA events, the L2 flushed, a graph
    kernel.resources        # {"registers", "spill_bytes", "shared_bytes", "stack_bytes"}

The driver is reached on the first call, not at build, through pycuda or cuda-bindings
(hexir/runtime/cuda_driver.py): a GPU-less machine builds CUDA kernels, and only calling one
says there is no GPU to run on. Kernels run in the device's primary context (the one the CUDA
runtime, CuPy and PyTorch use), made current for the length of each call.
"""

from __future__ import annotations

import contextlib
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
from hexir.runtime import cuda_driver
from hexir.runtime.cuda_driver import Device, Dim3, Driver, DriverError
from hexir.runtime.kernel import _problem
from hexir.runtime.nvrtc import CudaBinary
from hexir.runtime.target import Target

# Registers per block on every arch Hexir targets (sm_80 ... sm_90).
REGISTERS_PER_BLOCK = 65536


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
        self._functions: dict[str, Any] = {}  # the loaded function, per driver binding
        check_launch(self)

    def __call__(self, *arrays: np.ndarray) -> None:
        self._check(arrays)
        with _launcher(self, arrays) as launch:
            launch()

    def time(self, *arrays: np.ndarray, cutoff: float | None = None) -> float:
        """Median seconds per launch, after the knobs' warm-up launches: `timing_repeats`
        repeats, each `number` launches between two CUDA events after the L2 cache was
        flushed (twice its size written), with `number` chosen so that the repeats take
        `timing_min_seconds` in all. Where the driver binding captures CUDA graphs, a
        repeat replays one graph of the `number` launches, so that no launch waits on
        Python: a kernel of a few microseconds is timed, not the host's launch rate. A kernel
        whose first timed launch takes more than `cutoff` seconds (a tune's bound: the
        `measure_cutoff` knob times its task's best) is timed by that launch alone. The
        outputs hold the kernel's result afterwards, as after a call."""
        k = knobs.get()
        self._check(arrays)
        with _launcher(self, arrays) as launch:
            for _ in range(k.timing_warmup):
                launch()
            gpu = _gpu()
            events = (gpu.driver.event(), gpu.driver.event())
            repeats = max(k.timing_repeats, 1)
            once = _timed(gpu, events, launch, 1)
            if cutoff is not None and once > cutoff:
                return once
            number = min(MAX_LAUNCHES, max(1, math.ceil(k.timing_min_seconds / repeats / once)))
            graph = None
            if gpu.driver.supports_graphs and number > 1:
                graph = gpu.driver.capture(lambda stream: [launch(stream) for _ in range(number)])
            times = [_timed(gpu, events, launch, number, graph) for _ in range(repeats)]
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
    """Why CUDA kernels cannot run here (no driver binding, no driver, no GPU), or None when
    they can. Cheap: it initializes the driver and counts devices, but creates no context."""
    try:
        cuda_driver.load().check()
    except TargetError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class _Gpu:
    """Device 0 and its primary context, through the driver binding in use."""

    driver: Driver
    device: Device

    @property
    def arch(self) -> str:
        return self.device.arch

    @property
    def name(self) -> str:
        return self.device.name

    def current(self) -> contextlib.AbstractContextManager[None]:
        return self.driver.current(self.device)


def _gpu() -> _Gpu:
    driver = cuda_driver.load()
    return _Gpu(driver, driver.device())


def _runs_on(binary_arch: str, device_arch: str) -> bool:
    """A CUBIN for sm_XY runs on GPUs of the same major version X and minor at least Y."""
    b, d = int(binary_arch.removeprefix("sm_")), int(device_arch.removeprefix("sm_"))
    return b // 10 == d // 10 and d % 10 >= b % 10


@contextlib.contextmanager
def _launcher(kernel: CudaKernel, arrays: tuple[np.ndarray, ...]) -> Iterator[Callable[..., None]]:
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
    with gpu.current(), _driver_errors(kernel):
        function = _load(kernel, driver)
        pointers: list[int] = []
        try:
            for array in arrays:
                pointers.append(driver.alloc(array.nbytes))
                driver.htod(pointers[-1], array)

            def launch(stream: Any = None) -> None:
                driver.launch(
                    function, kernel.grid, kernel.block, kernel.shared_bytes, pointers, stream
                )

            yield launch
            driver.synchronize()
            n_in = len(arrays) - kernel.func.num_outputs
            for pointer, array in zip(pointers[n_in:], arrays[n_in:], strict=True):
                driver.dtoh(array, pointer)
        finally:
            for pointer in pointers:
                with contextlib.suppress(DriverError):  # keep the error that got us here
                    driver.free(pointer)


# Launches a timing repeat makes at most (a kernel of a microsecond at the default knobs).
MAX_LAUNCHES = 1000


def _timed(
    gpu: _Gpu,
    events: tuple[Any, Any],
    launch: Callable[..., None],
    number: int,
    graph: Any = None,
) -> float:
    """Seconds per launch of `number` launches between the two `events`, after an L2 flush:
    the launches one by one, or `graph`, a capture of them."""
    driver = gpu.driver
    start, end = events
    _flush_l2(gpu)
    stream = graph.stream if graph is not None else None
    driver.record(start, stream)
    if graph is not None:
        driver.launch_graph(graph)
    else:
        for _ in range(number):
            launch()
    driver.record(end, stream)
    return driver.elapsed(start, end) / number


_flush_buffers: dict[str, int] = {}  # per driver binding: a device buffer, kept


def _flush_l2(gpu: _Gpu) -> None:
    """Writes twice the L2 cache's size, so that the next launch reads its inputs from DRAM,
    as a kernel does in a model after the kernels before it."""
    nbytes = 2 * max(gpu.device.l2_bytes, 1 << 20)
    pointer = _flush_buffers.get(gpu.driver.name)
    if pointer is None:
        pointer = _flush_buffers[gpu.driver.name] = gpu.driver.alloc(nbytes)
    gpu.driver.memset(pointer, nbytes, 0)


def _load(kernel: CudaKernel, driver: Driver) -> Any:
    """The kernel's function in the driver binding, loading its CUBIN on first use."""
    function = kernel._functions.get(driver.name)
    if function is None:
        function = driver.load_function(
            kernel.binary.cubin, kernel.name, len(kernel.func.params), kernel.shared_bytes
        )
        kernel._functions[driver.name] = function
    return function


@contextlib.contextmanager
def _driver_errors(kernel: CudaKernel) -> Iterator[None]:
    """The driver's errors as MeasureError, naming the kernel and its launch."""
    try:
        yield
    except DriverError as e:
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
