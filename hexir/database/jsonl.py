"""The export format of the tuning database: JSON lines, readable without Hexir.

    {"format": "hexir.database", "version": 1}
    {"type": "workload", "key": "...", "text": "hextir.func @matmul(...) {...}", "created": "..."}
    {"type": "record", "id": "...", "workload_key": "...", "trace": "{...}", ...}

Every workload comes before the records that refer to it. Reading never executes anything:
lines are JSON, traces are checked with Trace.from_json, workloads are parsed as hextir text
and must have the key they claim.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from hexir.database.record import Record, Workload, parse_time, record_from_json, record_to_json
from hexir.errors import DatabaseError

FORMAT = {"format": "hexir.database", "version": 1}


def write_jsonl(
    path: str | os.PathLike, workloads: Iterable[Workload], records: Iterable[Record]
) -> int:
    """Write the file (through a temporary file, so a reader never sees half of one); the
    number of records written."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    n = 0
    with open(partial, "w", encoding="utf-8") as f:
        f.write(json.dumps(FORMAT) + "\n")
        for w in workloads:
            line = {
                "type": "workload",
                "key": w.key,
                "text": w.text,
                "created": w.created.isoformat(),
            }
            f.write(json.dumps(line) + "\n")
        for record in records:
            f.write(json.dumps(record_to_json(record)) + "\n")
            n += 1
    os.replace(partial, target)
    return n


def read_jsonl(path: str | os.PathLike) -> tuple[list[Workload], list[Record]]:
    """The workloads and records of an export file; DatabaseError naming the first bad line."""
    workloads: dict[str, Workload] = {}
    records: list[Record] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                _read_line(n, line, workloads, records)
            except (ValueError, TypeError, KeyError) as e:
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise DatabaseError(
                    f"{path}, line {n}: {reason}; expected the JSON lines that "
                    "Database.export_jsonl writes"
                ) from e
    return list(workloads.values()), records


def _read_line(n: int, line: str, workloads: dict[str, Workload], records: list[Record]) -> None:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if n == 1:
        if {k: data.get(k) for k in FORMAT} != FORMAT:
            raise ValueError(f"the first line should be {json.dumps(FORMAT)}")
        return
    match data.get("type"):
        case "workload":
            workload = Workload(str(data["key"]), str(data["text"]), parse_time(data["created"]))
            _check_workload(workload)
            workloads[workload.key] = workload
        case "record":
            record = record_from_json(data)
            if record.workload_key not in workloads:
                raise ValueError(
                    f"the record refers to workload {record.workload_key}, not defined above"
                )
            records.append(record)
        case other:
            raise ValueError(f"unknown line type {other!r}")


def _check_workload(workload: Workload) -> None:
    from hexir.ir.keys import workload_key

    if workload_key(workload.load_func()) != workload.key:
        raise ValueError(f"workload {workload.key}: its text has another workload key")
