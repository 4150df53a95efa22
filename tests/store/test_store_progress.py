"""The store calls the command line needs (issue 35): progress hooks, a tenant's
rebuild, and claiming one stale run by id; on every backend."""

from __future__ import annotations

import uuid
from pathlib import Path

from chatledger.store import Ledger, Message, Store, Verification


def test_migrate_reports_each_revision_it_applies(empty_url: str) -> None:
    versions = Path(__file__).parents[2] / "migrations" / "versions"
    count = len(list(versions.glob("0*.py")))
    calls: list[tuple[int, int]] = []
    with Store.open(empty_url) as store:
        store.migrate(progress=lambda done, total: calls.append((done, total)))
        assert calls == [(n, count) for n in range(1, count + 1)]
        calls.clear()
        store.migrate(progress=lambda done, total: calls.append((done, total)))
    assert calls == []  # at the newest revision: nothing applied


def test_rebuild_of_a_tenant_rebuilds_only_its_views(store: Store) -> None:
    tenant, other = f"r-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"
    for name, count in ((tenant, 2), (other, 1)):
        for _ in range(count):
            ledger = store.tenant(name)
            conv = ledger.create_conversation().id
            ledger.append_messages(conv, [Message(role="user", content=name)])
    seen: list[tuple[int, int]] = []
    assert store.rebuild(lambda d, t: seen.append((d, t)), tenant=tenant) == 2
    assert seen == [(1, 2), (2, 2)]
    for name in (tenant, other):
        ledger = store.tenant(name)
        for conv in ledger.conversations():
            assert [m.content for m in ledger.history(conv.id)] == [name]


def test_verify_all_reports_each_conversation(ledger: Ledger) -> None:
    for _ in range(2):
        ledger.create_conversation()
    seen: list[Verification] = []
    results = ledger.verify_all(seen.append)
    assert seen == results and len(results) >= 2


def test_claiming_by_id_claims_that_stale_run_only(database_url: str) -> None:
    with Store.open(database_url) as store:
        ledger = store.tenant(f"c-{uuid.uuid4().hex[:8]}")
        wanted, other = (
            ledger.runs.start(ledger.create_conversation().id, owner="dead", lease_seconds=0)
            for _ in range(2)
        )
        claimed = ledger.runs.claim_stale(owner="me", run_id=wanted.run_id)
        assert [run.id for run, _ in claimed] == [wanted.run_id]
        assert ledger.runs.claim_stale(owner="me", run_id=wanted.run_id) == []  # leased now
        assert ledger.runs.get(other.run_id).lease_owner == "dead"
        stranger = store.tenant("someone-else")
        assert stranger.runs.claim_stale(owner="me", run_id=other.run_id) == []
