"""Impact postings: the BM25 score of every (term, document) pair of an index, precomputed.

tantivy answers a union of term queries with block-max WAND, but the words of a question ("the",
"of", "which") are in most documents and every search pays for their postings (at 1M passages,
9-30 ms a question). At build time this module asks tantivy itself for each term's documents
and scores (one term query per term, boosted as in a search, so each score is the exact float32
that the term's clause adds to the union) and stores them sorted by document under
``<index>/impact/``. A search is then term at a time, in numba kernels, exact:

1. the cheap clauses (in at most ``CHEAP_FRACTION`` of the documents, and more until k
   documents are touched) are summed into a dense score array; the k-th best partial score is
   a lower bound of the final k-th best;
2. the other clauses are ranked by cost per unit of score (postings / highest score); while
   the highest scores of the costliest ones do not add up to less than ``LOOKUP_SHARE`` of
   the bound, the cheapest clause past those that fit is summed and the bound rises. The ones
   that fit are set aside: a document none of the summed clauses matched cannot reach the top
   k, nor one whose partial score is lower than the k-th best minus their highest scores;
3. for the documents left, the set-aside clauses' scores are looked up (binary search in
   their postings), the most valuable clause first, dropping the documents that can no longer
   reach the k-th best as the bound shrinks.

The top k is exact for the summed float32 scores (a tiny relative margin covers rounding), ties
ranked by ascending document address as tantivy ranks them; the sums can differ from tantivy's
by float32 rounding only (clauses are added in another order). Terms in fewer than ``MIN_DF``
documents are not stored (on a real corpus most terms are that rare, and each costs a search
at build time): a query reads them, and its phrase clauses, from tantivy. Building needs numpy,
searching numba too; without them the caller keeps to tantivy.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import mmap
import os
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

import tantivy

log = logging.getLogger(__name__)

IMPACT_DIR = "impact"
IMPACT_VERSION = 1
MIN_DF = 16  # rarer terms are read from tantivy at query time
SMALL_CORPUS = 100_000  # documents; below, every term is stored
CHUNK_ROWS = 1 << 20  # documents numbered per search when building
_META = "impact.json"
_IDS = "ids.bin"
_ID_OFFSETS = "ids.off"

try:  # optional: building needs numpy, searching numba too (imported when first needed)
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with the bench/train extras
    np = None  # type: ignore[assignment]

Fetch = Callable[[str, str, int], tuple[Any, Any]]
"""``fetch(field, token, df)`` -> (document numbers, scores) of a term kept out of the store."""


def can_build() -> bool:
    return np is not None


def can_search() -> bool:
    return np is not None and importlib.util.find_spec("numba") is not None


# --- building ----------------------------------------------------------------------------------


class IdWriter:
    """Streams the document ids, in row order, to ``ids.bin`` + ``ids.off`` (int64 offsets)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._blob = open(folder / _IDS, "wb")  # noqa: SIM115 - closed in close()
        self._offsets = array("q", [0])
        self._pos = 0

    def add(self, doc_id: str) -> None:
        raw = doc_id.encode("utf-8")
        self._blob.write(raw)
        self._pos += len(raw)
        self._offsets.append(self._pos)

    def close(self) -> None:
        self._blob.close()
        with open(self.folder / _ID_OFFSETS, "wb") as fh:
            self._offsets.tofile(fh)


def write_impacts(
    index: tantivy.Index, folder: Path, boosts: Mapping[str, float], min_df: int | None = None
) -> dict[str, Any]:
    """Write the impact postings of the (committed, never to change) ``index`` into ``folder``
    (which already holds the ids from :class:`IdWriter`); ``boosts``: field -> the boost its
    clauses carry in a search. Returns the impact metadata."""
    if np is None:
        raise RuntimeError("numpy is needed to write impact postings")
    start = time.perf_counter()
    index.reload()
    searcher = index.searcher()
    schema = index.schema
    n = searcher.num_docs
    if min_df is None:  # a small corpus has few terms: store them all
        min_df = 1 if n < SMALL_CORPUS else MIN_DF
    base, row_of_doc = _number_documents(searcher, schema, n)
    np.save(folder / "segments.npy", base)
    np.save(folder / "rows.npy", row_of_doc)
    fields: dict[str, Any] = {}
    postings = 0
    for field, boost in boosts.items():
        fields[field] = _write_field(searcher, schema, folder, field, boost, base, min_df)
        postings += fields[field]["postings"]
    meta = {
        "version": IMPACT_VERSION,
        "doc_count": n,
        "segments": len(base) - 1,
        "min_df": min_df,
        "fields": fields,
        "postings": postings,
        "seconds": round(time.perf_counter() - start, 3),
    }
    (folder / _META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    log.info("impact postings: %d in %.1fs", postings, meta["seconds"])
    return meta


def row_chunks(
    searcher: tantivy.Searcher, schema: tantivy.Schema, n: int, size: int
) -> Iterator[list[Any]]:
    """The addresses of an index's ``n`` pages, ``size`` rows at a time in row order (a row
    range per search, so that no search returns more than ``size`` hits)."""
    for lo in range(0, max(n, 1), size):
        query = tantivy.Query.range_query(
            schema, "row", tantivy.FieldType.Unsigned, lo, lo + size - 1
        )
        yield [address for _, address in searcher.search(query, limit=size, count=False).hits]


def _number_documents(
    searcher: tantivy.Searcher, schema: tantivy.Schema, n: int
) -> tuple[Any, Any]:
    """(first document number of each segment + the total, row of each document number).

    A document's number is its rank in (segment, doc id) order: the order tantivy breaks score
    ties in. Read in row ranges so that no search returns more than ``CHUNK_ROWS`` hits."""
    segs: list[Any] = []
    docs: list[Any] = []
    rows: list[Any] = []
    for addresses in row_chunks(searcher, schema, n, CHUNK_ROWS):
        segs.append(np.fromiter((a.segment_ord for a in addresses), np.int64, len(addresses)))
        docs.append(np.fromiter((a.doc for a in addresses), np.int64, len(addresses)))
        rows.append(np.asarray(searcher.fast_field_values("row", addresses), dtype=np.int64))
    seg, doc, row = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (segs, docs, rows))
    if len(seg) != n:
        raise RuntimeError(f"numbered {len(seg)} of {n} documents")
    sizes = np.zeros(max(searcher.num_segments, int(seg.max(initial=-1)) + 1), np.int64)
    np.maximum.at(sizes, seg, doc + 1)
    base = np.concatenate([[0], np.cumsum(sizes)])
    if base[-1] != n:  # a segment with deleted documents: never the case for a built index
        raise RuntimeError("impact postings need an index without deletions")
    row_of_doc = np.empty(n, np.int64)
    row_of_doc[base[seg] + doc] = row
    return base, row_of_doc


def _write_field(
    searcher: tantivy.Searcher,
    schema: tantivy.Schema,
    folder: Path,
    field: str,
    boost: float,
    base: Any,
    min_df: int,
) -> dict[str, Any]:
    terms = sorted((t, c) for t, c in searcher.terms_with_prefix(field, "") if c >= min_df)
    total = sum(c for _, c in terms)
    # raw little-endian files, appended to (a writable memory map would count in the RSS)
    docs = open(folder / f"{field}.docs.i32", "wb")  # noqa: SIM115 - closed below
    scores = open(folder / f"{field}.scores.f32", "wb")  # noqa: SIM115
    starts = np.zeros(len(terms) + 1, np.int64)
    best = np.zeros(len(terms), np.float32)
    pos = 0
    for i, (term, df) in enumerate(terms):
        query = tantivy.Query.term_query(schema, field, term)
        if boost != 1.0:
            query = tantivy.Query.boost_query(query, boost)
        got, score = _term_postings(searcher, schema, query, df, base)
        if len(got) != df:
            raise RuntimeError(f"{field}:{term}: {len(got)} documents, expected {df}")
        order = np.argsort(got, kind="stable")
        docs.write(got[order].astype("<i4").tobytes())
        scores.write(score[order].astype("<f4").tobytes())
        best[i] = score.max()
        pos += df
        starts[i + 1] = pos
    docs.close()
    scores.close()
    np.save(folder / f"{field}.starts.npy", starts)
    np.save(folder / f"{field}.max.npy", best)
    (folder / f"{field}.terms.json").write_text(
        json.dumps([t for t, _ in terms], ensure_ascii=False), encoding="utf-8"
    )
    return {"boost": boost, "terms": len(terms), "postings": total}


def _term_postings(
    searcher: tantivy.Searcher, schema: tantivy.Schema, query: tantivy.Query, df: int, base: Any
) -> tuple[Any, Any]:
    """(document numbers, scores) of all ``df`` documents of a term query; a common term is
    read in row ranges, so that no search holds more than ``CHUNK_ROWS`` hits in Python."""
    if df <= CHUNK_ROWS:
        return hits_arrays(searcher.search(query, limit=df, count=False).hits, base)
    parts = []
    for lo in range(0, searcher.num_docs, CHUNK_ROWS):
        rows = tantivy.Query.range_query(
            schema, "row", tantivy.FieldType.Unsigned, lo, lo + CHUNK_ROWS - 1
        )
        chunk = tantivy.Query.boolean_query(  # the range adds 0.0: the term's score is exact
            [
                (tantivy.Occur.Must, tantivy.Query.const_score_query(rows, 0.0)),
                (tantivy.Occur.Must, query),
            ]
        )
        parts.append(hits_arrays(searcher.search(chunk, limit=CHUNK_ROWS, count=False).hits, base))
    return np.concatenate([d for d, _ in parts]), np.concatenate([s for _, s in parts])


def hits_arrays(hits: Sequence[tuple[float, tantivy.DocAddress]], base: Any) -> tuple[Any, Any]:
    """(document numbers as int32, scores as float32) of tantivy hits."""
    n = len(hits)
    seg = np.fromiter((a.segment_ord for _, a in hits), np.int64, n)
    doc = np.fromiter((a.doc for _, a in hits), np.int64, n)
    score = np.fromiter((s for s, _ in hits), np.float32, n)
    return (base[seg] + doc).astype(np.int32), score


# --- searching ---------------------------------------------------------------------------------


class Impacts:
    """The impact postings of an index, memory-mapped. Thread-safe."""

    def __init__(self, folder: Path, meta: Mapping[str, Any]) -> None:
        _kernels()  # compile (or load from numba's cache) up front
        self.folder = folder
        self.meta = meta
        self.doc_count = int(meta["doc_count"])
        self.min_df = int(meta["min_df"])
        self.base = np.load(folder / "segments.npy")
        self.rows = np.load(folder / "rows.npy", mmap_mode="r").view(np.ndarray)
        self._id_offsets = np.memmap(folder / _ID_OFFSETS, dtype=np.int64, mode="r").view(
            np.ndarray
        )
        self._ids: bytes | mmap.mmap = b""
        if self._id_offsets[-1]:
            with open(folder / _IDS, "rb") as fh:
                self._ids = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.fields: dict[str, _Field] = {
            name: _Field(folder, name, float(info["boost"]))
            for name, info in meta["fields"].items()
        }
        self._pool: list[Any] = []
        self._lock = threading.Lock()

    @classmethod
    def open(cls, index_path: Path, doc_count: int) -> Impacts | None:
        """The impact postings of the index at ``index_path``, or None (absent, stale, or no
        numba)."""
        folder = index_path / IMPACT_DIR
        if not can_search() or not (folder / _META).is_file():
            return None
        try:
            meta = json.loads((folder / _META).read_text(encoding="utf-8"))
            if meta.get("version") != IMPACT_VERSION or meta.get("doc_count") != doc_count:
                return None
            return cls(folder, meta)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("impact postings of %s unusable (%s): tantivy searches", index_path, exc)
            return None

    def boost(self, field: str) -> float | None:
        entry = self.fields.get(field)
        return entry.boost if entry is not None else None

    def doc_id(self, number: int) -> str:
        return self.doc_ids([number])[0]

    def doc_ids(self, numbers: Sequence[int]) -> list[str]:
        """The ids of documents ``numbers`` (one numpy call for all, not one per document)."""
        rows = self.rows[np.asarray(numbers, np.int64)]
        starts = self._id_offsets[rows].tolist()
        ends = self._id_offsets[rows + 1].tolist()
        blob = self._ids
        return [blob[lo:hi].decode("utf-8") for lo, hi in zip(starts, ends, strict=True)]

    def address(self, number: int) -> tantivy.DocAddress:
        seg = int(np.searchsorted(self.base, number, side="right")) - 1
        return tantivy.DocAddress(seg, int(number - self.base[seg]))

    def top_k(
        self,
        clauses: Sequence[tuple[str, str]],
        k: int,
        doc_freq: Callable[[str, str], int],
        fetch: Fetch,
        extra: Sequence[tuple[Any, Any]] = (),
    ) -> list[tuple[float, int]]:
        """The top ``k`` (score, document number) of the union of term ``clauses`` (field,
        token), each scored as its field's stored boost says, plus the ``extra`` clauses given
        as (document numbers, scores). ``doc_freq``/``fetch`` read a term that is not stored
        from tantivy."""
        found: list[_Postings] = []
        for field, token in clauses:
            postings = self.fields[field].postings(token)
            if postings is None:
                df = doc_freq(field, token)
                if df == 0:
                    continue
                if df >= self.min_df:  # stored terms are all those with df >= min_df
                    raise RuntimeError(f"{field}:{token} is missing from the impact postings")
                postings = _sorted(*fetch(field, token, df))
            found.append(postings)
        found.extend(_sorted(docs, scores) for docs, scores in extra if len(docs))
        if not found:
            return []
        acc = self._borrow()
        try:
            return self._top_k(acc, found, k)
        finally:
            self._give_back(acc)

    def _top_k(self, acc: Any, clauses: list[_Postings], k: int) -> list[tuple[float, int]]:
        """Steps 1-3 of the module's docstring (acc is all zeros before and after)."""
        kern = _kernels()
        clauses = sorted(clauses, key=lambda c: len(c[0]))  # cheapest first
        cheap = CHEAP_FRACTION * self.doc_count
        # + 1: accumulate writes one slot past the documents it has kept
        touched = np.empty(min(self.doc_count, sum(len(c[0]) for c in clauses)) + 1, np.int32)
        # (the bookkeeping below is plain Python on a few dozen clauses: numpy's per-call
        # overhead on such small lists was a good share of a search)
        n = 0
        try:
            i = 0
            while i < len(clauses) and (len(clauses[i][0]) <= cheap or n < k):
                n = kern.accumulate(acc, clauses[i][0], clauses[i][1], touched, n)
                i += 1
            looked_up: list[_Postings] = []
            bound = 0.0
            if i < len(clauses):
                # The k-th best partial score of k documents is a lower bound of the final
                # k-th best: when the costliest clauses (postings per unit of highest score)
                # have highest scores adding up to less than a share of it, they can only
                # matter for documents already touched, where they are looked up. Until they
                # all fit, the cheapest clause past those that fit is summed, and the bound
                # rises.
                top_docs = kern.best_k_acc(acc, touched, n, k)[1]
                rest = sorted(clauses[i:], key=lambda c: -len(c[0]) / c[2])
                while rest:
                    budget = min(LOOKUP_SHARE, 1.0 - _MARGIN) * float(acc[top_docs].min())
                    total = list(accumulate(c[2] for c in rest))
                    fit = bisect_left(total, budget)
                    if fit == len(rest):
                        looked_up, bound = rest, total[-1]
                        break
                    j = min(range(fit, len(rest)), key=lambda m: len(rest[m][0]))
                    n = kern.accumulate(acc, rest[j][0], rest[j][1], touched, n)
                    del rest[j]
            sums = kern.gather_and_clear(acc, touched, n)
            n = 0
            if not looked_up:
                top_scores, top_docs = kern.best_k(sums, touched, k)
                return _best_k(top_scores, top_docs, k)
            theta = float(kern.best_k(sums, touched, k)[0][0])
            floor = np.float32(theta - bound - _MARGIN * (theta + bound))
            return self._with_lookups(kern, sums, touched, looked_up, floor, k)
        finally:
            kern.reset(acc, touched, n)

    @staticmethod
    def _with_lookups(
        kern: Any, sums: Any, touched: Any, clauses: list[_Postings], floor: Any, k: int
    ) -> list[tuple[float, int]]:
        """The documents whose partial score is at least ``floor``, plus the looked-up
        clauses' scores, most valuable clause first, pruning as the bound left shrinks."""
        cand, totals = kern.select(sums, touched, floor)
        order = np.argsort(cand)
        cand, totals = cand[order], totals[order]
        clauses = sorted(clauses, key=lambda c: -c[2])
        left = float(sum(c[2] for c in clauses))
        for docs, scores, best in clauses:
            kern.add_matches(cand, totals, docs, scores)
            left = max(left - best, 0.0)
            if len(cand) > 4 * k:  # drop documents that can no longer make the top k
                theta = float(np.partition(totals, len(totals) - k)[len(totals) - k])
                keep = totals >= np.float32(theta - left - _MARGIN * (theta + left))
                cand, totals = cand[keep], totals[keep]
        return _best_k(totals, cand, k)

    def _borrow(self) -> Any:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return np.zeros(self.doc_count, np.float32)

    def _give_back(self, acc: Any) -> None:
        with self._lock:
            self._pool.append(acc)


_Postings = tuple[Any, Any, float]  # (document numbers, scores, highest score)
LOOKUP_SHARE = 0.75  # the looked-up clauses may add at most this share of the k-th score
POPULATE_SHARE = 0.125  # postings up to this share of the RAM are mapped in at open
CHEAP_FRACTION = 0.005  # clauses in at most this share of the documents are always summed
_MARGIN = 2e-5  # relative float32 rounding slack of a sum of up to ~100 terms (each <= 2**-24)


def _mapped(path: Path, dtype: str, populate: bool = False) -> Any:
    """A read-only array over a raw file (a plain ndarray: slicing an np.memmap is slow);
    ``populate``: map every page now (the first searches then find them), not on first use."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype)
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    return np.frombuffer(mapped, dtype=dtype)


def _fits_in_memory(size: int) -> bool:
    """Whether ``size`` bytes are at most ``POPULATE_SHARE`` of the machine's memory."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    return size <= POPULATE_SHARE * total


def _sorted(docs: Any, scores: Any) -> _Postings:
    """Postings read from tantivy (in score order) as stored ones: by document."""
    order = np.argsort(docs, kind="stable")
    return docs[order], scores[order], float(scores.max())


def _best_k(scores: Any, docs: Any, k: int) -> list[tuple[float, int]]:
    """The ``k`` best (score, document number): highest score, then lowest number."""
    if len(scores) > k:
        theta = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= theta
        scores, docs = scores[keep], docs[keep]
    order = np.lexsort((docs, -scores))[:k]
    return [(float(scores[i]), int(docs[i])) for i in order]


class _Field:
    def __init__(self, folder: Path, name: str, boost: float) -> None:
        self.boost = boost
        terms = json.loads((folder / f"{name}.terms.json").read_text(encoding="utf-8"))
        self.index = {t: i for i, t in enumerate(terms)}
        self.starts = np.load(folder / f"{name}.starts.npy")
        self.best = np.load(folder / f"{name}.max.npy")
        docs, scores = folder / f"{name}.docs.i32", folder / f"{name}.scores.f32"
        populate = _fits_in_memory(docs.stat().st_size + scores.stat().st_size)
        self.docs = _mapped(docs, "<i4", populate)
        self.scores = _mapped(scores, "<f4", populate)

    def postings(self, token: str) -> tuple[Any, Any, float] | None:
        i = self.index.get(token)
        if i is None:
            return None
        lo, hi = int(self.starts[i]), int(self.starts[i + 1])
        return self.docs[lo:hi], self.scores[lo:hi], float(self.best[i])


# --- numba kernels -----------------------------------------------------------------------------

_KERNELS: Any = None
_KERNELS_LOCK = threading.Lock()


def _kernels() -> Any:
    """The jitted kernels (compiled once per process, cached on disk by numba)."""
    global _KERNELS
    with _KERNELS_LOCK:
        if _KERNELS is None:
            _KERNELS = _compile()
            _warm_up(_KERNELS)
        return _KERNELS


def _warm_up(kern: Any) -> None:
    """Call each kernel once with the argument types searches use (stored postings are
    read-only arrays, postings read from tantivy writable ones), so that no search pays for
    compiling or loading them."""
    acc = np.zeros(4, np.float32)
    touched = np.zeros(5, np.int32)
    stored = np.array([0, 2], np.int32), np.array([1.0, 2.0], np.float32)
    for arr in stored:
        arr.setflags(write=False)
    fetched = np.array([1], np.int32), np.array([0.5], np.float32)
    n = 0
    for docs, scores in (stored, fetched):
        n = kern.accumulate(acc, docs, scores, touched, n)
    kern.best_k_acc(acc, touched, n, 2)
    sums = kern.gather_and_clear(acc, touched, n)
    kern.best_k(sums, touched, 2)
    cand, totals = kern.select(sums, touched, np.float32(0.0))
    for docs, scores in (stored, fetched):
        kern.add_matches(cand, totals, docs, scores)
    kern.reset(acc, touched, 0)


def _compile() -> Any:
    """The kernels module (importing it compiles them, or loads them from numba's cache)."""
    from drvenus.corpus import _kernels as kernels

    return kernels
