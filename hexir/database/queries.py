"""The queries of the tuning database: plain functions over an open Session.

The Database class (database.py) owns sessions and transactions; these only read and add.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sqlalchemy import case, func, literal, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from hexir.database.models import RecordRow, WorkloadRow, naive
from hexir.database.record import Record, Workload, confirmed_runs, footing, standing


def add_workload(session: Session, workload: Workload) -> bool:
    """Add the workload unless its key is there already; whether it was added.

    Two drivers may add the same new workload at once (on servers that do not serialize
    writers, like PostgreSQL): the loser's insert fails inside a savepoint and is dropped.
    """
    if session.get(WorkloadRow, workload.key) is not None:
        return False
    try:
        with session.begin_nested():
            session.add(
                WorkloadRow(key=workload.key, text=workload.text, created=naive(workload.created))
            )
    except IntegrityError:
        return False
    return True


def add_record(session: Session, record: Record) -> None:
    session.add(RecordRow.of(record))


def _for(workload_key: str, target_key: str):  # noqa: ANN202 - a SQL condition
    return (RecordRow.workload_key == workload_key) & (RecordRow.target_key == target_key)


def best(
    session: Session,
    workload_key: str,
    target_key: str,
    k: int,
    threshold: float = 0.0,
    confirmed_first: bool = True,
) -> list[Record]:
    """The k fastest valid candidates, a record each, fastest first: those measured quietly
    first (calibration at most `threshold`, or none), then, where they are fewer than k,
    those measured under load (records timed in a model's run, `Record.in_model`, are left
    out); among each, with `confirmed_first`, those a tune confirmed
    first (a record of theirs has build_info "confirmed": timed in turn with the task's best
    and its default, hexir/search/tune.py), by their confirmations alone, then those a tune
    checked (build_info "checked": timed in turn with the best to check a claimed gain), by
    their checks alone, then the others (`footing`).
    A candidate measured more than once stands at the median of its quiet records (of all,
    where none is quiet), the slower of two middle ones: a lucky run alone does not make it
    the best once a second measurement says otherwise. Confirmation first, and alone,
    because a host's speed shifts: confirmed in a slow spell, a tune's best few stood behind
    candidates timed once in a fast one (38 of ResNet-18's 69 tasks, 1.4x on the convs), and
    a default whose first run fell in a slow spell stood at its slowest confirmation while
    the pick stood at its middle one (a residual conv's pick 4% slower than its default
    won)."""
    if k < 1:
        return []
    loaded = _suspect(threshold).label("loaded")
    confirmed = func.coalesce(RecordRow.build_info["confirmed"].as_boolean(), False)
    checked = func.coalesce(RecordRow.build_info["checked"].as_boolean(), False)
    columns = (RecordRow.id, RecordRow.candidate_key, RecordRow.median, RecordRow.created, loaded)
    valid = _for(workload_key, target_key) & RecordRow.error_kind.is_(None) & ~_in_model()
    query = select(*columns, confirmed.label("confirmed"), checked.label("checked"))
    query = query.where(valid & RecordRow.median.is_not(None))
    rows = session.execute(query).all()
    runs: dict[str, list] = {}
    for row in rows:
        runs.setdefault(row.candidate_key, []).append(row)
    ranks = []
    for candidate_runs in runs.values():
        if confirmed_first:
            candidate_runs = confirmed_runs(candidate_runs)
        quietest, middle = standing(candidate_runs, [r.loaded for r in candidate_runs])
        unconfirmed = footing(candidate_runs[0]) if confirmed_first else 0
        ranks.append((quietest, unconfirmed, middle.median, middle.created, middle.id))
    chosen = [entry[-1] for entry in sorted(ranks)[:k]]
    by_id = {
        row.id: row for row in session.scalars(select(RecordRow).where(RecordRow.id.in_(chosen)))
    }
    return [by_id[i].to_record() for i in chosen]


def _suspect(threshold: float):  # noqa: ANN202 - a SQL expression
    """1 for a record measured under load (its calibration past `threshold`; 0: none is), else 0."""
    if threshold <= 0:
        return literal(0)
    return case((RecordRow.calibration > threshold, 1), else_=0)


def _in_model():  # noqa: ANN202 - a SQL expression
    """True for a record timed inside a model's run (build_info "in_model" names the sitting)."""
    return RecordRow.build_info["in_model"].as_string().is_not(None)


def records(session: Session, workload_key: str, target_key: str) -> list[Record]:
    query = (
        select(RecordRow)
        .where(_for(workload_key, target_key))
        .order_by(RecordRow.created, RecordRow.id)
    )
    return [row.to_record() for row in session.scalars(query)]


def in_model(session: Session, workload_key: str, target_key: str) -> Record | None:
    """The workload's latest valid record timed in a model's run (`Record.in_model`)."""
    valid = RecordRow.error_kind.is_(None) & RecordRow.median.is_not(None)
    query = (
        select(RecordRow)
        .where(_for(workload_key, target_key) & _in_model() & valid)
        .order_by(RecordRow.created.desc(), RecordRow.id.desc())
    )
    row = session.scalars(query.limit(1)).first()
    return None if row is None else row.to_record()


def has_candidate(session: Session, workload_key: str, target_key: str, candidate_key: str) -> bool:
    query = select(RecordRow.id).where(
        _for(workload_key, target_key) & (RecordRow.candidate_key == candidate_key)
    )
    return session.scalars(query.limit(1)).first() is not None


def measured_keys(session: Session, workload_key: str, target_key: str) -> set[str]:
    query = select(RecordRow.candidate_key).where(_for(workload_key, target_key)).distinct()
    return set(session.scalars(query))


def workloads(session: Session) -> list[Workload]:
    query = select(WorkloadRow).order_by(WorkloadRow.created, WorkloadRow.key)
    return [row.to_workload() for row in session.scalars(query)]


def all_records(session: Session) -> Iterator[Record]:
    query = select(RecordRow).order_by(RecordRow.created, RecordRow.id)
    for row in session.scalars(query.execution_options(yield_per=256)):
        yield row.to_record()


def existing_ids(session: Session, ids: Iterable[str]) -> set[str]:
    """Those of `ids` that the database holds already."""
    wanted = list(ids)
    found: set[str] = set()
    for start in range(0, len(wanted), 500):  # keep under every backend's bound-parameter limit
        chunk = wanted[start : start + 500]
        found.update(session.scalars(select(RecordRow.id).where(RecordRow.id.in_(chunk))))
    return found


def suspect_count(session: Session, threshold: float) -> int:
    """Valid records measured under load (their calibration past `threshold`; 0: none)."""
    if threshold <= 0:
        return 0
    query = (
        select(func.count())
        .select_from(RecordRow)
        .where(RecordRow.error_kind.is_(None) & (RecordRow.calibration > threshold))
    )
    return session.scalar(query) or 0


def counts(session: Session) -> tuple[int, int, int, dict[str, int], dict[str, int]]:
    """Workloads, records, valid records, records by error kind, records by target key."""
    n_workloads = session.scalar(select(func.count()).select_from(WorkloadRow)) or 0
    by_target = session.execute(
        select(RecordRow.target_key, func.count()).group_by(RecordRow.target_key)
    )
    targets = {key: n for key, n in by_target}
    by_error = session.execute(
        select(RecordRow.error_kind, func.count())
        .where(RecordRow.error_kind.is_not(None))
        .group_by(RecordRow.error_kind)
    )
    errors = {str(kind): n for kind, n in by_error}
    valid = session.scalar(
        select(func.count())
        .select_from(RecordRow)
        .where(RecordRow.error_kind.is_(None) & RecordRow.median.is_not(None))
    )
    return n_workloads, sum(targets.values()), valid or 0, errors, targets
