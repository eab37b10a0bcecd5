"""Corpus loading, the tantivy index (build, cache, search, snippets) and the page store."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drvenus.corpus import (
    BUILTIN_DOC_COUNT,
    CorpusError,
    CorpusIndex,
    build_index,
    builtin_corpus_path,
    corpus_spec,
    default_cache_dir,
    index_dir,
    load_corpus,
    make_snippet,
    open_index,
    sanitize_query,
    url_key,
    wikipedia_url,
)
from drvenus.corpus.index import SNIPPET_CHARS

FILLER = (
    "The region is known for its mild climate and its long agricultural history. "
    "Many visitors arrive in the summer months to walk the old trails. "
)

DOCS = [
    {
        "id": "eiffel",
        "title": "Eiffel Tower",
        "url": "https://en.wikipedia.org/wiki/Eiffel_Tower",
        "text": "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. "
        "It is 330 metres tall and was designed by the company of Gustave Eiffel. "
        "It was the tallest man-made structure in the world until 1930.",
    },
    {
        "id": "louvre",
        "title": "Louvre",
        "url": "https://en.wikipedia.org/wiki/Louvre",
        "text": "The Louvre is the world's most-visited art museum, located in Paris. "
        "It houses the Mona Lisa and the Venus de Milo.",
    },
    {
        "id": "godel",
        "title": "Kurt Gödel",
        "url": "https://en.wikipedia.org/wiki/Kurt_G%C3%B6del",
        "text": "Kurt Gödel was a logician who published his incompleteness theorems in 1931, "
        "when he was 25 years old.",
    },
    {
        "id": "valley",
        "title": "Green Valley",
        "url": "https://example.org/places/green-valley/",
        "text": FILLER * 4
        + "In 1887 a gold nugget weighing nine kilograms was found near the river bend. "
        + FILLER * 4,
    },
    {
        "id": "ferry",
        "title": "Night Ferry",
        "url": "https://example.org/books/night-ferry/",
        "text": "Night Ferry is an 1897 novel by the Irish author Agnes Roe. "
        + FILLER * 3
        + "On the night ferry the crew of the Night Ferry fear the storm, and the Night Ferry "
        "sails into the harbour at dawn. "
        + FILLER * 2,
    },
    {
        "id": "tower-bridge",
        "title": "Tower Bridge",
        "url": "https://en.wikipedia.org/wiki/Tower_Bridge",
        "text": "Tower Bridge is a combined bascule and suspension bridge in London, "
        "built between 1886 and 1894.",
    },
]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "mini.jsonl", DOCS)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> CorpusIndex:
    root = tmp_path_factory.mktemp("mini")
    corpus = write_jsonl(root / "mini.jsonl", DOCS)
    return CorpusIndex(build_index(corpus, cache_dir=root / "cache").path)


# --- loading -----------------------------------------------------------------------------------


def test_jsonl_field_map_and_derived_fields(tmp_path: Path) -> None:
    rows = [
        {"doc_id": 7, "name": "Seven", "link": "https://x.org/7", "contents": "Seven is a number."},
        {"name": "No id", "link": "https://x.org/no-id", "contents": "This row has no id."},
        {"contents": "Neither id nor url nor title. Second sentence."},
    ]
    path = write_jsonl(tmp_path / "mapped.jsonl", rows)
    fmap = {"id": "doc_id", "title": "name", "url": "link", "text": "contents"}
    corpus = load_corpus(path, field_map=fmap)
    docs = corpus.documents
    assert [d.id for d in docs] == ["7", "https://x.org/no-id", "row-3"]
    assert docs[0].title == "Seven" and docs[0].url == "https://x.org/7"
    assert docs[2].title == "Neither id nor url nor title."
    assert docs[2].url.startswith("https://") and docs[2].url.endswith("/row-3")
    # the pseudo URL is stable across loads
    assert load_corpus(path, field_map=fmap).documents[2].url == docs[2].url


def test_malformed_rows_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows: list[object] = [
        DOCS[0],
        "{not json",
        "[1, 2, 3]",
        {"title": "no text"},
        {"title": "empty", "text": "   "},
        {"title": "numeric", "text": 42},
        DOCS[1],
    ]
    path = write_jsonl(tmp_path / "messy.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="drvenus.corpus"):
        corpus = load_corpus(path)
    assert len(corpus.documents) == 2
    assert corpus.stats.rows == 7 and corpus.stats.malformed == 5
    assert corpus.stats.reasons["invalid JSON"] == 1
    assert "skipped 5 malformed" in caplog.text


def test_parquet_with_field_map(tmp_path: Path) -> None:
    table = pa.table(
        {
            "link": [d["url"] for d in DOCS],
            "headline": [d["title"] for d in DOCS],
            "body": [d["text"] for d in DOCS[:-1]] + [None],
        }
    )
    path = tmp_path / "mini.parquet"
    pq.write_table(table, path)
    corpus = load_corpus(path, field_map={"url": "link", "title": "headline", "text": "body"})
    assert len(corpus.documents) == len(DOCS) - 1
    assert corpus.stats.malformed == 1
    assert corpus.documents[0].id == DOCS[0]["url"]
    assert corpus.documents[0].title == "Eiffel Tower"

    with pytest.raises(CorpusError, match="no column 'text'"):
        load_corpus(path)


def test_missing_file_and_empty_corpus(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="not found") as missing:
        load_corpus(tmp_path / "nope.jsonl")
    assert "\n" not in str(missing.value)
    path = write_jsonl(tmp_path / "empty.jsonl", [{"title": "x"}, "garbage"])
    with pytest.raises(CorpusError, match="no usable rows") as empty:
        load_corpus(path)
    assert "\n" not in str(empty.value)
    with pytest.raises(CorpusError, match="format"):
        load_corpus(write_jsonl(tmp_path / "data.txt", DOCS))
    with pytest.raises(CorpusError, match="field_map"):
        load_corpus(path, field_map={"body": "text"})


def test_builtin_corpus_loads_all_summaries() -> None:
    corpus = load_corpus()
    assert len(corpus.documents) == BUILTIN_DOC_COUNT == 10_033
    assert corpus.stats.malformed == 0
    by_title = {d.title: d for d in corpus.documents}
    odyssey = by_title["2001: A Space Odyssey"]
    assert odyssey.url == "https://en.wikipedia.org/wiki/2001:_A_Space_Odyssey"
    assert "Stanley Kubrick" in odyssey.text
    assert by_title["AT&T"].url == "https://en.wikipedia.org/wiki/AT%26T"
    assert builtin_corpus_path().name == "summaries_en-us.json"


# --- index build and cache ---------------------------------------------------------------------


def test_build_is_cached_and_keyed_by_content(corpus_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = build_index(corpus_file, cache_dir=cache)
    assert not first.cache_hit and first.doc_count == len(DOCS) and first.size_bytes > 0
    second = build_index(corpus_file, cache_dir=cache)
    assert second.cache_hit and second.path == first.path
    assert not list(first.path.parent.glob(".tmp-*"))

    mapped = build_index(corpus_file, cache_dir=cache, field_map={"title": "id"})
    assert mapped.path != first.path

    write_jsonl(corpus_file, DOCS[:3])
    changed = build_index(corpus_file, cache_dir=cache)
    assert not changed.cache_hit and changed.path != first.path and changed.doc_count == 3

    forced = build_index(corpus_file, cache_dir=cache, force=True)
    assert not forced.cache_hit and forced.path == changed.path
    assert CorpusIndex(forced.path).doc_count == 3


def test_failed_build_leaves_no_index(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"title": "no text"}])
    cache = tmp_path / "cache"
    with pytest.raises(CorpusError):
        build_index(path, cache_dir=cache)
    spec = corpus_spec(path)
    assert not index_dir(spec, cache).exists()
    assert not list((cache / "index").glob(".tmp-*"))


def test_cache_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    assert default_cache_dir(tmp_path / "param") == tmp_path / "param"
    monkeypatch.delenv("DRVENUS_CACHE_DIR")
    assert "drvenus" in str(default_cache_dir())


def test_open_index_is_shared(corpus_file: Path, tmp_path: Path) -> None:
    a = open_index(corpus_file, cache_dir=tmp_path / "cache")
    b = open_index(corpus_file, cache_dir=tmp_path / "cache")
    assert a is b


def test_builtin_index(tmp_path: Path) -> None:
    start = time.perf_counter()
    info = build_index(cache_dir=tmp_path / "cache")
    elapsed = time.perf_counter() - start
    assert info.doc_count == 10_033 and elapsed < 60
    index = CorpusIndex(info.path)
    hits = index.search("2001 space odyssey film", k=5)
    assert hits[0].title == "2001: A Space Odyssey"
    doc = index.get_document("http://en.m.wikipedia.org/wiki/2001:_A_Space_Odyssey")
    assert doc is not None and doc.title == "2001: A Space Odyssey"


# --- search ------------------------------------------------------------------------------------


def test_search_ranks_relevant_document_first(index: CorpusIndex) -> None:
    hits = index.search("how tall is the Eiffel tower", k=3)
    assert hits[0].id == "eiffel"
    assert hits[0].url == "https://en.wikipedia.org/wiki/Eiffel_Tower"
    assert "330 metres" in hits[0].snippet
    assert index.search("godel incompleteness")[0].id == "godel"  # accents folded
    assert index.search("Mona Lisa museum")[0].title == "Louvre"
    assert index.search("zzzqqq nothing matches") == []
    assert len(index.search("tower", k=1)) == 1


def test_analyze_gives_the_index_tokens(index: CorpusIndex) -> None:
    from drvenus.corpus import analyze

    assert analyze("Gödel's Towers, RUNNING") == ["godel", "s", "tower", "run"]
    assert set(index.term_weights("Gödel towers")) == set(analyze("Gödel towers"))


def test_title_is_boosted(index: CorpusIndex) -> None:
    # "bridge" is in the title of one doc only; "tower" in titles of two.
    hits = index.search("bridge")
    assert hits[0].id == "tower-bridge"


def test_snippet_is_a_window_around_the_match(index: CorpusIndex) -> None:
    (hit,) = index.search("gold nugget", k=1)
    text = next(d["text"] for d in DOCS if d["id"] == "valley")
    assert hit.id == "valley"
    assert "gold nugget" in hit.snippet
    assert hit.snippet.startswith("...") and hit.snippet.endswith("...")
    assert SNIPPET_CHARS // 2 <= len(hit.snippet) <= SNIPPET_CHARS + 10
    inner = hit.snippet.strip(".")
    assert inner.strip() in " ".join(text.split())  # cut at word boundaries
    words = set(text.split())
    assert all(w in words for w in hit.snippet.removeprefix("...").removesuffix("...").split())


def test_snippet_is_the_lead_unless_a_window_holds_more_of_the_query(index: CorpusIndex) -> None:
    """The densest window only repeats the title's words: the lead says what the page is."""
    for query in ("Night Ferry", "who wrote the novel Night Ferry"):
        (hit,) = index.search(query, k=1)
        assert hit.id == "ferry" and hit.snippet.startswith("Night Ferry is an 1897 novel by")
    (hit,) = index.search("Night Ferry storm harbour", k=1)
    assert hit.snippet.startswith("...") and "harbour" in hit.snippet
    (hit,) = index.search("gold nugget Green Valley", k=1)  # the title alone does not win it
    assert hit.id == "valley" and "gold nugget" in hit.snippet


def test_snippet_shows_where_a_query_word_the_lead_lacks_is_mentioned(index: CorpusIndex) -> None:
    """The title's words are shown anyway and question words locate nothing: "capital of
    Velaria" on the page "Velaria" wants the window that mentions the capital."""
    filler = " ".join(f"hill{i} river{i}" for i in range(40))
    body = (f"Country in the north. Velaria is a country of lakes and forests. {filler}. "
            f"Its capitals were moved twice; Morrow is the capital and largest city. {filler}.")
    weights = {"what": 4.0, "capit": 2.5, "velaria": 6.0, "of": 0.1, "the": 0.05}
    snippet = index.choose_snippet(body, 0, 0, weights, title="Velaria")
    assert "capitals were moved" in snippet and snippet.startswith("...")
    # without the title the lead's "Velaria" outweighs it; a word the lead has keeps the lead
    assert index.choose_snippet(body, 0, 0, weights).startswith("Country in the north.")
    assert index.choose_snippet(body, 0, 0, {"lake": 2.0, "what": 4.0}, title="Velaria") == (
        index.choose_snippet(body, 0, 0, {}, title="Velaria"))
    assert index.choose_snippet(body, 0, 0, {"moon": 9.0}, title="Velaria").startswith("Country")


def test_make_snippet_edges() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    lead = make_snippet(text, 0, 0, width=100)
    assert lead.startswith("word0 ") and lead.endswith("...") and len(lead) <= 104
    tail = make_snippet(text, len(text) - 7, len(text), width=100)
    assert tail.startswith("...") and tail.endswith("word199")
    assert make_snippet("short text", 0, 5) == "short text"


@pytest.mark.parametrize(
    "query",
    [
        'title:"unclosed AND (OR',
        "NOT",
        "AND OR NOT",
        "a:b:c::",
        "(((",
        "[1 TO 5]",
        "field:IN [a b]",
        "-eiffel +tower ~2 ^3 *",
        "東京タワー",
        "Gödel’s théorème — ÷ ∞",
        "\\",
        "'single' \"double\"",
        "x" * 5000,
        "tower " * 500,
        "\x00\x1f control",
        "",
        "   ",
        "?!.,;",
    ],
)
def test_weird_queries_never_raise(index: CorpusIndex, query: str) -> None:
    hits = index.search(query)
    assert isinstance(hits, list)


def test_sanitize_query() -> None:
    assert sanitize_query("") == ""
    assert sanitize_query("!!! ???") == ""
    assert sanitize_query("Eiffel AND tower") == "eiffel and tower"
    assert sanitize_query('"Eiffel Tower" height') == 'eiffel tower height "eiffel tower"'
    assert sanitize_query("title:foo (bar)") == "title foo bar"


def test_phrase_boost(index: CorpusIndex) -> None:
    hits = index.search('"tower bridge" eiffel')
    assert hits[0].id == "tower-bridge"


def test_concurrent_searches(index: CorpusIndex) -> None:
    queries = ["eiffel tower", "louvre paris", "gold nugget", "godel"] * 25
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda q: index.search(q, 3), queries))
    assert all(r for r in results)
    assert results[0][0].id == "eiffel"


# --- the page store ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://en.wikipedia.org/wiki/Eiffel_Tower",
        "http://en.wikipedia.org/wiki/Eiffel_Tower",
        "https://en.wikipedia.org/wiki/Eiffel_Tower/",
        "https://en.m.wikipedia.org/wiki/Eiffel_Tower",
        "https://en.wikipedia.org/wiki/Eiffel Tower",
        "https://en.wikipedia.org/wiki/Eiffel%20Tower",
        "https://en.wikipedia.org/wiki/Eiffel_Tower#History",
        "en.wikipedia.org/wiki/Eiffel_Tower",
        "https://EN.Wikipedia.org/wiki/eiffel_tower",
        "  https://www.en.wikipedia.org:443/wiki/Eiffel_Tower  ",
    ],
)
def test_get_document_normalises_urls(index: CorpusIndex, url: str) -> None:
    doc = index.get_document(url)
    assert doc is not None and doc.id == "eiffel"
    assert doc.text.startswith("The Eiffel Tower")


def test_get_document_misses(index: CorpusIndex) -> None:
    assert index.get_document("https://en.wikipedia.org/wiki/Big_Ben") is None
    assert index.get_document("file:///etc/passwd") is None
    assert index.get_document("ftp://en.wikipedia.org/wiki/Eiffel_Tower") is None
    assert index.get_document("") is None
    godel = index.get_document("https://en.wikipedia.org/wiki/Kurt_Gödel")
    assert godel is not None and godel.id == "godel"
    valley = index.get_document("http://example.org/places/green-valley")
    assert valley is not None and valley.id == "valley"


def test_url_key() -> None:
    assert url_key("https://en.m.wikipedia.org/wiki/A_B/") == "en.wikipedia.org/wiki/A_B"
    assert url_key("http://example.org:8080/a?b=1#frag") == "example.org:8080/a?b=1"
    assert url_key("example.org:8080/x") == "example.org:8080/x"
    assert url_key("javascript:alert(1)") is None
    assert url_key("mailto:someone@example.org") is None
    assert url_key("/etc/passwd") is None
    assert wikipedia_url("Kurt Gödel") == "https://en.wikipedia.org/wiki/Kurt_G%C3%B6del"
    assert wikipedia_url("HIV/AIDS") == "https://en.wikipedia.org/wiki/HIV/AIDS"
