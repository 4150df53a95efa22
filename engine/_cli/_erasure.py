"""`chatledger erase`: destroy a subject's data key (docs/erasure.md)."""

from __future__ import annotations

import argparse

from engine._cli._common import open_store, print_json


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
            f"{len(erasure.conversation_ids)} conversations read as erased. Nothing to do."
        )
    else:
        print(
            f"Erased subject '{erasure.subject}': data key {erasure.key_id} destroyed, "
            f"{len(erasure.conversation_ids)} conversations now read as erased."
        )
        for conversation_id in erasure.conversation_ids:
            print(f"  {conversation_id}")
    return 0
