"""Answer correctness: SQuAD-style exact match and token F1 against one or more accepted answers.

Ground truth may list several accepted answers joined by ``protocol.ANSWER_SPLIT``; a prediction is
scored against each and the best score counts.

Two rule sets (:class:`MatchRules`), chosen per benchmark by its grader: ``SQUAD`` (the default)
and ``HOTPOTQA``, HotpotQA's official EM / F1. Both normalise alike (lower case, no punctuation, no
articles a/an/the, white space collapsed) and agree on exact match; HotpotQA's F1 gives no partial
credit when either side is a closed answer (yes, no, noanswer) and the two differ, and none when
either side is empty.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

from drvenus.protocol import ANSWER_SPLIT

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


@dataclass(frozen=True)
class MatchRules:
    """How a normalised prediction is scored against a normalised answer. ``closed``: answers
    that earn F1 only when matched exactly (a "yes" shares no credit with "yes it is");
    ``empty_f1``: the F1 of an empty prediction against an empty answer."""

    name: str
    closed: frozenset[str] = frozenset()
    empty_f1: float = 1.0


SQUAD = MatchRules("squad")
HOTPOTQA = MatchRules("hotpotqa", closed=frozenset({"yes", "no", "noanswer"}), empty_f1=0.0)


def accepted_answers(gt: str) -> list[str]:
    """The accepted answers in a ground-truth string (empty parts removed)."""
    parts = [p.strip() for p in gt.split(ANSWER_SPLIT)]
    return [p for p in parts if p] or [gt.strip()]


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation and the articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gt: str) -> bool:
    """Normalised prediction equals some normalised accepted answer (under every rule set)."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in accepted_answers(gt))


def _f1(pred: str, gold: str, rules: MatchRules) -> float:
    """Token F1 of two normalised texts under ``rules``."""
    if pred != gold and (pred in rules.closed or gold in rules.closed):
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    if not pred_tokens or not gold_tokens:
        return rules.empty_f1 if pred_tokens == gold_tokens else 0.0
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, gt: str, rules: MatchRules = SQUAD) -> float:
    """Best token F1 of the normalised prediction over the accepted answers."""
    pred = normalize_answer(prediction)
    return max(_f1(pred, normalize_answer(a), rules) for a in accepted_answers(gt))
