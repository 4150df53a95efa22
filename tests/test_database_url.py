"""Database URLs: which database, which driver, and a clear error for a bad one."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from chatledger.store import AsyncStore, InvalidInputError, Store
from chatledger.store._db.engines import DEFAULT_URL, database_url, normalize_url


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://u:pw@db.example:5433/app", "postgresql+psycopg://u:pw@db.example:5433/app"),
        ("postgres://u:pw@db.example/app", "postgresql+psycopg://u:pw@db.example/app"),
        ("postgres+psycopg2://db.example/app", "postgresql+psycopg2://db.example/app"),
        ("postgresql+psycopg://db.example/app", "postgresql+psycopg://db.example/app"),
        ("sqlite:///chatledger.db", "sqlite:///chatledger.db"),
        ("sqlite://", "sqlite://"),
    ],
)
def test_postgres_urls_get_psycopg_3_and_others_are_kept(given: str, used: str) -> None:
    assert normalize_url(given) == used


def test_the_store_opens_postgres_urls_with_psycopg_3() -> None:
    with Store.open("postgres://u@db.example/app") as store:  # opening connects to nothing
        assert store.engine.url.drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    "given",
    [
        "sqlite:////tmp/a dir/50%25 done#1.db",
        "postgresql://us%40er:p%40ss%3Aword@[::1]:5432/app?sslmode=require&application_name=a%20b",
        "postgresql://u@/app?host=/var/run/postgresql",
    ],
)
def test_a_url_means_the_same_after_normalizing(given: str) -> None:
    normalized = sa.make_url(normalize_url(given))
    assert normalized.set(drivername=sa.make_url(given).drivername) == sa.make_url(given)


def test_the_default_is_chatledger_database_url_else_a_sqlite_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CHATLEDGER_DATABASE_URL", raising=False)
    assert normalize_url(None) == normalize_url("") == DEFAULT_URL == "sqlite:///chatledger.db"
    monkeypatch.setenv("CHATLEDGER_DATABASE_URL", "postgres://u@db.example/app")
    assert normalize_url(None) == "postgresql+psycopg://u@db.example/app"
    assert normalize_url("sqlite:///other.db") == "sqlite:///other.db"  # the argument wins


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("db.example/app", ["cannot be read as a URL", "postgresql://user:password@host"]),
        ("postgres//u:secret@db.example/app", ["cannot be read as a URL", "sqlite:///"]),
        (" postgresql://u:secret@db.example/app", ["cannot be read as a URL"]),
        ("postgresql://u:secret@db.example:fivefourthree/app", ["port", "not a number"]),
        ("mysql://u:secret@db.example/app", ["'mysql'", "PostgreSQL or SQLite", "u:***@"]),
        ("postgresql+nosuch://u:secret@db.example/app", ["'postgresql+nosuch'", "driver"]),
    ],
)
def test_a_malformed_url_says_what_is_wrong_and_never_shows_the_password(
    given: str, words: list[str]
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        database_url(given)
    message = str(caught.value)
    assert [w for w in words if w not in message] == []
    assert "secret" not in message


def test_a_malformed_url_from_the_environment_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATLEDGER_DATABASE_URL", "not a url")
    with pytest.raises(InvalidInputError, match=r"URL \(from CHATLEDGER_DATABASE_URL\) cannot"):
        Store.open()


def test_both_faces_refuse_a_malformed_url_as_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="cannot be read as a URL"):
        Store.open("nonsense")
    with pytest.raises(InvalidInputError, match="cannot be read as a URL"):
        AsyncStore.open("nonsense")
