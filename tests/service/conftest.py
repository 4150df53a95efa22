"""Fixtures of the service tests: keys, an in-process client, a real server."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from chatledger.engine import Agent
from chatledger.service import ApiKeys, create_app
from chatledger.store import AsyncStore, Store


@dataclass
class Tenants:
    """Two tenants and their keys, unique to the test."""

    a: str
    b: str
    key_a: str
    key_b: str

    @property
    def keys(self) -> ApiKeys:
        return ApiKeys.of({self.key_a: self.a, self.key_b: self.b})

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenants() -> Tenants:
    tag = uuid.uuid4().hex[:8]
    return Tenants(f"svc-a-{tag}", f"svc-b-{tag}", f"key-a-{tag}", f"key-b-{tag}")


@pytest.fixture
def sync_store(database_url: str) -> Iterator[Store]:
    with Store.open(database_url) as store:
        yield store


@pytest.fixture
async def client_for(
    database_url: str, tenants: Tenants
) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """`client_for(agent, **create_app_options)`: an in-process client of a new app."""
    stores: list[AsyncStore] = []
    clients: list[httpx.AsyncClient] = []

    def make(agent: Agent, **options: Any) -> httpx.AsyncClient:
        store = AsyncStore.open(database_url)
        stores.append(store)
        options.setdefault("keys", tenants.keys)
        app = create_app(agent, store, **options)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://service.test",
            headers=tenants.auth(tenants.key_a),
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    for store in stores:
        await store.close()


class Server:
    """uvicorn serving an app on a loopback port, in a thread with its own loop."""

    def __init__(self, app: Any) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        # Listening before the server runs: a client that connects early waits
        # in the backlog until the server accepts, so no start-up wait is needed.
        self.socket.listen(128)
        host, port = self.socket.getsockname()
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.socket])), daemon=True
        )

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.socket.close()
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture
def serve(database_url: str, tenants: Tenants) -> Iterator[Callable[..., Server]]:
    """`serve(agent, **create_app_options)`: a real server on the test's database."""
    servers: list[Server] = []

    def start(agent: Agent, **options: Any) -> Server:
        options.setdefault("keys", tenants.keys)
        server = Server(create_app(agent, database_url, **options)).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


def sse_events(lines: list[str]) -> list[tuple[str, str]]:
    """`(event, data)` pairs of a Server-Sent Events body, in order (comments skipped)."""
    events: list[tuple[str, str]] = []
    event, data = "message", []
    for line in lines:
        if not line:
            if data:
                events.append((event, "\n".join(data)))
            event, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        events.append((event, "\n".join(data)))
    return events
