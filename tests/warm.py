"""`run`: `subprocess.run` for Python programs, forked from a warm process.

A `chatledger` command spends most of its half second importing SQLAlchemy,
pydantic and the store, and the suite runs about a thousand commands and
docs examples. `run` takes the arguments the suite gives `subprocess.run`
and returns the same `CompletedProcess`. A Python program (`python -m M`,
an installed script of this environment such as `chatledger`, `python FILE`,
`python -c CODE`) runs in a child forked from a process of this test
worker's that has imported them already (tests/_zygote.py, ADR 0048), with
its own environment, working directory and exit code; its stdout and stderr
are pipes, read to their end (a process it leaves behind holding them is
waited for, as `subprocess.run` waits), and its stdin is a file holding the
input, or the null device. It is a real process: it can crash, exit, or be
killed like any other. What it shares with the warm process is the modules
imported before the fork (and the hash seed, `sys.flags` and the umask), so
a program whose start the interpreter decides (other `PYTHON*`, `LANG` or
`LC_*` values), with no such working directory, or not in Python, gets a
new interpreter from `subprocess.run`.

A worker's programs run one at a time: two threads of a test that call `run`
at once take turns (use `subprocess` for programs that must overlap).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).with_name("_zygote.py")
_STARTUP = ("PYTHON", "LANG", "LC_")
"""Variables the interpreter reads as it starts: a request whose values differ
from the warm process's gets a new interpreter."""


class _Gone(RuntimeError):
    """The warm process ended before it forked the program: another can run it."""


class _Zygote:
    """The warm process, and the pipes its requests and replies go over."""

    def __init__(self) -> None:
        self.startup = _startup(os.environ)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, while it lives
        to_child, self._requests = os.pipe()
        self.replies, from_child = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, str(ZYGOTE), str(to_child), str(from_child)],
            pass_fds=(to_child, from_child),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            start_new_session=True,  # its children are in its group (`close`)
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._closed = False
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, request: dict[str, Any]) -> None:
        data = (json.dumps(request) + "\n").encode()
        while data:
            data = data[os.write(self._requests, data) :]

    def receive(self) -> list[dict[str, Any]]:
        """The replies that have come whole, once `replies` is readable."""
        chunk = os.read(self.replies, 65536)
        if not chunk:
            self._process.wait()
            self.log.seek(0)
            raise _Gone(f"the warm process ended: {self.log.read().decode()}")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def close(self) -> None:
        """Stop it and whatever child it has."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        os.close(self._requests)
        os.close(self.replies)
        self.log.close()


_zygote: _Zygote | None = None
_started = threading.Lock()


def _warm() -> _Zygote:
    global _zygote
    with _started:
        if _zygote is None or not _zygote.alive():
            if _zygote is not None:  # died between calls: its pipes and log closed too
                _zygote.close()
            _zygote = _Zygote()
        return _zygote


@atexit.register
def _stop() -> None:
    if _zygote is not None:
        _zygote.close()


def _discard(zygote: _Zygote) -> None:
    """Stop `zygote`: a call broke off mid-exchange, so no reply is left unread."""
    global _zygote
    with _started:
        zygote.close()
        if _zygote is zygote:
            _zygote = None


def _program(argv: list[str]) -> tuple[str, list[str]] | None:
    """What the warm process runs for `argv`: (`module`, `code` or `file`, its
    argv), or None when it is not a Python program of this environment."""
    if argv and argv[0] == sys.executable:
        if len(argv) >= 3 and argv[1] in ("-m", "-c"):
            return ("module" if argv[1] == "-m" else "code"), argv[2:]
        if len(argv) >= 2 and not argv[1].startswith("-"):
            return "file", argv[1:]
        return None
    try:
        with open(argv[0], "rb") as script:
            shebang = script.readline().strip().decode()
    except (IndexError, OSError, UnicodeDecodeError):
        return None
    interpreter, here = Path(shebang[2:]), Path(sys.executable)
    if (  # an installed script of this environment's
        shebang.startswith("#!")
        and interpreter.parent == here.parent
        and interpreter.resolve() == here.resolve()
    ):
        return "file", argv
    return None


def _startup(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP)}


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    input: str | None = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(args, ...)` with text output captured (the only way the
    suite calls it), the program forked from a warm process when it can be."""
    assert capture_output and text, "run captures text output, as the suite uses it"
    assert stdin in (None, subprocess.DEVNULL), "stdin: the input text, or nothing"
    argv = [str(a) for a in args]
    environment = dict(os.environ if env is None else env)
    where = os.path.abspath(cwd if cwd is not None else os.getcwd())
    program = _program(argv)
    zygote = _warm() if program is not None and os.path.isdir(where) else None
    if program is None or zygote is None or _startup(environment) != zygote.startup:
        return subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=environment,
            stdin=None if input is not None else stdin,
        )
    kind, program_argv = program
    with tempfile.TemporaryDirectory(prefix="warm-") as files:
        stdin_path = None
        if input is not None:
            stdin_path = os.path.join(files, "stdin")
            Path(stdin_path).write_text(input, encoding="utf-8")
        paths, readers, writers = [], [], []
        for name in ("stdout", "stderr"):
            path = os.path.join(files, name)
            os.mkfifo(path)
            # A reader, then a writer of ours: the child's open finds the reader,
            # and no read ends before the child has its own writer (ours closes
            # once it has exited).
            paths.append(path)
            readers.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
            writers.append(os.open(path, os.O_WRONLY))
        request = {
            "kind": kind,
            "argv": program_argv,
            "env": environment,
            "cwd": where,
            "stdin": stdin_path,
            "stdout": paths[0],
            "stderr": paths[1],
        }
        try:
            for attempt in range(2):
                try:
                    with zygote.lock:
                        status, out, err = _exchange(
                            zygote, request, argv, readers, writers, timeout
                        )
                    break
                except _Gone:  # killed, or out of memory, before the fork: a new one runs it
                    if attempt:
                        raise
                    zygote = _warm()
        finally:
            _close(writers)
            _close(readers)
    return subprocess.CompletedProcess(argv, status, out, err)


def _exchange(
    zygote: _Zygote,
    request: dict[str, Any],
    argv: list[str],
    readers: list[int],
    writers: list[int],
    timeout: float | None,
) -> tuple[int, str, str]:
    """Send `request`, then read the child's pid, its stdout and stderr to their
    end and its status; past `timeout`, kill it and wait for the warm process to
    reap it. An error that leaves a reply unread discards the warm process (the
    next call starts another)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    read = {reader: bytearray() for reader in readers}
    open_readers = set(readers)
    pid: int | None = None
    status: int | None = None
    settled = False  # every reply read: the warm process can take the next request

    def replies(wait: float | None) -> None:
        nonlocal pid, status
        ready, _, _ = select.select([zygote.replies, *open_readers], [], [], wait)
        for fd in ready:
            if fd == zygote.replies:
                for reply in zygote.receive():
                    pid = reply.get("pid", pid)
                    status = reply.get("status", status)
                if status is not None:  # the child has exited: only what it left writes now
                    _close(writers)
                continue
            chunk = os.read(fd, 65536)
            if chunk:
                read[fd] += chunk
            else:
                open_readers.discard(fd)

    try:
        try:
            zygote.send(request)
        except BrokenPipeError as error:
            raise _Gone("the warm process ended") from error
        while status is None or open_readers:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if pid is not None and status is None:
                    os.kill(pid, signal.SIGKILL)
                    killed_by = time.monotonic() + 30
                    while status is None and time.monotonic() < killed_by:
                        replies(killed_by - time.monotonic())
                settled = status is not None
                raise subprocess.TimeoutExpired(
                    argv, timeout or 0.0, bytes(read[readers[0]]), bytes(read[readers[1]])
                )
            try:
                replies(left)
            except _Gone:
                if pid is None:
                    raise
                raise RuntimeError(f"the warm process ended while {argv} ran") from None
        settled = True
    finally:
        if not settled:
            _discard(zygote)
    return status, _text(read[readers[0]]), _text(read[readers[1]])


def _text(data: bytes | bytearray) -> str:
    """Output as `subprocess.run(text=True)` decodes it: newlines made universal."""
    return bytes(data).decode().replace("\r\n", "\n").replace("\r", "\n")


def _close(fds: list[int]) -> None:
    """Close each of `fds`, emptying the list (so none is closed twice)."""
    while fds:
        os.close(fds.pop())
