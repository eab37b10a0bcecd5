"""The ``search`` tool: each query goes to a chain of providers (online or the local index).

``Search(providers, top_k, cache=..., metrics=...)`` answers ``search(query=[...])``. Queries of
one call run concurrently; each asks the providers in order and takes the first answer. A
provider that raises (after its own retries, see :mod:`drvenus.tools.web_search`) hands the
query to the next one; an empty list is a valid answer and stops the chain.

What the model reads, per query (always one entry per query, in query order):

- results: the provider's top ``top_k`` as ``{title, url, snippet[, date]}``;
- no results: an empty ``web_page_info_list``. This is how the training data shows it: the
  legacy converter (:func:`drvenus.protocol.legacy.parse_serper_markdown`) turns DR-Venus's
  ``No results found for '...'. Try with a more general query.`` text into an entry with an
  empty list, and the local index tool always answered so;
- every provider failed: one note entry ``{"title": "Search failed", "url": "", "snippet":
  <why, and a hint to retry or rephrase>}`` (:data:`FAILED_TITLE`), so a transient outage is
  not mistaken for an answer of "nothing exists". The note never carries an API key.

Online providers' answers are cached (namespace ``search:<provider>``, key
``normalize_query(query)|k=<top_k>``, value the JSON result list); failures never are, and
providers with ``cacheable = False`` (the local index) skip the cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from drvenus.corpus import Hit
from drvenus.protocol import MISSING_ARGUMENT, SEARCH, render_search, tool_error_message
from drvenus.tools.base import ProviderError
from drvenus.tools.cache import ToolCache, normalize_query
from drvenus.tools.metrics import Metrics

log = logging.getLogger(__name__)

Result = dict[str, Any]

FAILED_TITLE = "Search failed"
FAILED_HINT = "Try again later, or rephrase the query."


class SearchTimeout(ProviderError):
    """A provider request ran out of time (always retryable; reported as ``timeout``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class SearchProvider(Protocol):
    """One search backend. ``search`` returns at most ``k`` result dicts ``{title, url,
    snippet[, date]}`` (``[]``: no results) or raises :class:`ProviderError`."""

    name: str

    async def search(self, query: str, k: int) -> list[Result]: ...

    async def aclose(self) -> None: ...


class SearchIndex(Protocol):
    def search(self, query: str, k: int = 10) -> list[Hit]: ...


class IndexSearch:
    """A provider over a local corpus index (:class:`drvenus.corpus.CorpusIndex`); not cached."""

    name = "local"
    cacheable = False

    def __init__(self, index: SearchIndex) -> None:
        self.index = index

    async def search(self, query: str, k: int) -> list[Result]:
        hits = await asyncio.to_thread(self.index.search, query, k)
        return [hit.to_result() for hit in hits]

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"IndexSearch({self.index!r})"


def _reason(provider: str, exc: ProviderError) -> str:
    text = str(exc)
    return text if text.startswith(f"{provider}:") else f"{provider}: {text}"


def failure_note(query: str, reasons: Sequence[str]) -> Result:
    """The single result entry shown for a query every provider failed on."""
    why = "; ".join(reasons) or "no search provider is configured"
    return {
        "title": FAILED_TITLE,
        "url": "",
        "snippet": f"The search for '{query}' failed ({why}). {FAILED_HINT}",
    }


class Search:
    """The ``search`` tool over ``providers`` (tried in order per query).

    ``top_k``: results per query; ``cache``: a :class:`ToolCache` for online answers (None: no
    cache); ``cache_ttl``: seconds an answer stays fresh (None: the cache's default);
    ``metrics``: a :class:`Metrics` to report each provider call and cache lookup (None: off).
    """

    name = SEARCH

    def __init__(
        self,
        providers: Sequence[SearchProvider],
        top_k: int = 10,
        *,
        cache: ToolCache | None = None,
        cache_ttl: float | None = None,
        metrics: Metrics | None = None,
        render: Callable[[Sequence[tuple[str, Sequence[Result]]]], str] = render_search,
        missing: str | None = None,
    ) -> None:
        """``render``: the profile's search renderer (drvenus's JSON by default); ``missing``:
        what a call without a query gets (None: drvenus's error text)."""
        self.providers = list(providers)
        self.render = render
        self.missing = missing
        self.top_k = top_k
        self.cache = cache
        self.cache_ttl = cache_ttl
        self.metrics = metrics

    def __repr__(self) -> str:
        names = ", ".join(p.name for p in self.providers)
        return f"Search([{names}], top_k={self.top_k})"

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        queries: Sequence[Any] = arguments.get("query") or []
        if isinstance(queries, str):
            queries = [queries]
        if not queries:
            if self.missing is not None:
                return self.missing
            return tool_error_message(SEARCH, MISSING_ARGUMENT[SEARCH])
        texts = [str(q) for q in queries]
        results = await asyncio.gather(*(self.search_one(q) for q in texts))
        return self.render(list(zip(texts, results, strict=True)))

    async def search_one(self, query: str) -> list[Result]:
        """The results for one query: the first provider that answers, else a failure note."""
        reasons: list[str] = []
        for provider in self.providers:
            cached = self._cached(provider, query)
            if cached is not None:
                return cached
            try:
                results = await self._ask(provider, query)
            except ProviderError as exc:
                reasons.append(_reason(provider.name, exc))
                log.warning("search %r: provider %s failed: %s", query, provider.name, exc)
                continue
            except Exception as exc:  # a provider bug must not lose the other providers
                reasons.append(f"{provider.name}: {type(exc).__name__}")
                log.exception("search %r: provider %s crashed", query, provider.name)
                continue
            self._store(provider, query, results)
            return results
        log.warning("search %r: no provider answered", query)
        return [failure_note(query, reasons)]

    async def _ask(self, provider: SearchProvider, query: str) -> list[Result]:
        start = time.monotonic()
        outcome = "error"
        try:
            results = list(await provider.search(query, self.top_k))[: self.top_k]
            outcome = "ok" if results else "empty"
            return results
        except SearchTimeout:
            outcome = "timeout"
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe(SEARCH, provider.name, outcome, time.monotonic() - start)

    def _cache_key(self, query: str) -> str:
        return f"{normalize_query(query)}|k={self.top_k}"

    def _cached(self, provider: SearchProvider, query: str) -> list[Result] | None:
        if self.cache is None or not getattr(provider, "cacheable", True):
            return None
        raw = self.cache.get(f"search:{provider.name}", self._cache_key(query), self.cache_ttl)
        results: list[Result] | None = None
        if raw is not None:
            try:
                value = json.loads(raw)
            except ValueError:
                value = None
            if isinstance(value, list) and all(isinstance(r, dict) for r in value):
                results = value
        if self.metrics is not None:
            self.metrics.cache(SEARCH, results is not None)
        return results

    def _store(self, provider: SearchProvider, query: str, results: list[Result]) -> None:
        if self.cache is None or not getattr(provider, "cacheable", True):
            return
        value = json.dumps(results, ensure_ascii=False)
        self.cache.put(f"search:{provider.name}", self._cache_key(query), value)

    async def aclose(self) -> None:
        """Close every provider (best effort)."""
        for provider in self.providers:
            try:
                await provider.aclose()
            except Exception:  # closing is best effort
                log.exception("closing search provider %s failed", provider.name)


class LocalSearch(Search):
    """``search(query=[...])`` over a local corpus index: the top ``top_k`` hits per query."""

    def __init__(self, index: SearchIndex, top_k: int = 10) -> None:
        super().__init__([IndexSearch(index)], top_k)
        self.index = index


__all__ = [
    "FAILED_TITLE",
    "IndexSearch",
    "LocalSearch",
    "Search",
    "SearchIndex",
    "SearchProvider",
    "SearchTimeout",
    "failure_note",
]
