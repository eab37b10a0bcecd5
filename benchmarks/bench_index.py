"""The local search index at scale: ours (tantivy) versus SQLite FTS5 and bm25s, side by side.

The corpus is real text recombined: sentences of the 10,033 built-in Wikipedia summaries and of
the 4,858 HotpotQA-500 paragraphs, sampled (fixed seed) into N new 100-word passages with unique
ids, written as JSONL to a temporary folder (the wiki-18 shape: title + 100-word passage).
Queries: the 500 HotpotQA questions and 500 titles of their paragraphs, top-10, one at a time.

Each engine runs in its own process (spawn), so its peak RSS is its own: build time, index size
on disk, peak RSS, p50/p95 latency and queries/s. An engine with several modes times them all on
each query, in turn (the first mode rotating), so that they share the machine's load:

- ``ours``: ``CorpusIndex.search_ids`` (top-10 ids and scores: the same work as bm25s) and
  ``CorpusIndex.search`` (full hits: title, url, the snippet the agent reads);
- ``bm25s``: bm25s as its README runs it (``bm25s.tokenize(query, stopwords="en")`` then
  ``retrieve``, one thread), on its default numpy backend and on ``backend="numba"``, one index;
  it returns document indices and scores;
- ``fts5``: SQLite FTS5, ``bm25()`` with the title weighted 2.5, returning id/title/text.

Engines run one after the other, and a shared machine's load changes in between; so, when both
ran, a last process (the race) loads ours and bm25s-numba from the indexes they built and times
``ours ids``, ``bm25s numba`` and ``ours hits`` on each query in turn, under the same load.

The baselines need the ``bench`` extra: ``pip install -e ".[bench]"`` (bm25s, numba for its fast
backend; numba also runs ours on its fast path).

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


# --- engines: each returns (build seconds, index folder, {mode: search function}) ---------------

Search = Callable[[str], list[Any]]


def engine_ours(corpus: Path, work: Path) -> tuple[float, Path, dict[str, Search]]:
    start = time.perf_counter()
    info = build_index(corpus, cache_dir=work)
    seconds = time.perf_counter() - start
    index = CorpusIndex(info.path)
    if not index.fast_path:
        logging.warning("ours: no impact postings or no numba: tantivy alone answers")
    return (
        seconds,
        info.path,
        {
            "ours ids": lambda q: index.search_ids(q, 10),
            "ours hits": lambda q: index.search(q, 10),
        },
    )


def fts5_query(text: str) -> str:
    """Free text as an FTS5 OR query of quoted terms (no operators)."""
    return " OR ".join(f'"{w}"' for w in _WORD.findall(text.lower())[:48])


def engine_fts5(corpus: Path, work: Path) -> tuple[float, Path, dict[str, Search]]:
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

    return seconds, folder, {"fts5": search}


def engine_bm25s(corpus: Path, work: Path) -> tuple[float, Path, dict[str, Search]]:
    """One bm25s index (title + text, English stopwords), retrieved with both backends."""
    import bm25s

    folder = work / "bm25s"
    start = time.perf_counter()
    texts = [f"{r['title']} {r['text']}" for r in read_rows(corpus)]
    tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
    del texts
    retriever = bm25s.BM25()  # as bm25s's README: the numpy backend
    retriever.index(tokens, show_progress=False)
    retriever.save(str(folder))
    seconds = time.perf_counter() - start
    del tokens
    fast = bm25s.BM25(backend="numba")  # bm25s's fast path, on the same index arrays
    for name in ("scores", "vocab_dict", "unique_token_ids_set", "nonoccurrence_array"):
        setattr(fast, name, getattr(retriever, name))

    def searcher(engine: Any) -> Search:
        def search(q: str) -> list[Any]:
            qt = bm25s.tokenize([q], stopwords="en", show_progress=False)
            if not qt.vocab:
                return []
            docs, scores = engine.retrieve(qt, k=10, show_progress=False, n_threads=1)
            return list(zip(docs[0].tolist(), scores[0].tolist(), strict=True))

        return search

    return seconds, folder, {"bm25s numpy": searcher(retriever), "bm25s numba": searcher(fast)}


ENGINES = {"ours": engine_ours, "fts5": engine_fts5, "bm25s": engine_bm25s}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def time_modes(
    modes: dict[str, Search], queries: list[str], budget: float
) -> dict[str, dict[str, Any]]:
    """Warm up, then time each query in every mode, in turn (the first mode rotating), until
    ``budget`` seconds are spent: p50/p95/queries/s per mode and the load average around."""
    for q in queries[-20:]:
        for search in modes.values():
            search(q)
    names = list(modes)
    latencies: dict[str, list[float]] = {m: [] for m in names}
    empty = dict.fromkeys(names, 0)
    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    for i, q in enumerate(queries):
        for mode in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            hits = modes[mode](q)
            latencies[mode].append((time.perf_counter() - t0) * 1000)
            empty[mode] += not hits
        if time.perf_counter() - wall > budget:
            break
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    out = {}
    for mode in names:
        times = sorted(latencies[mode])
        out[mode] = {
            "p50_ms": round(statistics.median(times), 3),
            "p95_ms": round(times[int(0.95 * (len(times) - 1))], 3),
            "qps": round(len(times) / (sum(times) / 1000), 1),
            "timed": len(times),
            "empty": empty[mode],
            "load": load,
        }
    return out


def run_engine(name: str, corpus: str, queries: list[str], budget: float, result: Any) -> None:
    """Child process: build, measure size and memory, time the engine's modes; send one dict
    per mode back (the index stays on disk for the race, see :func:`run_race`)."""
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=Path(corpus).parent))
    build_seconds, folder, modes = ENGINES[name](Path(corpus), work)
    build_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = _dir_size(folder)
    timed = time_modes(modes, queries, budget)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.send(
        [
            {
                "engine": mode,
                "build_s": round(build_seconds, 2),
                "size_mb": round(size / 1e6, 1),
                "peak_rss_mb": round(rss),
                "build_peak_rss_mb": round(build_rss),
                **figures,
                "folder": str(folder),
                "work": str(work),
            }
            for mode, figures in timed.items()
        ]
    )


def run_race(ours: str, bm25s_folder: str, queries: list[str], budget: float, result: Any) -> None:
    """Child process: ours and bm25s-numba loaded side by side from the indexes the engines
    built, timed on each query in turn: the same load for both, whatever the machine does."""
    import bm25s

    logging.basicConfig(level=logging.WARNING)
    index = CorpusIndex(ours)
    fast = bm25s.BM25.load(bm25s_folder, backend="numba", show_progress=False)

    def numba_search(q: str) -> list[Any]:
        qt = bm25s.tokenize([q], stopwords="en", show_progress=False)
        if not qt.vocab:
            return []
        docs, scores = fast.retrieve(qt, k=10, show_progress=False, n_threads=1)
        return list(zip(docs[0].tolist(), scores[0].tolist(), strict=True))

    modes: dict[str, Search] = {
        "race: ours ids": lambda q: index.search_ids(q, 10),
        "race: bm25s numba": numba_search,
        "race: ours hits": lambda q: index.search(q, 10),
    }
    result.send([{"engine": m, **f} for m, f in time_modes(modes, queries, budget).items()])


def _child(target: Any, args: tuple[Any, ...], name: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, child))
    proc.start()
    child.close()
    try:
        rows = parent.recv()
    except EOFError:
        rows = [{"engine": name, "error": f"exit code {proc.join() or proc.exitcode}"}]
    proc.join()
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def measure(name: str, corpus: Path, queries: list[str], budget: float) -> list[dict[str, Any]]:
    return _child(run_engine, (name, str(corpus), queries, budget), name)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table; ratios are the baseline's figure divided by ours (>1: ours is better),
    against ``ours ids`` for bm25s (document numbers and scores: the same work) and against
    ``ours hits`` for FTS5 (stored text)."""
    ours = {r["engine"]: r for r in rows if "ours" in r["engine"] and "error" not in r}
    cols = ["build_s", "size_mb", "peak_rss_mb", "p50_ms", "p95_ms", "qps"]
    lines = [
        "| engine | build s | index MB | peak RSS MB | p50 ms | p95 ms | queries/s "
        "| timed | empty | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['error']} |||||||||")
            continue
        ref = None
        if r["engine"] == "race: bm25s numba":
            ref = ours.get("race: ours ids")
        elif not r["engine"].startswith(("ours", "race")):
            ref = ours.get("ours ids" if r["engine"].startswith("bm25s") else "ours hits")
        cells = []
        for c in cols:
            if c not in r:  # a race row: the engines' own rows give build and size
                cells.append("")
                continue
            cell = f"{r[c]:g}"
            if ref and ref[c]:
                ratio = ref[c] / r[c] if c == "qps" else r[c] / ref[c]
                cell += f" ({ratio:.1f}x)"
            cells.append(cell)
        load = "-".join(f"{x:g}" for x in r.get("load", []))
        tail = f" | {r['timed']} | {r['empty']} | {load} |"
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
        rows = [row for name in args.engines for row in measure(name, corpus, queries, args.budget)]
        built = {r["engine"]: r["folder"] for r in rows if "folder" in r}
        if "ours ids" in built and "bm25s numba" in built:
            race = (built["ours ids"], built["bm25s numba"], queries, args.budget)
            rows += _child(run_race, race, "race")
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
        for work in {r.get("work") for r in locals().get("rows", [])} - {None}:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
