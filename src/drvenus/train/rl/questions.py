"""The training questions of an RL run as ``(question, ground truth)`` rows, read with the one
question reader (:func:`drvenus.questions.read_questions`). No torch: the verl dry run converts
them to parquet."""

from __future__ import annotations

import logging
from pathlib import Path

from drvenus.protocol import ANSWER_SPLIT
from drvenus.questions import read_questions
from drvenus.train.rl.config import RLConfigError

log = logging.getLogger(__name__)


def question_rows(path: str | Path) -> list[tuple[str, str]]:
    """``(question, ground truth)`` rows of any question file with answers (RL-format parquet
    or JSONL, question/answer rows); accepted answers joined by ``<|answer_split|>``. Rows
    without both, or repeating an id, are skipped and counted."""
    report = read_questions(path, need_answer=True)
    if report.malformed or report.duplicates:
        log.warning("%s: %d row(s) without a question and an answer, %d repeated id(s), skipped",
                    path, report.malformed, report.duplicates)
    rows = [(q.question, ANSWER_SPLIT.join(q.answers)) for q in report.items]
    if not rows:
        raise RLConfigError(f"{path}: no rows with a question and a ground truth")
    return rows


__all__ = ["question_rows"]
