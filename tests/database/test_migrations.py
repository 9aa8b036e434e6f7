import json
import os
import pickle
import statistics
import sys

import pytest
from db_fixtures import Result, tiny_func, traces
from sqlalchemy import create_engine, inspect, text

import hexir
from hexir.database import SCHEMA_VERSION, Database
from hexir.errors import DatabaseError, HexirError

# The version-0 layout, written out by hand: no hexir_schema table, integer record ids and no
# codegen version. The types are SQL that both SQLite and PostgreSQL read.
V0_TABLES = [
    "CREATE TABLE workload (key VARCHAR(64) PRIMARY KEY, text TEXT, created TIMESTAMP)",
    """CREATE TABLE record (
    id INTEGER PRIMARY KEY, workload_key VARCHAR(64), target_key VARCHAR(128),
    candidate_key VARCHAR(64), trace TEXT, latencies JSON, median FLOAT, error_kind VARCHAR(64),
    error_message TEXT, build_info JSON, hexir_version VARCHAR(32), created TIMESTAMP
)""",
]
V0_RECORD_COLUMNS = (
    "id, workload_key, target_key, candidate_key, trace, latencies, median, error_kind, "
    "error_message, build_info, hexir_version, created"
)


def _execute(url: str, *statements: str, **values: object) -> list[tuple]:
    """Run SQL on the database at `url` in one transaction, behind Hexir's back; the rows of
    the last statement (if it returns any)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                result = conn.execute(text(statement), values)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def _v0_database(url: str) -> list[tuple[str, float | None]]:
    """A version-0 database with three records; their (candidate key, median)."""
    func = tiny_func()
    key = hexir.workload_key(func)
    _execute(url, *V0_TABLES)
    _execute(
        url,
        "INSERT INTO workload VALUES (:key, :text, :created)",
        key=key,
        text=str(func),
        created="2024-01-02 03:04:05",
    )
    rows = []
    for n, (trace, latencies) in enumerate(zip(traces(3), [[2e-3], [1e-3, 3e-3], []], strict=True)):
        ck = hexir.candidate_key(trace.apply(func).func)
        median = statistics.median(latencies) if latencies else None
        values = {
            "id": n + 1,
            "workload_key": key,
            "target_key": "cpu-avx2",
            "candidate_key": ck,
            "trace": trace.to_json(),
            "latencies": json.dumps(latencies),
            "median": median,
            "error_kind": None if latencies else "crash",
            "error_message": None if latencies else "segfault",
            "build_info": "{}",
            "hexir_version": "0.0.1",
            "created": f"2024-01-02 03:0{n}:00",
        }
        names = ", ".join(f":{name}" for name in values)
        _execute(url, f"INSERT INTO record ({V0_RECORD_COLUMNS}) VALUES ({names})", **values)
        rows.append((ck, median))
    return rows


def test_a_version_0_database_is_migrated(new_url) -> None:
    url = new_url("v0")
    rows = _v0_database(url)
    db = Database(url)
    assert db.found_version == 0
    key = hexir.workload_key(tiny_func())
    records = db.records(key, "cpu-avx2")
    assert [(r.candidate_key, r.median) for r in records] == rows
    assert [r.codegen_version for r in records] == ["0"] * 3
    assert all(len(r.id) == 32 for r in records) and records[2].error_kind == "crash"
    assert [r.candidate_key for r in db.best(key, "cpu-avx2", k=3)] == [rows[0][0], rows[1][0]]
    assert db.workloads()[0].load_func() == tiny_func()
    db.commit_record(tiny_func(), "cpu", traces(1)[0], Result((1e-3,)))
    again = Database(url)
    assert again.found_version == SCHEMA_VERSION and again.stats().records == 4
    assert _execute(url, "SELECT version FROM hexir_schema") == [(SCHEMA_VERSION,)]


def test_a_version_1_database_gains_the_calibration_of_its_records(new_url) -> None:
    # Version 1 is the current layout without the calibration column; a record whose build
    # info carries a calibration figure (none did before version 2; made up here) keeps it.
    url = new_url("v1")
    db = Database(url)
    for trace, info in zip(traces(2), [{"calibration": 3.5}, {}], strict=True):
        db.commit_record(tiny_func(), "cpu-avx2", trace, Result((1e-3,), build_info=info))
    db.close()
    _execute(
        url, "ALTER TABLE record DROP COLUMN calibration", "UPDATE hexir_schema SET version = 1"
    )
    migrated = Database(url)
    assert migrated.found_version == 1
    records = migrated.records(hexir.workload_key(tiny_func()), "cpu-avx2")
    assert sorted(r.calibration or 0.0 for r in records) == [0.0, 3.5]
    assert _execute(url, "SELECT version FROM hexir_schema") == [(SCHEMA_VERSION,)]


def test_a_newer_schema_is_refused_naming_both_versions(new_url) -> None:
    url = new_url("new")
    Database(url).commit_record(tiny_func(), "cpu", traces(1)[0], Result((1.0,)))
    _execute(url, "UPDATE hexir_schema SET version = 7")
    with pytest.raises(DatabaseError) as info:
        Database(url)
    message = str(info.value)
    assert "schema version 7" in message and f"schema version {SCHEMA_VERSION}" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "content", [os.urandom(4096), b"a tuning log, but in words\n" * 20], ids=["random", "text"]
)
def test_a_file_that_is_not_a_database_is_one_line_and_untouched(tmp_path, content) -> None:
    path = tmp_path / "tuning.db"
    path.write_bytes(content)
    with pytest.raises(DatabaseError, match="file is not a database") as info:
        Database(f"sqlite:///{path}")
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert path.read_bytes() == content
    assert isinstance(pickle.loads(pickle.dumps(info.value)), HexirError)


def test_a_database_of_something_else_is_refused(new_url) -> None:
    url = new_url("other")
    _execute(url, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    with pytest.raises(DatabaseError, match="not a Hexir tuning database .*invoices"):
        Database(url)
    engine = create_engine(url)
    assert inspect(engine).get_table_names() == ["invoices"]
    engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://tuner:secret@127.0.0.1:1/hexir",  # nothing listens on port 1
        "not a url",
        "sqlite:///{tmp}/a-file/hexir.db",  # a folder that is a file
    ],
)
def test_an_unreachable_url_is_one_line(tmp_path, url) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DatabaseError, match="cannot open the tuning database") as info:
        Database(url.format(tmp=tmp_path))
    assert "\n" not in str(info.value) and "secret" not in str(info.value)


@pytest.mark.parametrize("module", ["psycopg", "psycopg2"])
def test_a_missing_driver_is_named_with_how_to_install_it(monkeypatch, module) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(DatabaseError) as info:
        Database(f"postgresql+{module}://tuner:secret@127.0.0.1:1/hexir")
    message = str(info.value)
    assert f"its driver, the Python module {module}, is not installed" in message
    assert 'pip install "psycopg[binary]"' in message
    assert "\n" not in message and "secret" not in message


def test_the_tables_compile_for_postgresql() -> None:
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateTable

    from hexir.database.models import Base

    dialect = postgresql.dialect()
    ddl = [str(CreateTable(t).compile(dialect=dialect)) for t in Base.metadata.sorted_tables]
    ddl += [
        str(CreateIndex(i).compile(dialect=dialect))
        for t in Base.metadata.sorted_tables
        for i in t.indexes
    ]
    text = "\n".join(ddl)
    assert "CREATE TABLE record" in text and "REFERENCES workload (key)" in text
    assert "latencies JSON" in text and "median DOUBLE PRECISION" in text
    assert "created TIMESTAMP WITHOUT TIME ZONE" in text
