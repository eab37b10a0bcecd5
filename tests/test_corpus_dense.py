"""Hybrid search: the dense article vectors (WordLlama, from its wheel) fused with BM25."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drvenus.corpus import CorpusIndex, build_index, open_index
from drvenus.corpus import dense as dense_module
from drvenus.corpus.dense import RRF_K, DenseUnavailable, fuse

pytest.importorskip("wordllama", reason="hybrid search needs pip install 'drvenus[dense]'")

DOCS = [
    {"id": "danube", "title": "Danube", "url": "https://en.wikipedia.org/wiki/Danube",
     "text": "The Danube is the second-longest river in Europe. It flows through Vienna, "
             "Bratislava, Budapest and Belgrade before it reaches the Black Sea."},
    {"id": "hungary", "title": "Hungary", "url": "https://en.wikipedia.org/wiki/Hungary",
     "text": "Hungary is a landlocked country in Central Europe. Its capital is Budapest."},
    {"id": "mona", "title": "Mona Lisa", "url": "https://en.wikipedia.org/wiki/Mona_Lisa",
     "text": "The Mona Lisa is a half-length portrait painting by Leonardo da Vinci, known "
             "for the enigmatic smile of the sitter."},
    {"id": "piano", "title": "Piano", "url": "https://en.wikipedia.org/wiki/Piano",
     "text": "The piano is a keyboard instrument in which hammers strike strings."},
    {"id": "volcano", "title": "Volcano", "url": "https://en.wikipedia.org/wiki/Volcano",
     "text": "A volcano is a rupture in the crust through which lava and gases escape."},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dense")
    corpus = root / "mini.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n", encoding="utf-8")
    return build_index(corpus, cache_dir=root / "cache").path


def test_vectors_are_built_once_and_saved_beside_the_index(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = CorpusIndex(folder, dense=True)
    assert first.hybrid and len(first._dense or ()) == len(DOCS)
    meta = json.loads((folder / "dense" / "meta.json").read_text())
    assert meta["doc_count"] == len(DOCS) and meta["model"].startswith("wordllama")

    def no_build(*args: object) -> None:
        raise AssertionError("the saved vectors should have been read")

    monkeypatch.setattr(dense_module, "_build", no_build)
    again = CorpusIndex(folder, dense=True)
    assert (again._dense.vectors == first._dense.vectors).all()  # type: ignore[union-attr]


def test_stale_or_broken_vectors_are_built_again(folder: Path) -> None:
    (folder / "dense" / "vectors.npy").write_bytes(b"not numpy")
    assert len(CorpusIndex(folder, dense=True)._dense or ()) == len(DOCS)
    meta = folder / "dense" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "doc_count": 99}))
    CorpusIndex(folder, dense=True)
    assert json.loads(meta.read_text())["doc_count"] == len(DOCS)


def test_a_described_subject_is_found_without_its_words(folder: Path) -> None:
    query = "famous renaissance artwork lady"  # none of these words is in the Mona Lisa page
    plain = CorpusIndex(folder)
    hybrid = CorpusIndex(folder, dense=True)
    assert "Mona Lisa" not in [h.title for h in plain.search(query, k=5)]
    hits = hybrid.search(query, k=2)
    assert hits[0].title == "Mona Lisa" and hits[0].snippet.startswith("The Mona Lisa")
    # the ranking of search_ids is search's
    ids = hybrid.search_ids(query, k=2)
    assert [i for i, _ in ids] == [h.id for h in hits]
    assert [s for _, s in ids] == [h.score for h in hits]


def test_hybrid_keeps_what_bm25_finds_first(folder: Path) -> None:
    hybrid = CorpusIndex(folder, dense=True)
    assert hybrid.search("Danube river Budapest", k=1)[0].title == "Danube"
    assert hybrid.search("", k=3) == [] and hybrid.search("Danube", k=0) == []


def test_open_index_keeps_one_index_per_ranking(tmp_path: Path) -> None:
    corpus = tmp_path / "mini.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n", encoding="utf-8")
    plain = open_index(corpus, cache_dir=tmp_path / "cache")
    hybrid = open_index(corpus, cache_dir=tmp_path / "cache", dense=True)
    assert not plain.hybrid and hybrid.hybrid
    assert open_index(corpus, cache_dir=tmp_path / "cache", dense=True) is hybrid


def test_without_the_model_hybrid_is_a_clear_error(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_wordllama(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("wordllama"):
            raise ImportError("No module named 'wordllama'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dense_module, "_MODEL", None)
    monkeypatch.setattr(builtins, "__import__", no_wordllama)
    with pytest.raises(DenseUnavailable, match=r"drvenus\[dense\]"):
        dense_module.load_model()


rankings = st.lists(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30)), unique=True, max_size=25),
    min_size=1, max_size=3,
)


@given(rankings, st.integers(0, 40))
def test_fusion_is_reciprocal_rank(lists: list[list[tuple[int, int]]], k: int) -> None:
    fused = fuse(lists, k)
    every = {a for r in lists for a in r}
    assert len(fused) == min(k, len(every))
    scores = [s for _, s in fused]
    assert scores == sorted(scores, reverse=True)
    for address, score in fused:
        expected = sum(1.0 / (RRF_K + r.index(address) + 1) for r in lists if address in r)
        assert score == pytest.approx(expected)
    # what every ranking puts first is first
    if k and all(r and r[0] == lists[0][0] for r in lists):
        assert fused[0][0] == lists[0][0]


def test_the_setting_chooses_the_ranking(tmp_path: Path) -> None:
    from drvenus.config import Settings
    from drvenus.small.preset import hybrid_search

    own = tmp_path / "pages.jsonl"
    assert hybrid_search(Settings())  # the embedded preset, built-in corpus, wordllama installed
    assert not hybrid_search(Settings(corpus=own))  # a user's corpus: opt in
    assert hybrid_search(Settings(corpus=own, retrieval="hybrid"))
    assert not hybrid_search(Settings(retrieval="bm25"))
    # another model is not the embedded preset: BM25 unless asked
    assert not hybrid_search(Settings(model_path=tmp_path / "m.gguf"))
    assert not hybrid_search(Settings(base_url="http://127.0.0.1:9/v1"))
    assert hybrid_search(Settings(base_url="http://127.0.0.1:9/v1", retrieval="hybrid"))


def test_index_build_prepares_hybrid_search(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    corpus = tmp_path / "mini.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n", encoding="utf-8")
    env = {**os.environ, "DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run(
        [sys.executable, "-m", "drvenus", "index", "build", str(corpus), "--retrieval", "hybrid"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "hybrid search ready" in run.stdout
    assert list((tmp_path / "cache").rglob("dense/meta.json"))
