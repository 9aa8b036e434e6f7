"""Emptying the caches of a kernel's arrays, so that the kernel timed next reads them from memory.

    flush_arrays(arrays)    # each array's cache lines written back and dropped, every level

A tune times a kernel of large arrays cold (hexir/search/worker.py: COLD_BYTES): in a model,
the kernels between two calls of it evict its weights. On x86-64 the arrays' own lines are
flushed by a small C function (FLUSH_SOURCE, built once through the build cache: CLFLUSHOPT
where the CPU has it, else CLFLUSH, then a fence), which costs what the arrays' size does:
matmul 1024³'s 12 MB in 0.4-0.7 ms here, and the default schedule timed after it within 2% of
its time after the old way. The old way, still the fallback elsewhere, writes a buffer twice
the last-level cache (`evict_bytes`), which cost 16-55 ms a call here: ten cold repeats of
that matmul spent more time emptying caches than running it.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["FLUSH_SOURCE", "evict_bytes", "flush_arrays"]

_ENTRY = "hexir_flush_lines"
FLUSH_SOURCE = "\n".join(
    [
        "/* Hexir's cache flush (hexir/runtime/cache_flush.py). */",
        "#include <stdint.h>",
        "#include <immintrin.h>",
        "",
        '__attribute__((visibility("default")))',
        f"void {_ENTRY}(const void *start, int64_t bytes) {{",
        "  uintptr_t line = (uintptr_t)start & ~(uintptr_t)63;",
        "  uintptr_t end = (uintptr_t)start + (uintptr_t)bytes;",
        "  for (; line < end; line += 64) {",
        "#ifdef __CLFLUSHOPT__",
        "    _mm_clflushopt((void *)line);",
        "#else",
        "    _mm_clflush((void *)line);",
        "#endif",
        "  }",
        "  _mm_mfence();",
        "}",
        "",
    ]
)


def flush_arrays(arrays: Sequence[np.ndarray]) -> None:
    """Empty every cache level of `arrays`' bytes: their lines flushed where the machine is
    x86-64, else the caches as a whole evicted (`_evict_all`)."""
    entry = _flush_entry()
    if entry is None:
        _evict_all()
        return
    for a in arrays:
        if a.nbytes:
            entry(a.ctypes.data, a.nbytes)


@functools.cache
def _flush_entry() -> ctypes._CFuncPtr | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    fn = getattr(ctypes.CDLL(str(_flush_library())), _ENTRY)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn


def _flush_library() -> Path:
    from hexir.runtime.cc import compile_c
    from hexir.runtime.target import Target

    return compile_c(FLUSH_SOURCE, Target("cpu"))


_evict: np.ndarray | None = None


def evict_bytes() -> int:
    """What `_evict_all` writes: twice the last-level cache the kernel reports, within 64
    and 256 MiB (an Intel Xeon VM here reports 480 MiB of L3: a 4 MB copy came back from
    cache after 64 MiB were written, from memory after 128 MiB, 7 ms, and 256 MiB, 16 ms)."""
    path = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    try:
        text = path.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        last = int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        last = 32 << 20
    return min(max(2 * last, 64 << 20), 256 << 20)


def _evict_all() -> None:
    """Write `evict_bytes()` (twice the L3), so that what a kernel reads next comes from
    memory, whatever it reads."""
    global _evict
    if _evict is None:
        _evict = np.zeros(evict_bytes() // 4, dtype=np.float32)
    _evict += 1.0
