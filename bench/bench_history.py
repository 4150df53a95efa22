"""Benchmark of the pure history algorithms: normalize_history + sanitize_history.

Run it as a plain script from the repository root:

    python bench/bench_history.py

It builds a history of 100,000 messages, about a fifth of them tool traffic
(assistant tool-call turns and tool results, with missing, misplaced and
duplicate results) and some URL parts (safe and unsafe), and times one
`normalize_history` plus one `sanitize_history` pass over it, and over each of
its ten slices of 10,000 messages (best of several rounds). It prints a table
and exits with status 1 when the 100k/10k time ratio exceeds 12, which would
mean the algorithms are no longer linear.

The 10k time is measured over the ten slices, one after the other, rather
than over one slice repeated, so that both figures come from the same messages
in the same memory; the repeated ("warm") figure is shown for reference. Every
sample handles 100,000 messages in all, and the samples are interleaved, so
that load from other processes on the machine skews both sizes alike.

The history comes from a seeded generator, so every run measures the same
input.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable

from chatledger.store import (
    DataPart,
    Message,
    ToolCall,
    UrlPart,
    normalize_history,
    sanitize_history,
)

SMALL = 10_000
LARGE = 100_000
# Each sample is timed this many times, and the fastest run counts.
ROUNDS = 25
PASSES: dict[str, Callable[[list[Message]], object]] = {
    "normalize": normalize_history,
    "sanitize": sanitize_history,
}
MAX_RATIO = 12.0
SEED = 20240611

_URLS = (
    "https://example.com/image.png",
    "HTTP://example.com/doc.pdf",
    "javascript:alert(1)",
    "file:///etc/passwd",
)


def build_history(size: int, seed: int = SEED) -> list[Message]:
    """A history of exactly `size` messages, about 20% of them tool traffic."""
    rng = random.Random(seed)
    history: list[Message] = []
    # Results held back to be recorded later than they should be (misplaced).
    late: list[Message] = []
    turn = 0
    while len(history) < size:
        turn += 1
        parts = []
        if rng.random() < 0.1:
            parts.append(UrlPart(url=rng.choice(_URLS)))
        if rng.random() < 0.02:
            parts.append(DataPart(media_type="image/png", data="iVBORw0KGgo="))
        if rng.random() < 0.01:
            history.append(Message(role="system", content="Be helpful."))
        history.append(Message(role="user", content=f"question {turn}", parts=parts))
        history.extend(late)
        late = []
        if rng.random() < 0.17:
            ids = [f"call_{turn}_{k}" for k in range(rng.randint(1, 3))]
            arguments = '{"q": "x"}' if rng.random() < 0.97 else '{"q": '
            history.append(
                Message(
                    role="assistant",
                    tool_calls=[ToolCall(id=i, name="search", arguments=arguments) for i in ids],
                )
            )
            for call_id in ids:
                fate = rng.random()
                result = Message(role="tool", tool_call_id=call_id, content="result text")
                if fate < 0.85:
                    history.append(result)
                elif fate < 0.9:
                    history.extend((result, result))  # duplicate
                elif fate < 0.95:
                    late.append(result)  # misplaced after the next user message
                # else: missing, repair synthesizes one
        history.append(Message(role="assistant", content=f"answer {turn}"))
    return history[:size]


def timed(run: Callable[[list[Message]], object], histories: list[list[Message]]) -> float:
    """The time of one call of `run`, averaged over one call per history.

    The garbage collector stays on (its work is part of the cost of a pass),
    but the calls start from a collected heap, so that they do not pay for the
    garbage of the calls timed before them.
    """
    gc.collect()
    start = time.perf_counter()
    for history in histories:
        run(history)
    return (time.perf_counter() - start) / len(histories)


def main() -> int:
    large = build_history(LARGE)
    # Move the history out of the collector's sight: otherwise every
    # gc.collect() below rescans its several hundred thousand objects, which takes
    # longer than the passes themselves. Collections during the passes still happen.
    gc.freeze()
    pieces = LARGE // SMALL
    # Each sample handles LARGE messages in all, so each lasts about as long,
    # and preemption by the scheduler (which a 10 ms run often escapes and a
    # 100 ms one never does) does not skew the ratio.
    samples = {
        # The ten slices of the large history, one after the other: the same
        # messages in the same memory as the large run, so the ratio measures
        # how the passes scale rather than how much of a history stays cached.
        f"{SMALL:,} x{pieces}": [large[k * SMALL : (k + 1) * SMALL] for k in range(pieces)],
        # One slice, ten times: cache-warm after the first run (for reference).
        f"{SMALL:,} warm": [large[:SMALL]] * pieces,
        f"{LARGE:,}": [large],
    }
    best = {(sample, name): float("inf") for sample in samples for name in PASSES}
    # Rounds interleave the samples, so that load from other processes slows
    # them alike.
    for _ in range(ROUNDS):
        for sample, histories in samples.items():
            for name, run in PASSES.items():
                best[sample, name] = min(best[sample, name], timed(run, histories))

    print(f"best of {ROUNDS} rounds, time.perf_counter, garbage collector on")
    header = ("history", "tool %", "normalize s", "sanitize s", "total s", "us/msg")
    print("{:>13} {:>7} {:>12} {:>11} {:>9} {:>7}".format(*header))
    totals = {}
    for sample, histories in samples.items():
        size = len(histories[0])
        tool = sum(1 for h in histories for m in h if m.role == "tool" or m.tool_calls)
        normalize, sanitize = best[sample, "normalize"], best[sample, "sanitize"]
        totals[sample] = normalize + sanitize
        print(
            f"{sample:>13} {tool / (size * len(histories)):>7.1%} {normalize:>12.4f} "
            f"{sanitize:>11.4f} {totals[sample]:>9.4f} {totals[sample] / size * 1e6:>7.2f}"
        )
    small, warm, large_sample = samples
    ratio = totals[large_sample] / totals[small]
    print(f"ratio {LARGE:,}/{SMALL:,}: {ratio:.2f} (limit {MAX_RATIO:g})")
    print(f"ratio {LARGE:,}/{SMALL:,} warm: {totals[large_sample] / totals[warm]:.2f} (reference)")
    if ratio > MAX_RATIO:
        print("FAIL: the time grows faster than the history; something is no longer linear.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
