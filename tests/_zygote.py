"""The warm process behind `tests/warm.py`: it imports what a `chatledger` command
and a docs example load, then forks a child per request, which runs the program
as the interpreter would have and exits.

Run as `python tests/_zygote.py READ_FD WRITE_FD`. Requests and replies are JSON
lines on those two descriptors; its stdin and stdout are the null device.
A request names the program (`argv`, as `subprocess.run` takes it), its
environment, working directory and the files its stdin, stdout and stderr are.
The reply is the child's pid, then its status: the exit code, or minus the
signal that ended it. This process only imports and forks: no thread, no
connection, no event loop, so each child starts as clean as a new interpreter
but for the modules already imported.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import sys
import threading
import traceback
import types
from typing import Any

PRELOAD = [
    "chatledger.engine._cli",
    "chatledger.store._store",
    "chatledger.store._async",
    "chatledger.store._sql.migrate",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "alembic.command",
    "alembic.runtime.migration",
]


_OURS = {__file__, "<frozen runpy>"}


def _streams(env: dict[str, str]) -> None:
    """New `sys.std*` over descriptors 0, 1 and 2, as the interpreter makes them
    for files and pipes."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
        encoding="utf-8",
        write_through=unbuffered,
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _program(argv: list[str], cwd: str) -> int:
    """Run `argv` (`python -m M`, `python -c CODE`, `python FILE`, or a Python
    script such as the installed `chatledger`) in this process; its exit code."""
    if argv[0] == sys.executable and argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        sys.path[0] = cwd
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    elif argv[0] == sys.executable and argv[1] == "-c":
        sys.argv = ["-c", *argv[3:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")  # this module stays what it is
        sys.modules["__main__"] = main
        exec(compile(argv[2], "<string>", "exec"), main.__dict__)
    else:
        script = argv[1] if argv[0] == sys.executable else argv[0]
        sys.argv = [script, *argv[2 if argv[0] == sys.executable else 1 :]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(os.path.abspath(script), run_name="__main__")
    return 0


def _child(request: dict[str, Any], channel: tuple[int, int]) -> None:
    for fd in channel:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for target, path, flags in (
        (0, request["stdin"] or os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_TRUNC),
    ):
        fd = os.open(path, flags)
        os.dup2(fd, target)
        os.close(fd)
    _streams(request["env"])
    code = 1
    try:
        code = _program(request["argv"], request["cwd"])
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:
        # The program's own frames, as the interpreter shows them (not this file's).
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OURS:
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        code = 1
    finally:
        # What the interpreter does on its way out: wait for the threads that are
        # not daemons, run the exit handlers, flush.
        try:
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    # sys.path[0] is this folder; each child puts its program's there instead.
    for module in PRELOAD:
        __import__(module)
    requests = os.fdopen(read_fd, "r", encoding="utf-8")
    replies = os.fdopen(write_fd, "w", encoding="utf-8", buffering=1)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, (read_fd, write_fd))
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
