"""Stage 6 of ``drvenus data clean``, judge: the correctness filter (``off``, ``em``, ``f1`` or an
LLM ``judge`` through :mod:`drvenus.grading.judge`) over the valid rows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from drvenus.grading.judge import JudgeConfig, judge_many
from drvenus.net.urls import redact_url


@dataclass
class Correctness:
    """The outcome of stage 6: a keep flag per valid row, the ``correctness`` block of
    ``stats.json``, and the drop reasons it adds (``incorrect_answer``, ``judge_failed``)."""

    keep: list[bool]
    info: dict[str, Any]
    drops: Counter = field(default_factory=Counter)


def filter_correct(
    table: pa.Table,
    mode: str,
    *,
    f1_threshold: float,
    judge: JudgeConfig | None,
    keep_judge_failures: bool,
    default_cache: Path,
) -> Correctness:
    """Stage 6 over the valid rows (columns ``_answer``, ``_em``, ``_f1``, ``question``, ``gt``).

    ``off`` keeps every row; ``em`` rows whose answer matches exactly; ``f1`` rows with answer
    F1 >= ``f1_threshold``; ``judge`` exact matches and the rows the LLM judge calls correct
    (a failed judge call keeps the row only with ``keep_judge_failures``).
    """
    n = table.num_rows
    out = Correctness(keep=[True] * n, info={"mode": mode})
    if mode == "off":
        return out
    answers = table.column("_answer").to_pylist()
    failed = 0
    if mode == "em":
        out.keep = table.column("_em").to_pylist()
        correct = sum(out.keep)
    elif mode == "f1":
        out.info["f1_threshold"] = f1_threshold
        out.keep = [f >= f1_threshold for f in table.column("_f1").to_pylist()]
        correct = sum(out.keep)
    else:
        if judge is None:
            raise ValueError("correctness mode 'judge' needs a judge configuration")
        if judge.cache_path is None:
            judge = replace(judge, cache_path=default_cache)
        correct, failed = _judge_rows(table, answers, judge, keep_judge_failures, out)
    incorrect = n - correct - failed
    if incorrect:
        out.drops["incorrect_answer"] = incorrect
    out.info.update(checked=n, correct=correct, incorrect=incorrect,
                    no_answer=sum(1 for a in answers if not a), kept=sum(out.keep))
    return out


def _judge_rows(
    table: pa.Table, answers: list[str], cfg: JudgeConfig, keep_failures: bool, out: Correctness
) -> tuple[int, int]:
    """Judge mode: exact matches pass unasked, other answered rows go to the judge. Sets
    ``out.keep`` and the judge entries of ``out.info``; returns (correct, failed)."""
    n = table.num_rows
    ems = table.column("_em").to_pylist()
    questions = table.column("question").to_pylist()
    gts = table.column("gt").to_pylist()
    ask = [i for i in range(n) if answers[i] and not ems[i]]
    verdicts = judge_many([(questions[i], answers[i], gts[i]) for i in ask], cfg)
    out.keep = [bool(answers[i]) and bool(ems[i]) for i in range(n)]
    correct = sum(out.keep)
    failed = 0
    for i, v in zip(ask, verdicts, strict=True):
        if v.correct is None:
            failed += 1
            out.keep[i] = keep_failures
        else:
            out.keep[i] = v.correct
            correct += v.correct
    out.info.update(
        judge_model=cfg.model,
        judge_calls=sum(1 for v in verdicts if not v.cached),
        judge_cached=sum(1 for v in verdicts if v.cached),
        judge_failed=failed,
        judge_failures_kept=keep_failures,
    )
    if failed and not keep_failures:
        out.drops["judge_failed"] = failed
    if ask and failed * 2 > len(ask):  # an outage, not a few hard rows: say so, write nothing
        errors = [v.error for v in verdicts if v.correct is None and v.error]
        raise JudgeOutage(
            f"the judge ({cfg.model} at {redact_url(cfg.base_url)}) failed on {failed} of "
            f"{len(ask)} rows it was asked about (last error: {errors[-1] if errors else '?'}); "
            "nothing was written. Check the judge and rerun (its verdicts so far are cached)"
        )
    return correct, failed


class JudgeOutage(ValueError):
    """Most judge calls of a run failed: the run stops (one error line, exit 2) instead of
    writing a gutted dataset."""
