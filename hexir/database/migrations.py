"""Schema versions of the tuning database, and the migrations between them.

The version lives in the one-row table `hexir_schema`. Opening a database:
- no tables at all: create the current schema;
- an older version: migrate it, one step at a time, in one transaction (a process killed during
  a migration leaves the old version intact);
- a newer version, or tables that are not Hexir's: refuse with a one-line DatabaseError.

Versions:
- 0: `workload` and `record` with an integer record id and no codegen version; no version table.
- 1: record ids are random 32-hex-digit strings (so export/import can merge without duplicates),
  records carry the codegen version, indexes on (workload, target, candidate | median).
- 2: records carry their calibration figure (hexir/search/calibration.py), taken from the
  build info where a record has one there.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from sqlalchemy import (
    JSON,
    Column,
    Connection,
    DateTime,
    Double,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)

from hexir import __version__
from hexir.database.models import Base, RecordRow, SchemaRow
from hexir.database.record import calibration_of
from hexir.errors import DatabaseError

SCHEMA_VERSION = 2
# The PostgreSQL advisory lock that openers of one database take turns on ("hexir" in ASCII).
SCHEMA_LOCK_KEY = 0x6865786972

# The version-0 layout, kept to read the rows of a version-0 file during its migration.
_V0 = MetaData()
V0_WORKLOAD = Table(
    "workload",
    _V0,
    Column("key", String(64), primary_key=True),
    Column("text", Text),
    Column("created", DateTime),
)
V0_RECORD = Table(
    "record",
    _V0,
    Column("id", Integer, primary_key=True),
    Column("workload_key", String(64)),
    Column("target_key", String(128)),
    Column("candidate_key", String(64)),
    Column("trace", Text),
    Column("latencies", JSON),
    Column("median", Double),
    Column("error_kind", String(64)),
    Column("error_message", Text),
    Column("build_info", JSON),
    Column("hexir_version", String(32)),
    Column("created", DateTime),
)


def _v0_to_v1(conn: Connection) -> None:
    rows = [
        dict(row) for row in conn.execute(select(V0_RECORD).order_by(V0_RECORD.c.id)).mappings()
    ]
    V0_RECORD.drop(conn)
    Base.metadata.create_all(conn)  # the new record table and hexir_schema; workload is unchanged
    for row in rows:
        row["id"] = uuid.uuid4().hex
        row["codegen_version"] = "0"  # measured before records said which codegen they used
    if rows:
        conn.execute(insert(RecordRow), rows)


def _v1_to_v2(conn: Connection) -> None:
    # A version-0 database's record table is made anew by _v0_to_v1, with the column.
    if "calibration" not in {c["name"] for c in inspect(conn).get_columns("record")}:
        column = Double().compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE record ADD COLUMN calibration {column}"))
    rows = conn.execute(select(RecordRow.id, RecordRow.build_info)).all()
    figures = [{"rid": rid, "value": calibration_of(info or {})} for rid, info in rows]
    figures = [f for f in figures if f["value"] is not None]
    if figures:
        conn.execute(
            update(RecordRow)
            .where(RecordRow.id == bindparam("rid"))
            .values(calibration=bindparam("value")),
            figures,
        )


# _MIGRATIONS[n] takes a version-n database to version n + 1.
_MIGRATIONS: tuple[Callable[[Connection], None], ...] = (_v0_to_v1, _v1_to_v2)
assert len(_MIGRATIONS) == SCHEMA_VERSION


def prepare(read: Engine, write: Engine, shown: str) -> int | None:
    """Bring the database at `read`/`write` to SCHEMA_VERSION; the version it had (None: new).

    The common case (already current) takes only a read; creating or migrating happens under a
    write transaction that looks again, since another process may have done it meanwhile.
    """
    with read.connect() as conn:
        found = schema_version(conn, shown)
    if found == SCHEMA_VERSION:
        return found
    _refuse_newer(found, shown)
    with write.begin() as conn:
        _take_turns(conn)
        found = schema_version(conn, shown)
        _refuse_newer(found, shown)
        if found is None:
            Base.metadata.create_all(conn)
        else:
            for step in range(found, SCHEMA_VERSION):
                _MIGRATIONS[step](conn)
        if found != SCHEMA_VERSION:
            conn.execute(delete(SchemaRow))
            conn.execute(insert(SchemaRow).values(id=1, version=SCHEMA_VERSION))
    return found


def _take_turns(conn: Connection) -> None:
    """Make processes that open one new (or old) database at once create (or migrate) it in
    turn, each seeing what the one before committed. SQLite's write transactions take turns
    already (BEGIN IMMEDIATE); PostgreSQL's would each create the tables, and all but one fail.
    The lock is the transaction's: it goes with its commit or rollback."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(SCHEMA_LOCK_KEY)))


def schema_version(conn: Connection, shown: str) -> int | None:
    """The schema version of the database, None if it holds no tables yet."""
    inspector = inspect(conn)
    names = set(inspector.get_table_names())
    if SchemaRow.__tablename__ in names:
        version = conn.execute(select(SchemaRow.version)).scalar()
        if version is None:
            raise DatabaseError(f"{shown}: the hexir_schema table is empty; the file is damaged")
        return version
    if not names:
        return None
    if {"workload", "record"} <= names:
        columns = {c["name"] for c in inspector.get_columns("record")}
        if {c.name for c in V0_RECORD.columns} <= columns:
            return 0
    raise DatabaseError(
        f"{shown} is not a Hexir tuning database (it holds tables {', '.join(sorted(names))}); "
        "point Hexir at a Hexir database or at a new file"
    )


def _refuse_newer(found: int | None, shown: str) -> None:
    if found is not None and not 0 <= found <= SCHEMA_VERSION:
        raise DatabaseError(
            f"{shown} was written with tuning-database schema version {found}; hexir "
            f"{__version__} reads schema version {SCHEMA_VERSION} and older: upgrade hexir, or "
            "point it at another database"
        )
