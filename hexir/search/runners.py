"""Runners: check, then time, built candidates one at a time (the `Runner` protocol).

    with CpuRunner() as runner:                 # a worker process, replaced when it dies
        results = runner.run(candidates, builds)
    with CudaRunner() as runner:                # the same, its worker holding a GPU context
        results = runner.run(candidates, builds)

Each candidate's outputs are poisoned, computed once and compared with the unscheduled
kernel's on the workload's random inputs before it is timed: a wrong result is an error
record, never a time. Every result's build_info gains `run_start` and `run_end` (time.time()
in this process), which never overlap from one candidate to the next, except that candidates
timed in turn (`CpuRunner.run_in_turn`: a call of each, then the next of each) share one.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from hexir import knobs
from hexir.errors import MeasureError
from hexir.runtime.target import Target
from hexir.search.measure import BuildResult, Candidate, MeasureResult
from hexir.search.worker import (
    InTurnRequest,
    MeasureRequest,
    ReferenceRequest,
    Reply,
    WorkerDied,
    WorkerProcess,
    WorkerTimedOut,
)


class _WorkerRunner:
    """Measures candidates in a separate worker process, one at a time. A candidate that
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
            raise RuntimeError(f"this {type(self).__name__} is closed; make a new one")
        return [self._run_one(c, b) for c, b in zip(candidates, builds, strict=True)]

    def run_in_turn(
        self, candidates: Sequence[Candidate], builds: Sequence[BuildResult]
    ) -> list[MeasureResult]:
        """`run` for candidates to be compared: here one at a time; the CPU runner times them
        in turn (`CpuRunner.run_in_turn`)."""
        return self.run(candidates, builds)

    def close(self) -> None:
        """End the worker process and remove the reference files."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, ref: ReferenceRequest, candidate: Candidate, build: BuildResult
    ) -> MeasureRequest:
        """The worker's MeasureRequest for a built candidate."""
        raise NotImplementedError

    def _what(self, build: BuildResult) -> str:
        """The candidate's build, named in an error record."""
        raise NotImplementedError

    def _reference_target(self, candidate: Candidate) -> Target:
        """Where the workload's unscheduled kernel, the reference, runs."""
        return candidate.target

    def _run_one(self, candidate: Candidate, build: BuildResult) -> MeasureResult:
        if not build.ok:
            return MeasureResult.from_build(build)
        ref = self._reference_request(candidate)
        request = self._request(ref, candidate, build)
        worker = self._prepared(ref)
        info: dict[str, Any] = {**build.info, "worker_pid": worker.pid, "run_start": time.time()}
        timeout = knobs.get().measure_timeout
        try:
            reply = worker.call(request, timeout)
        except WorkerTimedOut:
            self._worker = None
            info["run_end"] = time.time()
            message = (
                f"the candidate ran past the {timeout:g} s timeout (HEXIR_MEASURE_TIMEOUT) and "
                f"was killed; {self._what(build)}"
            )
            return MeasureResult.error("timeout", message, info)
        except WorkerDied as e:
            self._worker = None
            info["run_end"] = time.time()
            message = (
                f"the candidate crashed the measurement worker ({e.how}); {self._what(build)}"
                + (f"\nworker stderr:\n{e.log}" if e.log else "")
            )
            return MeasureResult.error("crash", message, info)
        info["run_end"] = time.time()
        return self._replied(reply, info)

    def _replied(self, reply: Reply, info: dict[str, Any]) -> MeasureResult:
        return _result(reply, info)

    def _reference_request(self, candidate: Candidate) -> ReferenceRequest:
        key = candidate.workload_key
        # One file per workload and target: the same workload may be measured for two CPUs.
        name = hashlib.sha256(f"{key} {candidate.target.key}".encode()).hexdigest()[:32]
        file = Path(self._dir.name) / f"{name}.npz"
        target = self._reference_target(candidate)
        return ReferenceRequest(key, candidate.workload, target, str(file), knobs.get())

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


class CpuRunner(_WorkerRunner):
    """Measures CPU candidates (shared libraries) in a worker process (`_WorkerRunner`)."""

    def _request(
        self, ref: ReferenceRequest, candidate: Candidate, build: BuildResult
    ) -> MeasureRequest:
        if build.path is None:
            raise ValueError("the CPU runner measures shared libraries: the build has no path")
        return MeasureRequest(
            ref, candidate.func, build.source, build.path, candidate.cutoff, near=candidate.near
        )

    def _what(self, build: BuildResult) -> str:
        return f"library {build.path}, its C source beside it"

    def run_in_turn(
        self, candidates: Sequence[Candidate], builds: Sequence[BuildResult]
    ) -> list[MeasureResult]:
        """`run`, but the candidates are checked (each against its workload's reference) and
        then timed in turn, in one request (`time_in_turn` in hexir/search/worker.py): a call
        of each, then the next call of each, so that the host's shifts of speed hit them
        alike: candidates of one workload, or the kernels of two forms of a conv. Where the
        worker crashes or runs past the timeout on the batch, each is run on its own (`run`)."""
        _check_lengths(candidates, builds)
        built = [(c, b) for c, b in zip(candidates, builds, strict=True) if b.ok]
        if len(built) < 2 or not self._finalizer.alive:
            return self.run(candidates, builds)
        refs = {c.workload_key: self._reference_request(c) for c, _ in built}
        request = InTurnRequest(tuple(self._request(refs[c.workload_key], c, b) for c, b in built))
        for ref in refs.values():
            worker = self._prepared(ref)
        start = time.time()
        try:
            reply = worker.call(request, knobs.get().measure_timeout * len(built))
        except (WorkerTimedOut, WorkerDied):
            self._worker = None
            return self.run(candidates, builds)
        span = {"worker_pid": worker.pid, "run_start": start, "run_end": time.time()}
        if reply.bug is not None:
            raise RuntimeError(f"the measurement worker failed unexpectedly:\n{reply.bug}")
        if reply.error_kind is not None:  # a HexirError on the batch: each on its own
            return self.run(candidates, builds)
        replies = iter(reply.info["replies"])
        return [
            _result(next(replies), {**b.info, **span}) if b.ok else MeasureResult.from_build(b)
            for b in builds
        ]


class CudaRunner(_WorkerRunner):
    """Measures CUDA candidates in a worker process (`_WorkerRunner`) that holds a GPU
    context of its own: a kernel that faults (an illegal address) poisons that context, so a
    candidate whose run fails on the GPU ends the worker and the next one gets a new one; a
    kernel that hangs is killed at the `measure_timeout` knob. The reference is the
    unscheduled kernel built for the CPU; timing is `CudaKernel.time` (the L2 flushed before
    each repeat)."""

    def _request(
        self, ref: ReferenceRequest, candidate: Candidate, build: BuildResult
    ) -> MeasureRequest:
        if build.kernel is None:
            raise ValueError("the CUDA runner measures built kernels: the build has none")
        return MeasureRequest(
            ref, candidate.func, build.source, None, candidate.cutoff, kernel=build.kernel
        )

    def _what(self, build: BuildResult) -> str:
        return "its CUDA C in the record's source"

    def _reference_target(self, candidate: Candidate) -> Target:
        return Target("cpu")

    def _replied(self, reply: Reply, info: dict[str, Any]) -> MeasureResult:
        if reply.error_kind == "run" and self._worker is not None:
            self._worker.close()  # its context may hold the fault's sticky error
            self._worker = None
        return _result(reply, info)


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
