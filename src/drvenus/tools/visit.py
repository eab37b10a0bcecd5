"""The ``visit`` tool over a local corpus: page store lookup, then evidence extraction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from drvenus.corpus import Document, is_web_url
from drvenus.protocol import VISIT, join_visits, render_visit, render_visit_failure
from drvenus.tools.extract import ExtractiveExtractor, Extractor

log = logging.getLogger(__name__)

DEFAULT_PAGE_TOKENS = 95_000
CHARS_PER_TOKEN = 4.0


class PageStore(Protocol):
    def get_document(self, url: str) -> Document | None: ...


def page_text(doc: Document) -> str:
    """The text the extractor reads: the title as a heading, then the page body."""
    if doc.title and not doc.text.startswith(doc.title):
        return f"{doc.title}\n\n{doc.text}"
    return doc.text


def truncate_page(text: str, max_tokens: int, chars_per_token: float = CHARS_PER_TOKEN) -> str:
    """Cut ``text`` to about ``max_tokens`` tokens (estimated from characters)."""
    limit = int(max_tokens * chars_per_token)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ", max(0, limit - 200))
    return cut[:space] if space > 0 else cut


class LocalVisit:
    """``visit(url=[...], goal=...)``: one frame per URL, joined as the protocol says.

    An unknown URL, a non-web scheme, an extractor failure or error: the failure frame.
    """

    name = VISIT

    def __init__(
        self,
        index: PageStore,
        extractor: Extractor | None = None,
        *,
        max_page_tokens: int = DEFAULT_PAGE_TOKENS,
        chars_per_token: float = CHARS_PER_TOKEN,
    ) -> None:
        self.index = index
        self.extractor = extractor if extractor is not None else ExtractiveExtractor()
        self.max_page_tokens = max_page_tokens
        self.chars_per_token = chars_per_token

    async def visit_one(self, url: str, goal: str) -> str:
        if not is_web_url(url):
            return render_visit_failure(url, goal)
        doc = await asyncio.to_thread(self.index.get_document, url)
        if doc is None:
            log.info("visit: %s is not in the corpus", url)
            return render_visit_failure(url, goal)
        text = truncate_page(page_text(doc), self.max_page_tokens, self.chars_per_token)
        try:
            extraction = await self.extractor.extract(text, goal, url)
        except Exception:  # one bad page must not fail the whole call
            log.exception("visit: extractor failed on %s", url)
            extraction = None
        if extraction is None:
            return render_visit_failure(url, goal)
        return render_visit(url, goal, extraction.summary, extraction.evidence)

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        urls = arguments.get("url") or []
        if isinstance(urls, str):
            urls = [urls]
        goal = str(arguments.get("goal") or "").strip()
        if not urls:
            return "ERROR: visit needs 'url': a URL or a list of URLs"
        frames = await asyncio.gather(*(self.visit_one(str(u).strip(), goal) for u in urls))
        return join_visits(frames)

    async def aclose(self) -> None:
        """Close the extractor's model client, if it has one."""
        close = getattr(self.extractor, "aclose", None)
        if close is not None:
            await close()
