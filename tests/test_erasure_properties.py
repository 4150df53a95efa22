"""Repair sees sealed histories as it sees their plaintext (property tests).

A head read repairs the history it reads, and a sealed history is opened
after the read (store._sealing): what stays in the clear in a sealed message
(roles, call ids and names, the call a result answers) must be all that
repair decides by. So for any history, repairing the sealed messages and
then opening them gives exactly the repair of the plaintext; and once the
key is erased, the markers pair as the plaintext did.
"""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings

from chatledger.store import _repair
from chatledger.store._crypto import (
    ERASED_CONTENT,
    DataKey,
    Seal,
    is_sealed,
    key_id_of,
    key_ids_of,
    opened,
)
from chatledger.store._values import NewEvent
from chatledger.store.messages import Message, dump_message, load_messages
from tests.test_history_properties import histories

KEY = DataKey("01a22f00-0000-7000-8000-000000000001", AESGCM(bytes(32)))


def _sealed(history: list[Message]) -> list[Message]:
    encoded = [(NewEvent.of_message(m), dump_message(m)) for m in history]
    return load_messages([text for _, text in Seal(KEY, "s").events(encoded)])


@settings(max_examples=300, deadline=None)
@given(histories())
def test_repairing_sealed_messages_then_opening_them_is_repairing_the_plaintext(
    history: list[Message],
) -> None:
    sealed = _sealed(history)
    assert opened(sealed, {KEY.key_id: KEY}) == history
    assert opened(_repair.repaired(sealed), {KEY.key_id: KEY}) == _repair.repaired(history)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_erased_markers_keep_the_shape_repair_sees(history: list[Message]) -> None:
    markers = opened(_sealed(history), {KEY.key_id: None})
    assert [m.role for m in markers] == [m.role for m in history]
    assert all(m.content == ERASED_CONTENT and not m.parts for m in markers)
    repaired_markers = _repair.repaired(markers)
    repaired_plain = _repair.repaired(history)
    assert [(m.role, m.tool_call_id, [c.id for c in m.tool_calls]) for m in repaired_markers] == [
        (m.role, m.tool_call_id, [c.id for c in m.tool_calls]) for m in repaired_plain
    ]


@settings(max_examples=200, deadline=None)
@given(histories())
def test_every_rows_key_id_is_read_in_one_pass_whatever_the_spelling(
    history: list[Message],
) -> None:
    encoded = [(NewEvent.of_message(m), dump_message(m)) for m in history]
    texts = [text for _, text in Seal(KEY, "s").events(encoded)]
    # The same sealed JSON in another spelling (the sealed members reordered), and clear texts.
    respelled = [_respelled(t) for t in texts]
    clear = [text for _, text in encoded]
    mixed = [t for triple in zip(texts, respelled, clear, strict=True) for t in triple]
    assert key_ids_of(mixed) == [KEY.key_id, KEY.key_id, None] * len(history)
    assert key_ids_of(mixed) == [key_id_of(t) if is_sealed(t) else None for t in mixed]


def _respelled(text: str) -> str:
    envelope = json.loads(text)
    envelope["sealed"] = dict(reversed(envelope["sealed"].items()))
    return json.dumps(envelope, separators=(",", ":"))
