"""Identity by donation (ADR 0033): the newest stamped message of supplied history.

Without an explicit `conversation_id`, `run_with_history` continues the
conversation named by the most recent message of the supplied history that
carries a `conversationId`, if it is a conversation of the handle's tenant.
Any other stamp (another tenant's, an unknown id, a malformed one) chooses
nothing, and the run looks exactly like one whose history named nothing.
"""

from __future__ import annotations

import pytest

from chatledger.engine import Agent
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Ledger, Message, Store, new_id


def said(text: str, conversation_id: str | None = None) -> Message:
    return Message(role="user", content=text, conversation_id=conversation_id)


def test_runs_on_their_own_results_chain_in_one_conversation(ledger: Ledger) -> None:
    agent = Agent(ScriptedModel(["one", "two", "three"]))
    first = agent.run(ledger, "a")
    second = agent.run_with_history(ledger, first.messages, "b")
    third = agent.run_with_history(ledger, second.messages, "c")
    assert first.conversation_id == second.conversation_id == third.conversation_id
    assert [m.content for m in ledger.history(first.conversation_id)] == [
        "a",
        "one",
        "b",
        "two",
        "c",
        "three",
    ]
    assert [c.id for c in ledger.conversations()] == [first.conversation_id]


def test_the_newest_stamped_message_donates_and_unstamped_ones_are_skipped(
    ledger: Ledger,
) -> None:
    older, newer = ledger.create_conversation(), ledger.create_conversation()
    history = [said("x", older.id), said("y", newer.id), said("z")]
    result = Agent(ScriptedModel(["ok"])).run_with_history(ledger, history, "go")
    assert result.conversation_id == newer.id
    # The supplied history is the truth for the run: an edit branch from the start.
    assert [m.content for m in ledger.history(newer.id)] == ["x", "y", "z", "go", "ok"]
    assert ledger.history(older.id) == []


def test_an_explicit_id_wins_over_a_donated_one(ledger: Ledger) -> None:
    named, chosen = ledger.create_conversation(), ledger.create_conversation()
    result = Agent(ScriptedModel(["ok"])).run_with_history(
        ledger, [said("x", named.id)], "go", conversation_id=chosen.id
    )
    assert result.conversation_id == chosen.id
    assert ledger.history(named.id) == []


def test_a_stamp_of_another_tenant_looks_exactly_like_an_unknown_one(
    ledger: Ledger, store: Store
) -> None:
    other = store.tenant(f"other-{new_id()}")
    theirs = other.create_conversation()
    other.append_messages(theirs.id, [said("their secret")])
    before = other.events()
    shapes = []
    for stamp in (theirs.id, new_id(), "not-an-id"):
        result = Agent(ScriptedModel(["ok"])).run_with_history(ledger, [said("x", stamp)], "go")
        assert result.conversation_id not in (theirs.id, stamp)  # a new one was minted
        assert [m.content for m in ledger.history(result.conversation_id)] == ["x", "go", "ok"]
        events = ledger.events(conversation_id=result.conversation_id)
        shapes.append([(e.kind, e.origin, e.position) for e in events])
    assert shapes[0] == shapes[1] == shapes[2]
    assert other.events() == before
    assert [m.content for m in other.history(theirs.id)] == ["their secret"]


@pytest.mark.parametrize("donor", ["other tenant", "unknown"])
def test_a_stamp_that_chooses_nothing_writes_nothing_in_the_named_tenant(
    ledger: Ledger, store: Store, donor: str
) -> None:
    other = store.tenant(f"other-{new_id()}")
    theirs = other.create_conversation().id if donor == "other tenant" else new_id()
    result = Agent(ScriptedModel(["ok"])).run_with_history(ledger, [said("x", theirs)], "go")
    assert [c.id for c in ledger.conversations()] == [result.conversation_id]
    assert [c.id for c in other.conversations()] == ([theirs] if donor == "other tenant" else [])
