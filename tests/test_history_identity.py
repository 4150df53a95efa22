"""resolve_conversation_id and from_pairs: identity and the flat history form."""

from __future__ import annotations

import uuid

import pytest

from chatledger.store import InvalidInputError, Message, from_pairs, resolve_conversation_id


def said(conversation_id: str | None, role: str = "user") -> Message:
    return Message.model_validate({"role": role, "conversationId": conversation_id})


# --- resolve_conversation_id -----------------------------------------------------------


def test_explicit_id_wins() -> None:
    assert resolve_conversation_id([said("from-history")], explicit="mine") == "mine"


def test_empty_explicit_id_is_ignored() -> None:
    assert resolve_conversation_id([said("from-history")], explicit="") == "from-history"


def test_most_recent_message_with_a_conversation_id_donates_it() -> None:
    history = [said("old"), said("newer", "assistant"), said(None), said("")]
    assert resolve_conversation_id(history) == "newer"


def test_new_uuid7_when_nothing_gives_an_id() -> None:
    resolved = resolve_conversation_id([said(None), said("")])
    assert uuid.UUID(resolved).version == 7
    assert str(uuid.UUID(resolved)) == resolved


def test_each_resolution_without_an_id_mints_a_different_one() -> None:
    assert resolve_conversation_id([]) != resolve_conversation_id([])


# --- from_pairs ------------------------------------------------------------------------


def test_from_pairs_builds_user_and_assistant_messages() -> None:
    assert from_pairs([("user", "hi"), ("assistant", "hello")]) == [
        Message(role="user", content="hi"),
        Message(role="assistant", content="hello"),
    ]


@pytest.mark.parametrize("role", ["system", "tool", "Assistant", "developer", ""])
def test_from_pairs_turns_other_roles_into_user(role: str) -> None:
    assert from_pairs([(role, "text")]) == [Message(role="user", content="text")]


def test_from_pairs_accepts_any_iterable() -> None:
    assert len(from_pairs(iter([["user", "a"], ("assistant", "b")]))) == 2  # type: ignore[list-item]


@pytest.mark.parametrize("pair", [("user",), ("user", 3), (None, "x"), "ux"])
def test_from_pairs_rejects_a_pair_that_is_not_two_strings(pair: object) -> None:
    with pytest.raises(InvalidInputError, match="pair 1"):
        from_pairs([("user", "ok"), pair])  # type: ignore[list-item]
