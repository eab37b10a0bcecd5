"""A BM25 search index over a corpus (tantivy), cached on disk, and the page store.

``build_index`` (:mod:`drvenus.corpus.build`) builds the index on first use under the cache
directory, in a folder keyed by the corpus content, atomically. ``CorpusIndex`` answers
searches (title boosted; the snippet is the page's lead unless another window holds more of the
query) and looks pages up by URL. It is cheap to open, shared per process by ``open_index``,
and thread-safe, so async code can call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tantivy

from drvenus.corpus.build import (  # noqa: F401 - re-exported: the index's public names
    IMPACT_DIR,
    SCHEMA_VERSION,
    TITLE_BOOST,
    TOKENIZER,
    IndexInfo,
    ProgressFn,
    _analyzer,
    _read_meta,
    _schema,
    analyze,
    build_index,
    corpus_key,
    default_cache_dir,
    index_dir,
)
from drvenus.corpus.dense import DEPTH as DENSE_DEPTH
from drvenus.corpus.dense import DenseVectors, fuse, vectors_saved
from drvenus.corpus.documents import (
    CorpusError,
    CorpusSource,
    Document,
    corpus_spec,
)
from drvenus.corpus.snippets import (  # noqa: F401 - re-exported
    SNIPPET_CHARS,
    WORD,
    char_span,
    choose_snippet,
    make_snippet,
)
from drvenus.corpus.urls import url_key

if TYPE_CHECKING:
    from drvenus.corpus.impact import Impacts

log = logging.getLogger(__name__)
MAX_QUERY_TERMS = 48
_SEARCH_FIELDS = ["title", "text"]
BM25_K1 = 1.2  # tantivy's
COMMON_FRACTION = 0.05  # a term in more than this share of the texts is "common" (see search)
CANDIDATES = (250,)  # first-stage depths tried before the plain full query
TWO_STAGE_MIN_DOCS = 500_000  # measured: slower than one pass at 200K passages, faster at 1M


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result."""

    id: str
    title: str
    url: str
    snippet: str
    score: float

    def to_result(self) -> dict[str, str]:
        """The protocol's ``{title, url, snippet}`` result object."""
        return {"title": self.title, "url": self.url, "snippet": self.snippet}


# --- querying ----------------------------------------------------------------------------------

_PHRASE = re.compile(r'"([^"]+)"')


def sanitize_query(text: str) -> str:
    """A tantivy query string for free user text: plain terms (lowercased, so AND/OR/NOT are
    words, not operators) plus each quoted phrase of two or more words as a phrase clause.
    Empty when the text has no words."""
    words = WORD.findall(text.lower())[:MAX_QUERY_TERMS]
    if not words:
        return ""
    parts = list(words)
    for phrase in _PHRASE.findall(text.lower())[:8]:
        terms = WORD.findall(phrase)[:MAX_QUERY_TERMS]
        if len(terms) > 1:
            parts.append('"' + " ".join(terms) + '"')
    return " ".join(parts)


class CorpusIndex:
    """An opened index: BM25 search and the URL -> page store. Thread-safe.

    ``impacts``: search with the index's impact postings when it has them and numba is
    installed (same results as tantivy's search, much faster with common words); False keeps
    every search in tantivy. ``dense``: hybrid search, BM25 fused with article vectors of a
    small embedding model (:mod:`drvenus.corpus.dense`; built beside the index on first use;
    raises :class:`~drvenus.corpus.dense.DenseUnavailable` without the model's package).
    ``snippet_chars``: about how long a result's snippet is."""

    snippet_chars = SNIPPET_CHARS

    def __init__(self, path: str | Path, *, impacts: bool = True, dense: bool = False) -> None:
        self.path = Path(path)
        meta = _read_meta(self.path)
        if meta is None:
            raise CorpusError(f"no drvenus index at {self.path} (or an incompatible version)")
        self.meta = meta
        try:
            self._index = tantivy.Index.open(str(self.path))
        except (OSError, ValueError) as exc:
            raise CorpusError(f"cannot open index {self.path}: {exc}") from exc
        self._index.register_tokenizer(TOKENIZER, _analyzer())
        self._index.reload()
        self._schema = self._index.schema
        self._analyzer = _analyzer()
        self._searcher = self._index.searcher()  # the index never changes once built
        self._impacts: Impacts | None = None
        if impacts and (self.path / IMPACT_DIR).is_dir():
            from drvenus.corpus.impact import Impacts  # numpy, numba: imported when needed

            self._impacts = Impacts.open(self.path, self._searcher.num_docs)
        if impacts and self._impacts is None and meta.get("impacts"):
            log.info(
                "%s: numba is not installed; searching with tantivy alone (pip install "
                "'drvenus[search]' for the fast path)",
                self.path,
            )
        self._dense: DenseVectors | None = None
        if dense:
            self._dense = DenseVectors.open(self.path, self._searcher, self._schema)

    @property
    def doc_count(self) -> int:
        return self._searcher.num_docs

    @property
    def hybrid(self) -> bool:
        """Whether searches fuse BM25 with the dense vectors (``dense=True``)."""
        return self._dense is not None

    @property
    def fast_path(self) -> bool:
        """Whether searches use the impact postings (see :mod:`drvenus.corpus.impact`)."""
        return self._impacts is not None

    def __len__(self) -> int:
        return self.doc_count

    def __repr__(self) -> str:
        return f"CorpusIndex({str(self.path)!r}, docs={self.doc_count})"

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The top ``k`` documents for free text ``query`` (never raises on odd syntax)."""
        text = sanitize_query(query if isinstance(query, str) else str(query))
        if not text or k <= 0:
            return []
        ranked = self._rank(text, k if self._dense is None else DENSE_DEPTH)
        if ranked is None:
            return []
        top, parsed = ranked
        if self._dense is not None:
            top = self._fused(query, top, k)
        if not top:
            return []
        searcher = self._searcher
        snippets = tantivy.SnippetGenerator.create(searcher, parsed, self._schema, "text")
        snippets.set_max_num_chars(self.snippet_chars)
        weights = self.term_weights(text)
        hits = []
        for score, address in top:
            doc = searcher.doc(address)
            body = doc.get_first("text") or ""
            snippet = snippets.snippet_from_doc(doc)
            if snippet.highlighted():
                span = snippet.fragment_range()
                start, end = char_span(body, span.start, span.end)
            else:  # matched in the title only: show the lead
                start = end = 0
            title = doc.get_first("title") or ""
            hits.append(
                Hit(
                    id=doc.get_first("id") or "",
                    title=title,
                    url=doc.get_first("url") or "",
                    snippet=self.choose_snippet(body, start, end, weights, title),
                    score=float(score),
                )
            )
        return hits

    def search_ids(self, query: str, k: int = 10) -> list[tuple[str, float]]:
        """The (id, score) of the top ``k`` documents for ``query``: the ranking of
        :meth:`search` without loading pages or making snippets."""
        text = sanitize_query(query if isinstance(query, str) else str(query))
        if not text or k <= 0:
            return []
        words = self._words(text)
        if self._dense is None and words is not None and self._impact_ready():
            assert self._impacts is not None
            return [
                (self._impacts.doc_id(number), score)
                for score, number in self._impact_top_k(words, k)
            ]
        ranked = self._rank(text, k if self._dense is None else DENSE_DEPTH)
        if ranked is None:
            return []
        top = ranked[0] if self._dense is None else self._fused(query, ranked[0], k)
        searcher = self._searcher
        return [(searcher.doc(address).get_first("id") or "", float(score))
                for score, address in top]

    def _fused(self, query: Any, top: list[tuple[float, Any]], k: int) -> list[tuple[float, Any]]:
        """The top ``k`` of BM25's ranking ``top`` fused with the dense ranking of ``query``;
        each hit's score is its fused score."""
        assert self._dense is not None
        lexical = [(a.segment_ord, a.doc) for _, a in top]
        dense = self._dense.top(query if isinstance(query, str) else str(query), DENSE_DEPTH)
        return [(score, tantivy.DocAddress(*place)) for place, score in fuse([lexical, dense], k)]

    def _rank(self, text: str, k: int) -> tuple[list[tuple[float, Any]], tantivy.Query] | None:
        """The top ``k`` (score, address) of sanitised ``text`` and a query of its terms (for
        snippets), or None when the text cannot be parsed."""
        words = self._words(text)
        if words is not None and self._impact_ready():
            assert self._impacts is not None
            top = [
                (score, self._impacts.address(number))
                for score, number in self._impact_top_k(words, k)
            ]
            tokens = dict.fromkeys(words[0] + [t for phrase in words[1] for t in phrase])
            terms = [tantivy.Query.term_query(self._schema, "text", t) for t in tokens]
            return top, _union(terms)
        searcher = self._searcher
        clauses = self._clauses(text)
        if clauses is not None:
            parsed = _union(clauses)
            return self._top_k(clauses, parsed, k), parsed
        try:
            parsed, _errors = self._index.parse_query_lenient(
                text, _SEARCH_FIELDS, field_boosts={"title": TITLE_BOOST}
            )
        except ValueError as exc:  # defensive: the sanitised text should always parse
            log.warning("query %r could not be parsed: %s", text, exc)
            return None
        return searcher.search(parsed, limit=k, count=False).hits, parsed

    def _words(self, text: str) -> tuple[list[str], list[list[str]]] | None:
        """The token of each distinct word of sanitised ``text`` and the tokens of each
        distinct phrase; None when a word is not exactly one token (the parser decides)."""
        words = _PHRASE.sub(" ", text).split()
        tokens = []
        for word in dict.fromkeys(words):
            analyzed = self._analyzer.analyze(word)
            if len(analyzed) != 1:
                return None
            tokens.append(analyzed[0])
        phrases = []
        for phrase in dict.fromkeys(_PHRASE.findall(text)):
            analyzed = [self._analyzer.analyze(w) for w in phrase.split()]
            if any(len(t) != 1 for t in analyzed):
                return None
            phrases.append([t for (t,) in analyzed])
        return tokens, phrases

    def _impact_ready(self) -> bool:
        impacts = self._impacts
        return (
            impacts is not None
            and impacts.boost("title") == TITLE_BOOST
            and impacts.boost("text") == 1.0
        )

    def _impact_top_k(
        self, terms: tuple[list[str], list[list[str]]], k: int
    ) -> list[tuple[float, int]]:
        """The clauses of :meth:`_clauses` (per word, then per phrase: title, boosted, and
        text) on the impact path; phrase clauses are read from tantivy."""
        from drvenus.corpus.impact import hits_arrays

        assert self._impacts is not None
        tokens, phrases = terms
        searcher = self._searcher
        extra = []
        for phrase in phrases:
            words = list(enumerate(phrase))
            for field, boost in (("title", TITLE_BOOST), ("text", 1.0)):
                most = min(searcher.doc_freq(field, token) for token in phrase)
                if most == 0:
                    continue
                query = _boost(tantivy.Query.phrase_query(self._schema, field, words), boost)
                hits = searcher.search(query, limit=most, count=False).hits
                if hits:
                    extra.append(hits_arrays(hits, self._impacts.base))
        clauses = [(field, token) for token in tokens for field in ("title", "text")]
        return self._impacts.top_k(clauses, k, searcher.doc_freq, self._fetch_postings, extra)

    def _fetch_postings(self, field: str, token: str, df: int) -> tuple[Any, Any]:
        """(document numbers, scores) of a term too rare for the impact postings."""
        from drvenus.corpus.impact import hits_arrays

        assert self._impacts is not None
        query = _boost(
            tantivy.Query.term_query(self._schema, field, token),
            TITLE_BOOST if field == "title" else 1.0,
        )
        hits = self._searcher.search(query, limit=df, count=False).hits
        return hits_arrays(hits, self._impacts.base)

    def term_weights(self, text: str) -> dict[str, float]:
        """Each token of sanitised query ``text`` with its idf in the page texts."""
        n = self._searcher.num_docs
        tokens = {
            t for word in _PHRASE.sub(" ", text).split() for t in self._analyzer.analyze(word)
        }
        return {t: _idf(self._searcher.doc_freq("text", t), n) for t in tokens}

    def choose_snippet(
        self, body: str, start: int, end: int, weights: Mapping[str, float], title: str = ""
    ) -> str:
        """:func:`drvenus.corpus.snippets.choose_snippet` with this index's analyzer."""
        return choose_snippet(self._analyzer.analyze, body, start, end, weights, title,
                              self.snippet_chars)

    def _clauses(self, text: str) -> list[_Clause] | None:
        """The clauses the query parser makes of sanitised text: each distinct word, then each
        distinct phrase, in the title (boosted) and in the text. None when a word is not
        exactly one token (the parser then decides)."""
        words = _PHRASE.sub(" ", text).split()
        terms = [self._analyzer.analyze(word) for word in dict.fromkeys(words)]
        phrases = [
            [self._analyzer.analyze(w) for w in phrase.split()]
            for phrase in dict.fromkeys(_PHRASE.findall(text))
        ]
        if any(len(t) != 1 for t in terms) or any(len(t) != 1 for p in phrases for t in p):
            return None
        clauses = []
        n = self._searcher.num_docs
        for (token,) in terms:
            for field, boost in (("title", TITLE_BOOST), ("text", 1.0)):
                query = tantivy.Query.term_query(self._schema, field, token)
                df = self._searcher.doc_freq(field, token)
                clauses.append(_Clause(field, _boost(query, boost), df, boost * _idf(df, n)))
        for phrase in phrases:
            words = [(i, token) for i, (token,) in enumerate(phrase)]
            for field, boost in (("title", TITLE_BOOST), ("text", 1.0)):
                query = tantivy.Query.phrase_query(self._schema, field, words)
                clauses.append(_Clause(field, _boost(query, boost), 0, 0.0, phrase=True))
        return clauses

    def _top_k(self, clauses: list[_Clause], full: tantivy.Query, k: int) -> list[Any]:
        """The exact top ``k`` (score, address) of ``full``, the union of ``clauses``.

        A union of term queries lets tantivy skip with block-max WAND, but common words (in
        most texts) still cost a pass over most postings. So: (1) take the best ``depth``
        documents for the rare clauses alone, (2) score just those with all clauses. No other
        document can beat the k-th of them when its full score exceeds the depth-th rare score
        plus the most the common clauses can add (each BM25 term score < its weight); else
        the next depth of ``CANDIDATES``, else the plain full query.
        """
        searcher = self._searcher
        limit = COMMON_FRACTION * searcher.num_docs
        common = [c for c in clauses if c.field == "text" and not c.phrase and c.df > limit]
        rare = [c for c in clauses if not any(c is d for d in common)]
        if (
            searcher.num_docs < TWO_STAGE_MIN_DOCS
            or not common
            or not any(c.df or c.phrase for c in rare)
        ):
            return searcher.search(full, limit=k, count=False).hits
        slack = sum(c.bound for c in common) * 1.01 + 1e-3
        first_query = _union(rare)
        for depth in CANDIDATES:
            first = searcher.search(first_query, limit=depth, count=False).hits
            floor = first[-1][0] if len(first) == depth else 0.0
            rows = searcher.fast_field_values("row", [address for _, address in first])
            # a union of term queries: a term set query here would scan every document
            only = _union([tantivy.Query.term_query(self._schema, "row_term", r) for r in rows])
            must = (tantivy.Occur.Must, tantivy.Query.const_score_query(only, 0.0))
            # common clauses each behind the filter: in a union they would be read in full
            should = [(tantivy.Occur.Should, c.query) for c in rare] + [
                (
                    tantivy.Occur.Should,
                    tantivy.Query.boolean_query([must, (tantivy.Occur.Must, c.query)]),
                )
                for c in common
            ]
            top = searcher.search(tantivy.Query.boolean_query([must, *should]), k, count=False)
            if len(top.hits) == k and top.hits[-1][0] > floor + slack:
                return top.hits
            if len(first) < depth:
                break
        return searcher.search(full, limit=k, count=False).hits

    def get_document(self, url: str) -> Document | None:
        """The page stored under ``url`` (any common spelling of it), or None."""
        key = url_key(url) if isinstance(url, str) else None
        if key is None:
            return None
        searcher = self._searcher
        for field, value in (("key", key), ("key_ci", key.lower())):
            query = tantivy.Query.term_query(self._schema, field, value)
            result = searcher.search(query, limit=1)
            if result.hits:
                doc = searcher.doc(result.hits[0][1])
                return Document(
                    id=doc.get_first("id") or "",
                    title=doc.get_first("title") or "",
                    url=doc.get_first("url") or "",
                    text=doc.get_first("text") or "",
                )
        return None


@dataclass(frozen=True, slots=True)
class _Clause:
    field: str
    query: tantivy.Query
    df: int  # documents with the term in this field
    boosted_idf: float  # boost * idf; terms only
    phrase: bool = False

    @property
    def bound(self) -> float:
        """BM25 weight, boost * idf * (1 + k1): above any score the (term) clause gives."""
        return self.boosted_idf * (1 + BM25_K1)


def _boost(query: tantivy.Query, boost: float) -> tantivy.Query:
    return query if boost == 1.0 else tantivy.Query.boost_query(query, boost)


def _idf(df: int, n: int) -> float:
    return math.log1p((n - df + 0.5) / (df + 0.5))


def _union(clauses: list[_Clause] | list[tantivy.Query]) -> tantivy.Query:
    """One flat union (sum of scores), which tantivy can evaluate with block-max WAND."""
    queries = [c.query if isinstance(c, _Clause) else c for c in clauses]
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, q) for q in queries])


_OPEN: dict[tuple[Path, bool], CorpusIndex] = {}
_OPEN_LOCK = threading.Lock()


def open_index(
    source: CorpusSource = None,
    *,
    field_map: Mapping[str, str] | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = False,
    dense: bool = False,
) -> CorpusIndex:
    """The shared :class:`CorpusIndex` of a corpus, built on first use (one per process and
    ranking); ``dense``: hybrid search (see :class:`CorpusIndex`)."""
    with _OPEN_LOCK:
        spec = corpus_spec(source, field_map=field_map)
        path = index_dir(spec, cache_dir)
        if not force and (path, dense) in _OPEN:
            return _OPEN[(path, dense)]
        info = build_index(spec, cache_dir=cache_dir, force=force, progress=progress)
        if progress and dense and not vectors_saved(info.path):
            from rich.console import Console

            Console(stderr=True).print(
                "[dim]preparing hybrid search: article vectors of the index (once)[/]")
        index = CorpusIndex(info.path, dense=dense)
        _OPEN[(info.path, dense)] = index
        return index
