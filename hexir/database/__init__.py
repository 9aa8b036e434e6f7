"""The tuning database (DESIGN.md §7): every measured schedule, kept for later builds.

    db = hexir.database.Database()                # sqlite:///tuning_logs/hexir.db
    db.commit_record(func, "cpu", trace, result)   # committed before it returns
    [best] = db.best(hexir.workload_key(func), "cpu")
    best.load_trace().apply(func)

models.py holds the tables, queries.py the queries, migrations.py the schema versions,
jsonl.py the export format and record.py the plain values handed back (no SQLAlchemy needed).
"""

from hexir.database.database import DEFAULT_URL, Database
from hexir.database.migrations import SCHEMA_VERSION
from hexir.database.record import CODEGEN_VERSION, Record, Stats, Workload, target_key

__all__ = [
    "CODEGEN_VERSION",
    "DEFAULT_URL",
    "SCHEMA_VERSION",
    "Database",
    "Record",
    "Stats",
    "Workload",
    "target_key",
]
