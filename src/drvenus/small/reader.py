"""Span readers: rank the spans an answer may copy by how likely each answers the question.

A reader is anything with :meth:`SpanReader.rank`; the levers name one (``span_reader``) and
:func:`span_reader` returns it: ``"linear"``, the linear reader below, or ``"neural"``,
:class:`drvenus.small.neural.NeuralReader` (imported only when chosen).

The linear reader:

The embedded model (135M parameters) reads poorly: on questions written the way people ask,
the answer was in what it had read for three in four single-hop questions, yet it copied
another span (a result's title, a word of the question's topic). The reader scores every
candidate span of the texts read (search titles and snippets, visited pages) with a linear
model over a few features that early open-domain QA systems relied on:

- how well the span's sentence matches the question (its content words weighted by how few
  sentences hold them) and whether it is the best-matching sentence;
- how close the span stands to the question's words in that sentence, before or after them;
- where the sentence is (a text's first lines are a result's title and description);
- how often the span recurs across the texts;
- its form against what the question asks for (a name, a number, a time) and its length;
- the word before it ("called", "known as", "in", "by");
- how its neighbours align with the words around the question's wh-phrase ("the tail of what
  animal" / "the tail of a fish"), and the question's words in a window around it.

The weights (:data:`WEIGHTS`) were fitted on recipe training questions
(``recipes/embedded/train_reader.py``), never on the questions we report on. The agent keeps
the top spans in its answer grammar (the ``span_rank`` lever): the model picks among a few good
spans instead of every span of five search results.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from drvenus.small.spans import (
    _CLAUSE_BREAK,
    _NAME_LINKS,
    _NUMBER_WORDS,
    _QUERY_STOPWORDS,
    _TIME_WORDS,
    _YEAR_WORD,
    AnswerShape,
    _echoes,
    _ok_word,
    answer_shape,
    clean_word,
    content_stems,
    question_query,
    question_words,
    weak_word,
)
from drvenus.text import split_sentences

MAX_SPAN_WORDS = 8
NEAR = 4  # words: a question word this close before or after a span "frames" it
WINDOW = 8  # words each side of a span that window_match counts
ALIGN = 4  # question words each side of its wh-phrase that wh_left / wh_right compare
_CUE_NAME = frozenset({"called", "named", "known", "as", "titled", "nicknamed", "dubbed"})
_CUE_PLACE = frozenset({"in", "at", "on", "from", "into", "near", "of"})
_CUE_AGENT = frozenset({"by", "with"})
_CUE_BE = frozenset({"is", "was", "are", "were", "became", "becomes"})

FEATURES: tuple[str, ...] = (
    "sentence_match",  # the sentence's match with the question / the best sentence's
    "best_sentence",  # it is the best-matching sentence
    "near",  # 1 / (1 + words to the nearest question word in the sentence)
    "framed_before",  # a question word within NEAR words before the span
    "framed_after",  # ... after it
    "sentence_order",  # 1 / (1 + the sentence's place in its text)
    "title_line",  # the span is a whole line of up to 8 words (a result's title)
    "latest_text",  # in the text read last
    "recurs",  # log(1 + other occurrences of the span in the texts)
    "one_word",
    "length",  # words / MAX_SPAN_WORDS
    "capitalised",  # every word a capital or a name link
    "lower_start",
    "has_digit",
    "number_word",
    "year",
    "time_word",
    "shape_name",  # a name asked and the span is capitalised
    "shape_number",  # a number asked and the span starts with one
    "shape_time",  # a time asked and the span starts with one
    "shape_plain_capitalised",  # a "what" question and a capitalised span
    "cue_name",
    "cue_place",
    "cue_agent",
    "cue_be",
    "sentence_start",  # the span opens its sentence (usually its subject, the topic)
    "ends_weak",  # the span ends with a short lower-case word
    "holds_question_word",  # a word of the span shares its stem with a question word
    "cuts_name",  # a capitalised word right before (not opening the sentence) or after it
    "function_word",  # the span starts or ends with a stopword ("A", "This", "In")
    "asked_noun",  # the noun the question asks for ("which river") is in or right after it
    "window_match",  # the question's words within WINDOW words of the span, IDF-weighted,
    #                  over the best sentence's match
    "wh_prev_word",  # the word before the span is the one before the question's wh-phrase
    #                  ("the tail of what animal" / "the tail of a fish"; articles skipped)
    "wh_left",  # share of the question's words just before its wh-phrase found just before
    #             the span
    "wh_right",  # share of the question's words just after its wh-phrase found just after it
)



def _load_weights() -> dict[str, float]:
    """The fitted weights shipped beside this module (``reader.json``, written by
    recipes/embedded/train_reader.py); a feature it does not name weighs nothing."""
    path = Path(__file__).with_name("reader.json")
    fitted = json.loads(path.read_text(encoding="utf-8"))["features"] if path.is_file() else {}
    return {name: float(fitted.get(name, 0.0)) for name in FEATURES}


WEIGHTS: Mapping[str, float] = _load_weights()


@dataclass(frozen=True, slots=True)
class Scored:
    """One candidate span (its words) and its reader score."""

    words: tuple[str, ...]
    score: float

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass(slots=True)
class _Sentence:
    words: list[str]  # stripped words
    keep: list[bool]  # may be part of an answer
    asked: list[bool]  # a question word (by stem)
    clause: list[int]  # clause number of each word
    order: int  # place in its text
    latest: bool
    line: bool  # the sentence is its whole line
    match: float = 0.0
    weights: list[float] = field(default_factory=list)  # each word's IDF weight if asked

def _sentence(text: str, exclude: frozenset[str], wanted: set[str], order: int,
              latest: bool, line: bool) -> _Sentence:
    s = _Sentence([], [], [], [], order, latest, line)
    for n, piece in enumerate(_CLAUSE_BREAK.split(text)):
        for raw in piece.split():
            word = clean_word(raw)
            if not word:
                continue
            lower = word.lower()
            s.words.append(word)
            s.keep.append(_ok_word(word) and not _echoes(lower, exclude))
            s.asked.append(len(lower) >= 3 and lower[:5] in wanted)
            s.clause.append(n)
    return s


def _sentences(texts: Sequence[str], question: str) -> list[_Sentence]:
    exclude = question_words(question)
    wanted = content_stems(question_query(question))
    out: list[_Sentence] = []
    for t, text in enumerate(texts):
        order = 0
        for line in text.splitlines():
            parts = split_sentences(line.strip())
            for part in parts:
                out.append(_sentence(part, exclude, wanted, order, t == len(texts) - 1,
                                     len(parts) == 1))
                order += 1
    stems = [{w.lower()[:5] for w in s.words if len(w) >= 3} & wanted for s in out]
    held = Counter(w for st in stems for w in st)
    n = max(len(out), 1)
    for s, st in zip(out, stems, strict=True):
        s.match = math.fsum(math.log(1 + n / held[w]) for w in st)
        s.weights = [math.log(1 + n / held[w.lower()[:5]]) if a and held[w.lower()[:5]] else 0.0
                     for w, a in zip(s.words, s.asked, strict=True)]
    return out


_ASKED = re.compile(r"\b(?:which|what)((?:\s+[A-Za-z'-]+){1,3})", re.IGNORECASE)
_ASKED_STOP = frozenset(
    "is are was were do does did has have had can could will would should may might of in on "
    "at to for by with from".split())


def _asked_noun(question: str) -> str:
    """The first five letters of the noun a "which/what N" question asks for, the last word
    before its verb or a preposition ("river" of "On the bank of which river does ...",
    "award" of "which humanitarian award did ..."), or "" ("what is": no noun; "what year":
    the shape says it)."""
    match = _ASKED.search(question)
    if match is None:
        return ""
    taken: list[str] = []
    for word in match.group(1).split():
        if word.lower() in _ASKED_STOP:
            break
        taken.append(word.lower())
    if not taken or taken[-1] in _QUERY_STOPWORDS or taken[-1] in ("year", "kind", "type"):
        return ""
    return taken[-1][:5]


_WH = frozenset({"what", "which", "who", "whom", "whose", "where", "when", "how"})
_ARTICLES = frozenset({"a", "an", "the"})


@dataclass(frozen=True, slots=True)
class _WhContext:
    """What surrounds a question's wh-phrase: the word right before it (articles skipped) and
    the stems of up to ALIGN content words before and after it."""

    prev: str = ""
    left: frozenset[str] = frozenset()
    right: frozenset[str] = frozenset()


def _wh_context(question: str) -> _WhContext:
    words = re.findall(r"[^\W_][\w'-]*", question)
    lower = [w.lower() for w in words]
    at = next((i for i, w in enumerate(lower) if w in _WH), None)
    if at is None:
        return _WhContext()
    end = at + 1
    if lower[at] in ("what", "which", "whose", "how"):  # "which river", "how many awards"
        while end < len(lower) and end - at <= 3 and lower[end] not in _ASKED_STOP:
            end += 1
    before = at - 1
    while before >= 0 and lower[before] in _ARTICLES:
        before -= 1

    def content(seq: Sequence[str]) -> list[str]:
        return [w[:5] for w in seq if len(w) >= 3 and w not in _QUERY_STOPWORDS]

    return _WhContext(lower[before] if before >= 0 else "",
                      frozenset(content(lower[:at])[-ALIGN:]),
                      frozenset(content(lower[end:])[:ALIGN]))


def _alignment(s: _Sentence, a: int, b: int, wh: _WhContext) -> dict[str, float]:
    """The wh-phrase features of the span ``s.words[a:b]`` (see :data:`FEATURES`)."""
    before = a - 1
    while before >= 0 and s.words[before].lower() in _ARTICLES:
        before -= 1
    prev = s.words[before].lower() if before >= 0 else ""
    left = {w.lower()[:5] for w in s.words[max(0, a - ALIGN - 1):a]}
    right = {w.lower()[:5] for w in s.words[b:b + ALIGN + 2]}
    return {
        "wh_prev_word": float(bool(wh.prev) and prev == wh.prev),
        "wh_left": len(wh.left & left) / len(wh.left) if wh.left else 0.0,
        "wh_right": len(wh.right & right) / len(wh.right) if wh.right else 0.0,
    }


def _window(s: _Sentence, a: int, b: int) -> float:
    """The IDF weight of the distinct question words within WINDOW words of ``[a, b)``."""
    seen: dict[str, float] = {}
    for p in (*range(max(0, a - WINDOW), a), *range(b, min(len(s.words), b + WINDOW))):
        if s.weights[p]:
            seen[s.words[p].lower()[:5]] = s.weights[p]
    return sum(seen.values())


def _capital(word: str) -> bool:
    return word[:1].isupper() and word.lower() not in _QUERY_STOPWORDS


def _shape_features(words: tuple[str, ...], shape: AnswerShape) -> dict[str, float]:
    first = words[0]
    capitalised = all(w[:1].isupper() or w[:1].isdigit() or w in _NAME_LINKS for w in words) \
        and first[:1].isupper()
    digit = any(c.isdigit() for c in first)
    number_word = first.lower() in _NUMBER_WORDS
    year = _YEAR_WORD.fullmatch(first) is not None
    time_word = first.lower() in _TIME_WORDS
    plain = not (shape.name or shape.number or shape.time)
    return {
        "capitalised": float(capitalised),
        "lower_start": float(first[:1].islower()),
        "has_digit": float(any(c.isdigit() for w in words for c in w)),
        "number_word": float(number_word),
        "year": float(year),
        "time_word": float(time_word),
        "shape_name": float(shape.name and capitalised),
        "shape_number": float(shape.number and (digit or number_word)),
        "shape_time": float(shape.time and (digit or time_word)),
        "shape_plain_capitalised": float(plain and capitalised),
    }


def candidates(
    texts: Sequence[str], question: str, *, max_words: int = MAX_SPAN_WORDS,
    weights: Mapping[str, float] | None = None,
) -> list[tuple[tuple[str, ...], dict[str, float]]]:
    """Every candidate span of ``texts`` with its features (see :data:`FEATURES`): a run of at
    most ``max_words`` words inside one clause, without the question's words, neither starting
    nor ending with a short lower-case word, not stopwords alone. A span found in several
    places keeps its best features (by ``weights``, default :data:`WEIGHTS`)."""
    shape = answer_shape(question)
    noun = _asked_noun(question)
    wh = _wh_context(question)
    sentences = _sentences(texts, question)
    best_match = max((s.match for s in sentences), default=0.0) or 1.0
    top = max(range(len(sentences)), key=lambda i: sentences[i].match, default=-1)
    counts: Counter[str] = Counter()
    found: dict[tuple[str, ...], dict[str, float]] = {}
    for i, s in enumerate(sentences):
        asked = [p for p, a in enumerate(s.asked) if a]
        n = len(s.words)
        for a in range(n):
            if not s.keep[a] or weak_word(s.words[a]):
                continue
            for b in range(a + 1, min(n, a + max_words) + 1):
                if not s.keep[b - 1] or s.clause[b - 1] != s.clause[a]:
                    break
                words = tuple(s.words[a:b])
                if all(w.lower() in _QUERY_STOPWORDS for w in words):  # "In", "This", "It"
                    continue
                counts[" ".join(words).lower()] += 1
                prev = s.words[a - 1].lower() if a else ""
                prev2 = s.words[a - 2].lower() if a > 1 else ""
                outside = [a - p if p < a else p - b + 1 for p in asked if not a <= p < b]
                dist = min(outside, default=None)
                f = {
                    "sentence_match": s.match / best_match,
                    "best_sentence": float(i == top),
                    "near": 0.0 if dist is None else 1.0 / (1 + dist),
                    "framed_before": float(any(a - NEAR <= p < a for p in asked)),
                    "framed_after": float(any(b <= p < b + NEAR for p in asked)),
                    "sentence_order": 1.0 / (1 + s.order),
                    "title_line": float(s.line and a == 0 and b == n and n <= max_words),
                    "latest_text": float(s.latest),
                    "one_word": float(b - a == 1),
                    "length": (b - a) / max_words,
                    "cue_name": float(prev in _CUE_NAME or prev2 == "known"),
                    "cue_place": float(prev in _CUE_PLACE),
                    "cue_agent": float(prev in _CUE_AGENT),
                    "cue_be": float(prev in _CUE_BE),
                    "sentence_start": float(a == 0),
                    "holds_question_word": float(any(s.asked[a:b])),
                    "cuts_name": float((a > 1 and _capital(s.words[a - 1]))
                                       or (b < n and _capital(s.words[b]))),
                    "asked_noun": float(bool(noun) and any(
                        w.lower().startswith(noun) for w in s.words[a:b + 1])),
                    "function_word": float(words[0].lower() in _QUERY_STOPWORDS
                                           or words[-1].lower() in _QUERY_STOPWORDS),
                    "ends_weak": float(weak_word(words[-1])),
                    "window_match": _window(s, a, b) / best_match,
                    **_alignment(s, a, b, wh),
                    **_shape_features(words, shape),
                }
                old = found.get(words)
                if old is None or _score(f, weights) > _score(old, weights):
                    found[words] = f
    out = []
    for words, f in found.items():
        f["recurs"] = math.log(counts[" ".join(words).lower()])
        out.append((words, f))
    return out


def _score(features: Mapping[str, float], weights: Mapping[str, float] | None = None) -> float:
    w = WEIGHTS if weights is None else weights
    return sum(w.get(k, 0.0) * v for k, v in features.items())


def rank_spans(
    texts: Sequence[str], question: str, k: int, *, max_words: int = MAX_SPAN_WORDS,
    weights: Mapping[str, float] | None = None,
) -> list[Scored]:
    """The ``k`` best candidate spans of ``texts`` for ``question``, best first (ties: the
    earlier found). Spans of the shape the question asks for come first when there are any
    (see :class:`~drvenus.small.spans.AnswerShape`)."""
    shape = answer_shape(question)
    found = candidates(texts, question, max_words=max_words, weights=weights)
    shaped = [c for c in found if shape.first(c[0][0])]
    pool = shaped or found
    scored = [Scored(words, _score(f, weights)) for words, f in pool]
    scored.sort(key=lambda s: -s.score)  # stable: reading order among equals
    return scored[:k]


ReaderName = Literal["linear", "neural"]
READERS: tuple[str, ...] = ("linear", "neural")


class ScoredSpan(Protocol):
    """A ranked span: its text and its reader score (higher is better; scores compare within
    one ranking only)."""

    @property
    def text(self) -> str: ...

    @property
    def score(self) -> float: ...


@runtime_checkable
class SpanReader(Protocol):
    """Ranks the spans of ``texts`` (what was read) as answers to ``question``, best first."""

    def rank(self, question: str, texts: Sequence[str], k: int = 10,
             max_words: int = MAX_SPAN_WORDS) -> Sequence[ScoredSpan]: ...


class LinearReader:
    """The linear reader (see the module doc) as a :class:`SpanReader`."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = weights

    def rank(self, question: str, texts: Sequence[str], k: int = 10,
             max_words: int = MAX_SPAN_WORDS) -> list[Scored]:
        return rank_spans(texts, question, k, max_words=max_words, weights=self.weights)


class ReaderUnavailableError(RuntimeError):
    """The reader the levers name cannot be loaded."""


@cache
def span_reader(name: ReaderName = "linear") -> SpanReader:
    """The reader called ``name`` (one per process): "linear", or "neural"
    (``drvenus.small.neural.NeuralReader``, imported now)."""
    if name == "linear":
        return LinearReader()
    if name != "neural":
        raise ValueError(f"unknown span reader {name!r}; choose from {', '.join(READERS)}")
    try:
        module = importlib.import_module("drvenus.small.neural")
    except ModuleNotFoundError as exc:
        if exc.name != "drvenus.small.neural":
            raise
        raise ReaderUnavailableError(
            "the neural span reader (drvenus.small.neural) is not in this install: "
            "use span_reader='linear'") from None
    return module.NeuralReader()


__all__ = [
    "FEATURES",
    "MAX_SPAN_WORDS",
    "READERS",
    "WEIGHTS",
    "LinearReader",
    "ReaderName",
    "ReaderUnavailableError",
    "Scored",
    "ScoredSpan",
    "SpanReader",
    "candidates",
    "rank_spans",
    "span_reader",
]
