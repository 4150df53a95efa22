"""Sealing around an operation: the key a write seals under, and opening results.

Both are small programs that yield the steps they need run (an `Op`, a key
lookup; or `Blocking` work, the key-encryption key's calls and decryption)
and return what the caller runs next or gets back; `Store.execute` drives
them with its own `execute`, `AsyncStore.execute` with `await`, so the two
faces share every rule (as they share the `Op`s).

- `preparing`: before a write that stores content (`Op.sealing`), the seal
  of its conversation: cached per conversation, else read from the database
  (its subject's key; for a new conversation, the subject's existing key or
  a newly minted one, written by the op itself).
- `opening`: after any operation, its result with sealed content opened.
  The keys are read from the database each time (cached unwrapped), so a
  key erased in another process is gone here at once; a write's own result
  opens with the key it just sealed under.

The key-encryption key's calls (`wrap`, `unwrap`: a KMS may sit behind them)
and the decryption of what a read returns are `Blocking` steps, run after
the op that read the keys has ended its transaction (a slow KMS holds no
connection) and, by `AsyncStore`, in a worker thread, not on the event loop.
A write's own result opens in place with the key it sealed under (no
key-encryption key call, no I/O, and no more than the caller just passed).
A head read opens what it reads inside its own fast path (`store._ops`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from chatledger.store._crypto import NO_KEY, PLAIN, Seal, Sealer, opened, sealed_key_ids
from chatledger.store._errors import ConflictError, EncryptionError, ErasedError
from chatledger.store._sql import keys as _keys
from chatledger.store._sql.ops import Op, Sealing
from chatledger.store.ids import new_id

__all__ = [
    "Blocking",
    "Program",
    "adrive",
    "drive",
    "executing",
    "needs_opening",
    "opening",
    "preparing",
    "runs_alone",
    "then",
]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Blocking(Generic[T]):
    """A step of a program that needs no database but may block (a KMS call, file
    syncs, decrypting many messages): `drive` runs it in place, `adrive` in a
    worker thread."""

    fn: Callable[[], T]


Program = Generator["Op[Any] | Blocking[Any]", Any, T]
"""Yields the steps it needs run, receives each one's result, returns its own."""


def then(op: Op[T], after: Callable[[T], U]) -> Program[U]:
    """`op`, then `after` of its result: work an operation needs done in this process
    once its transaction has ended (a conflict raised after its commit, a cache
    cleared, a result rebuilt)."""
    done: T = yield op
    return after(done)


def drive(program: Program[T], execute: Callable[[Op[Any]], Any]) -> T:
    """Run `program`, each op it yields by `execute`; an op's error is raised in the
    program, where it may be caught."""
    try:
        op = next(program)
        while True:
            try:
                done = op.fn() if isinstance(op, Blocking) else execute(op)
            except Exception as error:
                op = program.throw(error)
            else:
                op = program.send(done)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        program.close()  # interrupted (a cancellation): the program's cleanups run now


async def adrive(program: Program[T], execute: Callable[[Op[Any]], Awaitable[Any]]) -> T:
    """`drive`, awaiting each op, and each `Blocking` step in a worker thread."""
    try:
        op = next(program)
        while True:
            try:
                if isinstance(op, Blocking):
                    done = await asyncio.to_thread(op.fn)
                else:
                    done = await execute(op)
            except Exception as error:
                op = program.throw(error)
            else:
                op = program.send(done)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        program.close()


def runs_alone(sealer: Sealer | None, op: Op[Any]) -> bool:
    """Whether `executing(sealer, op)` would only run `op` and return its result: a
    write on a store without a key-encryption key (nothing to seal or open, and no
    key minted, whose lost race is what it retries). The faces then run `op` as it
    is, without the program around it (on every append)."""
    return sealer is None and op.write


def executing(sealer: Sealer | None, op: Op[T], *, inside: bool) -> Program[T]:
    """`op`, sealed first when it is a write that stores content and the store has a
    key-encryption key, and its result with sealed content opened: what each face's
    `execute` drives. `inside`: in a caller's transaction.

    A write that minted its subject's data key and lost the race to write it
    (`keys.KeyRaced`: it wrote nothing) is prepared and run once more, under the
    winner's key; not inside a caller's transaction, which the caller retries.
    """
    seal = None
    sealing = op.sealing  # the op it builds has none of its own
    for again in (False, True):
        if sealing is not None and sealer is not None:
            op, seal = yield from preparing(sealer, sealing, remember=not inside)
        try:
            done: T = yield op
        except (ErasedError, ConflictError, EncryptionError) as error:
            if sealing is not None and sealer is not None:
                sealer.forget(sealing.tenant, sealing.conversation_id)
            if again or inside or not isinstance(error, _keys.KeyRaced):
                raise
        else:
            break
    if not needs_opening(sealer, op, done):
        return done
    return (yield from opening(sealer, done, seal, op.tenant))


def preparing(
    sealer: Sealer, s: Sealing[T], *, remember: bool = True
) -> Program[tuple[Op[T], Seal]]:
    """The op of `s`, built with the seal its conversation's content takes, and that seal.

    Without `remember` (inside a caller's transaction, which may roll back),
    a seal read from the database is not kept for later writes: what it was
    read from may never commit, and the conversation id may then be created
    again under another key.
    """
    seal = yield from _seal_of(sealer, s, remember)
    return s.build(seal), seal


def _seal_of(sealer: Sealer, s: Sealing[T], remember: bool) -> Program[Seal]:
    cached = sealer.writing(s.tenant, s.conversation_id)
    if cached is not None:
        return cached
    found: _keys.WriteKey = yield Op(
        f"finding the data key of conversation '{s.conversation_id}'",
        write=False,
        fn=lambda c: _keys.write_key(
            c, s.tenant, s.conversation_id, source=s.source, subject=s.subject
        ),
    )
    seal: Seal
    known: bool
    seal, known = yield Blocking(lambda: _resolved(sealer, s, found))
    if known and remember:
        sealer.remember(s.tenant, s.conversation_id, seal)
    return seal


def _resolved(sealer: Sealer, s: Sealing[Any], found: _keys.WriteKey) -> tuple[Seal, bool]:
    """The seal a write to `s`'s conversation takes, as `found` says, and whether the
    conversation exists (its seal can be remembered). Unwrapping or minting a key
    calls the key-encryption key: a `Blocking` step."""
    if found.exists:
        if found.subject is None:
            return PLAIN, True
        if found.erased or found.key_id is None or found.wrapped is None:
            if s.ends:
                return Seal(subject=found.subject), False
            raise ErasedError(conversation_id=s.conversation_id, subject=found.subject)
        return Seal(sealer.data_key(found.key_id, found.wrapped), found.subject), True
    if not s.create:
        return PLAIN, False  # the op reports the missing conversation
    assert found.subject is not None
    if found.key_id is not None and found.wrapped is not None:
        return Seal(sealer.data_key(found.key_id, found.wrapped), found.subject), False
    return sealer.mint(s.tenant, found.subject, new_id()), False


def needs_opening(sealer: Sealer | None, op: Op[Any], value: object) -> bool:
    """Whether `value`, the result of `op`, holds sealed content to open (or, on a
    store without a key, to refuse). A write's result on such a store is returned
    as it is: the write committed, and raising would invite a retry. An op that
    opens its own result (`Op.opens`, a history read) is not looked through."""
    if op.opens or (sealer is None and op.write):
        return False
    return bool(sealed_key_ids(value))


def opening(
    sealer: Sealer | None, value: U, seal: Seal | None = None, tenant: str | None = None
) -> Program[U]:
    """`value` with its sealed content opened (erased markers where a key is gone),
    with the keys of `tenant` only when given (the op's: `Op.tenant`); a key of
    another tenant is as good as gone."""
    ids = sealed_key_ids(value)
    if not ids:
        return value
    if sealer is None:
        raise EncryptionError(NO_KEY)
    if seal is not None and seal.key is not None and ids == {seal.key.key_id}:
        # A write's own result, under the key it was just sealed with: no I/O.
        return opened(value, {seal.key.key_id: seal.key})
    wrapped: dict[str, bytes] = yield Op(
        "reading data keys", write=False, fn=lambda c: _keys.keys_by_id(c, ids, tenant)
    )
    found: U = yield Blocking(lambda: opened(value, sealer.data_keys(ids, wrapped)))
    return found
