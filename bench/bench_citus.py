"""chatledger on one Postgres node against chatledger on a Citus cluster, in one run.

    python bench/bench_citus.py --citus-url postgresql+psycopg://postgres@127.0.0.1:9700/chatledger
        [--seconds 5] [--rounds 2]

The cluster is the one scripts/citus.sh starts (a coordinator and two workers on
this machine); the one node is the Postgres at `CHATLEDGER_BENCH_POSTGRES_URL`
(default: the machine's own, 127.0.0.1:5432). Both workloads are
bench/bench_writers.py's: writer processes appending one-message turns to
conversations of their own, a new conversation every 20 messages, each writer a
tenant of its own. "The chat loop" is one writer; then 16 at once. Each round
runs both targets back to back, in an order that alternates; the figure is the
median round's messages per second, and the ratio is the cluster's over the one
node's. On the cluster the tables live in a schema of the bench's own, laid out
by `migrate(citus=True)`, dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ADMIN_URL, libpq, machine, postgres_database, write_section
from bench.bench_writers import writers
from chatledger.store import Store

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")


@contextmanager
def citus_schema(url: str) -> Iterator[str]:
    """A schema of the bench's own on the cluster, laid out by tenant; its URL."""
    schema = f"chatledger_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    own = (
        sa.make_url(url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    try:
        with Store.open(own) as store:
            store.migrate(citus=True)
        yield own
    finally:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--citus-url", default=os.environ.get("CHATLEDGER_TEST_CITUS_URL"))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.citus_url:
        parser.error("give --citus-url (or set CHATLEDGER_TEST_CITUS_URL): see scripts/citus.sh")
    admin = os.environ.get("CHATLEDGER_BENCH_POSTGRES_URL", ADMIN_URL)
    rows = []
    with (
        postgres_database("chatledger_citus_ab", admin) as node,
        citus_schema(args.citus_url) as cluster,
    ):
        with Store.open(node) as store:
            store.migrate()
        targets = {"one node": node, "cluster": cluster}
        for count, name in ((1, "the chat loop (1 writer)"), (16, "16 writers")):
            rates: dict[str, list[float]] = {t: [] for t in targets}
            for r in range(args.rounds):
                order = list(targets) if r % 2 == 0 else list(reversed(targets))
                for target in order:
                    got = writers(targets[target], "ours", count, args.seconds)
                    rates[target].append(got["rate"])
            node_rate = statistics.median(rates["one node"])
            cluster_rate = statistics.median(rates["cluster"])
            rows.append(
                (
                    name,
                    f"{node_rate:.0f}",
                    f"{cluster_rate:.0f}",
                    f"{cluster_rate / node_rate:.2f}x",
                )
            )
            print(
                f"{name}: one node {node_rate:.0f} msg/s, cluster {cluster_rate:.0f} msg/s, "
                f"{cluster_rate / node_rate:.2f}x (rounds: {rates})"
            )
    details = machine()
    body = "\n".join(
        [
            f"`python bench/bench_citus.py --seconds {args.seconds} --rounds {args.rounds}`: "
            "bench_writers.py's writers (a tenant each, one-message turns, a new conversation "
            "every 20 messages) on one Postgres node and on a Citus 13 cluster (a coordinator "
            "and two workers, scripts/citus.sh) on the same machine, the rounds alternating; "
            "the median round's messages per second.",
            "",
            "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
            "",
            "| workload | one node msg/s | cluster msg/s | cluster / one node |",
            "|---|---:|---:|---:|",
            *(f"| {' | '.join(row)} |" for row in rows),
        ]
    )
    print(body)
    write_section(RESULTS, "Citus: one node against a three-node cluster on one machine", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
