"""Evaluation metrics over graded (item, run) results: Avg@k, best Pass@1, unbiased Pass@k,
majority vote, HLE-style calibration error, DeepSearchQA set scores, a benchmark's own EM and F1
(HotpotQA) with their intervals, per-level accuracy, the
termination histogram, tool calls / tokens / wall time per question and, for local corpora, the
recall of gold paragraphs among the documents the agent retrieved or visited.

A judge error (``correct is None``: no verdict could be had) counts as wrong in every accuracy,
as the official graders count a missing verdict, and is counted on its own beside it (a rerun
of ``eval`` asks the judge again).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from drvenus.agent.record import FAILED_TERMINATIONS
from drvenus.corpus.urls import url_key
from drvenus.grading.match import normalize_answer
from drvenus.protocol import (
    classify_tool_response,
    parse_search_body,
    parse_turn,
    repair_turn,
    unwrap_tool_response,
)


@dataclass
class RunResult:
    """One graded (item, run): the outcome and what it cost."""

    item_id: str
    run: int
    correct: bool | None
    prediction: str = ""
    termination: str = "answered"
    turns: int = 0
    search_calls: int = 0
    visit_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed: float = 0.0
    score: float | None = None
    confidence: float | None = None
    level: str | None = None
    is_set: bool = False
    recall_visited: float | None = None
    recall_retrieved: float | None = None
    grade: dict[str, Any] = field(default_factory=dict)

    @property
    def tool_calls(self) -> int:
        return self.search_calls + self.visit_calls

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- trajectories
@dataclass
class ToolUse:
    """The tool calls of one trajectory and the URLs they touched."""

    search_calls: int = 0
    visit_calls: int = 0
    visited: list[str] = field(default_factory=list)
    retrieved: list[str] = field(default_factory=list)


def tool_use(messages: Sequence[dict[str, Any]]) -> ToolUse:
    """Count the search and visit calls of a trajectory (its assistant turns) and collect the
    URLs visited (call arguments) and retrieved (search results)."""
    use = ToolUse()
    for msg in messages:
        content = msg.get("content") or ""
        if msg.get("role") == "assistant":
            turn = parse_turn(repair_turn(content))
            call = turn.tool_call
            if call is None:
                continue
            if call.name == "search":
                use.search_calls += 1
            elif call.name == "visit":
                use.visit_calls += 1
                urls = call.arguments.get("url") or []
                use.visited.extend([urls] if isinstance(urls, str) else urls)
        elif msg.get("role") == "user" and classify_tool_response(content) == "search":
            for entry in parse_search_body(unwrap_tool_response(content) or "") or []:
                use.retrieved.extend(h["url"] for h in entry["web_page_info_list"])
    return use


def gold_recall(gold_urls: Iterable[str], urls: Iterable[str]) -> float | None:
    """The share of gold documents among ``urls`` (URLs compared by their canonical key)."""
    gold = {url_key(u) or u for u in gold_urls}
    if not gold:
        return None
    seen = {url_key(u) or u for u in urls}
    return len(gold & seen) / len(gold)


# ---------------------------------------------------------------------------- formulas
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from ``n`` samples with ``c`` correct: 1 - C(n-c, k) / C(n, k)."""
    if k > n or n <= 0:
        raise ValueError(f"pass@k needs 1 <= k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def accuracy(flags: Iterable[bool | None]) -> float | None:
    """Share of True among the flags (None, a judge error, counts as wrong); None if empty."""
    values = list(flags)
    return sum(bool(f) for f in values) / len(values) if values else None


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """Wilson score interval of a proportion (95% for ``z`` = 1.96); ``successes`` may be
    fractional (a mean over runs per item, summed over items)."""
    if n <= 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def item_means(results: Iterable[RunResult], value: Callable[[RunResult], float]) -> list[float]:
    """Each item's mean of ``value`` over its runs."""
    per_item: dict[str, list[float]] = defaultdict(list)
    for r in results:
        per_item[r.item_id].append(value(r))
    return [statistics.fmean(v) for v in per_item.values()]


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% Wilson interval of the mean of per-item values in [0, 1] (a share of correct runs,
    or an F1): the Wilson interval assumes the variance p(1-p), the largest any [0, 1] value
    with mean p can have, so for graded scores it errs wide."""
    return wilson_interval(sum(values), len(values))


def item_interval(results: Iterable[RunResult]) -> tuple[float, float] | None:
    """95% Wilson interval of the accuracy over items (each item's share of correct runs):
    how far the Avg@k of another draw of as many questions may lie."""
    return mean_interval(item_means(results, lambda r: float(bool(r.correct))))  # error: wrong


def calibration_error(
    confidences: Sequence[float], correct: Sequence[bool], bin_size: int = 100,
    *, skip_last: bool = False,
) -> float | None:
    """HLE-style RMS calibration error: sort by confidence (0-100), cut into bins of
    ``bin_size`` (the last bin takes the remainder), and take the root of the size-weighted mean
    squared gap between mean confidence and accuracy per bin. None when n < ``bin_size``. (HLE's
    reference code skips its last bin, ``skip_last``; by default every bin counts.)"""
    n = len(confidences)
    if n != len(correct):
        raise ValueError("confidences and correct differ in length")
    if n < bin_size:
        return None
    pairs = sorted(zip((c / 100.0 for c in confidences), correct, strict=True))
    starts = list(range(0, (n // bin_size) * bin_size, bin_size))
    total = 0.0
    for i, start in enumerate(starts):
        if skip_last and i == len(starts) - 1:
            break
        end = n if i == len(starts) - 1 else start + bin_size
        chunk = pairs[start:end]
        gap = statistics.fmean(c for c, _ in chunk) - statistics.fmean(float(k) for _, k in chunk)
        total += len(chunk) / n * gap * gap
    return math.sqrt(total)


def majority_vote(results: Iterable[RunResult]) -> float | None:
    """Accuracy of the most frequent (normalised) prediction per item across runs; a tie goes to
    the earliest run's answer (an ungraded one counts as wrong)."""
    by_item: dict[str, list[RunResult]] = defaultdict(list)
    for r in results:
        by_item[r.item_id].append(r)
    flags: list[bool | None] = []
    for rows in by_item.values():
        rows.sort(key=lambda r: r.run)
        keys = [normalize_answer(r.prediction) for r in rows]
        counts = Counter(keys)
        best = max(counts.values())
        chosen = next(k for k in keys if counts[k] == best)
        flags.append(next(r.correct for r, k in zip(rows, keys, strict=True) if k == chosen))
    return accuracy(flags)


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def cost_summary(rows: Sequence[RunResult]) -> dict[str, float | None]:
    """Mean tool calls, tokens, turns and seconds per question."""
    return {
        "search_calls": _mean(r.search_calls for r in rows),
        "visit_calls": _mean(r.visit_calls for r in rows),
        "tool_calls": _mean(r.tool_calls for r in rows),
        "turns": _mean(r.turns for r in rows),
        "prompt_tokens": _mean(r.prompt_tokens for r in rows),
        "completion_tokens": _mean(r.completion_tokens for r in rows),
        "tokens": _mean(r.tokens for r in rows),
        "seconds": _mean(r.elapsed for r in rows),
    }


# ---------------------------------------------------------------------------- the summary
def per_run_accuracy(results: Iterable[RunResult]) -> dict[int, float | None]:
    by_run: dict[int, list[bool | None]] = defaultdict(list)
    for r in results:
        by_run[r.run].append(r.correct)
    return {run: accuracy(flags) for run, flags in sorted(by_run.items())}


def pass_at_k_curve(results: Iterable[RunResult]) -> dict[int, float]:
    """Mean unbiased Pass@k over items, for k = 1 .. the fewest runs of any item (a judge error
    counts as a wrong run)."""
    per_item: dict[str, list[bool]] = defaultdict(list)
    for r in results:
        per_item[r.item_id].append(bool(r.correct))
    if not per_item:
        return {}
    k_max = min(len(v) for v in per_item.values())
    return {
        k: statistics.fmean(pass_at_k(len(v), sum(v), k) for v in per_item.values())
        for k in range(1, k_max + 1)
    }


def _set_metrics(rows: Sequence[RunResult]) -> dict[str, Any] | None:
    sets = [r for r in rows if r.is_set]
    if not sets:
        return None
    return {"items": len(sets), "fully_correct": accuracy(r.correct for r in sets),
            "item_f1": _mean(r.score for r in sets)}


def _dsqa_official(rows: Sequence[RunResult]) -> dict[str, Any] | None:
    """DeepSearchQA's starter metrics over every row graded by it (Single and Set answers): the
    means of fully correct, correct with excessive answers, fully incorrect, precision, recall
    and F1 (a row without a verdict or with a judge error counts 0 in each), and fully correct
    per answer type."""
    graded = [r for r in rows if r.grade.get("grader") == "deepsearchqa"]
    if not graded:
        return None

    def one(r: RunResult) -> dict[str, float]:
        gold, found, extra = (r.grade.get(k) for k in ("gold_items", "found_items",
                                                        "extra_items"))
        if gold is None or found is None or extra is None:
            return dict.fromkeys(("fully_correct", "correct_with_excessive", "fully_incorrect",
                                  "precision", "recall", "f1"), 0.0)
        all_found = gold == 0 or found == gold
        precision = found / (found + extra) if found + extra else 0.0
        recall = found / gold if gold else 0.0
        return {"fully_correct": float(bool(r.correct)),
                "correct_with_excessive": float(all_found and extra > 0),
                "fully_incorrect": float(gold > 0 and found == 0),
                "precision": precision, "recall": recall,
                "f1": 2 * precision * recall / (precision + recall) if precision + recall
                else 0.0}

    per = [one(r) for r in graded]
    out: dict[str, Any] = {"rows": len(graded)}
    for key in per[0]:
        out[key] = statistics.fmean(p[key] for p in per)
    out["fully_correct_by_type"] = {
        kind: accuracy(r.correct for r in graded if r.is_set is is_set)
        for kind, is_set in (("set", True), ("single", False))
        if any(r.is_set is is_set for r in graded)
    }
    return out


def _exact_f1(rows: Sequence[RunResult]) -> dict[str, Any] | None:
    """The benchmark's own EM and token F1 (graders that record ``exact``, e.g. HotpotQA's
    official rules), each the mean over items of the mean over runs, with a 95% interval."""
    graded = [r for r in rows if r.grade.get("exact") is not None]
    if not graded:
        return None
    em = item_means(graded, lambda r: float(r.grade["exact"]))
    f1 = item_means(graded, lambda r: r.score or 0.0)
    return {"items": len(em), "em": statistics.fmean(em), "em_ci95": mean_interval(em),
            "f1": statistics.fmean(f1), "f1_ci95": mean_interval(f1)}


def _per_level(rows: Sequence[RunResult]) -> dict[str, Any] | None:
    levels: dict[str, list[RunResult]] = defaultdict(list)
    for r in rows:
        if r.level is not None:
            levels[r.level].append(r)
    if not levels:
        return None
    return {
        lv: {"n": len({r.item_id for r in rs}), "avg_at_k": _mean(per_run_accuracy(rs).values()),
             "ci95_items": item_interval(rs)}
        for lv, rs in sorted(levels.items())
    }


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """Every metric of the report, as plain JSON-ready values."""
    runs = per_run_accuracy(results)
    run_values = [v for v in runs.values() if v is not None]
    confident = [r for r in results if r.confidence is not None and r.correct is not None]
    hle_official = any(r.grade.get("grader") == "hle" for r in results)
    correct_rows = [r for r in results if r.correct]
    elapsed = [r.elapsed for r in results]
    return {
        "items": len({r.item_id for r in results}),
        "rows": len(results),
        "runs": len(runs),
        "judge_errors": sum(r.correct is None for r in results),
        # runs that failed (llm_error, tool_error, exception): in every accuracy, as wrong
        "failed_runs": sum(r.termination in FAILED_TERMINATIONS for r in results),
        "no_verdict": sum(r.grade.get("method") == "official-no-verdict" for r in results),
        "per_run": {str(k): v for k, v in runs.items()},
        "avg_at_k": _mean(run_values),
        "std_at_k": statistics.pstdev(run_values) if len(run_values) > 1 else 0.0,
        "ci95_items": item_interval(results),
        "best_pass_at_1": max(run_values) if run_values else None,
        "pass_at_k": {str(k): v for k, v in pass_at_k_curve(results).items()},
        "majority_vote": majority_vote(results),
        "mean_score": _mean(r.score for r in results),
        "calibration_error": calibration_error(
            [r.confidence for r in confident], [bool(r.correct) for r in confident],  # type: ignore[misc]
            skip_last=hle_official,
        ),
        "calibration_n": len(confident),
        "deepsearchqa": _set_metrics(results),
        "deepsearchqa_official": _dsqa_official(results),
        "exact_f1": _exact_f1(results),
        "per_level": _per_level(results),
        "terminations": dict(Counter(r.termination for r in results).most_common()),
        "cost_all": cost_summary(results),
        "cost_correct": cost_summary(correct_rows),
        "wall_seconds": {"total": sum(elapsed), "mean": _mean(elapsed),
                         "median": statistics.median(elapsed) if elapsed else None},
        "recall": {"visited": _mean(r.recall_visited for r in results),
                   "retrieved": _mean(r.recall_retrieved for r in results)},
    }


__all__ = [
    "RunResult",
    "ToolUse",
    "accuracy",
    "calibration_error",
    "cost_summary",
    "gold_recall",
    "item_interval",
    "item_means",
    "majority_vote",
    "mean_interval",
    "pass_at_k",
    "pass_at_k_curve",
    "per_run_accuracy",
    "summarize",
    "tool_use",
    "wilson_interval",
]
