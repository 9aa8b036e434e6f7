"""A compiled CPU kernel, called through ctypes on numpy arrays.

kernel = CpuKernel(func, source, library_path, target)
kernel(a, b, c)           # checks every array, then runs; outputs are written in place
kernel.time(a, b, c)      # median seconds per call
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from hexir import knobs
from hexir.codegen.c import kernel_symbol
from hexir.errors import HexirError
from hexir.ir.arrays import address
from hexir.ir.dtype import numpy_dtype
from hexir.ir.symbolic import bind_sizes, shape_at
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target

# The thread count last set in each loaded library: kernels that load one path share one
# library (dlopen), and so its thread count. `threads_changes()` counts the settings, so a
# module whose kernels were all set, and nothing set since, need not look at each again.
_threads_set: dict[str, int] = {}
_changes = 0


def threads_changes() -> int:
    """How many times a library's thread count has been set in this process."""
    return _changes


class CpuKernel:
    """A PrimFunc built into a shared library: `func`, `source`, `path`, `target`."""

    def __init__(self, func: PrimFunc, source: str, path: Path, target: Target):
        self.func = func
        self.source = source
        self.path = path
        self.target = target
        self._lib = ctypes.CDLL(str(path))
        self._fn = getattr(self._lib, kernel_symbol(func))
        self._symbols = func.symbols  # int64 arguments after the arrays, read from their shapes
        self._fn.argtypes = [ctypes.c_void_p] * len(func.params) + [ctypes.c_int64] * len(
            self._symbols
        )
        self._fn.restype = None
        # Only kernels with a parallel loop export it (and link OpenMP's runtime).
        self._set_threads = getattr(self._lib, "hexir_set_num_threads", None)
        self._key = str(path)  # the library's, in _threads_set
        self._dtypes = [numpy_dtype(b.dtype) for b in func.params]

    def __call__(self, *arrays: np.ndarray, sizes: Mapping[str, int] | None = None) -> None:
        """Run on `arrays` (the params in order). A kernel of symbolic extents reads their
        sizes from the arrays' shapes, after `sizes` (needed where an extent is a sum no
        array fixes alone: `{past + seq}`)."""
        pointers = self._check(arrays, sizes)
        self._sync_threads()
        self._fn(*pointers)

    def time(self, *arrays: np.ndarray) -> float:
        """Median seconds per call, after the knobs' warm-up calls, over at least
        `timing_repeats` calls and `timing_min_seconds` in all."""
        k = knobs.get()
        pointers = self._check(arrays)
        self._sync_threads()
        fn = self._fn
        for _ in range(k.timing_warmup):
            fn(*pointers)
        times: list[float] = []
        total = 0.0
        while len(times) < max(k.timing_repeats, 1) or total < k.timing_min_seconds:
            start = time.perf_counter()
            fn(*pointers)
            elapsed = time.perf_counter() - start
            times.append(elapsed)
            total += elapsed
        return statistics.median(times)

    def _sync_threads(self) -> None:
        global _changes
        threads = knobs.get().num_threads
        if self._set_threads is not None and _threads_set.get(self._key) != threads:
            self._set_threads(ctypes.c_int(threads))
            _threads_set[self._key] = threads
            _changes += 1

    def __reduce__(self):
        # Reloads the library from its path (the build cache) on the other side.
        return (type(self), (self.func, self.source, self.path, self.target))

    def _check(
        self, arrays: tuple[np.ndarray, ...], known: Mapping[str, int] | None = None
    ) -> list[int]:
        """The arrays' data pointers, then the symbols' sizes, after checking them against the
        parameters."""
        params = self.func.params
        if len(arrays) != len(params):
            names = ", ".join(b.name for b in params)
            raise HexirError(
                f"kernel {self.func.name} takes {len(params)} arrays ({names}), got {len(arrays)}"
            )
        sizes = self._sizes(arrays, known)
        for buffer, dtype, array in zip(params, self._dtypes, arrays, strict=True):
            shape = shape_at(buffer.shape, sizes)
            problem = _problem(array, shape, dtype)
            if problem:
                raise HexirError(
                    f"kernel {self.func.name}: parameter {buffer.name} expects a C-contiguous "
                    f"{dtype} array of shape {shape}, got {problem}"
                )
        self._check_overlap(arrays)
        return [address(a) for a in arrays] + [sizes[name] for name in self._symbols]

    def _sizes(
        self, arrays: tuple[object, ...], known: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Each symbol's size, read from the arrays' shapes; the kernel's assumptions guarded:
        every extent agrees with them, every symbol is at least 1, and every param holds fewer
        than 2^31 elements (symbolic buffers are indexed in int32, hexir/ir/arith.py)."""
        if not self._symbols:
            return {}
        params = self.func.params
        shapes = [getattr(a, "shape", ()) for a in arrays]
        if known is not None and all(known.get(n, 0) >= 1 for n in self._symbols):
            # Every size given (a DynamicModule's run): the arrays' shapes are checked against
            # the extents at those sizes by the caller (`_check`), without binding them again.
            sizes, problems = {n: int(known[n]) for n in self._symbols}, []
        else:
            known = {n: s for n, s in (known or {}).items() if n in self._symbols}
            sizes, problems = bind_sizes([(b.name, b.shape) for b in params], shapes, known)
        for buffer, shape in zip(params, shapes, strict=True):
            if not problems and math.prod(shape) > 2**31 - 1:
                problems.append(f"{buffer.name} has {math.prod(shape)} elements, past 2^31 - 1")
        if problems:
            raise HexirError(
                f"kernel {self.func.name} (compiled once for any {', '.join(self._symbols)}) "
                f"cannot run on these arrays: {'; '.join(problems)}"
            )
        return sizes

    def _check_overlap(self, arrays: tuple[np.ndarray, ...]) -> None:
        # Parameters are `restrict`: an output may share memory with no other array.
        n_in = len(arrays) - self.func.num_outputs
        for i in range(n_in, len(arrays)):
            out = arrays[i]
            if not out.flags.writeable:
                raise HexirError(
                    f"kernel {self.func.name}: output {self.func.params[i].name} is read-only"
                )
            for j, other in enumerate(arrays):
                if j != i and np.may_share_memory(out, other):
                    raise HexirError(
                        f"kernel {self.func.name}: output {self.func.params[i].name} shares "
                        f"memory with parameter {self.func.params[j].name}"
                    )

    def __repr__(self) -> str:
        return (
            f"CpuKernel({self.func.name!r}, target={str(self.target)!r}, path={str(self.path)!r})"
        )


def _problem(array: object, shape: tuple[int, ...], dtype: np.dtype) -> str:
    """What is wrong with `array` for a parameter, or "" when it fits."""
    if not isinstance(array, np.ndarray):
        return f"a {type(array).__name__}"
    got = f"a {array.dtype} array of shape {array.shape}"
    if array.shape != tuple(shape) or array.dtype != dtype:
        return got
    if not array.flags.c_contiguous:
        return f"a non-contiguous {array.dtype} array of shape {array.shape}"
    return ""
