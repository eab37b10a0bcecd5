"""Answer correctness: SQuAD-style exact match and token F1 against one or more accepted answers.

Ground truth may list several accepted answers joined by ``protocol.ANSWER_SPLIT``; a prediction is
scored against each and the best score counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from drvenus.protocol import ANSWER_SPLIT

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


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
    """Normalised prediction equals some normalised accepted answer."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in accepted_answers(gt))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, gt: str) -> float:
    """Best token F1 of the normalised prediction over the accepted answers."""
    pred = normalize_answer(prediction).split()
    return max(_f1(pred, normalize_answer(a).split()) for a in accepted_answers(gt))
