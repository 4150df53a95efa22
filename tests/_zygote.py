"""The warm process behind `tests/warm.py`: it imports what a `chatledger` command
and a docs example load, then forks a child per request, which runs the program
as the interpreter would have and exits.

Run as `python tests/_zygote.py READ_FD WRITE_FD`. Requests and replies are JSON
lines on those two descriptors. A request names the program (`kind`: a module,
code or a file, and its `argv`), its environment, working directory and the
paths its stdin, stdout and stderr open (pipes the caller reads). The reply is
the child's pid, then its status: the exit code, or minus the signal that ended
it. This process only imports and forks: no thread, no connection, no event
loop, so each child starts as clean as a new interpreter but for the modules
already imported. When an import warns, a new interpreter would have shown the
warning to each program: this process then exits, and the caller starts
programs the usual way.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import signal
import sys
import threading
import traceback
import types
import warnings
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
_interrupted = False  # the program ended on a KeyboardInterrupt
_HERE = __file__
_OURS = {_HERE, "<frozen runpy>"}
"""The files of frames a program's traceback leaves out: this one's, and runpy's
for code and files (the interpreter shows runpy's frames for `-m` alone)."""


def _streams() -> None:
    """New `sys.std*` over descriptors 0, 1 and 2, as the interpreter made this
    process's own: the same encoding and errors, and buffered or not alike."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        model = getattr(sys, f"__{name}__")
        raw = io.FileIO(fd, mode, closefd=False)
        unbuffered = mode == "w" and model.write_through  # `-u`, PYTHONUNBUFFERED
        buffer: Any = (
            raw if unbuffered else (io.BufferedReader if mode == "r" else io.BufferedWriter)(raw)
        )
        stream = io.TextIOWrapper(
            buffer,
            encoding=model.encoding,
            errors=model.errors,
            newline="\n",
            line_buffering=model.line_buffering,
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _program(kind: str, argv: list[str], cwd: str) -> None:
    """Run the program: `python -m argv[0]`, `python -c argv[0]`, or the file argv[0]."""
    if kind == "module":
        sys.argv = list(argv)
        sys.path[0] = cwd
        # `-m` runs the module in `__main__`'s namespace: a new one, not this file's.
        sys.modules["__main__"] = types.ModuleType("__main__")
        runpy._run_module_as_main(argv[0])  # type: ignore[attr-defined]  # what `-m` runs
    elif kind == "code":
        sys.argv = ["-c", *argv[1:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")  # this module stays what it is
        sys.modules["__main__"] = main
        exec(compile(argv[0], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(os.path.abspath(argv[0]), run_name="__main__")


def _exit_code(request: dict[str, Any]) -> int:
    try:
        _program(request["kind"], request["argv"], request["cwd"])
    except SystemExit as stop:
        if stop.code is None:
            return 0
        if isinstance(stop.code, int):
            return stop.code
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException as error:
        # The program's own frames, as the interpreter shows them (not this file's).
        ours = {_HERE} if request["kind"] == "module" else _OURS
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        if isinstance(error, KeyboardInterrupt):  # the interpreter dies of the signal
            global _interrupted
            _interrupted = True
        return 1
    return 0


def _child(request: dict[str, Any], channel: tuple[int, int]) -> None:
    code = 1
    try:
        for fd in channel:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for target, path, flags in (
            (0, request["stdin"] or os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY),
            (2, request["stderr"], os.O_WRONLY),
        ):
            fd = os.open(path, flags)
            os.dup2(fd, target)
            os.close(fd)
        _streams()
        code = _exit_code(request)
        # What the interpreter does on its way out: wait for the threads that are
        # not daemons, run the exit handlers, flush.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if _interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    # sys.path[0] is tests/, whose folders must not stand in for what is imported
    # here; each child puts its program's folder there instead.
    sys.path[0] = os.devnull
    with warnings.catch_warnings(record=True) as caught:
        for module in PRELOAD:
            __import__(module)
    if caught:
        sys.exit(f"importing warned, so programs need a new interpreter: {caught[0]}")
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
