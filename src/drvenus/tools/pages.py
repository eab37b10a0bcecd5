"""Page readers: a URL in, the page's readable text out.

Every reader has a ``name`` (its metrics and cache label), ``await read(url) -> Page`` (raises
:class:`~drvenus.tools.base.ProviderError` when it cannot), ``await admit(url)`` (raises the
refusal of its address policy, checked again before a cached page is served), ``policy_key``
(its address policy, part of its cache keys) and ``await aclose()``:

- :class:`FetchReader`: the page itself, fetched with :class:`~drvenus.tools.web.SafeFetcher`;
  HTML becomes markdown-like text with trafilatura (headings, lists, tables), or plain text
  with lxml when trafilatura finds no main content; PDF text comes from pypdf.
- :class:`JinaReader`: Jina Reader (``GET {base_url}/{url}``), as DR-Venus's ``visit`` reads
  pages; its markdown answer is the page text.
- :class:`CorpusReader`: a document of the local corpus index.

The visit tool tries its readers in order (e.g. Jina, then the page itself).
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import itertools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from drvenus.corpus import Document
from drvenus.net.addresses import AddressPolicy
from drvenus.net.retry import RetryPolicy
from drvenus.tools.base import ProviderError
from drvenus.tools.limits import Limits
from drvenus.tools.web import (
    FetchResult,
    Resolver,
    SafeFetcher,
    check_url,
    refused,
)

log = logging.getLogger(__name__)

JINA_BASE_URL = "https://r.jina.ai"
_JINA_TITLE = re.compile(r"^Title:[ \t]*(.*)$", re.MULTILINE)
_BLANKS = re.compile(r"\n{3,}")


@dataclass(frozen=True)
class Page:
    """A page's readable text (``title`` may be empty)."""

    url: str
    title: str
    text: str


@runtime_checkable
class PageReader(Protocol):
    """Reads pages from one provider. ``cacheable``: worth storing in the tool cache.
    ``policy_key``: the address policy it reads under (pages cached under one policy are
    never served under another)."""

    name: str
    cacheable: bool
    policy_key: str

    async def read(self, url: str) -> Page:
        """The page at ``url``; raises :class:`ProviderError` when it cannot be read."""
        ...

    async def admit(self, url: str) -> None:
        """Raise the refused :class:`ProviderError` when the address policy forbids ``url``
        (asked before a cached page is served)."""
        ...

    async def aclose(self) -> None: ...


class PageStore(Protocol):
    def get_document(self, url: str) -> Document | None: ...


def page_text(doc: Document) -> str:
    """The text the extractor reads: the title as a heading, then the page body."""
    if doc.title and not doc.text.startswith(doc.title):
        return f"{doc.title}\n\n{doc.text}"
    return doc.text


def with_scheme(url: str) -> str:
    """``url`` with ``https://`` in front when it names no scheme (``en.wikipedia.org/...``)."""
    return url if "://" in url else "https://" + url.lstrip("/")


# --- turning fetched bytes into text -----------------------------------------------------------


def _lxml_text(html: str) -> tuple[str, str]:
    """Title and visible text of an HTML page without its scripts, styles and page chrome."""
    import lxml.html

    try:
        root = lxml.html.fromstring(html)
    except Exception:  # lxml raises several types on junk input
        return "", ""
    title = " ".join((root.findtext(".//title") or "").split())
    for element in root.xpath(
        "//script|//style|//noscript|//template|//nav|//header|//footer|//aside|//form"
    ):
        element.drop_tree()
    lines = (" ".join(line.split()) for line in root.text_content().splitlines())
    return title, "\n".join(line for line in lines if line)


def html_to_page(html: str, url: str) -> Page:
    """Readable markdown-like text of an HTML page (trafilatura, else lxml)."""
    import trafilatura

    text = ""
    try:
        text = trafilatura.extract(
            html,
            url=url,
            output_format="markdown",
            include_tables=True,
            include_links=False,
            include_comments=False,
            include_images=False,
            include_formatting=True,
        ) or ""
        meta = trafilatura.extract_metadata(html, default_url=url)
        title = (meta.title if meta is not None else "") or ""
    except Exception:  # a parser failure on odd HTML: use the simple extraction
        log.debug("trafilatura failed on %s", url, exc_info=True)
        title = ""
    fallback_title, fallback_text = _lxml_text(html) if not (text and title) else ("", "")
    title = title or fallback_title
    text = text.strip() or fallback_text
    if title and text and not text.startswith(("# " + title, title)):
        text = f"# {title}\n\n{text}"
    return Page(url=url, title=title, text=_BLANKS.sub("\n\n", text).strip())


def pdf_to_page(data: bytes, url: str, *, max_pages: int = 300) -> Page:
    """The text of a PDF (pypdf), page after page; raises ProviderError if unreadable."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        texts = [(p.extract_text() or "").strip() for p in reader.pages[:max_pages]]
        title = str((reader.metadata or {}).get("/Title") or "").strip()
    except Exception as exc:  # pypdf raises many types on broken files
        raise ProviderError(f"unreadable PDF: {exc}") from None
    return Page(url=url, title=title, text="\n\n".join(t for t in texts if t))


def result_to_page(result: FetchResult) -> Page:
    """The page in a fetched resource, by its media type (sniffed when none is given)."""
    kind = result.content_type
    if kind == "application/pdf" or (not kind and result.body.startswith(b"%PDF-")):
        return pdf_to_page(result.body, result.url)
    text = result.text()
    head = text[:1024].lstrip().lower()
    if kind in ("text/html", "application/xhtml+xml") or (
        not kind and head.startswith(("<!doctype html", "<html"))
    ):
        return html_to_page(text, result.url)
    return Page(url=result.url, title="", text=text.strip())


# --- the readers -------------------------------------------------------------------------------


class FetchReader:
    """Pages fetched directly, safely (see :class:`~drvenus.tools.web.SafeFetcher`, whose
    keyword arguments this takes when no ``fetcher`` is given)."""

    name = "fetch"
    cacheable = True

    def __init__(
        self,
        fetcher: SafeFetcher | None = None,
        *,
        allow_private: bool = False,
        policy: AddressPolicy | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        limits: Limits | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.fetcher = fetcher or SafeFetcher(
            allow_private=allow_private,
            policy=policy,
            timeout=timeout,
            retry=retry,
            limits=limits,
            resolver=resolver,
        )

    def __repr__(self) -> str:
        return f"FetchReader({self.fetcher!r})"

    @property
    def policy_key(self) -> str:
        return self.fetcher.policy.key

    async def admit(self, url: str) -> None:
        await check_url(with_scheme(url), self.fetcher.resolver, policy=self.fetcher.policy)

    async def read(self, url: str) -> Page:
        result = await self.fetcher.fetch(with_scheme(url))
        page = await asyncio.to_thread(result_to_page, result)
        if not page.text.strip():
            raise ProviderError("the page has no readable text")
        return Page(url=url, title=page.title, text=page.text)

    async def aclose(self) -> None:
        await self.fetcher.aclose()


class JinaReader:
    """Pages read by Jina Reader: ``GET {base_url}/{url}`` with ``Authorization: Bearer KEY``.

    ``api_key``: one key, several (used in turn) or None (anonymous, rate-limited by Jina).
    Target URLs are checked for their scheme and must not be IP literals the address policy
    (``policy``, else that of ``allow_private``) refuses (Jina cannot reach private ones, and
    they are not sent anywhere).
    ``timeout``: seconds per attempt; ``retry`` / ``limits`` as for the fetcher.
    """

    name = "jina"
    cacheable = True

    def __init__(
        self,
        api_key: str | Sequence[str] | None = None,
        *,
        base_url: str = JINA_BASE_URL,
        timeout: float = 50.0,
        retry: RetryPolicy | None = None,
        limits: Limits | None = None,
        allow_private: bool = False,
        policy: AddressPolicy | None = None,
    ) -> None:
        keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
        self._keys = itertools.cycle([k for k in keys if k] or [None])
        self.base_url = base_url.rstrip("/")
        self.policy = policy or AddressPolicy(allow_private)
        # The Jina endpoint is configured, not chosen by the model: no address policy for it.
        self.fetcher = SafeFetcher(
            allow_private=True, timeout=timeout, retry=retry, limits=limits or Limits(4)
        )

    def __repr__(self) -> str:  # never shows the keys
        return f"JinaReader(base_url={self.base_url!r})"

    def _check(self, url: str) -> str:
        url = with_scheme(url)
        scheme, _, rest = url.partition("://")
        if scheme.lower() not in ("http", "https"):
            raise refused(f"only http and https URLs can be read, not {scheme}")
        host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
        host = host[1:].split("]")[0] if host.startswith("[") else host.split(":")[0]
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return url  # a host name: Jina resolves it, not us
        reason = self.policy.reason(ip)
        if reason:
            raise refused(f"{host} is {reason}; not sent to Jina ({self.policy.advice(ip)})")
        return url

    @property
    def policy_key(self) -> str:
        return self.policy.key

    async def admit(self, url: str) -> None:
        self._check(url)

    async def read(self, url: str) -> Page:
        target = self._check(url)
        key = next(self._keys)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        result = await self.fetcher.fetch(f"{self.base_url}/{target}", headers=headers)
        text = result.text().strip()
        if not text:
            raise ProviderError("Jina returned an empty page")
        match = _JINA_TITLE.search(text[:2000])
        return Page(url=url, title=match.group(1).strip() if match else "", text=text)

    async def aclose(self) -> None:
        await self.fetcher.aclose()


class CorpusReader:
    """Pages of the local corpus (``index.get_document(url)``)."""

    name = "local"
    cacheable = False  # already local and fast
    policy_key = "corpus"  # no addresses: the corpus's own pages

    def __init__(self, index: PageStore) -> None:
        self.index = index

    async def admit(self, url: str) -> None:
        return None

    async def read(self, url: str) -> Page:
        doc = await asyncio.to_thread(self.index.get_document, url)
        if doc is None:
            raise ProviderError(f"{url} is not in the corpus")
        return Page(url=url, title=doc.title, text=page_text(doc))

    async def aclose(self) -> None:
        return None


__all__ = [
    "CorpusReader",
    "FetchReader",
    "JinaReader",
    "Page",
    "PageReader",
    "PageStore",
    "html_to_page",
    "page_text",
    "pdf_to_page",
    "result_to_page",
    "with_scheme",
]
