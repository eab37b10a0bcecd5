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

from drvenus.corpus import CorpusError, CorpusIndex, build_index, impact, load_corpus, url_key
from drvenus.corpus import build as build_module
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
        mp.setattr(build_module, "PROGRESS_EVERY", 500)
        for fmt, path in corpora.items():
            calls: list[tuple[int, int | None]] = []
            # one thread: documents keep the file order, so equal scores tie-break alike
            info = build_index(
                path,
                cache_dir=cache,
                on_progress=lambda d, t, c=calls: c.append((d, t)),
                threads=1,
                impacts=True,  # not the default at this size
            )
            out[fmt] = (CorpusIndex(info.path), calls)
        info = build_index(corpora["jsonl"], cache_dir=cache / "threads", threads=2, impacts=True)
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
    parsed = _parser_query(index, text)
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


def exactness_queries() -> list[str]:
    rng = random.Random(3)
    return QUERIES + [
        " ".join(
            rng.choice(COMMON + TOPICS + ["w1", "w2", "w99"]) for _ in range(rng.randrange(1, 12))
        )
        for _ in range(60)
    ]


@pytest.mark.parametrize("candidates", [(250,), (40,), (5,), (1, 3)])
def test_two_stage_search_is_exact(
    built: dict[str, tuple[CorpusIndex, list]], candidates: tuple[int, ...], monkeypatch
) -> None:
    """tantivy's own path (no impact postings): same top-k order and snippets as full
    evaluation, whichever stage answers."""
    monkeypatch.setattr(index_module, "CANDIDATES", candidates)
    monkeypatch.setattr(index_module, "TWO_STAGE_MIN_DOCS", 0)
    index = CorpusIndex(built["jsonl"][0].path, impacts=False)
    assert not index.fast_path
    for query in exactness_queries():
        for k in (1, 10):
            got = [(h.id, h.snippet) for h in index.search(query, k)]
            assert got == reference_search(index, query, k), (query, k)


needs_numba = pytest.mark.skipif(not impact.can_search(), reason="numba is not installed")


@needs_numba
@pytest.mark.parametrize(
    ("share", "cheap"), [(0.5, 0.005), (0.0, 0.005), (0.99, 0.0), (0.99, 1.0), (0.2, 0.05)]
)
def test_impact_search_is_exact(
    built: dict[str, tuple[CorpusIndex, list]], share: float, cheap: float, monkeypatch
) -> None:
    """The impact path: same top-k order, snippets and scores as tantivy's full evaluation,
    however the clauses split between summed and looked up."""
    monkeypatch.setattr(impact, "LOOKUP_SHARE", share)
    monkeypatch.setattr(impact, "CHEAP_FRACTION", cheap)
    for fmt in ("jsonl", "threads"):  # one segment, several segments
        index = built[fmt][0]
        assert index.fast_path
        for query in exactness_queries():
            for k in (1, 3, 10):
                got = index.search(query, k)
                assert [(h.id, h.snippet) for h in got] == reference_search(index, query, k)
                want = [s for s, _ in reference_scores(index, query, k)]
                assert [h.score for h in got] == pytest.approx(want, rel=1e-5), query
                assert index.search_ids(query, k) == [(h.id, h.score) for h in got]


@needs_numba
@pytest.mark.parametrize(("min_df", "chunk"), [(1, 1 << 20), (10**9, 1 << 20), (16, 128)])
def test_impact_postings_with_every_or_no_term_stored(
    corpora: dict[str, Path], tmp_path: Path, min_df: int, chunk: int, monkeypatch
) -> None:
    """Terms left out of the store (rarer than MIN_DF) are read from tantivy at query time;
    common terms are read in row ranges when building (CHUNK_ROWS)."""
    monkeypatch.setattr(impact, "MIN_DF", min_df)
    monkeypatch.setattr(impact, "SMALL_CORPUS", 0)
    monkeypatch.setattr(impact, "CHUNK_ROWS", chunk)
    info = build_index(corpora["jsonl"], cache_dir=tmp_path, threads=2, impacts=True)
    index = CorpusIndex(info.path)
    assert index.fast_path
    stored = sum(f["terms"] for f in index._impacts.meta["fields"].values())
    assert (stored == 0) == (min_df > N_DOCS)
    for query in exactness_queries()[:30]:
        got = [(h.id, h.snippet) for h in index.search(query, 10)]
        assert got == reference_search(index, query, 10), query


def test_impact_dir_name() -> None:
    assert build_module.IMPACT_DIR == impact.IMPACT_DIR


@pytest.mark.parametrize("impacts", [False, None])
def test_index_without_impact_postings(
    corpora: dict[str, Path], tmp_path: Path, impacts: bool | None
) -> None:
    """Not asked for, or (by default) a corpus under IMPACT_MIN_DOCS: tantivy alone."""
    info = build_index(corpora["jsonl"], cache_dir=tmp_path, impacts=impacts)
    index = CorpusIndex(info.path)
    assert not index.fast_path and not (info.path / impact.IMPACT_DIR).exists()
    assert not index.meta["impacts"]
    hits = index.search("comet glacier", 5)
    assert hits and index.search_ids("comet glacier", 5) == [(h.id, h.score) for h in hits]
    assert index.search_ids("zzz nothing", 5) == [] and index.search_ids("", 5) == []


@needs_numba
def test_stale_impact_postings_are_ignored(corpora: dict[str, Path], tmp_path: Path) -> None:
    info = build_index(corpora["jsonl"], cache_dir=tmp_path, impacts=True)
    meta_file = info.path / impact.IMPACT_DIR / "impact.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "doc_count": meta["doc_count"] + 1}))
    index = CorpusIndex(info.path)
    assert not index.fast_path
    assert index.search("comet glacier", 3)


def _parser_query(index: CorpusIndex, text: str) -> tantivy.Query:
    parsed, _ = index._index.parse_query_lenient(
        text, ["title", "text"], field_boosts={"title": TITLE_BOOST}
    )
    return parsed


def reference_scores(index: CorpusIndex, query: str, k: int) -> list[tuple[float, str]]:
    text = sanitize_query(query)
    if not text:
        return []
    parsed = _parser_query(index, text)
    searcher = index._index.searcher()
    return [
        (score, searcher.doc(address).get_first("id"))
        for score, address in searcher.search(parsed, limit=k).hits
    ]


def test_url_key_fast_path_matches_the_long_way() -> None:
    rng = random.Random(0)
    alphabet = "abcAB09-._~!$&'()*+,;=:@/%?# wW.m"
    hosts = ["en.wikipedia.org", "www.x.org", "en.m.wikipedia.org", "a-b.c", "x", "a..b", "a.b."]
    for _ in range(20_000):
        url = rng.choice(["https://", "http://", "HTTPS://", ""]) + rng.choice(hosts)
        url += "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert url_key(url) == _canonical_key(url), url
