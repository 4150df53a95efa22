"""`chatledger retention set|show|clear|run`: retention policies and the pass a
scheduler runs (docs/erasure.md, "Retention")."""

from __future__ import annotations

import argparse
from typing import Any

from chatledger.engine._cli._common import EXIT_ERROR, open_store, print_json, print_table


def set_policy(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        policy = store.tenant(args.tenant).set_retention(args.idle_days, args.action)
    print(
        f"Tenant '{policy.tenant}': conversations idle for {policy.idle_days} days are "
        + ("erased." if policy.action == "erase" else "exported, then erased.")
    )
    return 0


def show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        policy = store.tenant(args.tenant).retention()
    if args.json:
        print_json(
            None
            if policy is None
            else {"tenant": policy.tenant, "idleDays": policy.idle_days, "action": policy.action}
        )
    elif policy is None:
        print(f"Tenant '{args.tenant}' has no retention policy: nothing is erased for idleness.")
    else:
        print(f"Tenant '{policy.tenant}': {policy.action} after {policy.idle_days} idle days.")
    return 0


def clear(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        had = store.tenant(args.tenant).clear_retention()
    print(
        f"Tenant '{args.tenant}': retention policy removed."
        if had
        else f"Tenant '{args.tenant}' had no retention policy."
    )
    return 0


def run(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        report = store.run_retention(
            tenant=args.tenant, export_dir=args.export_dir, dry_run=args.dry_run
        )
    if args.json:
        print_json(
            {
                "dryRun": report.dry_run,
                "tenants": [
                    {
                        "tenant": p.tenant,
                        "idleDays": p.policy.idle_days,
                        "action": p.policy.action,
                        "cutoff": p.cutoff.isoformat(),
                        "due": p.due,
                        "keptActive": p.active,
                        "inTheClear": p.clear,
                    }
                    for p in report.plans
                ],
                "subjects": [_outcome(s) for s in report.subjects],
            }
        )
    else:
        verb = "would erase" if report.dry_run else "erased"
        rows = [
            {
                "tenant": s.tenant,
                "subject": s.subject,
                "conversations": len(s.conversation_ids),
                "exported": len(s.exported),
                "done": "failed: " + s.error
                if s.error
                else (verb if s.erased or report.dry_run else ""),
            }
            for s in report.subjects
        ]
        print_table(
            rows,
            ["tenant", "subject", "conversations", "exported", "done"],
            empty="Nothing is due.",
        )
        for plan in report.plans:
            if plan.active:
                print(
                    f"Tenant '{plan.tenant}': {len(plan.active)} subjects kept: an idle "
                    f"conversation of each has an active one beside it."
                )
            if plan.clear:
                print(
                    f"Tenant '{plan.tenant}': {len(plan.clear)} idle conversations are stored in "
                    f"the clear and cannot be erased (open the store with a key-encryption key "
                    f"for new ones)."
                )
    return EXIT_ERROR if report.failed else 0


def _outcome(s: Any) -> dict[str, Any]:
    return {
        "tenant": s.tenant,
        "subject": s.subject,
        "conversationIds": s.conversation_ids,
        "exported": s.exported,
        "erased": s.erased,
        "keptActive": s.active,
        "error": s.error,
    }
