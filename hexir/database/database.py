"""`hexir.Database`: the tuning database (DESIGN.md §7), on SQLAlchemy.

    db = Database("sqlite:///tuning_logs/hexir.db")        # any SQLAlchemy URL
    record = db.commit_record(func, "cpu", trace, result)  # committed before it returns
    db.best(hexir.workload_key(func), "cpu", k=3)           # valid only, fastest first

Every write is one transaction, committed before the call returns: a tuning driver killed at
any moment keeps every record it committed. SQLite files run in WAL mode with a busy timeout
and write transactions that take the write lock up front (BEGIN IMMEDIATE), so several
processes can write one file at once without losing a record or failing on a lock upgrade.
On PostgreSQL (`postgresql+psycopg://user:password@host/name`, with `pip install
"psycopg[binary]"`) writers run side by side: a workload that two add at once is kept once
(queries.add_workload), and processes opening a new database create its tables in turn
(migrations.prepare). Both backends are tested alike (tests/database).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from hexir import __version__
from hexir.database import queries
from hexir.database.jsonl import read_jsonl, write_jsonl
from hexir.database.migrations import SCHEMA_VERSION, prepare
from hexir.database.record import (
    CODEGEN_VERSION,
    Record,
    Stats,
    Workload,
    calibration_of,
    check_result,
    confirmed_runs,
    median_of,
    now,
    standing,
    target_key,
)
from hexir.errors import DatabaseError
from hexir.ir import keys

if TYPE_CHECKING:
    from hexir.ir.tir import PrimFunc
    from hexir.runtime.target import Target
    from hexir.schedule.trace import Trace

DEFAULT_URL = "sqlite:///tuning_logs/hexir.db"
# How long a SQLite writer waits for another's transaction before giving up. Transactions
# here last milliseconds, so only a stuck process makes anyone wait this long.
BUSY_TIMEOUT_S = 60.0
# How to install the driver modules that URLs name most (postgresql:// is psycopg on SQLAlchemy
# 2.1, psycopg2 on 2.0), for the message when one is missing.
DRIVER_INSTALLS = {
    "psycopg": 'pip install "psycopg[binary]"',
    "psycopg2": "pip install psycopg2-binary, or name psycopg 3 in the URL "
    '(postgresql+psycopg://...) and pip install "psycopg[binary]"',
}


class Database:
    """A tuning database: workloads and the measured records of their candidates.

    Opening one creates a new database (and the folder of a SQLite file), migrates one written
    by an older schema version, or refuses (DatabaseError) a newer one or a file that is not a
    Hexir database. Results are plain frozen `Record`s and `Workload`s.
    """

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self.url = url
        self.shown = _shown(url)
        # Workloads are never deleted: one committed (by anyone) need not be looked up again.
        self._known_workloads: set[str] = set()
        with self._errors("open"):
            self._engine, self._writer = _engines(url)
            # The schema version the database had when opened: None if it was new, older
            # than SCHEMA_VERSION if it was migrated.
            self.found_version = _prepare(self._engine, self._writer, self.shown)

    def commit_record(
        self,
        func: PrimFunc,
        target: Target | str,
        trace: Trace,
        result: object,
        *,
        candidate_key: str | None = None,
    ) -> Record:
        """Record one measurement of `trace` on the unscheduled `func`; commits the workload
        if it is new. `result` has `latencies` (seconds, empty on error), `error_kind`,
        `error_message` and `build_info` (JSON-able). `candidate_key`, when the caller has it,
        saves replaying the trace to compute it."""
        latencies, kind, message, info = check_result(result)
        created = now()
        record = Record(
            id=uuid.uuid4().hex,
            workload_key=keys.workload_key(func),
            target_key=target_key(target),
            candidate_key=candidate_key or keys.candidate_key(trace.apply(func).func),
            trace=trace.to_json(),
            latencies=latencies,
            median=median_of(latencies),
            error_kind=kind,
            error_message=message,
            build_info=info,
            hexir_version=__version__,
            codegen_version=CODEGEN_VERSION,
            created=created,
            calibration=calibration_of(info),
        )
        known = record.workload_key in self._known_workloads
        with self._writing("commit a record") as session:
            if not known:
                queries.add_workload(session, Workload(record.workload_key, str(func), created))
            queries.add_record(session, record)
        self._known_workloads.add(record.workload_key)
        return record

    def best(
        self,
        workload_key: str,
        target: Target | str,
        k: int = 1,
        threshold: float | None = None,
        confirmed_first: bool = True,
    ) -> list[Record]:
        """The k fastest valid candidates, a record each, fastest first: those measured
        quietly first, then those measured under load (`Record.suspect(threshold)`; None: the
        `measure_calibration_threshold` knob), where the quiet ones are fewer than k; among
        each, with `confirmed_first`, those a tune's confirmation timed in turn with the
        task's best and its default first (`Record.confirmed`), by their confirmations
        alone, then those a tune checked (`Record.checked`), by their checks alone. A
        candidate measured more than once stands at the median of its records (the slower of
        two middle ones), and the record returned is that one."""
        threshold = _threshold(threshold)
        with self._reading("look up the best records") as session:
            key = target_key(target)
            return queries.best(session, workload_key, key, k, threshold, confirmed_first)

    def standing(
        self,
        workload_key: str,
        target: Target | str,
        candidate_key: str,
        threshold: float | None = None,
    ) -> Record | None:
        """The record a candidate stands at, as `best` ranks candidates (the median of its
        quiet valid records, of all where none is quiet, the slower of two middle ones; of its
        confirmations alone where a tune confirmed it); None where it has no valid record."""
        threshold = _threshold(threshold)
        runs = [
            r
            for r in self.records(workload_key, target)
            if r.candidate_key == candidate_key and r.is_valid and not r.in_model
        ]
        if not runs:
            return None
        runs = confirmed_runs(runs)
        return standing(runs, [int(r.suspect(threshold)) for r in runs])[1]

    def in_model(self, workload_key: str, target: Target | str) -> Record | None:
        """The workload's latest valid record timed inside a model's run (`Record.in_model`:
        its build_info's "in_model" names the sitting that timed it), None where it has
        none."""
        with self._reading("read the times in a model") as session:
            return queries.in_model(session, workload_key, target_key(target))

    def records(self, workload_key: str, target: Target | str) -> list[Record]:
        """Every record of the workload on the target, errors included, oldest first."""
        with self._reading("read records") as session:
            return queries.records(session, workload_key, target_key(target))

    def has_candidate(self, workload_key: str, target: Target | str, candidate_key: str) -> bool:
        """Whether the candidate was measured (or failed) on the target already."""
        with self._reading("look up a candidate") as session:
            return queries.has_candidate(session, workload_key, target_key(target), candidate_key)

    def measured_keys(self, workload_key: str, target: Target | str) -> set[str]:
        """The candidate keys of every record of the workload on the target: never re-measure."""
        with self._reading("read candidate keys") as session:
            return queries.measured_keys(session, workload_key, target_key(target))

    def workloads(self) -> list[Workload]:
        """Every workload, oldest first; `Workload.load_func()` rebuilds its PrimFunc."""
        with self._reading("read workloads") as session:
            return queries.workloads(session)

    def stats(self) -> Stats:
        """How many workloads, records, valid records; errors by kind; records by target."""
        with self._reading("count records") as session:
            n_workloads, n_records, valid, errors, targets = queries.counts(session)
            suspect = queries.suspect_count(session, _threshold(None))
        return Stats(
            self.shown, SCHEMA_VERSION, n_workloads, n_records, valid, errors, targets, suspect
        )

    def export_jsonl(self, path: str | os.PathLike) -> int:
        """Write every workload and record as JSON lines; the number of records written."""
        with self._reading("export") as session:
            return write_jsonl(path, queries.workloads(session), queries.all_records(session))

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Merge an export file in one transaction; the number of records added.

        A record is identified by its id, which export keeps, so importing a file twice, or a
        file that holds records this database already has, adds nothing twice. Distinct
        measurements of one candidate (different ids) are all kept.
        """
        with self._errors("read an export file"):
            workloads, records = read_jsonl(path)
        with self._writing("import records") as session:
            for workload in workloads:
                queries.add_workload(session, workload)
            known = queries.existing_ids(session, (r.id for r in records))
            added = 0
            for record in records:
                if record.id not in known:
                    known.add(record.id)
                    queries.add_record(session, record)
                    added += 1
        return added

    def close(self) -> None:
        """Release the connections (the database stays usable: it reconnects on demand)."""
        self._engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({self.shown!r})"

    def __reduce__(self) -> tuple[type[Database], tuple[str]]:
        # Another process opens its own connections to the same URL.
        return (Database, (self.url,))

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (SQLAlchemyError, OSError, ImportError) as e:
            raise DatabaseError(_message(self.shown, action, e)) from e

    @contextlib.contextmanager
    def _reading(self, action: str) -> Iterator[Session]:
        with self._errors(action), Session(self._engine) as session:
            yield session

    @contextlib.contextmanager
    def _writing(self, action: str) -> Iterator[Session]:
        with self._errors(action), Session(self._writer) as session, session.begin():
            yield session


def _engines(url: str) -> tuple[Engine, Engine]:
    """The engine for reads and the one for writes (they differ on SQLite only)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = create_engine(parsed, pool_pre_ping=True)
        return engine, engine
    path = parsed.database
    if path and path != ":memory:" and not path.startswith("file:"):
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": BUSY_TIMEOUT_S})
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine, engine.execution_options(hexir_write=True)


# Opening a new SQLite file from several processes at once: SQLite may report it locked at
# once, without waiting out the busy timeout (switching the new file to WAL needs it alone),
# so opening tries again, after a pause that grows; a later try sees the schema made.
OPEN_TRIES = 8


def _prepare(read: Engine, write: Engine, shown: str) -> int | None:
    """`prepare` (migrations.py), tried again where SQLite reports the file locked at once."""
    for attempt in range(OPEN_TRIES):
        try:
            return prepare(read, write, shown)
        except OperationalError as e:
            if "locked" not in str(e.orig) or attempt == OPEN_TRIES - 1:
                raise
            time.sleep(0.02 * 2**attempt)
    raise AssertionError("unreachable")


def _sqlite_connect(dbapi_connection, _record) -> None:  # noqa: ANN001 - a DBAPI connection
    # Let SQLAlchemy emit BEGIN itself (see _sqlite_begin) instead of the sqlite3 module's
    # implicit one, which starts too late for a consistent read and cannot take the lock early.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    cursor.execute("PRAGMA journal_mode = WAL")
    # In WAL mode NORMAL loses no committed transaction when a process dies, only (at worst)
    # the last ones on a power cut, and it saves an fsync per record.
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _sqlite_begin(conn) -> None:  # noqa: ANN001 - a Connection
    # A write transaction takes the write lock at BEGIN: a deferred one that reads first and
    # then writes fails at once with "database is locked" if another writer got in between.
    write = conn.get_execution_options().get("hexir_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError, TypeError):
        return str(url)


def _message(shown: str, action: str, error: BaseException) -> str:
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines()
    reason = lines[0] if lines else type(cause).__name__
    if action == "open" and isinstance(error, ImportError) and error.name:
        return f"cannot open the tuning database {shown}: {_missing_driver(error.name)}"
    if action == "open":
        return (
            f"cannot open the tuning database {shown}: {reason}; check the URL (like "
            f"{DEFAULT_URL}), that its server is reachable and its driver installed, and that "
            "the file is a Hexir database"
        )
    return f"tuning database {shown}: cannot {action}: {reason}"


def _missing_driver(module: str) -> str:
    """What to do when the URL's driver (a Python module SQLAlchemy imports) is missing."""
    install = DRIVER_INSTALLS.get(
        module, "install the package that provides it, or name an installed driver in the URL"
    )
    return f"its driver, the Python module {module}, is not installed: {install}"


def _threshold(threshold: float | None) -> float:
    """A calibration threshold given, or the `measure_calibration_threshold` knob's."""
    from hexir import knobs

    return knobs.get().measure_calibration_threshold if threshold is None else threshold
