"""Fetching web pages safely: SSRF checks, pinned DNS, manual redirects, size and type caps.

:class:`SafeFetcher` is what the ``visit`` tool uses to read pages from the open web for a
model that chooses the URLs. It

- accepts only ``http``/``https`` URLs without credentials in them;
- resolves the host once (``getaddrinfo`` in a thread, or an injected resolver) and checks
  every address against an :class:`AddressPolicy`: private, loopback, link-local, unspecified,
  multicast, reserved and shared addresses are refused unless the policy allows private ones,
  and the cloud metadata endpoints (IPv4-mapped, 6to4, Teredo and NAT64 forms included) stay
  refused even then, unless named in the policy's allow list;
- connects to the address it checked (``scheme://IP:port/path`` with the ``Host`` header, and
  for https the SNI / certificate host name set through httpcore's ``sni_hostname`` request
  extension), so a second DNS answer cannot point the request elsewhere (DNS rebinding). No
  connection is kept alive, so one verified for a host is never reused for another;
- follows redirects itself, checking every hop, at most ``max_redirects`` of them;
- streams the body and stops past ``max_bytes`` on the wire or ``max_decoded_bytes`` after
  decompression (a compression bomb), and refuses content types it cannot read (images, audio,
  video, archives, executables);
- bounds every attempt by ``timeout`` seconds and retries timeouts, connection errors and the
  statuses :func:`drvenus.net.is_retryable_status` accepts under
  :class:`~drvenus.net.RetryPolicy`, each request inside the provider's
  :class:`~drvenus.tools.limits.Limiter`.

Errors are :class:`~drvenus.tools.base.ProviderError` (``refused`` for the security policy,
:class:`FetchTimeout` for timeouts).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

from drvenus.net import (
    LoopClient,
    RetryPolicy,
    is_retryable_status,
    parse_retry_after,
    with_retries,
)
from drvenus.net.addresses import AddressPolicy, IPAddress, blocked_reason
from drvenus.text import one_line
from drvenus.tools.base import ProviderError
from drvenus.tools.limits import Limiter, Limits

log = logging.getLogger(__name__)

# (host, port) -> the addresses it resolves to, as strings.
Resolver = Callable[[str, int], Awaitable[list[str]]]

DEFAULT_USER_AGENT = "Mozilla/5.0 (compatible; drvenus/0.1; research agent page reader)"
DEFAULT_ACCEPT = (
    "text/html,application/xhtml+xml,application/pdf;q=0.9,text/plain;q=0.8,"
    "application/json;q=0.7,application/xml;q=0.7,*/*;q=0.1"
)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

READABLE_TYPES = frozenset(
    {
        "text/html",
        "application/xhtml+xml",
        "text/plain",
        "text/markdown",
        "text/x-markdown",
        "text/csv",
        "application/pdf",
        "application/json",
        "application/ld+json",
        "application/xml",
        "text/xml",
        "application/rss+xml",
        "application/atom+xml",
    }
)


class FetchTimeout(ProviderError):
    """A request took longer than its time limit (retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


def refused(message: str) -> ProviderError:
    """The error for a URL the security policy blocks (never retried)."""
    return ProviderError(message, refused=True)


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (``getaddrinfo`` in a worker thread)."""
    infos = await asyncio.to_thread(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Target:
    """One checked request target: the URL as asked and the address to connect to."""

    url: str
    scheme: str
    host: str
    port: int
    ip: str

    def connect_url(self) -> httpx.URL:
        """The URL with the checked address in place of the host name."""
        return httpx.URL(self.url).copy_with(host=self.ip)

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"


def _split(url: str) -> tuple[str, str, int]:
    """Scheme, host and port of ``url``; refuses what is not a plain http(s) URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise refused(f"malformed URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise refused(f"only http and https URLs can be fetched, not {scheme or 'no'} scheme")
    if parts.username is not None or parts.password is not None:
        raise refused("URLs with credentials are not fetched")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise refused("the URL has no host")
    return scheme, host, port or (443 if scheme == "https" else 80)


async def check_url(
    url: str, resolver: Resolver, *, allow_private: bool = False,
    policy: AddressPolicy | None = None,
) -> Target:
    """Resolve ``url``'s host once and check every address under ``policy`` (else the policy
    of ``allow_private``); the target to connect to. Refusals name the reason and the way to
    allow it."""
    policy = policy or AddressPolicy(allow_private)
    scheme, host, port = _split(url)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise ProviderError(f"cannot resolve {host}: {one_line(exc)}") from None
    if not addresses:
        raise ProviderError(f"cannot resolve {host}: no addresses")
    for address in addresses:  # every answer must pass: the order may change
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        reason = policy.reason(ip)
        if reason:
            what = f"{host} is" if literal is not None else f"{host} resolves to"
            raise refused(f"{what} {reason}; not fetched ({policy.advice(ip)})")
    return Target(url=url, scheme=scheme, host=host, port=port, ip=addresses[0])


# --- the fetcher -------------------------------------------------------------------------------


def media_type(content_type: str | None) -> tuple[str, str | None]:
    """``("text/html", "utf-8")`` from a Content-Type header (lower-cased; charset or None)."""
    if not content_type:
        return "", None
    kind, _, params = content_type.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip("\"'").lower()
    return kind.strip().lower(), charset


def is_readable(kind: str) -> bool:
    """True for the content types a page reader can turn into text (an empty type is sniffed)."""
    return (
        not kind
        or kind in READABLE_TYPES
        or kind.endswith(("+xml", "+json"))
        or (kind.startswith("text/") and kind not in ("text/css", "text/javascript"))
    )


@dataclass(frozen=True)
class FetchResult:
    """A fetched resource: the final URL (after redirects), status, media type and body."""

    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes

    def text(self) -> str:
        """The body decoded (declared charset, else UTF-8), undecodable bytes replaced."""
        try:
            return self.body.decode(self.charset or "utf-8", errors="replace")
        except LookupError:  # an unknown charset name
            return self.body.decode("utf-8", errors="replace")


def _bad_certificate(exc: BaseException) -> bool:
    """True when a TLS certificate did not verify (the same on every try)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


class SafeFetcher:
    """GETs http(s) URLs under the policy in the module docstring.

    ``allow_private``: also fetch private and loopback addresses (tests, intranet use);
    ``policy``: the whole :class:`AddressPolicy` (it wins over ``allow_private``).
    ``timeout``: seconds for one attempt (the whole redirect chain, body included);
    ``connect_timeout``: seconds to connect. ``max_bytes`` / ``max_decoded_bytes``: body caps
    before / after decompression. ``retry``: attempts on transient failures. ``limits``: this
    provider's concurrency and rate. ``resolver``: ``(host, port) -> [address, ...]`` (the
    system resolver by default). ``headers``: sent with every request (never logged).
    ``verify``: TLS verification (True: the system's CAs; an ``ssl.SSLContext`` for own CAs).
    """

    name = "fetch"

    def __init__(
        self,
        *,
        allow_private: bool = False,
        policy: AddressPolicy | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_bytes: int = 10_000_000,
        max_decoded_bytes: int = 20_000_000,
        max_redirects: int = 5,
        retry: RetryPolicy | None = None,
        limits: Limits | None = None,
        resolver: Resolver | None = None,
        user_agent: str = DEFAULT_USER_AGENT,
        headers: Mapping[str, str] | None = None,
        verify: bool | ssl.SSLContext = True,
    ) -> None:
        self.policy = policy or AddressPolicy(allow_private)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_bytes = max_bytes
        self.max_decoded_bytes = max_decoded_bytes
        self.max_redirects = max_redirects
        self.retry = retry or RetryPolicy(attempts=3, base=0.5, cap=8.0)
        self.limiter = Limiter(limits or Limits(concurrency=8))
        self.resolver: Resolver = resolver or system_resolver
        self.verify = verify
        self._headers = {"User-Agent": user_agent, "Accept": DEFAULT_ACCEPT, **(headers or {})}
        self._clients = LoopClient(self._new_client)

    def __repr__(self) -> str:  # headers may hold keys: never shown
        return f"SafeFetcher(policy={self.policy.key!r}, timeout={self.timeout:g})"

    @property
    def allow_private(self) -> bool:
        return self.policy.allow_private

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,  # no proxy or netrc from the environment: connect as checked
            verify=self.verify,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def _http(self) -> httpx.AsyncClient:
        return self._clients.get()

    async def fetch(self, url: str, *, headers: Mapping[str, str] | None = None) -> FetchResult:
        """GET ``url`` (redirects followed and checked); raises :class:`ProviderError`."""

        async def attempt(seconds: float | None) -> FetchResult:
            try:
                async with asyncio.timeout(seconds):
                    return await self._follow(url, headers or {})
            except TimeoutError:
                raise FetchTimeout(f"timed out after {seconds:g}s") from None

        return await with_retries(
            attempt, self.retry, timeout=self.timeout, what=f"fetch {one_line(url, 120)}"
        )

    async def _follow(self, url: str, headers: Mapping[str, str]) -> FetchResult:
        current = url
        for _hop in range(self.max_redirects + 1):
            target = await check_url(current, self.resolver, policy=self.policy)
            async with self.limiter:
                result = await self._get(target, headers)
            if isinstance(result, FetchResult):
                return result
            current = urljoin(current, result)
        raise ProviderError(f"more than {self.max_redirects} redirects")

    async def _get(self, target: Target, headers: Mapping[str, str]) -> FetchResult | str:
        """One request to a checked target: the result, or the next URL of a redirect."""
        request = self._http().build_request(
            "GET",
            target.connect_url(),
            headers={**self._headers, **headers, "Host": target.host_header()},
            timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
            extensions={"sni_hostname": target.host} if target.scheme == "https" else None,
        )
        try:
            response = await self._http().send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise FetchTimeout(f"{type(exc).__name__} for {target.host}") from None
        except httpx.HTTPError as exc:
            reason = one_line(exc) or type(exc).__name__
            message = f"cannot fetch from {target.host}: {reason}"
            raise ProviderError(message, retryable=not _bad_certificate(exc)) from None
        try:
            return await self._answer(target, response)
        finally:
            await response.aclose()

    async def _answer(self, target: Target, response: httpx.Response) -> FetchResult | str:
        status = response.status_code
        if status in REDIRECT_STATUSES and response.headers.get("location"):
            return response.headers["location"]
        if status >= 400:
            raise ProviderError(
                f"HTTP {status} from {target.host}",
                retryable=is_retryable_status(status),
                retry_after=parse_retry_after(response.headers.get("retry-after")),
            )
        kind, charset = media_type(response.headers.get("content-type"))
        if not is_readable(kind):
            raise ProviderError(f"{kind} content cannot be read as a page")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise ProviderError(f"response too large ({declared} bytes)")
        body = await self._read_capped(response)
        return FetchResult(target.url, status, kind, charset, body)

    async def _read_capped(self, response: httpx.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                chunks.append(chunk)
                if response.num_bytes_downloaded > self.max_bytes:
                    raise ProviderError(f"response larger than {self.max_bytes} bytes")
                if size > self.max_decoded_bytes:
                    raise ProviderError(
                        f"response larger than {self.max_decoded_bytes} bytes decompressed"
                    )
        except httpx.TimeoutException as exc:
            raise FetchTimeout(f"{type(exc).__name__} while reading") from None
        except httpx.DecodingError as exc:  # bad compression: the same next time
            raise ProviderError(f"cannot decode response: {one_line(exc)}") from None
        except httpx.HTTPError as exc:  # a broken stream
            raise ProviderError(f"cannot read response: {one_line(exc)}", retryable=True) from None
        return b"".join(chunks)

    async def aclose(self) -> None:
        await self._clients.aclose()


__all__ = [
    "AddressPolicy",
    "FetchResult",
    "FetchTimeout",
    "Resolver",
    "SafeFetcher",
    "Target",
    "blocked_reason",
    "check_url",
    "is_readable",
    "media_type",
    "refused",
    "system_resolver",
]
