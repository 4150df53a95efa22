"""Instructions per appended message in the chat loop, counted by valgrind: the
client's cost of one append, without this machine's noise.

    python bench/bench_instructions.py [--python PATH] [--appends 1000]

Process CPU per message moves by 20% or more from run to run on a shared
2-core VM, more than most changes to the write path do. valgrind's callgrind
counts the instructions a process executes, whatever else the machine is
doing: the same program and inputs give the same count to within a fraction
of a percent. This script runs the chat loop of bench_store.py (one message
per append, a new conversation every 20 messages, the four ~1 KB shapes) in a
child process under callgrind twice, with `--appends` and three times as
many, and reports the difference per append: start-up, imports and
migrations cancel out. User-space instructions only: what the kernel does
for a commit's fsync or a socket's send is not counted, nor the server's
work on Postgres.

`--python`: another interpreter whose environment has another version of
chatledger installed (a checkout of an older commit, say), to compare two
trees on this machine: the child imports `chatledger.store`, or `store` in a
tree from before the one import package; its figures are printed, not written.
This tree's go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, postgres_database, write_section

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
PER_CONVERSATION = 20

# The child: the chat loop alone, its store opened and migrated first.
CHILD = """
import json, sys
try:
    from chatledger.store import Message, Store, ToolCall, new_id
except ModuleNotFoundError as error:  # a tree from before the one import package
    if error.name not in ("chatledger", "chatledger.store"):
        raise
    from store import Message, Store, ToolCall, new_id
TEXT = "The quick brown fox jumps over the lazy dog. " * 22
MESSAGES = [
    Message(role="user", content=TEXT),
    Message(role="assistant", tool_calls=[
        ToolCall(id="call-1", name="search", arguments=json.dumps({"q": TEXT[:900]}))]),
    Message(role="tool", tool_call_id="call-1", tool_name="search", content=TEXT),
    Message(role="assistant", content=TEXT),
]
url, count, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = Store.open(url, message_cache=0)
store.migrate()
ledger = store.tenant("bench")
conversation = ""
for k in range(count):
    if k % per == 0:
        conversation = new_id()
        ledger.append_messages(conversation, [MESSAGES[k % 4]], create=True)
    else:
        ledger.append_messages(conversation, [MESSAGES[k % 4]])
(getattr(store, "close", None) or store.dispose)()  # an older tree: dispose
"""


def instructions(python: str, url: str, count: int) -> int:
    """The instructions the child executes, start to end, appending `count` messages."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         python, "-P", "-c", CHILD, url, str(count), str(PER_CONVERSATION)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the child failed under callgrind:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def per_append(python: str, urls: tuple[str, str], appends: int) -> float:
    """Instructions per append: the difference between three times `appends` and
    `appends` (on two fresh databases; both children run at once: counts do not
    depend on the machine's load)."""
    with ThreadPoolExecutor(2) as pool:
        many, few = pool.map(instructions, [python] * 2, urls, [3 * appends, appends])
    return (many - few) / (2 * appends)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    parser.add_argument("--appends", type=int, default=1000)
    args = parser.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        postgres_database("bench_instr_a") as first,
        postgres_database("bench_instr_b") as second,
    ):
        sqlite = (f"sqlite:///{tmp}/a.db", f"sqlite:///{tmp}/b.db")
        rows.append(("SQLite", per_append(args.python, sqlite, args.appends)))
        rows.append(("Postgres", per_append(args.python, (first, second), args.appends)))
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    info = machine()
    body = "\n".join(
        [
            f"`python bench/bench_instructions.py --appends {args.appends}`"
            + ("" if args.python == sys.executable else f" `--python {args.python}`")
            + f": the chat loop of bench_store.py (one message an append, a new conversation "
            f"every {PER_CONVERSATION}) under valgrind's callgrind, {args.appends} and "
            f"{3 * args.appends} appends; user-space instructions per append (the difference), "
            "client side only.",
            "",
            "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + f"; measured python {version}",
            "",
            "| database | instructions per append |",
            "|---|---:|",
            *[f"| {name} | {count:,.0f} |" for name, count in rows],
        ]
    )  # fmt: skip
    print(body)
    if args.python == sys.executable:  # RESULTS.md's machine line names this tree's commit
        write_section(RESULTS, "Instructions per append (callgrind)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
