"""A real local OpenAI-compatible HTTP server for tests (stdlib only, runs in a thread).

Speaks ``POST /v1/chat/completions`` (plain JSON or ``stream: true`` server-sent events) and
``GET /v1/models`` on 127.0.0.1 at a free port. Replies are scripted, every request is recorded.

    with StubServer(["<think>\\nhi\\n</think>\\n<answer>\\n42\\n</answer>"]) as server:
        model = OpenAICompatModel(server.base_url, "stub-model")
        ...
        assert server.requests[0].json["top_k"] == 20

A reply is one of:

- ``str``: the assistant content;
- :class:`Reply` (or a dict of its fields): content, ``reasoning_content``, ``status`` (an error
  status sends an OpenAI-style error body), a raw ``body`` (dict or str) sent verbatim,
  ``delay`` seconds before answering, ``usage``, ``finish_reason``, ``headers``, ``drop``
  (close the connection without answering);
- a callable ``(request: RecordedRequest) -> str | Reply | dict`` computing the reply.

Replies are consumed in order; once the script is used up, ``default`` answers (a well-formed
protocol answer turn unless given). ``fail_next(n, status)`` queues ``n`` failures in front.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_CONTENT = "<think>\nA stub thought.\n</think>\n<answer>\nstub answer\n</answer>"


@dataclass
class Reply:
    """One scripted response of the stub server."""

    content: str | None = DEFAULT_CONTENT
    reasoning_content: str | None = None
    status: int = 200
    body: dict[str, Any] | str | None = None
    delay: float = 0.0
    usage: dict[str, int] | None = None
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False


@dataclass(frozen=True)
class RecordedRequest:
    """A request the stub received."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any
    time: float


ReplySpec = str | Reply | dict[str, Any] | Callable[[RecordedRequest], Any]


def _as_reply(spec: Any) -> Reply:
    if isinstance(spec, Reply):
        return spec
    if isinstance(spec, str):
        return Reply(content=spec)
    if isinstance(spec, dict):
        return Reply(**spec)
    raise TypeError(f"not a reply: {spec!r}")


def _approx_tokens(text: str) -> int:
    return max(1, len(text.encode("utf-8")) // 4) if text else 0


class StubServer:
    """A scripted OpenAI-compatible server on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        replies: Iterable[ReplySpec] = (),
        *,
        default: ReplySpec | None = None,
        delay: float = 0.0,
        model: str = "stub-model",
        owned_by: str = "stub",
    ) -> None:
        self.model = model
        self.owned_by = owned_by
        self.delay = delay
        self.default: ReplySpec = default if default is not None else Reply()
        self.requests: list[RecordedRequest] = []
        self.in_flight = self.max_in_flight = 0  # chat requests inside their delay at once
        self._script: deque[ReplySpec] = deque(replies)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control -----------------------------------------------------------------------------

    def start(self) -> StubServer:
        handler = type("_BoundHandler", (_Handler,), {"stub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in a delay
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stub server is not running")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, what OpenAI clients take as base URL."""
        return self.url + "/v1"

    def add_replies(self, *replies: ReplySpec) -> None:
        with self._lock:
            self._script.extend(replies)

    def fail_next(self, n: int = 1, status: int = 500, message: str = "stub failure") -> None:
        """Answer the next ``n`` chat requests with HTTP ``status``."""
        with self._lock:
            for _ in range(n):
                self._script.appendleft(Reply(status=status, content=message))

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # -- internals -----------------------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            spec = self._script.popleft() if self._script else self.default
        if callable(spec) and not isinstance(spec, Reply):
            spec = spec(request)
        return _as_reply(spec)

    def _delay(self, seconds: float) -> None:
        """Sleep ``seconds`` (woken by stop), counting the requests doing so at once."""
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._sleep(seconds)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)


class _Handler(BaseHTTPRequestHandler):
    stub: StubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _recorded(self, payload: Any) -> RecordedRequest:
        rec = RecordedRequest(
            self.command, self.path, dict(self.headers.items()), payload, time.monotonic()
        )
        self.stub._record(rec)
        return rec

    def do_GET(self) -> None:  # http.server naming
        self._recorded(None)
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": self.stub.model, "object": "model", "owned_by": self.stub.owned_by}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # http.server naming
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        rec = self._recorded(payload)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
            self._send_json(400, {"error": {"message": "body must be JSON with 'messages'"}})
            return
        reply = self.stub._next_reply(rec)
        self.stub._delay(self.stub.delay + reply.delay)
        if reply.drop:
            self.close_connection = True
            self.connection.close()
            return
        if reply.body is not None:
            self._send_json(reply.status, reply.body, reply.headers)
            return
        if reply.status >= 400:
            error = {"message": reply.content or "error", "type": "stub_error"}
            self._send_json(reply.status, {"error": error}, reply.headers)
            return
        prompt_text = "".join(str(m.get("content") or "") for m in payload["messages"])
        content = reply.content
        usage = reply.usage or {
            "prompt_tokens": _approx_tokens(prompt_text),
            "completion_tokens": _approx_tokens((content or "") + (reply.reasoning_content or "")),
        }
        usage.setdefault(
            "total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        )
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.reasoning_content is not None:
            message["reasoning_content"] = reply.reasoning_content
        model = payload.get("model") or self.stub.model
        if payload.get("stream"):
            self._stream(model, message, reply, usage)
            return
        body = {
            "id": f"chatcmpl-stub-{len(self.stub.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
            "usage": usage,
        }
        self._send_json(200, body, reply.headers)

    def _stream(self, model: str, message: dict[str, Any], reply: Reply, usage: dict) -> None:
        """Server-sent events: one role chunk, one content chunk, a finish chunk, [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        deltas: list[dict[str, Any]] = [{"role": "assistant"}]
        if reply.reasoning_content is not None:
            deltas.append({"reasoning_content": reply.reasoning_content})
        deltas.append({"content": message["content"] or ""})
        chunks = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas] + [
            {"index": 0, "delta": {}, "finish_reason": reply.finish_reason}
        ]
        for i, choice in enumerate(chunks):
            event = {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [choice],
            }
            if i == len(chunks) - 1:
                event["usage"] = usage
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


__all__ = ["DEFAULT_CONTENT", "RecordedRequest", "Reply", "StubServer"]
