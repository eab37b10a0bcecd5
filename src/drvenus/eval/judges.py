"""Graders per benchmark: an LLM judge when one is configured, else a deterministic scorer.

The judge endpoint, its retries and its verdict cache are the data pipeline's
(:class:`drvenus.grading.judge.JudgeClient`). A reply that cannot be parsed is asked again; one that
still cannot, or a judge that cannot be reached, grades ``correct=None`` (a judge error, never a
wrong answer). The cache keeps a short canonical verdict (no reasoning, no ground truth), read back
by the same parser.

- ``browsecomp`` (and ``hle``): HLE-style (extract the final answer, judge equivalence only,
  ``correct: yes/no``, confidence); EM without a judge.
- ``xbench``: its Chinese judge (最终答案 / 解释 / 结论: 正确/错误) after an exact-match
  short-cut; the loose exact match without a judge.
- ``gaia``: the normalised-match scorer, then an equivalence judge for misses.
- ``deepsearchqa``: Set answers get one mark per gold item plus a count of extra items (fully
  correct = all items, no extras; item F1); Single answers as ``qa``.
- ``qa``: exact match, then an equivalence judge; EM (and F1) without a judge.
- ``hotpotqa``: as ``qa`` under HotpotQA's official EM / F1 rules
  (:data:`drvenus.grading.match.HOTPOTQA`); its EM is recorded apart from the verdict.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from drvenus.eval.benchmarks import EvalItem, is_set_answer
from drvenus.eval.scoring import (
    SetScore,
    em,
    f1,
    gaia_score,
    loose_equal,
    set_score,
    split_set,
)
from drvenus.grading.judge import JudgeClient
from drvenus.grading.match import HOTPOTQA, SQUAD, MatchRules
from drvenus.protocol.legacy import strip_thinking


@dataclass(frozen=True)
class Grade:
    """One graded answer. ``correct`` None: the judge failed (an error, not a wrong answer).
    ``score``: token F1, or item F1 for set answers; ``confidence``: 0-100 as the judge read it;
    ``exact``: the benchmark's exact match where it reports one apart from the verdict."""

    correct: bool | None
    method: str
    score: float | None = None
    confidence: float | None = None
    extracted: str | None = None
    gold_items: int | None = None
    found_items: int | None = None
    extra_items: int | None = None
    error: str | None = None
    grader: str | None = None  # the official grader that graded it (``--grader official``)
    exact: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# ---------------------------------------------------------------------------- verdict parsing
_MARKUP = str.maketrans("", "", "*`\"'[]")
_YES = {"yes", "true", "correct"}
_LINE_VERDICT = re.compile(r"^(?:is_)?correct\s*[:：=]\s*(yes|no|true|false|correct|incorrect)\b")
_ANY_VERDICT = re.compile(r"\bcorrect\s*[:：=]\s*(yes|no|true|false)\b")
_CONFIDENCE = re.compile(r"^confidence\s*[:：=]\s*(\d+(?:\.\d+)?)\s*(%?)")
_EXTRACTED = re.compile(r"^extracted_final_answer\s*[:：=]\s*(.*)$")
# lines that quote the response or the truth: a verdict is never read from them
_QUOTING = ("extracted_final_answer", "correct_answer", "question", "response")


def _clean(line: str) -> str:
    """A line without markdown emphasis, quotes and list/heading markers, lower-cased."""
    return line.translate(_MARKUP).strip().lstrip("#>-•+ \t").strip().lower()


def _lines(reply: str) -> list[str]:
    return [_clean(x) for x in strip_thinking(reply or "").splitlines() if x.strip()]


def parse_yes_no(reply: str) -> bool | None:
    """The ``correct: yes|no`` verdict: the last line that starts with it (after markdown such as
    ``**correct:** yes``), else the last such field inside a line that does not quote the
    extracted answer or the truth; None when there is none."""
    lines = _lines(reply)
    for line in reversed(lines):
        m = _LINE_VERDICT.match(line)
        if m:
            return m.group(1) in _YES
    for line in reversed(lines):
        if line.startswith(_QUOTING):
            continue
        hits = _ANY_VERDICT.findall(line)
        if hits:
            return hits[-1] in _YES
    return None


def parse_confidence(reply: str) -> float | None:
    """``confidence: 85%`` as 85.0 (a bare fraction such as 0.85 also reads as 85)."""
    for line in reversed(_lines(reply)):
        m = _CONFIDENCE.match(line)
        if m:
            value = float(m.group(1))
            if not m.group(2) and "." in m.group(1) and value <= 1.0:
                value *= 100
            return max(0.0, min(100.0, value))
    return None


def parse_extracted(reply: str) -> str | None:
    for raw in strip_thinking(reply or "").splitlines():
        m = _EXTRACTED.match(_clean(raw))
        if m:
            text = raw.translate(str.maketrans("", "", "*`")).split(":", 1)[-1].strip()
            return None if text.lower() in ("none", "") else text
    return None


def parse_hle(reply: str) -> dict[str, Any] | None:
    """An HLE-style verdict: ``correct``, ``confidence`` and ``extracted``; None if no verdict."""
    correct = parse_yes_no(reply)
    if correct is None:
        return None
    return {"correct": correct, "confidence": parse_confidence(reply),
            "extracted": parse_extracted(reply)}


def render_hle(verdict: dict[str, Any]) -> str:
    """The canonical text of a verdict (what the cache keeps); :func:`parse_hle` reads it."""
    lines = [f"extracted_final_answer: {verdict.get('extracted') or 'None'}",
             f"correct: {'yes' if verdict['correct'] else 'no'}"]
    if verdict.get("confidence") is not None:
        lines.append(f"confidence: {verdict['confidence']:g}%")
    return "\n".join(lines)


_XB_VERDICT = re.compile(
    r"^(?:结论|判断|conclusion)\s*[:：]?\s*(正确|错误|不正确|correct|incorrect)"
)


def parse_xbench(reply: str) -> dict[str, Any] | None:
    """xbench's ``结论: 正确/错误`` (the last such line); falls back to ``correct: yes/no``."""
    for line in reversed(_lines(reply)):
        m = _XB_VERDICT.match(line)
        if m:
            return {"correct": m.group(1) in ("正确", "correct")}
    correct = parse_yes_no(reply)
    return None if correct is None else {"correct": correct}


def render_xbench(verdict: dict[str, Any]) -> str:
    return f"结论: {'正确' if verdict['correct'] else '错误'}"


_ITEM = re.compile(r"^item\s*#?\s*(\d+)\s*[:：=]\s*(yes|no|found|missing|true|false)\b")
_EXTRA = re.compile(r"^extra(?:neous)?(?:[ _]items)?\s*[:：=]\s*(\d+)")


def parse_set_marks(reply: str, n: int) -> dict[str, Any] | None:
    """``item k: yes|no`` for every k in 1..n and ``extra: N``; None unless all are there."""
    marks: dict[int, bool] = {}
    extra = None
    for line in _lines(reply):
        if m := _ITEM.match(line):
            marks[int(m.group(1))] = m.group(2) in ("yes", "found", "true")
        elif m := _EXTRA.match(line):
            extra = int(m.group(1))
    if extra is None or any(k not in marks for k in range(1, n + 1)):
        return None
    return {"found": [marks[k] for k in range(1, n + 1)], "extra": extra}


def render_set_marks(verdict: dict[str, Any]) -> str:
    lines = [f"item {k}: {'yes' if ok else 'no'}" for k, ok in enumerate(verdict["found"], 1)]
    return "\n".join([*lines, f"extra: {verdict['extra']}"])


# ---------------------------------------------------------------------------- judge prompts
HLE_PROMPT = """Decide whether the response below gives the correct final answer to the question.

[question]: {question}

[response]: {response}

[correct_answer]: {answer}

Answer with these four lines and nothing else:
extracted_final_answer: the final exact answer stated in [response], copied as written; write \
None if it states no final answer.
reasoning: whether extracted_final_answer matches [correct_answer], naming any meaningful \
difference. Judge the match only: do not solve the question again, do not argue for another \
answer, and do not comment on how the response got there.
correct: yes when extracted_final_answer is equivalent to [correct_answer], or within a small \
margin for a numerical answer; no when it differs in any way, is ambiguous, or is missing.
confidence: the confidence the response states for its answer, from 0% to 100%; write 100% when \
it states none."""

EQUIVALENCE_PROMPT = """You grade answers to questions.

Question: {question}
Accepted answer(s): {answer}
Predicted answer: {response}

Does the predicted answer name the same entity, value or fact as an accepted answer? Wording, \
formatting, units written differently and extra correct detail do not matter; a different, \
partial, hedged or missing answer is wrong.

Reply with two lines:
reasoning: one sentence.
correct: yes or no"""

XBENCH_PROMPT = """请根据给定的[标准答案]，判断下面对[问题]的[回答]是否正确。

[问题]: {question}

[回答]: {response}

[标准答案]: {answer}

请严格按以下三行格式输出：
最终答案: 从[回答]中摘出的最终确切答案；[回答]里没有明确的最终答案时写"无"。
解释: 只比较[最终答案]与[标准答案]之间有没有实质差别并说明理由；不要重新解题，不要讨论题目背景，\
也不要为与[标准答案]不同的答案辩护。
结论: [最终答案]与[标准答案]一致，或数值题在可接受的微小误差以内时写"正确"；\
有任何不一致、含糊、不等价或答案缺失时写"错误"。"""

SET_PROMPT = """A question asks for a set of items. Check the response against the gold items.

Question: {question}

Gold items:
{items}

Response: {response}

For each gold item, decide whether the response clearly includes it (same entity, any wording). \
Then count the items the response gives that match no gold item.

Reply with one line per gold item, then one line for the extra items, and nothing else:
{format}
extra: <number of response items matching no gold item>"""


# ---------------------------------------------------------------------------- graders
Grader = Callable[[EvalItem, str, JudgeClient | None], Awaitable[Grade]]


async def _judged(
    judge: JudgeClient, prompt: str, parse: Callable[[str], Any], store: Callable[[Any], str]
) -> tuple[dict[str, Any] | None, str | None]:
    try:
        verdict, _cached = await judge.ask(prompt, parse, store)
    except RuntimeError as exc:
        return None, str(exc)
    return verdict, None


async def _equivalence(item: EvalItem, prediction: str, judge: JudgeClient, score: float) -> Grade:
    prompt = EQUIVALENCE_PROMPT.format(question=item.question, response=prediction,
                                       answer=" | ".join(item.answers))
    verdict, error = await _judged(judge, prompt, parse_hle, render_hle)
    if verdict is None:
        return Grade(None, "judge", score, error=error)
    return Grade(verdict["correct"], "judge", score)


async def grade_qa(
    item: EvalItem, prediction: str, judge: JudgeClient | None, rules: MatchRules = SQUAD
) -> Grade:
    """Generic short-answer QA: exact match, then the equivalence judge if there is one."""
    score = f1(prediction, item.answers, rules)
    if not prediction.strip():
        return Grade(False, "empty", score)
    if em(prediction, item.answers):
        return Grade(True, "em", score)
    if judge is None:
        return Grade(False, "em", score)
    return await _equivalence(item, prediction, judge, score)


async def grade_hotpotqa(item: EvalItem, prediction: str, judge: JudgeClient | None) -> Grade:
    """HotpotQA: ``qa`` under its official rules, its EM kept beside the verdict (a judge may
    accept what EM misses; the report shows both)."""
    graded = await grade_qa(item, prediction, judge, HOTPOTQA)
    return replace(graded, exact=em(prediction, item.answers))


async def grade_gaia(item: EvalItem, prediction: str, judge: JudgeClient | None) -> Grade:
    """GAIA: the normalised-match scorer; a miss goes to the equivalence judge if there is one."""
    if gaia_score(prediction, item.answers):
        return Grade(True, "gaia", 1.0)
    if judge is None or not prediction.strip():
        return Grade(False, "gaia", 0.0)
    return await _equivalence(item, prediction, judge, 0.0)


async def grade_browsecomp(item: EvalItem, prediction: str, judge: JudgeClient | None) -> Grade:
    """BrowseComp(-ZH): the HLE-style judge (verdict and confidence); EM without a judge."""
    score = f1(prediction, item.answers)
    if judge is None or not prediction.strip():
        return Grade(bool(prediction.strip()) and em(prediction, item.answers), "em", score)
    prompt = HLE_PROMPT.format(question=item.question, response=prediction, answer=item.answer)
    verdict, error = await _judged(judge, prompt, parse_hle, render_hle)
    if verdict is None:
        return Grade(None, "judge", score, error=error)
    return Grade(verdict["correct"], "judge", score, confidence=verdict["confidence"],
                 extracted=verdict["extracted"])


async def grade_xbench(item: EvalItem, prediction: str, judge: JudgeClient | None) -> Grade:
    """xbench-DeepSearch: an exact match (loosely normalised) short-cuts; else its judge."""
    score = f1(prediction, item.answers)
    if loose_equal(prediction, item.answers):
        return Grade(True, "exact", score)
    if judge is None or not prediction.strip():
        return Grade(False, "exact", score)
    prompt = XBENCH_PROMPT.format(question=item.question, response=prediction, answer=item.answer)
    verdict, error = await _judged(judge, prompt, parse_xbench, render_xbench)
    if verdict is None:
        return Grade(None, "judge", score, error=error)
    return Grade(verdict["correct"], "judge", score)


async def grade_deepsearchqa(item: EvalItem, prediction: str, judge: JudgeClient | None) -> Grade:
    """DeepSearchQA: Set answers item by item (fully correct = every item, no extras, plus
    item F1); Single answers as short-answer QA."""
    if not is_set_answer(item.meta):
        return await grade_qa(item, prediction, judge)
    gold = split_set(item.answer)
    use_judge = judge is not None and bool(prediction.strip()) and bool(gold)
    if not use_judge:
        s = set_score(prediction, item.answer)
    else:
        prompt = SET_PROMPT.format(
            question=item.question, response=prediction,
            items="\n".join(f"{k}. {g}" for k, g in enumerate(gold, 1)),
            format="\n".join(f"item {k}: yes or no" for k in range(1, len(gold) + 1)),
        )
        verdict, error = await _judged(
            judge, prompt, lambda r: parse_set_marks(r, len(gold)), render_set_marks)
        if verdict is None:
            return Grade(None, "judge", error=error, gold_items=len(gold))
        s = SetScore(gold=len(gold), found=sum(verdict["found"]), extra=verdict["extra"])
    return Grade(s.fully_correct, "judge" if use_judge else "set", s.f1, gold_items=s.gold,
                 found_items=s.found, extra_items=s.extra)


GRADERS: dict[str, Grader] = {
    "qa": grade_qa,
    "gaia": grade_gaia,
    "browsecomp": grade_browsecomp,
    "hle": grade_browsecomp,  # HLE-style already: the same judge
    "xbench": grade_xbench,
    "deepsearchqa": grade_deepsearchqa,
    "hotpotqa": grade_hotpotqa,
}


async def grade(
    grader: str, item: EvalItem, prediction: str, judge: JudgeClient | None = None
) -> Grade:
    """Grade ``prediction`` for ``item`` with the named grader (``judge`` None: deterministic)."""
    return await GRADERS[grader](item, prediction or "", judge)


__all__ = [
    "EQUIVALENCE_PROMPT",
    "GRADERS",
    "HLE_PROMPT",
    "SET_PROMPT",
    "XBENCH_PROMPT",
    "Grade",
    "grade",
    "parse_confidence",
    "parse_hle",
    "parse_set_marks",
    "parse_xbench",
    "parse_yes_no",
]
