"""Build the recipe's data: questions, teacher trajectories for SFT, RL and eval files.

:func:`build` runs every step in order and returns a report (counts, drop reasons, token
lengths); ``recipes/embedded/build_data.py`` is its command line. Outputs under ``out``:

- ``questions.jsonl``: every generated question record (``split`` says where it went);
- ``raw/train-sft.jsonl``: teacher trajectories of train-SFT questions, in the clean layout
  ``drvenus data clean`` reads (``question``, ``messages``, ``gt``, plus the record's fields);
- ``rl/train-rl.jsonl``: train-RL questions in verl RL rows (``drvenus rl --train``);
- ``eval/dev.jsonl``, ``eval/test.jsonl``: reserved-only questions as generic question/answer
  rows (``drvenus eval --benchmark jsonl``);
- ``report.json``: the numbers of the data card.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus import protocol
from drvenus.grading.match import normalize_answer
from drvenus.protocol import ANSWER_SPLIT, ToolCall
from drvenus.recipe.articles import Article, is_reserved
from drvenus.recipe.facts import contains_answer, find_span
from drvenus.recipe.pairs import COMPARISON, YES_NO, comparisons, yes_no
from drvenus.recipe.questions import (
    RESERVED,
    TRAIN,
    Question,
    assign_splits,
    dedupe,
    single_hop,
    two_hop,
    usable_alias,
)
from drvenus.recipe.teacher import Teacher, Trajectory
from drvenus.small.spans import question_query

log = logging.getLogger(__name__)

DEFAULT_DATE = "2026-12-01"
MIX_SOURCE = "deepresearcher-mix"


@dataclass
class BuildConfig:
    out: Path
    seed: int = 17
    mix_path: Path | None = None  # the deepresearcher mix parquet (None: not used)
    current_date: str = DEFAULT_DATE
    sft_tokens: int = 1_200_000  # token budget of the SFT trajectories
    max_tokens: int = 2048  # longest trajectory kept (embedded tokens)
    dev_size: int = 200
    test_size: int = 500
    per_article: int = 3
    per_bridge: int = 4  # two-hop questions per bridge
    described: float = 0.8  # share of single-hop questions that describe their subject
    sft_share: float = 0.8  # share of the train articles whose questions go to SFT (else RL)
    # shares of the SFT token budget per question family (what a share leaves unused goes to
    # the rest, round-robin): the natural sets ask described subjects, two hops, comparisons
    # and yes/no questions far more often than the title-named template
    sft_mix: dict[str, float] = field(default_factory=lambda: {
        "wiki-described": 0.35, "wiki-two-hop": 0.15, COMPARISON: 0.15, YES_NO: 0.10,
        "wiki-single-hop": 0.20, MIX_SOURCE: 0.05})
    concurrency: int = 8
    limit: int | None = None  # questions per source (a quick run)


@dataclass
class BuildResult:
    questions: list[Question]
    solved: dict[str, Trajectory] = field(default_factory=dict)
    drops: dict[str, str] = field(default_factory=dict)
    sft: list[Trajectory] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


# --- distant supervision ------------------------------------------------------------------


async def mix_questions(rows: Iterable[dict[str, Any]], toolbox: Any,
                        by_url: dict[str, Article]) -> tuple[list[Question], Counter[str]]:
    """Rows of the deepresearcher mix whose answer occurs in an article the local search
    returns for the question's query; the bucket is that of the articles holding the answer
    (any non-reserved one: train, with only those as gold; else reserved)."""
    out: list[Question] = []
    why: Counter[str] = Counter()
    for row in rows:
        prompt = row.get("prompt") or []
        question = next((m["content"] for m in prompt if m.get("role") == "user"), None)
        gt = (row.get("reward_model") or {}).get("ground_truth") or ""
        if not question:
            why["no_question"] += 1
            continue
        every = [a.strip() for a in str(gt).split(ANSWER_SPLIT) if a.strip()]
        if any(contains_answer(question, a) for a in every):
            why["answer_in_question"] += 1  # e.g. "Which died later, A or B?"
            continue
        aliases = [a for a in every if usable_alias(a)]
        if not aliases:
            why["no_usable_answer"] += 1
            continue
        query = question_query(question)
        if not query:
            why["no_query"] += 1
            continue
        body = await toolbox.call(ToolCall(protocol.SEARCH, {"query": [query]}))
        hits = [h for e in protocol.parse_search_body(body) or [] for h in e["web_page_info_list"]]
        gold: list[tuple[Article, str]] = []
        for h in hits:
            art = by_url.get(h["url"])
            if art is None:
                continue
            span = next((s for a in aliases if (s := find_span(art.text, a))), None)
            if span is not None and title_overlaps(art.title, question):
                gold.append((art, span))
        train_gold = [(a, s) for a, s in gold if not a.reserved]
        chosen = train_gold or gold
        if not chosen:
            why["answer_not_retrieved"] += 1
            continue
        answer = " ".join(chosen[0][1].split())
        if mostly_in(answer, question):
            why["answer_in_question"] += 1
            continue
        extra = row.get("extra_info") or {}
        source = str(row.get("data_source") or "mix")
        out.append(Question(
            id=f"mix-{source}-{extra.get('index') or len(out)}", question=question.strip(),
            answer=answer, aliases=[a for a in aliases if a.lower() != answer.lower()],
            kind=f"mix:{source}", hops=1, gold_titles=[a.title for a, _ in chosen],
            bucket=TRAIN if train_gold else RESERVED, split="", source=f"{MIX_SOURCE}:{source}",
            wh="mixed", category="mixed", subject=query,
            meta={"reserved_also_holds_answer": bool(train_gold) and len(gold) > len(train_gold)},
        ))
        why["kept"] += 1
    return out, why


_TOKEN = re.compile(r"\w+")
_TITLE_STOP = frozenset(
    """the of and for from with list country countries city state music film song book world
    year years name people river history language war group team album novel series game
    first second third largest new""".split()
)


def title_overlaps(title: str, question: str) -> bool:
    """Whether the question names the article: every content word of its title (at least one,
    not a generic word such as "country") is a word of the question. The distant supervision
    keeps an answer only from an article the question is about, not from any page that happens
    to contain the answer string ("The Deer Hunter" is not about "Hunter S. Thompson")."""
    words = {w for w in _TOKEN.findall(title.lower()) if len(w) >= 3 and w not in _TITLE_STOP}
    asked = set(_TOKEN.findall(question.lower()))
    return bool(words) and words <= asked


def mostly_in(answer: str, question: str) -> bool:
    """Half or more of the answer's words are in the question ("Paul Thomas Mann" for "...,
    David Guterson or Thomas Mann?")."""
    words = normalize_answer(answer).split()
    asked = set(normalize_answer(question).split())
    return len(words) > 1 and sum(w in asked for w in words) * 2 >= len(words)


def read_mix(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


# --- running the teacher ------------------------------------------------------------------


async def run_teacher(teacher: Teacher, questions: Sequence[Question], concurrency: int = 8
                      ) -> tuple[dict[str, Trajectory], dict[str, str]]:
    solved: dict[str, Trajectory] = {}
    drops: dict[str, str] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(q: Question) -> None:
        async with gate:
            traj, why = await teacher.solve(q)
        if traj is not None:
            solved[q.id] = traj
        else:
            drops[q.id] = why or "unknown"

    await asyncio.gather(*(one(q) for q in questions))
    return solved, drops


def stratified(items: Sequence[Any], key: Callable[[Any], str], rng: random.Random) -> list[Any]:
    """``items`` in round-robin order over their groups (each group shuffled)."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for it in items:
        groups[key(it)].append(it)
    order = sorted(groups)
    for g in order:
        rng.shuffle(groups[g])
    out = []
    while any(groups[g] for g in order):
        for g in order:
            if groups[g]:
                out.append(groups[g].pop())
    return out


def _lengths(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered), "total": sum(ordered), "mean": round(statistics.fmean(ordered), 1),
        "median": ordered[len(ordered) // 2], "p95": ordered[int(0.95 * (len(ordered) - 1))],
        "max": ordered[-1], "min": ordered[0],
    }


def _family(t: Trajectory) -> str:
    return t.question.source.split(":")[0]


def select_sft(pool: Sequence[Trajectory], budget: int, mix: dict[str, float],
               rng: random.Random) -> list[Trajectory]:
    """Trajectories for SFT within ``budget`` tokens: each family (question source) first fills
    its share of the budget, then what is left goes to every family. Within a family, round-robin
    over (kind, visited or not), so that every kind, and the visit turns that IGPO scores, are
    represented even though most answers are in a search snippet."""
    by_family: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in stratified(pool, lambda t: f"{_family(t)}|{t.question.kind}|{t.visits > 0}",
                           rng):
        by_family[_family(traj)].append(traj)
    chosen: list[Trajectory] = []
    used = 0

    def take(items: list[Trajectory], limit: int) -> list[Trajectory]:
        """Takes from ``items`` up to ``limit`` tokens; returns the ones left."""
        nonlocal used
        spent = 0
        left = []
        for traj in items:
            cost = traj.tokens or 0
            if spent + cost > limit or used + cost > budget:
                left.append(traj)
                continue
            chosen.append(traj)
            spent += cost
            used += cost
        return left

    for family, share in mix.items():
        by_family[family] = take(by_family.get(family, []), int(share * budget))
    take(stratified([t for items in by_family.values() for t in items],
                    lambda t: f"{_family(t)}|{t.question.kind}", rng), budget)
    return chosen


def rl_row(q: Question) -> dict[str, Any]:
    return {
        "data_source": q.source, "prompt": [{"role": "user", "content": q.question}],
        "ability": "search & question answering",
        "reward_model": {"ground_truth": q.ground_truth, "style": "rule"},
        "extra_info": {"index": q.id, "split": "train", "kind": q.kind, "hops": q.hops},
    }


EVAL_LEVELS = {"wiki-single-hop": "single-hop", "wiki-described": "single-hop",
               "wiki-two-hop": "two-hop", COMPARISON: "comparison", YES_NO: "yes-no",
               "deepresearcher-mix": "open-qa"}


def eval_row(q: Question) -> dict[str, Any]:
    return {
        "id": q.id, "question": q.question, "answer": q.ground_truth, "kind": q.kind,
        "hops": q.hops, "gold_titles": q.gold_titles, "data_source": q.source,
        "level": EVAL_LEVELS.get(q.source.split(":")[0], q.source),  # the eval report's breakdown
    }


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def generate_questions(articles: Sequence[Article], cfg: BuildConfig, toolbox: Any
                       ) -> tuple[list[Question], dict[str, Any]]:
    rng = random.Random(cfg.seed)
    singles = single_hop(articles, rng, cfg.per_article, cfg.described)
    doubles, two_hop_skips = two_hop(articles, rng, cfg.per_bridge)
    doubles += comparisons(articles, rng) + yes_no(articles, rng)
    mixed: list[Question] = []
    mix_why: Counter[str] = Counter()
    if cfg.mix_path is not None:
        rows = read_mix(cfg.mix_path)
        if cfg.limit:
            rows = rows[: cfg.limit]
        by_url = {a.url: a for a in articles}
        mixed, mix_why = asyncio.run(mix_questions(rows, toolbox, by_url))
    if cfg.limit:
        singles = random.Random(cfg.seed).sample(singles, min(cfg.limit, len(singles)))
        doubles = random.Random(cfg.seed).sample(doubles, min(cfg.limit, len(doubles)))
    questions = dedupe([*singles, *doubles, *mixed])
    assign_splits(questions, cfg.seed, sft_share=cfg.sft_share)
    return questions, {"two_hop_skipped": two_hop_skips, "mix": dict(mix_why)}


def check_buckets(questions: Iterable[Question]) -> None:
    """The bucket invariants; raises AssertionError-like ValueError when broken."""
    for q in questions:
        reserved = [is_reserved(t) for t in q.gold_titles]
        if q.split.startswith("train") and any(reserved):
            raise ValueError(f"{q.id}: a reserved gold article in {q.split}")
        if q.split in ("dev", "test") and not all(reserved):
            raise ValueError(f"{q.id}: a non-reserved gold article in {q.split}")


def build(cfg: BuildConfig, articles: Sequence[Article], toolbox: Any,
          counter: Any) -> BuildResult:
    """Every step but ``data clean``: questions, teacher runs, selection, files, report."""
    t0 = time.monotonic()
    questions, gen_info = generate_questions(articles, cfg, toolbox)
    check_buckets(questions)
    t_gen = time.monotonic() - t0
    system = protocol.build_system_prompt(cfg.current_date)
    urls = {a.title: a.url for a in articles}
    teacher = Teacher(toolbox, urls, system, count_tokens=counter.count,
                      max_tokens=cfg.max_tokens, seed=cfg.seed)
    t1 = time.monotonic()
    solved, drops = asyncio.run(run_teacher(teacher, questions, cfg.concurrency))
    t_teacher = time.monotonic() - t1
    for traj in solved.values():  # a trajectory's sources must be its own bucket's
        if traj.question.split.startswith("train") and any(is_reserved(s) for s in traj.sources):
            raise ValueError(f"{traj.question.id}: answered from a reserved article")

    rng = random.Random(cfg.seed)
    sft_pool = [solved[q.id] for q in questions if q.split == "train-sft" and q.id in solved]
    sft = select_sft(sft_pool, cfg.sft_tokens, cfg.sft_mix, rng)
    sft.sort(key=lambda t: t.question.id)
    rl = sorted((q for q in questions if q.split == "train-rl" and q.id in solved),
                key=lambda q: q.id)
    evals = {}
    for split, size in (("dev", cfg.dev_size), ("test", cfg.test_size)):
        pool = [q for q in questions if q.split == split and q.id in solved]
        picked = stratified(pool, lambda q: q.source.split(":")[0], rng)[:size]
        evals[split] = sorted(picked, key=lambda q: q.id)

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    for q in questions:
        q.meta["teacher"] = "solved" if q.id in solved else drops.get(q.id, "")
    write_jsonl(out / "questions.jsonl", (q.to_dict() for q in questions))
    write_jsonl(out / "raw" / "train-sft.jsonl", (t.raw_row() for t in sft))
    write_jsonl(out / "rl" / "train-rl.jsonl", (rl_row(q) for q in rl))
    for split, items in evals.items():
        write_jsonl(out / "eval" / f"{split}.jsonl", (eval_row(q) for q in items))
    (out / "system_prompt.txt").write_text(system, encoding="utf-8")

    report = make_report(questions, solved, drops, sft, rl, evals, gen_info, counter.name)
    report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(cfg).items()}
    report["seconds"] = {"questions": round(t_gen, 1), "teacher": round(t_teacher, 1)}
    return BuildResult(questions, solved, drops, sft, report)


def make_report(questions, solved, drops, sft, rl, evals, gen_info, counter_name) -> dict:
    def family(q: Question) -> str:
        return q.source.split(":")[0]

    per: dict[str, Any] = {}
    for split in ("train-sft", "train-rl", "dev", "test"):
        qs = [q for q in questions if q.split == split]
        per[split] = {
            "questions": len(qs),
            "by_source": dict(Counter(family(q) for q in qs)),
            "teacher_solved": sum(q.id in solved for q in qs),
            "solved_by_source": dict(Counter(family(q) for q in qs if q.id in solved)),
        }
    kinds = Counter((family(q), q.kind) for q in questions)
    solved_kinds = Counter((family(q), q.kind) for q in questions if q.id in solved)
    return {
        "questions": len(questions),
        "by_source": dict(Counter(family(q) for q in questions)),
        "by_bucket": dict(Counter(q.bucket for q in questions)),
        "by_wh": dict(Counter(q.wh for q in questions)),
        "by_category": dict(Counter(q.category for q in questions)),
        "by_kind": {f"{s}|{k}": [n, solved_kinds[(s, k)]] for (s, k), n in kinds.most_common()},
        "splits": per,
        "teacher": {
            "solved": len(solved), "dropped": len(drops),
            "drop_reasons": dict(Counter(drops.values())),
            "tool_calls": dict(Counter(len(t.calls) for t in solved.values())),
            "with_visit": sum(t.visits > 0 for t in solved.values()),
        },
        "generation": gen_info,
        "outputs": {
            "sft_trajectories": len(sft), "rl_questions": len(rl),
            "dev": len(evals["dev"]), "test": len(evals["test"]),
            "sft_by_source": dict(Counter(family(t.question) for t in sft)),
            "sft_by_kind": dict(Counter(t.question.kind for t in sft)),
        },
        "tokens": {
            "counter": counter_name,
            "sft": _lengths([t.tokens or 0 for t in sft]),
            "all_solved": _lengths([t.tokens or 0 for t in solved.values()]),
        },
    }


__all__ = ["BuildConfig", "BuildResult", "build", "check_buckets", "eval_row",
           "generate_questions", "mix_questions", "rl_row", "run_teacher", "select_sft",
           "stratified",
           "write_jsonl"]
