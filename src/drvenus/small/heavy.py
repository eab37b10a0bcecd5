"""Heavy mode for the small agent: the synthesis turn chooses among the runs' answers, and the
reader's score of each run's answer in the evidence that run read is a signal the plain vote
lacks.

A 135M model asked to synthesise copies spans of the synthesis prompt ("Researcher 1"), so its
turn may only be one of the runs' answers (:func:`ranked_answers`, the synthesis grammar's
choices: the original question is the question). :func:`evidence_scores` scores each run's
answer with the levers' reader over the texts that run read (its search results and pages):
an answer the run's own evidence supports scores high, a span picked from a poor reading low;
:mod:`drvenus.agent.heavy` breaks a tie of the vote with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from drvenus.grading.match import normalize_answer
from drvenus.protocol.state import RunAnswer, TurnState
from drvenus.small.levers import Levers
from drvenus.small.reader import SpanReader, span_reader

# spans of a run's evidence the reader ranks when it looks for the run's answer among them
RANKED = 10_000


def answer_score(reader: SpanReader, question: str, read: Sequence[str], answer: str,
                 max_words: int) -> float:
    """The reader's score of ``answer`` among the spans of ``read`` (-inf: not one of them)."""
    wanted = normalize_answer(answer)
    if not wanted or not read:
        return -math.inf
    for span in reader.rank(question, read, RANKED, max_words=max_words):
        if normalize_answer(span.text) == wanted:
            return float(span.score)
    return -math.inf


def evidence_scores(question: str, runs: Sequence[RunAnswer], levers: Levers) -> list[float]:
    """Each run's answer scored by the levers' reader in the texts that run read."""
    reader = span_reader(levers.span_reader)
    return [answer_score(reader, question, run.read, run.answer, levers.max_span_words)
            for run in runs]


def evidence_scorer(levers: Levers) -> Callable[[str, Sequence[RunAnswer]], list[float]]:
    """:func:`evidence_scores` under ``levers``, as Heavy mode's tie-break
    (:class:`drvenus.agent.heavy.HeavyPolicy`'s ``scorer``)."""

    def score(question: str, runs: Sequence[RunAnswer]) -> list[float]:
        return evidence_scores(question, runs, levers)

    return score


def ranked_answers(state: TurnState, levers: Levers) -> tuple[str, ...]:
    """The runs' distinct answers (each as the first run wrote it), most votes first, then by
    the reader's best score of each in its runs' evidence: the synthesis turn's choices."""
    runs = [r for r in state.answers if normalize_answer(r.answer)]
    scores = evidence_scores(state.question, runs, levers)
    best: dict[str, tuple[int, float, int, str]] = {}
    for i, (run, score) in enumerate(zip(runs, scores, strict=True)):
        key = normalize_answer(run.answer)
        votes, top, first, text = best.get(key, (0, -math.inf, i, run.answer))
        best[key] = (votes + 1, max(top, score), first, text)
    order = sorted(best.values(), key=lambda v: (-v[0], -v[1], v[2]))
    return tuple(text for _, _, _, text in order)


__all__ = ["answer_score", "evidence_scorer", "evidence_scores", "ranked_answers"]
