"""The ``visit`` tool: read each page (local corpus, Jina Reader or the page itself), cut it to
the page budget, pull out the evidence for the goal.

One frame per URL, joined as the protocol says. The URLs of one call are read concurrently
within ``overall_timeout`` seconds; a URL not done by then, unknown or unreadable by every
reader, or one the extractor gives up on, gets the protocol's failure frame (the model sees
exactly what DR-Venus's tool writes then); one refused by the address policy gets the failure
frame with the refusal's reason as its evidence (so the record says why, not only the logs).

Cached pages are stored per reader and address policy (``page:{reader}:{policy}``), and a URL
is checked against the reader's policy again before its cached page is served: a page one
process was allowed to read is never handed to a process whose policy refuses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drvenus.corpus import is_web_url
from drvenus.protocol import (
    DRVENUS_TEXTS,
    MISSING_ARGUMENT,
    VISIT,
    ProtocolTexts,
    join_visits,
    render_visit,
    tool_error_message,
)
from drvenus.tools.base import ProviderError
from drvenus.tools.cache import ToolCache, normalize_url
from drvenus.tools.extract import ExtractiveExtractor, Extractor
from drvenus.tools.metrics import Metrics
from drvenus.tools.pages import CorpusReader, Page, PageReader, PageStore, page_text
from drvenus.tools.tokens import ByteEstimate, TokenCounter, default_counter
from drvenus.tools.web import FetchTimeout

log = logging.getLogger(__name__)

DEFAULT_PAGE_TOKENS = 95_000
DEFAULT_VISIT_TIMEOUT = 240.0


def truncate_page(text: str, max_tokens: int, counter: TokenCounter | None = None) -> str:
    """Cut ``text`` to about ``max_tokens`` tokens of ``counter`` (None: the package estimate,
    UTF-8 bytes / 4), at a space near the cut when counted by estimate."""
    return (counter or ByteEstimate()).truncate(text, max_tokens)


@dataclass(frozen=True)
class Refused:
    """A URL the address policy refuses, and why (told to the agent in the failure frame)."""

    reason: str


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, FetchTimeout | TimeoutError | asyncio.CancelledError):
        return "timeout"
    if isinstance(exc, ProviderError) and exc.refused:
        return "refused"
    return "error"


class Visit:
    """``visit(url=[...], goal=...)`` over page readers tried in order.

    ``readers``: e.g. ``[JinaReader(keys), FetchReader()]``; a refused URL is not offered to
    the next reader. ``extractor``: the evidence extractor (offline BM25 when None).
    ``max_page_tokens``: the page budget (DR-Venus: 95K ``cl100k_base`` tokens) counted with
    ``counter`` (:func:`~drvenus.tools.tokens.default_counter` when None). ``cache``: stores
    read page text under ``page:{reader}:{policy}``; ``cache_ttl``: its age limit (the cache's
    default when None). ``metrics``: one observation per reader attempt, one per cache lookup.
    ``overall_timeout``: seconds for all URLs of one call (None: no limit). ``texts``: the
    words of the failure frame (a profile's: ours by default).
    """

    name = VISIT

    def __init__(
        self,
        readers: Sequence[PageReader],
        extractor: Extractor | None = None,
        *,
        max_page_tokens: int = DEFAULT_PAGE_TOKENS,
        counter: TokenCounter | None = None,
        cache: ToolCache | None = None,
        cache_ttl: float | None = None,
        metrics: Metrics | None = None,
        overall_timeout: float | None = DEFAULT_VISIT_TIMEOUT,
        texts: ProtocolTexts = DRVENUS_TEXTS,
    ) -> None:
        if not readers:
            raise ValueError("visit needs at least one page reader")
        self.readers = list(readers)
        self.extractor = extractor if extractor is not None else ExtractiveExtractor()
        self.max_page_tokens = max_page_tokens
        self.counter = counter
        self.cache = cache
        self.cache_ttl = cache_ttl
        self.metrics = metrics
        self.overall_timeout = overall_timeout
        self.texts = texts

    # -- reading pages -----------------------------------------------------------------------

    @staticmethod
    def cache_namespace(reader: PageReader) -> str:
        """Where ``reader``'s pages are cached: per reader and address policy."""
        return f"page:{reader.name}:{reader.policy_key}"

    def _cached(self, reader: PageReader, url: str) -> Page | None:
        if self.cache is None or not reader.cacheable:
            return None
        raw = self.cache.get(self.cache_namespace(reader), normalize_url(url), self.cache_ttl)
        if self.metrics is not None:
            self.metrics.cache(VISIT, raw is not None)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return Page(url=url, title=str(data["title"]), text=str(data["text"]))
        except (ValueError, KeyError, TypeError):
            return None

    def _store(self, reader: PageReader, url: str, page: Page) -> None:
        if self.cache is not None and reader.cacheable:
            value = json.dumps({"title": page.title, "text": page.text}, ensure_ascii=False)
            self.cache.put(self.cache_namespace(reader), normalize_url(url), value)

    async def _read_with(self, reader: PageReader, url: str) -> Page:
        cached = await asyncio.to_thread(self._cached, reader, url)
        if cached is not None:
            try:  # the policy of now, not that of the process that stored it
                await reader.admit(url)
            except ProviderError as exc:
                if exc.refused:
                    raise
                # e.g. no DNS now: the page was read under this same policy (its key says so)
            return cached
        start = time.monotonic()
        try:
            page = await reader.read(url)
        except BaseException as exc:
            if self.metrics is not None:
                self.metrics.observe(VISIT, reader.name, _outcome(exc), time.monotonic() - start)
            raise
        if self.metrics is not None:
            self.metrics.observe(VISIT, reader.name, "ok", time.monotonic() - start)
        await asyncio.to_thread(self._store, reader, url, page)
        return page

    async def read_page(self, url: str) -> Page | Refused | None:
        """The page from the first reader that can read it; :class:`Refused` (with the reason)
        when the address policy forbids it; None when no reader can read it."""
        for reader in self.readers:
            try:
                return await self._read_with(reader, url)
            except ProviderError as exc:
                log.info("visit: %s could not read %s: %s", reader.name, url, exc)
                if exc.refused:
                    return Refused(str(exc))
            except Exception:  # a reader bug must not fail the whole call
                log.exception("visit: %s failed on %s", reader.name, url)
        return None

    async def _budgeted(self, url: str) -> Page | Refused | None:
        """The page cut to the page budget; :class:`Refused` when the address policy forbids
        it; None when it cannot be read or is empty."""
        if not is_web_url(url):
            return None
        page = await self.read_page(url)
        if isinstance(page, Refused) or page is None or not page.text.strip():
            return page if isinstance(page, Refused) else None
        counter = self.counter or default_counter()
        text = await asyncio.to_thread(counter.truncate, page.text, self.max_page_tokens)
        return Page(url=url, title=page.title, text=text)

    async def read_text(self, url: str) -> Page | None:
        """The page as a visit reads it before extracting, without a goal (cut to the page
        budget); None when it cannot be read or is refused. Bounded by ``overall_timeout``
        like a call."""
        try:
            page = await asyncio.wait_for(self._budgeted(url), self.overall_timeout)
        except TimeoutError:
            log.warning("visit: %s not read in %gs", url, self.overall_timeout)
            return None
        return None if isinstance(page, Refused) else page

    # -- the tool ----------------------------------------------------------------------------

    async def visit_one(self, url: str, goal: str) -> str:
        page = await self._budgeted(url)
        if isinstance(page, Refused):
            return self.texts.visit_refused(url, goal, page.reason)
        if page is None:
            return self.texts.visit_failure(url, goal)
        try:
            extraction = await self.extractor.extract(page.text, goal, url)
        except Exception:  # one bad page must not fail the whole call
            log.exception("visit: extractor failed on %s", url)
            extraction = None
        if extraction is None:
            return self.texts.visit_failure(url, goal)
        return render_visit(url, goal, extraction.summary, extraction.evidence)

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        urls = arguments.get("url") or []
        if isinstance(urls, str):
            urls = [urls]
        goal = str(arguments.get("goal") or "").strip()
        if not urls:
            return tool_error_message(VISIT, MISSING_ARGUMENT[VISIT])
        urls = [str(u).strip() for u in urls]
        tasks = [asyncio.create_task(self.visit_one(u, goal)) for u in urls]
        try:
            done, pending = await asyncio.wait(tasks, timeout=self.overall_timeout)
        finally:  # on time out, and when this call itself is cancelled
            for task in tasks:
                task.cancel()
        if pending:
            log.warning(
                "visit: %d of %d URLs not done in %gs", len(pending), len(urls),
                self.overall_timeout,
            )
            await asyncio.gather(*pending, return_exceptions=True)
        frames = [
            t.result() if t in done and t.exception() is None
            else self.texts.visit_failure(u, goal)
            for t, u in zip(tasks, urls, strict=True)
        ]
        return join_visits(frames)

    async def aclose(self) -> None:
        """Close the readers and the extractor's model client."""
        for closable in (*self.readers, self.extractor):
            close = getattr(closable, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception:  # closing is best effort
                log.exception("visit: closing %r failed", closable)


class LocalVisit(Visit):
    """``visit`` over a local corpus index (its documents are the pages)."""

    def __init__(
        self,
        index: PageStore,
        extractor: Extractor | None = None,
        *,
        max_page_tokens: int = DEFAULT_PAGE_TOKENS,
        counter: TokenCounter | None = None,
        texts: ProtocolTexts = DRVENUS_TEXTS,
    ) -> None:
        super().__init__(
            [CorpusReader(index)], extractor, max_page_tokens=max_page_tokens, counter=counter,
            texts=texts,
        )
        self.index = index


__all__ = [
    "DEFAULT_PAGE_TOKENS",
    "LocalVisit",
    "PageStore",
    "Refused",
    "Visit",
    "page_text",
    "truncate_page",
]
