"""Where Heavy mode could gain on the embedded agent, and whether a combiner can take it (#33).

``--heavy 4`` with the embedded agent gains nothing on the natural dev set (docs/BENCHMARKS.md,
"Heavy mode on the embedded agent"): its runs read the same first search, and the span reader
picks the same span, so they vote for one answer. This script asks the two questions behind
that, on the hand-written natural questions of ``recipes/embedded/natural``:

1. **Evidence** (no model, seconds). Would members that read *different* evidence be right on
   different questions? Each member sends another first search: the agent's own (the question's
   content words, ``question_query``) over hybrid and over BM25 ranking, the first and the second
   half of those words, and a 60-character query. Each member answers with the span reader's best
   span of what it read (the embedded preset's answer to a plain "what" question). Reported:
   each member's exact rate, pass@N (some member right: the most any combiner could reach), the
   reader over every member's evidence pooled, and a majority vote (ties go to the pooled
   reader's score).
2. **Runs** (``--runs FILE...``). Result files of real runs over the same questions (rows of
   ``bench_embedded_questions.py`` JSON, or an ``eval`` / ``run`` results.jsonl): each file's
   exact rate, pass@N, how often the runs agree and how often they are right then, who is right
   when they disagree, and the majority vote (ties to the earlier file). Two files from
   different policies (the adapter and ``--no-adapter``) show the headroom that model diversity
   opens, and whether agreement marks the right answer.

Usage: python benchmarks/bench_heavy_headroom.py [--set dev|test] [--sample N]
       [--runs A.json B.jsonl ...]
Results: stdout (markdown tables) and benchmarks/out/heavy_headroom.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_embedded_questions import _stable_order, load_natural_questions
from drvenus.config import Settings
from drvenus.grading.match import exact_match, normalize_answer
from drvenus.protocol.state import tool_response_text
from drvenus.small.reader import rank_spans
from drvenus.small.spans import question_query
from drvenus.stack import build_toolbox

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
SHORT_QUERY_CHARS = 60


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (round(100 * (centre - half), 1), round(100 * (centre + half), 1))


def member_queries(question: str) -> dict[str, str]:
    """The first search of each evidence member (see the module doc)."""
    full = question_query(question)
    words = full.split()
    half = max(1, (len(words) + 1) // 2)
    return {
        "own": full,
        "first-half": " ".join(words[:half]) or full,
        "second-half": " ".join(words[half:]) or full,
        "short": question_query(question, SHORT_QUERY_CHARS) or full,
    }


def _rate(hits: int, n: int) -> dict[str, Any]:
    return {"right": hits, "n": n, "pct": round(100 * hits / n, 1) if n else 0.0,
            "ci95": list(wilson(hits, n))}


def vote(answers: Sequence[str], tie_score: dict[str, float] | None = None) -> int | None:
    """The index of the answer most members gave; a tie goes to the highest ``tie_score``
    (normalised answer -> score), else to the earliest member."""
    counts = Counter(normalize_answer(a) for a in answers if a.strip())
    if not counts:
        return None
    best = max(counts.values())
    tied = [i for i, a in enumerate(answers) if a.strip() and counts[normalize_answer(a)] == best]
    if tie_score:
        return max(tied, key=lambda i: (tie_score.get(normalize_answer(answers[i]), -math.inf), -i))
    return tied[0]


async def _evidence(questions: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each question's search result text per member."""
    toolboxes = {r: build_toolbox(Settings(retrieval=r)) for r in ("hybrid", "bm25")}
    out = []
    for q in questions:
        texts = {}
        for name, query in member_queries(q["question"]).items():
            rankings = ("hybrid", "bm25") if name == "own" else ("hybrid",)
            for ranking in rankings:
                body = await toolboxes[ranking]["search"]({"query": [query]})
                texts[f"{name}/{ranking}"] = tool_response_text(body)
        out.append(texts)
    return out


def evidence_part(questions: list[dict[str, str]]) -> dict[str, Any]:
    start = time.perf_counter()
    evidence = asyncio.run(_evidence(questions))
    members = list(evidence[0]) if evidence else []
    right: Counter[str] = Counter()
    for q, texts in zip(questions, evidence, strict=True):
        gold = q["answer"]
        answers = []
        for m in members:
            top = rank_spans([texts[m]], q["question"], 1)
            answers.append(top[0].text if top else "")
            right[m] += bool(answers[-1]) and exact_match(answers[-1], gold)
        pooled_texts = [texts[m] for m in members]
        pooled = rank_spans(pooled_texts, q["question"], 1)
        right["pooled reader"] += bool(pooled) and exact_match(pooled[0].text, gold)
        right["pass@N"] += any(a and exact_match(a, gold) for a in answers)
        # the pooled reader's score of each span (the best, where a span recurs)
        scores = {normalize_answer(s.text): s.score
                  for s in reversed(rank_spans(pooled_texts, q["question"], 10_000))}
        chosen = vote(answers, scores)
        right["vote"] += chosen is not None and exact_match(answers[chosen], gold)
    n = len(questions)
    return {"members": members, "seconds": round(time.perf_counter() - start, 1),
            "rates": {k: _rate(right[k], n) for k in [*members, "pass@N", "pooled reader",
                                                       "vote"]}}


def load_run(path: Path) -> dict[str, str]:
    """question -> prediction (empty when the run gave no answer) of a result file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)["rows"]
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    out = {}
    for row in rows:
        answered = str(row.get("termination") or "").startswith("answered")
        out[row["question"]] = str(row.get("prediction") or "") if answered else ""
    return out


def runs_part(questions: list[dict[str, str]], paths: Sequence[Path]) -> dict[str, Any]:
    runs = {p.name: load_run(p) for p in paths}
    shared = [q for q in questions if all(q["question"] in r for r in runs.values())]
    right: Counter[str] = Counter()
    agree = agree_right = 0
    for q in shared:
        answers = [r[q["question"]] for r in runs.values()]
        ok = [bool(a) and exact_match(a, q["answer"]) for a in answers]
        for name, hit in zip(runs, ok, strict=True):
            right[name] += hit
        right["pass@N"] += any(ok)
        chosen = vote(answers)
        right["vote"] += chosen is not None and ok[chosen]
        if len({normalize_answer(a) for a in answers}) == 1 and answers[0].strip():
            agree += 1
            agree_right += ok[0]
        else:
            right[f"only {'+'.join(n for n, h in zip(runs, ok, strict=True) if h) or 'none'}"] += 1
    n = len(shared)
    return {"questions": n, "agree": agree, "right_when_agreeing": agree_right,
            "rates": {k: _rate(v, n) for k, v in right.items() if not k.startswith("only")},
            "disagreements": {k: v for k, v in sorted(right.items()) if k.startswith("only")}}


def _table(rates: dict[str, dict[str, Any]]) -> str:
    lines = ["| member / combiner | right | exact | 95% CI |", "|---|---|---|---|"]
    for name, r in rates.items():
        lo, hi = r["ci95"]
        lines.append(f"| {name} | {r['right']}/{r['n']} | {r['pct']:.1f}% | {lo:.1f}-{hi:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("dev", "test"), default="dev")
    ap.add_argument("--sample", type=int, default=None,
                    help="the first N of the stable order bench_embedded_questions --sample uses")
    ap.add_argument("--runs", type=Path, nargs="*", default=[],
                    help="result files of runs over the same questions (part 2)")
    args = ap.parse_args()
    if args.sample is not None and args.sample < 1:
        ap.error("--sample must be 1 or more")
    missing = [str(p) for p in args.runs if not p.is_file()]
    if missing:
        ap.error(f"no such result file: {', '.join(missing)}")
    questions = load_natural_questions(args.set)
    if args.sample:
        questions = sorted(questions, key=lambda q: _stable_order(q.get("id") or q["question"]))
        questions = questions[: args.sample]
    report: dict[str, Any] = {"set": args.set, "questions": len(questions),
                              "evidence": evidence_part(questions)}
    print(f"## Evidence members, natural {args.set}, {len(questions)} questions "
          f"({report['evidence']['seconds']} s)\n")
    print(_table(report["evidence"]["rates"]))
    if args.runs:
        report["runs"] = runs_part(questions, args.runs)
        r = report["runs"]
        print(f"\n## Runs ({', '.join(p.name for p in args.runs)}), {r['questions']} questions\n")
        print(_table(r["rates"]))
        print(f"\nagree on {r['agree']} (right {r['right_when_agreeing']}); "
              f"disagreements: {r['disagreements']}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "heavy_headroom.json").write_text(json.dumps(report, indent=2) + "\n",
                                             encoding="utf-8")


if __name__ == "__main__":
    main()
