"""The ``visit`` tool over a local corpus: page store lookup, then evidence extraction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from drvenus.corpus import Document, is_web_url
from drvenus.protocol import (
    MISSING_ARGUMENT,
    VISIT,
    join_visits,
    render_visit,
    render_visit_failure,
    tool_error_message,
)
from drvenus.text import BYTES_PER_TOKEN, estimate_tokens
from drvenus.tools.extract import ExtractiveExtractor, Extractor

log = logging.getLogger(__name__)

DEFAULT_PAGE_TOKENS = 95_000


class PageStore(Protocol):
    def get_document(self, url: str) -> Document | None: ...


def page_text(doc: Document) -> str:
    """The text the extractor reads: the title as a heading, then the page body."""
    if doc.title and not doc.text.startswith(doc.title):
        return f"{doc.title}\n\n{doc.text}"
    return doc.text


def truncate_page(text: str, max_tokens: int) -> str:
    """Cut ``text`` to about ``max_tokens`` tokens (the package's estimate: UTF-8 bytes / 4),
    at a space near the cut when there is one."""
    if estimate_tokens(text) <= max_tokens:
        return text
    limit = int(max_tokens * BYTES_PER_TOKEN)
    cut = text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")
    space = cut.rfind(" ", max(0, len(cut) - 200))
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
    ) -> None:
        self.index = index
        self.extractor = extractor if extractor is not None else ExtractiveExtractor()
        self.max_page_tokens = max_page_tokens

    async def visit_one(self, url: str, goal: str) -> str:
        if not is_web_url(url):
            return render_visit_failure(url, goal)
        doc = await asyncio.to_thread(self.index.get_document, url)
        if doc is None:
            log.info("visit: %s is not in the corpus", url)
            return render_visit_failure(url, goal)
        text = truncate_page(page_text(doc), self.max_page_tokens)
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
            return tool_error_message(VISIT, MISSING_ARGUMENT[VISIT])
        frames = await asyncio.gather(*(self.visit_one(str(u).strip(), goal) for u in urls))
        return join_visits(frames)

    async def aclose(self) -> None:
        """Close the extractor's model client, if it has one."""
        close = getattr(self.extractor, "aclose", None)
        if close is not None:
            await close()
