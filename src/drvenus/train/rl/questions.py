"""The training questions of an RL run (no torch: the verl dry run converts them to parquet)."""

from __future__ import annotations

from pathlib import Path

from drvenus.protocol import ANSWER_SPLIT
from drvenus.train.rl.config import RLConfigError


def read_questions(path: str | Path) -> list[tuple[str, str]]:
    """``(question, ground truth)`` rows: RL-format parquet / JSONL (``prompt``,
    ``reward_model.ground_truth``) or question/answer columns; accepted answers joined by
    ``<|answer_split|>``. Rows without both are skipped and counted."""
    from drvenus.eval.benchmarks import load_generic

    items = load_generic(Path(path))
    rows = [(it.question, ANSWER_SPLIT.join(it.answers)) for it in items if it.answers]
    if not rows:
        raise RLConfigError(f"{path}: no rows with a question and a ground truth")
    return rows


__all__ = ["read_questions"]
