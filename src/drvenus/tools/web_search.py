"""Online search providers for the ``search`` tool: Serper (Google) and SearXNG.

Both implement :class:`drvenus.tools.search.SearchProvider`: ``await provider.search(query, k)``
returns at most ``k`` dicts ``{title, url, snippet[, date]}`` or raises
:class:`~drvenus.tools.base.ProviderError` once its retries are spent.

- :class:`SerperSearch` calls the API the way DR-Venus does: ``POST {base_url}/search`` with
  JSON ``{"q", "location", "gl", "hl"}`` and the key in ``X-API-KEY``; a query with any CJK
  character (U+4E00..U+9FFF) is searched as China / ``cn`` / ``zh-cn``, any other as
  United States / ``us`` / ``en``. Serper's ``organic`` list gives the results.
- :class:`SearxngSearch` calls a self-hosted SearXNG: ``GET {base_url}/search?q=...&format=json``
  (plus ``language=zh-CN`` for CJK queries); its ``results`` list gives the results.

Each provider owns one ``httpx.AsyncClient`` (per event loop, :class:`drvenus.net.LoopClient`;
``aclose`` closes it) and one :class:`~drvenus.tools.limits.Limiter`, entered by every request,
retries included. Every request has a timeout. Connection errors, timeouts and the HTTP statuses
:func:`drvenus.net.is_retryable_status` accepts (408, 425, 429, 5xx) are retried under the
:class:`~drvenus.net.RetryPolicy` (a ``Retry-After`` header is honoured); other HTTP errors
(400, 401, 403, ...) are not. Nothing here reads the environment: the caller passes the key and
URLs (see :func:`make_search_providers`), and the key never appears in reprs, logs or errors.
The HTTP clients ignore proxy variables in the environment (``trust_env=False``) for the same
reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from drvenus.net import (
    LoopClient,
    RetryPolicy,
    is_retryable_status,
    parse_retry_after,
    redact_url,
    with_retries,
)
from drvenus.text import one_line
from drvenus.tools.base import ProviderError
from drvenus.tools.limits import Limiter, Limits
from drvenus.tools.search import IndexSearch, Result, SearchIndex, SearchProvider, SearchTimeout

log = logging.getLogger(__name__)

DEFAULT_SERPER_URL = "https://google.serper.dev"
DEFAULT_TIMEOUT = 15.0  # seconds for one HTTP request
PROVIDER_NAMES = ("serper", "searxng", "local")

CJK_LOCALE = {"location": "China", "gl": "cn", "hl": "zh-cn"}
US_LOCALE = {"location": "United States", "gl": "us", "hl": "en"}
SEARXNG_CJK_LANGUAGE = "zh-CN"


def has_cjk(text: str) -> bool:
    """DR-Venus's rule for Chinese queries: any character in U+4E00..U+9FFF."""
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


class _HttpProvider:
    """Shared plumbing: client per event loop, limiter, timeout, retries, error mapping."""

    name = "http"
    cacheable = True

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        secret: str | None = None,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.base_url = base_url.rstrip("/")
        self.limits = limits or Limits()
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._headers = dict(headers or {})
        self._secret = secret
        self._limiter: Limiter | None = None
        self._clients = LoopClient(
            lambda: httpx.AsyncClient(headers=self._headers, trust_env=False),
            on_new=self._new_limiter,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.base_url)!r})"

    def _scrub(self, text: str) -> str:
        """``text`` with the secret (if any) masked, for messages quoting a server's reply."""
        return text.replace(self._secret, "***") if self._secret else text

    def _new_limiter(self) -> None:
        self._limiter = Limiter(self.limits)  # its locks belong to one event loop, too

    def _bind(self) -> tuple[httpx.AsyncClient, Limiter]:
        """The client and limiter of the running event loop (a loop that is gone takes its
        pooled connections with it, so they are made afresh)."""
        client = self._clients.get()
        assert self._limiter is not None
        return client, self._limiter

    async def _request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request with retries; the decoded JSON body."""

        async def attempt(timeout: float | None) -> Any:
            client, limiter = self._bind()
            async with limiter:
                return await self._attempt(client, method, path, timeout, kwargs)

        return await with_retries(attempt, self.retry, timeout=self.timeout, what=self.name)

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        method: str,
        path: str,
        timeout: float | None,
        kwargs: Mapping[str, Any],
    ) -> Any:
        seconds = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(seconds):  # a bound on the whole request, too
                response = await client.request(
                    method, self.base_url + path, timeout=seconds, **kwargs
                )
        except (httpx.TimeoutException, TimeoutError):
            raise SearchTimeout(f"{self.name}: timed out after {seconds:g}s") from None
        except httpx.TransportError as exc:
            reason = type(exc).__name__
            raise ProviderError(
                f"{self.name}: connection failed ({reason})", retryable=True
            ) from None
        status = response.status_code
        if status >= 400:
            retryable = is_retryable_status(status)
            after = parse_retry_after(response.headers.get("retry-after")) if retryable else None
            hint = " (check the API key)" if status in (401, 403) else ""
            raise ProviderError(
                f"{self.name}: HTTP {status} {response.reason_phrase}{hint}",
                retryable=retryable,
                retry_after=after,
            )
        try:
            return response.json()
        except ValueError:
            text = one_line(self._scrub(response.text), 80)
            raise ProviderError(f"{self.name}: response is not JSON: {text}") from None

    async def aclose(self) -> None:
        await self._clients.aclose()


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _result(title: Any, url: Any, snippet: Any, date: Any, source: Any = None) -> Result | None:
    """A result dict, or None without a URL (no ``snippet`` key when the provider gave none;
    ``source``, the publisher, where it names one)."""
    link = _text(url)
    if not link:
        return None
    out: Result = {"title": _text(title), "url": link}
    if isinstance(snippet, str):
        out["snippet"] = _text(snippet)
    if _text(date):
        out["date"] = _text(date)
    if _text(source):
        out["source"] = _text(source)
    return out


class SerperSearch(_HttpProvider):
    """Google results from serper.dev, as DR-Venus requests them.

    ``api_key``: the Serper key (sent as ``X-API-KEY``; never logged or shown);
    ``base_url``: the API root (default ``https://google.serper.dev``);
    ``limits``: concurrency and rate of requests; ``retry``: the retry policy;
    ``timeout``: seconds per HTTP request.
    """

    name = "serper"

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = DEFAULT_SERPER_URL,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not api_key:
            raise ValueError("Serper needs an API key")
        headers = {"X-API-KEY": api_key, "Content-Type": "application/json"}
        super().__init__(
            base_url, headers=headers, secret=api_key, limits=limits, retry=retry, timeout=timeout
        )

    @staticmethod
    def request_body(query: str) -> dict[str, str]:
        """The JSON body DR-Venus sends for ``query``."""
        return {"q": query, **(CJK_LOCALE if has_cjk(query) else US_LOCALE)}

    async def search(self, query: str, k: int) -> list[Result]:
        data = await self._request_json("POST", "/search", json=self.request_body(query))
        organic = data.get("organic") if isinstance(data, dict) else None
        if not isinstance(organic, list):
            return []  # Serper omits "organic" when nothing matches
        results = []
        for item in organic:
            if isinstance(item, dict):
                hit = _result(item.get("title"), item.get("link"), item.get("snippet"),
                              item.get("date"), item.get("source"))
                if hit is not None:
                    results.append(hit)
        return results[:k]


class SearxngSearch(_HttpProvider):
    """Results from a SearXNG instance's JSON API (its ``json`` format must be enabled).

    ``base_url``: the instance root, e.g. ``http://localhost:8888``; ``limits``, ``retry``,
    ``timeout``: as for :class:`SerperSearch`.
    """

    name = "searxng"

    def __init__(
        self,
        base_url: str,
        *,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not base_url:
            raise ValueError("SearXNG needs a base URL")
        super().__init__(base_url, limits=limits, retry=retry, timeout=timeout)

    @staticmethod
    def request_params(query: str) -> dict[str, str]:
        params = {"q": query, "format": "json"}
        if has_cjk(query):
            params["language"] = SEARXNG_CJK_LANGUAGE
        return params

    async def search(self, query: str, k: int) -> list[Result]:
        data = await self._request_json("GET", "/search", params=self.request_params(query))
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            return []
        results = []
        for item in items:
            if isinstance(item, dict):
                hit = _result(
                    item.get("title"),
                    item.get("url"),
                    item.get("content"),
                    item.get("publishedDate"),
                )
                if hit is not None:
                    results.append(hit)
        return results[:k]


def make_search_providers(
    names: Sequence[str],
    *,
    serper_api_key: str | None = None,
    serper_url: str = DEFAULT_SERPER_URL,
    searxng_url: str | None = None,
    index: SearchIndex | None = None,
    limits: Mapping[str, Limits] | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[SearchProvider]:
    """The providers named in ``names`` (``serper``, ``searxng``, ``local``), in that order.

    ``serper`` needs ``serper_api_key``; ``searxng`` needs ``searxng_url``; ``local`` needs
    ``index`` (a :class:`~drvenus.corpus.CorpusIndex`). ``limits`` maps a provider name to its
    :class:`Limits` (default: ``Limits()``). Raises ValueError for an unknown or unconfigured
    name, or a name given twice.
    """
    limits = limits or {}
    providers: list[SearchProvider] = []
    seen: set[str] = set()
    for raw in names:
        name = raw.strip().lower()
        if name in seen:
            raise ValueError(f"search provider {name!r} is listed twice")
        seen.add(name)
        common: dict[str, Any] = {"limits": limits.get(name), "retry": retry, "timeout": timeout}
        if name == "serper":
            if not serper_api_key:
                raise ValueError("search provider 'serper' needs an API key")
            providers.append(SerperSearch(serper_api_key, base_url=serper_url, **common))
        elif name == "searxng":
            if not searxng_url:
                raise ValueError("search provider 'searxng' needs a base URL")
            providers.append(SearxngSearch(searxng_url, **common))
        elif name == "local":
            if index is None:
                raise ValueError("search provider 'local' needs a corpus index")
            providers.append(IndexSearch(index))
        else:
            known = ", ".join(PROVIDER_NAMES)
            raise ValueError(f"unknown search provider {raw!r} (known: {known})")
    return providers


__all__ = [
    "CJK_LOCALE",
    "DEFAULT_SERPER_URL",
    "DEFAULT_TIMEOUT",
    "PROVIDER_NAMES",
    "US_LOCALE",
    "SearxngSearch",
    "SerperSearch",
    "has_cjk",
    "make_search_providers",
    "parse_retry_after",
]
