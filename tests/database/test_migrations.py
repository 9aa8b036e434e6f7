import json
import os
import pickle
import sqlite3
import statistics

import pytest
from db_fixtures import Result, tiny_func, traces

import hexir
from hexir.database import SCHEMA_VERSION, Database
from hexir.errors import DatabaseError, HexirError

# The version-0 layout, written out by hand: no hexir_schema table, integer record ids and no
# codegen version.
V0_TABLES = """
CREATE TABLE workload (key VARCHAR(64) PRIMARY KEY, text TEXT, created DATETIME);
CREATE TABLE record (
    id INTEGER PRIMARY KEY, workload_key VARCHAR(64), target_key VARCHAR(128),
    candidate_key VARCHAR(64), trace TEXT, latencies JSON, median FLOAT, error_kind VARCHAR(64),
    error_message TEXT, build_info JSON, hexir_version VARCHAR(32), created DATETIME
);
"""


def _v0_file(path) -> list[tuple[str, float | None]]:
    """A version-0 database with three records; their (candidate key, median)."""
    func = tiny_func()
    conn = sqlite3.connect(path)
    conn.executescript(V0_TABLES)
    key = hexir.workload_key(func)
    conn.execute("INSERT INTO workload VALUES (?, ?, ?)", (key, str(func), "2024-01-02 03:04:05"))
    rows = []
    for n, (trace, latencies) in enumerate(zip(traces(3), [[2e-3], [1e-3, 3e-3], []], strict=True)):
        ck = hexir.candidate_key(trace.apply(func).func)
        median = statistics.median(latencies) if latencies else None
        values = (n + 1, key, "cpu-avx2", ck, trace.to_json(), json.dumps(latencies), median)
        values += (None if latencies else "crash", None if latencies else "segfault", "{}")
        values += ("0.0.1", f"2024-01-02 03:0{n}:00")
        conn.execute(f"INSERT INTO record VALUES ({', '.join('?' * 12)})", values)
        rows.append((ck, median))
    conn.commit()
    conn.close()
    return rows


def test_a_version_0_file_is_migrated(tmp_path) -> None:
    path = tmp_path / "v0.db"
    rows = _v0_file(path)
    db = Database(f"sqlite:///{path}")
    assert db.found_version == 0
    key = hexir.workload_key(tiny_func())
    records = db.records(key, "cpu-avx2")
    assert [(r.candidate_key, r.median) for r in records] == rows
    assert [r.codegen_version for r in records] == ["0"] * 3
    assert all(len(r.id) == 32 for r in records) and records[2].error_kind == "crash"
    assert [r.candidate_key for r in db.best(key, "cpu-avx2", k=3)] == [rows[0][0], rows[1][0]]
    assert db.workloads()[0].load_func() == tiny_func()
    db.commit_record(tiny_func(), "cpu", traces(1)[0], Result((1e-3,)))
    again = Database(f"sqlite:///{path}")
    assert again.found_version == SCHEMA_VERSION and again.stats().records == 4
    version = sqlite3.connect(path).execute("SELECT version FROM hexir_schema").fetchall()
    assert version == [(SCHEMA_VERSION,)]


def test_a_newer_schema_is_refused_naming_both_versions(tmp_path) -> None:
    path = tmp_path / "new.db"
    Database(f"sqlite:///{path}").commit_record(tiny_func(), "cpu", traces(1)[0], Result((1.0,)))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE hexir_schema SET version = 7")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError) as info:
        Database(f"sqlite:///{path}")
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


def test_a_database_of_something_else_is_refused(tmp_path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError, match="not a Hexir tuning database .*invoices"):
        Database(f"sqlite:///{path}")
    tables = sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("invoices",)]


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
