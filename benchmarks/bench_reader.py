"""The readers on their own: which span of what was read answers the question.

For every span question of the natural sets (``recipes/embedded/natural/{dev,test}.jsonl``,
hand-written the way people ask over reserved built-in articles; the yes/no and comparison
questions are left out, their answers are choices the question names), each reader ranks the
spans of what the agent would read, in two settings:

- ``gold``: the text of the gold article that states the answer (what a visit returns);
- ``search``: the results of the agent's first search (the question's own content words,
  ``question_query``; the product's default retrieval, hybrid when the ``dense`` extra is
  installed), one text per result (title and snippet).

A reader is right at k when a span among its top k equals an accepted answer after
normalisation (SQuAD's: lower case, punctuation and articles dropped). Readers: ``linear``
(``rank_spans``, the hand-made features with fitted weights) and ``neural``
(``drvenus.small.neural``, MiniLM with a trained span head), ``fused`` (the two rankings'
reciprocal-rank fusion) and ``reranked`` (the neural reader's five best spans ordered by the
reranker, Gemma 3 270M: ``drvenus.small.rerank``). Reported with Wilson 95%
intervals, per set and level, with the seconds a question each reader took.

``--sets hotpotqa``: the first 100 HotpotQA dev questions of the shared set (distractor
setting), read from their two gold paragraphs and from all ten; top-1 F1 as well.

Usage: python benchmarks/bench_reader.py [--sets dev,test,hotpotqa]
       [--readers linear,neural,reranked] [--weights FILE.npz] [--limit N]
       [--second-hop 1e9,5,8] [--hops 1e9,-16,-1e9] [--decompose] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from drvenus.config import load_settings
from drvenus.eval.metrics import wilson_interval
from drvenus.grading.match import f1_score, normalize_answer
from drvenus.protocol.render import parse_search_body
from drvenus.protocol.tools import ToolCall
from drvenus.recipe.articles import load_articles
from drvenus.small.spans import question_query
from drvenus.stack import build_toolbox

ROOT = Path(__file__).resolve().parents[1]
NATURAL = ROOT / "recipes/embedded/natural"


def load_set(name: str, limit: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (NATURAL / f"{name}.jsonl").open()]
    rows = [r for r in rows if r["kind"] in ("single-hop", "two-hop")]
    return rows[:limit] if limit else rows


HOTPOT = ROOT.parent / "shared/data/qa/hotpotqa-dev-500-with-paragraphs.jsonl"


def hotpot_rows(limit: int) -> tuple[list[dict[str, Any]], dict[str, list[list[str]]]]:
    """The first HotpotQA dev questions (distractor setting): the gold paragraphs, and all ten."""
    rows, gold, every = [], [], []
    with HOTPOT.open() as fh:
        for line in fh:
            r = json.loads(line)
            answers = [s for a in r["answers_objects"] for s in a["spans"]]
            rows.append({"question": r["question_text"], "answer": answers, "level": "hotpotqa"})
            gold.append([f"{c['title']}\n{c['paragraph_text']}" for c in r["contexts"]
                         if c["is_supporting"]])
            every.append([f"{c['title']}\n{c['paragraph_text']}" for c in r["contexts"]])
            if len(rows) == (limit or 100):
                break
    return rows, {"gold": gold, "all10": every}


def gold_text(row: dict[str, Any], by_title: dict[str, str]) -> str:
    """The gold article that states an answer (the last hop's for a two-hop question)."""
    texts = [by_title[t] for t in row["gold_titles"] if t in by_title]
    for text in reversed(texts):
        if any(normalize_answer(a) in normalize_answer(text) for a in row["answer"]):
            return text
    return texts[-1] if texts else ""


async def search_texts(queries: list[str]) -> list[list[str]]:
    """Per query, the search's results as texts (title and snippet each)."""
    toolbox = build_toolbox(load_settings())
    out = []
    try:
        for query in queries:
            body = await toolbox.call(ToolCall("search", {"query": [query]}))
            data = parse_search_body(body) or []
            out.append([f"{h['title']}\n{h['snippet']}" for e in data
                        for h in e["web_page_info_list"]])
    finally:
        await toolbox.aclose()
    return out


def second_hop(rows: list[dict[str, Any]], first: list[list[str]], weights: Path | None,
               thresholds: Sequence[float]) -> None:
    """The neural reader with a second search for the span it ranks best in the first
    results (the bridge: "the painter" -> "Albrecht Dürer"), always or only when its best
    score is below a threshold; the answer is read from both searches' results."""
    from drvenus.small.neural import NeuralReader

    reader = NeuralReader(weights=weights)
    tops = [reader.rank(r["question"], t, k=1) for r, t in zip(rows, first, strict=True)]
    second = asyncio.run(search_texts([t[0].text if t else r["question"]
                                       for r, t in zip(rows, tops, strict=True)]))
    both = [reader.rank(r["question"], a + b, k=1) for r, a, b in zip(rows, first, second,
                                                                       strict=True)]
    for tau in thresholds:
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for r, one, two in zip(rows, tops, both, strict=True):
            again = not one or one[0].score < tau
            spans = [s.text for s in (two if again else one)]
            for level in (r["level"], "all"):
                c = counts[level]
                c[0] += hit(spans, r["answer"], 1)
                c[1] += again
                c[2] += 1
        for level, (h1, n2, n) in sorted(counts.items()):
            print(f"second search below {tau:g}: {level:10s} top-1 {interval(h1, n):24s} "
                  f"searched twice {n2}/{n}", flush=True)


def hops(rows: list[dict[str, Any]], first: list[list[str]],
         thresholds: Sequence[float]) -> None:
    """The shipped second hop (``bridge_search``, :func:`drvenus.small.grammar.second_search`)
    with the reader and the reranker: the bridge query made from the first results, searched,
    the answer the reranker's best of both searches' best spans
    (``RerankedReader.after_hops``); for each threshold, a second search only when the
    reranker's score of the first search's best span is below it (1e9: always, -1e9: never,
    the first search's best span then)."""
    from drvenus.protocol.state import TurnState
    from drvenus.small.grammar import levers_reader, second_search
    from drvenus.small.levers import EMBEDDED_LEVERS

    levers = EMBEDDED_LEVERS.but(bridge_search="always")
    reader = levers_reader(levers)
    words = levers.max_span_words
    firsts = [reader.ranked(r["question"], t, 5, words) for r, t in zip(rows, first, strict=True)]
    queries = [second_search(TurnState(question=r["question"], texts=tuple(("read", x) for x in t),
                                       queries=("first",)), levers) or r["question"]
               for r, t in zip(rows, first, strict=True)]
    second = asyncio.run(search_texts(queries))
    after = [reader.after_hops(r["question"], a, b, words)
             for r, a, b in zip(rows, first, second, strict=True)]
    for tau in thresholds:
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for r, one, two in zip(rows, firsts, after, strict=True):
            sure = one[0][1] if one and one[0][1] is not None else -1e9
            again = sure < tau
            best = (two[0][0] if two else "") if again else (one[0][0].text if one else "")
            for level in (r["level"], "all"):
                c = counts[level]
                c[0] += hit([best], r["answer"], 1)
                c[1] += again
                c[2] += 1
        for level, (h1, n2, n) in sorted(counts.items()):
            print(f"second hop below {tau:g}: {level:10s} top-1 {interval(h1, n):24s} "
                  f"searched twice {n2}/{n}", flush=True)


def innermost_description(question: str) -> str | None:
    """The question's last described subject ("the German Renaissance painter famous for his
    woodcut prints"): from its last "the"/"a"/"an" to the end, four words or more."""
    body = question.rstrip(" ?")
    for m in reversed(list(re.finditer(r"\b(?:the|a|an)\s", body))):
        if m.start() > 0 and len(body[m.start():].split()) >= 4:
            return body[m.start():]
    return None


def decomposed(rows: list[dict[str, Any]], first: list[list[str]], weights: Path | None,
               hops: int = 2) -> None:
    """Reading a nested question one description at a time: the innermost description is
    searched for and read as "What is <description>?", its best name replaces it in the
    question, and the rewritten question is searched again (up to ``hops`` times); the answer
    is read from the last and the first results, the bridges themselves left out."""
    from drvenus.small.neural import NeuralReader

    reader = NeuralReader(weights=weights)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r, texts0 in zip(rows, first, strict=True):
        current, texts, bridges = r["question"], texts0, set()
        for _ in range(hops):
            phrase = innermost_description(current)
            if phrase is None:
                break
            found = asyncio.run(search_texts([question_query(phrase)]))[0]
            names = [s.text for s in reader.rank(f"What is {phrase}?", found, k=5)
                     if s.text[:1].isupper()]
            if not names:
                break
            bridges.add(normalize_answer(names[0]))
            current = current.replace(phrase, names[0])
            texts = asyncio.run(search_texts([question_query(current)]))[0]
        spans = [s.text for s in reader.rank(current, texts + texts0, k=8)
                 if normalize_answer(s.text) not in bridges]
        for level in (r["level"], "all"):
            counts[level][0] += hit(spans, r["answer"], 1)
            counts[level][1] += 1
    for level, (h1, n) in sorted(counts.items()):
        print(f"decomposed: {level:10s} top-1 {interval(h1, n):24s}", flush=True)


def linear_reader() -> Callable[[str, Sequence[str]], list[str]]:
    from drvenus.small.reader import rank_spans

    def read(question: str, texts: Sequence[str]) -> list[str]:
        return [" ".join(s.words) for s in rank_spans(["\n".join(texts)], question, 3)]

    return read


def neural_reader(weights: Path | None) -> Callable[[str, Sequence[str]], list[str]]:
    from drvenus.small.neural import NeuralReader

    reader = NeuralReader(weights=weights)

    def read(question: str, texts: Sequence[str]) -> list[str]:
        return [s.text for s in reader.rank(question, texts, k=3)]

    return read


def reranked_reader(weights: Path | None) -> Callable[[str, Sequence[str]], list[str]]:
    """The neural reader's five best spans in the order the reranker (Gemma 3 270M) gives."""
    from drvenus.small.neural import NeuralReader
    from drvenus.small.rerank import RerankedReader, SpanReranker

    reader = RerankedReader(NeuralReader(weights=weights), SpanReranker())

    def read(question: str, texts: Sequence[str]) -> list[str]:
        return [s.text for s in reader.rank(question, texts, k=3)]

    return read


def fused_reader(weights: Path | None) -> Callable[[str, Sequence[str]], list[str]]:
    """Reciprocal-rank fusion of the two readers' top 20 (a span both rank high wins)."""
    from drvenus.small.neural import NeuralReader
    from drvenus.small.reader import rank_spans

    reader = NeuralReader(weights=weights)

    def read(question: str, texts: Sequence[str]) -> list[str]:
        score: dict[str, float] = defaultdict(float)
        shown: dict[str, str] = {}
        lists = ([" ".join(s.words) for s in rank_spans(["\n".join(texts)], question, 20)],
                 [s.text for s in reader.rank(question, texts, k=20)])
        for ranked in lists:
            for i, span in enumerate(ranked):
                key = normalize_answer(span)
                score[key] += 1.0 / (10 + i)
                shown.setdefault(key, span)
        return [shown[k] for k in sorted(score, key=lambda k: -score[k])][:3]

    return read


def hit(spans: Sequence[str], answers: Sequence[str], k: int) -> bool:
    gold = {normalize_answer(a) for a in answers}
    return any(normalize_answer(s) in gold for s in spans[:k])


def f1(span: str, answers: Sequence[str]) -> float:
    return max((f1_score(span, a) for a in answers), default=0.0)


def interval(hits: int, n: int) -> str:
    ci = wilson_interval(hits, n)
    lo, hi = ci if ci else (0.0, 0.0)
    return f"{hits}/{n} {100 * hits / max(n, 1):.1f}% ({100 * lo:.0f}-{100 * hi:.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="dev,test")
    ap.add_argument("--readers", default="linear,neural")
    ap.add_argument("--weights", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--second-hop", default="",
                    help="thresholds (comma-separated) below which the neural reader's best "
                         "score makes a second search; 1e9: always")
    ap.add_argument("--hops", default="",
                    help="thresholds (comma-separated) below which the reranker's score of the "
                         "first search's best span makes the shipped second hop; 1e9: always")
    ap.add_argument("--decompose", action="store_true",
                    help="also read each question one nested description at a time")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/out/reader.json")
    args = ap.parse_args()
    by_title = {a.title: a.text for a in load_articles()}
    readers = {"linear": linear_reader,
               "neural": lambda: neural_reader(args.weights),
               "fused": lambda: fused_reader(args.weights),
               "reranked": lambda: reranked_reader(args.weights)}
    report: dict[str, Any] = {}
    for set_name in args.sets.split(","):
        if set_name == "hotpotqa":
            rows, settings = hotpot_rows(args.limit)
        else:
            rows = load_set(set_name, args.limit)
            queries = [question_query(r["question"]) for r in rows]
            settings = {"gold": [[gold_text(r, by_title)] for r in rows],
                        "search": asyncio.run(search_texts(queries))}
            if args.second_hop:
                second_hop(rows, settings["search"], args.weights,
                           [float(x) for x in args.second_hop.split(",")])
            if args.hops:
                hops(rows, settings["search"], [float(x) for x in args.hops.split(",")])
            if args.decompose:
                decomposed(rows, settings["search"], args.weights)
        for name in args.readers.split(","):
            read = readers[name]()
            for setting, texts in settings.items():
                counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0.0])
                t0 = time.perf_counter()
                for r, t in zip(rows, texts, strict=True):
                    spans = read(r["question"], t)
                    for level in (r["level"], "all"):
                        c = counts[level]
                        c[3] += f1(spans[0] if spans else "", r["answer"])
                        c[0] += hit(spans, r["answer"], 1)
                        c[1] += hit(spans, r["answer"], 3)
                        c[2] += 1
                secs = (time.perf_counter() - t0) / max(len(rows), 1)
                for level, (h1, h3, n, f) in sorted(counts.items()):
                    key = f"{set_name}/{setting}/{level}/{name}"
                    report[key] = {"top1": h1, "top3": h3, "n": n, "f1": f / max(n, 1),
                                   "s_per_question": secs}
                    print(f"{key:36s} top-1 {interval(h1, n):24s} top-3 {interval(h3, n):24s} "
                          f"F1 {f / max(n, 1):.2f} {secs:.2f} s/q", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
