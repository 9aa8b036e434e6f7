"""The search space: sketch rules that turn an unscheduled PrimFunc into sampled traces.

    traces = space.sample(func, "cpu", random.Random(0), n=64)
    traces[0].decisions                 # [(instruction index, decision), ...]
    traces[0].apply(func).func          # the scheduled PrimFunc, replayed

A sketch is the structure the rules give a workload: which blocks are inlined, which are tiled
and how many levels, where caches go, which loops are parallel, vectorized or bound to GPU
threads. Its tile sizes, unroll steps and compute locations are sampling instructions
(`sample_perfect_tile`, `sample_categorical`, `sample_compute_location`) whose decisions the
search later changes with `Trace.with_decision`. The rules (sketch_cpu.py, sketch_gpu.py) match
block properties, not op names, so any workload the lowering produces gets a space.

A sampled schedule that a primitive refuses (ScheduleError) or that exceeds the target's
limits (threads per block, shared memory: hexir/codegen/gpu_verify.py) is dropped before it is
built, and sampling draws again, up to `max_attempts` draws per trace asked for.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hexir.errors import ResourceError, ScheduleError, SpaceError
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target
from hexir.schedule import Schedule, Trace
from hexir.search.sketch_cpu import cpu_sketch
from hexir.search.sketch_gpu import gpu_sketch

__all__ = ["SearchSpace", "sample"]


@dataclass(frozen=True)
class SearchSpace:
    """The schedules the search may propose for a workload on a target (see the module)."""

    max_attempts: int = 10  # draws per trace asked for before sampling gives up

    def sample(
        self, func: PrimFunc, target: Target | str, rng: random.Random, n: int
    ) -> list[Trace]:
        """`n` valid traces of `func` for `target`, every decision drawn from `rng`.

        Raises SpaceError when fewer than `n` valid ones turn up in `max_attempts * n` draws,
        naming the most common reasons the others were dropped."""
        return [sch.trace for sch in self.sample_schedules(func, target, rng, n)]

    def sample_schedules(
        self, func: PrimFunc, target: Target | str, rng: random.Random, n: int
    ) -> list[Schedule]:
        """As `sample`, but the Schedules: each trace with the scheduled PrimFunc it made
        (a Candidate needs no replay: `Candidate.from_schedule`)."""
        target = Target.of(target)
        found: list[Schedule] = []
        dropped: Counter[str] = Counter()
        for _ in range(self.max_attempts * n):
            if len(found) == n:
                break
            try:
                found.append(self.sample_schedule(func, target, rng))
            except (ScheduleError, ResourceError) as e:
                dropped[_reason(e)] += 1
        if len(found) < n:
            raise _space_error(func, target, n, len(found), dropped)
        return found

    def sample_schedule(self, func: PrimFunc, target: Target, rng: random.Random) -> Schedule:
        """One sampled schedule that passed the checks; ScheduleError / ResourceError if the
        draw was not valid."""
        # A generator of its own per draw: a dropped draw does not shift the next one.
        sch = Schedule(func, rng=random.Random(rng.getrandbits(64)), target=target)
        if target.kind == "cuda":
            gpu_sketch(sch, target)
        else:
            cpu_sketch(sch, target)
        check_resources(sch.func, target)
        return sch


def sample(func: PrimFunc, target: Target | str, rng: random.Random, n: int) -> list[Trace]:
    """`n` valid traces of `func` for `target` from the default SearchSpace."""
    return SearchSpace().sample(func, target, rng, n)


def check_resources(func: PrimFunc, target: Target) -> None:
    """ResourceError / ScheduleError where a scheduled `func` does not fit `target`: on a GPU,
    threads per block, grid, shared memory and consistent thread bindings, checked on the
    function as it will be built (caches compacted to their tiles)."""
    if target.kind != "cuda":
        return
    from hexir.codegen.gpu_verify import verify_gpu
    from hexir.schedule.compact import compact_buffers

    verify_gpu(compact_buffers(func), target)


def _reason(error: ScheduleError | ResourceError) -> str:
    if isinstance(error, ScheduleError):
        return error.brief()
    return str(error).splitlines()[0]


def _space_error(
    func: PrimFunc, target: Target, n: int, found: int, dropped: Counter[str]
) -> SpaceError:
    reasons = "; ".join(f"{count}x {why}" for why, count in dropped.most_common(3))
    return SpaceError(
        f"the search space of @{func.name} for target {target} gave {found} valid schedules "
        f"of the {n} asked for; the others were dropped ({reasons}). A rule does not fit this "
        "workload: report it with the workload, or ask for fewer schedules"
    )
