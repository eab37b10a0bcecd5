"""The local search index at scale: ours (tantivy) versus SQLite FTS5 and bm25s, side by side.

The corpus is real text recombined: sentences of the 10,033 built-in Wikipedia summaries and of
the 4,858 HotpotQA-500 paragraphs, sampled (fixed seed) into N new 100-word passages with unique
ids, written as JSONL to a temporary folder (the wiki-18 shape: title + 100-word passage).
Queries: the 500 HotpotQA questions and 500 titles of their paragraphs, top-10, one at a time.

Each engine runs in its own process (spawn), so its peak RSS is its own: build time, index size
on disk, peak RSS, p50/p95 latency and queries/s. An engine with several modes times them all on
each query, in turn (the first mode rotating), so that they share the machine's load; besides
wall-clock latencies, the CPU time of each call (the thread's: what other jobs on a shared
machine take does not count, their cache pressure still does):

- ``ours``: ``CorpusIndex.search_ids`` (top-10 ids and scores: the same work as bm25s) and
  ``CorpusIndex.search`` (full hits: title, url, the snippet the agent reads);
- ``bm25s``: bm25s as its README runs it (``bm25s.tokenize(query, stopwords="en")`` then
  ``retrieve``, one thread), on its default numpy backend and on ``backend="numba"``, one index;
  it returns document indices and scores;
- ``fts5``: SQLite FTS5, ``bm25()`` with the title weighted 2.5, returning id/title/text.

Those engines rank differently (our title boost and English stemming against bm25s's stop
words, k1 1.5 and exact lengths): they agree on about half of their top-10 ids. The race
therefore runs both on the same ranking, in one process, each query timed on both in turn
under the same load (``--race-only`` skips the engines above):

- the same documents: each passage's title and text as one field (ours's title field holds
  just the filler word below),
  padded with a filler word up to a length tantivy stores exactly (it keeps a document's
  length in one byte: exact up to 40 tokens, then in steps of 2, 4, 8, ...; bm25s keeps the
  exact length), so both see the same lengths and the same average;
- the same tokens: bm25s is given our analyser's tokens (``drvenus.corpus.analyze``: words,
  lowercased, accents folded, English stems), no stop words on either side;
- the same BM25: k1 1.2 and b 0.75 (tantivy's), Lucene's idf, on both;
- the same queries: the words of each query, one per distinct token (no phrases).

It reports the top-10 agreement (ids in common, also counting documents tied at the tenth
score, whose order each engine breaks its own way; and queries whose ten scores are equal: ours
are bm25s's times 1 + k1) before the latencies of ``ours ids`` and ``bm25s numba``.

The baselines need the ``bench`` extra: ``pip install -e ".[bench]"`` (bm25s, numba for its fast
backend; numba also runs ours on its fast path).

Usage: python benchmarks/bench_index.py [--passages 1000000] [--queries 1000] [--engines ...]
[--race-only] [--race-dir DIR]
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

from drvenus.corpus import CorpusIndex, analyze, build_index, builtin_corpus, iter_documents
from drvenus.corpus.index import BM25_K1

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
    cpu: dict[str, list[float]] = {m: [] for m in names}
    empty = dict.fromkeys(names, 0)
    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    for i, q in enumerate(queries):
        for mode in names[i % len(names) :] + names[: i % len(names)]:
            c0, t0 = time.thread_time(), time.perf_counter()
            hits = modes[mode](q)
            latencies[mode].append((time.perf_counter() - t0) * 1000)
            cpu[mode].append((time.thread_time() - c0) * 1000)
            empty[mode] += not hits
        if time.perf_counter() - wall > budget:
            break
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    out = {}
    for mode in names:
        times = sorted(latencies[mode])
        cpu_times = sorted(cpu[mode])
        out[mode] = {
            "p50_ms": round(statistics.median(times), 3),
            "p95_ms": round(times[int(0.95 * (len(times) - 1))], 3),
            "cpu_p50_ms": round(statistics.median(cpu_times), 3),
            "cpu_p95_ms": round(cpu_times[int(0.95 * (len(cpu_times) - 1))], 3),
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


def _fieldnorms() -> list[int]:
    """The document lengths tantivy stores exactly (its one-byte length code): 0 to 40, then
    eight steps of 2, eight of 4, eight of 8, ..."""
    table, step = list(range(41)), 2
    while len(table) < 256:
        for _ in range(8):
            table.append(table[-1] + step)
        step *= 2
    return table[:256]


FILLER = "qqfiller"  # pads documents to an exactly stored length; never in a query


def same_ranking_corpus(corpus: Path, out: Path) -> tuple[list[list[int]], dict[str, int],
                                                         list[str]]:
    """Write the race's corpus (title + text in one field, padded with :data:`FILLER` to a
    length tantivy stores exactly) to ``out``; return each document's token ids, the
    vocabulary and the document ids."""
    lengths = _fieldnorms()
    vocab: dict[str, int] = {}
    token_ids: list[list[int]] = []
    ids: list[str] = []
    with open(out, "wb") as fh:
        for row in read_rows(corpus):
            text = f"{row['title']} {row['text']}"
            doc = analyze(text)
            pad = next(n for n in lengths if n >= len(doc)) - len(doc)
            if pad:
                text += f" {FILLER}" * pad
                doc += [FILLER] * pad
            # ours makes a title of an empty one: the filler stands in (never queried)
            fh.write(orjson.dumps({"id": row["id"], "title": FILLER, "text": text}) + b"\n")
            token_ids.append([vocab.setdefault(t, len(vocab)) for t in doc])
            ids.append(row["id"])
    return token_ids, vocab, ids


def same_ranking_query(text: str) -> tuple[str, list[str]]:
    """The race's query: the words of ``text``, one per distinct token (at most 48, the cap of
    ours), and those tokens."""
    words: dict[str, str] = {}
    for word in _WORD.findall(text.lower()):
        found = analyze(word)
        if len(found) == 1 and found[0] != FILLER and found[0] not in words:
            words[found[0]] = word
        if len(words) == 48:
            break
    return " ".join(words.values()), list(words)


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-4 * max(1.0, abs(x))


def agreement(ours: list[list[tuple[str, float]]], theirs: list[list[tuple[str, float]]],
              scale: float) -> dict[str, float]:
    """Top-k agreement over the queries: the share of ids in common (over the longer list);
    the same with documents tied at the last score counted as agreeing (tantivy breaks ties
    by document address, bm25s otherwise); the share of queries whose scores are equal (ours =
    theirs x ``scale``, float32 rounding aside)."""
    common = tied = total = same = 0
    for a, b in zip(ours, theirs, strict=True):
        b = [(i, s * scale) for i, s in b]
        shared = {i for i, _ in a} & {i for i, _ in b}
        common += len(shared)
        total += max(len(a), len(b))
        if a and b and _close(a[-1][1], b[-1][1]):
            tied += min(sum(i not in shared and _close(s, a[-1][1]) for i, s in a),
                        sum(i not in shared and _close(s, b[-1][1]) for i, s in b))
        same += len(a) == len(b) and all(_close(x, y) for (_, x), (_, y) in zip(a, b,
                                                                               strict=True))
    return {"top10_ids_in_common": round(common / max(total, 1), 4),
            "top10_ids_in_common_or_tied": round((common + tied) / max(total, 1), 4),
            "queries_same_scores": round(same / max(len(ours), 1), 4)}


def run_race(corpus: str, queries: list[str], budget: float, keep: str | None,
             result: Any) -> None:
    """Child process: the race on the same ranking (see the module doc). ``keep``: a folder
    where both indexes are kept, and found again by the next run."""
    import bm25s
    from bm25s.tokenization import Tokenized

    logging.basicConfig(level=logging.WARNING)
    work = Path(keep or tempfile.mkdtemp(prefix="bench-race-", dir=Path(corpus).parent))
    work.mkdir(parents=True, exist_ok=True)
    same, saved = work / "same.jsonl", work / "bm25s"
    try:
        start = time.perf_counter()
        if saved.is_dir() and same.is_file():
            ids = [row["id"] for row in read_rows(same)]
            fast = bm25s.BM25.load(str(saved), backend="numba")
            prepared = bm25s_build = 0.0
        else:
            token_ids, vocab, ids = same_ranking_corpus(Path(corpus), same)
            prepared = time.perf_counter() - start
            start = time.perf_counter()
            fast = bm25s.BM25(k1=BM25_K1, b=0.75, method="lucene", backend="numba")
            fast.index(Tokenized(ids=token_ids, vocab=vocab), show_progress=False)
            bm25s_build = time.perf_counter() - start
            del token_ids
            if keep:
                fast.save(str(saved))
        start = time.perf_counter()
        index = CorpusIndex(build_index(same, cache_dir=work).path)
        ours_build = time.perf_counter() - start
        known = fast.vocab_dict

        def numba_search(q: str) -> list[tuple[str, float]]:
            found = [t for t in same_ranking_query(q)[1] if t in known]
            if not found:
                return []
            docs, scores = fast.retrieve([found], k=10, show_progress=False, n_threads=1)
            return [(ids[d], s) for d, s in zip(docs[0].tolist(), scores[0].tolist(),
                                                strict=True) if s > 0]

        modes: dict[str, Search] = {
            "race: ours ids": lambda q: index.search_ids(same_ranking_query(q)[0], 10),
            "race: bm25s numba": numba_search,
        }
        agree = agreement([modes["race: ours ids"](q) for q in queries],
                          [numba_search(q) for q in queries], 1 + BM25_K1)
        agree["queries"] = len(queries)
        builds = {"prepare_s": round(prepared, 1), "ours_build_s": round(ours_build, 1),
                  "bm25s_build_s": round(bm25s_build, 1), "fast_path": index.fast_path}
        timed = time_modes(modes, queries, budget)
        result.send([{"engine": "race: agreement", **agree, **builds}]
                    + [{"engine": m, **f} for m, f in timed.items()])
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


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
    cols = ["build_s", "size_mb", "peak_rss_mb", "p50_ms", "p95_ms", "qps", "cpu_p50_ms",
            "cpu_p95_ms"]
    lines = [
        "| engine | build s | index MB | peak RSS MB | p50 ms | p95 ms | queries/s "
        "| CPU p50 ms | CPU p95 ms | timed | empty | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["engine"] == "race: agreement":
            lines.append(f"| {r['engine']} | top-10 ids in common {r['top10_ids_in_common']:.2%}"
                         f" ({r['top10_ids_in_common_or_tied']:.2%} counting ties at the 10th"
                         f" score), same ten scores {r['queries_same_scores']:.2%} of "
                         f"{r['queries']} queries |||||||||||")
            continue
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['error']} |||||||||||")
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
            if ref and ref.get(c):
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
    parser.add_argument("--race-only", action="store_true",
                        help="only the race of ours and bm25s-numba on the same ranking")
    parser.add_argument("--race-dir", type=Path,
                        help="keep the race's indexes here (a later run reuses them)")
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
        engines = [] if args.race_only else args.engines
        rows = [row for name in engines for row in measure(name, corpus, queries, args.budget)]
        if args.race_only or {"ours", "bm25s"} <= set(args.engines):
            race = (str(corpus), queries, args.budget, args.race_dir and str(args.race_dir))
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
