"""Shared plumbing for the benchmarks: throwaway databases, machine details, timing."""

from __future__ import annotations

import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa

ADMIN_URL = os.environ.get(
    "CHATLEDGER_BENCH_POSTGRES_URL",
    os.environ.get(
        "CHATLEDGER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
)


def libpq(url: str) -> str:
    """A SQLAlchemy URL as a libpq connection string for raw psycopg."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def postgres_database(prefix: str, admin_url: str = ADMIN_URL) -> Iterator[str]:
    """A throwaway Postgres database on `admin_url`'s server; yields its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def machine() -> dict[str, str]:
    """The details a result is meaningless without."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = "unknown"
    try:
        with open("/proc/meminfo") as info:
            memory = f"{int(info.readline().split()[1]) // 1024 // 1024} GiB"
    except OSError:
        pass
    with psycopg.connect(libpq(ADMIN_URL)) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        fsync = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        # The library measured is the working tree's: say so when it differs from the commit.
        if subprocess.run(
            ["git", "status", "--porcelain", "--", "store", "engine"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip():
            commit += " + uncommitted changes in store/ or engine/"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "memory": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgres": f"{server} (synchronous_commit={fsync})",
        "sqlite": sqlite3.sqlite_version,
        "commit": commit,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def rate(fn: Callable[[], None], count: int) -> float:
    """Operations per second of `count` calls of `fn`."""
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return count / (time.perf_counter() - start)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time of `fn` over `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_section(path: str, heading: str, body: str) -> None:
    """Replace (or add) the `## heading` section of a markdown results file."""
    try:
        with open(path) as existing:
            text = existing.read()
    except FileNotFoundError:
        text = "# Benchmark results\n\nWritten by the scripts in bench/; rerun them to refresh.\n"
    marker = f"\n## {heading}\n"
    start = text.find(marker)
    if start >= 0:
        end = text.find("\n## ", start + len(marker))
        text = text[:start] + text[end if end >= 0 else len(text) :]
    text = text.rstrip("\n") + "\n" + marker + "\n" + body.strip("\n") + "\n"
    with open(path, "w") as out:
        out.write(text)


# -- CPU time: the client's from getrusage, a Postgres backend's from /proc ------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def client_cpu(who: int = resource.RUSAGE_SELF) -> float:
    """User + system CPU seconds of this process (or its reaped children)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process on this machine, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def server_cpu(admin: psycopg.Connection[Any], application_name: str) -> dict[int, float]:
    """CPU seconds so far of each Postgres backend serving `application_name`."""
    pids = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
    ).fetchall()
    admin.commit()
    return {pid: _proc_cpu(pid) for (pid,) in pids}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """Server CPU seconds between two `server_cpu` snapshots (new backends from zero)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def with_application_name(url: str, name: str) -> str:
    """A Postgres SQLAlchemy URL whose connections report `name` to the server."""
    return (
        sa.make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )
