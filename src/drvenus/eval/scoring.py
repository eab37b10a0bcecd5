"""Deterministic scorers: GAIA's normalised match, exact match, token F1, set-answer matching.

Exact match and F1 come from the grading library (:mod:`drvenus.grading.match`).
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from drvenus.grading.match import SQUAD, MatchRules, exact_match, f1_score, normalize_answer
from drvenus.protocol import ANSWER_SPLIT

_LIST_SEPARATORS = re.compile(r"[,;]")
_ASCII_PUNCT = frozenset(string.punctuation)  # what GAIA's official scorer removes
_ALL_PUNCT = _ASCII_PUNCT | {"，", "。", "；", "：", "、", "！", "？", "（", "）"}


def _joined(answers: Sequence[str] | str) -> str:
    return answers if isinstance(answers, str) else ANSWER_SPLIT.join(answers)


def em(prediction: str, answers: Sequence[str] | str) -> bool:
    """SQuAD-style exact match against any accepted answer."""
    return bool(prediction) and exact_match(prediction, _joined(answers))


def f1(prediction: str, answers: Sequence[str] | str, rules: MatchRules = SQUAD) -> float:
    """Best token F1 over the accepted answers (SQuAD's rules unless told)."""
    return f1_score(prediction or "", _joined(answers), rules)


# ---------------------------------------------------------------------------- GAIA
def parse_number(text: str) -> float | None:
    """A number written with optional ``$``, ``%`` and thousands commas; None otherwise."""
    cleaned = text.replace("$", "").replace("%", "").replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def squash(text: str, *, keep_punctuation: bool = False,
           punctuation: frozenset[str] | set[str] = _ALL_PUNCT) -> str:
    """Lower case, every white-space character removed, ``punctuation`` removed unless kept."""
    text = "".join(text.split()).lower()
    if keep_punctuation:
        return text
    return "".join(c for c in text if c not in punctuation)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def gaia_match(prediction: str, truth: str) -> bool:
    """GAIA's normalised match, as the official scorer defines it:

    - a numeric truth: the prediction, stripped of ``$``, ``%`` and commas, is the same number;
    - a truth containing ``,`` or ``;``: a list of the same length whose elements match in order
      (numbers as numbers, others as strings, punctuation kept);
    - otherwise the strings are equal once lower-cased, without white space and ASCII
      punctuation (``string.punctuation``: CJK and full-width marks stay, as they do there).
    """
    prediction = prediction if isinstance(prediction, str) else str(prediction)
    truth = str(truth).strip()
    if _is_number(truth):  # a prediction that is no number reads as inf, as it does there
        value = parse_number(prediction)
        return (math.inf if value is None else value) == float(truth)
    if _LIST_SEPARATORS.search(truth):
        gold = [t.strip() for t in _LIST_SEPARATORS.split(truth)]
        got = [p.strip() for p in _LIST_SEPARATORS.split(prediction)]
        if len(gold) != len(got):
            return False
        for g, p in zip(gold, got, strict=True):
            if _is_number(g):
                value = parse_number(p)
                if (math.inf if value is None else value) != float(g):
                    return False
            elif squash(p, keep_punctuation=True) != squash(g, keep_punctuation=True):
                return False
        return True
    return squash(prediction, punctuation=_ASCII_PUNCT) == squash(truth, punctuation=_ASCII_PUNCT)


def gaia_score(prediction: str, answers: Sequence[str] | str) -> bool:
    """:func:`gaia_match` against any accepted answer."""
    golds = answers.split(ANSWER_SPLIT) if isinstance(answers, str) else answers
    return bool(prediction) and any(gaia_match(prediction, g) for g in golds)


# ---------------------------------------------------------------------------- short answers
def loose_equal(prediction: str, answers: Sequence[str] | str) -> bool:
    """Equal after Unicode NFKC, lower case, and removing white space and punctuation (the
    exact-match short-cut of the xbench judge; also right for CJK text)."""
    golds = answers.split(ANSWER_SPLIT) if isinstance(answers, str) else answers
    got = squash(unicodedata.normalize("NFKC", prediction or ""))
    return bool(got) and any(got == squash(unicodedata.normalize("NFKC", g)) for g in golds)


# ---------------------------------------------------------------------------- set answers
_SET_SEPARATORS = re.compile(r"[,;\n，；、]")
_LEADING_AND = re.compile(r"^(?:and|&)\s+", re.IGNORECASE)


def split_set(text: str) -> list[str]:
    """The items of a set answer written as a comma/semicolon/line separated list (a leading
    "and" of the last item is dropped; "and" inside an item, as in "Trinidad and Tobago", stays)."""
    parts = (_LEADING_AND.sub("", p.strip(" \t-*•.")) for p in _SET_SEPARATORS.split(text or ""))
    return [p for p in parts if p]


@dataclass(frozen=True)
class SetScore:
    """A set answer against the gold set: items found, extra items, and the item-level scores."""

    gold: int
    found: int
    extra: int

    @property
    def precision(self) -> float:
        given = self.found + self.extra
        return self.found / given if given else 0.0

    @property
    def recall(self) -> float:
        return self.found / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def fully_correct(self) -> bool:
        """Every gold item and nothing else."""
        return self.gold > 0 and self.found == self.gold and self.extra == 0


def set_score(prediction: str, truth: str) -> SetScore:
    """Match the predicted items to the gold items by normalised text (one to one)."""
    gold = [normalize_answer(g) for g in split_set(truth)]
    got = [normalize_answer(p) for p in split_set(prediction)]
    unmatched = list(gold)
    found = 0
    for item in got:
        if item in unmatched:
            unmatched.remove(item)
            found += 1
    return SetScore(gold=len(gold), found=found, extra=len(got) - found)


__all__ = [
    "SetScore",
    "em",
    "f1",
    "gaia_match",
    "gaia_score",
    "loose_equal",
    "parse_number",
    "set_score",
    "split_set",
    "squash",
]
