"""chatledger on a Citus cluster: where a tenant's rows are, and what reads one shard.

Runs against the cluster `CHATLEDGER_TEST_CITUS_URL` names (a coordinator's
database with the citus extension and its workers added: scripts/citus.sh),
in a schema of its own laid out by `migrate(citus=True)`. Citus is not
packaged for the machines CI runs on, so without the variable these tests are
skipped, with that reason. The conformance suite runs on the cluster with the
same variable set (tests/conftest.py, docs/scaling.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.store import Ledger, NewEvent, Store
from chatledger.store._sql.citus import COLOCATED
from tests.conftest import citus_schema, citus_url
from tests.helpers import assistant, user

pytestmark = pytest.mark.skipif(
    citus_url() is None,
    reason="needs a Citus cluster: set CHATLEDGER_TEST_CITUS_URL (scripts/citus.sh starts one)",
)

KEK = bytes(range(64, 96))

# Each table's shard for a tenant, and the worker that holds it.
_PLACEMENT = """
SELECT s.logicalrelid::regclass::text, s.shardid, n.nodename, n.nodeport
FROM pg_dist_shard s
JOIN pg_dist_placement p ON p.shardid = s.shardid
JOIN pg_dist_node n ON n.groupid = p.groupid
WHERE s.shardid = get_shard_id_for_distribution_column(s.logicalrelid, %(tenant)s::text)
  AND s.logicalrelid = ANY(%(tables)s::regclass[])
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The URL of a schema of this module's own on the cluster, laid out by tenant."""
    yield from citus_schema()


def _libpq(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _schema(url: str) -> str:
    options = str(sa.make_url(url).query["options"])
    return options.removeprefix("-csearch_path=")


def _one_shard_only(url: str) -> str:
    """`url` with Citus told to refuse any statement that reads or writes more than
    one shard: an operation that runs whole there is a query of one shard."""
    options = str(sa.make_url(url).query["options"])
    return (
        sa.make_url(url)
        .update_query_dict({"options": f"{options} -ccitus.multi_task_query_log_level=error"})
        .render_as_string(hide_password=False)
    )


def _written(ledger: Ledger) -> tuple[str, str, str, str]:
    """A conversation with a run, a fork of it and a fork of the fork; their ids and
    the run's."""
    conv = ledger.create_conversation(key="thread-1")
    ledger.append_messages(conv.id, [user("hello")])
    cursor = ledger.runs.start(conv.id, owner="w", events=[NewEvent.of_message(user("q"))])
    _, cursor = ledger.runs.record(cursor, [NewEvent.of_message(assistant("a"))])
    ledger.runs.complete(cursor)
    fork = ledger.fork(conv.id, at=2)
    ledger.append_messages(fork.id, [user("on the fork")])
    deeper = ledger.fork(fork.id)
    return conv.id, fork.id, deeper.id, cursor.run_id


def test_a_conversation_its_forks_and_its_runs_are_on_one_shard_of_one_worker(
    cluster: str,
) -> None:
    with Store.open(cluster) as store:
        tenant = f"placed-{uuid.uuid4().hex[:8]}"
        conv, fork, deeper, run = _written(store.tenant(tenant))
    schema = _schema(cluster)
    tables = [f"{schema}.{t}" for t in COLOCATED]
    with psycopg.connect(_libpq(citus_url() or ""), autocommit=True) as coordinator:
        placed = coordinator.execute(_PLACEMENT, {"tenant": tenant, "tables": tables}).fetchall()
        workers = coordinator.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE shouldhaveshards AND isactive"
        ).fetchall()
    assert sorted(t for t, *_ in placed) == sorted(tables)
    (node,) = {(host, port) for _, _, host, port in placed}
    assert len(workers) >= 2 and node in workers
    shard = {table.split(".")[1]: shardid for table, shardid, _, _ in placed}
    ids = [conv, fork, deeper]
    counted = {
        "chatledger_conversations": "id = ANY(%(ids)s::uuid[])",
        "chatledger_events": "conversation_id = ANY(%(ids)s::uuid[])",
        "chatledger_branches": "conversation_id = ANY(%(ids)s::uuid[])",
        "chatledger_view_entries": "conversation_id = ANY(%(ids)s::uuid[])",
        "chatledger_runs": "id = %(run)s::uuid",
    }
    with psycopg.connect(_libpq(citus_url() or ""), autocommit=True) as coordinator:
        coordinator.execute(f"SET search_path = {schema}")
        through_the_coordinator = {
            table: coordinator.execute(
                f"SELECT count(*) FROM {table} WHERE {where}", {"ids": ids, "run": run}
            ).fetchone()
            for table, where in counted.items()
        }
    # Every row of the three conversations and the run is in the tenant's shards,
    # read on their worker directly; the other workers hold none of them.
    host, port = node
    worker_url = sa.make_url(citus_url() or "").set(host=host, port=port)
    with psycopg.connect(_libpq(worker_url.render_as_string(hide_password=False))) as worker:
        on_the_worker = {
            table: worker.execute(
                f"SELECT count(*) FROM {schema}.{table}_{shard[table]} WHERE {where}",
                {"ids": ids, "run": run},
            ).fetchone()
            for table, where in counted.items()
        }
    assert on_the_worker == through_the_coordinator
    assert through_the_coordinator["chatledger_conversations"] == (3,)
    assert through_the_coordinator["chatledger_runs"] == (1,)


def test_a_fork_on_the_cluster_copies_nothing(cluster: str) -> None:
    with Store.open(cluster) as store:
        ledger = store.tenant(f"forks-{uuid.uuid4().hex[:8]}")
        conv, fork, deeper, _ = _written(ledger)
        source = [m.content for m in ledger.history(conv)]
        with store.engine.connect() as conn:
            own_messages = conn.execute(
                sa.text(
                    "SELECT conversation_id::text, count(*) FROM chatledger_events "
                    "WHERE tenant = :t AND kind = 'message.recorded' GROUP BY 1"
                ),
                {"t": ledger.tenant},
            ).all()
            shared = conn.execute(
                sa.text(
                    "SELECT count(*) FROM chatledger_view_entries "
                    "WHERE tenant = :t AND conversation_id = :f AND event_conversation_id = :c"
                ),
                {"t": ledger.tenant, "f": fork, "c": conv},
            ).scalar_one()
        # Forked at position 2: the conversation's first message.
        assert [m.content for m in ledger.history(fork)] == [source[0], "on the fork"]
        assert [m.content for m in ledger.history(deeper)] == [source[0], "on the fork"]
        # The fork's log holds its one own message; the deeper fork's none.
        assert dict(own_messages) == {conv: len(source), fork: 1}
        assert shared == 1  # the fork's view points at its source's event
        assert ledger.verify(fork).ok and ledger.verify(deeper).ok


def test_a_tenants_hot_operations_each_read_and_write_one_shard(cluster: str) -> None:
    # Citus refuses, with an error, any statement of these connections that would
    # run on more than one shard.
    with Store.open(_one_shard_only(cluster), kek=KEK) as store:
        ledger = store.tenant(f"hot-{uuid.uuid4().hex[:8]}")
        conv, fork, _, run = _written(ledger)
        created = ledger.append_messages(ledger.create_conversation().id, [user("x")])
        first = ledger.append_messages(
            str(uuid.uuid4()), [user("first")], create=True, idempotency_key="k1"
        )
        ledger.append_messages(first.conversation_id, [user("again")], ids=[str(uuid.uuid4())])
        assert ledger.history(conv) and ledger.history(conv, at=2)
        assert ledger.entries(conv, last=1) and ledger.entries(fork)
        assert ledger.conversation_by_key("thread-1").id == conv
        assert ledger.runs.get(run).status == "completed"
        assert ledger.runs.recent(conversation_id=conv)
        cursor = ledger.runs.start(created.conversation_id, owner="w")
        ledger.runs.renew_lease(cursor)
        ledger.runs.fail(cursor, stage="model", error="down")
        assert ledger.audit.events(conversation_id=conv).items
        assert ledger.audit.run_timeline(run)
        assert ledger.events(conversation_id=conv)
        assert ledger.verify(conv).ok and ledger.verify(fork).ok
        sealed = ledger.create_conversation(subject="person-1")
        ledger.append_messages(sealed.id, [user("private")])
        assert ledger.erase("person-1", reason="asked").conversation_ids == [sealed.id]


def test_a_resume_worker_claims_stale_runs_of_every_tenant_on_the_cluster(cluster: str) -> None:
    with Store.open(cluster) as store:
        ledgers = [store.tenant(f"stale-{uuid.uuid4().hex[:8]}") for _ in range(2)]
        started = {}
        for ledger in ledgers:
            conv = ledger.create_conversation()
            started[ledger.tenant] = ledger.runs.start(conv.id, owner="crashed")
        with store.engine.begin() as conn:  # their leases run out
            conn.execute(
                sa.text(
                    "UPDATE chatledger_runs SET lease_expires_at = now() - interval '1 minute' "
                    "WHERE tenant = ANY(:tenants)"
                ),
                {"tenants": list(started)},
            )
        claimed = store.claim_stale_runs(owner="worker", limit=100)
        mine = {run.tenant: cursor for run, cursor in claimed if run.tenant in started}
        assert sorted(mine) == sorted(started)
        for ledger in ledgers:
            cursor = mine[ledger.tenant]
            assert cursor.run_id == started[ledger.tenant].run_id and cursor.owner == "worker"
            ledger.runs.complete(cursor)
            assert ledger.runs.get(cursor.run_id).status == "completed"
        assert [r for r, _ in store.claim_stale_runs(owner="w2") if r.tenant in started] == []
