"""Time to first paint of the page's conversation view, at 100 and 5,000 messages.

    python bench/bench_ui.py [--repeats 7] [--record]

On a SQLite file in a temporary directory, one conversation per size (user and
assistant messages alternating), served by `chatledger ui` as a real process
(`--port 0`) and opened in Debian's headless chromium (/usr/bin/chromium) by
playwright, each time in a new page. Reported per size, the median over
`--repeats` loads after one warm-up load: the browser's `first-contentful-paint`
and the navigation's `responseEnd` (the server's whole answer), both from
navigation start, and the size of the HTML. The same page is also fetched with
httpx (the server's time alone, no browser) as a ratio's floor.

`--record` writes the figures to the "The page" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import machine, write_section
from chatledger.store import Message, Store

SIZES = (100, 5_000)
_TIMING = """() => new Promise(resolve => new PerformanceObserver((list, observer) => {
    const paint = list.getEntriesByName('first-contentful-paint')[0];
    if (!paint) return;
    observer.disconnect();
    resolve([paint.startTime, performance.getEntriesByType('navigation')[0].responseEnd]);
}).observe({type: 'paint', buffered: true}))"""


def _conversation(store: Store, size: int) -> str:
    ledger = store.tenant("default")
    conversation = ledger.create_conversation({"title": f"{size} messages"}).id
    messages = [
        Message(role="user" if i % 2 == 0 else "assistant", content=f"message {i} " * 8)
        for i in range(size)
    ]
    ledger.append_messages(conversation, messages)
    return conversation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ui.db'}"
        with Store.open(url) as store:
            store.migrate()
            conversations = {size: _conversation(store, size) for size in SIZES}
        with subprocess.Popen(
            [sys.executable, "-m", "chatledger", "ui", "--database-url", url, "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        ) as server:
            assert server.stdout is not None
            found = re.search(r"http://\S+/ui/", server.stdout.readline())
            assert found, "chatledger ui did not print its URL"
            base = found.group(0)
            rows = []
            try:
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(
                        executable_path="/usr/bin/chromium", args=["--no-sandbox"]
                    )
                    for size, conversation in conversations.items():
                        page_url = f"{base}conversations/{conversation}"
                        paints, answers, fetched = [], [], []
                        for attempt in range(args.repeats + 1):
                            page = browser.new_page()
                            page.goto(page_url, wait_until="load")
                            timing = page.evaluate(_TIMING)
                            shown = page.locator("li.message").count()
                            page.close()
                            start = time.perf_counter()
                            body = httpx.get(page_url, timeout=60).text
                            took = time.perf_counter() - start
                            if attempt:  # the first load warms the server and the browser
                                paints.append(timing[0])
                                answers.append(timing[1])
                                fetched.append(took * 1000)
                        rows.append(
                            f"| {size:,} | {shown} | {len(body) / 1024:.0f} KiB "
                            f"| {statistics.median(fetched):.1f} ms "
                            f"| {statistics.median(answers):.1f} ms "
                            f"| {statistics.median(paints):.1f} ms |"
                        )
                    browser.close()
            finally:
                server.terminate()
                server.communicate(timeout=60)
    table = "\n".join(
        [
            "; ".join(f"{k}: {v}" for k, v in machine().items() if k != "postgres"),
            "",
            f"Median of {args.repeats} loads after a warm-up; chromium headless.",
            "",
            "| messages | shown | HTML | httpx GET | responseEnd | first contentful paint |",
            "|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print(table)
    if args.record:
        write_section("bench/RESULTS.md", "The page", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
