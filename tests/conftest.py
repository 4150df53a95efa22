"""Shared fixtures: a `store` on every backend, each schema made by the migrations.

The `backend` fixture is parametrized over SQLite (a fresh file per test)
and Postgres (a throwaway database per test session at
`CHATLEDGER_TEST_POSTGRES_URL`), so every test that takes it, or
`database_url`, runs once per backend. Without a reachable Postgres the
Postgres half is skipped, except under `CI=true`, where it fails loudly.

A test that takes `store` (or `ledger`) runs twice more, on each backend with
the store's fast paths off (ids `sqlite-general`, `postgres-general`): the
hot operations' plain-SQL forms and their general path must give the same
results. The conformance suite (tests/conformance/) runs twice more again,
its `ledger` an `AsyncLedger` on each backend (ids `sqlite-async`,
`postgres-async`), called as a `Ledger` is: both faces keep every behaviour.
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.store import Ledger, Store

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ["sqlite", "postgres"]
# (backend, fast_paths) for a test of the store; the default runs keep the bare backend id.
STORE_VARIANTS = [
    *[pytest.param(b, True, id=b) for b in BACKENDS],
    *[pytest.param(b, False, id=f"{b}-general") for b in BACKENDS],
]
# (backend, fast_paths, face) for the conformance suite (tests/conformance/): every
# store variant on the sync face, and the async face with the store as shipped (the
# general path is the same code under both faces).
FACE_VARIANTS = [
    *[pytest.param(*p.values, "sync", id=p.id) for p in STORE_VARIANTS],
    *[pytest.param(b, True, "async", id=f"{b}-async") for b in BACKENDS],
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fast_paths_only: a test of the fast paths themselves; no `*-general` runs",
    )
    if not hasattr(config, "workerinput"):  # once, in the session's first process
        compile_the_project()


def compile_the_project() -> None:
    """Byte-compile chatledger's folders and the tests, where they are stale.

    Where `PYTHONDONTWRITEBYTECODE` is set (the development machines set it), no
    process writes `.pyc` files, so every `chatledger` command and child process
    the suite starts would compile each of the project's modules from source again
    (0.1 s to 0.15 s of a command's 0.6 s here). `compileall` writes them all the
    same, and every process reads them.
    """
    root = Path(__file__).resolve().parent.parent
    for folder in ("chatledger", "adapters", "engine", "migrations", "service", "store", "tests"):
        compileall.compile_dir(root / folder, quiet=1)


@pytest.hookimpl(tryfirst=True)  # before fixture params (`recompute`...): the backend id leads
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `backend`, and with it `fast_paths` where the test takes a store.

    Done here rather than with fixture `params` because only the tests of a
    store get the general-path runs: a test that opens its own store from
    `database_url` runs once per backend, and so does a test marked
    `fast_paths_only` (one that checks the fast paths themselves). A test that
    parametrizes `backend` or `fast_paths` itself keeps its own values (and
    the fast paths default to on).
    """
    marked = _parametrized_by_marks(metafunc)
    if "backend" not in metafunc.fixturenames or "backend" in marked:
        return
    # The store's conformance suite is tests/store/ (and the tests at the top
    # of tests/ that take a store); the engine's and the providers' tests
    # (tests/agent, tests/providers) use a store but test the run loop, so
    # they run with the store as shipped.
    engine_test = metafunc.definition.path.parent.name in ("agent", "providers")
    general_runs = (
        metafunc.definition.get_closest_marker("fast_paths_only") is None and not engine_test
    )
    if "face" in metafunc.fixturenames and "fast_paths" not in marked and general_runs:
        metafunc.parametrize(("backend", "fast_paths", "face"), FACE_VARIANTS, indirect=True)
    elif "fast_paths" in metafunc.fixturenames and "fast_paths" not in marked and general_runs:
        metafunc.parametrize(("backend", "fast_paths"), STORE_VARIANTS, indirect=True)
    else:
        metafunc.parametrize("backend", BACKENDS, indirect=True)


def _parametrized_by_marks(metafunc: pytest.Metafunc) -> set[str]:
    names: set[str] = set()
    for mark in metafunc.definition.iter_markers("parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = argnames.split(",")
        names.update(name.strip() for name in argnames)
    return names


def postgres_admin_url() -> str:
    return os.environ.get("CHATLEDGER_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def _libpq(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_postgres_database(prefix: str = "chatledger_test", template: str | None = None) -> str:
    """Create a throwaway database (a copy of the database `template`, if named);
    return its SQLAlchemy URL."""
    admin = postgres_admin_url()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = "" if template is None else f' TEMPLATE "{template}"'
    try:
        with psycopg.connect(_libpq(admin), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy}')
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


def partitions_under_test() -> int | None:
    """`CHATLEDGER_TEST_PARTITIONS=N`: the session's Postgres database is hash-partitioned."""
    value = os.environ.get("CHATLEDGER_TEST_PARTITIONS")
    return int(value) if value else None


def citus_url() -> str | None:
    """`CHATLEDGER_TEST_CITUS_URL`: a Citus coordinator's database (scripts/citus.sh)."""
    return os.environ.get("CHATLEDGER_TEST_CITUS_URL") or None


def citus_schema() -> Iterator[str]:
    """A schema of its own in the Citus database, laid out by `migrate(citus=True)`,
    as a URL whose connections find it first; dropped, with every shard, after.

    A schema, not a database: a database made on the coordinator has no workers.
    """
    url = citus_url()
    assert url is not None
    schema = f"chatledger_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(_libpq(url), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError as error:
        pytest.fail(f"The Citus cluster at {url} is unreachable: {error}")
    own = (
        sa.make_url(url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    with Store.open(own) as store:
        store.migrate(citus=True)
    yield own
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated throwaway Postgres database for this test session.

    Its events and head-view tables are hash-partitioned into N partitions
    when `CHATLEDGER_TEST_PARTITIONS=N` is set (docs/scaling.md).
    """
    if citus_url() is not None:
        yield from citus_schema()
        return
    url = create_postgres_database()
    with Store.open(url) as store:
        store.migrate(partitions=partitions_under_test())
    yield url
    drop_postgres_database(url)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The database of this run: `sqlite` or `postgres` (see `pytest_generate_tests`)."""
    return str(request.param)


@pytest.fixture
def fast_paths(request: pytest.FixtureRequest) -> bool:
    """Whether the `store` of this run tries its fast paths (see `pytest_generate_tests`)."""
    return bool(getattr(request, "param", True))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file the migrations made once per session; each test copies it.

    A copy costs well under a millisecond, a fresh Alembic upgrade about 0.15 s,
    and every schema a test sees is still the one the migrations made.
    """
    path = tmp_path_factory.mktemp("template") / "chatledger.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.migrate()
    assert not path.with_name(path.name + "-wal").exists()  # closed: one self-contained file
    return path


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """The name of a Postgres database the migrations made once per session.

    Partitioned as the session's database is (`partitions_under_test`). Nothing
    connects to it after the migration, so `CREATE DATABASE ... TEMPLATE` can
    copy it: a copy takes a fraction of the time a fresh upgrade does.
    """
    url = create_postgres_database("chatledger_template")
    with Store.open(url) as store:
        store.migrate(partitions=partitions_under_test())
    yield str(sa.make_url(url).database)
    drop_postgres_database(url)


def migrated_sqlite(template: Path, path: Path) -> str:
    """A copy of the migrated `template` at `path`, as a URL."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A migrated SQLite file of this test's own, whatever the backend of the run."""
    return migrated_sqlite(sqlite_template, tmp_path / "chatledger.db")


def fresh_database(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of its own on `backend`, copied from the session's
    template and dropped after the test; each call makes another."""
    if backend == "sqlite":
        template = request.getfixturevalue("sqlite_template")
        return migrated_sqlite(template, tmp_path / f"own-{uuid.uuid4().hex[:8]}.db")
    url = create_postgres_database("chatledger_own", request.getfixturevalue("postgres_template"))
    request.addfinalizer(lambda: drop_postgres_database(url))
    return url


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database URL on the current backend."""
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    template = request.getfixturevalue("sqlite_template")
    return migrated_sqlite(template, tmp_path / "chatledger.db")


@pytest.fixture
def empty_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database of its own on the current backend, without chatledger's tables."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    url = create_postgres_database("chatledger_empty")
    yield url
    drop_postgres_database(url)


@pytest.fixture
def own_database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A migrated database of this test's own on the current backend: its files
    hold nothing of other tests, and a whole-database pass sees only its rows."""
    return fresh_database(backend, request, tmp_path)


@pytest.fixture
def store(database_url: str, fast_paths: bool) -> Iterator[Store]:
    with Store.open(database_url, fast_paths=fast_paths) as opened:
        yield opened


@pytest.fixture
def ledger(store: Store) -> Ledger:
    """A handle on a tenant no other test uses."""
    return store.tenant(f"tenant-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def partitioned() -> Iterator[str]:
    """A migrated Postgres database whose log is hash-partitioned into 8."""
    url = create_postgres_database("chatledger_partitioned")
    with Store.open(url) as store:
        store.migrate(partitions=8)
    yield url
    drop_postgres_database(url)


def kill_when_paused(module: str, *args: str, at: str = "deleting") -> None:
    """Run `python -m module args...`, wait for its line `at` (it then blocks: by
    default `deleting`, inside a transaction), and SIGKILL it there; its stderr on
    any surprise."""
    child = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).resolve().parent.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == f"{at}\n", child.stderr.read() if child.stderr else line
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
