"""What the tuning database hands back: plain frozen values, never live ORM objects.

This module needs no SQLAlchemy, so code that only reads records (the search, the cost model)
can import it cheaply. A `Record` is one measurement of one candidate of one workload on one
target; `Record.load_trace()` rebuilds its Trace from JSON (no eval, no pickle).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from hexir.runtime.target import Target

R = TypeVar("R")

if TYPE_CHECKING:
    from hexir.ir.tir import PrimFunc
    from hexir.schedule.trace import Trace

# The version of what the code generators emit, stored with every record so that a record
# measured with older generated code can be told apart. It lives here until codegen owns it.
CODEGEN_VERSION = "1"
# The longest error kind the record table holds (PostgreSQL enforces it; SQLite would not).
ERROR_KIND_CHARS = 64


@dataclass(frozen=True)
class Record:
    """One measurement: a trace of a workload on a target, its latencies or its error.

    `id` is a random 32-hex-digit identity given when the record is first committed; it travels
    with the record through export and import, which is how an import never duplicates one.
    A record is valid (a candidate for `best`) when it has latencies and no error kind.
    """

    id: str
    workload_key: str
    target_key: str
    candidate_key: str
    trace: str = field(repr=False)  # Trace.to_json() text
    latencies: tuple[float, ...]  # seconds; empty when the candidate failed
    median: float | None
    error_kind: str | None
    error_message: str | None
    build_info: Mapping[str, object] = field(hash=False)
    hexir_version: str
    codegen_version: str
    created: datetime  # UTC, timezone-aware
    # The calibration kernel's time right after this measurement over its quiet time, or the
    # measurement's median over its fastest latency where larger (hexir/search/calibration.py
    # `load`); None where it was not timed (a GPU, older records).
    calibration: float | None = None

    @property
    def is_valid(self) -> bool:
        return self.error_kind is None and self.median is not None

    @property
    def confirmed(self) -> bool:
        """Whether a tune's confirmation measured it, timed in turn with its task's best few
        and its default schedule (hexir/search/tune.py): Database.best ranks such candidates
        first."""
        return bool(self.build_info.get("confirmed"))

    @property
    def checked(self) -> bool:
        """Whether a tune timed it in turn with its task's best to check a claimed gain
        (hexir/search/tune.py): Database.best ranks such candidates after the confirmed ones,
        ahead of the rest."""
        return bool(self.build_info.get("checked"))

    @property
    def in_model(self) -> bool:
        """Whether it times the kernel inside a run of a whole model (hexir/search/tune.py,
        `hexir.graph.forms`), not alone: Database.best and the cost model leave such records
        out, and a build's pick of a conv's form weighs them (`Database.in_model`)."""
        return bool(self.build_info.get("in_model"))

    def suspect(self, threshold: float) -> bool:
        """Whether it was measured while something else ran: its calibration passed
        `threshold` (0: never)."""
        return threshold > 0 and self.calibration is not None and self.calibration > threshold

    def load_trace(self) -> Trace:
        """The stored trace, parsed from JSON."""
        from hexir.schedule.trace import Trace

        return Trace.from_json(self.trace)


@dataclass(frozen=True)
class Workload:
    """A workload the database has seen: its key and the unscheduled function's printed text."""

    key: str
    text: str
    created: datetime

    def load_func(self) -> PrimFunc:
        """The unscheduled PrimFunc, parsed back from its text."""
        from hexir.ir.tir import PrimFunc
        from hexir.ops.parse import parse

        func = parse(self.text)
        if not isinstance(func, PrimFunc):
            raise ValueError(f"workload {self.key} holds a graph, not a hextir function")
        return func


@dataclass(frozen=True)
class Stats:
    """Counts of what a database holds: `errors` by error kind, `targets` records by target key."""

    url: str
    schema_version: int
    workloads: int
    records: int
    valid: int
    errors: Mapping[str, int] = field(hash=False)
    targets: Mapping[str, int] = field(hash=False)
    suspect: int = 0  # valid records measured under load (`Record.suspect`)


def target_key(target: Target | str) -> str:
    """The key of a Target, a target string ("cpu", "cuda -arch=sm_90") or a target key itself.

    Keys ("cpu-avx2-avx512f-fma", "cuda-sm_90") are accepted as they are, so records measured on
    another machine can be looked up by the key they were stored under.
    """
    if isinstance(target, Target):
        return target.key
    if target.startswith(("cpu-", "cuda-")) and " " not in target:
        return target
    return Target(target).key


def standing(runs: Sequence[R], loaded: Sequence[int]) -> tuple[int, R]:
    """Where a candidate measured `runs` times stands, as Database.best ranks candidates:
    (1 where every run was measured under load, else 0; the run it stands at). That run is
    the median of its quiet runs (of all, where none is quiet) by (median, created, id), the
    slower of two middle ones. A run has `.median`, `.created` and `.id`; `loaded[i]` is 1
    for a run measured under load."""
    quietest = min(loaded)
    kept = [r for r, n in zip(runs, loaded, strict=True) if n == quietest]
    kept.sort(key=lambda r: (r.median, r.created, r.id))
    return quietest, kept[len(kept) // 2]


def footing(run: Any) -> int:
    """A run's footing, lowest first: 0 a tune's confirmation timed it (`.confirmed`), 1 a
    tune's check of a claimed gain (`.checked`), 2 neither. Database.best ranks a candidate by
    the lowest footing of its runs, and at its runs of that footing alone."""
    return 0 if run.confirmed else 1 if run.checked else 2


def confirmed_runs(runs: Sequence[R]) -> list[R]:
    """A candidate's runs of its lowest `footing`: its confirmations where it has any, else its
    checks, else all of them. A confirmed candidate stands at its confirmations alone, which
    were timed in turn with its rivals (the tasks of a conv's other form among them), where its
    other runs were timed at other moments."""
    lowest = min((footing(r) for r in runs), default=2)
    return [r for r in runs if footing(r) == lowest]


def median_of(latencies: tuple[float, ...]) -> float | None:
    return statistics.median(latencies) if latencies else None


def now() -> datetime:
    return datetime.now(UTC)


def check_result(result: object) -> tuple[tuple[float, ...], str | None, str | None, dict]:
    """The latencies, error kind, error message and build info of a measure result, checked.

    `result` is any object with those four attributes (the search's MeasureResult).
    """
    latencies = tuple(float(x) for x in getattr(result, "latencies", ()))
    kind = getattr(result, "error_kind", None)
    message = getattr(result, "error_message", None)
    info = dict(getattr(result, "build_info", None) or {})
    if any(not math.isfinite(x) or x <= 0 for x in latencies):
        raise ValueError(f"latencies must be positive finite seconds, got {latencies}")
    if kind is None and not latencies:
        raise ValueError("a measure result needs latencies or an error kind; it has neither")
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"error_kind must be a string or None, got {kind!r}")
    check_error_kind(kind)
    try:
        json.dumps(info)
    except (TypeError, ValueError) as e:
        raise ValueError(f"build_info must be JSON-able: {e}") from e
    return latencies, kind, None if message is None else storable(str(message)), info


def check_error_kind(kind: str | None) -> None:
    if kind is not None and len(kind) > ERROR_KIND_CHARS:
        raise ValueError(f"error_kind has at most {ERROR_KIND_CHARS} characters, got {kind!r:.80}")


def storable(text: str) -> str:
    """The text with each NUL character replaced by U+FFFD: PostgreSQL's text cannot hold NUL
    (SQLite's can), and a message stored on one backend should read back alike on another."""
    return text.replace("\x00", "\ufffd")


def record_to_json(record: Record) -> dict[str, object]:
    """The JSON object of one record in an export file."""
    return {
        "type": "record",
        "id": record.id,
        "workload_key": record.workload_key,
        "target_key": record.target_key,
        "candidate_key": record.candidate_key,
        "trace": record.trace,
        "latencies": list(record.latencies),
        "error_kind": record.error_kind,
        "error_message": record.error_message,
        "build_info": dict(record.build_info),
        "hexir_version": record.hexir_version,
        "codegen_version": record.codegen_version,
        "created": record.created.isoformat(),
        "calibration": record.calibration,
    }


def record_from_json(data: dict[str, object]) -> Record:
    """The record an export line describes; ValueError naming the first bad field."""
    from hexir.schedule.trace import Trace

    latencies = tuple(float(x) for x in _typed(data, "latencies", list))
    record = Record(
        id=_text(data, "id"),
        workload_key=_text(data, "workload_key"),
        target_key=_text(data, "target_key"),
        candidate_key=_text(data, "candidate_key"),
        trace=_text(data, "trace"),
        latencies=latencies,
        median=median_of(latencies),
        error_kind=None if data.get("error_kind") is None else _text(data, "error_kind"),
        error_message=_message(data),
        build_info=_typed(data, "build_info", dict),
        hexir_version=_text(data, "hexir_version"),
        codegen_version=_text(data, "codegen_version"),
        created=parse_time(_text(data, "created")),
        calibration=_calibration(data),
    )
    if not 0 < len(record.id) <= 32:
        raise ValueError(f"a record id has 1 to 32 characters, got {record.id!r}")
    check_error_kind(record.error_kind)
    Trace.from_json(record.trace)  # refuse a line whose trace does not parse
    return record


def calibration_of(build_info: Mapping[str, object]) -> float | None:
    """The calibration figure a measurement's build info carries (None: not timed)."""
    value = build_info.get("calibration")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _calibration(data: dict[str, object]) -> float | None:
    """An export line's calibration: its own field, else its build info's (older exports)."""
    value = data.get("calibration")
    if value is None:
        info = data.get("build_info")
        return calibration_of(info) if isinstance(info, dict) else None
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"calibration must be a positive number or null, got {value!r}")
    return float(value)


def _typed(data: dict[str, object], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind):
        raise ValueError(f"field {name!r} should be a {kind.__name__}, got {value!r:.80}")
    return value


def _text(data: dict[str, object], name: str) -> str:
    return _typed(data, name, str)


def _message(data: dict[str, object]) -> str | None:
    return None if data.get("error_message") is None else storable(_text(data, "error_message"))


def parse_time(text: str) -> datetime:
    """An ISO timestamp as a UTC-aware datetime (naive ones are taken to be UTC)."""
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
