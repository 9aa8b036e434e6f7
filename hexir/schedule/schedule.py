"""`hexir.Schedule`: a PrimFunc being scheduled, and the trace of how.

sch = Schedule(func, seed=0)
i, j, k = sch.get_loops(sch.get_block("matmul"))
io, ii = sch.split(i, [None, 32])
sch.parallel(io)
sch.func     # the scheduled PrimFunc
sch.trace    # the schedule, as data (prints as Python)
"""

from __future__ import annotations

from hexir.schedule.annotate import AnnotatePrimitives
from hexir.schedule.blockize import BlockizePrimitives
from hexir.schedule.cache import CachePrimitives
from hexir.schedule.compute_location import ComputeLocationPrimitives
from hexir.schedule.flash import FlashPrimitives
from hexir.schedule.loops import LoopPrimitives
from hexir.schedule.reduction import ReductionPrimitives
from hexir.schedule.sampling import SamplingPrimitives


class Schedule(
    LoopPrimitives,
    AnnotatePrimitives,
    ComputeLocationPrimitives,
    CachePrimitives,
    ReductionPrimitives,
    BlockizePrimitives,
    FlashPrimitives,
    SamplingPrimitives,
):
    """A PrimFunc, its Trace, and the handles (BlockRV, LoopRV, ExprRV) primitives return.

    `Schedule(func, seed=..., rng=..., target=...)`: sampling draws from `rng` (or a
    `random.Random(seed)`), never the global generator; a `target` (anything with
    `max_threads_per_block`) has its limits checked by `bind`. Each primitive group is a mixin
    over `ScheduleBase` (hexir/schedule/state.py); new groups join the bases here.
    """

    def copy(self) -> Schedule:
        return super().copy()  # type: ignore[return-value]

    fork = copy
