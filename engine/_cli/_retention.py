"""`chatledger retention set|show|clear|run`: retention policies and the pass a
scheduler runs (docs/erasure.md, "Retention")."""

from __future__ import annotations

import argparse
from typing import Any

from chatledger.engine._cli._common import (
    EXIT_ERROR,
    counted,
    open_store,
    print_json,
    print_table,
    progress,
)


def set_policy(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        policy = store.tenant(args.tenant).retention.set(args.idle_days, args.action)
    if args.json:
        print_json(_policy(policy))
        return 0
    print(
        f"Tenant '{policy.tenant}': conversations idle for {counted(policy.idle_days, 'day')} are "
        + ("erased." if policy.action == "erase" else "exported, then erased.")
    )
    return 0


def _policy(policy: Any) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {"tenant": policy.tenant, "idleDays": policy.idle_days, "action": policy.action}


def show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        policy = store.tenant(args.tenant).retention.get()
    if args.json:
        print_json(_policy(policy))
    elif policy is None:
        print(f"Tenant '{args.tenant}' has no retention policy: nothing is erased for idleness.")
    else:
        print(
            f"Tenant '{policy.tenant}': {policy.action} after {counted(policy.idle_days, 'idle day')}."
        )
    return 0


def clear(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        had = store.tenant(args.tenant).retention.clear()
    print(
        f"Tenant '{args.tenant}': retention policy removed."
        if had
        else f"Tenant '{args.tenant}' had no retention policy."
    )
    return 0


def run(args: argparse.Namespace) -> int:
    with open_store(args) as store, progress("applying retention", unit=" subjects") as shown:
        report = store.run_retention(
            tenant=args.tenant,
            export_dir=args.export_dir,
            dry_run=args.dry_run,
            progress=shown.step,
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
        if report.subjects:
            done = (
                len(report.subjects) if report.dry_run else sum(s.erased for s in report.subjects)
            )
            failed = f"; {counted(len(report.failed), 'subject')} failed" if report.failed else ""
            print(
                f"{verb.capitalize()} {counted(done, 'subject')} of "
                f"{counted(len(report.plans), 'tenant')}{failed}."
            )
        for plan in report.plans:
            if plan.active:
                print(
                    f"Tenant '{plan.tenant}': {counted(len(plan.active), 'subject')} kept: an "
                    f"idle conversation of each has an active one beside it."
                )
            if plan.clear:
                stored = "is" if len(plan.clear) == 1 else "are"
                print(
                    f"Tenant '{plan.tenant}': {counted(len(plan.clear), 'idle conversation')} "
                    f"{stored} stored in the clear and cannot be erased (set CHATLEDGER_KEK "
                    f"so that new ones are sealed)."
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
