"""What ``drvenus serve`` and ``drvenus tools serve`` share: defaults, the bind rule, JSON bodies
under a size cap, the busy signal, and running uvicorn on a socket bound first.

fastapi and uvicorn are optional (``pip install 'drvenus[serve]'``): they are imported only inside
the functions that need them, so this module loads without them.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
import time
from typing import Any, Self

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"  # loopback: another address needs a token (see check_bind)
MAX_BODY_BYTES = 1 << 20  # a JSON request body, bytes
# A JSON request body nested deeper is refused: no request of ours needs more than a handful of
# levels, and deep nesting only costs recursion further on (100k levels crash json.loads).
MAX_JSON_DEPTH = 100
SERVE_EXTRA_HINT = "the server needs fastapi and uvicorn: pip install 'drvenus[serve]'"


def require_serve_extra(hint: str = SERVE_EXTRA_HINT) -> None:
    """Raise ImportError with the install ``hint`` when fastapi or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(hint) from exc


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this host."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, *, what: str = "tools",
               token_hint: str = "set DRVENUS_TOOLS_TOKEN (or pass --token)") -> None:
    """Raise ValueError when serving on ``host`` would expose the server without a token."""
    if not token and not is_loopback(host):
        raise ValueError(
            f"refusing to serve {what} on {host or 'all interfaces'} without a token: "
            f"{token_hint}, or bind 127.0.0.1"
        )


class Busy(Exception):
    """The server is full (every slot taken, the queue full): answered 503 (or 429) with
    ``Retry-After``."""


class Reject(Exception):
    """A request answered with an HTTP error (status, JSON body)."""

    def __init__(self, status: int, body: dict[str, Any], retry_after: int | None = None) -> None:
        super().__init__(body.get("error", ""))
        self.status, self.body, self.retry_after = status, body, retry_after


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why decoded JSON cannot be taken in (None: it can): arrays and objects nested deeper
    than ``max_depth``, or a string or key holding a lone surrogate (``"\\ud800"`` decodes to
    one; it is not Unicode text and cannot be written as UTF-8 later). Walks without
    recursion, so any depth is safe to check."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return "a string holds a lone surrogate (such as \\ud800), not valid Unicode"
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                return f"arrays and objects are nested more than {max_depth} levels deep"
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return None


async def read_json_body(request: Any, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The request's JSON object; Reject 413 past ``limit`` bytes (declared or streamed), 400
    when it is not a JSON object or :func:`json_problem` finds it unusable (too deep, a lone
    surrogate)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise Reject(400, {"error": "bad Content-Length"})
        if int(length) > limit:
            raise Reject(413, {"error": f"request body over {limit} bytes"})
    data = bytearray()
    try:
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise Reject(413, {"error": f"request body over {limit} bytes"})
    except Exception as exc:  # starlette's ClientDisconnect (matched by name: no import here)
        if type(exc).__name__ != "ClientDisconnect":
            raise
        # the client went away mid-body: nobody to answer, nothing wrong with the server
        log.warning("%s %s: the client disconnected after %d of %s body bytes",
                    request.method, request.url.path, len(data), length or "?")
        raise Reject(400, {"error": "the client disconnected before sending the whole "
                                    "body"}) from None
    try:
        body = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise Reject(400, {"error": f"the body is not JSON: {exc}"}) from None
    except RecursionError:  # thousands of levels: the parser's own stack runs out
        problem = f"arrays and objects are nested more than {MAX_JSON_DEPTH} levels deep"
        raise Reject(400, {"error": f"the body is refused: {problem}"}) from None
    if not isinstance(body, dict):
        raise Reject(400, {"error": "the body must be a JSON object"})
    problem = json_problem(body)
    if problem is not None:
        raise Reject(400, {"error": f"the body is refused: {problem}"})
    return body


# ----------------------------------------------------------------------------- running it


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (port 0: a free one); OSError when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio only turns Nagle off (TCP_NODELAY) on connections accepted
    # from such a socket, and with Nagle on every response waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        if os.name == "posix":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket) -> str:
    """The http URL of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _disconnected(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it groups or was raised from) is a client that went
    away mid-request (starlette's ClientDisconnect, matched by name)."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ == "ClientDisconnect":
            return True
        group = getattr(exc, "exceptions", None)
        if isinstance(group, tuple) and any(_disconnected(e) for e in group):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class ClientDisconnectFilter(logging.Filter):
    """Turns a logged traceback of a client that disconnected mid-request (an SDK's
    ``logger.exception`` around ``request.body()``) into one warning line: nothing is wrong
    with the server."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _disconnected(record.exc_info[1]):
            record.msg = f"{record.getMessage()}: the client disconnected mid-request"
            record.args, record.exc_info, record.exc_text = None, None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# where the servers' request handlers log (the MCP SDK reads its bodies itself)
_DISCONNECT_LOGGERS = ("mcp.server.streamable_http", "uvicorn.error")
_DISCONNECT_FILTER = ClientDisconnectFilter()


def uvicorn_server(app: Any, sock: socket.socket, *, lifespan: str = "off",
                   graceful_seconds: float | None = None) -> Any:
    """A uvicorn server for ``app`` on a socket bound already (no logging config of its own);
    a client disconnecting mid-request is one warning line, never a traceback."""
    import uvicorn

    for name in _DISCONNECT_LOGGERS:
        logger = logging.getLogger(name)
        if _DISCONNECT_FILTER not in logger.filters:
            logger.addFilter(_DISCONNECT_FILTER)

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, lifespan=lifespan,
        timeout_keep_alive=30, timeout_graceful_shutdown=graceful_seconds,
    )
    return uvicorn.Server(config)


class ServerThread:
    """An app served by uvicorn in a daemon thread, on a socket bound before it starts (port 0:
    a free port). For tests and benchmarks: ``with ServerThread(app) as server: server.url``.
    Subclasses set ``lifespan`` ("on" runs the app's startup/shutdown) and ``label``."""

    lifespan = "off"
    label = "tool server"

    def __init__(self, app: Any, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> Self:
        sock = bind_socket(self.host, self.port)
        self.url = socket_url(sock)
        self._server = uvicorn_server(self.app, sock, lifespan=self.lifespan,
                                      graceful_seconds=5 if self.lifespan == "on" else None)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
            name=f"drvenus-{self.label.replace(' ', '-')}",
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.label} at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "DEFAULT_HOST",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "SERVE_EXTRA_HINT",
    "Busy",
    "Reject",
    "ServerThread",
    "bind_socket",
    "check_bind",
    "is_loopback",
    "json_problem",
    "read_json_body",
    "require_serve_extra",
    "socket_url",
    "uvicorn_server",
]
