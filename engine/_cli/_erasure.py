"""`chatledger erase` (destroy a subject's data key) and `chatledger rotate-kek`
(re-wrap every data key under a new key-encryption key); docs/erasure.md."""

from __future__ import annotations

import argparse
import os

from chatledger.engine._cli._common import UsageError, counted, open_store, print_json


def erase(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        erasure = store.tenant(args.tenant).erase(args.subject, reason=args.reason)
    if args.json:
        print_json(
            {
                "subject": erasure.subject,
                "keyId": erasure.key_id,
                "conversationIds": erasure.conversation_ids,
                "reason": erasure.reason,
                "already": erasure.already,
            }
        )
    elif erasure.already:
        print(
            f"Subject '{erasure.subject}' was erased before: its "
            f"{counted(len(erasure.conversation_ids), 'conversation')} read as erased. "
            f"Nothing to do."
        )
    else:
        print(
            f"Erased subject '{erasure.subject}': data key {erasure.key_id} destroyed, "
            f"{counted(len(erasure.conversation_ids), 'conversation')} now read as erased."
        )
        for conversation_id in erasure.conversation_ids:
            print(f"  {conversation_id}")
    return 0


def rotate_kek(args: argparse.Namespace) -> int:
    from chatledger.store import LocalKek

    text = os.environ.get("CHATLEDGER_NEW_KEK")
    if not text:
        raise UsageError(
            "Set CHATLEDGER_NEW_KEK to the new key-encryption key (32 bytes, base64 or hex), "
            "and CHATLEDGER_KEK to the current one."
        )
    new = LocalKek.from_text(text, what="CHATLEDGER_NEW_KEK")
    with open_store(args) as store:
        count = store.rotate_kek(new)
    if args.json:
        print_json({"rewrapped": count, "kekId": new.id})
        return 0
    print(
        f"Re-wrapped {counted(count, 'data key')} under key-encryption key '{new.id}'. Run "
        f"every store with the new key from now on (CHATLEDGER_KEK)."
    )
    return 0
