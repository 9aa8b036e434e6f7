"""Runners: check, then time, built candidates one at a time (the `Runner` protocol).

    with CpuRunner() as runner:                 # a worker process, replaced when it dies
        results = runner.run(candidates, builds)
    results = CudaRunner().run(candidates, builds)   # in this process, the kernel's time()

Each candidate's outputs are poisoned, computed once and compared with the unscheduled
kernel's on the workload's random inputs before it is timed: a wrong result is an error
record, never a time. Every result's build_info gains `run_start` and `run_end` (time.time()
in this process), which never overlap from one candidate to the next.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hexir import knobs
from hexir.errors import HexirError, MeasureError
from hexir.search.check import Arrays, mismatch, poisoned_outputs, reference
from hexir.search.measure import BuildResult, Candidate, MeasureResult
from hexir.search.worker import (
    MeasureRequest,
    ReferenceRequest,
    Reply,
    WorkerDied,
    WorkerProcess,
    WorkerTimedOut,
)


class CpuRunner:
    """Measures CPU candidates in a separate worker process, one at a time. A candidate that
    crashes the worker costs one "crash" record, one that runs past the `measure_timeout`
    knob one "timeout" record; the worker is replaced and the next candidate measured.
    Use it as a context manager, or `close()` it, to end the worker."""

    def __init__(self) -> None:
        self._worker: WorkerProcess | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="hexir-measure-")
        self._finalizer = weakref.finalize(self, _shut, self.__dict__)

    def run(
        self, candidates: Sequence[Candidate], builds: Sequence[BuildResult]
    ) -> list[MeasureResult]:
        """One MeasureResult per candidate, in order; raises MeasureError only when a
        workload's unscheduled kernel (the reference) cannot be run."""
        _check_lengths(candidates, builds)
        if not self._finalizer.alive:
            raise RuntimeError("this CpuRunner is closed; make a new one")
        return [self._run_one(c, b) for c, b in zip(candidates, builds, strict=True)]

    def close(self) -> None:
        """End the worker process and remove the reference files."""
        self._finalizer()

    def __enter__(self) -> CpuRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_one(self, candidate: Candidate, build: BuildResult) -> MeasureResult:
        if not build.ok:
            return MeasureResult.from_build(build)
        if build.path is None:
            raise ValueError("the CPU runner measures shared libraries: the build has no path")
        ref = self._reference_request(candidate)
        worker = self._prepared(ref)
        info: dict[str, Any] = {**build.info, "worker_pid": worker.pid, "run_start": time.time()}
        request = MeasureRequest(ref, candidate.func, build.source, build.path, candidate.cutoff)
        timeout = knobs.get().measure_timeout
        try:
            reply = worker.call(request, timeout)
        except WorkerTimedOut:
            self._worker = None
            info["run_end"] = time.time()
            message = (
                f"the candidate ran past the {timeout:g} s timeout (HEXIR_MEASURE_TIMEOUT) and "
                f"was killed; library {build.path}, its C source beside it"
            )
            return MeasureResult.error("timeout", message, info)
        except WorkerDied as e:
            self._worker = None
            info["run_end"] = time.time()
            message = (
                f"the candidate crashed the measurement worker ({e.how}); library "
                f"{build.path}, its C source beside it"
                + (f"\nworker stderr:\n{e.log}" if e.log else "")
            )
            return MeasureResult.error("crash", message, info)
        info["run_end"] = time.time()
        return _result(reply, info)

    def _reference_request(self, candidate: Candidate) -> ReferenceRequest:
        key = candidate.workload_key
        # One file per workload and target: the same workload may be measured for two CPUs.
        name = hashlib.sha256(f"{key} {candidate.target.key}".encode()).hexdigest()[:32]
        file = Path(self._dir.name) / f"{name}.npz"
        return ReferenceRequest(key, candidate.workload, candidate.target, str(file), knobs.get())

    def _prepared(self, ref: ReferenceRequest) -> WorkerProcess:
        """A live worker that holds the reference of `ref`'s workload."""
        if self._worker is None:
            self._worker = _start_worker()
        worker = self._worker
        if ref.file in worker.references:
            return worker
        timeout = knobs.get().measure_reference_timeout
        try:
            reply = worker.call(ref, timeout)
        except (WorkerTimedOut, WorkerDied) as e:
            self._worker = None
            raise _reference_error(ref, f"failed ({e})") from None
        if reply.bug is not None:
            raise RuntimeError(f"the measurement worker failed unexpectedly:\n{reply.bug}")
        if reply.error_kind is not None:
            raise _reference_error(ref, f"raised: {reply.error_message}")
        worker.references.add(ref.file)
        return worker


class CudaRunner:
    """Measures CUDA candidates in this process, one at a time, with each built kernel's own
    `time()` (CUDA events). The reference is the unscheduled kernel built for the CPU. Nothing
    here isolates a crash or a hang: a GPU fault ends the process."""

    def __init__(self) -> None:
        self._references: dict[str, tuple[Arrays, Arrays]] = {}

    def run(
        self, candidates: Sequence[Candidate], builds: Sequence[BuildResult]
    ) -> list[MeasureResult]:
        """One MeasureResult per candidate, in order (latencies: the kernel's median)."""
        _check_lengths(candidates, builds)
        return [self._run_one(c, b) for c, b in zip(candidates, builds, strict=True)]

    def _run_one(self, candidate: Candidate, build: BuildResult) -> MeasureResult:
        if not build.ok:
            return MeasureResult.from_build(build)
        kernel: Any = build.kernel
        if kernel is None:
            raise ValueError("the CUDA runner measures loaded kernels: the build has none")
        key = candidate.workload_key
        if key not in self._references:
            self._references[key] = reference(candidate.workload, key, "cpu")
        inputs, expected = self._references[key]
        info: dict[str, Any] = {**build.info, "run_start": time.time()}
        outputs = poisoned_outputs(candidate.func)
        k = knobs.get()
        try:
            kernel(*inputs, *outputs)
            problem = mismatch(outputs, expected, k.measure_rtol, k.measure_atol)
            latency = None if problem else float(kernel.time(*inputs, *outputs))
        except HexirError as e:
            info["run_end"] = time.time()
            return MeasureResult.error("run", str(e), info)
        info["run_end"] = time.time()
        if latency is None:
            return MeasureResult.error("wrong_result", problem or "", info)
        return MeasureResult((latency,), build_info=info)


def _result(reply: Reply, info: dict[str, Any]) -> MeasureResult:
    if reply.bug is not None:
        raise RuntimeError(f"the measurement worker failed unexpectedly:\n{reply.bug}")
    info.update(reply.info)
    if reply.error_kind is not None:
        return MeasureResult.error(reply.error_kind, reply.error_message or "", info)
    return MeasureResult(reply.latencies, build_info=info)


def _start_worker() -> WorkerProcess:
    try:
        return WorkerProcess()
    except (WorkerDied, WorkerTimedOut) as e:
        log = f"\n{e.log}" if isinstance(e, WorkerDied) and e.log else ""
        raise MeasureError(
            f"the measurement worker process did not start ({e}); check that "
            f"`python -c 'import hexir.search.worker'` runs in this environment{log}"
        ) from None


def _reference_error(ref: ReferenceRequest, what: str) -> MeasureError:
    return MeasureError(
        f"the unscheduled kernel of workload {ref.workload_key[:16]} (@{ref.workload.name}), "
        f"which every candidate is checked against, {what}. Reproduce it alone with "
        f"hexir.build(workload)(*inputs, *outputs); a slow one needs a larger "
        f"HEXIR_MEASURE_REFERENCE_TIMEOUT."
    )


def _check_lengths(candidates: Sequence[Candidate], builds: Sequence[BuildResult]) -> None:
    if len(candidates) != len(builds):
        raise ValueError(f"{len(candidates)} candidates but {len(builds)} builds")


def _shut(state: dict[str, Any]) -> None:
    # A finalizer holds the runner's __dict__, not the runner, so the runner can be collected.
    worker = state.get("_worker")
    if worker is not None:
        worker.close()
        state["_worker"] = None
    state["_dir"].cleanup()
