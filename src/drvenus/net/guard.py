"""The one access guard of ``drvenus serve`` and ``drvenus tools serve``: an ASGI middleware in
front of every route (HTTP and websocket requests alike).

- With a token, every route but the open ones (``/health``) needs it: ``Authorization: Bearer
  <token>`` (API clients, MCP, :class:`~drvenus.tools.remote.RemoteToolbox`). With
  ``browser_login`` also the ``drvenus_token`` cookie (the browser): ``/`` without it is a page
  asking for the token, whose form POSTs it (so it stays out of the address bar, the history
  and access logs); that, or opening ``/?token=<token>``, sets the cookie (HttpOnly,
  SameSite=Lax) and redirects to ``/``. ``/mcp`` refuses with 403 and
  the reason (a 401 challenge sends MCP clients into OAuth). Comparisons take constant time.
- Without a token (loopback only, see :func:`drvenus.net.server.check_bind`), the ``Host``
  header must name a loopback host (421 otherwise), so a web page on another site cannot reach
  the server through DNS rebinding.
- POST requests under ``json_prefixes`` must be JSON (``Content-Type: application/json``, 415
  otherwise): a form or another "simple" cross-site request, which a browser sends without
  asking the server first, cannot start anything.

A refused websocket request is closed with code 1008 (policy violation). Refusals are plain
text, or ``{"error": ...}`` JSON with ``json_errors``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

from drvenus.net.server import is_loopback

COOKIE = "drvenus_token"
OPEN_PATHS = frozenset({"/health"})
NO_CHALLENGE_PREFIXES = ("/mcp",)  # refused with 403 and a reason, not a 401 OAuth challenge


def header(scope: dict[str, Any], name: bytes) -> bytes:
    """The first value of header ``name`` (lower case) in an ASGI scope, or b""."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return b""


def _cookie(scope: dict[str, Any], name: str) -> str:
    for part in header(scope, b"cookie").decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def host_of(value: str) -> str:
    """The host of a ``Host`` header, without the port (IPv6 keeps its brackets)."""
    if value.startswith("["):
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware enforcing the rules in the module doc.

    ``token``: None for a loopback-only server. ``open_paths``: routes that need no token.
    ``json_prefixes``: path prefixes whose POSTs must be JSON (``("/",)``: every POST).
    ``browser_login``: accept the token cookie and ``/?token=``. ``json_errors``: refusals as
    ``{"error": ...}`` JSON instead of plain text.
    """

    def __init__(
        self,
        app: Any,
        token: str | None,
        *,
        open_paths: Iterable[str] = OPEN_PATHS,
        json_prefixes: tuple[str, ...] = ("/",),
        browser_login: bool = False,
        json_errors: bool = False,
    ) -> None:
        self.app, self.token = app, token or None
        self.bearer = f"Bearer {token}".encode() if token else None
        self.open_paths = frozenset(open_paths)
        self.json_prefixes = json_prefixes
        self.browser_login = browser_login
        self.json_errors = json_errors

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if (self.browser_login and self.token and path == "/" and scope["type"] == "http"
                and scope.get("method") == "POST"):  # the login form
            given = await _posted_token(receive)
            if hmac.compare_digest(given.encode(), self.token.encode()):
                await _set_cookie_redirect(send, self.token)
            else:
                await _login_page(send, wrong=True)
            return
        problem = self.problem(scope)
        if problem is not None and scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        if problem is not None:
            status, text = problem
            if status == 401 and self.browser_login and path == "/":
                await _login_page(send, wrong=bool(self._given_query_token(scope)))
            elif status == 401 and path.startswith(NO_CHALLENGE_PREFIXES):
                # MCP clients answer a 401 challenge with OAuth discovery; say what is wrong
                await self._refuse(send, 403, f"{text}: send Authorization: Bearer <token>",
                                   challenge=False)
            else:
                await self._refuse(send, status, text)
            return
        if self.browser_login and self.token and path == "/" and self._query_token(scope):
            await _set_cookie_redirect(send, self.token)
            return
        await self.app(scope, receive, send)

    def problem(self, scope: dict[str, Any]) -> tuple[int, str] | None:
        """(status, reason) when the request is refused, else None."""
        path = scope.get("path", "")
        if self.token is None:
            host = host_of(header(scope, b"host").decode("latin-1"))
            if not is_loopback(host):
                return 421, "this server only answers requests addressed to a loopback host"
        elif path not in self.open_paths and not self._authorized(scope, path):
            return 401, "missing or wrong token"
        if scope.get("method") == "POST" and path.startswith(self.json_prefixes):
            kind = header(scope, b"content-type").split(b";")[0].strip().lower()
            if kind != b"application/json":
                return 415, "send JSON (Content-Type: application/json)"
        return None

    def _authorized(self, scope: dict[str, Any], path: str) -> bool:
        assert self.token is not None and self.bearer is not None
        if hmac.compare_digest(header(scope, b"authorization"), self.bearer):
            return True
        if not self.browser_login:
            return False
        if hmac.compare_digest(_cookie(scope, COOKIE).encode(), self.token.encode()):
            return True
        return path == "/" and self._query_token(scope)

    @staticmethod
    def _given_query_token(scope: dict[str, Any]) -> str:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return (query.get("token") or [""])[0]

    def _query_token(self, scope: dict[str, Any]) -> bool:
        assert self.token is not None
        given = self._given_query_token(scope)
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def _refuse(self, send: Any, status: int, text: str, *, challenge: bool = True
                      ) -> None:
        if self.json_errors:
            body, kind = json.dumps({"error": text}).encode(), b"application/json"
        else:
            body, kind = text.encode(), b"text/plain; charset=utf-8"
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        if status == 401 and challenge:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>drvenus: token</title>
<style>body{{font:16px system-ui,sans-serif;max-width:28rem;margin:12vh auto;padding:0 1rem}}
input,button{{font:inherit;padding:.4rem .6rem}}input{{width:100%;box-sizing:border-box}}
p.bad{{color:#c92a2a}}</style></head><body><h1>drvenus</h1>
<p>This server needs its token (the one it was started with: <code>--token</code> or
<code>DRVENUS_SERVE_TOKEN</code>).</p>{wrong}
<form method="post" action="/"><label for="t">Token</label>
<input id="t" name="token" type="password" autocomplete="current-password" required autofocus>
<p><button type="submit">Open</button></p></form></body></html>"""


MAX_LOGIN_BYTES = 4096


async def _posted_token(receive: Any) -> str:
    """The ``token`` field of the login form's urlencoded body ("" when absent or too long)."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_LOGIN_BYTES:
            return ""
        if not message.get("more_body"):
            break
    return (parse_qs(body.decode("latin-1")).get("token") or [""])[0]


async def _login_page(send: Any, *, wrong: bool) -> None:
    """The page ``/`` shows without the token: a form to enter it (then the cookie is set)."""
    note = '<p class="bad">That token is not the right one.</p>' if wrong else ""
    body = LOGIN_PAGE.format(wrong=note).encode()
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store"),
        (b"www-authenticate", b"Bearer"),
    ]})
    await send({"type": "http.response.body", "body": body})


async def _set_cookie_redirect(send: Any, token: str) -> None:
    # Lax: a run link opened from another site (a top-level GET) carries it; cross-site POSTs
    # do not, and every POST must be JSON anyway
    cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"
    await send({
        "type": "http.response.start",
        "status": 303,
        "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode()),
                    (b"content-length", b"0")],
    })
    await send({"type": "http.response.body", "body": b""})


__all__ = ["COOKIE", "OPEN_PATHS", "Guard", "header", "host_of"]
