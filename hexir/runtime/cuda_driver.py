"""The few CUDA driver calls Hexir's GPU runners make, on either of two Python bindings.

    driver = cuda_driver.load()      # pycuda where it imports, else cuda-bindings (knob)
    device = driver.device()         # device 0: .arch ("sm_90"), .name
    with driver.current(device):     # its primary context, current for the block
        ptr = driver.alloc(nbytes); driver.htod(ptr, array); driver.dtoh(array, ptr)
        function = driver.load_function(cubin, "name", params, dynamic_shared_bytes)
        driver.launch(function, grid, block, shared_bytes, [ptr, ...])
        start, end = driver.event(), driver.event(); driver.record(start); ...
        driver.record(end); driver.elapsed(start, end)   # seconds
        driver.memset(ptr, nbytes, 0)    # device.l2_bytes: what a flush before timing writes

pycuda (the `cuda` extra) is the runner where it is installed; cuda-bindings (a dependency of
Hexir already, for NVRTC) runs the same kernels through the driver API where pycuda is not,
so a GPU machine whose pycuda cannot be built still runs them. The knob `cuda_driver`
(HEXIR_CUDA_DRIVER=auto|pycuda|cuda-bindings) picks one. Kernel arguments are device
pointers only: every Hexir kernel takes its buffers and nothing else. Every failure of a
driver call is a `DriverError` naming the call, whichever binding made it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexir import knobs
from hexir.errors import TargetError

NO_GPU = "no GPU to run on: "
HOW = (
    "Run CUDA kernels on a machine with an NVIDIA GPU and its driver; Hexir calls the driver "
    "through pycuda where it is installed (`pip install 'hexir[cuda]'`) and through "
    "cuda-bindings (installed with Hexir) otherwise. Building needs neither: hexir.build "
    "compiles CUDA with NVRTC anywhere."
)

Dim3 = tuple[int, int, int]


class DriverError(Exception):
    """A CUDA driver call failed (a fault, a bad launch, out of memory)."""


@dataclass(frozen=True)
class Device:
    handle: Any
    context: Any  # the primary context, retained once per process
    arch: str  # "sm_90"
    name: str
    l2_bytes: int = 0  # the L2 cache's size, which a flush before timing writes twice over


def load() -> Driver:
    """The driver binding the knob `cuda_driver` asks for ("auto": pycuda where it imports,
    else cuda-bindings), one per process; TargetError where it cannot be imported."""
    choice = knobs.get().cuda_driver
    if choice == "auto":
        choice = "pycuda" if _imports("pycuda.driver") else "cuda-bindings"
    return _load(choice)


@functools.cache
def _load(choice: str) -> Driver:
    return _PyCuda() if choice == "pycuda" else _Bindings()


def _imports(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


class Driver:
    """What the runners call; `_PyCuda` and `_Bindings` implement it."""

    name = ""

    @functools.cached_property
    def _device(self) -> Device:
        return self._open()

    def device(self) -> Device:
        """Device 0 and its primary context; TargetError where there is no GPU."""
        return self._device

    def check(self) -> None:
        """TargetError where there is no driver or no GPU; creates no context."""
        self._init()

    @contextlib.contextmanager
    def current(self, device: Device) -> Iterator[None]:
        self._push(device.context)
        try:
            yield
        finally:
            self._pop()

    # The calls each binding implements.
    def _init(self) -> Any: ...
    def _open(self) -> Device: ...
    def _push(self, context: Any) -> None: ...
    def _pop(self) -> None: ...
    def version(self) -> str: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, pointer: int) -> None: ...
    def htod(self, pointer: int, array: np.ndarray) -> None: ...
    def dtoh(self, array: np.ndarray, pointer: int) -> None: ...
    def synchronize(self) -> None: ...
    def memset(self, pointer: int, nbytes: int, value: int) -> None: ...
    def load_function(self, cubin: bytes, name: str, params: int, dynamic_shared: int) -> Any: ...
    def launch(
        self,
        function: Any,
        grid: Dim3,
        block: Dim3,
        shared: int,
        pointers: Sequence[int],
        stream: Any = None,
    ) -> Any: ...
    def event(self) -> Any: ...
    def record(self, event: Any, stream: Any = None) -> None: ...
    def elapsed(self, start: Any, end: Any) -> float: ...

    # CUDA graphs, where the binding has them (`supports_graphs`): launches captured once on
    # a stream of their own, then replayed with one call.
    supports_graphs = False

    def capture(self, launches: Callable[[Any], None]) -> Any:
        """A graph of what `launches(stream)` launches on a new stream; `replay` runs it."""
        raise NotImplementedError(f"{self.name} does not capture CUDA graphs")

    def replay(self, graph: Any) -> None:
        """Runs a captured graph and waits for it."""
        self.launch_graph(graph)
        self.wait(graph)

    def launch_graph(self, graph: Any) -> None:
        """Queues a captured graph on its stream (`graph.stream`) and returns at once."""
        raise NotImplementedError(f"{self.name} does not capture CUDA graphs")

    def wait(self, graph: Any) -> None:
        """Waits for what was queued on the graph's stream."""
        raise NotImplementedError(f"{self.name} does not capture CUDA graphs")


# Dynamic shared memory beyond this needs the kernel's opt-in attribute.
DEFAULT_DYNAMIC_SHARED = 48 * 1024


class _PyCuda(Driver):
    name = "pycuda"

    def __init__(self):
        try:
            import pycuda.driver as cuda
        except ModuleNotFoundError as e:
            raise TargetError(f"{NO_GPU}pycuda is not installed ({e}). {HOW}") from e
        except ImportError as e:  # pycuda is there, the driver library (libcuda) is not
            raise TargetError(
                f"{NO_GPU}pycuda cannot load the CUDA driver ({e}): this machine has no "
                f"NVIDIA driver. {HOW}"
            ) from e
        self.cuda = cuda
        self._allocations: dict[int, Any] = {}  # pycuda frees an allocation it collects

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self.cuda.Error as e:
            raise DriverError(str(e)) from e

    def _init(self) -> Any:
        cuda = self.cuda
        try:
            cuda.init()
            if cuda.Device.count() == 0:
                raise TargetError(f"{NO_GPU}the CUDA driver sees no GPU. {HOW}")
            return cuda.Device(0)
        except cuda.Error as e:
            raise TargetError(f"{NO_GPU}the CUDA driver did not start ({e}). {HOW}") from e

    def _open(self) -> Device:
        device = self._init()
        major, minor = device.compute_capability()
        context = device.retain_primary_context()
        l2 = device.get_attribute(self.cuda.device_attribute.L2_CACHE_SIZE)
        return Device(device, context, f"sm_{major}{minor}", device.name(), l2)

    def _push(self, context: Any) -> None:
        context.push()

    def _pop(self) -> None:
        self.cuda.Context.pop()

    def version(self) -> str:
        v = self.cuda.get_driver_version()
        return f"{v // 1000}.{v % 1000 // 10}"

    def alloc(self, nbytes: int) -> int:
        with self._errors():
            allocation = self.cuda.mem_alloc(max(nbytes, 1))
        self._allocations[int(allocation)] = allocation
        return int(allocation)

    def free(self, pointer: int) -> None:
        with self._errors():
            self._allocations.pop(pointer).free()

    def htod(self, pointer: int, array: np.ndarray) -> None:
        with self._errors():
            self.cuda.memcpy_htod(pointer, array)

    def dtoh(self, array: np.ndarray, pointer: int) -> None:
        with self._errors():
            self.cuda.memcpy_dtoh(array, pointer)

    def synchronize(self) -> None:
        with self._errors():
            self.cuda.Context.synchronize()

    def memset(self, pointer: int, nbytes: int, value: int) -> None:
        with self._errors():
            self.cuda.memset_d8(pointer, value, nbytes)

    def load_function(self, cubin: bytes, name: str, params: int, dynamic_shared: int) -> Any:
        with self._errors():
            function = self.cuda.module_from_buffer(cubin).get_function(name)  # keeps it alive
            function.prepare([np.uintp] * params)
            if dynamic_shared > DEFAULT_DYNAMIC_SHARED:
                attribute = self.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
                function.set_attribute(attribute, dynamic_shared)
        return function

    def launch(
        self,
        function: Any,
        grid: Dim3,
        block: Dim3,
        shared: int,
        pointers: Sequence[int],
        stream: Any = None,
    ) -> None:
        with self._errors():
            if stream is None:
                function.prepared_call(grid, block, *pointers, shared_size=shared)
            else:
                function.prepared_async_call(grid, block, stream, *pointers, shared_size=shared)

    def event(self) -> Any:
        return self.cuda.Event()

    def record(self, event: Any, stream: Any = None) -> None:
        with self._errors():
            event.record(stream)

    def elapsed(self, start: Any, end: Any) -> float:
        with self._errors():
            end.synchronize()
            return end.time_since(start) * 1e-3


class _Bindings(Driver):
    """The driver API through cuda-bindings (`cuda.bindings.driver`): every call returns its
    status first, checked here."""

    name = "cuda-bindings"

    def __init__(self):
        try:
            from cuda.bindings import driver as cu
        except ImportError as e:
            raise TargetError(f"{NO_GPU}cuda-bindings is not installed ({e}). {HOW}") from e
        self.cu = cu
        self._stream = cu.CUstream(0)

    def _call(self, name: str, *args: Any) -> Any:
        """cu.<name>(*args)'s results after its status; DriverError where it failed."""
        status, *results = getattr(self.cu, name)(*args)
        if status != self.cu.CUresult.CUDA_SUCCESS:
            _, text = self.cu.cuGetErrorString(status)
            text = text.decode() if isinstance(text, bytes) else status.name
            raise DriverError(f"{name} failed: {status.name}: {text}")
        return results[0] if len(results) == 1 else tuple(results) or None

    def _init(self) -> Any:
        try:
            self._call("cuInit", 0)
            if self._call("cuDeviceGetCount") == 0:
                raise TargetError(f"{NO_GPU}the CUDA driver sees no GPU. {HOW}")
            return self._call("cuDeviceGet", 0)
        except DriverError as e:
            raise TargetError(f"{NO_GPU}the CUDA driver did not start ({e}). {HOW}") from e
        except (OSError, RuntimeError) as e:  # no libcuda: cuda-pathfinder cannot find it
            raise TargetError(
                f"{NO_GPU}cuda-bindings cannot load the CUDA driver ({e}): this machine has "
                f"no NVIDIA driver. {HOW}"
            ) from e

    def _open(self) -> Device:
        device = self._init()
        a = self.cu.CUdevice_attribute
        major = self._call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                           device)  # fmt: skip
        minor = self._call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                           device)  # fmt: skip
        name = self._call("cuDeviceGetName", 256, device)
        name = name.split(b"\0", 1)[0].decode()
        l2 = self._call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device)
        context = self._call("cuDevicePrimaryCtxRetain", device)
        return Device(device, context, f"sm_{major}{minor}", name, l2)

    def _push(self, context: Any) -> None:
        self._call("cuCtxPushCurrent", context)

    def _pop(self) -> None:
        self._call("cuCtxPopCurrent")

    def version(self) -> str:
        v = self._call("cuDriverGetVersion")
        return f"{v // 1000}.{v % 1000 // 10}"

    def alloc(self, nbytes: int) -> int:
        return int(self._call("cuMemAlloc", max(nbytes, 1)))

    def free(self, pointer: int) -> None:
        self._call("cuMemFree", self.cu.CUdeviceptr(pointer))

    def htod(self, pointer: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._call("cuMemcpyHtoD", self.cu.CUdeviceptr(pointer), array.ctypes.data, array.nbytes)

    def dtoh(self, array: np.ndarray, pointer: int) -> None:
        if not array.flags.c_contiguous:
            raise ValueError("dtoh copies into a C-contiguous array only")
        self._call("cuMemcpyDtoH", array.ctypes.data, self.cu.CUdeviceptr(pointer), array.nbytes)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def memset(self, pointer: int, nbytes: int, value: int) -> None:
        self._call("cuMemsetD8", self.cu.CUdeviceptr(pointer), value, nbytes)

    def load_function(self, cubin: bytes, name: str, params: int, dynamic_shared: int) -> Any:
        image = np.frombuffer(cubin, np.uint8)
        module = self._call("cuModuleLoadData", image.ctypes.data)
        function = self._call("cuModuleGetFunction", module, name.encode())
        if dynamic_shared > DEFAULT_DYNAMIC_SHARED:
            attribute = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._call("cuFuncSetAttribute", function, attribute, dynamic_shared)
        return _Function(module, function)

    def launch(
        self,
        function: Any,
        grid: Dim3,
        block: Dim3,
        shared: int,
        pointers: Sequence[int],
        stream: Any = None,
    ) -> None:
        # kernelParams: an array of N addresses, each of one argument's value (a pointer).
        values = np.array(pointers, dtype=np.uint64)
        params = np.array([values.ctypes.data + 8 * i for i in range(len(values))], np.uint64)
        self._call("cuLaunchKernel", function.handle, *grid, *block, shared,
                   stream or self._stream, params.ctypes.data, 0)  # fmt: skip

    supports_graphs = True

    def capture(self, launches: Callable[[Any], None]) -> Any:
        # A blocking stream: it waits for the copies made on the legacy stream before it.
        stream = self._call("cuStreamCreate", self.cu.CUstream_flags.CU_STREAM_DEFAULT)
        mode = self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._call("cuStreamBeginCapture", stream, mode)
        try:
            launches(stream)
        finally:
            graph = self._call("cuStreamEndCapture", stream)
        return _Graph(self, stream, graph, self._call("cuGraphInstantiate", graph, 0))

    def launch_graph(self, graph: Any) -> None:
        self._call("cuGraphLaunch", graph.executable, graph.stream)

    def wait(self, graph: Any) -> None:
        self._call("cuStreamSynchronize", graph.stream)

    def event(self) -> Any:
        return _Event(self, self._call("cuEventCreate", self.cu.CUevent_flags.CU_EVENT_DEFAULT))

    def record(self, event: Any, stream: Any = None) -> None:
        self._call("cuEventRecord", event.handle, stream or self._stream)

    def elapsed(self, start: Any, end: Any) -> float:
        self._call("cuEventSynchronize", end.handle)
        return self._call("cuEventElapsedTime", start.handle, end.handle) * 1e-3


@dataclass(frozen=True)
class _Function:
    module: Any  # kept, so the module stays loaded as long as the function is used
    handle: Any


class _Graph:
    """A captured graph, its executable form and its stream, destroyed when collected."""

    def __init__(self, driver: _Bindings, stream: Any, graph: Any, executable: Any):
        self.driver, self.stream, self.graph, self.executable = driver, stream, graph, executable

    def __del__(self):
        cu = self.driver.cu
        with contextlib.suppress(Exception):
            cu.cuGraphExecDestroy(self.executable)
            cu.cuGraphDestroy(self.graph)
            cu.cuStreamDestroy(self.stream)


class _Event:
    """A CUDA event, destroyed when collected (as pycuda's are)."""

    def __init__(self, driver: _Bindings, handle: Any):
        self.driver, self.handle = driver, handle

    def __del__(self):
        with contextlib.suppress(Exception):
            self.driver.cu.cuEventDestroy(self.handle)
