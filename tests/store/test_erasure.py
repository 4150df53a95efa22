"""Crypto-shredding: sealed content, `ledger.erase`, and what erasure guarantees.

Conformance tests, on both backends and both paths: a store opened with a
key-encryption key seals what people wrote, reads it back exactly, and after
`erase` shows erased markers everywhere while the log still verifies and
still finds tampering. docs/erasure.md is the contract these hold.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from chatledger.store import (
    ConflictError,
    Conversation,
    EncryptionError,
    ErasedError,
    Expected,
    InvalidInputError,
    Ledger,
    LocalKek,
    Message,
    NewConversation,
    NewEvent,
    NotFoundError,
    Store,
    ToolCall,
    new_id,
)
from chatledger.store._crypto import ERASED_CONTENT, SEALED_PREFIX
from tests.store.test_audit import drain
from tests.store.test_tail import settled
from tests.store.test_verify import triggers_off

KEK = bytes(range(32))


def _turn(marker: str) -> list[Message]:
    """A user prompt, a tool call, its result and an answer, each holding `marker`."""
    call = f"call-{uuid.uuid4().hex[:8]}"
    return [
        Message(role="user", content=f"user says {marker}"),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id=call, name="lookup", arguments={"q": marker})],
        ),
        Message(role="tool", tool_call_id=call, tool_name="lookup", content=f"found {marker}"),
        Message(role="assistant", content=f"answer {marker}"),
    ]


@pytest.fixture
def sealed_store(database_url: str, fast_paths: bool) -> Iterator[Store]:
    with Store.open(database_url, fast_paths=fast_paths, kek=KEK) as opened:
        yield opened


@pytest.fixture
def sealed(sealed_store: Store) -> Ledger:
    return sealed_store.tenant(f"tenant-{uuid.uuid4().hex[:8]}")


def _stored_payloads(store: Store, conversation_id: str) -> list[tuple[str, str]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT kind, payload FROM chatledger_events WHERE conversation_id = :c ORDER BY seq"
            ),
            {"c": conversation_id},
        ).all()
    return [(str(k), str(p)) for k, p in rows]


def _stored_column(store: Store, conversation_id: str, column: str) -> str:
    """A conversation row's column (`metadata`, `state`) as stored."""
    with store.engine.connect() as conn:
        return str(
            conn.execute(
                sa.text(f"SELECT {column} FROM chatledger_conversations WHERE id = :c"),
                {"c": conversation_id},
            ).scalar_one()
        )


def _stored_metadata(store: Store, conversation_id: str) -> str:
    return _stored_column(store, conversation_id, "metadata")


def _stored_state(store: Store, conversation_id: str) -> str:
    return _stored_column(store, conversation_id, "state")


# -- sealing ---------------------------------------------------------------------------


def test_sealed_content_reads_back_exactly_and_is_stored_only_as_ciphertext(
    sealed_store: Store, sealed: Ledger
) -> None:
    marker = f"m-{uuid.uuid4().hex}"
    conv = sealed.create_conversation({"user": marker})
    turn = _turn(marker)
    sealed.append_messages(conv.id, turn[:1])
    sealed.append_messages(conv.id, turn[1:])

    assert sealed.history(conv.id) == turn
    assert sealed.history(conv.id, repaired=False) == turn
    assert sealed.history(conv.id, at=3, repaired=False) == turn[:2]
    assert [e.message for e in sealed.entries(conv.id)] == turn
    assert sealed.conversation(conv.id).metadata == {"user": marker}
    assert sealed.conversation(conv.id).subject == conv.id
    messages = [e.message for e in sealed.events(conversation_id=conv.id)[1:]]
    assert messages == turn
    created = sealed.events(conversation_id=conv.id)[0]
    assert created.payload["metadata"] == {"user": marker}

    stored = _stored_payloads(sealed_store, conv.id)
    assert [k for k, _ in stored] == ["conversation.created", *["message.recorded"] * 4]
    assert all(p.startswith(SEALED_PREFIX) and marker not in p for _, p in stored)
    assert _stored_metadata(sealed_store, conv.id).startswith(SEALED_PREFIX)
    # What stays in the clear is the structure a history needs: roles, call ids, tool names.
    clear = [json.loads(p) for _, p in stored[1:]]
    assert [c["role"] for c in clear] == ["user", "assistant", "tool", "assistant"]
    assert clear[1]["toolCalls"] == [{"id": turn[1].tool_calls[0].id, "name": "lookup"}]
    assert clear[2]["toolName"] == "lookup"


def test_every_way_of_writing_content_seals_it(sealed_store: Store, sealed: Ledger) -> None:
    marker = f"m-{uuid.uuid4().hex}"
    cid = str(uuid.uuid4())
    created = sealed.append_messages(
        cid, [Message(role="user", content=marker)], create=NewConversation(metadata={"m": marker})
    )
    assert created.created
    cursor = sealed.runs.start(
        cid, owner="w", events=[NewEvent.of_message(Message(role="user", content=marker))]
    )
    _, cursor = sealed.runs.record(
        cursor, [NewEvent.of_message(Message(role="assistant", content=marker))]
    )
    sealed.runs.complete(cursor)
    fork = sealed.fork(cid, metadata={"m": marker})
    sealed.append_messages(fork.id, [Message(role="user", content=marker)])
    sealed.append_messages(
        cid, [Message(role="user", content=marker)], after=1, ids=[str(uuid.uuid4())]
    )

    for conversation_id in (cid, fork.id):
        for kind, payload in _stored_payloads(sealed_store, conversation_id):
            assert marker not in payload, kind
        assert marker not in _stored_metadata(sealed_store, conversation_id)
    assert sealed.conversation(fork.id).subject == cid  # a fork is its source's subject
    assert [m.content for m in sealed.history(fork.id)] == [marker] * 4


def test_a_sealed_conversations_state_is_sealed_compared_opened_and_erased(
    database_url: str, sealed_store: Store, sealed: Ledger
) -> None:
    marker = f"m-{uuid.uuid4().hex}"
    conv = sealed.create_conversation(subject="person-s")

    def sealed_at_rest(version: int) -> None:
        row = _stored_state(sealed_store, conv.id)
        assert row.startswith(SEALED_PREFIX) and marker not in row
        assert sealed.conversation(conv.id).state == {"v": version, "m": marker}

    # Every way a state is written: with messages, alone (at the head kept, and
    # at a head read by a second store), after a position, by a head move.
    sealed.append_messages(
        conv.id, [Message(role="user", content="hi")], state={"v": 1, "m": marker}
    )
    sealed_at_rest(1)
    sealed.append_messages(
        conv.id, [], state={"v": 2, "m": marker}, expected=Expected(state={"v": 1})
    )
    sealed_at_rest(2)
    with Store.open(database_url, kek=KEK) as second:
        other = second.tenant(sealed.tenant)
        other.append_messages(
            conv.id, [], state={"v": 3, "m": marker}, expected=Expected(state={"v": 2})
        )
        with pytest.raises(ConflictError, match="'v'"):
            other.append_messages(conv.id, [], state={"v": 9}, expected=Expected(state={"v": 2}))
    sealed_at_rest(3)
    with pytest.raises(ConflictError, match="'v'"):  # the head kept here is stale: read again
        sealed.append_messages(conv.id, [], state={"v": 9}, expected=Expected(state={"v": 2}))
    sealed.append_messages(
        conv.id,
        [Message(role="user", content="again")],
        after=2,
        state={"v": 4, "m": marker},
        expected=Expected(state={"v": 3}),
    )
    sealed_at_rest(4)
    head = sealed.conversation(conv.id).head
    moved = sealed.move_head(
        conv.id, 2, expected=Expected(head=head, state={"v": 4}), state={"v": 5, "m": marker}
    )
    assert moved.state == {"v": 5, "m": marker}
    sealed_at_rest(5)
    with pytest.raises(ConflictError, match="'v'"):
        sealed.move_head(conv.id, 2, expected=Expected(state={"v": 4}), state={"v": 6})

    # Read back opened, everywhere it reads.
    assert sealed.conversation(conv.id).state == {"v": 5, "m": marker}
    (listed,) = [c for c in sealed.conversations() if c.id == conv.id]
    assert listed.state == {"v": 5, "m": marker}
    changes = sealed.state_changes(conv.id)
    assert [e.payload["state"]["v"] for e in changes] == [1, 2, 3, 4, 5]
    assert [
        e.payload for e in sealed.events(conversation_id=conv.id) if e.kind == "state.changed"
    ] == [e.payload for e in changes]
    # Stored only as ciphertext: the events and the row.
    stored = [p for k, p in _stored_payloads(sealed_store, conv.id) if k == "state.changed"]
    assert len(stored) == 5
    assert all(p.startswith(SEALED_PREFIX) and marker not in p for p in stored)
    assert _stored_state(sealed_store, conv.id).startswith(SEALED_PREFIX)
    assert marker not in _stored_state(sealed_store, conv.id)
    with Store.open(database_url, kek=None) as bare:
        with pytest.raises(EncryptionError, match="key-encryption key"):
            bare.tenant(sealed.tenant).state_changes(conv.id)
        with pytest.raises(EncryptionError, match="key-encryption key"):
            bare.tenant(sealed.tenant).append_messages(
                conv.id, [], state={"v": 7}, expected=Expected(state={"v": 5})
            )
    assert sealed.conversation(conv.id).state["v"] == 5  # nothing was written

    sealed.erase("person-s", reason="the user asked")
    assert sealed.conversation(conv.id).state == {"erased": True}
    assert [e.payload for e in sealed.state_changes(conv.id)] == [
        {"state": {"erased": True}, "erased": True}
    ] * 5
    assert sealed.verify(conv.id).ok
    with pytest.raises(ErasedError):
        sealed.append_messages(conv.id, [], state={"v": 8})


def test_the_state_field_sealed_is_reserved(sealed: Ledger) -> None:
    conv = sealed.create_conversation()
    with pytest.raises(InvalidInputError, match="'sealed'"):
        sealed.append_messages(conv.id, [], state={"sealed": {"key": "k"}})
    assert sealed.conversation(conv.id).state == {}


def test_a_store_without_the_key_cannot_read_or_write_sealed_content(
    database_url: str, sealed: Ledger
) -> None:
    conv = sealed.create_conversation()
    minted = str(uuid.uuid4())
    sealed.append_messages(conv.id, [Message(role="user", content="secret")], ids=[minted])
    for fast in (True, False):  # a history read refuses by itself, on every path
        with Store.open(database_url, kek=None, fast_paths=fast) as bare:
            ledger = bare.tenant(sealed.tenant)
            for at in (None, 2):
                for repaired in (True, False):
                    with pytest.raises(EncryptionError, match="key-encryption key"):
                        ledger.history(conv.id, at=at, repaired=repaired)
                with pytest.raises(EncryptionError, match="key-encryption key"):
                    ledger.entries(conv.id, at=at)
            with pytest.raises(EncryptionError, match="key-encryption key"):
                ledger.entry(minted)
    with Store.open(database_url, kek=None) as bare:
        ledger = bare.tenant(sealed.tenant)
        with pytest.raises(EncryptionError, match="key-encryption key"):
            ledger.append_messages(conv.id, [Message(role="user", content="in the clear")])
        with pytest.raises(EncryptionError, match="key-encryption key"):
            ledger.create_conversation(subject="someone")
        with pytest.raises(EncryptionError, match="key-encryption key"):
            ledger.conversation(conv.id)  # its metadata is sealed too
    assert sealed.conversation(conv.id).head.position == 2  # nothing was written
    with (
        Store.open(database_url, kek=os.urandom(32)) as other,
        pytest.raises(EncryptionError, match="wrapped by another"),
    ):
        other.tenant(sealed.tenant).history(conv.id)


def test_conversations_in_the_clear_keep_working_once_a_key_is_configured(
    database_url: str, fast_paths: bool
) -> None:
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    with Store.open(database_url, fast_paths=fast_paths, kek=None) as bare:
        old = bare.tenant(tenant).create_conversation({"era": "before"})
        bare.tenant(tenant).append_messages(old.id, [Message(role="user", content="plain")])
    with Store.open(database_url, fast_paths=fast_paths, kek=KEK) as keyed:
        ledger = keyed.tenant(tenant)
        ledger.append_messages(old.id, [Message(role="assistant", content="still plain")])
        assert [m.content for m in ledger.history(old.id)] == ["plain", "still plain"]
        assert ledger.conversation(old.id).subject is None
        assert not any(p.startswith(SEALED_PREFIX) for _, p in _stored_payloads(keyed, old.id))
        new = ledger.create_conversation({"era": "after"})
        assert ledger.conversation(new.id).subject == new.id
        with pytest.raises(NotFoundError, match=r"(?i)erasure subject"):
            ledger.erase(old.id, reason="stored in the clear: nothing to erase")


def test_bad_subjects_and_reasons_are_refused(sealed: Ledger) -> None:
    with pytest.raises(InvalidInputError):
        sealed.create_conversation(subject="")
    with pytest.raises(InvalidInputError):
        sealed.create_conversation(subject="x" * 201)
    with pytest.raises(InvalidInputError):
        sealed.erase("someone", reason="x" * 1001)
    with pytest.raises(InvalidInputError, match="NewConversation"):
        sealed.append_messages(
            str(uuid.uuid4()),
            [Message(role="user", content="hi")],
            create="someone",  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidInputError):
        sealed.append_messages(
            str(uuid.uuid4()),
            [Message(role="user", content="hi")],
            create=NewConversation(subject=""),
        )
    with pytest.raises(NotFoundError):
        sealed.erase("nobody", reason="no such subject")
    with pytest.raises(InvalidInputError):
        LocalKek(b"short")


# -- erasure ---------------------------------------------------------------------------


def test_erasure_shows_markers_everywhere_and_refuses_writes(
    sealed_store: Store, sealed: Ledger
) -> None:
    marker = f"m-{uuid.uuid4().hex}"
    conv = sealed.create_conversation({"user": marker}, subject="person-1")
    turn = _turn(marker)
    sealed.append_messages(conv.id, turn)
    second = sealed.create_conversation(subject="person-1")
    sealed.append_messages(second.id, [Message(role="user", content=marker)])
    bystander = sealed.create_conversation(subject="person-2")
    sealed.append_messages(bystander.id, [Message(role="user", content="keep me")])

    erasure = sealed.erase("person-1", reason="request 17")
    assert sorted(erasure.conversation_ids) == sorted([conv.id, second.id])
    assert not erasure.already

    history = sealed.history(conv.id)
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert all(m.content == ERASED_CONTENT and m.model_extra == {"erased": True} for m in history)
    # The structure survives: the call and its result still pair, so nothing is repaired.
    assert history[1].tool_calls[0].id == turn[1].tool_calls[0].id
    assert history[2].tool_call_id == turn[2].tool_call_id
    assert history == sealed.history(conv.id, repaired=False)
    assert [e.message.content for e in sealed.entries(conv.id)] == [ERASED_CONTENT] * 4
    after = sealed.conversation(conv.id)
    assert after.metadata == {"erased": True} and after.erased_at is not None
    events = sealed.events(conversation_id=conv.id)
    assert all(marker not in e.payload_json for e in events)
    assert events[-1].kind == "conversation.erased"
    assert events[-1].payload == {
        "subject": "person-1",
        "keyId": erasure.key_id,
        "reason": "request 17",
    }
    assert events[0].payload["metadata"] == {"erased": True}
    assert [m.content for m in sealed.history(bystander.id)] == ["keep me"]

    with pytest.raises(ErasedError):
        sealed.append_messages(conv.id, [Message(role="user", content="more")])
    with pytest.raises(ErasedError):
        sealed.runs.start(second.id, owner="w")
    again = sealed.erase("person-1", reason="request 17, again")
    assert again.already and sorted(again.conversation_ids) == sorted([conv.id, second.id])
    # The subject can start over, under a new key.
    fresh = sealed.create_conversation(subject="person-1")
    sealed.append_messages(fresh.id, [Message(role="user", content="new")])
    assert [m.content for m in sealed.history(fresh.id)] == ["new"]


def test_the_log_verifies_before_and_after_erasure_and_still_finds_tampering(
    sealed_store: Store, sealed: Ledger
) -> None:
    conv = sealed.create_conversation({"who": "x"})
    sealed.append_messages(conv.id, _turn("before"))
    before = sealed.verify(conv.id)
    assert before.ok
    sealed.erase(conv.id, reason="asked")
    after = sealed.verify(conv.id)
    assert after.ok and after.checked == before.checked + 1
    with triggers_off(sealed_store) as conn:
        seq = conn.execute(
            sa.text(
                "SELECT seq FROM chatledger_events WHERE conversation_id = :c "
                "AND kind = 'message.recorded' ORDER BY seq LIMIT 1"
            ),
            {"c": conv.id},
        ).scalar_one()
        conn.execute(
            sa.text(
                "UPDATE chatledger_events SET payload = replace(payload, 'user', 'USER') "
                "WHERE seq = :s"
            ),
            {"s": seq},
        )
    broken = sealed.verify(conv.id)
    assert not broken.ok and broken.event_seq == seq


def test_forks_of_the_subject_are_erased_with_it_and_others_keep_their_own(
    sealed: Ledger,
) -> None:
    source = sealed.create_conversation()
    sealed.append_messages(source.id, [Message(role="user", content="shared prefix")])
    same = sealed.fork(source.id)
    sealed.append_messages(same.id, [Message(role="user", content="same subject's own")])
    other = sealed.fork(source.id, subject="someone-else")
    sealed.append_messages(other.id, [Message(role="user", content="other subject's own")])
    assert sealed.conversation(other.id).subject == "someone-else"

    erasure = sealed.erase(source.id, reason="source's subject")
    assert sorted(erasure.conversation_ids) == sorted([source.id, same.id])

    assert [m.content for m in sealed.history(same.id)] == [ERASED_CONTENT] * 2
    assert [m.content for m in sealed.history(other.id)] == [
        ERASED_CONTENT,
        "other subject's own",
    ]
    sealed.append_messages(other.id, [Message(role="user", content="still writable")])
    with pytest.raises(ErasedError):
        sealed.append_messages(same.id, [Message(role="user", content="refused")])


def test_an_erasure_in_another_process_holds_here_at_once(
    database_url: str, sealed_store: Store, sealed: Ledger
) -> None:
    conv = sealed.create_conversation()
    sealed.append_messages(conv.id, [Message(role="user", content="cached here")])
    assert sealed.history(conv.id)[0].content == "cached here"  # the key is cached now
    with Store.open(database_url, kek=KEK) as elsewhere:
        elsewhere.tenant(sealed.tenant).erase(conv.id, reason="from elsewhere")
    assert sealed.history(conv.id)[0].content == ERASED_CONTENT
    with pytest.raises(ErasedError):
        sealed.append_messages(conv.id, [Message(role="user", content="stale cache")])
    assert len(sealed.events(conversation_id=conv.id)) == 3  # created, message, erased


def test_opened_messages_are_served_from_the_cache_only_while_their_key_exists(
    database_url: str, fast_paths: bool, sealed_store: Store, sealed: Ledger
) -> None:
    conv = sealed.create_conversation()
    sealed.append_messages(conv.id, _turn("warm"))
    first = sealed.history(conv.id, repaired=False)
    again = sealed.history(conv.id, repaired=False)
    assert again == first
    if fast_paths:  # the head read's (the general path reads the head without the cache)
        # A warm read opens nothing: the messages opened by the first read come back.
        assert all(a is b for a, b in zip(again, first, strict=True))
    # Erased by another process: this store's cache still holds the opened
    # messages, and no read serves them.
    with Store.open(database_url, kek=KEK) as elsewhere:
        elsewhere.tenant(sealed.tenant).erase(conv.id, reason="from elsewhere")
    erased = sealed.history(conv.id, repaired=False)
    assert [m.content for m in erased] == [ERASED_CONTENT] * 4
    assert sealed.history(conv.id, repaired=False) == erased  # markers are not cached as content

    # Erased by this store: its cache lets go of every opened message.
    other = sealed.create_conversation()
    sealed.append_messages(other.id, _turn("dropped"))
    sealed.history(other.id)
    assert len(sealed_store.message_cache._items) > 0 or not fast_paths
    sealed.erase(other.id, reason="here")
    assert len(sealed_store.message_cache._items) == 0
    assert sealed.history(other.id)[0].content == ERASED_CONTENT


def test_another_tenants_subject_looks_missing(sealed_store: Store, sealed: Ledger) -> None:
    conv = sealed.create_conversation(subject="shared-name")
    other = sealed_store.tenant(f"other-{uuid.uuid4().hex[:8]}")
    with pytest.raises(NotFoundError):
        other.erase("shared-name", reason="not mine")
    with pytest.raises(NotFoundError):
        other.erase(conv.id, reason="not mine")
    theirs = other.create_conversation(subject="shared-name")
    other.append_messages(theirs.id, [Message(role="user", content="theirs")])
    sealed.erase("shared-name", reason="mine")
    assert [m.content for m in other.history(theirs.id)] == ["theirs"]


# -- the engine, audit and the tail on sealed conversations ---------------------------


def test_runs_on_sealed_conversations_rebuild_and_read_as_erased_everywhere(
    sealed: Ledger,
) -> None:
    from chatledger.engine import rebuild_request
    from chatledger.store import trim_history
    from tests._audit_agent import wrapped_agent

    agent = wrapped_agent("anthropic", history_processor=trim_history(4))
    first = agent.run(sealed, "weather?")
    second = agent.run(sealed, "and again?", first.conversation_id)
    for result in (first, second):
        for n in range(1, result.request_count + 1):
            assert rebuild_request(sealed, result.run_id, n, agent).matches, (result.run_id, n)
    stored = sealed.history(first.conversation_id)
    assert any(m.tool_calls for m in stored) and all(m.content != ERASED_CONTENT for m in stored)

    sealed.erase(first.conversation_id, reason="the person asked")
    # Audit pages and the tail hold back what another open transaction on the
    # server may yet precede (`Page.pending`, ADR 0005): read until settled.
    conv = first.conversation_id
    audited = drain(
        lambda after: sealed.audit.events(
            conversation_id=conv, kinds="message.recorded", after=after
        )
    )
    assert audited and all(e.payload["content"] == ERASED_CONTENT for e in audited)
    tools = drain(lambda after: sealed.audit.tool_executions(conversation_id=conv, after=after))
    assert tools  # tool names and call ids are structure, kept in the clear
    tailed = [e for page in settled(sealed) for e in page.items]
    messages = [e for e in tailed if e.kind == "message.recorded"]
    assert messages and all(e.payload["content"] == ERASED_CONTENT for e in messages)
    assert not rebuild_request(sealed, second.run_id, 1, agent).matches  # the content is gone


def test_a_failed_runs_error_is_sealed_and_erased_with_its_conversation(
    sealed_store: Store, sealed: Ledger
) -> None:
    # An exception's text may quote what the run was given: here, a sealed argument.
    from chatledger.engine import Agent, RunError, tool
    from chatledger.engine.providers import ScriptedModel

    secret = f"Atlantis-{uuid.uuid4().hex}"
    call = ToolCall(id="c1", name="weather", arguments={"city": secret})

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        raise ConnectionError(f"failed for {city}")

    agent = Agent(ScriptedModel([Message(role="assistant", tool_calls=[call])]), tools=[weather])
    with pytest.raises(RunError) as failure:
        agent.run(sealed, "weather?")
    run_id, conv = failure.value.run_id, failure.value.conversation_id
    with sealed_store.engine.connect() as c:
        error = c.execute(
            sa.text("SELECT error FROM chatledger_runs WHERE id = :r"), {"r": run_id}
        ).scalar_one()
    assert secret not in str(error)
    assert not any(secret in p for _, p in _stored_payloads(sealed_store, conv))
    assert sealed.runs.get(run_id).error == f"failed for {secret}"
    (ended,) = [e for e in sealed.events(conversation_id=conv) if e.kind == "run.failed"]
    assert (ended.payload["stage"], ended.payload["error"]) == ("tool", f"failed for {secret}")

    sealed.erase(conv, reason="the person asked")
    assert sealed.runs.get(run_id).error == ERASED_CONTENT
    (ended,) = [e for e in sealed.events(conversation_id=conv) if e.kind == "run.failed"]
    assert (ended.payload["stage"], ended.payload["error"]) == ("tool", ERASED_CONTENT)
    assert ended.payload["erased"] is True


def test_idempotent_retries_of_sealed_writes_replay_the_original(sealed: Ledger) -> None:
    conv = sealed.create_conversation()
    turn = [Message(role="user", content="once")]
    first = sealed.append_messages(conv.id, turn, idempotency_key="k1")
    again = sealed.append_messages(conv.id, turn, idempotency_key="k1")
    assert [e.id for e in again.events] == [e.id for e in first.events]
    assert again.events[0].message == turn[0]
    with pytest.raises(InvalidInputError, match="different append"):
        sealed.append_messages(
            conv.id, [Message(role="user", content="other")], idempotency_key="k1"
        )
    cursor = sealed.runs.start(conv.id, owner="w")
    recorded = [NewEvent.of_message(Message(role="assistant", content="ran"))]
    events, after = sealed.runs.record(cursor, recorded, idempotency_key="r1")
    replay, _ = sealed.runs.record(cursor, recorded, idempotency_key="r1")
    assert [e.id for e in replay] == [e.id for e in events]
    assert replay[0].message.content == "ran"
    assert [m.content for m in sealed.history(conv.id)] == ["once"]
    assert len(sealed.history(conv.id, repaired=False)) == 1
    del after


# -- what an attacker or a race could try ---------------------------------------------


def test_copied_ciphertext_is_never_opened_outside_its_place(
    database_url: str, sealed_store: Store, sealed: Ledger
) -> None:
    victim = sealed.create_conversation()
    sealed.append_messages(victim.id, [Message(role="user", content="VICTIM SECRET")])
    row = next(p for k, p in _stored_payloads(sealed_store, victim.id) if k == "message.recorded")
    envelope = json.loads(row)["sealed"]
    attacker = sealed_store.tenant(f"attacker-{uuid.uuid4().hex[:8]}")
    mine = attacker.create_conversation()
    # In the payload of any event: refused, nothing written. (A `conversation.created`
    # recorded into a conversation in the clear would be stored as given, and reads
    # open that kind.)
    with Store.open(database_url, kek=None) as bare:
        in_the_clear = bare.tenant(attacker.tenant).create_conversation()
    for conv_id, kind in ((mine.id, "model.responded"), (in_the_clear.id, "conversation.created")):
        cursor = attacker.runs.start(conv_id, owner="w")
        with pytest.raises(InvalidInputError, match="reserves"):
            attacker.runs.record(cursor, [NewEvent(kind, {"sealed": envelope})])
        attacker.runs.complete(cursor)
    # Put there all the same (a row written past the API): another tenant's key
    # never opens in this tenant's reads; it reads as erased.
    forged = '{"sealed":' + json.dumps(envelope, separators=(",", ":")) + "}"
    with sealed_store.engine.begin() as conn:
        head = conn.execute(
            sa.text(
                "SELECT head_branch_id, head_position FROM chatledger_conversations WHERE id = :c"
            ),
            {"c": in_the_clear.id},
        ).one()
        conn.execute(
            sa.text(
                "INSERT INTO chatledger_events (id, conversation_id, branch_id, position, kind, "
                "origin, head, recorded_at, payload, hash, tenant) VALUES (:id, :c, :b, :p, "
                "'conversation.created', 'client', false, CURRENT_TIMESTAMP, :payload, :hash, :t)"
            ),
            {
                "t": attacker.tenant,
                "id": str(uuid.uuid4()),
                "c": in_the_clear.id,
                "b": str(head[0]),
                "p": head[1] + 100,
                "payload": forged,
                "hash": bytes(32),
            },
        )
    shown = [e.payload_json for e in attacker.events(conversation_id=in_the_clear.id)]
    assert forged in [p for _, p in _stored_payloads(sealed_store, in_the_clear.id)]
    assert not any("VICTIM SECRET" in p for p in shown)
    assert any('"erased":true' in p for p in shown)
    # As a message field: refused, nothing written.
    with pytest.raises(InvalidInputError, match="reserves"):
        attacker.append_messages(
            mine.id,
            [Message(role="user", content="hi", sealed=envelope)],  # type: ignore[call-arg]
        )
    # As metadata: sealed like any metadata, and read back as given.
    meta = attacker.create_conversation({"sealed": envelope})
    assert attacker.conversation(meta.id).metadata == {"sealed": envelope}
    with Store.open(database_url, kek=None) as bare:
        clear = bare.tenant(attacker.tenant).create_conversation({"sealed": envelope})
    assert attacker.conversation(clear.id).metadata == {"sealed": envelope}


def test_a_message_row_holding_another_tenants_ciphertext_reads_as_erased_everywhere(
    sealed_store: Store, sealed: Ledger
) -> None:
    victim = sealed.create_conversation()
    sealed.append_messages(victim.id, [Message(role="user", content="VICTIM SECRET")])
    stolen = next(
        p for k, p in _stored_payloads(sealed_store, victim.id) if k == "message.recorded"
    )
    attacker = sealed_store.tenant(f"attacker-{uuid.uuid4().hex[:8]}")
    mine = attacker.create_conversation()
    minted = str(uuid.uuid4())
    written = attacker.append_messages(
        mine.id, [Message(role="user", content="mine")], ids=[minted]
    ).events[0]
    # Past the API (a superuser's write): the attacker's message row holds the
    # victim's ciphertext. Every read of it opens with the attacker's keys only.
    with triggers_off(sealed_store) as conn:
        conn.execute(
            sa.text(
                "UPDATE chatledger_events SET payload = :p WHERE conversation_id = :c AND seq = :s"
            ),
            {"p": stolen, "c": mine.id, "s": written.seq},
        )
    reads = [
        attacker.history(mine.id)[-1],
        attacker.history(mine.id, at=written.position)[-1],
        attacker.entries(mine.id)[-1].message,
        attacker.entries(mine.id, last=1)[-1].message,
        attacker.entry(minted).message,
    ]
    assert all(m.content == ERASED_CONTENT for m in reads)
    assert sealed.history(victim.id)[0].content == "VICTIM SECRET"  # the victim's, untouched


def test_a_run_caught_by_an_erasure_still_ends(sealed: Ledger) -> None:
    conv = sealed.create_conversation()
    sealed.append_messages(conv.id, [Message(role="user", content="hi")])
    cursor = sealed.runs.start(conv.id, owner="w")
    sealed.erase(conv.id, reason="mid-run")
    with pytest.raises(ErasedError):
        sealed.runs.record(cursor, [NewEvent.of_message(Message(role="assistant", content="no"))])
    sealed.runs.fail(cursor, stage="model", error="it may quote the content")
    run = sealed.runs.get(cursor.run_id)
    assert (run.status, run.error) == ("failed", ERASED_CONTENT)  # nothing left to seal it with


def test_a_creation_prepared_under_a_key_that_is_then_erased_writes_nothing(
    sealed_store: Store, sealed: Ledger
) -> None:
    from chatledger.store._sealing import drive, preparing
    from chatledger.store._store import Operations

    first = sealed.create_conversation(subject="racer")
    ops = Operations(sealed.tenant, sealed_store.message_cache, sealed_store._sealer)
    assert sealed_store._sealer is not None
    sealing = ops.create_conversation(subject="racer").sealing
    assert sealing is not None
    op, _ = drive(preparing(sealed_store._sealer, sealing), sealed_store.execute)
    sealed.erase("racer", reason="between the key read and the write")
    with pytest.raises(ConflictError, match="destroyed"):
        sealed_store.execute(op)
    again = sealed.create_conversation({"m": "readable"}, subject="racer")
    assert sealed.conversation(again.id).metadata == {"m": "readable"}
    assert sealed.conversation(first.id).erased_at is not None


class _MintingTogether(LocalKek):
    """A key-encryption key whose first two wraps return together: two writers that
    each found no key for a subject both mint one before either writes it."""

    def __init__(self) -> None:
        super().__init__(KEK)
        self.together = threading.Barrier(2, timeout=30)

    def wrap(self, data_key: bytes) -> bytes:
        self.together.wait()
        return super().wrap(data_key)


def test_a_subjects_first_conversations_created_at_once_share_its_key(database_url: str) -> None:
    # The second to write its minted key finds the first's: its creation, which wrote
    # nothing, is tried again under that key, rather than refused.
    with Store.open(database_url, kek=_MintingTogether()) as store:
        sealed = store.tenant(f"tenant-{uuid.uuid4().hex[:8]}")
        with ThreadPoolExecutor(2) as pool:
            made = [pool.submit(sealed.create_conversation, subject="pair") for _ in range(2)]
            convs = [m.result(timeout=60) for m in made]
        for conv in convs:
            sealed.append_messages(conv.id, [Message(role="user", content="SECRET")])
        sealed.erase("pair", reason="both at once")
        assert all(sealed.conversation(c.id).erased_at is not None for c in convs)
        assert all(sealed.history(c.id)[0].content == ERASED_CONTENT for c in convs)


def test_a_store_without_the_key_cannot_fork_a_sealed_conversation(
    database_url: str, sealed: Ledger
) -> None:
    conv = sealed.create_conversation()
    sealed.append_messages(conv.id, [Message(role="user", content="sealed")])
    with Store.open(database_url, kek=None) as bare, pytest.raises(EncryptionError, match="fork"):
        bare.tenant(sealed.tenant).fork(conv.id)


def test_an_import_cannot_bring_ciphertext_under_another_subjects_key(
    sealed_store: Store, sealed: Ledger
) -> None:
    import io

    from chatledger.store import ImportFileError

    victim, attacker, mine, renamed = _victim_and_attackers_export(sealed_store, sealed)
    # Forge the file as an attacker can: fresh ids, no key record, the message's
    # payload the victim's ciphertext, every hash recomputed.
    forged = _forged_export(renamed, payload=_stolen(_stored_payloads(sealed_store, victim.id)))
    with pytest.raises(ImportFileError, match="not the key of the conversation's subject"):
        attacker.import_file(io.StringIO(forged))
    assert [c.id for c in attacker.conversations()] == [mine.id]  # nothing was written


@pytest.mark.parametrize("where", ["row", "event", "row respelled"])
def test_an_import_cannot_bring_a_sealed_state_under_another_subjects_key(
    sealed_store: Store, sealed: Ledger, where: str
) -> None:
    import io

    from chatledger.store import ImportFileError

    victim = sealed.create_conversation()
    sealed.append_messages(victim.id, [], state={"address": "VICTIM SECRET"})
    row = _stored_state(sealed_store, victim.id)
    stolen = {
        "row": row,
        "row respelled": json.dumps(json.loads(row), separators=(", ", ": ")),
        "event": next(
            p for k, p in _stored_payloads(sealed_store, victim.id) if k == "state.changed"
        ),
    }[where]
    attacker = sealed_store.tenant(f"attacker-{uuid.uuid4().hex[:8]}")
    mine = attacker.create_conversation()
    attacker.append_messages(mine.id, [], state={"address": "mine"})
    renamed = _renamed_export(attacker, mine.id)
    forged = (
        _forged_export(renamed, payload=stolen, kind="state.changed")
        if where == "event"
        else _forged_export(renamed, state=stolen)
    )
    refused = (
        "'sealed'" if where == "row respelled" else "not the key of the conversation's subject"
    )
    with pytest.raises(ImportFileError, match=refused):
        attacker.import_file(io.StringIO(forged))
    assert [c.id for c in attacker.conversations()] == [mine.id]  # nothing was written


@pytest.mark.parametrize("forged", ["embedded", "metadata"])
def test_an_import_cannot_bring_ciphertext_in_a_message_field_or_in_metadata(
    sealed_store: Store, sealed: Ledger, forged: str
) -> None:
    # The same forgery, with the victim's ciphertext where a read would also open
    # it: a `sealed` member of a message outside the sealed layout, or the sealed
    # conversation's metadata.
    import io

    from chatledger.store import ImportFileError

    victim, attacker, mine, renamed = _victim_and_attackers_export(sealed_store, sealed)
    stolen = _stored_payloads(sealed_store, victim.id)
    if forged == "embedded":
        text = _forged_export(renamed, payload=_stolen(stolen, embed=True))
        refusal = "reserves for the messages it stores encrypted"
    else:
        text = _forged_export(renamed, metadata=_stored_metadata(sealed_store, victim.id))
        refusal = "not the key of the conversation's subject"
    with pytest.raises(ImportFileError, match=refusal):
        attacker.import_file(io.StringIO(text))
    assert [c.id for c in attacker.conversations()] == [mine.id]  # nothing was written


def _victim_and_attackers_export(
    sealed_store: Store, sealed: Ledger
) -> tuple[Conversation, Ledger, Conversation, str]:
    """A victim's sealed conversation (metadata and a message saying VICTIM SECRET), an
    attacker tenant with a sealed conversation of its own, and that conversation's
    export with every id renamed, as an attacker can forge it into a new one."""
    victim = sealed.create_conversation({"note": "VICTIM SECRET"})
    sealed.append_messages(victim.id, [Message(role="user", content="VICTIM SECRET")])
    attacker = sealed_store.tenant(f"attacker-{uuid.uuid4().hex[:8]}")
    mine = attacker.create_conversation({"note": "mine"})
    attacker.append_messages(mine.id, [Message(role="user", content="mine")])
    return victim, attacker, mine, _renamed_export(attacker, mine.id)


def _renamed_export(ledger: Ledger, conversation_id: str) -> str:
    """The conversation's export with every id renamed, as a forger makes a new one of it."""
    import io

    out = io.StringIO()
    ledger.export(out, conversation_id=conversation_id)
    fresh: dict[str, str] = {}
    return re.sub(
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        lambda m: fresh.setdefault(m.group(0), str(uuid.uuid4())),
        out.getvalue(),
    )


def _stolen(victim: list[tuple[str, str]], *, embed: bool = False) -> str:
    """The victim's message ciphertext; `embed`: as a `sealed` member of a message
    that is not in the sealed layout."""
    stolen = next(p for k, p in victim if k == "message.recorded")
    if not embed:
        return stolen
    envelope = json.loads(stolen)
    return json.dumps(
        {"role": envelope["role"], "sealed": envelope["sealed"]}, separators=(",", ":")
    )


def _forged_export(
    text: str,
    *,
    payload: str | None = None,
    kind: str = "message.recorded",
    metadata: str | None = None,
    state: str | None = None,
    run_error: str | None = None,
) -> str:
    """`text` (one branch) without its key record, with the `payload` of its events of
    `kind`, the conversation's stored `metadata` and `state` and its run's `run_error`
    replaced where given, every hash and the end record recomputed."""
    import hashlib

    from chatledger.store._sql import chain as _chain

    records = [json.loads(line) for line in text.splitlines()]
    records = [r for r in records if r.get("type") != "subjectKey"]
    if metadata is not None:
        next(r for r in records if r.get("type") == "conversation")["metadata"] = metadata
    if state is not None:
        next(r for r in records if r.get("type") == "conversation")["state"] = state
    if run_error is not None:
        next(r for r in records if r.get("type") == "run")["error"] = run_error
    previous = _chain.GENESIS
    for r in records:
        if r.get("type") != "event":
            continue
        if r["kind"] == kind and payload is not None:
            r["payload"] = payload
        fields = {
            "id": r["id"],
            "conversation_id": r["conversationId"],
            "branch_id": r["branchId"],
            "position": r["position"],
            "run_id": r.get("runId"),
            "kind": r["kind"],
            "origin": r["origin"],
            "head": r["head"],
            "idempotency_key": r.get("idempotencyKey"),
            "payload": r["payload"],
        }
        previous = _chain.link(previous, _chain.content(**fields))
        r["hash"] = previous.hex()
    conv = next(r for r in records if r.get("type") == "conversation")
    (head,) = [
        r
        for r in records
        if r.get("type") == "event"
        and (r["branchId"], r["position"]) == (conv["headBranchId"], conv["headPosition"])
    ]
    conv["headHash"] = head["hash"]
    body = [json.dumps(r, separators=(",", ":"), ensure_ascii=True) for r in records[:-1]]
    digest = hashlib.sha256("".join(line + "\n" for line in body).encode()).hexdigest()
    end = {**records[-1], "lines": len(body), "sha256": digest}
    return "".join(line + "\n" for line in [*body, json.dumps(end, separators=(",", ":"))])


@pytest.mark.parametrize("clear", ["metadata", "creation", "message", "run", "run end"])
def test_an_import_refuses_content_in_the_clear_in_a_sealed_conversation(
    sealed: Ledger, clear: str
) -> None:
    # What its erasure would not reach: plaintext in a sealed conversation's rows.
    import io

    from chatledger.store import ImportFileError

    conv = sealed.create_conversation({"note": "sealed"})
    sealed.append_messages(conv.id, [Message(role="user", content="sealed")])
    cursor = sealed.runs.start(conv.id, owner="w")
    sealed.runs.fail(cursor, stage="tool", error="failed for a sealed argument")
    text = _renamed_export(sealed, conv.id)
    secret = "PLAIN SECRET"
    if clear == "metadata":
        text = _forged_export(text, metadata=json.dumps({"note": secret}))
    elif clear == "creation":
        created = {"metadata": {"note": secret}, "tenant": sealed.tenant}
        text = _forged_export(text, payload=json.dumps(created), kind="conversation.created")
    elif clear == "message":
        text = _forged_export(text, payload=json.dumps({"role": "user", "content": secret}))
    elif clear == "run":
        text = _forged_export(text, run_error=f"failed for {secret}")
    else:
        ended = {"error": f"failed for {secret}", "requestCount": 0, "stage": "tool"}
        text = _forged_export(text, payload=json.dumps(ended), kind="run.failed")
    with pytest.raises(ImportFileError, match="holds only sealed content"):
        sealed.import_file(io.StringIO(text))
    assert [c.id for c in sealed.conversations()] == [conv.id]  # nothing was written


def test_a_resumed_run_of_an_erased_conversation_is_erased_with_it(sealed: Ledger) -> None:
    from chatledger.engine import RunError
    from tests._audit_agent import wrapped_agent

    with pytest.raises(RunError) as failed:
        wrapped_agent("anthropic", fail_on=2).run(sealed, "weather?")
    resumed = wrapped_agent("anthropic").resume(sealed, failed.value.run_id)
    conversation_id = resumed.conversation_id
    branches = {e.branch_id for e in sealed.events(conversation_id=conversation_id)}
    assert len(branches) > 1  # the failed run's branch and the resume branch
    assert all(m.content != ERASED_CONTENT for m in sealed.history(conversation_id))
    sealed.erase(conversation_id, reason="with its resume branch")
    messages = [
        e.message
        for e in sealed.events(conversation_id=conversation_id)
        if e.kind == "message.recorded"
    ]
    assert messages and all(m.content == ERASED_CONTENT for m in messages)


def test_a_keyless_store_s_write_result_is_returned_not_refused_after_its_commit(
    database_url: str, sealed: Ledger
) -> None:
    conv = sealed.create_conversation({"m": "sealed metadata"})
    sealed.append_messages(conv.id, [Message(role="user", content="a")])
    sealed.append_messages(conv.id, [Message(role="user", content="b")])
    with Store.open(database_url, kek=None) as bare:
        moved = bare.tenant(sealed.tenant).move_head(conv.id, 2)
    assert moved.head.position > 2  # it committed, and said so
    assert [m.content for m in sealed.history(conv.id)] == ["a"]


def test_a_write_refused_as_erased_forgets_the_conversations_cached_key(
    database_url: str, sealed_store: Store, sealed: Ledger
) -> None:
    conv = sealed.create_conversation()
    sealed.append_messages(conv.id, [Message(role="user", content="before")])
    sealer = sealed_store._sealer
    assert sealer is not None and sealer.writing(sealed.tenant, conv.id) is not None
    with Store.open(database_url, kek=KEK) as other:  # another process's erasure
        other.tenant(sealed.tenant).erase(conv.id, reason="asked")
    with pytest.raises(ErasedError):
        sealed.append_messages(conv.id, [Message(role="user", content="after")])
    assert sealer.writing(sealed.tenant, conv.id) is None


def test_a_seal_read_in_a_rolled_back_transaction_is_not_kept_for_later_writes(
    database_url: str, sealed_store: Store, sealed: Ledger
) -> None:
    """A caller's transaction creates a sealed conversation and appends to it,
    then rolls back; another store creates the same id under another subject.
    This store's next append must seal under the key that exists, not the one
    it read inside the rolled-back transaction: else what it acknowledged
    reads back as erased."""
    from chatledger.store._store import Operations

    cid = new_id()
    ops = Operations(sealed.tenant, sealed_store.message_cache, sealed_store._sealer)
    with sealed_store.engine.connect() as caller:
        caller.begin()
        sealed_store.execute(
            ops.create_conversation(conversation_id=cid, subject="rolled-back"), caller
        )
        turn = next(ops.append_messages(cid, _turn("inside")))
        sealed_store.execute(turn, caller)
        caller.rollback()
    with Store.open(database_url, kek=KEK) as other:
        other.tenant(sealed.tenant).create_conversation(conversation_id=cid, subject="kept")
    acknowledged = _turn("acknowledged")
    sealed.append_messages(cid, acknowledged)
    assert sealed.history(cid) == acknowledged
    assert sealed.conversation(cid).subject == "kept"
