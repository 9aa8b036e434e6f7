"""Measurement: what is measured (`Candidate`), what comes back (`MeasureResult`), and the two
seams that do it, `Builder` and `Runner` (DESIGN.md §5, §6).

    cands = [Candidate.from_trace(func, trace, "cpu") for trace in traces]
    with CpuRunner() as runner:
        results = measure(cands, CpuBuilder(), runner)
    results[0].median        # seconds, or None when the candidate failed
    results[0].error_kind    # None, or one of ERROR_KINDS

A result never lies: every candidate's output is checked against the unscheduled kernel's
before its time counts, and whatever goes wrong with one candidate (a schedule or resource
check, the compiler, a run that raises, a wrong result, a timeout, a crash) becomes that
candidate's error record, never a time and never the end of the search.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hexir.errors import BuildError, HexirError, ResourceError, ScheduleError
from hexir.ir.keys import candidate_key, workload_key
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target
from hexir.schedule import Schedule, Trace

# Every error kind a MeasureResult may carry.
ERROR_KINDS = ("schedule", "resource", "build", "run", "wrong_result", "timeout", "crash")

# Error messages are kept whole up to this many characters (they land in the database).
MAX_MESSAGE = 4000


@dataclass(frozen=True)
class Candidate:
    """One schedule of one workload for one target: the unit the search measures.

    `workload` is the unscheduled PrimFunc, `func` the scheduled one `trace` makes of it, and
    `candidate_key` the key of `func` (DESIGN.md §2): two candidates with one key are one.
    `cutoff` (seconds; None: none) is how slow a candidate may be and still be timed in full:
    past it on a warm call, one call's time stands for it (the tuner sets it from the task's
    best so far: a candidate three times slower than the best is told apart by one call).
    `near` (seconds; None: none), on the CPU: a candidate whose first three latencies read
    slower than that (their median) is timed by those three, not ten (the tuner sets it from
    the best too: one 1.5 times slower is told apart by three).
    """

    workload: PrimFunc
    trace: Trace
    func: PrimFunc
    target: Target
    candidate_key: str
    cutoff: float | None = field(default=None, compare=False)
    near: float | None = field(default=None, compare=False)

    @classmethod
    def from_trace(cls, func: PrimFunc, trace: Trace, target: Target | str) -> Candidate:
        """Replay `trace` on the unscheduled `func`; raises ScheduleError when it does not
        replay (or breaks one of the target's limits)."""
        target = Target.of(target)
        return cls.from_schedule(func, trace.apply(func, target=target), target)

    @classmethod
    def from_schedule(cls, func: PrimFunc, sch: Schedule, target: Target | str) -> Candidate:
        """The candidate a Schedule of the unscheduled `func` already holds (no replay)."""
        return cls(func, sch.trace, sch.func, Target.of(target), candidate_key(sch.func))

    @property
    def workload_key(self) -> str:
        return workload_key(self.workload)

    @functools.cached_property
    def c_source(self) -> str:
        """The C a CPU build of this candidate compiles, made once: the search reads its size
        before it proposes the candidate, and the builder then compiles it as it is."""
        from hexir.runtime.build import c_source

        return c_source(self.func, self.target)

    def keep_source(self, source: str) -> None:
        """Hold `source`, printed elsewhere from this candidate's func (a helper process:
        hexir/search/sources.py), as its `c_source`."""
        self.__dict__["c_source"] = source

    @property
    def has_source(self) -> bool:
        return "c_source" in self.__dict__

    @property
    def c_lines(self) -> int:
        return self.c_source.count("\n")

    def fits(self, max_lines: int) -> bool:
        """Whether this candidate's C is at most `max_lines` lines. Where it has no C yet,
        the C is printed only that far: a longer one is remembered as such (`mark_longer`),
        without its C. One whose C does not print fits (the builder records its error)."""
        from hexir.codegen.c import SourceTooLong
        from hexir.runtime.build import c_source

        if self.has_source:
            return self.c_lines <= max_lines
        if self.longer_than(max_lines):
            return False
        try:
            self.keep_source(c_source(self.func, self.target, max_lines=max_lines))
        except SourceTooLong:
            self.mark_longer(max_lines)
            return False
        except HexirError:
            return True
        return self.c_lines <= max_lines

    def mark_longer(self, max_lines: int) -> None:
        """Remember that this candidate's C is longer than `max_lines` lines (printed that
        far elsewhere: hexir/search/sources.py)."""
        self.__dict__["_longer_than"] = max(max_lines, self.__dict__.get("_longer_than", 0))

    def longer_than(self, max_lines: int) -> bool:
        """Whether this candidate's C is known to be longer than `max_lines` lines."""
        if self.has_source:
            return self.c_lines > max_lines
        return self.__dict__.get("_longer_than", -1) >= max_lines


@dataclass(frozen=True)
class BuildResult:
    """What a Builder made of one candidate: the shared library (`path`, CPU) or the loaded
    kernel (`kernel`, for an in-process runner such as the CUDA one), the generated source,
    or the error that stopped the build. `info` is JSON-able: times, flags, resources."""

    path: str | None = None
    source: str = ""
    error_kind: str | None = None
    error_message: str | None = None
    info: dict[str, Any] = field(default_factory=dict, hash=False)
    kernel: object | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_kind(self.error_kind)

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass(frozen=True)
class MeasureResult:
    """The measurement of one candidate: `latencies` in seconds (empty on error), or an
    `error_kind` (one of ERROR_KINDS) and its message; `build_info` is JSON-able (build and run
    times, compiler flags, the worker that ran it, NVRTC's resource report, ...)."""

    latencies: tuple[float, ...] = ()
    error_kind: str | None = None
    error_message: str | None = None
    build_info: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _check_kind(self.error_kind)
        if (self.error_kind is None) == (not self.latencies):
            raise ValueError("a MeasureResult holds either latencies or an error kind, not both")

    @classmethod
    def error(cls, kind: str, message: str, build_info: dict[str, Any] | None = None):
        """An error record; the message is cut to MAX_MESSAGE characters."""
        return cls((), kind, _cut(message), dict(build_info or {}))

    @classmethod
    def from_build(cls, build: BuildResult) -> MeasureResult:
        """The error record of a failed build."""
        return cls.error(build.error_kind or "build", build.error_message or "", build.info)

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def median(self) -> float | None:
        """Median seconds per call, or None for an error record."""
        return statistics.median(self.latencies) if self.latencies else None

    @property
    def calibration(self) -> float | None:
        """How many times slower than quiet the machine ran this measurement: the calibration
        kernel's time right after it over its quiet time, or its own median over its fastest
        latency where larger (hexir/search/calibration.py `load`); None where it was not
        timed (an error, a GPU)."""
        value = self.build_info.get("calibration")
        return float(value) if isinstance(value, int | float) else None

    def suspect(self, threshold: float) -> bool:
        """Whether this time was measured while something else ran: its calibration passed
        `threshold` (0: never)."""
        calibration = self.calibration
        return threshold > 0 and calibration is not None and calibration > threshold


class Builder(Protocol):
    """Builds candidates, several at once: one BuildResult per candidate, in order. A failed
    build is a BuildResult with an error kind; only a bug raises."""

    def build(self, candidates: Sequence[Candidate]) -> list[BuildResult]: ...


class Runner(Protocol):
    """Checks and times built candidates, one at a time: one MeasureResult per candidate, in
    order. It must not run while a Builder builds (timings never overlap builds)."""

    def run(
        self, candidates: Sequence[Candidate], builds: Sequence[BuildResult]
    ) -> list[MeasureResult]: ...


def measure(
    candidates: Sequence[Candidate], builder: Builder, runner: Runner
) -> list[MeasureResult]:
    """Build every candidate (in parallel), then run them (one at a time): one result each."""
    return list(measure_each(candidates, builder, runner))


def measure_each(
    candidates: Sequence[Candidate], builder: Builder, runner: Runner
) -> Iterator[MeasureResult]:
    """`measure`, one result at a time, each as soon as it is timed (so that a caller can
    commit it before the next candidate runs)."""
    builds = builder.build(candidates)
    if len(builds) != len(candidates):
        raise ValueError(f"the builder returned {len(builds)} results for {len(candidates)}")
    for candidate, build in zip(candidates, builds, strict=True):
        yield from runner.run([candidate], [build])


def error_kind_of(error: HexirError) -> str:
    """The error kind of an expected failure before a run: a schedule, a resource or a build."""
    match error:
        case ScheduleError():
            return "schedule"
        case ResourceError():
            return "resource"
        case _:
            return "build"


def error_message(error: HexirError) -> str:
    """A record's message: a BuildError without its numbered source (the build keeps that)."""
    match error:
        case BuildError():
            text = error.message + (
                f"\n--- compiler log ---\n{error.log.rstrip()}" if error.log else ""
            )
        case ScheduleError():
            text = error.brief()
        case _:
            text = str(error)
    return _cut(text)


def _cut(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    return message[: MAX_MESSAGE - 30] + f"\n... ({len(message)} characters in all)"


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in ERROR_KINDS:
        raise ValueError(f"unknown error kind {kind!r}; one of {', '.join(ERROR_KINDS)}")
