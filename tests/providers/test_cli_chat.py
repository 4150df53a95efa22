"""`chatledger chat` against the strict loopback server, as a real command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .strict_server import OPENAI_KEY, Reply, StrictServer


def test_chat_talks_to_an_openai_compatible_endpoint(
    strict_server: StrictServer, tmp_path: Path
) -> None:
    strict_server.enqueue(Reply(text="Hello there."), Reply(text="Still here."))
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    subprocess.run(
        [sys.executable, "-m", "chatledger", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [sys.executable, "-m", "chatledger", "chat", "--database-url", url, "--model", "gpt-test"],
        input="hi\nhow are you?\n\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "OPENAI_API_KEY": OPENAI_KEY,
            "OPENAI_BASE_URL": strict_server.openai_url,
        },
    )
    assert result.returncode == 0, result.stderr
    assert "assistant: Hello there." in result.stdout
    assert "assistant: Still here." in result.stdout
    second = strict_server.requests[1].json()
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == "Hello there."
