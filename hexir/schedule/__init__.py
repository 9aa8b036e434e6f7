"""Schedules as data (DESIGN.md §3): `Schedule`, its primitives, and the `Trace` they record."""

from hexir.errors import ScheduleError
from hexir.schedule.sampling import compute_location_candidates
from hexir.schedule.schedule import Schedule
from hexir.schedule.state import INLINE, ROOT, Location
from hexir.schedule.trace import BlockRV, ExprRV, Instruction, LoopRV, Trace

__all__ = [
    "INLINE",
    "ROOT",
    "BlockRV",
    "ExprRV",
    "Instruction",
    "Location",
    "LoopRV",
    "Schedule",
    "ScheduleError",
    "Trace",
    "compute_location_candidates",
]
