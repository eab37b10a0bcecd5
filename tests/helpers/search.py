"""A fake Serper (``POST /search``, checks X-API-KEY) / SearXNG (``GET /search?format=json``)
server on 127.0.0.1: scripted answers first, then a default answer for the query."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

KEY = "sk-serper-SECRET-0123456789abcdef"


@dataclass
class Canned:
    """One scripted answer; ``body`` None means the default answer for the query."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    json: Any
    time: float

    @property
    def query(self) -> str:
        return self.json["q"] if isinstance(self.json, dict) else self.params.get("q", "")


def serper_answer(query: str, n: int) -> dict[str, Any]:
    """What serper.dev returns (trimmed); queries containing 'nothing' match nothing."""
    params = {"q": query, "type": "search", "engine": "google"}
    if "nothing" in query:
        return {"searchParameters": params, "credits": 1}
    organic = []
    for i in range(1, n + 1):
        item = {
            "title": f"{query} - result {i}",
            "link": f"https://example.com/{i}?q={query}",
            "snippet": f"Snippet {i} about {query}.",
            "position": i,
        }
        if i == 1:
            item["date"] = "Mar 3, 2024"
        organic.append(item)
    return {"searchParameters": params, "organic": organic, "credits": 1}


def searxng_answer(query: str, n: int) -> dict[str, Any]:
    """What SearXNG's format=json returns (trimmed)."""
    results = []
    if "nothing" not in query:
        for i in range(1, n + 1):
            results.append(
                {
                    "url": f"https://searx.example/{i}",
                    "title": f"{query} ({i})",
                    "content": f"Content {i} for {query}.",
                    "engine": "duckduckgo",
                    "publishedDate": "2024-03-03T00:00:00" if i == 1 else None,
                }
            )
    return {"query": query, "number_of_results": len(results), "results": results}


class FakeSearchServer:
    """Serper's ``POST /search`` (kind 'serper', checks X-API-KEY) or SearXNG's
    ``GET /search?format=json`` on 127.0.0.1; scripted answers first, then the default."""

    def __init__(self, kind: str, *, n: int = 12, delay: float = 0.0) -> None:
        self.kind = kind
        self.n = n
        self.delay = delay
        self.requests: list[Seen] = []
        self.script: deque[Canned] = deque()
        self.always: Canned | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.handle(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                fake.handle(self, json.loads(self.rfile.read(length) or b"null"))

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that timed out hang up: not an error here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def queue(self, *canned: Canned) -> None:
        with self.lock:
            self.script.extend(canned)

    def handle(self, h: BaseHTTPRequestHandler, payload: Any) -> None:
        parts = urlsplit(h.path)
        params = {k: v[0] for k, v in parse_qs(parts.query).items()}
        seen = Seen(
            h.command, parts.path, params, dict(h.headers.items()), payload, time.monotonic()
        )
        with self.lock:
            self.requests.append(seen)
            canned = self.script.popleft() if self.script else (self.always or Canned())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.stopping.wait(self.delay + canned.delay)
            status, body = self.answer(h, seen, canned)
            data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in canned.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        finally:
            with self.lock:
                self.in_flight -= 1

    def answer(self, h: BaseHTTPRequestHandler, seen: Seen, canned: Canned) -> tuple[int, Any]:
        if seen.path != "/search":
            return 404, {"message": "not found"}
        if self.kind == "serper":
            if h.headers.get("X-API-KEY") != KEY:
                return 401, {"message": "Unauthorized.", "statusCode": 401}
            if h.command != "POST" or not isinstance(seen.json, dict):
                return 400, {"message": "Bad request", "statusCode": 400}
        elif seen.params.get("format") != "json":
            return 403, "forbidden"
        if canned.body is not None or canned.status != 200:
            return canned.status, canned.body if canned.body is not None else {"message": "x"}
        make = serper_answer if self.kind == "serper" else searxng_answer
        return 200, make(seen.query, self.n)

    def __enter__(self) -> FakeSearchServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
