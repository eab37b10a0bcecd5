"""Building the corpus index: the tantivy schema and analyzer, the cache key of a corpus (file
hash + field map + schema version), and the atomic build (written to a temporary folder and
renamed into place, so a crashed build never leaves half an index; impact postings for a large
corpus). Searching it is :mod:`drvenus.corpus.index`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tantivy

from drvenus.corpus.documents import (
    BUILTIN_DOC_COUNT,
    CorpusSource,
    CorpusSpec,
    Document,
    LoadStats,
    corpus_spec,
    iter_documents,
    report,
)
from drvenus.corpus.urls import url_key

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3  # 3: impact postings
TOKENIZER = "drvenus_en"
TITLE_BOOST = 2.5
META_FILE = "drvenus_index.json"
_STALE_TMP_SECONDS = 6 * 3600
WRITER_HEAP_BYTES = 512_000_000  # shared by the writer threads; bounds the build's memory
PROGRESS_EVERY = 10_000
IMPACT_MIN_DOCS = 100_000  # by default, impact postings from this corpus size up
IMPACT_DIR = "impact"  # drvenus.corpus.impact.IMPACT_DIR
_BOOSTS = {"title": TITLE_BOOST, "text": 1.0}  # the clause boosts the impact postings store

ProgressFn = Callable[[int, int | None], None]
"""Called as ``fn(documents_indexed, expected_rows_or_None)`` during a build."""


def default_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else the settings' cache folder (``DRVENUS_CACHE_DIR`` or the user cache
    dir of ``drvenus``)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from drvenus.config import load_settings

    return load_settings().cache_root()


@dataclass(frozen=True)
class IndexInfo:
    """An index on disk and how it was made."""

    path: Path
    doc_count: int
    build_seconds: float
    cache_hit: bool
    corpus_path: str
    corpus_name: str
    corpus_key: str
    rows: int
    malformed: int
    size_bytes: int


# --- schema ------------------------------------------------------------------------------------


def _analyzer() -> tantivy.TextAnalyzer:
    """Words, lowercased, accents folded, English-stemmed (queries and documents alike)."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


@functools.cache
def _shared_analyzer() -> tantivy.TextAnalyzer:
    return _analyzer()


def analyze(text: str) -> list[str]:
    """The tokens an index makes of ``text`` (titles, texts and queries alike)."""
    return list(_shared_analyzer().analyze(text))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True, tokenizer_name=TOKENIZER)
    builder.add_text_field("url", stored=True, tokenizer_name="raw")
    builder.add_text_field("text", stored=True, tokenizer_name=TOKENIZER)
    builder.add_text_field("key", stored=False, tokenizer_name="raw")
    builder.add_text_field("key_ci", stored=False, tokenizer_name="raw")
    # the document's number, twice: a fast field (address -> row), an indexed one (row -> doc)
    builder.add_unsigned_field("row", fast=True)
    builder.add_unsigned_field("row_term", indexed=True)
    return builder.build()


# --- cache keys --------------------------------------------------------------------------------

_DIGESTS: dict[tuple[str, int, int], tuple[str, int]] = {}


def _file_digest(path: Path) -> tuple[str, int]:
    """(sha256 of the file bytes, number of lines); memoised on path, size and mtime."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo in _DIGESTS:
        return _DIGESTS[memo]
    digest = hashlib.sha256()
    lines = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            lines += chunk.count(b"\n")
    _DIGESTS[memo] = (digest.hexdigest(), lines)
    return _DIGESTS[memo]


def corpus_key(spec: CorpusSpec) -> str:
    """Hash of what determines the index: file bytes, format, field map, name, schema."""
    material = {
        "sha256": _file_digest(spec.path)[0],
        "format": spec.format,
        "field_map": sorted(spec.field_map.items()),
        "name": spec.label,
        "schema": SCHEMA_VERSION,
        "tantivy": tantivy.__version__,
    }
    blob = json.dumps(material, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def index_dir(spec: CorpusSpec, cache_dir: str | Path | None = None) -> Path:
    """The folder the index of ``spec`` lives in (whether built yet or not)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.label).strip("-.")[:40] or "corpus"
    return default_cache_dir(cache_dir) / "index" / f"{slug}-{corpus_key(spec)}"


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION:
        return None
    return meta


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _info(path: Path, meta: Mapping[str, Any], cache_hit: bool) -> IndexInfo:
    return IndexInfo(
        path=path,
        doc_count=int(meta["doc_count"]),
        build_seconds=float(meta["build_seconds"]),
        cache_hit=cache_hit,
        corpus_path=str(meta.get("corpus_path", "")),
        corpus_name=str(meta.get("corpus_name", "")),
        corpus_key=str(meta.get("corpus_key", "")),
        rows=int(meta.get("rows", 0)),
        malformed=int(meta.get("malformed", 0)),
        size_bytes=_dir_size(path),
    )


# --- building ----------------------------------------------------------------------------------


def build_index(
    source: CorpusSource = None,
    *,
    field_map: Mapping[str, str] | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = False,
    on_progress: ProgressFn | None = None,
    threads: int | None = None,
    impacts: bool | None = None,
) -> IndexInfo:
    """Build the index of a corpus unless a valid cached one exists; return where it is.

    ``source``: None (the built-in corpus), a JSONL/parquet/TSV path, or a :class:`CorpusSpec`.
    The corpus is streamed (memory is bounded by the writer heap, not the corpus size).
    ``progress`` shows a progress bar on stderr; ``on_progress`` is called every
    ``PROGRESS_EVERY`` documents and once at the end. ``threads``: indexing threads (default:
    all cores, at most 8). ``impacts``: also store every term's BM25 scores for the fast search
    path (:mod:`drvenus.corpus.impact`; needs numpy): None (default) for corpora of at least
    ``IMPACT_MIN_DOCS`` documents, where tantivy alone gets slow. Raises :class:`CorpusError`
    for a missing file or a corpus without usable rows.
    """
    spec = corpus_spec(source, field_map=field_map)
    final = index_dir(spec, cache_dir)
    meta = _read_meta(final)
    if meta is not None and not force:
        return _info(final, meta, cache_hit=True)

    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        from drvenus.corpus import impact  # numpy: imported when building

        with_impacts = impacts if impact.can_build() else False
        meta = _write_index(spec, tmp, progress, on_progress, threads, with_impacts)
        _publish(tmp, final, replace=force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    meta = _read_meta(final) or meta
    info = _info(final, meta, cache_hit=False)
    log.info(
        "indexed %d documents of %s in %.1fs (%s)",
        info.doc_count,
        spec.path.name,
        info.build_seconds,
        final,
    )
    return info


def _write_index(
    spec: CorpusSpec,
    path: Path,
    progress: bool,
    on_progress: ProgressFn | None,
    threads: int | None,
    impacts: bool | None,
) -> dict[str, Any]:
    start = time.perf_counter()
    index = tantivy.Index(_schema(), path=str(path), reuse=False)
    index.register_tokenizer(TOKENIZER, _analyzer())
    threads = max(1, threads or min(8, os.cpu_count() or 1))
    # tantivy needs at least ~15 MB of heap per thread
    writer = index.writer(
        heap_size=max(WRITER_HEAP_BYTES, threads * 32_000_000), num_threads=threads
    )
    stats = LoadStats()
    docs = iter_documents(spec, stats)
    add = writer.add_document
    make = tantivy.Document
    from drvenus.corpus import impact

    ids = impact.IdWriter(path / IMPACT_DIR) if impacts is not False else None
    for row, doc in enumerate(_with_progress(docs, spec, progress, on_progress)):
        key = url_key(doc.url) or doc.url
        page = make(
            id=doc.id, title=doc.title, url=doc.url, text=doc.text, key=key, key_ci=key.lower()
        )
        page.add_unsigned("row", row)
        page.add_unsigned("row_term", row)
        add(page)
        if ids is not None:
            ids.add(doc.id)
    report(spec, stats)  # raises CorpusError when nothing was usable
    writer.commit()
    writer.wait_merging_threads()
    impact_meta = None
    if ids is not None:
        ids.close()
        if impacts or stats.documents >= IMPACT_MIN_DOCS:
            impact_meta = impact.write_impacts(index, path / IMPACT_DIR, _BOOSTS)
        else:
            shutil.rmtree(path / IMPACT_DIR)
    meta = {
        "schema_version": SCHEMA_VERSION,
        "doc_count": stats.documents,
        "rows": stats.rows,
        "malformed": stats.malformed,
        "build_seconds": round(time.perf_counter() - start, 3),
        "corpus_path": str(spec.path),
        "corpus_name": spec.label,
        "corpus_format": spec.format,
        "field_map": dict(spec.field_map),
        "corpus_key": corpus_key(spec),
        "tantivy": tantivy.__version__,
        "impacts": impact_meta is not None,
        "impact_seconds": impact_meta["seconds"] if impact_meta else None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # The meta file is written last: its presence marks a complete index.
    (path / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def _with_progress(
    docs: Iterator[Document], spec: CorpusSpec, bar: bool, on_progress: ProgressFn | None
) -> Iterator[Document]:
    """Pass the documents through, reporting every ``PROGRESS_EVERY`` and at the end."""
    if not bar and on_progress is None:
        yield from docs
        return
    total = _expected_rows(spec)
    if bar:
        docs = _with_bar(docs, spec, total)
    done = 0
    for done, doc in enumerate(docs, start=1):
        yield doc
        if on_progress is not None and done % PROGRESS_EVERY == 0:
            on_progress(done, total)
    if on_progress is not None and done % PROGRESS_EVERY:
        on_progress(done, total)


def _with_bar(docs: Iterator[Document], spec: CorpusSpec, total: int | None) -> Iterator[Document]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn("[bold]indexing {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(spec.label, total=total)
        done = 0
        for done, doc in enumerate(docs, start=1):
            yield doc
            if done % 1000 == 0:
                bar.update(task, completed=done)
        bar.update(task, completed=done, total=done)  # rows counted include malformed ones


def _expected_rows(spec: CorpusSpec) -> int | None:
    """Rough row count for the progress bar (None when unknown)."""
    try:
        if spec.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(spec.path).metadata.num_rows
        if spec.format == "wiki-summaries":
            return BUILTIN_DOC_COUNT
        if spec.format in ("jsonl", "tsv") and not spec.path.name.lower().endswith(".gz"):
            lines = _file_digest(spec.path)[1] - (spec.format == "tsv")  # TSV: header row
            return lines if lines > 0 else None
    except Exception:  # only cosmetics depend on it
        return None
    return None


def _publish(tmp: Path, final: Path, *, replace: bool) -> None:
    """Rename the finished index into place; a concurrent builder's valid index wins."""
    if final.exists():
        if _read_meta(final) is not None and not replace:
            return
        old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            final.rename(old)
        except OSError:
            pass
        else:
            shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.rename(final)
    except OSError:
        if _read_meta(final) is None:
            raise


def _remove_stale_tmp(root: Path) -> None:
    now = time.time()
    for entry in root.glob(".tmp-*"):
        try:
            if now - entry.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
