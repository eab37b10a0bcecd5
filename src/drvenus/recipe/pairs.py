"""Questions over two named articles: comparisons ("Who was born first, A or B?") and yes/no
questions ("Were A and B both Italian?"), the HotpotQA question types the natural sets ask.

Both subjects are named by title (as people ask such questions); each needs one fact of each
article, so the teacher reads two pages (:meth:`drvenus.recipe.teacher.Teacher.solve`). A pair is
made only of articles in the same bucket; every article is in at most ``per_article`` pairs of a
kind. The fact values of both articles are kept in ``meta["pair"]`` (what the teacher must read).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from drvenus.recipe.articles import Article, is_reserved
from drvenus.recipe.facts import Fact, article_facts
from drvenus.recipe.questions import RESERVED, TRAIN, Question, question_id, subject_mention

COMPARISON, YES_NO = "wiki-comparison", "wiki-yes-no"


@dataclass(frozen=True)
class _Side:
    article: Article
    mention: str
    fact: Fact


def _year(text: str) -> int | None:
    return int(text) if re.fullmatch(r"\d{3,4}", text) else None


_SCALE = {"thousand": 1e3, "million": 1e6, "billion": 1e9}


def amount(text: str) -> float | None:
    """``"1,234,567"``, ``"2.1 million"`` as a number (None: not a plain amount)."""
    m = re.fullmatch(r"(?:about |around |over |more than )?([\d,]*\.?\d+)\s*([a-z]+)?", text)
    if m is None:
        return None
    try:
        value = float(m.group(1).replace(",", ""))
    except ValueError:
        return None
    if m.group(2):
        if m.group(2) not in _SCALE:
            return None
        value *= _SCALE[m.group(2)]
    return value


@dataclass(frozen=True)
class _Comparison:
    """One comparable fact kind: its value reader, the articles it applies to, and phrasings
    (``{a}``, ``{b}``) for which the smaller value wins and for which the larger does."""

    kind: str
    value: Callable[[str], float | None]
    smaller: tuple[str, ...]
    larger: tuple[str, ...]
    topic: str | None = None  # only articles of this topic
    min_ratio: float = 1.0  # the larger value is at least this times the smaller


COMPARISONS = (
    _Comparison("birth_year", _year,
                ("Who was born first, {a} or {b}?", "Which of {a} and {b} was born earlier?",
                 "Who is older, {a} or {b}?"),
                ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?"), "People"),
    _Comparison("death_year", _year,
                ("Who died first, {a} or {b}?", "Which of {a} and {b} died earlier?"),
                ("Who died later, {a} or {b}?", "Which of {a} and {b} died more recently?")),
    _Comparison("work_year", _year,
                ("Which came out first, {a} or {b}?", "Which is older, {a} or {b}?"),
                ("Which came out later, {a} or {b}?", "Which is more recent, {a} or {b}?")),
    _Comparison("population", amount,
                ("Which has fewer inhabitants, {a} or {b}?",),
                ("Which has more inhabitants, {a} or {b}?", "Which is more populous, {a} or {b}?",
                 "Where do more people live, {a} or {b}?"), "Geography", min_ratio=1.1),
)


def _sides(articles: Sequence[Article], kind: str, topic: str | None = None) -> list[_Side]:
    out = []
    for art in articles:
        if topic is not None and art.topic != topic:
            continue
        mention = subject_mention(art.title, art.extract)
        if mention is None:
            continue
        fact = next((f for f in article_facts(art) if f.kind == kind), None)
        if fact is not None:
            out.append(_Side(art, mention, fact))
    return out


def _bucket_pairs(sides: list[_Side], rng: random.Random, per_article: int
                  ) -> list[tuple[_Side, _Side]]:
    """Random pairs within each bucket; each side in at most ``per_article`` pairs."""
    by_bucket: dict[bool, list[_Side]] = defaultdict(list)
    for s in sides:
        by_bucket[is_reserved(s.article.title)].append(s)
    pairs = []
    for group in by_bucket.values():
        for _ in range(per_article):
            order = list(group)
            rng.shuffle(order)
            pairs.extend(zip(order[0::2], order[1::2], strict=False))
    return pairs


def _question(source: str, kind: str, text: str, answer: str, aliases: list[str],
              a: _Side, b: _Side, wh: str) -> Question:
    titles = [a.article.title, b.article.title]
    return Question(
        id=question_id(source.removeprefix("wiki-"), kind.replace(":", "-"), text),
        question=text, answer=answer, aliases=aliases, kind=kind, hops=2, gold_titles=titles,
        bucket=RESERVED if is_reserved(titles[0]) else TRAIN, split="", source=source, wh=wh,
        category=a.fact.category, subject=a.mention, bridge=None,
        meta={"pair": [{"title": s.article.title, "mention": s.mention, "kind": s.fact.kind,
                        "value": s.fact.answer} for s in (a, b)],
              "evidence": [a.fact.evidence, b.fact.evidence]},
    )


def comparisons(articles: Sequence[Article], rng: random.Random, per_article: int = 1
                ) -> list[Question]:
    """"Who was born first, A or B?": the answer is the winning subject as the question names
    it (its title as alias when the mention adds "the")."""
    out = []
    for spec in COMPARISONS:
        for a, b in _bucket_pairs(_sides(articles, spec.kind, spec.topic), rng, per_article):
            va, vb = spec.value(a.fact.answer), spec.value(b.fact.answer)
            if va is None or vb is None or va == vb or min(va, vb) <= 0:
                continue
            if max(va, vb) < spec.min_ratio * min(va, vb):
                continue
            smaller_wins = rng.random() < 0.5 or not spec.larger
            templates = spec.smaller if smaller_wins else spec.larger
            winner = a if (va < vb) == smaller_wins else b
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            text = rng.choice(templates).format(a=first.mention, b=second.mention)
            aliases = [winner.article.title] if winner.mention != winner.article.title else []
            out.append(_question(COMPARISON, f"cmp:{spec.kind}", text, winner.mention, aliases,
                                 first, second, "which"))
    return out


_NATIONALITY = ("Were {a} and {b} both {v}?", "Did {a} and {b} share {v} nationality? Answer "
                "yes or no.", "Were both {a} and {b} {v}?")
_COUNTRY = ("Are {a} and {b} both in {v}?", "Are {a} and {b} located in the same country, "
            "{v}?", "Do {a} and {b} both lie in {v}?")

_THE_COUNTRY_WORDS = frozenset(("United", "Netherlands", "Philippines", "Czech", "Democratic",
                                "Republic", "Bahamas", "Gambia", "Maldives"))


def yes_no(articles: Sequence[Article], rng: random.Random, per_article: int = 1
           ) -> list[Question]:
    """"Were A and B both Italian?" (nationality of two people) and "Are A and B both in
    Italy?" (country of two places): yes when both facts equal the asked value; no when one
    differs (the asked value is then the first subject's, so the answer needs both pages)."""
    out = []
    for kind, templates, topic in (("nationality", _NATIONALITY, "People"),
                                   ("country", _COUNTRY, None)):
        sides = _sides(articles, kind, topic)
        by_value: dict[tuple[bool, str], list[_Side]] = defaultdict(list)
        for s in sides:
            by_value[(is_reserved(s.article.title), s.fact.answer)].append(s)
        same = [p for group in by_value.values() if len(group) > 1
                for p in _bucket_pairs(group, rng, per_article)]
        differ = [(a, b) for a, b in _bucket_pairs(sides, rng, per_article)
                  if a.fact.answer != b.fact.answer]
        rng.shuffle(differ)
        for (a, b), answer in [*((p, "yes") for p in same),
                               *((p, "no") for p in differ[: len(same)])]:
            value = a.fact.answer
            if kind == "country" and value.split(" ", 1)[0] in _THE_COUNTRY_WORDS:
                value = f"the {value}"  # "both in the United States"
            text = rng.choice(templates).format(a=a.mention, b=b.mention, v=value)
            out.append(_question(YES_NO, f"yn:{kind}", text, answer, [], a, b, "yes/no"))
    return out


__all__ = ["COMPARISON", "COMPARISONS", "YES_NO", "amount", "comparisons", "yes_no"]
