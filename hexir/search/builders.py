"""Builders: candidates to kernels, several at once (the `Builder` protocol of measure.py).

    builds = CpuBuilder(workers=2).build(candidates)    # C compiler runs, in parallel
    builds = CudaBuilder().build(candidates)            # NVRTC, through hexir.build

Both go through `hexir.build`, so a measured kernel is exactly the one a user builds. The
C compiler is a subprocess, so a pool of threads keeps several compiles running at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hexir import knobs
from hexir.errors import HexirError
from hexir.runtime.build import build
from hexir.runtime.cc import compile_flags
from hexir.runtime.target import Target
from hexir.search.measure import BuildResult, Candidate, error_kind_of, error_message


class _PoolBuilder:
    """Builds each candidate with `hexir.build` on a pool of `workers` threads (None: the
    `measure_build_workers` knob, whose 0 means one per core)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def build(self, candidates: Sequence[Candidate]) -> list[BuildResult]:
        """One BuildResult per candidate, in order; a HexirError becomes an error result."""
        workers = self._workers()
        with knobs.scope(cc_timeout=knobs.get().measure_build_timeout):
            if workers == 1 or len(candidates) <= 1:
                return [self._build_one(c, workers) for c in candidates]
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hexir-build") as pool:
                return list(pool.map(lambda c: self._build_one(c, workers), candidates))

    def _workers(self) -> int:
        workers = self.workers if self.workers is not None else knobs.get().measure_build_workers
        return workers if workers > 0 else Target("cpu").num_cores

    def _build_one(self, candidate: Candidate, workers: int) -> BuildResult:
        start = time.time()
        try:
            source = candidate.c_source if candidate.target.kind == "cpu" else None
            kernel = build(candidate.func, candidate.target, source)
        except HexirError as e:
            info = self._info(candidate.target, start, workers)
            return BuildResult(
                source=getattr(e, "source", ""),
                error_kind=error_kind_of(e),
                error_message=error_message(e),
                info=info,
            )
        return self._result(kernel, self._info(candidate.target, start, workers))

    def _info(self, target: Target, start: float, workers: int) -> dict[str, Any]:
        end = time.time()
        return {
            "builder": type(self).__name__,
            "build_start": start,
            "build_end": end,
            "build_seconds": end - start,
            "build_workers": workers,
        }

    def _result(self, kernel: Any, info: dict[str, Any]) -> BuildResult:
        raise NotImplementedError


class CpuBuilder(_PoolBuilder):
    """C through the system compiler into shared libraries (the build cache's), in parallel.
    The result holds the library's path, not a loaded kernel: the runner loads it in its
    worker process."""

    def _info(self, target: Target, start: float, workers: int) -> dict[str, Any]:
        info = super()._info(target, start, workers)
        info["compiler"] = knobs.get().cc
        info["flags"] = compile_flags(target)
        return info

    def _result(self, kernel: Any, info: dict[str, Any]) -> BuildResult:
        return BuildResult(path=str(kernel.path), source=kernel.source, info=info)


class CudaBuilder(_PoolBuilder):
    """CUDA C through NVRTC (`hexir.build` for a CUDA target). The result keeps the loaded
    kernel for the in-process CudaRunner, and NVRTC's resource report in its info. A kernel
    that spills registers or keeps a stack frame (local memory, hundreds of cycles a load) is
    a "resource" error: the search does not spend a measurement on it. The info also holds
    the static analyzer's reading (hexir/codegen/gpu_analyze.py): the worst shared-memory
    bank conflict, the occupancy and the fraction of FP32 peak the inner loop allows."""

    def _result(self, kernel: Any, info: dict[str, Any]) -> BuildResult:
        resources = getattr(kernel, "resources", None)
        if resources is not None:
            info["resources"] = dict(resources)
            spill, stack = resources.get("spill_bytes", 0), resources.get("stack_bytes", 0)
            if spill or stack:
                return BuildResult(
                    source=kernel.source,
                    error_kind="resource",
                    error_message=(
                        f"kernel {kernel.name!r} spills {spill} bytes to local memory "
                        f"({stack} bytes of stack) with {resources.get('registers')} registers "
                        "per thread: fewer outputs per thread would keep it in registers"
                    ),
                    info=info,
                )
            info["analysis"] = _analysis(kernel)
        path = getattr(kernel, "path", None)
        return BuildResult(
            path=str(path) if path is not None else None,
            source=kernel.source,
            info=info,
            kernel=kernel,
        )


def _analysis(kernel: Any) -> dict[str, float]:
    from hexir.codegen.gpu_analyze import analyze

    report = analyze(kernel)
    return {
        "worst_conflict": report.worst,
        "occupancy": report.occupancy,
        "predicted_peak": report.predicted,
    }
