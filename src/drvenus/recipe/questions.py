"""Question sets from the built-in corpus: single-hop, two-hop and distant-supervision rows.

Every question is a :class:`Question` record (id, question, answer + aliases, kind, hops, gold
titles, bucket, split, source). Generation is deterministic for a seed. The bucket is the
article's (:func:`drvenus.recipe.articles.is_reserved`); a question's bucket is ``reserved``
only when every gold article is reserved and ``train`` only when none is (mixed questions are
not made). Splits: ``train-sft`` / ``train-rl`` (train bucket, disjoint by gold article),
``dev`` / ``test`` (reserved bucket, disjoint by gold article).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from drvenus.protocol import ANSWER_SPLIT
from drvenus.recipe.articles import Article, is_reserved
from drvenus.recipe.facts import (
    MAX_SUBJECT_CHARS,
    Fact,
    article_facts,
    contains_answer,
    wh_of,
)

TRAIN, RESERVED = "train", "reserved"
SPLITS = ("train-sft", "train-rl", "dev", "test")


@dataclass
class Question:
    id: str
    question: str
    answer: str
    aliases: list[str]
    kind: str
    hops: int
    gold_titles: list[str]
    bucket: str
    split: str
    source: str
    wh: str = "what"
    category: str = "general"
    subject: str = ""  # how the (first) gold article is named in the question
    bridge: str | None = None  # two-hop: the bridge entity (the second gold title)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ground_truth(self) -> str:
        """All accepted answers joined by the protocol's answer separator."""
        return ANSWER_SPLIT.join(dict.fromkeys([self.answer, *self.aliases]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Question:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__ if k in row})


def stable_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def question_id(source: str, kind: str, question: str) -> str:
    return f"{source}-{kind}-{stable_hash(question)[:10]}"


def subject_mention(title: str, extract: str = "") -> str | None:
    """How a question names an article: its title, when it is short and has no parenthetical
    disambiguation ("Mercury (planet)" is left out: the bare name would be ambiguous), with
    "the" in front when the article itself says "The <title> ..." ("the BBC")."""
    if "(" in title or len(title) > MAX_SUBJECT_CHARS or not title[:1].isalnum():
        return None
    if extract.startswith(f"The {title} ") and not title.startswith("The "):
        return f"the {title}"
    return title


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


_PARENTHESES = re.compile(r"\s*\([^()]*\)")
_WORDS = re.compile(r"[A-Za-z]+")
MIN_DESCRIBED_WORDS = 3  # "the substance used for cleaning", not "the sport"


def lower_words(articles: Sequence[Article]) -> frozenset[str]:
    """The words the corpus writes in lower case (so "Capital" can start a description and
    be "the capital ...", while "American" stays capitalised)."""
    return frozenset(w for a in articles for w in _WORDS.findall(a.extract) if w.islower())


def described_mention(article: Article, lower: frozenset[str]) -> str | None:
    """How a person who does not know its title describes an article: its short description,
    parentheses left out, after "the" ("Substance used for cleaning" -> "the substance used
    for cleaning"); None when there is none of at least ``MIN_DESCRIBED_WORDS`` words, or it
    names the article's title."""
    text = " ".join(_PARENTHESES.sub("", article.description).split()).strip(" ,;.")
    if len(text.split()) < MIN_DESCRIBED_WORDS or contains_answer(text, article.title):
        return None
    first = text.split(" ", 1)[0]
    if first.lower() in lower:
        text = first.lower() + text[len(first):]
    return f"the {text}"


def _bucket(titles: Iterable[str]) -> str | None:
    flags = {is_reserved(t) for t in titles}
    if flags == {False}:
        return TRAIN
    if flags == {True}:
        return RESERVED
    return None


def single_hop(articles: Sequence[Article], rng: random.Random, per_article: int = 3,
               described: float = 0.0) -> list[Question]:
    """One question per fact (at most ``per_article`` facts of an article, kinds shuffled),
    one phrasing drawn at random; the answer is never in the question. With ``described``,
    that share of the questions (where the article has a usable description and the fact a
    phrasing for a noun phrase) describe the subject instead of naming it (source
    ``wiki-described``: "Who founded the multinational fast food chain ...?")."""
    lower = lower_words(articles) if described else frozenset()
    out = []
    for art in articles:
        mention = subject_mention(art.title, art.extract)
        if mention is None:
            continue
        description = described_mention(art, lower) if described else None
        facts = article_facts(art)
        rng.shuffle(facts)
        made = 0
        for f in facts:
            if made >= per_article:
                break
            subject, source, templates = mention, "wiki-single-hop", f.templates
            if description and f.templates_for_phrase() and rng.random() < described:
                subject, source = description, "wiki-described"
                templates = f.templates_for_phrase()
            q = _cap(rng.choice(templates).format(s=subject))
            if contains_answer(q, f.answer):
                continue
            bucket = _bucket([art.title])
            out.append(Question(
                id=question_id("wiki1", f.kind, q), question=q, answer=f.answer, aliases=[],
                kind=f.kind, hops=1, gold_titles=[art.title], bucket=bucket or TRAIN, split="",
                source=source, wh=wh_of(f.kind), category=f.category,
                subject=subject, meta={"evidence": f.evidence},
            ))
            made += 1
    return out


_PERSON_BRIDGE = re.compile(
    r"the (author|director|composer|painter|designer|inventor|discoverer|founder|creator|"
    r"illustrator|producer|sculptor|developer) of"
)


def two_hop(articles: Sequence[Article], rng: random.Random, per_bridge: int = 2
            ) -> tuple[list[Question], dict[str, int]]:
    """Questions that bridge two articles: a fact of A whose answer is the title of B (the
    bridge entity), composed with a fact of B ("In what year was the author of Dracula
    born?"). A and B are in the same bucket (pairs across buckets are counted and skipped)."""
    by_lower = {a.title.lower(): a for a in articles}
    facts_of: dict[str, list[Fact]] = {}
    out: list[Question] = []
    skipped = {"mixed_bucket": 0, "answer_or_bridge_in_question": 0}
    for art in articles:
        mention = subject_mention(art.title, art.extract)
        if mention is None:
            continue
        for fa in article_facts(art):
            if fa.bridge is None:
                continue
            b = by_lower.get(fa.answer.lower()) or by_lower.get(
                fa.answer.lower().removeprefix("the "))
            if b is None or b.title == art.title or subject_mention(b.title) is None:
                continue
            if _PERSON_BRIDGE.search(fa.bridge) and b.topic != "People":
                continue  # "the author of X" must be a person
            if is_reserved(art.title) != is_reserved(b.title):
                skipped["mixed_bucket"] += 1
                continue
            if b.title not in facts_of:
                facts_of[b.title] = [f for f in article_facts(b) if f.templates_for_phrase()]
            candidates = list(facts_of[b.title])
            rng.shuffle(candidates)
            made = 0
            for fb in candidates:
                if made >= per_bridge:
                    break
                phrase = fa.bridge.format(s=mention)
                q = _cap(rng.choice(fb.templates_for_phrase()).format(s=phrase))
                if contains_answer(q, fb.answer) or contains_answer(q, b.title):
                    skipped["answer_or_bridge_in_question"] += 1
                    continue
                kind = f"{fa.kind}>{fb.kind}"
                out.append(Question(
                    id=question_id("wiki2", kind.replace(">", "-"), q), question=q,
                    answer=fb.answer, aliases=[], kind=kind, hops=2,
                    gold_titles=[art.title, b.title], bucket=_bucket([art.title, b.title])
                    or TRAIN, split="", source="wiki-two-hop", wh=wh_of(fb.kind),
                    category=fb.category, subject=mention, bridge=b.title,
                    meta={"bridge_kind": fa.kind, "bridge_evidence": fa.evidence,
                          "evidence": fb.evidence},
                ))
                made += 1
    return out, skipped


# --- distant supervision over the deepresearcher mix ------------------------------------------

MAX_QUERY_CHARS = 60  # the embedded grammar's bound on a query the model writes


def usable_alias(alias: str) -> bool:
    a = alias.strip()
    return len(a) >= 3 and a[:1].isalnum() and len(a.split()) <= 6 and "<" not in a


def assign_splits(questions: list[Question], seed: int, sft_share: float = 0.6,
                  dev_share: float = 0.4) -> None:
    """``split`` of every question, by its first gold article (all questions about one article
    land in one split): train -> train-sft (``sft_share``) or train-rl; reserved -> dev
    (``dev_share``) or test."""
    for q in questions:
        key = stable_hash(f"{seed}:{q.gold_titles[0]}")
        x = int(key[:8], 16) / 0xFFFFFFFF
        if q.bucket == TRAIN:
            q.split = "train-sft" if x < sft_share else "train-rl"
        else:
            q.split = "dev" if x < dev_share else "test"


def dedupe(questions: Iterable[Question]) -> list[Question]:
    seen: set[str] = set()
    out = []
    for q in questions:
        key = q.question.lower()
        if key not in seen:
            seen.add(key)
            out.append(q)
    return out


__all__ = [
    "MAX_QUERY_CHARS", "RESERVED", "SPLITS", "TRAIN", "Question", "assign_splits", "dedupe",
    "described_mention", "lower_words", "question_id", "single_hop", "stable_hash",
    "subject_mention", "two_hop", "usable_alias",
]
