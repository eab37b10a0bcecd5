"""Retrieval quality on HotpotQA-500: recall of the gold paragraphs, ours vs plain BM25.

Corpus: the unique paragraphs of the 500 questions (title + paragraph text; 4,858). Query: the
raw question. For each question, recall@k = share of its supporting paragraphs (2 each) in the
top k; the table gives the mean over the questions and the share with both gold paragraphs in
the top k. Engines, same run: ours (tantivy, title boosted, stemmed, the product's search; on
its impact-postings fast path, and on tantivy alone, which must rank the same), bm25s (plain
BM25 over title + text, English stopwords, no stemming) and SQLite FTS5 (bm25(), porter
stemmer); and ours hybrid (``--retrieval hybrid``: fused with WordLlama's article vectors).

Usage: python benchmarks/bench_retrieval.py
Results go to stdout (a markdown table) and benchmarks/out/retrieval.json.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from drvenus.corpus import CorpusIndex, build_index

OUT = Path(__file__).resolve().parent / "out"
HOTPOT = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / "qa"
    / "hotpotqa-dev-500-with-paragraphs.jsonl"
).resolve()
KS = (5, 10)
_Search = Callable[[str, int], list[str]]


def load() -> tuple[list[dict[str, str]], list[tuple[str, set[str]]]]:
    """(paragraphs with ids, [(question, gold paragraph ids)])."""
    if not HOTPOT.is_file():
        raise SystemExit(f"shared data not found: {HOTPOT}")
    ids: dict[tuple[str, str], str] = {}
    questions = []
    for line in HOTPOT.read_bytes().splitlines():
        if not line.strip():
            continue
        row = orjson.loads(line)
        gold = set()
        for ctx in row["contexts"]:
            key = (ctx["title"], ctx["paragraph_text"])
            pid = ids.setdefault(key, f"h{len(ids)}")
            if ctx["is_supporting"]:
                gold.add(pid)
        questions.append((row["question_text"], gold))
    paragraphs = [{"id": pid, "title": t, "text": x} for (t, x), pid in ids.items()]
    return paragraphs, questions


def ours(paragraphs: list[dict[str, str]], work: Path, impacts: bool = True,
         dense: bool = False) -> _Search:
    """The product's search: ``CorpusIndex.search`` (full hits, snippets made and dropped)."""
    corpus = work / "hotpot.jsonl"
    corpus.write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in paragraphs))
    # impact postings built although the corpus is small (not the default under 100K documents)
    info = build_index(corpus, cache_dir=work / "cache", impacts=True)
    index = CorpusIndex(info.path, impacts=impacts, dense=dense)
    if impacts and not dense and not index.fast_path:
        logging.warning("ours: no impact postings or no numba: tantivy alone answers")
    return lambda q, k: [h.id for h in index.search(q, k)]


def ours_tantivy(paragraphs: list[dict[str, str]], work: Path) -> _Search:
    """The same search on tantivy alone (no impact postings): the ranking must not change."""
    return ours(paragraphs, work, impacts=False)


def ours_hybrid(paragraphs: list[dict[str, str]], work: Path) -> _Search:
    """The product's hybrid search (``--retrieval hybrid``: BM25 fused with WordLlama)."""
    return ours(paragraphs, work, dense=True)


def bm25s_plain(paragraphs: list[dict[str, str]], work: Path) -> _Search:
    import bm25s

    retriever = bm25s.BM25()
    texts = [f"{p['title']} {p['text']}" for p in paragraphs]
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    ids = [p["id"] for p in paragraphs]

    def search(q: str, k: int) -> list[str]:
        tokens = bm25s.tokenize([q], stopwords="en", show_progress=False)
        docs, _ = retriever.retrieve(tokens, k=k, show_progress=False)
        return [ids[i] for i in docs[0]]

    return search


def fts5(paragraphs: list[dict[str, str]], work: Path) -> _Search:
    import re

    con = sqlite3.connect(work / "fts5.db")
    con.execute(
        "CREATE VIRTUAL TABLE docs USING fts5(id UNINDEXED, title, text, "
        "tokenize='porter unicode61 remove_diacritics 2')"
    )
    con.executemany("INSERT INTO docs VALUES (?, ?, ?)", [tuple(p.values()) for p in paragraphs])
    con.commit()
    word = re.compile(r"[^\W_]+")

    def search(q: str, k: int) -> list[str]:
        match = " OR ".join(f'"{w}"' for w in word.findall(q.lower()))
        sql = "SELECT id FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?"
        return [r[0] for r in con.execute(sql, (match, k))] if match else []

    return search


ENGINES: dict[str, Callable[[list[dict[str, str]], Path], _Search]] = {
    "ours (tantivy, title x2.5, stemmed)": ours,
    "ours, tantivy alone (no impact postings)": ours_tantivy,
    "ours, hybrid (BM25 + WordLlama, rank fusion)": ours_hybrid,
    "bm25s (plain BM25)": bm25s_plain,
    "SQLite FTS5 bm25()": fts5,
}


def evaluate(search: _Search, questions: list[tuple[str, set[str]]]) -> dict[str, Any]:
    """Mean recall@k and share of questions with all gold in the top k, per k."""
    depth = max(KS)
    row: dict[str, Any] = {}
    start = time.perf_counter()
    ranked = [search(q, depth) for q, _ in questions]
    row["ms_per_query"] = round((time.perf_counter() - start) * 1000 / len(questions), 2)
    for k in KS:
        found = [
            len(gold & set(r[:k])) / len(gold)
            for r, (_, gold) in zip(ranked, questions, strict=True)
        ]
        row[f"recall@{k}"] = round(sum(found) / len(found), 4)
        row[f"both@{k}"] = round(sum(f == 1.0 for f in found) / len(found), 4)
    return row


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    paragraphs, questions = load()
    print(f"{len(paragraphs):,} paragraphs, {len(questions)} questions, gold 2 per question\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as tmp:
        for name, make in ENGINES.items():
            work = Path(tmp) / str(len(rows))
            work.mkdir()
            rows.append({"engine": name, **evaluate(make(paragraphs, work), questions)})
    cols = [f"{m}@{k}" for k in KS for m in ("recall", "both")]
    print("| engine | " + " | ".join(cols) + " | ms/query |")
    print("|---" * (len(cols) + 2) + "|")
    for r in rows:
        print(
            f"| {r['engine']} | "
            + " | ".join(f"{r[c]:.3f}" for c in cols)
            + f" | {r['ms_per_query']} |"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "retrieval.json").write_text(
        json.dumps({"paragraphs": len(paragraphs), "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
