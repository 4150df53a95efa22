"""`run`: `subprocess.run` for Python programs, forked from a warm process.

A `chatledger` command spends most of its 0.5 s importing SQLAlchemy,
pydantic and the store, and the suite runs about a thousand commands and
docs examples. `run` takes the same arguments as `subprocess.run` and
returns the same `CompletedProcess`; a Python program (`python -m chatledger`,
the installed `chatledger`, `python FILE`, `python -c CODE`) runs in a child
forked from a process of this test worker's that has imported them already
(tests/_zygote.py), with its own environment, working directory, stdin,
stdout, stderr and exit code. It is a real process: it can crash, exit,
write to a closed pipe or be killed like any other. What it shares with the
warm process is the modules imported before the fork, so a program that
depends on how the interpreter starts (`PYTHON*` variables, the locale, the
interpreter's flags) or that is not Python gets a new interpreter, as it
would from `subprocess.run`: those requests go there.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).with_name("_zygote.py")
_STARTUP = ("PYTHON", "LANG", "LC_")
"""Variables the interpreter reads as it starts: a request whose values differ
from the warm process's gets a new interpreter."""


class _Zygote:
    def __init__(self) -> None:
        self.env = dict(os.environ)
        to_child, self._requests = os.pipe()
        self._replies, from_child = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, str(ZYGOTE), str(to_child), str(from_child)],
            pass_fds=(to_child, from_child),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=self.env,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, request: dict[str, Any]) -> None:
        os.write(self._requests, (json.dumps(request) + "\n").encode())

    def reply(self, timeout: float | None) -> dict[str, Any] | None:
        """The next reply, or None when none came within `timeout` seconds."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise RuntimeError("the warm process ended: see the test's stderr")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def close(self) -> None:
        os.close(self._requests)
        self._process.wait(timeout=30)
        os.close(self._replies)


_zygote: _Zygote | None = None
_started = threading.Lock()


def _warm() -> _Zygote:
    global _zygote
    with _started:
        if _zygote is None or not _zygote.alive():
            _zygote = _Zygote()
            atexit.register(_zygote.close)
        return _zygote


def _python(argv: Sequence[str]) -> bool:
    """Whether `argv` is a Python program the warm process can run."""
    if not argv:
        return False
    first = str(argv[0])
    if first == sys.executable:
        return len(argv) >= 2 and (str(argv[1]) in ("-m", "-c") or not str(argv[1]).startswith("-"))
    try:
        with open(first, "rb") as script:
            shebang = script.readline().strip().decode()
    except (OSError, UnicodeDecodeError):
        return False
    interpreter = Path(shebang[2:])  # an installed script: this environment's Python
    here = Path(sys.executable)
    return (
        shebang.startswith("#!")
        and interpreter.parent == here.parent
        and (interpreter.resolve() == here.resolve())
    )


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
    argv = [str(a) for a in args]
    environment = dict(os.environ if env is None else env)
    zygote = _warm() if _python(argv) else None
    if zygote is None or _startup(environment) != _startup(zygote.env):
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
    with tempfile.TemporaryDirectory(prefix="warm-") as files:
        out, err, into = (Path(files) / name for name in ("out", "err", "in"))
        out.touch()
        err.touch()
        if input is not None:
            into.write_text(input, encoding="utf-8")
        request = {
            "argv": argv,
            "env": environment,
            "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()),
            "stdin": str(into) if input is not None else None,
            "stdout": str(out),
            "stderr": str(err),
        }
        with zygote.lock:
            zygote.send(request)
            started = zygote.reply(30)
            assert started is not None, "the warm process did not fork"
            done = zygote.reply(timeout)
            if done is None:
                os.kill(started["pid"], signal.SIGKILL)
                zygote.reply(None)
                raise subprocess.TimeoutExpired(argv, timeout or 0.0)
        return subprocess.CompletedProcess(
            argv,
            done["status"],
            out.read_text(encoding="utf-8"),
            err.read_text(encoding="utf-8"),
        )
