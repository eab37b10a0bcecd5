"""Access control of ``drvenus serve``: one ASGI middleware in front of every route.

- With a token, every route but ``/health`` needs it: ``Authorization: Bearer <token>`` (API
  clients, MCP), or the ``drvenus_token`` cookie (the browser). Opening ``/?token=<token>`` sets
  that cookie (HttpOnly, SameSite=Strict) and redirects to ``/`` so the token leaves the
  address bar. Comparisons take constant time.
- Without a token (loopback only, see :func:`drvenus.tools.server.check_bind`), the ``Host``
  header must name a loopback host, so a web page on another site cannot reach the server
  through DNS rebinding.
- Requests that change something must be JSON (``Content-Type: application/json``): a form
  or a "simple" cross-site request cannot start runs.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import parse_qs

COOKIE = "drvenus_token"
OPEN_PATHS = frozenset({"/health"})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
JSON_ONLY_PREFIXES = ("/api/", "/v1/")


def _header(scope: dict[str, Any], name: bytes) -> bytes:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return b""


def _cookie(scope: dict[str, Any], name: str) -> str:
    for part in _header(scope, b"cookie").decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def host_of(header: str) -> str:
    """The host of a ``Host`` header, without the port (IPv6 keeps its brackets)."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware enforcing the rules in the module doc."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token
        self.bearer = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        problem = self._problem(scope, path)
        if problem is not None and scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        if problem is not None:
            await _plain(send, *problem)
            return
        if self.token and path == "/" and self._query_token(scope):
            await _set_cookie_redirect(send, self.token)
            return
        await self.app(scope, receive, send)

    def _problem(self, scope: dict[str, Any], path: str) -> tuple[int, str] | None:
        if self.token is None:
            host = host_of(_header(scope, b"host").decode("latin-1"))
            if host not in LOOPBACK_HOSTS:
                return 421, "this server only answers requests addressed to a loopback host"
        elif path not in OPEN_PATHS and not self._authorized(scope, path):
            return 401, "missing or wrong token"
        if scope.get("method") == "POST" and path.startswith(JSON_ONLY_PREFIXES):
            kind = _header(scope, b"content-type").split(b";")[0].strip().lower()
            if kind != b"application/json":
                return 415, "send JSON (Content-Type: application/json)"
        return None

    def _authorized(self, scope: dict[str, Any], path: str) -> bool:
        assert self.token is not None and self.bearer is not None
        if hmac.compare_digest(_header(scope, b"authorization"), self.bearer):
            return True
        if hmac.compare_digest(_cookie(scope, COOKIE).encode(), self.token.encode()):
            return True
        return path == "/" and self._query_token(scope)

    def _query_token(self, scope: dict[str, Any]) -> bool:
        assert self.token is not None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())


async def _plain(send: Any, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _set_cookie_redirect(send: Any, token: str) -> None:
    cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
    await send({
        "type": "http.response.start",
        "status": 303,
        "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode()),
                    (b"content-length", b"0")],
    })
    await send({"type": "http.response.body", "body": b""})


__all__ = ["COOKIE", "Guard", "host_of"]
