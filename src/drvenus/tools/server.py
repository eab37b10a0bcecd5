"""The tool server: one toolbox shared over HTTP by agents, batch runs, evaluation and RL rollouts.

Routes (all JSON in and out unless said otherwise):

- ``POST /search`` ``{"query": [...]}`` and ``POST /visit`` ``{"url": [...], "goal": "..."}``
  answer ``{"content": "..."}``: exactly the text :meth:`Toolbox.call` returns, i.e. the body the
  agent puts inside ``<tool_response>``. Arguments are normalised as the agent loop does
  (:func:`drvenus.protocol.normalize_tool_call`); unusable ones answer 422 with the protocol's
  error text in ``content`` and the reason in ``error``. A tool that fails answers 200 with the
  protocol's error text, as in process: tool errors are never HTTP errors.
- ``GET /metrics``: Prometheus text (the toolbox's :class:`Metrics` plus per-route counters and
  latency histograms).
- ``GET /health``: ``{"status": "ok", "tools": [...]}``. It is the only route that needs no
  token, so that load balancers and supervisors can probe liveness; it tells nothing else.

Security (:class:`drvenus.net.guard.Guard`, the guard of ``drvenus serve`` too): the server binds
127.0.0.1 by default and refuses any other address without a token. With a token every route but
``/health`` needs ``Authorization: Bearer <token>`` (compared in constant time) and answers 401
without it. Without a token only requests addressed to a loopback host are answered (421 for any
other ``Host``: no DNS rebinding), and with or without one a POST must be JSON (415 otherwise), so
a web page the user opens cannot make the server search or read pages. Bodies are bounded (413),
running tool calls are bounded by a semaphore with a bounded queue behind it (503 with
``Retry-After`` when full).
Identical calls are answered from a small in-memory cache (and concurrent ones share one call).

fastapi and uvicorn are optional: ``pip install 'drvenus[serve]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from drvenus.net.guard import Guard
from drvenus.net.secrets import redact
from drvenus.net.server import (
    DEFAULT_HOST,
    MAX_BODY_BYTES,
    Busy,
    Reject,
    bind_socket,
    check_bind,
    read_json_body,
    require_serve_extra,
    socket_url,
    uvicorn_server,
)
from drvenus.protocol import (
    DRVENUS_TEXTS,
    TOOL_NAMES,
    VISIT,
    ProtocolTexts,
    TextsLike,
    ToolCall,
    ToolCallError,
    normalize_tool_call,
    visit_failure_marks,
)
from drvenus.protocol import tool_error_message as _tool_error
from drvenus.tools.metrics import BUCKETS, Metrics
from drvenus.tools.toolbox import close_quietly

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
DEFAULT_MAX_CONCURRENCY = 32
DEFAULT_MAX_QUEUE = 1024
DRAIN_SECONDS = 10.0  # after Ctrl-C, how long running calls may still finish
DEFAULT_CACHE_SIZE = 4096
DEFAULT_CACHE_TTL = 600.0
OPEN_ROUTES = frozenset({"/health"})
ROUTES = ("/search", "/visit", "/health", "/metrics")
SERVE_EXTRA_HINT = "the tool server needs fastapi and uvicorn: pip install 'drvenus[serve]'"


class ToolRunner(Protocol):
    """What the server needs from a toolbox (a :class:`~drvenus.tools.toolbox.Toolbox`)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    async def call(self, tool_call: ToolCall) -> str: ...


# ------------------------------------------------------------------------ pieces of the app


class RouteMetrics:
    """HTTP requests by route and status, latency by route, calls in flight (Prometheus text)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self._hist: dict[str, list[int]] = {}
        self._sum: dict[str, float] = defaultdict(float)
        self.in_flight = 0

    def observe(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(route, status)] += 1
            counts = self._hist.setdefault(route, [0] * (len(BUCKETS) + 1))
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    counts[i] += 1
            counts[-1] += 1
            self._sum[route] += seconds

    def render(self) -> str:
        name = "drvenus_tool_server_request_seconds"
        lines = [
            "# HELP drvenus_tool_server_requests_total Tool server HTTP requests by route, status.",
            "# TYPE drvenus_tool_server_requests_total counter",
        ]
        with self._lock:
            for (route, status), n in sorted(self.requests.items()):
                lines.append(
                    f'drvenus_tool_server_requests_total{{route="{route}",status="{status}"}} {n}'
                )
            lines += [
                f"# HELP {name} Tool server HTTP request latency by route.",
                f"# TYPE {name} histogram",
            ]
            for route, counts in sorted(self._hist.items()):
                for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                    lines.append(f'{name}_bucket{{route="{route}",le="{bound}"}} {n}')
                lines.append(f'{name}_sum{{route="{route}"}} {self._sum[route]:.6f}')
                lines.append(f'{name}_count{{route="{route}"}} {counts[-1]}')
            lines += [
                "# HELP drvenus_tool_server_calls_in_flight Tool calls running or queued.",
                "# TYPE drvenus_tool_server_calls_in_flight gauge",
                f"drvenus_tool_server_calls_in_flight {self.in_flight}",
            ]
        return "\n".join(lines) + "\n"


class Slots:
    """At most ``running`` tool calls at once and ``queued`` more waiting; beyond that, Busy."""

    def __init__(self, running: int, queued: int) -> None:
        if running < 1 or queued < 0:
            raise ValueError("max_concurrency must be >= 1 and max_queue >= 0")
        self._sem = asyncio.Semaphore(running)
        self.queued = queued
        self.waiting = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._sem.locked() and self.waiting >= self.queued:
            raise Busy
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._sem.release()


def cacheable(content: str, texts: TextsLike = DRVENUS_TEXTS) -> bool:
    """Only complete answers are kept: no error text, no page that failed to load (a failure
    frame in ``texts``' words, the toolbox's profile's)."""
    return not content.startswith("ERROR:") and not any(
        mark in content for mark in visit_failure_marks(texts))


def toolbox_texts(toolbox: object) -> ProtocolTexts:
    """The profile texts a toolbox's visit tool writes with (drvenus's when it has none)."""
    tools = getattr(toolbox, "tools", None)
    visit = tools.get(VISIT) if isinstance(tools, dict) else None
    texts = getattr(visit, "texts", None)
    return texts if isinstance(texts, ProtocolTexts) else DRVENUS_TEXTS


class ResponseCache:
    """LRU of tool responses by call key, each kept ``ttl`` seconds; concurrent identical calls
    share one computation. ``size`` 0 turns caching off (calls are still shared). ``texts``:
    whose visit failure frames are not kept (the toolbox's profile's)."""

    def __init__(self, size: int = DEFAULT_CACHE_SIZE, ttl: float = DEFAULT_CACHE_TTL,
                 texts: TextsLike = DRVENUS_TEXTS) -> None:
        self.size, self.ttl, self.texts = size, ttl, texts
        self._items: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._pending: dict[str, _Shared] = {}

    def get(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] < time.monotonic():
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: str, content: str) -> None:
        if self.size <= 0 or not cacheable(content, self.texts):
            return
        self._items[key] = (time.monotonic() + self.ttl, content)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    async def get_or_call(
        self, key: str, compute: Callable[[], Awaitable[str]]
    ) -> tuple[str, bool]:
        """(content, whether it came without a call of our own). The call runs as its own task
        that every identical request waits on; a waiter cancelled (its client gone) stops
        waiting, and the call itself is cancelled when no one waits for it any more."""
        hit = self.get(key)
        if hit is not None:
            return hit, True
        shared = self._pending.get(key)
        ours = shared is None
        if shared is None:
            shared = self._pending[key] = _Shared(asyncio.ensure_future(compute()))
            shared.task.add_done_callback(lambda task: self._settle(key, task))
        shared.waiters += 1
        try:
            content = await asyncio.shield(shared.task)
        except asyncio.CancelledError:
            if not shared.task.done():
                shared.waiters -= 1
                if shared.waiters == 0:
                    shared.task.cancel()  # nobody wants it any more
            raise
        return content, not ours

    def _settle(self, key: str, task: asyncio.Future[str]) -> None:
        if self._pending.get(key) is not None and self._pending[key].task is task:
            del self._pending[key]
        if not task.cancelled() and task.exception() is None:
            self.put(key, task.result())


@dataclass
class _Shared:
    task: asyncio.Future[str]
    waiters: int = 0


class RouteTimer:
    """ASGI middleware counting every HTTP request by route and status, with its latency (the
    guard's refusals included: it sits outside the :class:`~drvenus.net.guard.Guard`)."""

    def __init__(self, app: Any, routes: RouteMetrics) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        start = time.perf_counter()
        status = 500

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.routes.observe(route, status, time.perf_counter() - start)


def _dumps(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # a lone surrogate in the text: plain json escapes it
        import json

        return json.dumps(body).encode()


# ------------------------------------------------------------------------------- the app


class ToolService:
    """The request handling behind the routes, without the web framework."""

    def __init__(
        self, toolbox: ToolRunner, metrics: Metrics, slots: Slots, cache: ResponseCache,
        routes: RouteMetrics, max_body_bytes: int,
    ) -> None:
        self.toolbox, self.metrics, self.slots, self.cache = toolbox, metrics, slots, cache
        self.routes, self.max_body_bytes = routes, max_body_bytes

    async def handle(self, name: str, request: Any) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) for one tool request; raises Reject for HTTP errors."""
        arguments = await read_json_body(request, self.max_body_bytes)
        try:
            call = normalize_tool_call({"name": name, "arguments": arguments})
        except ToolCallError as exc:
            reason = redact(str(exc))
            return 422, {"error": reason, "content": _tool_error(name, reason)}
        try:
            content, shared = await self.cache.get_or_call(call.key(), lambda: self._run(call))
        except Busy:
            raise Reject(503, {"error": "the tool server is busy"}, retry_after=1) from None
        self.metrics.cache(name, shared)
        return 200, {"content": content}

    async def _run(self, call: ToolCall) -> str:
        self.routes.in_flight += 1
        try:
            async with self.slots.slot():
                return await self.toolbox.call(call)
        except Busy:
            raise
        except Exception as exc:  # Toolbox.call does not raise; another runner might
            log.exception("tool %s raised", call.name)
            return _tool_error(call.name, redact(str(exc) or type(exc).__name__))
        finally:
            self.routes.in_flight -= 1


def create_app(
    toolbox: ToolRunner,
    *,
    token: str | None = None,
    metrics: Metrics | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_body_bytes: int = MAX_BODY_BYTES,
    cache_size: int = DEFAULT_CACHE_SIZE,
    cache_ttl: float = DEFAULT_CACHE_TTL,
) -> FastAPI:
    """The FastAPI app serving ``toolbox`` (see the module doc). ``metrics``: the toolbox's
    (its ``metrics`` attribute when it has one), else a new one."""
    require_serve_extra(SERVE_EXTRA_HINT)
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    metrics = metrics or getattr(toolbox, "metrics", None) or Metrics()
    routes = RouteMetrics()
    service = ToolService(
        toolbox, metrics, Slots(max_concurrency, max_queue),
        ResponseCache(cache_size, cache_ttl, toolbox_texts(toolbox)), routes, max_body_bytes,
    )
    app = FastAPI(
        title="drvenus tool server", docs_url=None, redoc_url=None, openapi_url=None,
    )

    def json_response(
        status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Response:
        return Response(_dumps(body), status, headers, media_type="application/json")

    async def tool_route(name: str, request: Request) -> Response:
        try:
            status, body = await _unless_gone(request, service.handle(name, request))
        except ClientGone:  # nobody to answer: the call was cancelled (unless shared)
            return Response(b"", 499)
        except asyncio.CancelledError:  # the server is stopping: an answer, not a traceback
            return json_response(503, {"error": "the tool server is shutting down"},
                                 {"Retry-After": "5"})
        except Reject as exc:
            headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
            return json_response(exc.status, exc.body, headers)
        return json_response(status, body)

    async def search(request: Request) -> Response:
        return await tool_route("search", request)

    async def visit(request: Request) -> Response:
        return await tool_route("visit", request)

    async def health(request: Request) -> Response:
        names = [n for n in getattr(toolbox, "names", TOOL_NAMES) if n in TOOL_NAMES]
        return json_response(200, {"status": "ok", "tools": names})

    async def prometheus(request: Request) -> Response:
        text = metrics.render() + routes.render()
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # plain (Starlette) routes: the handlers read the body themselves, with a size bound
    app.add_route("/search", search, methods=["POST"])
    app.add_route("/visit", visit, methods=["POST"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/metrics", prometheus, methods=["GET"])

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("tool server error on %s", request.url.path, exc_info=exc)
        return json_response(500, {"error": "internal error in the tool server"})

    app.state.metrics, app.state.routes, app.state.service = metrics, routes, service
    app.add_middleware(Guard, token=token, open_paths=OPEN_ROUTES, json_errors=True)
    app.add_middleware(RouteTimer, routes=routes)  # outermost: counts the guard's refusals too
    return app



class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


async def _unless_gone(request: Any, work: Awaitable[Any], poll: float = 0.5) -> Any:
    """``work``'s result, or :class:`ClientGone` (``work`` cancelled) once the client has
    disconnected: a tool call nobody waits for stops instead of holding a slot."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

# ----------------------------------------------------------------------------- running it


def serve(
    toolbox: ToolRunner,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    on_ready: Callable[[str], None] | None = None,
    **options: Any,
) -> None:
    """Serve ``toolbox`` until interrupted, then close it. Raises ValueError for a public
    ``host`` without a token, ImportError without the ``serve`` extra, OSError when the port
    is taken. ``on_ready(url)`` is called once the socket listens; ``options`` go to
    :func:`create_app`."""
    try:
        check_bind(host, token)
        app = create_app(toolbox, token=token, **options)
        sock = bind_socket(host, port)
    except BaseException:
        close_quietly(toolbox)
        raise
    # Ctrl-C: calls in flight get DRAIN_SECONDS to finish, then they are cancelled
    server = uvicorn_server(app, sock, graceful_seconds=DRAIN_SECONDS)
    if on_ready is not None:
        on_ready(socket_url(sock))
    log.info("tool server listening on %s", socket_url(sock))

    async def run() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            close = getattr(toolbox, "aclose", None)
            if close is not None:
                await close()

    try:
        asyncio.run(run())
    finally:
        sock.close()


__all__ = [
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_PORT",
    "ResponseCache",
    "RouteMetrics",
    "RouteTimer",
    "create_app",
    "serve",
]
