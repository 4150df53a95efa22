"""Read replicas on a real streaming standby (docs/adr/0023-read-replicas.md).

The module's `cluster` fixture builds, on this machine, a Postgres primary of
its own (`initdb` in a temporary directory, on a free port, `wal_level =
replica`) and a streaming replica of it (`pg_basebackup -R`, on another
port), and tears both down at the end; the test server's configuration is
never touched. Postgres refuses to run as root, so as root the binaries run
as the `postgres` user. The binaries are those of `$CHATLEDGER_TEST_PG_BIN`,
else the newest under /usr/lib/postgresql; without them the tests are
skipped, except under `CI=true`, where the fixture fails.

The replica's replay is paused (`pg_wal_replay_pause()`) to make it lag on
purpose: what must see its own writes sees them (it ran on the primary), and
what tolerates staleness does not yet (it ran on the replica).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.store import (
    AsyncStore,
    Event,
    InvalidInputError,
    Message,
    NewEvent,
    Page,
    Store,
    Verification,
)
from chatledger.store._crypto import ERASED_CONTENT


def _pg_bin() -> Path:
    """Postgres's binaries: `$CHATLEDGER_TEST_PG_BIN`, else Debian's newest, else `initdb`'s."""
    if "CHATLEDGER_TEST_PG_BIN" in os.environ:
        return Path(os.environ["CHATLEDGER_TEST_PG_BIN"])
    debian = [p for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.parts[-3].isdigit()]
    if debian:
        return max(debian, key=lambda p: int(p.parts[-3])).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()
CATCH_UP_SECONDS = 30.0


@dataclass(frozen=True)
class Cluster:
    """A primary and its streaming replica: SQLAlchemy URLs of each."""

    primary: str
    replica: str

    def catch_up(self) -> None:
        """Wait until the replica has replayed everything the primary has written so far."""
        with psycopg.connect(_libpq(self.primary), autocommit=True) as conn:
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        _poll(
            self.replica,
            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
            (lsn,),
            f"the replica to replay up to {lsn}",
        )

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The replica's replay paused: it answers, as of the moment it paused."""
        self.catch_up()
        with psycopg.connect(_libpq(self.replica), autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
        try:
            _poll(
                self.replica,
                "SELECT pg_get_wal_replay_pause_state() = 'paused'",
                (),
                "the replica's replay to pause",
            )
            yield
        finally:
            with psycopg.connect(_libpq(self.replica), autocommit=True) as conn:
                conn.execute("SELECT pg_wal_replay_resume()")
        self.catch_up()


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _poll(url: str, query: str, params: tuple[object, ...], what: str) -> None:
    """Ask `query` until it says true, within `CATCH_UP_SECONDS`."""
    deadline = time.monotonic() + CATCH_UP_SECONDS
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        while not conn.execute(query, params).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, f"waited {CATCH_UP_SECONDS}s for {what}"
            time.sleep(0.01)


# -- the cluster ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Builder:
    """Runs Postgres's own binaries, as `postgres` when we are root, in one directory."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chatledger-replicas-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.started: list[Path] = []

    def run(self, *args: str) -> None:
        done = subprocess.run(
            [*self.as_user, str(PG_BIN / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip() or done.stdout}")

    def configure(self, data: Path, settings: str) -> None:
        # Appended as ourselves: as root we may write the `postgres` user's files.
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(settings)

    def start(self, data: Path) -> None:
        self.run("pg_ctl", "-D", str(data), "-l", f"{data}.log", "-w", "-t", "60", "start")
        self.started.append(data)

    def log_tail(self) -> str:
        tails = []
        for log in sorted(self.root.glob("*.log")):
            tails.append(f"{log.name}: {log.read_text()[-1500:]}")
        return "\n".join(tails)

    def tear_down(self) -> None:
        for data in reversed(self.started):
            with contextlib.suppress(Exception):
                self.run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def build(self) -> Cluster:
        primary, replica = self.root / "primary", self.root / "replica"
        primary_port, replica_port = _free_port(), _free_port()
        self.run("initdb", "-D", str(primary), "-U", "postgres", "-A", "trust", "--no-sync")
        self.configure(
            primary,
            f"\nport = {primary_port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.root}'\nwal_level = replica\n"
            f"max_wal_senders = 4\nfsync = off\n",
        )
        with (primary / "pg_hba.conf").open("a") as hba:
            hba.write("\nhost replication all 127.0.0.1/32 trust\n")
        self.start(primary)
        self.run(
            "pg_basebackup", "-R", "-D", str(replica), "-h", "127.0.0.1",
            "-p", str(primary_port), "-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        self.configure(replica, f"\nport = {replica_port}\n")  # the last setting wins
        self.start(replica)
        url = "postgresql+psycopg://postgres@127.0.0.1:{}/postgres"
        return Cluster(url.format(primary_port), url.format(replica_port))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A migrated primary and its streaming replica, caught up."""
    builder = _Builder()
    started = time.monotonic()
    try:
        built = builder.build()
        with Store.open(built.primary) as store:
            store.migrate()
        built.catch_up()
    except BaseException as error:
        logs = builder.log_tail()
        builder.tear_down()  # whatever failed: no cluster is left running
        if not isinstance(error, OSError | RuntimeError | subprocess.SubprocessError | KeyError):
            raise
        message = f"Cannot build a streaming replica with {PG_BIN}: {error}\n{logs}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: the replica tests must run)")
        pytest.skip(message)
    logging.getLogger(__name__).info("replica built in %.1fs", time.monotonic() - started)
    try:
        yield built
    finally:
        builder.tear_down()


@pytest.fixture
def store(cluster: Cluster) -> Iterator[Store]:
    with Store.open(cluster.primary, replicas=[cluster.replica]) as opened:
        yield opened


def tenant() -> str:
    return f"tenant-{uuid.uuid4().hex[:8]}"


def said(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


# -- read-your-writes: on the primary --------------------------------------------------


def test_head_reads_see_an_append_the_replica_has_not_replayed(
    cluster: Cluster, store: Store
) -> None:
    ledger = store.tenant(tenant())
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, said("first"))
    with cluster.paused():
        appended = ledger.append_messages(conv.id, said("second"))
        assert [m.content for m in ledger.history(conv.id)] == ["first", "second"]
        assert ledger.conversation(conv.id).head == appended.head
        assert [e.message.content for e in ledger.entries(conv.id)] == ["first", "second"]
        assert ledger.events(conversation_id=conv.id)[-1].seq == appended.events[-1].seq


def test_runs_and_leases_see_their_own_writes_while_the_replica_lags(
    cluster: Cluster, store: Store
) -> None:
    ledger = store.tenant(tenant())
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, said("question"))
    with cluster.paused():
        cursor = ledger.runs.start(conv.id, owner="worker")
        assert ledger.runs.get(cursor.run_id).status == "running"
        assert [r.id for r in ledger.runs.recent(conversation_id=conv.id)] == [cursor.run_id]
        leased = ledger.runs.get(cursor.run_id).lease_expires_at
        ledger.runs.renew_lease(cursor, 600)
        renewed = ledger.runs.get(cursor.run_id).lease_expires_at
        assert leased is not None and renewed is not None and renewed > leased
        _, cursor = ledger.runs.record(cursor, [NewEvent.of_message(Message(role="assistant"))])
        done = ledger.runs.complete(cursor)
        assert ledger.runs.get(cursor.run_id).status == "completed"
        assert ledger.conversation(conv.id).head == done.head


def test_a_read_at_a_position_the_replica_lacks_is_answered_by_the_primary(
    cluster: Cluster, store: Store
) -> None:
    ledger = store.tenant(tenant())
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, said("first"))
    with cluster.paused():
        appended = ledger.append_messages(conv.id, said("second"))
        at = appended.head
        assert [m.content for m in ledger.history(conv.id, at=at)] == ["first", "second"]
        assert [e.message.content for e in ledger.entries(conv.id, at=at)] == ["first", "second"]
        # A conversation the replica has not seen at all, likewise.
        new = ledger.append_messages(str(uuid.uuid4()), said("hello"), create=True)
        assert [m.content for m in ledger.history(new.conversation_id, at=new.head)] == ["hello"]
        assert ledger.audit.lineage(new.conversation_id).conversation.head == new.head


# -- stale-tolerant reads: on the replica ------------------------------------------------


def test_stale_tolerant_reads_run_on_the_replica(cluster: Cluster, store: Store) -> None:
    ledger = store.tenant(tenant())
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, said("first"))
    with cluster.paused():
        appended = ledger.append_messages(conv.id, said("second"))
        now = datetime.now(UTC)
        seen = ledger.audit.events(conversation_id=conv.id).items
        assert appended.events[-1].id not in [e.id for e in seen]
        assert [m.content for m in ledger.history(conv.id, at=now)] == ["first"]
        assert [e.message.content for e in ledger.entries(conv.id, at=2)] == ["first"]
        assert ledger.verify(conv.id).checked == len(seen)
        assert sum(v.checked for v in ledger.verify_all()) == len(seen)
    # Replayed: the replica answers with the append.
    seen = ledger.audit.events(conversation_id=conv.id).items
    assert seen[-1].id == appended.events[-1].id
    assert [m.content for m in ledger.history(conv.id, at=now)] == ["first", "second"]
    assert ledger.verify(conv.id).checked == len(seen)


def test_an_erasure_shows_in_reads_the_replica_answers_before_it_replays_it(
    cluster: Cluster,
) -> None:
    kek = os.urandom(32)
    with Store.open(cluster.primary, replicas=[cluster.replica], kek=kek) as sealed:
        ledger = sealed.tenant(tenant())
        conv = ledger.create_conversation()
        appended = ledger.append_messages(conv.id, said("secret"))
        cluster.catch_up()
        at = appended.head
        assert [m.content for m in ledger.history(conv.id, at=at)] == ["secret"]
        with cluster.paused():
            ledger.erase(conv.id, reason="request")
            # The replica still holds the subject's key; its rows are opened with
            # the keys the primary has, and there the key is gone.
            for read in (
                [m.content for m in ledger.history(conv.id, at=at)],
                [m.content for m in ledger.history(conv.id, at=at, repaired=False)],
                [e.message.content for e in ledger.entries(conv.id, at=at)],
                [e.message.content for e in ledger.entries(conv.id, at=2)],
            ):
                assert read == [ERASED_CONTENT]
            with Store.open(cluster.replica, kek=kek) as replica:
                # (the replica has not replayed the erasure: read directly, it opens)
                direct = replica.tenant(ledger.tenant).history(conv.id)
                assert [m.content for m in direct] == ["secret"]


def test_store_verify_checks_the_log_as_the_replica_has_it(cluster: Cluster, store: Store) -> None:
    def checked(found: list[Verification]) -> int:
        return sum(v.checked for v in found)

    ledger = store.tenant(tenant())
    conv = ledger.create_conversation()
    with cluster.paused():
        ledger.append_messages(conv.id, said("hi"))
        routed = checked(store.verify())
        with Store.open(cluster.replica) as standby:
            assert checked(standby.verify()) == routed
        with Store.open(cluster.primary) as primary:
            assert checked(primary.verify()) == routed + 1


def test_a_replica_holds_back_events_committed_behind_a_transaction_open_on_the_primary(
    cluster: Cluster, store: Store
) -> None:
    # The standby shares the primary's transaction ids and counts the open
    # one as running, though it wrote nothing: audit pages keep commit order
    # there too (docs/adr/0005-audit-pagination.md). Read on the standby alone.
    ledger = store.tenant(tenant())
    conv = ledger.create_conversation()
    with Store.open(cluster.replica) as standby:

        def page() -> Page[Event]:
            audit = standby.tenant(ledger.tenant).audit
            return audit.events(conversation_id=conv.id, kinds="message.recorded")

        with store.engine.connect() as open_transaction:
            open_transaction.begin()
            open_transaction.execute(sa.text("SELECT pg_current_xact_id()"))
            ledger.append_messages(conv.id, said("committed"))
            cluster.catch_up()
            assert page().pending and page().items == []
            open_transaction.rollback()
        # An abort is not flushed at once (the WAL writer flushes it soon
        # after); the standby holds the event back until it replays it.
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while (found := page()).pending:
            assert time.monotonic() < deadline, "the standby never replayed the rollback"
            time.sleep(0.01)
        assert [e.message.content for e in found.items if e.message] == ["committed"]


def test_the_primary_answers_stale_tolerant_reads_without_replicas(cluster: Cluster) -> None:
    with Store.open(cluster.primary) as store:
        ledger = store.tenant(tenant())
        conv = ledger.create_conversation()
        with cluster.paused():
            appended = ledger.append_messages(conv.id, said("hi"))
            seen = ledger.audit.events(conversation_id=conv.id).items
            assert seen[-1].id == appended.events[-1].id


# -- the async store ---------------------------------------------------------------------


async def test_the_async_store_routes_as_the_sync_store_does(cluster: Cluster) -> None:
    async with AsyncStore.open(cluster.primary, replicas=[cluster.replica]) as store:
        ledger = store.tenant(tenant())
        conv = await ledger.create_conversation()
        await ledger.append_messages(conv.id, said("first"))
        with cluster.paused():
            appended = await ledger.append_messages(conv.id, said("second"))
            # Its own writes, from the primary.
            history = await ledger.history(conv.id)
            assert [m.content for m in history] == ["first", "second"]
            assert (await ledger.conversation(conv.id)).head == appended.head
            at = await ledger.history(conv.id, at=appended.head)
            assert [m.content for m in at] == ["first", "second"]
            cursor = await ledger.runs.start(conv.id, owner="worker")
            assert (await ledger.runs.get(cursor.run_id)).status == "running"
            await ledger.runs.renew_lease(cursor, 120)
            # The rest, from the replica.
            seen = (await ledger.audit.events(conversation_id=conv.id)).items
            assert appended.events[-1].id not in [e.id for e in seen]
            assert (await ledger.verify(conv.id)).checked == len(seen)
        seen = (await ledger.audit.events(conversation_id=conv.id)).items
        assert cursor.run_id in {e.run_id for e in seen}


# -- a replica that does not answer -----------------------------------------------------


def _closed_port_url() -> str:
    return f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres"


def test_an_unreachable_replica_leaves_the_reads_to_the_primary(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _closed_port_url()
    with Store.open(cluster.primary, replicas=[dead]) as store:
        ledger = store.tenant(tenant())
        conv = ledger.create_conversation()
        appended = ledger.append_messages(conv.id, said("hi"))
        with caplog.at_level(logging.WARNING, logger="chatledger.store"):
            for _ in range(3):
                seen = ledger.audit.events(conversation_id=conv.id).items
                assert seen[-1].id == appended.events[-1].id
        assert [m.content for m in ledger.history(conv.id, at=appended.head)] == ["hi"]
        assert ledger.verify(conv.id).ok
    # Said once, not on every read while the replica stays down; no password shown.
    assert len(caplog.records) == 1
    assert "failed, so the primary answered" in caplog.records[0].getMessage()


async def test_an_async_driver_in_a_replica_url_is_read_with_the_sync_driver(
    cluster: Cluster,
) -> None:
    replica = cluster.replica.replace("+psycopg:", "+psycopg_async:")
    async with AsyncStore.open(cluster.primary, replicas=[replica]) as store:
        ledger = store.tenant(tenant())
        conv = await ledger.create_conversation()
        with cluster.paused():
            await ledger.append_messages(conv.id, said("hi"))
            seen = (await ledger.audit.events(conversation_id=conv.id)).items
            assert [e.kind for e in seen] == ["conversation.created"]
            assert [m.content for m in await ledger.history(conv.id)] == ["hi"]


async def test_an_unreachable_replica_leaves_the_async_reads_to_the_primary(
    cluster: Cluster,
) -> None:
    async with AsyncStore.open(cluster.primary, replicas=[_closed_port_url()]) as store:
        ledger = store.tenant(tenant())
        conv = await ledger.create_conversation()
        appended = await ledger.append_messages(conv.id, said("hi"))
        seen = (await ledger.audit.events(conversation_id=conv.id)).items
        assert seen[-1].id == appended.events[-1].id


def test_a_failed_replica_is_skipped_and_the_others_take_its_turns(cluster: Cluster) -> None:
    with Store.open(cluster.primary, replicas=[_closed_port_url(), cluster.replica]) as store:
        ledger = store.tenant(tenant())
        conv = ledger.create_conversation()
        with cluster.paused():
            appended = ledger.append_messages(conv.id, said("hi"))

            def fresh() -> bool:
                seen = ledger.audit.events(conversation_id=conv.id).items
                return appended.events[-1].id in [e.id for e in seen]

            # The first turn is the dead replica's: the primary answers, fresh.
            # Then the live replica answers every read, stale: the dead one is skipped.
            assert [fresh() for _ in range(4)] == [True, False, False, False]


def test_close_releases_the_replica_connections(cluster: Cluster) -> None:
    name = f"chatledger-{uuid.uuid4().hex[:8]}"
    replica = f"{cluster.replica}?application_name={name}"

    def connected() -> int:
        with psycopg.connect(_libpq(cluster.replica), autocommit=True) as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            return int(conn.execute(query, (name,)).fetchone()[0])  # type: ignore[index]

    with Store.open(cluster.primary, replicas=[replica]) as store:
        store.tenant(tenant()).audit.events()
        assert connected() == 1
    deadline = time.monotonic() + CATCH_UP_SECONDS  # a closed session's backend exits soon after
    while connected():
        assert time.monotonic() < deadline, "the replica connection outlived close()"
        time.sleep(0.01)


# -- bad input -------------------------------------------------------------------------------


def test_a_sqlite_store_refuses_replicas(tmp_path: Path, cluster: Cluster) -> None:
    with pytest.raises(InvalidInputError, match="Read replicas are for a store on Postgres"):
        Store.open(f"sqlite:///{tmp_path / 'a.db'}", replicas=[cluster.replica])
    with pytest.raises(InvalidInputError, match="Read replicas are for a store on Postgres"):
        AsyncStore.open(f"sqlite:///{tmp_path / 'a.db'}", replicas=[cluster.replica])


@pytest.mark.parametrize(
    ("replica", "says"),
    [
        ("sqlite:///replica.db", "is a 'sqlite' URL"),
        ("mysql://u@host/db", "is a 'mysql' URL"),
        ("", "a replica is a URL"),
        ("postgresql://u@host:port/db", "Read replica 1 of 1: The port"),
    ],
)
def test_a_replica_that_is_not_a_postgres_url_is_refused(
    cluster: Cluster, replica: str, says: str
) -> None:
    with pytest.raises(InvalidInputError, match=says):
        Store.open(cluster.primary, replicas=[replica])
    with pytest.raises(InvalidInputError, match=says):
        AsyncStore.open(cluster.primary, replicas=[replica])


def test_replicas_take_a_list_not_one_url(cluster: Cluster) -> None:
    with pytest.raises(InvalidInputError, match=r"write replicas=\[url\]"):
        Store.open(cluster.primary, replicas=cluster.replica)


def test_the_ask_service_on_a_primary_and_its_replica(cluster: Cluster) -> None:
    """`create_app(url, replicas=)`: an answer, then the head read over HTTP, see the
    run's writes while the replica replays nothing."""
    import httpx

    from chatledger.service import ApiKeys, create_app
    from tests.service.agents import weather_agent
    from tests.service.conftest import Server

    keys = ApiKeys.of({"replica-key": tenant()})
    app = create_app(weather_agent(), cluster.primary, keys=keys, replicas=[cluster.replica])
    with (
        Server(app) as server,
        httpx.Client(
            base_url=server.url, headers={"Authorization": "Bearer replica-key"}, timeout=60
        ) as client,
    ):
        first = client.post("/v1/ask", json={"question": "Weather?"}).json()
        conversation = first["conversationId"]
        with cluster.paused():
            second = client.post(
                "/v1/ask", json={"question": "Again?", "conversation_id": conversation}
            )
            assert second.status_code == 200, second.text
            head = client.get(f"/v1/conversations/{conversation}/messages").json()
            assert head["messages"][-1]["content"] == second.json()["answer"]
            timeline = client.get(f"/v1/runs/{second.json()['runId']}").json()
            assert timeline["run"]["status"] == "completed"


def test_replicas_go_with_a_url_not_an_open_store(tmp_path: Path) -> None:
    from chatledger.engine import Agent
    from chatledger.engine.providers.scripted import ScriptedModel
    from chatledger.service import ApiKeys, create_app
    from chatledger.store import AsyncStore

    store = AsyncStore.open(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(InvalidInputError, match="replicas= goes with a database URL"):
        create_app(
            Agent(ScriptedModel([])), store, keys=ApiKeys.of({}), replicas=["postgresql://x/y"]
        )
