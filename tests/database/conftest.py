"""The database tests run on each backend at hand: SQLite always, PostgreSQL when the
environment variable HEXIR_TEST_POSTGRES_URL names a database on a server whose role may
create databases (`.ci/run` starts such a server and sets it, so CI always runs both).

A test that takes `new_url` or `db` runs once per backend (ids `[sqlite]`, `[postgresql]`)
and every database it opens is new and its own: a SQLite file in its tmp_path, or a PostgreSQL
database created for it and dropped after. Without the variable the PostgreSQL cases are not
generated at all: they never skip, since CI fails on any skip beyond the GPU tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from db_fixtures import POSTGRES_URL
from sqlalchemy import Engine, create_engine, text

from hexir.database import Database

BACKENDS = ("sqlite", "postgresql") if POSTGRES_URL else ("sqlite",)


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[Engine]:
    """A connection to HEXIR_TEST_POSTGRES_URL that creates and drops the tests' databases."""
    assert POSTGRES_URL is not None
    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def new_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[Callable[[str], str]]:
    """`new_url(name)`: the URL of a new, empty database on this test's backend."""
    if request.param == "sqlite":
        yield lambda name: f"sqlite:///{tmp_path}/{name}.db"
        return
    admin: Engine = request.getfixturevalue("postgres_admin")
    created: list[str] = []

    def new(name: str) -> str:
        database = f"hexir_test_{name}_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{database}"'))
        created.append(database)
        return admin.url.set(database=database).render_as_string(hide_password=False)

    yield new
    with admin.connect() as conn:
        for database in created:
            # FORCE: the test's own Database objects may still hold pooled connections.
            conn.execute(text(f'DROP DATABASE "{database}" WITH (FORCE)'))


@pytest.fixture
def db(new_url: Callable[[str], str]) -> Iterator[Database]:
    """A new, empty tuning database on this test's backend."""
    database = Database(new_url("tuning"))
    yield database
    database.close()
