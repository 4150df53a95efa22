"""The partition-ready schema (0004/0005) against the schema before it, paired, on Postgres.

    git worktree add --detach ../wt-before 871a9a6
    python bench/bench_schema_ab.py [--before-tree ../wt-before] [--new-tree .] [--rounds 10]
        [--storage-counts 300,5,100]

Three sides, each the Postgres workloads of bench/bench_store.py measured as
a ratio against the raw driver in the same process (`RawPostgres` and
`Ours` of that side's own bench_store.py, taking turns as its `interleaved`
helpers do):

- before: the tree at 871a9a6 (schema revision 0003), imported from
  `--before-tree` (PYTHONPATH);
- new: this tree, or `--new-tree` (a clean checkout of a commit, when this
  working tree holds changes not to be measured): migrations 0004 and 0005;
- new-8-partitions: the same tree with CHATLEDGER_BENCH_PARTITIONS=8
  (`Store.migrate(partitions=8)` hash-partitions the events and head-view
  tables).

Each (round, side) is one child process with its own throwaway database.
Every round runs the three sides back to back, in an order rotated from
round to round, and divides each of the new sides' ratios by the before
side's of the same round: the machine's load moves all three sides of a
round alike, so the paired quotient keeps what the schema changed and
loses most of what the machine did. The report gives per measure the
median ratio of each side, and the median of the paired quotients with a
bootstrap 90% interval; "within 5%" means that median is >= 0.95 for a
rate (<= 1.05 for a time or a size).

Storage hardly moves with the machine's load, so after the rounds one more
child a side sizes it at bench_store.py's own counts (or `--storage-counts`,
calls,rounds,workloads), with what each further message cost between the
rounds' databases and that one. Results go to bench/RESULTS.md; a storage
pass at other counts than bench_store's to a section of its own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
MAIN = HERE.parent.parent
BEFORE_COMMIT = "871a9a6"
SECTION = "Partition-ready schema against the schema before it"

# Counts as bench_store.py --quick: 100 calls x 3 rounds (30 workloads x 3).
COUNT, ROUNDS, WORKLOADS = 100, 3, 30
# bench_store.py's own (full) counts, the storage pass's default: 300 x 5, 100 x 5.
FULL_COUNTS = (300, 5, 100)
LOAD_CALLS, LOAD_ROUNDS = 5, 4  # 20 loads a contender, taking turns 5 at a time

# (key, label, kind): a rate is better higher, a time or a size lower.
MEASURES = [
    ("chat_loop", "chat-loop append, 1 message/transaction (msg/s ratio)", "rate"),
    ("batched", "batched append, 10 messages/call (calls/s ratio)", "rate"),
    ("workload", "workload with creation: new conversation + 2 turns of 10 (ratio)", "rate"),
    ("load", "load a 1,000-message head history, cold (time ratio)", "time"),
    ("storage", "storage per message, every chatledger table and index (bytes ratio)", "bytes"),
    (
        "storage5",
        "storage per message, bench_store's five tables (bytes ratio)",
        "bytes",
    ),
    (
        "storage_net",
        "storage per message, every table, less the empty schema's size (chatledger bytes)",
        "bytes",
    ),
]
FIVE_TABLES = [
    "chatledger_conversations",
    "chatledger_branches",
    "chatledger_events",
    "chatledger_runs",
    "chatledger_view_entries",
]


# -- the child: one side, one round ----------------------------------------------------------


def _table_bytes(conn: Any) -> dict[str, int]:
    """Bytes of each chatledger table with its indexes, a partitioned one's partitions summed."""
    rows = conn.execute(
        """
        SELECT c.relname,
               CASE WHEN c.relkind = 'p'
                    THEN (SELECT sum(pg_total_relation_size(t.relid))
                            FROM pg_partition_tree(c.oid) AS t)
                    ELSE pg_total_relation_size(c.oid) END
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
           AND NOT c.relispartition AND c.relname LIKE 'chatledger\\_%'
           AND c.relname <> 'chatledger_alembic_version'
        """
    ).fetchall()
    conn.commit()
    return {name: int(size) for name, size in rows}


def child(tree: str, counts: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Measure one side: this process imports bench_store and store from `tree` (PYTHONPATH).

    `counts`: calls, rounds and workloads, `--quick`'s unless given (the storage pass's).
    """
    import uuid

    import psycopg

    if (Path(tree) / "chatledger").is_dir():
        import chatledger

        chatledger.__path__.append(tree)  # the side's own store/, engine/ as chatledger.*
        from chatledger import store
    else:  # a tree from before the one import package (docs/adr/0031), as 871a9a6
        store = importlib.import_module("store")
    from bench import bench_store as bs
    from bench._common import libpq, postgres_database

    for module in (store, bs):  # the side's own code, not the installed tree's
        if not Path(module.__file__).resolve().is_relative_to(Path(tree).resolve()):
            raise SystemExit(f"{module.__name__} imported from {module.__file__}, not {tree}")
    count, rounds, workloads = counts or (COUNT, ROUNDS, WORKLOADS)
    started = time.perf_counter()
    out: dict[str, Any] = {"load_average": os.getloadavg()[0]}
    with postgres_database("chatledger_ab") as url:
        raw = bs.RawPostgres(url)
        ours = bs.Ours(url)  # honours CHATLEDGER_BENCH_PARTITIONS on the new tree
        try:
            with psycopg.connect(libpq(url)) as conn:  # the migrated schema, no rows yet
                empty = sum(_table_bytes(conn).values())
            raw_conv = str(uuid.uuid4())
            our_conv = ours.ledger.create_conversation().id
            for _ in range(10):  # connections and statement caches warm on both sides
                raw.append(raw_conv)
                ours.append(our_conv)

            # As bench_store.run_backend: the chat loop, then batches of ten.
            for key, pairs, n in [
                (
                    "chat_loop",
                    [
                        ("raw", lambda: raw.append(raw_conv)),
                        ("ours", lambda: ours.append(our_conv)),
                    ],
                    count,
                ),
                (
                    "batched",
                    [
                        ("raw", lambda: raw.append_batch(raw_conv)),
                        ("ours", lambda: ours.append_batch(our_conv)),
                    ],
                    count,
                ),
                # As bench_store.round_two: a new conversation and two turns of ten.
                ("workload", [("raw", raw.workload), ("ours", ours.workload)], workloads),
            ]:
                rates = bs.interleaved(pairs, n, rounds)
                out[key] = rates["ours"] / rates["raw"]
                out[f"{key}_raw"], out[f"{key}_ours"] = rates["raw"], rates["ours"]

            # As bench_store.run_backend: a 1,000-message head on each side, loaded
            # cold; here the two take turns (interleaved_times) instead of one after
            # the other, so a burst of load lands on both.
            raw_head, our_head = str(uuid.uuid4()), ours.ledger.create_conversation().id
            for _ in range(100):
                raw.append_batch(raw_head)
            bs.grow(ours.ledger, our_head, 1000)
            assert len(raw.load(raw_head)) == 1000 and len(ours.load(our_head)) == 1000
            times = bs.interleaved_times(
                [("raw", lambda: raw.load(raw_head)), ("ours", lambda: ours.load(our_head))],
                LOAD_CALLS,
                LOAD_ROUNDS,
            )
            raw_t, our_t = statistics.median(times["raw"]), statistics.median(times["ours"])
            out["load"], out["load_raw_ms"], out["load_ours_ms"] = (
                our_t / raw_t,
                raw_t * 1000,
                our_t * 1000,
            )

            # Storage per message, both sides holding the same mix of messages,
            # a partitioned table's partitions summed.
            raw_bytes = raw.bytes_per_message()
            with psycopg.connect(libpq(url)) as conn:
                (messages,) = conn.execute(
                    "SELECT count(*) FROM chatledger_events WHERE kind = 'message.recorded'"
                ).fetchone()  # type: ignore[misc]
                sizes = _table_bytes(conn)
                (revision,) = conn.execute(
                    "SELECT version_num FROM chatledger_alembic_version"
                ).fetchone()  # type: ignore[misc]
                (partitions,) = conn.execute(
                    "SELECT count(*) FROM pg_inherits "
                    "WHERE inhparent = 'chatledger_events'::regclass"
                ).fetchone()  # type: ignore[misc]
            out["storage"] = sum(sizes.values()) / messages / raw_bytes
            out["storage5"] = sum(sizes.get(t, 0) for t in FIVE_TABLES) / messages / raw_bytes
            out["storage_raw_bytes"] = raw_bytes
            out["storage_ours_bytes"] = sum(sizes.values()) / messages
            out["storage5_ours_bytes"] = sum(sizes.get(t, 0) for t in FIVE_TABLES) / messages
            out["storage_net"] = (sum(sizes.values()) - empty) / messages
            out["storage_empty_bytes"] = empty
            out["messages"] = messages
            out["tables"] = sorted(sizes)
            out["revision"], out["partitions"] = revision, partitions
        finally:
            ours.store.close()
            raw.conn.close()
    out["seconds"] = time.perf_counter() - started
    return out


# -- the parent: rounds of paired sides -----------------------------------------------------


def sides(before_tree: Path, new_tree: Path) -> list[tuple[str, Path, dict[str, str]]]:
    return [
        ("before", before_tree, {}),
        ("new", new_tree, {}),
        ("new-8-partitions", new_tree, {"CHATLEDGER_BENCH_PARTITIONS": "8"}),
    ]


def commit_of(tree: Path) -> str:
    """The short commit of a checkout, marked when its library code has local changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "store", "engine", "migrations"):
        commit += " + uncommitted changes in store/, engine/ or migrations/"
    return commit


def run_side(
    tree: Path, extra: dict[str, str], counts: tuple[int, int, int] | None = None
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "CHATLEDGER_BENCH_PARTITIONS"}
    env.update(extra, PYTHONPATH=str(tree))
    # -P: the script's own directory (this tree's bench/) is not put on sys.path.
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            str(HERE),
            "--child",
            str(tree),
            *(["--counts", ",".join(map(str, counts))] if counts else []),
        ],
        env=env,
        cwd=str(tree),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child for {tree} {extra} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bootstrap(values: list[float], rng: random.Random, draws: int = 5000) -> tuple[float, float]:
    """A percentile bootstrap 90% interval of the median of `values`."""
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(draws * 0.05)], medians[int(draws * 0.95) - 1]


def verdict(kind: str, median: float, interval: tuple[float, float]) -> str:
    lo, hi = interval
    if kind == "rate":
        ok, inside, edge = median >= 0.95, lo >= 0.95, f"{lo:.3f}"
    else:
        ok, inside, edge = median <= 1.05, hi <= 1.05, f"{hi:.3f}"
    if not ok:
        return "NOT within 5%"
    if inside:
        return "within 5% (interval too)"
    return f"within 5% (interval reaches {edge})"


def summarize(results: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Per measure: each side's median ratio; each new side's paired quotient, interval, verdict."""
    rng = random.Random(seed)
    summary = []
    for key, label, kind in MEASURES:
        row: dict[str, Any] = {"key": key, "label": label, "kind": kind}
        for side in ("before", "new", "new-8-partitions"):
            row[side] = statistics.median(r["sides"][side][key] for r in results)
        for side in ("new", "new-8-partitions"):
            quotients = [r["sides"][side][key] / r["sides"]["before"][key] for r in results]
            median = statistics.median(quotients)
            interval = bootstrap(quotients, rng)
            row[f"{side} q"] = median
            row[f"{side} interval"] = interval
            row[f"{side} verdict"] = verdict(kind, median, interval)
            row[f"{side} quotients"] = quotients
        summary.append(row)
    return summary


def shown(key: str, value: float) -> str:
    """A side's figure: a ratio to the raw driver, or bytes (storage_net)."""
    return f"{value:.0f} B" if key == "storage_net" else f"{value:.3f}x"


def summary_table(summary: list[dict[str, Any]]) -> str:
    lines = [
        "| measure | before (0003) | new | new, 8 partitions "
        "| new / before, paired [90% interval] | verdict "
        "| 8 partitions / before, paired [90% interval] | verdict |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for row in summary:
        cells = [
            row["label"],
            *(shown(row["key"], row[s]) for s in ("before", "new", "new-8-partitions")),
        ]
        for side in ("new", "new-8-partitions"):
            lo, hi = row[f"{side} interval"]
            cells += [f"{row[f'{side} q']:.3f} [{lo:.3f}, {hi:.3f}]", row[f"{side} verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rounds_table(results: list[dict[str, Any]]) -> str:
    keys = [k for k, _, _ in MEASURES]
    lines = [
        "| round | side (in run order) | load avg | " + " | ".join(keys) + " | child s |",
        "|---|---|---:|" + "---:|" * len(keys) + "---:|",
    ]
    for r in results:
        for side in r["order"]:
            m = r["sides"][side]
            lines.append(
                f"| {r['round'] + 1} | {side} | {m['load_average']:.2f} | "
                + " | ".join(shown(k, m[k]) for k in keys)
                + f" | {m['seconds']:.0f} |"
            )
    return "\n".join(lines)


def storage_heading(counts: Sequence[int]) -> str:
    calls, rounds, workloads = counts
    whose = "bench_store.py's own (full) counts" if tuple(counts) == FULL_COUNTS else "counts"
    return (
        f"Storage at {whose}: after the rounds, one more child a side with {calls} calls x "
        f"{rounds} rounds of appends and of batches and {workloads} x {rounds} workloads"
    )


def storage_table(results: list[dict[str, Any]], full: dict[str, dict[str, Any]]) -> str:
    """The storage pass, against the rounds' smaller databases."""
    lines = [
        "| side | messages | chatledger bytes per message | ratio to the raw driver "
        "| / before | verdict | each further message (bytes) |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for side in ("before", "new", "new-8-partitions"):
        big = full[side]
        # The rounds' databases hold the same messages; their sizes differ by what
        # autovacuum had done (free-space and visibility maps) when sized.
        small = statistics.median_low(
            (
                r["sides"][side]["storage_ours_bytes"] * r["sides"][side]["messages"],
                r["sides"][side]["messages"],
            )
            for r in results
        )
        further = (big["storage_ours_bytes"] * big["messages"] - small[0]) / (
            big["messages"] - small[1]
        )
        if side == "before":
            cells = ["", ""]
        else:
            q = big["storage"] / full["before"]["storage"]
            cells = [f"{q:.3f}", "within 5%" if q <= 1.05 else "NOT within 5%"]
        lines.append(
            f"| {side} | {big['messages']} | {big['storage_ours_bytes']:.0f} "
            f"| {big['storage']:.3f}x | " + " | ".join(cells) + f" | {further:.0f} |"
        )
    return "\n".join(lines)


def absolute_table(results: list[dict[str, Any]]) -> str:
    """Each side's median absolute figures, raw driver and chatledger, for scale."""
    rows = [
        ("chat-loop append (msg/s)", "chat_loop_raw", "chat_loop_ours", "{:.0f}"),
        ("batched append (calls/s)", "batched_raw", "batched_ours", "{:.0f}"),
        ("workload with creation (workloads/s)", "workload_raw", "workload_ours", "{:.1f}"),
        ("load a 1,000-message head (ms)", "load_raw_ms", "load_ours_ms", "{:.1f}"),
        ("storage per message (bytes)", "storage_raw_bytes", "storage_ours_bytes", "{:.0f}"),
    ]
    names = ("before", "new", "new-8-partitions")
    extra = ["| chatledger's tables, migrated and empty (KiB) | "]
    extra[0] += (
        " | ".join(
            "- / {:.0f}".format(
                statistics.median(r["sides"][s]["storage_empty_bytes"] for r in results) / 1024
            )
            for s in names
        )
        + " |"
    )
    extra.append("| chatledger messages when sized | ")
    extra[1] += (
        " | ".join(
            "- / {:.0f}".format(statistics.median(r["sides"][s]["messages"] for r in results))
            for s in names
        )
        + " |"
    )
    lines = [
        "| measure (median over rounds) | "
        + " | ".join(f"{s}: raw / chatledger" for s in names)
        + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, raw_key, our_key, fmt in rows:
        cells = []
        for s in names:
            raw = statistics.median(r["sides"][s][raw_key] for r in results)
            ours = statistics.median(r["sides"][s][our_key] for r in results)
            cells.append(f"{fmt.format(raw)} / {fmt.format(ours)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines + extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", metavar="TREE", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    parser.add_argument(
        "--storage-counts",
        default=",".join(map(str, FULL_COUNTS)),
        help="calls,rounds,workloads of the storage pass (default bench_store's: %(default)s)",
    )
    parser.add_argument(
        "--before-tree",
        default=str(MAIN.parent / "wt-before"),
        help=f"a checkout of {BEFORE_COMMIT} (git worktree add --detach ../wt-before "
        f"{BEFORE_COMMIT}); default %(default)s",
    )
    parser.add_argument(
        "--new-tree",
        default=str(MAIN),
        help="the checkout measured as new (default: this tree, %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds (default 10)")
    parser.add_argument("--seed", type=int, default=15, help="bootstrap seed (default 15)")
    parser.add_argument("--save", help="also write every child's figures to this JSON file")
    parser.add_argument("--replay", help="report from a --save file instead of measuring")
    args = parser.parse_args()
    if args.child:
        counts = tuple(map(int, args.counts.split(","))) if args.counts else None
        print(json.dumps(child(args.child, counts)))
        return 0

    sys.path.insert(0, str(MAIN))
    from bench._common import machine, write_section

    before_tree = Path(args.before_tree).resolve()
    new_tree = Path(args.new_tree).resolve()
    if args.replay:
        with open(args.replay) as saved:
            run = json.load(saved)
    else:
        if not (before_tree / "bench" / "bench_store.py").exists():
            raise SystemExit(
                f"no checkout at {before_tree}: git worktree add --detach {before_tree} "
                f"{BEFORE_COMMIT}"
            )
        os.chdir(new_tree)  # machine() names the commit of the tree measured as new
        run = {
            "machine": machine(),
            "before_commit": commit_of(before_tree),
            "new_commit": commit_of(new_tree),
            "new_tree_is_this_tree": new_tree == MAIN,
            "results": [],
        }
        started = time.perf_counter()
        all_sides = sides(before_tree, new_tree)
        save = args.save or os.path.join(tempfile.gettempdir(), "bench_schema_ab.json")
        for r in range(args.rounds):
            order = all_sides[r % 3 :] + all_sides[: r % 3]
            figures = {}
            for name, tree, extra in order:
                figures[name] = run_side(tree, extra)
                print(
                    f"round {r + 1}/{args.rounds} {name}: "
                    + " ".join(f"{k}={shown(k, figures[name][k])}" for k, _, _ in MEASURES)
                    + f" ({figures[name]['seconds']:.0f} s)",
                    flush=True,
                )
            run["results"].append({"round": r, "order": [n for n, _, _ in order], "sides": figures})
            run["seconds"] = time.perf_counter() - started
            with open(save, "w") as out:
                json.dump(run, out, indent=1)
        # Storage at --storage-counts (bench_store.py's own by default): one child
        # a side, since storage hardly moves with the machine's load.
        storage_counts = tuple(map(int, args.storage_counts.split(",")))
        run["full"], run["storage_counts"] = {}, storage_counts
        for name, tree, extra in all_sides:
            run["full"][name] = run_side(tree, extra, storage_counts)
            print(f"storage pass {name}: {run['full'][name]['storage']:.3f}x", flush=True)
        run["seconds"] = time.perf_counter() - started
        with open(save, "w") as out:
            json.dump(run, out, indent=1)
        print(f"figures saved to {save}")

    results = run["results"]
    storage_counts = tuple(run.get("storage_counts", FULL_COUNTS))
    summary = summarize(results, args.seed)
    table = summary_table(summary)
    print("\n" + table)
    storage: list[str] = []
    if "full" in run:
        storage = [
            storage_heading(storage_counts) + ", sized as above. The last column is what "
            "each further message cost, between the rounds' databases and this one: "
            "(bytes here - bytes there) / (messages here - messages there), every table; "
            "what it leaves out is the fixed cost of the tables and their partitions.",
            "",
            storage_table(results, run["full"]),
            "",
        ]
        print("\n" + storage[2])
    first = results[0]["sides"]
    minutes = run["seconds"] / 60
    commands = f"`git worktree add --detach ../wt-before {BEFORE_COMMIT}`"
    flags = f" --rounds {len(results)}"
    if not run["new_tree_is_this_tree"]:
        commands += f", `git worktree add --detach ../wt-new {run['new_commit']}`"
        flags += " --new-tree ../wt-new"
    if storage_counts != FULL_COUNTS:
        flags += " --storage-counts " + ",".join(map(str, storage_counts))
    commands += f", then `python bench/bench_schema_ab.py{flags}`"
    if run["new_tree_is_this_tree"]:
        commands += f" in a checkout of {run['new_commit']}"
    body = [
        "Machine: " + "; ".join(f"{k} {v}" for k, v in run["machine"].items()),
        "",
        f"Commands: {commands} ({len(results)} paired rounds, bootstrap seed {args.seed}; "
        f"the whole run took {minutes:.1f} minutes).",
        "",
        f"Sides: before = {run['before_commit']} (schema revision "
        f"{first['before']['revision']}), new = {run['new_commit']} (revision "
        f"{first['new']['revision']}, not partitioned), new with 8 partitions "
        f"(`CHATLEDGER_BENCH_PARTITIONS=8`, {first['new-8-partitions']['partitions']} partitions "
        "of chatledger_events). Each side of each round is one process with its own "
        "database, running that tree's bench_store.py `RawPostgres` and `Ours` with the "
        f"counts of `--quick` ({COUNT} calls x {ROUNDS} rounds of appends and of batches, "
        f"{WORKLOADS} x {ROUNDS} workloads; {LOAD_CALLS * LOAD_ROUNDS} head loads a contender "
        "taking turns); every figure is chatledger's against the raw driver in the same "
        "process. A round runs the three sides back to back, the order rotated each round; "
        "the paired quotient is a new side's figure over the before side's in the same "
        "round (above 1 is faster for a rate, slower or larger for a time or a size). "
        '"Within 5%": the median paired quotient is >= 0.95 for a rate, <= 1.05 for a time '
        "or a size; the interval is a percentile bootstrap of that median (5,000 draws). "
        "Storage sums a partitioned table's partitions, and every chatledger table "
        "(the first storage row; the tables of the new schema are "
        + ", ".join(first["new"]["tables"])
        + ") or bench_store's five (the second row, the tables bench_store sizes); "
        "the third row is chatledger's bytes per message "
        "(not a ratio) less the size of its tables just migrated, before any row: the fixed "
        "cost of a table's pages and indexes, which 8 partitions multiply and a small "
        "database feels most. Storage in the rounds is taken after this script's workloads "
        f"(about {first['new']['messages']} messages); bench_store's own counts write more, "
        "and the storage pass below sizes those.",
        "",
        table,
        "",
        *storage,
        "Median absolute figures of each side (raw driver / chatledger):",
        "",
        absolute_table(results),
        "",
        "Every round (ratios to the raw driver; load avg is the 1-minute load average "
        "when the child started):",
        "",
        rounds_table(results),
    ]
    # A storage pass at other counts than bench_store's keeps a section of its own.
    section = SECTION
    if storage_counts != FULL_COUNTS:
        section += ", storage at " + ",".join(map(str, storage_counts))
    write_section(str(MAIN / "bench" / "RESULTS.md"), section, "\n".join(body))
    print(f"\nwhole run: {minutes:.1f} minutes; written to bench/RESULTS.md ({section})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
