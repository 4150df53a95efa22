"""A real HTTP server on 127.0.0.1 that speaks OpenAI Chat Completions and Anthropic Messages.

It enforces the rules the real providers enforce (see `strict_rules`) and
answers a violation with 400 and a provider-shaped error body. Every request
is recorded (raw body bytes and sha256). A test scripts the answers with
`server.enqueue(...)`: `Reply` (text, tool calls, thinking, usage; optionally
stalled, or cut off midway when streamed) and `Fail` (an error status, with
`Retry-After` if wanted). With nothing enqueued it answers `Reply()`.

Routes: `POST /v1/chat/completions` (OpenAI; base URL `server.openai_url`)
and `POST /v1/messages` (Anthropic; base URL `server.url`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import strict_rules

OPENAI_KEY = "sk-strict-openai"
ANTHROPIC_KEY = "sk-strict-anthropic"


@dataclass(frozen=True)
class Call:
    """A tool call the server answers with; `arguments` is JSON text."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True)
class Reply:
    """A successful answer.

    `cut_after` (streams only) sends that many SSE events and then drops the
    connection mid-body (`clean_cut`: ends the body properly instead, so the
    stream is merely incomplete). `stall` waits that many seconds (or until
    the server stops) before answering.
    """

    text: str = "ok"
    calls: tuple[Call, ...] = ()
    thinking: str = ""
    signature: str = "sig-strict"
    input_tokens: int = 11
    output_tokens: int = 7
    cache_read: int | None = None
    cache_write: int | None = None
    cut_after: int | None = None
    clean_cut: bool = False
    stall: float = 0.0


@dataclass(frozen=True)
class Fail:
    """An error answer with the given status (and `Retry-After`, when set)."""

    status: int
    retry_after: str | None = None
    message: str = "The server had an error while processing your request."


@dataclass(frozen=True)
class Recorded:
    """One request as received."""

    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class StrictServer:
    """The server's state: scripted actions, recorded requests, handler errors."""

    requests: list[Recorded] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    rejections: list[strict_rules.Rejection] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    _actions: deque[Reply | Fail] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _httpd: _Server | None = None
    _thread: threading.Thread | None = None

    def enqueue(self, *actions: Reply | Fail) -> None:
        with self._lock:
            self._actions.extend(actions)

    def next_action(self) -> Reply | Fail:
        with self._lock:
            return self._actions.popleft() if self._actions else Reply()

    def record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> None:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.strict = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    strict: StrictServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        # A client that timed out or stopped reading closes its end first.
        if not isinstance(exc, (BrokenPipeError, ConnectionResetError)) and exc is not None:
            self.strict.errors.append(exc)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        strict = self.server.strict
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        strict.record(Recorded(self.path, headers, body))
        if self.path == "/v1/chat/completions":
            api: _Api = _OPENAI
        elif self.path == "/v1/messages":
            api = _ANTHROPIC
        else:
            self._json(404, {"error": {"message": f"Unknown path {self.path}"}})
            return
        try:
            data = json.loads(body)
        except ValueError:
            self._reject(
                api,
                strict_rules.Rejection(400, "We could not parse the JSON body of your request."),
            )
            return
        rejection = api.check(headers, data)
        if rejection is not None:
            strict.rejections.append(rejection)
            self._reject(api, rejection)
            return
        action = strict.next_action()
        if isinstance(action, Fail):
            kind = "rate_limit_error" if action.status == 429 else "api_error"
            extra = {"retry-after": action.retry_after} if action.retry_after is not None else {}
            self._json(
                action.status,
                api.error(strict_rules.Rejection(action.status, action.message, kind)),
                extra,
            )
            return
        if action.stall:
            strict.stopping.wait(action.stall)
        if data.get("stream"):
            self._stream(api.events(action, data), action)
        else:
            self._json(200, api.answer(action, data))

    def _reject(self, api: _Api, rejection: strict_rules.Rejection) -> None:
        self._json(rejection.status, api.error(rejection))

    def _json(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.send_header("connection", "close")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)
        self.close_connection = True

    def _stream(self, events: list[str], action: Reply) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        cut = action.cut_after
        for event in events if cut is None else events[:cut]:
            raw = event.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        if cut is None or action.clean_cut:
            self.wfile.write(b"0\r\n\r\n")
        # Otherwise return without the final chunk: the connection closes mid-body.


def _split(text: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class _Api:
    def check(self, headers: dict[str, str], body: Any) -> strict_rules.Rejection | None:
        raise NotImplementedError

    def error(self, rejection: strict_rules.Rejection) -> Any:
        raise NotImplementedError

    def answer(self, reply: Reply, body: Any) -> Any:
        raise NotImplementedError

    def events(self, reply: Reply, body: Any) -> list[str]:
        raise NotImplementedError


class _OpenAI(_Api):
    def check(self, headers: dict[str, str], body: Any) -> strict_rules.Rejection | None:
        return strict_rules.check_openai(headers, body, OPENAI_KEY)

    def error(self, rejection: strict_rules.Rejection) -> Any:
        kind = {"rate_limit_error": "requests", "api_error": "server_error"}.get(
            rejection.kind, rejection.kind
        )
        return {
            "error": {
                "message": rejection.message,
                "type": kind,
                "param": rejection.param,
                "code": rejection.code,
            }
        }

    @staticmethod
    def _usage(reply: Reply) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }
        if reply.cache_read is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cache_read}
        return usage

    @staticmethod
    def _finish(reply: Reply) -> str:
        return "tool_calls" if reply.calls else "stop"

    def answer(self, reply: Reply, body: Any) -> Any:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text or None,
            "refusal": None,
        }
        if reply.thinking:
            message["reasoning_content"] = reply.thinking
        if reply.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in reply.calls
            ]
        return {
            "id": "chatcmpl-strict",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish(reply),
                }
            ],
            "usage": self._usage(reply),
        }

    def events(self, reply: Reply, body: Any) -> list[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _sse(
                {
                    "id": "chatcmpl-strict",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [choice],
                }
            )

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"reasoning_content": t}) for t in _split(reply.thinking, 2)]
        events += [chunk({"content": t}) for t in _split(reply.text, 3)]
        for index, call in enumerate(reply.calls):
            head = {
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            events.append(chunk({"tool_calls": [head]}))
            events += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": a}}]})
                for a in _split(call.arguments, 2)
            ]
        events.append(chunk({}, self._finish(reply)))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                _sse(
                    {
                        "id": "chatcmpl-strict",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": body["model"],
                        "choices": [],
                        "usage": self._usage(reply),
                    }
                )
            )
        events.append(_sse("[DONE]"))
        return events


class _Anthropic(_Api):
    def check(self, headers: dict[str, str], body: Any) -> strict_rules.Rejection | None:
        return strict_rules.check_anthropic(headers, body, ANTHROPIC_KEY)

    def error(self, rejection: strict_rules.Rejection) -> Any:
        return {
            "type": "error",
            "error": {"type": rejection.kind, "message": rejection.message},
            "request_id": "req_strict",
        }

    @staticmethod
    def _usage(reply: Reply, output: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"input_tokens": reply.input_tokens, "output_tokens": output}
        if reply.cache_read is not None:
            usage["cache_read_input_tokens"] = reply.cache_read
        if reply.cache_write is not None:
            usage["cache_creation_input_tokens"] = reply.cache_write
        return usage

    @staticmethod
    def _blocks(reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.thinking:
            blocks.append(
                {"type": "thinking", "thinking": reply.thinking, "signature": reply.signature}
            )
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": json.loads(call.arguments),
                }
            )
        return blocks

    @staticmethod
    def _stop(reply: Reply) -> str:
        return "tool_use" if reply.calls else "end_turn"

    def answer(self, reply: Reply, body: Any) -> Any:
        return {
            "id": "msg_strict",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": self._blocks(reply),
            "stop_reason": self._stop(reply),
            "stop_sequence": None,
            "usage": self._usage(reply, reply.output_tokens),
        }

    def events(self, reply: Reply, body: Any) -> list[str]:
        message = {
            **self.answer(reply, body),
            "content": [],
            "stop_reason": None,
            "usage": self._usage(reply, 1),
        }
        events = [
            _sse({"type": "message_start", "message": message}, "message_start"),
            _sse({"type": "ping"}, "ping"),
        ]
        for index, block in enumerate(self._blocks(reply)):
            kind = block["type"]
            if kind == "text":
                start, deltas = (
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": t} for t in _split(block["text"], 3)],
                )
            elif kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": t} for t in _split(block["thinking"], 2)
                ]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            else:
                start = {**block, "input": {}}
                text = json.dumps(block["input"], separators=(",", ":"))
                deltas = [{"type": "input_json_delta", "partial_json": t} for t in _split(text, 2)]
            events.append(
                _sse(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
            events += [
                _sse(
                    {"type": "content_block_delta", "index": index, "delta": d},
                    "content_block_delta",
                )
                for d in deltas
            ]
            events.append(
                _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
            )
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop(reply), "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        }
        events.append(_sse(delta, "message_delta"))
        events.append(_sse({"type": "message_stop"}, "message_stop"))
        return events


_OPENAI = _OpenAI()
_ANTHROPIC = _Anthropic()
