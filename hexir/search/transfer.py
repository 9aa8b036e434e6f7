"""Transfer tuning: a new workload's search starts from the best schedules of similar ones.

    keys = similar_workloads(db, func, target)          # same op and fusion, other sizes
    found = transferred(db, func, target, k=16)         # their best records, replayed on func

Two workloads are similar when their unscheduled functions differ only in numbers: the same
op in the same fusion at other sizes (ResNet's 3x3 convs on 56² and on 28² images; BERT's and
GPT-2's dense layers). Their `skeleton`, the printed function with every number replaced, is
the same. A record of one replays on the other with its sampling decisions adapted where they
do not fit (`adapt`): a tile recorded on a loop of another extent keeps, from the innermost
factor out, the divisor of what is left of the new extent closest to the recorded factor (in
ratio), and the outermost factor takes the rest; a categorical or location index past the new
candidates takes the last. A trace that does not replay even so is dropped.

The tuner's evolutionary search (hexir/search/evolutionary.py) adds these candidates to a
task's initial population while the database holds fewer records of the task itself than the
population's measured share: the search, and the cost model trained on every record of the
target, start from what worked at other sizes.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from hexir.errors import ResourceError, ScheduleError
from hexir.ir.keys import workload_key
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target
from hexir.schedule.sampling import divisors
from hexir.search.measure import Candidate
from hexir.search.space import check_resources

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.schedule import Schedule, Trace
    from hexir.schedule.trace import Instruction

__all__ = ["adapt", "adapt_tile", "skeleton", "similar_workloads", "transfer", "transferred"]

_NUMBER = re.compile(r"\d+(\.\d+)?([eE][-+]?\d+)?")
_NAME = re.compile(r"%[A-Za-z_][\w.]*")


def skeleton(text: str) -> str:
    """A printed function (`str(func)`, as the database keeps it) with every number replaced
    by `#` and every %name by its order of appearance, the function's name and attributes
    dropped: equal for the same op and fusion at any size, whatever the names."""
    head, _, body = text.partition("\n")
    head = re.sub(r"@\S+?\(", "(", head[: head.find(")") + 1], count=1)
    names: dict[str, str] = {}
    rename = lambda m: names.setdefault(m.group(), _letters(len(names)))  # noqa: E731
    named = _NAME.sub(rename, head + "\n" + body)
    return _NUMBER.sub("#", named)


def _letters(n: int) -> str:
    """%a, %b, ..., %z, %ba, ...: a name without digits (numbers become # afterwards)."""
    out = ""
    while True:
        n, digit = divmod(n, 26)
        out = chr(97 + digit) + out
        if n == 0:
            return "%" + out


def similar_workloads(db: Database, func: PrimFunc, target: Target | str) -> list[str]:
    """Keys of the database's workloads like `func` (same skeleton, another key) that hold a
    valid record on `target`, the most recently created first."""
    own, key = skeleton(str(func)), workload_key(func)
    found = [w for w in db.workloads() if w.key != key and skeleton(w.text) == own]
    found = [w for w in found if db.best(w.key, target, k=1)]
    return [w.key for w in sorted(found, key=lambda w: w.created, reverse=True)]


def transferred(db: Database, func: PrimFunc, target: Target | str, k: int) -> list[Candidate]:
    """Up to `k` distinct candidates of `func` from the best records of similar workloads
    (a share of `k` from each, round robin, best first), replayed with adapted decisions."""
    target = Target.of(target)
    keys = similar_workloads(db, func, target)
    if not keys or k <= 0:
        return []
    each = max(1, math.ceil(k / len(keys)))
    found: dict[str, Candidate] = {}
    for key in keys:
        for record in db.best(key, target, k=each):
            candidate = transfer(record.load_trace(), func, target)
            if candidate is not None and len(found) < k:
                found.setdefault(candidate.candidate_key, candidate)
    return list(found.values())


def transfer(trace: Trace, func: PrimFunc, target: Target | str) -> Candidate | None:
    """`trace` replayed on `func` with its decisions adapted (see the module docstring); None
    when it does not replay or does not fit the target."""
    target = Target.of(target)
    try:
        sch = trace.apply(func, target=target, adapt=adapt)
        check_resources(sch.func, target)
    except (ScheduleError, ResourceError):
        return None
    return Candidate.from_schedule(func, sch, target)


def adapt(sch: Schedule, inst: Instruction, inputs: dict[str, object]) -> object:
    """Another decision for a sampling instruction whose own does not fit (Trace.apply's
    `adapt`), or None."""
    attrs = dict(inst.attrs)
    if inst.kind == "sample_perfect_tile":
        extent = sch.get(inputs["loop"]).extent  # type: ignore[union-attr, arg-type]
        return adapt_tile(list(inst.decision), extent, attrs.get("max_innermost_factor", 16))  # type: ignore[arg-type]
    if inst.kind == "sample_categorical":
        return min(int(inst.decision), len(attrs["candidates"]) - 1)  # type: ignore[arg-type]
    if inst.kind == "sample_compute_location":
        from hexir.schedule.sampling import compute_location_candidates

        block = sch.get(inputs["block"])  # type: ignore[arg-type]
        count = len(compute_location_candidates(sch.func, block))  # type: ignore[arg-type]
        return min(int(inst.decision), count - 1)  # type: ignore[arg-type]
    return None


def adapt_tile(factors: list[int], extent: int, max_inner: int = 16) -> list[int]:
    """Factors of `extent` shaped like `factors` (recorded on another extent): from the
    innermost out, the divisor of what is left closest in ratio to the recorded factor (the
    innermost at most `max_inner` when that is 1 or more); the outermost takes the rest."""
    out = [1] * len(factors)
    rest = extent
    for pos in range(len(factors) - 1, 0, -1):
        choices = divisors(rest)
        if pos == len(factors) - 1 and max_inner >= 1:
            choices = [d for d in choices if d <= max_inner]
        want = max(1, factors[pos])
        out[pos] = min(choices, key=lambda d: (abs(math.log(d / want)), -d))
        rest //= out[pos]
    out[0] = rest
    return out
