"""Recall of the gold article on the built-in corpus: our BM25, a small embedding model, hybrid.

Issue #29 asks whether hybrid retrieval (BM25 plus a small embedding model that ships inside a
package on the index) helps questions that describe their subject instead of naming it. The
embedding model is WordLlama's default (``pip install wordllama``: a 256-dimension token
embedding table, 16 MB, in the wheel itself; mean-pooled, cosine). This script measures, on the
embedded corpus (10,033 lead summaries) and a question set of ``recipes/embedded/natural``:

- ``bm25``: the product's search (``CorpusIndex.search_ids``, title boosted);
- ``dense``: the product's article vectors alone (WordLlama over "title. text", cosine);
- ``hybrid``: the product's ``--retrieval hybrid`` (``drvenus.corpus.dense``: reciprocal-rank
  fusion of the two top-100 rankings, ``1 / (60 + rank)`` each).

The query is what the agent's first search sends (``question_query``: the question's content
words). Recall@k: a gold article (``gold_titles``; two-hop questions have two) in the top k;
the agent sees the top 5. Rates with 95% Wilson intervals, by question kind.

Usage: python benchmarks/bench_hybrid_recall.py [--set dev|test] [--limit N]
Results: stdout (a markdown table) and benchmarks/out/hybrid_recall.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import tantivy

from drvenus.corpus import CorpusIndex, iter_documents, open_index
from drvenus.corpus.documents import builtin_corpus
from drvenus.small.spans import question_query

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
NATURAL = ROOT / "recipes" / "embedded" / "natural"
KS = (1, 5, 10)


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (round(100 * (centre - half), 1), round(100 * (centre + half), 1))


def dense_titles(index: CorpusIndex, query: str, k: int) -> list[str]:
    """The titles of the dense ranking alone (the product's article vectors)."""
    assert index._dense is not None
    searcher = index._searcher
    return [searcher.doc(tantivy.DocAddress(*place)).get_first("title") or ""
            for place in index._dense.top(query, k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", choices=("dev", "test"), default="dev")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions only")
    args = ap.parse_args()

    rows = [json.loads(line) for line in (NATURAL / f"{args.set}.jsonl").read_text().splitlines()
            if line.strip()][: args.limit]
    index = open_index(None)
    start = time.perf_counter()
    hybrid = open_index(None, dense=True)  # builds the article vectors on first use
    vectors_seconds = time.perf_counter() - start
    by_id = {doc.id: doc.title for doc in iter_documents(builtin_corpus())}

    engines = ("bm25", "dense", "hybrid")
    found: dict[tuple[str, str, int], int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        query = question_query(row["question"])
        ranked = {
            "bm25": [by_id.get(i, "") for i, _ in index.search_ids(query, max(KS))],
            "dense": dense_titles(hybrid, query, max(KS)),
            "hybrid": [by_id.get(i, "") for i, _ in hybrid.search_ids(query, max(KS))],
        }
        gold = set(row["gold_titles"])
        for kind in (row["level"], "all"):
            counts[kind] += 1
            for engine in engines:
                for k in KS:
                    found[(engine, kind, k)] += bool(gold & set(ranked[engine][:k]))

    kinds = sorted(counts, key=lambda kd: (kd == "all", kd))
    print(f"natural {args.set}: {len(rows)} questions; {len(by_id)} articles; article vectors "
          f"{vectors_seconds:.1f} s (0 when saved by an earlier run)")
    print("\n| engine | kind | n | recall@1 | recall@5 [95% CI] | recall@10 |")
    print("|---|---|---|---|---|---|")
    table = []
    for kind in kinds:
        n = counts[kind]
        for engine in engines:
            r = {k: found[(engine, kind, k)] for k in KS}
            lo, hi = wilson(r[5], n)
            table.append({"engine": engine, "kind": kind, "n": n,
                          **{f"recall@{k}": round(100 * r[k] / n, 1) for k in KS},
                          "recall@5_ci95": [lo, hi]})
            print(f"| {engine} | {kind} | {n} | {100 * r[1] / n:.1f}% | {100 * r[5] / n:.1f}% "
                  f"[{lo}, {hi}] | {100 * r[10] / n:.1f}% |")
    OUT.mkdir(exist_ok=True)
    (OUT / "hybrid_recall.json").write_text(json.dumps({"set": args.set, "rows": table},
                                                       indent=1))


if __name__ == "__main__":
    main()
