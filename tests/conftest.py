"""Shared fixtures: a `store` on every backend, each schema made by the migrations.

The `store` fixture is parametrized over SQLite (a fresh file per test) and
Postgres (a throwaway database per test session at
`CHATLEDGER_TEST_POSTGRES_URL`), so every test that takes it runs once per
backend. Without a reachable Postgres the Postgres half is skipped, except
under `CI=true`, where it fails loudly.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from store import Ledger, Store

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ["sqlite", "postgres"]


def postgres_admin_url() -> str:
    return os.environ.get("CHATLEDGER_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def _libpq(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_postgres_database(prefix: str = "chatledger_test") -> str:
    """Create a throwaway database; return its SQLAlchemy URL."""
    admin = postgres_admin_url()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(_libpq(admin), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as error:
        message = f"PostgreSQL at {admin} is unreachable: {error}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: the Postgres tests must run)")
        pytest.skip(message)
    return sa.make_url(admin).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(url: str) -> None:
    name = sa.make_url(url).database
    with psycopg.connect(_libpq(postgres_admin_url()), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated throwaway Postgres database for this test session."""
    url = create_postgres_database()
    with Store.open(url) as store:
        store.migrate()
    yield url
    drop_postgres_database(url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'chatledger.db'}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A migrated database URL on the current backend."""
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    url = str(request.getfixturevalue("sqlite_url"))
    with Store.open(url) as store:
        store.migrate()
    return url


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with Store.open(database_url) as opened:
        yield opened


@pytest.fixture
def ledger(store: Store) -> Ledger:
    """A handle on a tenant no other test uses."""
    return store.tenant(f"tenant-{uuid.uuid4().hex[:8]}")
