"""The local search index at scale: ours (tantivy) versus SQLite FTS5 and bm25s, side by side.

The corpus is real text recombined: sentences of the 10,033 built-in Wikipedia summaries and of
the 4,858 HotpotQA-500 paragraphs, sampled (fixed seed) into N new 100-word passages with unique
ids, written as JSONL to a temporary folder (the wiki-18 shape: title + 100-word passage).
Queries: the 500 HotpotQA questions and 500 titles of their paragraphs, top-10, one at a time.

Each engine runs in its own process (spawn), so its peak RSS is its own: build time, index size
on disk, peak RSS, p50/p95 latency and queries/s. "ours" answers with full hits (title, url,
snippet), FTS5 with the stored id/title/text of the top 10, bm25s with document indices.

The baselines need the ``bench`` extra: ``pip install -e ".[bench]"`` (bm25s and numba).

Usage: python benchmarks/bench_index.py [--passages 1000000] [--queries 1000] [--engines ...]
Results go to stdout (a markdown table) and benchmarks/out/index.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import random
import re
import resource
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from drvenus.corpus import CorpusIndex, build_index, builtin_corpus, iter_documents

OUT = Path(__file__).resolve().parent / "out"
HOTPOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "qa"
HOTPOT_FILE = (HOTPOT / "hotpotqa-dev-500-with-paragraphs.jsonl").resolve()
PASSAGE_WORDS = 100
SEED = 18
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[^\W_]+")


# --- corpus and queries ------------------------------------------------------------------------


def hotpot_rows() -> list[dict[str, Any]]:
    """The HotpotQA-500 rows (question, contexts)."""
    if not HOTPOT_FILE.is_file():
        raise SystemExit(f"shared data not found: {HOTPOT_FILE}")
    return [orjson.loads(line) for line in HOTPOT_FILE.read_bytes().splitlines() if line.strip()]


def source_texts() -> list[tuple[str, list[str]]]:
    """(title, sentences) of every built-in summary and every unique HotpotQA paragraph."""
    sources: dict[tuple[str, str], None] = {}
    for doc in iter_documents(builtin_corpus()):
        sources[(doc.title, doc.text)] = None
    for row in hotpot_rows():
        for ctx in row["contexts"]:
            sources[(ctx["title"], ctx["paragraph_text"])] = None
    out = []
    for title, text in sources:
        sentences = [s for s in _SENTENCE.split(" ".join(text.split())) if s]
        if sentences:
            out.append((title, sentences))
    return out


def passages(n: int, seed: int = SEED) -> Iterator[dict[str, str]]:
    """``n`` 100-word passages: consecutive sentences of a random source, topped up from others."""
    rng = random.Random(seed)
    sources = source_texts()
    for i in range(n):
        title, sentences = sources[rng.randrange(len(sources))]
        words: list[str] = []
        start = rng.randrange(len(sentences))
        current = sentences
        while len(words) < PASSAGE_WORDS:
            for sentence in current[start:]:
                words.extend(sentence.split())
                if len(words) >= PASSAGE_WORDS:
                    break
            current = sources[rng.randrange(len(sources))][1]
            start = rng.randrange(len(current))
        yield {"id": f"p{i:08d}", "title": title, "text": " ".join(words[:PASSAGE_WORDS])}


def write_corpus(path: Path, n: int) -> float:
    """Write the JSONL corpus; return seconds taken."""
    start = time.perf_counter()
    with open(path, "wb") as fh:
        for row in passages(n):
            fh.write(orjson.dumps(row) + b"\n")
    return time.perf_counter() - start


def bench_queries(n: int) -> list[str]:
    """HotpotQA questions and titles of their paragraphs, alternating (so any prefix is a fair
    sample), ``n`` in all; deterministic."""
    rows = hotpot_rows()
    questions = [r["question_text"] for r in rows]
    titles = sorted({c["title"] for r in rows for c in r["contexts"]})
    random.Random(SEED).shuffle(titles)
    mixed = [q for pair in zip(questions, titles, strict=False) for q in pair]
    return mixed[:n]


def read_rows(path: Path) -> Iterator[dict[str, str]]:
    with open(path, "rb") as fh:
        for line in fh:
            yield orjson.loads(line)


# --- engines: each returns (build seconds, index folder, search function) -----------------------


def engine_ours(corpus: Path, work: Path) -> tuple[float, Path, Callable[[str], list[Any]]]:
    start = time.perf_counter()
    info = build_index(corpus, cache_dir=work)
    seconds = time.perf_counter() - start
    index = CorpusIndex(info.path)
    return seconds, info.path, lambda q: index.search(q, 10)


def fts5_query(text: str) -> str:
    """Free text as an FTS5 OR query of quoted terms (no operators)."""
    return " OR ".join(f'"{w}"' for w in _WORD.findall(text.lower())[:48])


def engine_fts5(corpus: Path, work: Path) -> tuple[float, Path, Callable[[str], list[Any]]]:
    folder = work / "fts5"
    folder.mkdir()
    db = folder / "index.db"
    start = time.perf_counter()
    con = sqlite3.connect(db, check_same_thread=False)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute(
        "CREATE VIRTUAL TABLE docs USING fts5(id UNINDEXED, title, text, "
        "tokenize='porter unicode61 remove_diacritics 2')"
    )
    rows = ((r["id"], r["title"], r["text"]) for r in read_rows(corpus))
    con.executemany("INSERT INTO docs(id, title, text) VALUES (?, ?, ?)", rows)
    con.execute("INSERT INTO docs(docs) VALUES ('optimize')")
    con.commit()
    seconds = time.perf_counter() - start
    sql = (
        "SELECT id, title, text FROM docs WHERE docs MATCH ? "
        "ORDER BY bm25(docs, 0.0, 2.5, 1.0) LIMIT 10"
    )

    def search(q: str) -> list[Any]:
        match = fts5_query(q)
        return con.execute(sql, (match,)).fetchall() if match else []

    return seconds, folder, search


def engine_bm25s(corpus: Path, work: Path, backend: str = "numpy"
                 ) -> tuple[float, Path, Callable[[str], list[Any]]]:
    import bm25s

    folder = work / f"bm25s-{backend}"
    start = time.perf_counter()
    texts = [f"{r['title']} {r['text']}" for r in read_rows(corpus)]
    tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
    del texts
    retriever = bm25s.BM25(backend=backend)  # "numba": bm25s's fast path (pip: numba)
    retriever.index(tokens, show_progress=False)
    retriever.save(str(folder))
    seconds = time.perf_counter() - start
    del tokens

    def search(q: str) -> list[Any]:
        qt = bm25s.tokenize([q], stopwords="en", show_progress=False)
        if not qt.vocab:
            return []
        docs, _scores = retriever.retrieve(qt, k=10, show_progress=False, n_threads=1)
        return list(docs[0])

    return seconds, folder, search


def engine_bm25s_numba(corpus: Path, work: Path) -> tuple[float, Path, Callable[[str], list[Any]]]:
    return engine_bm25s(corpus, work, backend="numba")


ENGINES = {"ours": engine_ours, "fts5": engine_fts5, "bm25s": engine_bm25s,
           "bm25s-numba": engine_bm25s_numba}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_engine(name: str, corpus: str, queries: list[str], budget: float, result: Any) -> None:
    """Child process: build, measure size, warm up, time each query until ``budget`` seconds
    are spent; send a dict back."""
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=Path(corpus).parent))
    build_seconds, folder, search = ENGINES[name](Path(corpus), work)
    build_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = _dir_size(folder)
    for q in queries[-20:]:
        search(q)
    latencies = []
    empty = 0
    wall = time.perf_counter()
    for q in queries:
        t0 = time.perf_counter()
        hits = search(q)
        latencies.append((time.perf_counter() - t0) * 1000)
        empty += not hits
        if time.perf_counter() - wall > budget:
            break
    wall = time.perf_counter() - wall
    latencies.sort()
    result.send(
        {
            "engine": name,
            "build_s": round(build_seconds, 2),
            "size_mb": round(size / 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "build_peak_rss_mb": round(build_rss),
            "p50_ms": round(statistics.median(latencies), 3),
            "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 3),
            "qps": round(len(latencies) / wall, 1),
            "timed": len(latencies),
            "empty": empty,
        }
    )
    shutil.rmtree(work, ignore_errors=True)


def measure(name: str, corpus: Path, queries: list[str], budget: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=run_engine, args=(name, str(corpus), queries, budget, child))
    proc.start()
    child.close()
    try:
        row = parent.recv()
    except EOFError:
        row = {"engine": name, "error": f"exit code {proc.join() or proc.exitcode}"}
    proc.join()
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table; ratios are the baseline's figure divided by ours (>1: ours is better)."""
    ours = next((r for r in rows if r["engine"] == "ours" and "error" not in r), None)
    cols = ["build_s", "size_mb", "peak_rss_mb", "p50_ms", "p95_ms", "qps"]
    lines = [
        "| engine | build s | index MB | peak RSS MB | p50 ms | p95 ms | queries/s "
        "| timed | empty |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['error']} ||||||||")
            continue
        cells = []
        for c in cols:
            cell = f"{r[c]:g}"
            if ours and r is not ours and ours[c]:
                ratio = ours[c] / r[c] if c == "qps" else r[c] / ours[c]
                cell += f" ({ratio:.1f}x)"
            cells.append(cell)
        tail = f" | {r['timed']} | {r['empty']} |"
        lines.append(f"| {r['engine']} | " + " | ".join(cells) + tail)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--keep", type=Path, help="write the corpus here and keep it")
    parser.add_argument("--budget", type=float, default=150, help="seconds of queries per engine")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-index-"))
    corpus = args.keep or tmp / f"passages-{args.passages}.jsonl"
    try:
        if not corpus.is_file():
            made = write_corpus(corpus, args.passages)
            print(
                f"corpus: {args.passages:,} passages, {corpus.stat().st_size / 1e6:.0f} MB, "
                f"written in {made:.0f}s -> {corpus}"
            )
        queries = bench_queries(args.queries)
        print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}")
        rows = [measure(name, corpus, queries, args.budget) for name in args.engines]
        print(f"load average after: {os.getloadavg()}")
        print(
            f"\n{args.passages:,} passages, up to {len(queries)} queries ({args.budget:g}s budget "
            "per engine), top-10, one at a time (ratios: baseline / ours, >1 = ours better)\n"
        )
        print(table(rows))
        OUT.mkdir(exist_ok=True)
        record = {
            "passages": args.passages,
            "queries": len(queries),
            "rows": rows,
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "loadavg_after": os.getloadavg(),
        }
        (OUT / "index.json").write_text(json.dumps(record, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
