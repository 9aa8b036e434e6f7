"""The tables of the tuning database (schema version 1), as typed SQLAlchemy ORM models.

Only portable types (strings, text, integers, doubles, JSON, timestamps) so the same models run
on SQLite and PostgreSQL. Timestamps are stored as naive UTC, which every backend keeps alike.
PostgreSQL enforces string lengths and refuses NUL in text, where SQLite keeps either: error
kinds are checked against their column and NUL in error messages is stored as U+FFFD
(record.check_result), so both backends store the same records.
A change to these tables is a new schema version with a migration in migrations.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, DateTime, Double, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from hexir.database.record import ERROR_KIND_CHARS, Record, Workload


class Base(DeclarativeBase):
    pass


class SchemaRow(Base):
    """One row: the schema version the tables follow."""

    __tablename__ = "hexir_schema"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class WorkloadRow(Base):
    __tablename__ = "workload"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    text: Mapped[str] = mapped_column(Text)  # the unscheduled PrimFunc, printed: hexir.parse-able
    created: Mapped[datetime] = mapped_column(DateTime)

    def to_workload(self) -> Workload:
        return Workload(self.key, self.text, aware(self.created))


class RecordRow(Base):
    __tablename__ = "record"
    __table_args__ = (
        Index("ix_record_candidate", "workload_key", "target_key", "candidate_key"),
        Index("ix_record_median", "workload_key", "target_key", "median"),
    )

    # A random identity (uuid4 hex) rather than a counter: it survives export and import, so
    # merging databases written on different machines never duplicates a record.
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    workload_key: Mapped[str] = mapped_column(String(64), ForeignKey("workload.key"))
    target_key: Mapped[str] = mapped_column(String(128))
    candidate_key: Mapped[str] = mapped_column(String(64))
    trace: Mapped[str] = mapped_column(Text)
    latencies: Mapped[list[float]] = mapped_column(JSON)
    median: Mapped[float | None] = mapped_column(Double)
    error_kind: Mapped[str | None] = mapped_column(String(ERROR_KIND_CHARS))
    error_message: Mapped[str | None] = mapped_column(Text)
    build_info: Mapped[dict] = mapped_column(JSON)
    hexir_version: Mapped[str] = mapped_column(String(32))
    codegen_version: Mapped[str] = mapped_column(String(32))
    created: Mapped[datetime] = mapped_column(DateTime)
    calibration: Mapped[float | None] = mapped_column(Double)  # schema version 2

    @classmethod
    def of(cls, record: Record) -> RecordRow:
        return cls(
            id=record.id,
            workload_key=record.workload_key,
            target_key=record.target_key,
            candidate_key=record.candidate_key,
            trace=record.trace,
            latencies=list(record.latencies),
            median=record.median,
            error_kind=record.error_kind,
            error_message=record.error_message,
            build_info=dict(record.build_info),
            hexir_version=record.hexir_version,
            codegen_version=record.codegen_version,
            created=naive(record.created),
            calibration=record.calibration,
        )

    def to_record(self) -> Record:
        return Record(
            id=self.id,
            workload_key=self.workload_key,
            target_key=self.target_key,
            candidate_key=self.candidate_key,
            trace=self.trace,
            latencies=tuple(self.latencies),
            median=self.median,
            error_kind=self.error_kind,
            error_message=self.error_message,
            build_info=dict(self.build_info),
            hexir_version=self.hexir_version,
            codegen_version=self.codegen_version,
            created=aware(self.created),
            calibration=self.calibration,
        )


def naive(moment: datetime) -> datetime:
    """UTC without a zone, as stored."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC)
