"""The service over real sockets: uvicorn on a loopback port, httpx as the client."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from chatledger.service import key_digest
from chatledger.store import Store, new_id
from tests.service.agents import blocking_agent, weather_agent
from tests.service.conftest import Server, Tenants, sse_events


def test_ask_and_stream_over_a_real_socket(
    serve: Callable[..., Server], tenants: Tenants, sync_store: Store
) -> None:
    server = serve(weather_agent())
    with httpx.Client(
        base_url=server.url, headers=tenants.auth(tenants.key_a), timeout=60
    ) as client:
        answer = client.post("/v1/ask", json={"question": "Weather?"}).json()
        assert answer["answer"].startswith("Summary: sunny in")
        lines: list[str] = []
        with client.stream(
            "POST",
            "/v1/ask/stream",
            json={"question": "Again?", "conversation_id": answer["conversationId"]},
        ) as response:
            assert response.status_code == 200
            lines.extend(response.iter_lines())
    events = [(e, json.loads(d)) for e, d in sse_events(lines)]
    assert [e for e, _ in events][:3] == ["start", "tool_call", "tool_call"]
    assert events[-1][0] == "answer"
    assert events[-1][1]["conversationId"] == answer["conversationId"]
    ledger = sync_store.tenant(tenants.a)
    runs = ledger.runs.recent(conversation_id=answer["conversationId"])
    assert [r.status for r in runs] == ["completed", "completed"]


def _raw(url: str, request_line: str, headers: list[str], body: bytes = b"") -> tuple[int, Any]:
    """One request as raw bytes (httpx would merge repeated headers); its status and JSON."""
    address = httpx.URL(url)
    assert address.host and address.port
    lines = [request_line, f"Host: {address.host}:{address.port}", "Connection: close", *headers]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    with socket.create_connection((address.host, address.port), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        received = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, payload = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload)


def test_two_authorization_headers_are_400_in_any_order_and_write_nothing(
    serve: Callable[..., Server], tenants: Tenants, sync_store: Store
) -> None:
    """A gateway that checks only the first header cannot be bypassed by a second one."""
    server = serve(weather_agent())
    a, b = f"Authorization: Bearer {tenants.key_a}", f"Authorization: Bearer {tenants.key_b}"
    invalid = "Authorization: Bearer not-a-key"
    ask = b'{"question": "Weather?"}'
    for pair in [(a, b), (b, a), (invalid, a), (a, invalid), (a, a)]:
        for request_line, body in [
            ("POST /v1/ask HTTP/1.1", ask),
            ("POST /v1/ask/stream HTTP/1.1", ask),
            (f"GET /v1/conversations/{new_id()}/runs HTTP/1.1", b""),
        ]:
            status, error = _raw(server.url, request_line, list(pair), body)
            assert status == 400, (pair, request_line, error)
            assert "2 Authorization headers" in error["error"]["message"]
    for tenant in (tenants.a, tenants.b):
        ledger = sync_store.tenant(tenant)
        assert (ledger.conversations(), ledger.events()) == ([], [])
    # One header of the same request is served: the refusal is the duplicate's alone.
    status, answer = _raw(server.url, "POST /v1/ask HTTP/1.1", [a], ask)
    assert status == 200 and answer["answer"].startswith("Summary:")


def _wait_for(condition: Callable[[], Any], what: str, seconds: float = 30.0) -> Any:
    """Poll `condition` until it returns a truthy value; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def _chatledger_serve(database_url: str, agent: str, keys: Path) -> Iterator[str]:
    """A real `chatledger serve` process on a free port; yields its URL."""
    with _chatledger(
        "serve",
        "--agent",
        agent,
        "--database-url",
        database_url,
        "--keys",
        str(keys),
        "--port",
        "0",
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    ) as server:
        try:
            assert server.stderr is not None
            url = None
            for line in server.stderr:
                found = re.search(r"Uvicorn running on (http://\S+)", line)
                if found:
                    url = found.group(1)
                    break
            assert url is not None, "the server did not start"
            yield url
        finally:
            server.send_signal(signal.SIGINT)
            server.communicate(timeout=60)  # drain stderr so the server can exit
        assert server.returncode == 0


def test_a_client_that_disconnects_learns_its_ids_and_the_run_waits_for_agent_resume(
    own_database: str, tmp_path: Path
) -> None:
    """The start event names the new conversation; the canceled run is resumable with
    `Agent.resume`, and the `chatledger resume` worker leaves it (it takes crashed runs)."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({key_digest("k"): "acme"}))
    with (
        _chatledger_serve(own_database, "tests.service.cli_agent:blocking", keys) as url,
        httpx.Client(base_url=url, headers={"Authorization": "Bearer k"}, timeout=60) as client,
    ):
        lines: list[str] = []
        with client.stream("POST", "/v1/ask/stream", json={"question": "Wait?"}) as response:
            for line in response.iter_lines():
                lines.append(line)
                if line.startswith("event: tool_call"):
                    break  # leave while the tool is still working
        event, data = sse_events(lines)[0]
        start = json.loads(data)
        assert event == "start" and set(start) == {"runId", "conversationId"}
        run_id, conversation_id = start["runId"], start["conversationId"]

        def canceled() -> dict[str, Any] | None:
            run = client.get(f"/v1/runs/{run_id}").json()
            return run if run["run"]["status"] == "canceled" else None

        timeline = _wait_for(canceled, "the run to be recorded as canceled")
        assert client.get(f"/v1/conversations/{conversation_id}").status_code == 200
    assert timeline["run"]["stage"] == "disconnect"
    assert timeline["run"]["conversationId"] == conversation_id
    kinds = [e["kind"] for e in timeline["events"]]
    assert kinds[:5] == [
        "run.started",
        "message.recorded",
        "model.requested",
        "model.responded",
        "message.recorded",
    ]
    assert kinds[-1] == "run.canceled"
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "chatledger",
            *("resume", "--once", "--json", "--database-url", own_database),
            *("--agent", "tests.service.cli_agent:blocking"),
        ],
        capture_output=True,
        text=True,
    )
    assert worker.returncode == 0, worker.stderr
    assert run_id not in worker.stdout
    with Store.open(own_database) as store:
        ledger = store.tenant("acme")
        assert ledger.runs.get(run_id).status == "canceled"
        assert [r.id for r in ledger.runs.recent(conversation_id=conversation_id)] == [run_id]
        resumed = blocking_agent().resume(ledger, run_id)
        assert resumed.output == "Finished after waiting."
        assert resumed.conversation_id == conversation_id
        history = ledger.history(conversation_id)
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1].tool_calls[0].id == "w1"


def _chatledger(*args: str, **options: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "chatledger", *args],
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **options,
    )


def test_chatledger_serve_and_api_key(database_url: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    tenant = f"cli-{new_id()[-8:]}"
    made = subprocess.run(
        [sys.executable, "-m", "chatledger", "api-key", tenant, "--keys", str(keys)],
        capture_output=True,
        text=True,
        check=True,
    )
    key = re.search(r"^key:\s+(\S+)$", made.stdout, re.MULTILINE)
    assert key is not None, made.stdout
    assert key.group(1) not in keys.read_text()  # only the digest is kept
    with (
        _chatledger_serve(database_url, "tests.service.cli_agent:agent", keys) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        refused = client.post("/v1/ask", json={"question": "Weather?"})
        assert refused.status_code == 401
        answer = client.post(
            "/v1/ask",
            json={"question": "Weather?"},
            headers={"Authorization": f"Bearer {key.group(1)}"},
        )
        assert answer.status_code == 200, answer.text
        # An id pasted in capitals names the same conversation and run.
        auth = {"Authorization": f"Bearer {key.group(1)}"}
        conv, run_id = answer.json()["conversationId"], answer.json()["runId"]
        for path in ("/v1/conversations/{}/messages", "/v1/conversations/{}"):
            lower = client.get(path.format(conv), headers=auth)
            upper = client.get(path.format(conv.upper()), headers=auth)
            assert upper.status_code == 200 and upper.json() == lower.json(), upper.text
        assert client.get(f"/v1/runs/{run_id.upper()}", headers=auth).json()["run"]["id"] == run_id
        again = client.post(
            "/v1/ask", json={"question": "Again?", "conversationId": conv.upper()}, headers=auth
        )
        assert again.json()["conversationId"] == conv, again.text
        # Refusals in the API's words, with no Python advice.
        past = client.get(f"/v1/conversations/{conv}/messages?at=999", headers=auth)
        missing = client.get(f"/v1/conversations/{new_id()}", headers=auth)
        assert (past.status_code, missing.status_code) == (422, 404)
        for said in (past.json()["error"]["message"], missing.json()["error"]["message"]):
            assert "store.tenant" not in said and "Position(" not in said, said
        assert "Pass a position in that range" in past.json()["error"]["message"]
        assert "API key's tenant" in missing.json()["error"]["message"]
    with Store.open(database_url) as store:
        run = store.tenant(tenant).runs.get(run_id)
        assert run.status == "completed"


_SERVE = [sys.executable, "-m", "chatledger", "serve", "--agent", "tests.service.cli_agent:agent"]


def _serve_refusal(database_url: str, *options: str) -> str:
    """What `chatledger serve` prints on stderr when it refuses to start (exit 1)."""
    result = subprocess.run(
        [*_SERVE, "--database-url", database_url, *options],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("CHATLEDGER_API_KEYS")},
    )
    assert result.returncode == 1, result.stderr
    return result.stderr


def test_serve_refuses_to_start_without_usable_keys(database_url: str, tmp_path: Path) -> None:
    missing = _serve_refusal(database_url)
    assert "No API keys" in missing and "api-key" in missing
    plain = tmp_path / "keys.json"
    plain.write_text(json.dumps({"clk_plain_key": "acme"}))
    assert "never the keys themselves" in _serve_refusal(database_url, "--keys", str(plain))
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert "lists no keys" in _serve_refusal(database_url, "--keys", str(empty))


def test_api_key_refuses_a_key_file_that_is_not_json(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "chatledger", "api-key", "acme", "--keys", str(keys)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "Cannot read the key file" in result.stderr and "internal error" not in result.stderr
    assert keys.read_text() == "{not json"
