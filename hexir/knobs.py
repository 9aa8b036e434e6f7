"""Every setting of Hexir, typed, each with its environment variable, and a scope for tests.

from hexir import knobs
knobs.get().cc                       # the C compiler
with knobs.scope(num_threads=1):     # any knob, for one block
    ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "hexir")


@dataclass(frozen=True)
class Knobs:
    # The C compiler for CPU kernels and its optimization flags.
    cc: str = field(default_factory=lambda: _env("HEXIR_CC", "cc"))
    cflags: str = field(default_factory=lambda: _env("HEXIR_CFLAGS", "-O3"))
    # OpenMP threads for `parallel` loops; 0 means every core.
    num_threads: int = field(default_factory=lambda: int(_env("HEXIR_NUM_THREADS", "0")))
    # Where built kernels are cached, keyed by source, flags and compiler version.
    cache_dir: str = field(default_factory=lambda: _env("HEXIR_CACHE_DIR", _default_cache()))
    # Kernel timing: warm-up calls, then repeats until both counts are met.
    timing_warmup: int = field(default_factory=lambda: int(_env("HEXIR_TIMING_WARMUP", "2")))
    timing_repeats: int = field(default_factory=lambda: int(_env("HEXIR_TIMING_REPEATS", "10")))
    timing_min_seconds: float = field(
        default_factory=lambda: float(_env("HEXIR_TIMING_MIN_SECONDS", "0.05"))
    )
    # Measurement (hexir/search/measure.py): parallel builds (0 = one per core); seconds one
    # candidate may run (check and timing) before it is killed; seconds the unscheduled
    # reference kernel may take; tolerances of the check against it.
    measure_build_workers: int = field(
        default_factory=lambda: int(_env("HEXIR_MEASURE_BUILD_WORKERS", "0"))
    )
    measure_timeout: float = field(
        default_factory=lambda: float(_env("HEXIR_MEASURE_TIMEOUT", "30"))
    )
    measure_reference_timeout: float = field(
        default_factory=lambda: float(_env("HEXIR_MEASURE_REFERENCE_TIMEOUT", "600"))
    )
    measure_rtol: float = field(default_factory=lambda: float(_env("HEXIR_MEASURE_RTOL", "1e-3")))
    measure_atol: float = field(default_factory=lambda: float(_env("HEXIR_MEASURE_ATOL", "1e-3")))
    # CUDA builds: NVRTC's --use_fast_math (approximate exp, division, ...), and keeping the PTX.
    cuda_fast_math: bool = field(
        default_factory=lambda: _env("HEXIR_CUDA_FAST_MATH", "0") not in ("0", "false")
    )
    cuda_keep_ptx: bool = field(
        default_factory=lambda: _env("HEXIR_CUDA_KEEP_PTX", "0") not in ("0", "false")
    )
    # Fuse ops into one kernel per group (the whole-models issue); off means one op per kernel.
    fusion: bool = field(default_factory=lambda: _env("HEXIR_FUSION", "1") not in ("0", "false"))


_current: Knobs | None = None


def get() -> Knobs:
    """The knobs in force: the environment's, or those of the innermost `scope`."""
    global _current
    if _current is None:
        _current = Knobs()
    return _current


@contextlib.contextmanager
def scope(**changes: object) -> Iterator[Knobs]:
    """Change some knobs for one block: `with knobs.scope(num_threads=1): ...`."""
    global _current
    previous = get()
    unknown = set(changes) - {f.name for f in dataclasses.fields(Knobs)}
    if unknown:
        raise TypeError(f"unknown knobs: {', '.join(sorted(unknown))}")
    _current = dataclasses.replace(previous, **changes)  # type: ignore[arg-type]
    try:
        yield _current
    finally:
        _current = previous
