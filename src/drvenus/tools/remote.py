"""A toolbox that forwards tool calls to a tool server (``drvenus tools serve``).

:class:`RemoteToolbox` has the interface the agent loop uses of
:class:`~drvenus.tools.toolbox.Toolbox` (``names``, ``in``, ``call``, ``aclose``) and returns the
same text for the same call. It never raises for a failed call: an unreachable server, a timeout
or an HTTP error comes back as the protocol's tool error text. Transient failures (connection
refused, connect timeout, the HTTP statuses :func:`drvenus.net.is_retryable_status` accepts) are
retried under :class:`drvenus.net.RetryPolicy`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from drvenus.net import (
    LoopClient,
    RetryPolicy,
    is_retryable_status,
    parse_retry_after,
    redact_url,
    with_retries,
)
from drvenus.net.secrets import redact
from drvenus.net.server import is_loopback
from drvenus.protocol import TOOL_NAMES, ToolCall, tool_error_message, unknown_tool_message
from drvenus.tools.base import ProviderError, UnusableToolText

if TYPE_CHECKING:
    from drvenus.config import Settings

log = logging.getLogger(__name__)

# The server's own tool timeout (Toolbox's 300 s) plus room for the queue and the network.
DEFAULT_REMOTE_TIMEOUT = 330.0


class ToolServerUnusable(ValueError):
    """The tool server cannot serve this client at all (down, or refusing its token)."""


class RemoteToolbox:
    """Runs protocol tool calls on the tool server at ``base_url``; ``call`` never raises.

    ``names`` are the protocol's tools (the server answers unknown ones as a local toolbox
    would). ``timeout``: seconds per attempt. ``transport``: an httpx transport (tests).
    One connection pool per event loop: a toolbox used from a new loop opens a new pool.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_REMOTE_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"tool server URL must be http(s)://host:port, got {redact_url(base_url)!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.where = redact_url(self.base_url)  # for messages and logs: no credentials
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._has_token = bool(token)
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._transport = transport
        self._clients = LoopClient(lambda: httpx.AsyncClient(
            headers=self._headers, limits=self._limits, transport=self._transport,
        ))
        if token and parts.scheme == "http" and not is_loopback(parts.hostname or ""):
            log.warning("the tool server token is sent unencrypted to %s (use https)", self.where)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> RemoteToolbox:
        """The server of ``settings.tools_url`` with ``settings.tools_token``."""
        if not settings.tools_url:
            raise ValueError("no tool server URL: set DRVENUS_TOOLS_URL or pass --tools-url")
        return cls(settings.tools_url, settings.tools_token_value(), **kwargs)

    def __repr__(self) -> str:
        return f"RemoteToolbox({self.where!r})"

    @property
    def names(self) -> tuple[str, ...]:
        return TOOL_NAMES

    def __contains__(self, name: object) -> bool:
        return name in TOOL_NAMES

    def _http(self) -> httpx.AsyncClient:
        return self._clients.get()

    async def call(self, tool_call: ToolCall) -> str:
        name = tool_call.name
        if name not in TOOL_NAMES:
            return unknown_tool_message(name)

        async def attempt(timeout: float | None) -> str:
            return await self._post(name, tool_call.arguments, timeout)

        try:
            return await with_retries(
                attempt, self.retry, timeout=self.timeout, what=f"tool server {name}"
            )
        except ProviderError as exc:
            log.warning("%s via %s failed: %s", name, self.where, exc)
            text = tool_error_message(name, redact(str(exc)))
            return UnusableToolText(text) if exc.unusable else text
        except Exception as exc:  # never raise into the agent loop
            log.exception("%s via %s failed", name, self.where)
            return tool_error_message(name, redact(str(exc) or type(exc).__name__))

    async def _post(self, name: str, arguments: dict[str, Any], timeout: float | None) -> str:
        url = f"{self.base_url}/{name}"
        try:
            response = await self._http().post(url, json=arguments, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ProviderError(
                f"tool server {self.where} unreachable: {exc or type(exc).__name__}",
                retryable=True, unusable=True,
            ) from None
        except httpx.TimeoutException:
            raise ProviderError(
                f"tool server {self.where} gave no answer within {timeout or 0:g}s"
            ) from None
        except httpx.TransportError as exc:  # the connection broke mid-request
            raise ProviderError(
                f"tool server {self.where}: {exc or type(exc).__name__}", retryable=True
            ) from None
        return self._content(response)

    def _content(self, response: httpx.Response) -> str:
        """The tool response body from the server's answer; ProviderError for HTTP errors."""
        status = response.status_code
        body: Any = None
        try:
            body = response.json()
        except ValueError:
            pass
        content = body.get("content") if isinstance(body, dict) else None
        if isinstance(content, str) and status in (200, 422):
            return content  # 422: bad arguments, answered with the protocol's error text
        if status == 401:
            why = "wrong token" if self._has_token else "no token given"
            raise ProviderError(
                f"tool server {self.where} refused the request (401, {why}): "
                "set DRVENUS_TOOLS_TOKEN to the server's token", unusable=True,
            )
        if status == 413:
            raise ProviderError(f"tool server {self.where}: request too large (413)")
        detail = body.get("error") if isinstance(body, dict) else None
        detail = detail or response.text[:200] or response.reason_phrase
        raise ProviderError(
            f"tool server {self.where} answered HTTP {status}: {detail}",
            retryable=is_retryable_status(status),
            retry_after=parse_retry_after(response.headers.get("retry-after")),
        )

    def check(self, timeout: float = 10.0) -> None:
        """Before any question runs: the server is up (``/health``) and takes this toolbox's
        token (``/metrics`` needs it). Raises :class:`ToolServerUnusable` naming what to fix,
        so a wrong token or a closed port fails the command instead of every tool call."""
        try:
            with httpx.Client(headers=self._headers, timeout=timeout, trust_env=False) as client:
                health = client.get(f"{self.base_url}/health")
                up = health.status_code == 200
                probe = client.get(f"{self.base_url}/metrics") if up else None
        except httpx.HTTPError as exc:
            raise ToolServerUnusable(
                f"tool server {self.where} is not reachable ({exc or type(exc).__name__}): "
                "start it with `drvenus tools serve`, or fix --tools-url / DRVENUS_TOOLS_URL"
            ) from None
        if probe is None:
            raise ToolServerUnusable(
                f"tool server {self.where}: /health answered HTTP {health.status_code} (is this "
                "a drvenus tool server?)"
            )
        if probe.status_code == 401:
            why = "the token is wrong" if self._has_token else "it needs a token"
            raise ToolServerUnusable(
                f"tool server {self.where} refused us (401, {why}): set DRVENUS_TOOLS_TOKEN to "
                "the server's token"
            )

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer; raises ProviderError when it is not up."""
        try:
            response = await self._http().get(f"{self.base_url}/health", timeout=10.0)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderError(f"tool server {self.where} is not up: {exc}") from None

    async def aclose(self) -> None:
        await self._clients.aclose()


__all__ = ["DEFAULT_REMOTE_TIMEOUT", "RemoteToolbox", "ToolServerUnusable"]
