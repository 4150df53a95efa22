"""`tests/warm.py` runs a program as `subprocess.run` does: the same exit code,
output and errors for every way the suite starts a Python program."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import warm

SCRIPT = """\
import atexit, os, sys, threading, time
print(sys.argv[1:], os.getcwd() == os.path.realpath(os.environ["EXPECT_CWD"]), __name__)
print("read:", repr(sys.stdin.read()), "LEAK" in os.environ)
atexit.register(print, "an exit handler runs")
ending = threading.Event()

def last_words():  # printed only if the exit waits for the threads that are not daemons
    ending.wait()
    time.sleep(0.2)  # well after the main thread is done
    print("the thread's last words")

threading.Thread(target=last_words).start()
print("to stderr", file=sys.stderr)
try:
    if sys.argv[1:] == ["raise"]:
        raise ValueError("the program's own error")
    if sys.argv[1:] == ["die"]:
        sys.stdout.flush()
        os.kill(os.getpid(), 9)
    sys.exit(int(sys.argv[1]) if sys.argv[1].lstrip("-").isdigit() else sys.argv[1])
finally:
    ending.set()
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "program.py"
    path.write_text(SCRIPT)
    return path


def both(argv: list[str], **kwargs: object) -> tuple[object, object]:
    """(warm, subprocess) results as comparable tuples."""
    results = []
    for runner in (warm.run, subprocess.run):
        done = runner(argv, capture_output=True, text=True, timeout=60, **kwargs)  # type: ignore[operator]
        results.append((done.returncode, done.stdout, done.stderr))
    return results[0], results[1]


@pytest.mark.parametrize("args", [["0"], ["3"], ["256"], ["-1"], ["a message"], ["raise"], ["die"]])
def test_a_script_exits_prints_and_fails_as_it_would_in_a_new_interpreter(
    script: Path, tmp_path: Path, args: list[str]
) -> None:
    env = {**os.environ, "EXPECT_CWD": str(tmp_path)}
    ours, theirs = both(
        [sys.executable, str(script), *args], cwd=tmp_path, env=env, input="in\r\nput"
    )
    assert ours == theirs
    # What was set for one program is not there for the next.
    again = warm.run(
        [sys.executable, str(script), "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "LEAK": "1"},
    )
    assert "True" in again.stdout.splitlines()[1]
    ours, _ = both([sys.executable, str(script), *args], cwd=tmp_path, env=env)
    assert "False" in ours[1].splitlines()[1]  # type: ignore[index]


def test_code_and_modules_run_as_they_would_in_a_new_interpreter(tmp_path: Path) -> None:
    code = "import sys; print(sys.argv, sys.path[0] == ''); print(input()); sys.exit(4)"
    ours, theirs = both([sys.executable, "-c", code], input="line\n")
    assert ours == theirs
    (tmp_path / "crashing.py").write_text("raise SystemError('a module that fails')\n")
    ours, theirs = both([sys.executable, "-m", "crashing"], cwd=tmp_path)
    assert ours == theirs
    ours, theirs = both([sys.executable, "-m", "chatledger", "no-such-command"], cwd=tmp_path)
    assert ours == theirs
    assert ours[0] == 2  # type: ignore[index]
    command = Path(sys.executable).with_name("chatledger")
    ours, theirs = both([str(command), "migrate"], cwd=tmp_path)
    assert ours[0] == 0 and "Created" in ours[1]  # type: ignore[index]
    assert theirs[0] == 0 and "already" in theirs[1]  # type: ignore[index]  # the same file


def test_a_program_is_forked_warm_unless_the_interpreter_start_matters(tmp_path: Path) -> None:
    code = "import sys; print('sqlalchemy' in sys.modules)"
    warmed = warm.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert warmed.stdout == "True\n"  # imported before the fork
    cold = warm.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert cold.stdout == "False\n"  # a variable the interpreter reads as it starts


def test_a_program_past_its_timeout_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1)
    with pytest.raises(ProcessLookupError):  # killed, and reaped before the error
        os.kill(int(pid_file.read_text()), 0)
    done = warm.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True)
    assert done.stdout == "1\n"  # the warm process serves the next program


def test_a_warm_process_that_died_is_started_again() -> None:
    dead = warm._warm()._process
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait()  # dead before the call: it is replaced, not found dead mid-exchange
    done = warm.run([sys.executable, "-c", "print(2)"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "2\n")
