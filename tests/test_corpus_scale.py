"""The index at scale: streaming builds from JSONL, parquet and TSV, progress, exact fast search."""

from __future__ import annotations

import csv
import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tantivy

from drvenus.corpus import CorpusError, CorpusIndex, build_index, load_corpus, url_key
from drvenus.corpus import index as index_module
from drvenus.corpus.index import SNIPPET_CHARS, TITLE_BOOST, sanitize_query
from drvenus.corpus.urls import _canonical_key

N_DOCS = 3000
COMMON = "the of and in a was is to by for on with as at from that his it".split()
TOPICS = (
    "river castle violin comet glacier senate harbor opera falcon desert copper monsoon "
    "cathedral railway tundra reactor sonnet volcano bishop lagoon quarry tapestry"
).split()


def make_rows(n: int = N_DOCS, seed: int = 7) -> list[dict[str, str]]:
    """Deterministic pseudo-articles: common words everywhere, a few topic words each."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topics = rng.sample(TOPICS, 3)
        words = [
            rng.choice(COMMON) if rng.random() < 0.6 else rng.choice(topics) for _ in range(60)
        ]
        words += [f"w{rng.randrange(400)}" for _ in range(20)]
        text = " ".join(words)
        if i % 97 == 0:
            text = f'He said "hello"\tthen left. {text}'  # a quote and a tab inside a field
        rows.append({"id": f"d{i}", "title": f"{topics[0].title()} {i}", "text": text})
    return rows


QUERIES = [
    "the river castle",
    "Was the violin in the senate of the harbor?",
    "comet glacier w17",
    "opera",
    "the of and",
    "falcon desert copper monsoon cathedral railway tundra reactor",
    "who built the volcano by the lagoon with a quarry",
    '"river castle" the',
    "w3 w5 w7 the a",
    "nothing matches zzz",
]


def write_tsv(path: Path, rows: list[dict[str, str]]) -> Path:
    """The wiki-18 layout: header ``id, text, title``; CSV quoting inside a tab-separated file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows([r["id"], r["text"], r["title"]] for r in rows)
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scale")
    rows = make_rows()
    jsonl = root / "scale.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    parquet = root / "scale.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=700)
    return {
        "jsonl": jsonl,
        "parquet": parquet,
        "tsv": write_tsv(root / "scale.tsv", rows),
        "tsv.gz": write_tsv(root / "scale.tsv.gz", rows),
    }


@pytest.fixture(scope="module")
def built(
    corpora: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[CorpusIndex, list[tuple[int, int | None]]]]:
    cache = tmp_path_factory.mktemp("cache")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(index_module, "PROGRESS_EVERY", 500)
        for fmt, path in corpora.items():
            calls: list[tuple[int, int | None]] = []
            # one thread: documents keep the file order, so equal scores tie-break alike
            info = build_index(
                path,
                cache_dir=cache,
                on_progress=lambda d, t, c=calls: c.append((d, t)),
                threads=1,
            )
            out[fmt] = (CorpusIndex(info.path), calls)
        info = build_index(corpora["jsonl"], cache_dir=cache / "threads", threads=2)
        out["threads"] = (CorpusIndex(info.path), [])
    return out


def test_progress_callback(built: dict[str, tuple[CorpusIndex, list]]) -> None:
    for fmt, (index, calls) in built.items():
        if fmt == "threads":
            continue
        assert index.doc_count == N_DOCS, fmt
        assert [d for d, _ in calls] == list(range(500, N_DOCS + 1, 500)), fmt
        expected = None if fmt == "tsv.gz" else N_DOCS  # no row count for compressed files
        assert {t for _, t in calls} == {expected}, fmt


def test_formats_give_the_same_hits(built: dict[str, tuple[CorpusIndex, list]]) -> None:
    reference = built["jsonl"][0]
    for query in QUERIES:
        want = [(h.id, h.title, h.snippet) for h in reference.search(query, 10)]
        for fmt in ("parquet", "tsv", "tsv.gz"):
            got = [(h.id, h.title, h.snippet) for h in built[fmt][0].search(query, 10)]
            assert got == want, (fmt, query)
        # two indexing threads: documents interleave, so only the scores must agree
        scores = [round(h.score, 4) for h in built["threads"][0].search(query, 10)]
        assert scores == [round(h.score, 4) for h in reference.search(query, 10)], query
    assert reference.search("comet glacier", 5)


def test_tsv_fields_round_trip(corpora: dict[str, Path]) -> None:
    docs = load_corpus(corpora["tsv"]).documents
    rows = make_rows()
    assert [(d.id, d.title, d.text) for d in docs] == [
        (r["id"], r["title"], r["text"]) for r in rows
    ]
    assert docs[0].text.startswith('He said "hello"\tthen')
    assert docs[0].url.startswith("https://scale.corpus.local/doc/")


def test_tsv_bad_rows_and_header(tmp_path: Path) -> None:
    path = tmp_path / "psgs.tsv"
    path.write_text(
        "id\ttext\ttitle\n1\tfirst text\tOne\n2\tonly two\n3\t\tEmpty\n", encoding="utf-8"
    )
    corpus = load_corpus(path)
    assert [d.id for d in corpus.documents] == ["1"]
    assert corpus.stats.malformed == 2
    mapped = tmp_path / "mapped.tsv"
    mapped.write_text("doc\tbody\n1\tsome text\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="no column 'text'"):
        load_corpus(mapped)
    assert load_corpus(mapped, field_map={"id": "doc", "text": "body"}).documents[0].id == "1"


def reference_search(index: CorpusIndex, query: str, k: int) -> list[tuple[str, str]]:
    """The search as it was: parser query, full evaluation, tantivy snippets (then the index's
    own lead-or-fragment choice, tested on its own in test_corpus.py)."""
    text = sanitize_query(query)
    if not text:
        return []
    parsed, _ = index._index.parse_query_lenient(
        text, ["title", "text"], field_boosts={"title": TITLE_BOOST}
    )
    searcher = index._index.searcher()
    result = searcher.search(parsed, limit=k)
    gen = tantivy.SnippetGenerator.create(searcher, parsed, index._schema, "text")
    gen.set_max_num_chars(SNIPPET_CHARS)
    weights = index.term_weights(text)
    out = []
    for _, address in result.hits:
        doc = searcher.doc(address)
        body = doc.get_first("text")
        snip = gen.snippet_from_doc(doc)
        start = end = 0
        if snip.highlighted():
            span = snip.fragment_range()
            raw = body.encode()
            start = len(raw[: span.start].decode(errors="ignore"))
            end = start + len(raw[span.start : span.end].decode(errors="ignore"))
        title = doc.get_first("title") or ""
        out.append((doc.get_first("id"), index.choose_snippet(body, start, end, weights, title)))
    return out


@pytest.mark.parametrize("candidates", [(250,), (40,), (5,), (1, 3)])
def test_fast_search_is_exact(
    built: dict[str, tuple[CorpusIndex, list]], candidates: tuple[int, ...], monkeypatch
) -> None:
    """Same top-k order and snippets as full evaluation, whichever path answers."""
    monkeypatch.setattr(index_module, "CANDIDATES", candidates)
    monkeypatch.setattr(index_module, "TWO_STAGE_MIN_DOCS", 0)
    index = built["jsonl"][0]
    rng = random.Random(3)
    queries = QUERIES + [
        " ".join(
            rng.choice(COMMON + TOPICS + ["w1", "w2", "w99"]) for _ in range(rng.randrange(1, 12))
        )
        for _ in range(60)
    ]
    for query in queries:
        for k in (1, 10):
            got = [(h.id, h.snippet) for h in index.search(query, k)]
            assert got == reference_search(index, query, k), (query, k)


def test_url_key_fast_path_matches_the_long_way() -> None:
    rng = random.Random(0)
    alphabet = "abcAB09-._~!$&'()*+,;=:@/%?# wW.m"
    hosts = ["en.wikipedia.org", "www.x.org", "en.m.wikipedia.org", "a-b.c", "x", "a..b", "a.b."]
    for _ in range(20_000):
        url = rng.choice(["https://", "http://", "HTTPS://", ""]) + rng.choice(hosts)
        url += "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert url_key(url) == _canonical_key(url), url
