"""Executors: where candidates are measured, behind one interface (`MeasureExecutor`).

    with LocalExecutor("cpu") as executor:            # in this process, no Ray
        results = executor.measure(candidates)        # one MeasureResult each, in order
        for result in executor.measure_each(candidates):   # the same, each once timed
            ...
        results = executor.measure_in_turn(candidates)     # timed in turn, to compare
    with RayExecutor("cpu") as executor:              # hexir/search/distributed.py
        results = executor.measure(candidates)

The tuning driver hands each round's candidates to an executor and writes what comes back to
the database; an executor writes nothing. Every executor builds a whole batch (in parallel)
before it times any of it, so no timing ever overlaps a build on the same machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, Self

from hexir import knobs
from hexir.errors import MeasureError
from hexir.runtime.target import Target, host_key
from hexir.search.builders import CpuBuilder, CudaBuilder
from hexir.search.measure import Builder, Candidate, MeasureResult, Runner, measure_each
from hexir.search.runners import CpuRunner, CudaRunner


class MeasureExecutor(Protocol):
    """Measures candidates of one target: `measure` returns one MeasureResult per candidate,
    in the candidates' order; failures are error records (only a bug, or a measurement setup
    that cannot work at all, raises). `measure_each` yields the same results in the same
    order, each as soon as it is timed. `workers` is how many builds run at once, for the
    search to size its batches. `close()` ends whatever the executor started (idempotent);
    an executor is a context manager that closes on exit."""

    @property
    def workers(self) -> int: ...

    def measure(self, candidates: Sequence[Candidate]) -> list[MeasureResult]: ...

    def measure_each(self, candidates: Sequence[Candidate]) -> Iterator[MeasureResult]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class LocalExecutor:
    """Measures in this process: a Builder (default: CpuBuilder, or CudaBuilder for a CUDA
    target) builds a batch in parallel, then a Runner (default: CpuRunner, whose worker
    process survives crashing and hanging candidates, or CudaRunner) times it one candidate
    at a time. The executor owns the runner it holds, given or made: `close()` closes it.
    A CPU target must be this machine's (its key): one described as another CPU is a
    MeasureError here, as it is on a Ray node of another CPU."""

    def __init__(
        self,
        target: Target | str,
        builder: Builder | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.target = Target.of(target)
        if self.target.kind == "cpu" and self.target.key != (here := host_key("cpu")):
            raise MeasureError(
                f"target {self.target} ({self.target.key}) is another CPU than this machine's "
                f"({here}): measure it on a machine with that CPU (tune there, or from a node "
                "of a Ray cluster of them: RayExecutor(target, address='auto'))"
            )
        cuda = self.target.kind == "cuda"
        self.builder: Builder = builder or (CudaBuilder() if cuda else CpuBuilder())
        self.runner: Runner = runner or (CudaRunner() if cuda else CpuRunner())
        self._closed = False

    @property
    def workers(self) -> int:
        """The builder's parallel builds: its `workers`, else the `measure_build_workers`
        knob (0: one per core); 1 for a builder that does not say."""
        workers = getattr(self.builder, "workers", 1)
        if workers is None:
            workers = knobs.get().measure_build_workers
        return workers if workers > 0 else Target("cpu").num_cores

    def measure(self, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """Build every candidate, then check and time them one at a time."""
        return list(self.measure_each(candidates))

    def measure_each(self, candidates: Sequence[Candidate]) -> Iterator[MeasureResult]:
        """`measure`, each result as soon as it is timed."""
        if self._closed:
            raise RuntimeError("this LocalExecutor is closed; make a new one")
        check_targets(candidates, self.target)
        if candidates:
            yield from measure_each(candidates, self.builder, self.runner)

    def measure_in_turn(self, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """`measure` for candidates to be compared, timed in turn where the runner can
        (`CpuRunner.run_in_turn`: a call of each, then the next of each), else one at a
        time: the tune's confirmation of its best against the default."""
        run_in_turn = getattr(self.runner, "run_in_turn", None)
        if run_in_turn is None:
            return self.measure(candidates)
        if self._closed:
            raise RuntimeError("this LocalExecutor is closed; make a new one")
        check_targets(candidates, self.target)
        return run_in_turn(candidates, self.builder.build(candidates)) if candidates else []

    def close(self) -> None:
        """Close the runner (its worker process ends); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_targets(candidates: Sequence[Candidate], target: Target) -> None:
    """ValueError where a candidate was scheduled for another target than the executor's."""
    for candidate in candidates:
        if candidate.target.key != target.key:
            raise ValueError(
                f"a candidate of @{candidate.workload.name} is for target {candidate.target} "
                f"({candidate.target.key}) but this executor measures {target} ({target.key}); "
                "use one executor per target"
            )
