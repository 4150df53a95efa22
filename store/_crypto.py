"""Sealing: messages and metadata encrypted under a data key per erasure subject.

A store opened with a key-encryption key (`Store.open(kek=...)`, or the
environment's `CHATLEDGER_KEK`) seals what people wrote: the payload of each
`message.recorded` event, the metadata in `conversation.created` and the
conversation row's metadata column, the conversation's state (each
`state.changed` payload and the row's state column: a framework keeps its
checkpoints and pending values there); and what a run's failure said about it,
which may quote it: the error of a failed or canceled run, in its
`run.failed` or `run.canceled` event and on its `chatledger_runs` row. Each conversation belongs to an erasure
subject (its own id unless one is given at creation; a fork inherits its
source's), each subject has one random 256-bit data key, and the key is
stored wrapped by the key-encryption key in `chatledger_subject_keys`.
`ledger.erase(subject)` deletes that row: what the key sealed can never be
opened again, while every event row, and so the hash chain, stays as it was
(docs/erasure.md, docs/adr/0025-crypto-shredding.md).

A sealed payload is JSON text that begins `{"sealed":{` and keeps in the
clear only what the structure of a history needs (a message's role, its tool
call ids and names, the tool a result answers, `failed`), so that repair,
audit queries by tool name and a reader without keys all see a well-formed
history; the content, arguments and parts are in the AES-GCM ciphertext,
whose associated data is the key id. The hash chain covers the sealed text.

Opening happens once per result, after the operation: `sealed_key_ids`
finds what a result holds sealed, the store reads those keys' rows (a key
that was erased is simply absent, in whatever process erased it), and
`opened` rebuilds the result with the plaintext, or with an erased marker
where the key is gone.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat
from typing import Any, Protocol, TypeVar, runtime_checkable

from chatledger.store._errors import EncryptionError, InvalidInputError
from chatledger.store._values import Conversation, Event, NewEvent, Position, Run
from chatledger.store.messages import Message, load_messages

__all__ = [
    "ERASED_CONTENT",
    "NO_KEY",
    "PLAIN",
    "SEALED_KINDS",
    "SEALED_PREFIX",
    "DataKey",
    "KeyEncryptionKey",
    "LocalKek",
    "NewKey",
    "Seal",
    "Sealer",
    "is_sealed",
    "kek_for",
    "kek_from_env",
    "key_id_of",
    "open_text",
    "opened",
    "refuse_sealed",
    "sealed_key_ids",
    "sealer_for",
    "split_sealed",
]

T = TypeVar("T")

SEALED_PREFIX = '{"sealed":{'
"""How every sealed payload or metadata text begins (and no clear one can)."""

ERASED_CONTENT = "[erased]"
"""The content of an erased message, which also carries `"erased": true`; and the
error of an erased conversation's failed run."""

ENV_VAR = "CHATLEDGER_KEK"

SEALED_KINDS = frozenset(
    {"message.recorded", "conversation.created", "state.changed", "run.failed", "run.canceled"}
)
"""The event kinds whose payloads are sealed (a run's end when it has an error): no
other payload is ever opened."""
_CREATED_CLEAR = ("tenant", "forkedFrom")
_STATE_CLEAR = '"kind":"state.changed"'
"""The clear member of a sealed `state.changed` payload."""
_SEALED_COLUMNS = ("metadata", "state")
"""A sealed conversation's columns that hold sealed text."""
_WRAP_AAD = b"chatledger data key v1"


def _aesgcm() -> Any:
    """cryptography's AES-GCM, from the `encryption` extra."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise EncryptionError(
            "Sealing needs the `cryptography` package: pip install 'chatledger[encryption]'."
        ) from exc
    return AESGCM


def is_sealed(text: str) -> bool:
    """Whether stored JSON text is sealed."""
    return text.startswith(SEALED_PREFIX)


NO_KEY = (
    "This result holds sealed content, and the store has no key-encryption key. "
    "Open it with the key the content was sealed under (Store.open(kek=...) or the "
    "CHATLEDGER_KEK environment variable)."
)
"""The error of a store without a key that reads sealed content."""


def refuse_sealed(texts: Sequence[str]) -> None:
    """`EncryptionError` when any of the stored `texts` is sealed (a store without a key)."""
    if any(map(str.startswith, texts, repeat(SEALED_PREFIX))):  # map: a third faster
        raise EncryptionError(NO_KEY)


@runtime_checkable
class KeyEncryptionKey(Protocol):
    """What wraps and unwraps data keys: a local key, or a KMS behind two calls.

    `id` names the key (stored beside each key it wrapped, for rotation);
    `wrap` and `unwrap` must be inverse and must fail on a wrapped key they
    did not produce.
    """

    @property
    def id(self) -> str: ...

    def wrap(self, data_key: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes) -> bytes: ...


class LocalKek:
    """A key-encryption key held in configuration: AES-256-GCM key wrapping."""

    def __init__(self, key: bytes, *, id: str | None = None) -> None:
        if not isinstance(key, bytes) or len(key) != 32:
            raise InvalidInputError(
                "A key-encryption key is 32 random bytes (AES-256); generate one with "
                "`python -c 'import os, base64; print(base64.b64encode(os.urandom(32)).decode())'`."
            )
        self._aead = _aesgcm()(key)
        self._id = id or "local:" + hashlib.sha256(b"chatledger kek id" + key).hexdigest()[:16]

    @property
    def id(self) -> str:
        return self._id

    def wrap(self, data_key: bytes) -> bytes:
        nonce = os.urandom(12)
        sealed: bytes = self._aead.encrypt(nonce, data_key, _WRAP_AAD)
        return nonce + sealed

    def unwrap(self, wrapped: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            key: bytes = self._aead.decrypt(wrapped[:12], wrapped[12:], _WRAP_AAD)
        except (InvalidTag, ValueError) as exc:
            raise EncryptionError(
                f"A data key cannot be unwrapped with key-encryption key '{self._id}': it was "
                f"wrapped by another. Open the store with the key that wrapped it."
            ) from exc
        return key

    @classmethod
    def from_text(cls, text: str, *, what: str = ENV_VAR) -> LocalKek:
        """A key from its base64 (standard or URL-safe) or hex spelling."""
        value = text.strip()
        decoders: tuple[Callable[[str], bytes], ...] = (
            bytes.fromhex,
            lambda v: base64.b64decode(v, validate=True),
            base64.urlsafe_b64decode,
        )
        for decode in decoders:
            try:
                key = decode(value)
            except (ValueError, binascii.Error):
                continue
            if len(key) == 32:
                return cls(key)
        raise InvalidInputError(
            f"{what} is not a 32-byte key in base64 or hex. Generate one with "
            f"`python -c 'import os, base64; print(base64.b64encode(os.urandom(32)).decode())'`."
        )


def kek_from_env() -> LocalKek | None:
    """The key-encryption key in `CHATLEDGER_KEK`, if set."""
    text = os.environ.get(ENV_VAR)
    return LocalKek.from_text(text) if text else None


@dataclass(frozen=True)
class DataKey:
    """An unwrapped data key, ready to seal and open."""

    key_id: str
    aead: Any  # cryptography's AESGCM

    def seal(self, plaintext: str, clear: Mapping[str, Any]) -> str:
        """`plaintext` sealed, as the stored JSON text (see the module docstring)."""
        members = json.dumps(clear, separators=(",", ":"), ensure_ascii=False)[1:-1]
        return self.seal_text(plaintext, members)

    def seal_text(self, plaintext: str, clear_json: str) -> str:
        """`seal` with the clear fields given as JSON members text (`"a":1,"b":2`).

        Built as text: every part but the clear fields is an id or base64,
        which JSON never escapes; `split_sealed` reads it back by position.
        """
        nonce = os.urandom(12)
        data = self.aead.encrypt(nonce, plaintext.encode("utf-8"), self.key_id.encode())
        head = (
            f'{SEALED_PREFIX}"key":"{self.key_id}","nonce":"{_b64(nonce)}","data":"{_b64(data)}"}}'
        )
        return head + ("," + clear_json + "}" if clear_json else "}")

    def open_parts(self, nonce: str, data: str) -> str:
        """The plaintext of a sealed value's base64 `nonce` and `data`."""
        try:
            plain: bytes = self.aead.decrypt(_a2b(nonce), _a2b(data), self.key_id.encode("ascii"))
        except Exception as exc:  # cryptography's InvalidTag, or bad base64
            raise EncryptionError(
                f"Sealed content under data key '{self.key_id}' fails authentication: the "
                f"stored row was altered. Run `chatledger verify` on its conversation."
            ) from exc
        return plain.decode("utf-8")


@dataclass(frozen=True)
class NewKey:
    """A data key minted for a subject that has none: its row, written with the conversation."""

    key_id: str
    tenant: str
    subject: str
    kek_id: str
    wrapped: bytes


@dataclass(frozen=True)
class Seal:
    """How one write seals: under `key`, or not at all (`PLAIN`)."""

    key: DataKey | None = None
    subject: str | None = None
    new_key: NewKey | None = None

    @property
    def sealed(self) -> bool:
        return self.key is not None

    def events(self, encoded: Sequence[tuple[NewEvent, str]]) -> list[tuple[NewEvent, str]]:
        """`encoded` with the content of each message and creation event sealed."""
        key = self.key
        if key is None:
            return list(encoded)
        return [(item, _seal_event(key, item, text)) for item, text in encoded]

    def metadata(self, meta_text: str) -> str:
        """The conversation row's metadata text, sealed."""
        return meta_text if self.key is None else self.key.seal(meta_text, {})

    def state(self, state_text: str) -> str:
        """The conversation row's state text, sealed."""
        return state_text if self.key is None else self.key.seal(state_text, {})

    def state_of(self, state: Mapping[str, Any], sealed: bool) -> dict[str, Any] | None:
        """A conversation's state (`Conversation.state` or a stored state parsed) with its
        fields opened, `sealed` saying whether the conversation is: sealed under this
        seal's key, or in the clear (a clear conversation's, or one written before
        states were sealed). None when it is sealed and this seal has not its key."""
        found = _sealed_of_metadata(state) if sealed else None
        if found is None:
            return dict(state)
        key = self.key
        if key is None or found.get("key") != key.key_id:
            return None
        return dict(json.loads(key.open_parts(str(found.get("nonce")), str(found.get("data")))))


PLAIN = Seal()


def _seal_event(key: DataKey, item: NewEvent, text: str) -> str:
    if item.kind == "message.recorded":
        m = item.message
        assert m is not None  # encode_events requires it
        # The clear fields as JSON text, built directly (json.dumps of a small
        # dict costs more than the encryption): `role` is one of four words,
        # every other value goes through json.dumps.
        clear = f'"role":"{m.role}"'
        if m.tool_calls:
            calls = [
                {"id": c.id, "name": c.name} if c.id is not None else {"name": c.name}
                for c in m.tool_calls
            ]
            clear += ',"toolCalls":' + json.dumps(calls, separators=(",", ":"))
        if m.tool_call_id is not None:
            clear += ',"toolCallId":' + json.dumps(m.tool_call_id)
        if m.tool_name is not None:
            clear += ',"toolName":' + json.dumps(m.tool_name)
        if m.failed:
            clear += ',"failed":true'
        if m.run_id is not None:
            clear += ',"runId":' + json.dumps(m.run_id)
        if m.conversation_id is not None:
            clear += ',"conversationId":' + json.dumps(m.conversation_id)
        return key.seal_text(text, clear)
    if item.kind == "conversation.created":
        value = json.loads(text)
        return key.seal(text, {k: value[k] for k in _CREATED_CLEAR if k in value})
    if item.kind == "state.changed":
        # Named in the clear, so that its erased marker reads as a state.
        return key.seal_text(text, _STATE_CLEAR)
    if item.kind in ("run.failed", "run.canceled") and item.payload.get("error") is not None:
        # The error may quote sealed content (a tool's exception naming its
        # argument); the stage, usage and counts are the run's structure.
        return key.seal(text, {k: v for k, v in item.payload.items() if k != "error"})
    return text


class Sealer:
    """A store's sealing: its key-encryption key and the data keys it has unwrapped.

    Unwrapped keys are cached by their wrapped bytes, so a KMS is asked once
    per key; whether a key still exists is read from the database on every
    read that opens something, so an erasure holds in every process at once.
    The key a conversation's writes seal under is cached by conversation: a
    write that raced an erasure in another process is refused by the
    database (the conversation's `erased_at`), never stored readable.
    """

    def __init__(self, kek: KeyEncryptionKey, *, cache: int = 4096) -> None:
        if not isinstance(kek, KeyEncryptionKey):
            raise InvalidInputError(
                "kek must be 32 bytes or an object with `id`, `wrap(bytes)` and "
                "`unwrap(bytes)` (a KeyEncryptionKey)."
            )
        self.kek = kek
        self._size = cache
        self._unwrapped: OrderedDict[bytes, DataKey] = OrderedDict()
        self._writing: OrderedDict[tuple[str, str], Seal] = OrderedDict()
        # Ops run in several threads at once (a thread-shared Store, AsyncStore's
        # workers): the caches change under this lock, and the key-encryption
        # key is called outside it.
        self._lock = threading.Lock()

    def data_key(self, key_id: str, wrapped: bytes) -> DataKey:
        with self._lock:
            found = self._unwrapped.get(wrapped)
        if found is None:
            found = DataKey(key_id, _aesgcm()(self.kek.unwrap(wrapped)))
            self._remember(self._unwrapped, wrapped, found)
        return found

    def data_keys(self, ids: set[str], wrapped: Mapping[str, bytes]) -> dict[str, DataKey | None]:
        """The data keys of `ids`, unwrapped, for those that still exist (`wrapped`, as
        read from the database); None for an erased one."""
        return {i: (self.data_key(i, wrapped[i]) if i in wrapped else None) for i in ids}

    def mint(self, tenant: str, subject: str, key_id: str) -> Seal:
        """A new data key for `subject`, to be written with its first conversation."""
        aesgcm = _aesgcm()
        secret = aesgcm.generate_key(bit_length=256)
        kek = self.kek  # once: a `rekey` meanwhile must not pair one's id with the other's bytes
        wrapped = kek.wrap(secret)
        key = DataKey(key_id, aesgcm(secret))
        self._remember(self._unwrapped, wrapped, key)
        return Seal(key, subject, NewKey(key_id, tenant, subject, kek.id, wrapped))

    def rekey(self, kek: KeyEncryptionKey) -> None:
        """Hold `kek` from now on (after `Store.rotate_kek`), forgetting every cached key."""
        with self._lock:
            self.kek = kek
            self._unwrapped.clear()
            self._writing.clear()

    def unwrap_under(self, kek_id: str, wrapped: bytes) -> bytes:
        """A data key's secret, unwrapped by this store's key-encryption key, which must
        be the one that wrapped it (`kek_id`)."""
        if kek_id != self.kek.id:
            raise EncryptionError(
                f"A data key is wrapped by key-encryption key '{kek_id}', and this store holds "
                f"'{self.kek.id}'. Open the store with the key that wrapped it to rotate."
            )
        return self.kek.unwrap(wrapped)

    def open_texts(
        self, texts: Sequence[str], fetch: Callable[[set[str]], Mapping[str, bytes]]
    ) -> list[str]:
        """`texts` with each sealed one opened (or its erased marker), the keys read by
        `fetch` (key ids -> the wrapped keys that still exist) in the caller's read."""
        ids = {key_id_of(t) for t in texts if t.startswith(SEALED_PREFIX)}
        if not ids:
            return list(texts)
        keys = self.data_keys(ids, fetch(ids))
        return [open_text(t, keys) if t.startswith(SEALED_PREFIX) else t for t in texts]

    def writing(self, tenant: str, conversation_id: str) -> Seal | None:
        """The cached seal of a conversation's writes (None: not known yet)."""
        with self._lock:
            return self._writing.get((tenant, conversation_id))

    def remember(self, tenant: str, conversation_id: str, seal: Seal) -> None:
        self._remember(
            self._writing, (tenant, conversation_id), dataclasses.replace(seal, new_key=None)
        )

    def forget(self, tenant: str, conversation_id: str) -> None:
        with self._lock:
            self._writing.pop((tenant, conversation_id), None)

    def _remember(self, cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > self._size:
                cache.popitem(last=False)


# -- opening results -------------------------------------------------------------------


def _sealed_of_message(m: Message) -> Mapping[str, Any] | None:
    extra = m.__pydantic_extra__
    if extra:
        sealed = extra.get("sealed")
        if isinstance(sealed, dict):
            return sealed
    return None


def _sealed_of_metadata(metadata: Any) -> Mapping[str, Any] | None:
    if isinstance(metadata, dict) and len(metadata) == 1:
        sealed = metadata.get("sealed")
        if isinstance(sealed, dict):
            return sealed
    return None


_LEAVES = (str, int, float, bytes, datetime, Position)
"""Values that hold no sealed content: `_visit` stops at them first."""
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _visit(value: Any, found: Callable[[str], None]) -> None:
    if value is None or isinstance(value, _LEAVES):
        return
    if isinstance(value, Message):
        sealed = _sealed_of_message(value)
        if sealed is not None:
            found(str(sealed.get("key")))
    elif isinstance(value, Event):
        if value.kind in SEALED_KINDS and is_sealed(value.payload_json):
            found(key_id_of(value.payload_json))
    elif isinstance(value, list | tuple):
        for item in value:
            _visit(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, Conversation) and value.subject is not None:
            for column in _SEALED_COLUMNS:
                sealed = _sealed_of_metadata(getattr(value, column))
                if sealed is not None:
                    found(str(sealed.get("key")))
        elif isinstance(value, Run) and value.error is not None and is_sealed(value.error):
            found(key_id_of(value.error))
        for name in _field_names(type(value)):
            _visit(getattr(value, name), found)


def sealed_key_ids(value: Any) -> set[str]:
    """The data keys a result holds sealed content under (empty: nothing sealed)."""
    ids: set[str] = set()
    _visit(value, ids.add)
    return ids


def opened(value: T, keys: Mapping[str, DataKey | None]) -> T:
    """`value` with each sealed message, payload and metadata opened under `keys`,
    or an erased marker where its key is None (destroyed)."""
    return _open(value, keys)  # type: ignore[no-any-return]


def _open(value: Any, keys: Mapping[str, DataKey | None]) -> Any:
    if isinstance(value, Message):
        if _sealed_of_message(value) is None:
            return value
        return Message.model_validate_json(_open_message(value, keys))
    if isinstance(value, Event):
        if value.kind not in SEALED_KINDS or not is_sealed(value.payload_json):
            return value
        return _with_payload(value, open_text(value.payload_json, keys))
    if isinstance(value, list):
        if value and all(isinstance(m, Message) for m in value):
            return _open_messages(value, keys)
        return [_open(item, keys) for item in value]
    if isinstance(value, tuple):
        return tuple(_open(item, keys) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            item = getattr(value, f.name)
            new = _open(item, keys)
            if new is not item:
                changes[f.name] = new
        if isinstance(value, Conversation) and value.subject is not None:
            for column in _SEALED_COLUMNS:
                sealed = _sealed_of_metadata(getattr(value, column))
                if sealed is not None:
                    changes[column] = json.loads(_open_sealed(sealed, lambda: {}, keys))
        elif isinstance(value, Run) and value.error is not None and is_sealed(value.error):
            key_id, nonce, data, _ = split_sealed(value.error)
            key = keys.get(key_id)
            changes["error"] = ERASED_CONTENT if key is None else key.open_parts(nonce, data)
        return dataclasses.replace(value, **changes) if changes else value
    return value


def _open_messages(messages: list[Message], keys: Mapping[str, DataKey | None]) -> list[Message]:
    """A list of messages opened with one parse of the opened ones."""
    sealed = [i for i, m in enumerate(messages) if _sealed_of_message(m) is not None]
    if not sealed:
        return messages
    opened_ = load_messages([_open_message(messages[i], keys) for i in sealed])
    out = list(messages)
    for i, m in zip(sealed, opened_, strict=True):
        out[i] = m
    return out


def _open_message(m: Message, keys: Mapping[str, DataKey | None]) -> str:
    """A parsed sealed message's plaintext JSON (or its erased marker)."""
    sealed = _sealed_of_message(m)
    assert sealed is not None

    def clear() -> dict[str, Any]:
        fields = m.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        fields.pop("sealed", None)
        return fields

    return _open_sealed(sealed, clear, keys)


def _open_sealed(
    sealed: Mapping[str, Any],
    clear: Callable[[], dict[str, Any]],
    keys: Mapping[str, DataKey | None],
) -> str:
    """A `"sealed"` object's plaintext, or the erased marker of its `clear` fields."""
    key = keys.get(str(sealed.get("key")))
    if key is not None:
        return key.open_parts(str(sealed.get("nonce")), str(sealed.get("data")))
    return _marker(clear())


def _marker(clear: Mapping[str, Any]) -> str:
    """The erased marker of a sealed value whose key is gone, from its clear fields."""
    if "role" in clear:
        marker = {**clear, "content": ERASED_CONTENT, "erased": True}
    elif "stage" in clear:  # a run's end
        marker = {**clear, "error": ERASED_CONTENT, "erased": True}
    elif clear.get("kind") == "state.changed":
        marker = {"state": {"erased": True}, "erased": True}
    elif not clear:  # a metadata or state column
        marker = {"erased": True}
    else:
        marker = {**clear, "metadata": {"erased": True}, "erased": True}
    return json.dumps(marker, separators=(",", ":"), ensure_ascii=False)


def _with_payload(event: Event, payload: str) -> Event:
    """`event` with another payload text (a copy: events are frozen)."""
    new = copy.copy(event)
    object.__setattr__(new, "payload_json", payload)
    return new


_a2b = binascii.a2b_base64


def split_sealed(text: str) -> tuple[str, str, str, str]:
    """A sealed text's key id, base64 nonce and data, and the JSON of its clear fields.

    `DataKey.seal` writes one layout, read here by position; any other
    spelling of the same JSON is parsed as JSON.
    """
    end = _layout_end(text)
    if end:
        rest = text[end + 2 :]
        return text[18:54], text[65:81], text[91:end], "{" + rest[1:] if rest != "}" else "{}"
    envelope = json.loads(text)
    sealed = envelope.pop("sealed")
    return (
        str(sealed.get("key")),
        str(sealed.get("nonce")),
        str(sealed.get("data")),
        json.dumps(envelope, separators=(",", ":"), ensure_ascii=False),
    )


def _layout_end(text: str) -> int:
    """Where the data of `DataKey.seal`'s layout ends (0: another layout)."""
    if text[11:18] == '"key":"' and text[54:65] == '","nonce":"' and text[81:91] == '","data":"':
        end = text.find('"', 91)
        if end > 0 and text[end + 1 : end + 2] == "}":
            return end
    return 0


def open_text(text: str, keys: Mapping[str, DataKey | None]) -> str:
    """A sealed text's plaintext, or its erased marker when its key is None (gone)."""
    end = _layout_end(text)
    if end:  # the common case, without building the clear fields' JSON
        key = keys.get(text[18:54])
        if key is not None:
            return key.open_parts(text[65:81], text[91:end])
    key_id, nonce, data, clear_json = split_sealed(text)
    sealed = {"key": key_id, "nonce": nonce, "data": data}
    return _open_sealed(sealed, lambda: dict(json.loads(clear_json)), keys)


def key_id_of(text: str) -> str:
    """A sealed text's key id."""
    return (
        text[18:54] if text[11:18] == '"key":"' and text[54:56] == '",' else split_sealed(text)[0]
    )


_KEY_AT = SEALED_PREFIX + '"key":"'
"""How a sealed text of `DataKey.seal`'s layout begins: its key id follows."""


def key_ids_of(texts: Iterable[str]) -> list[str | None]:
    """Each text's key id (None: in the clear), in one pass (a read's every row)."""
    return [
        t[18:54]
        if t.startswith(_KEY_AT) and t[54:56] == '",'
        else (key_id_of(t) if t.startswith(SEALED_PREFIX) else None)
        for t in texts
    ]


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def kek_for(kek: KeyEncryptionKey | bytes) -> KeyEncryptionKey:
    """An explicit key-encryption key: 32 bytes (a `LocalKek`) or a `KeyEncryptionKey`."""
    if isinstance(kek, bytes | bytearray):
        return LocalKek(bytes(kek))
    if not isinstance(kek, KeyEncryptionKey):
        raise InvalidInputError(
            "A key-encryption key is 32 bytes or an object with `id`, `wrap(bytes)` and "
            "`unwrap(bytes)` (a KeyEncryptionKey)."
        )
    return kek


def sealer_for(kek: KeyEncryptionKey | bytes | None) -> Sealer | None:
    """The sealer of a store opened with `kek` (None: the environment's, if any)."""
    if kek is None:
        found = kek_from_env()
        return None if found is None else Sealer(found)
    if isinstance(kek, bytes | bytearray):
        return Sealer(LocalKek(bytes(kek)))
    return Sealer(kek)
