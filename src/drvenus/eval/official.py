"""``drvenus eval --grader official``: each benchmark's official grader, from pinned sources.

The texts a judge reads (prompt template, system message) and the request it gets (sampling,
token cap, structured output) come from the official files at run time
(:mod:`drvenus.reference.graders`); how its reply is scored is written here, to behave as the
official code does:

- ``browsecomp`` (BrowseComp, BrowseComp-ZH): simple-evals' grader. The verdict is the first
  ``correct: yes|no`` in the reply, case as written (``Correct: Yes`` and ``**correct:** yes``
  are no verdict); no verdict is wrong; an empty reply is asked again.
- ``xbench`` (xbench-DeepSearch): xbench-evals' judge, after its own short-cut: the text after
  ``最终答案`` in the response (up to a second ``:``) equal to the answer is right without a
  judge. The verdict is the first ``结论`` followed by colons, one character and 正确/错误, read
  as the official code reads it (the text between the first and second ``:``); anything else is
  wrong.
- ``hle``: HLE's judge with its structured verdict (JSON: extracted answer, reasoning,
  ``correct`` yes/no, integer confidence, ``strict`` true); a reply that is not such a verdict
  is wrong. The confidence feeds the calibration error, computed as HLE's code does.
- ``gaia``: the official deterministic scorer only (:func:`drvenus.eval.scoring.gaia_match`),
  no judge fallback.
- ``deepsearchqa``: the starter autorater's metrics for Single and Set answers alike: per item,
  expected parts found and excessive answers; fully correct, correct with excessive answers,
  fully incorrect, precision, recall, F1. The starter notebook is not on GitHub and is not
  pinned: its prompt is drvenus's own wording asking for the same verdict fields.

A judge that cannot be reached is a judge error (counted wrong, shown apart); a reply without a
verdict is simply wrong, as in the official code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drvenus.eval.benchmarks import EvalItem
from drvenus.eval.judges import Grade
from drvenus.eval.scoring import f1, gaia_match
from drvenus.grading.judge import JudgeClient
from drvenus.reference.graders import GraderTexts, grader_texts
from drvenus.reference.store import ReferenceStore

NO_VERDICT = "official-no-verdict"


# ---------------------------------------------------------------------------- simple-evals
_SE_VERDICT = re.compile(r"correct: (yes|no)")


def simple_evals_verdict(reply: str) -> str | None:
    """``yes`` / ``no`` from the first ``correct: yes|no`` of the reply (case as written);
    None when there is none (the official grader then scores the answer wrong)."""
    m = _SE_VERDICT.search(reply or "")
    return m.group(1) if m else None


def _se_parse(reply: str) -> dict[str, Any] | None:
    if not reply.strip():
        return None  # the official sampler asks again when a reply has no content
    return {"verdict": simple_evals_verdict(reply)}


def _se_store(parsed: dict[str, Any]) -> str:
    return f"correct: {parsed['verdict']}" if parsed["verdict"] else "(no verdict)"


# ---------------------------------------------------------------------------- xbench-evals
_XB_ANSWER = re.compile(r"最终答案:*(.*)")
_XB_VERDICT = re.compile(r"结论:*.(正确|错误)")


def xbench_field(match: re.Match[str] | None) -> str | None:
    """What xbench-evals reads from a match: the text between its first and second ASCII
    colon, stripped; the whole match when it holds no colon; None without a match."""
    if match is None:
        return None
    text = match.group(0)
    parts = text.split(":")
    return parts[1].strip() if len(parts) > 1 else text


def xbench_answer(response: str) -> str | None:
    """The final answer xbench-evals reads from a response (its exact-match short-cut)."""
    return xbench_field(_XB_ANSWER.search(response or ""))


def xbench_verdict(reply: str) -> str | None:
    """The judge's conclusion as xbench-evals reads it (``正确`` scores 1, anything else 0)."""
    return xbench_field(_XB_VERDICT.search(reply or ""))


def _xb_parse(reply: str) -> dict[str, Any]:
    return {"verdict": xbench_verdict(reply)}


def _xb_store(parsed: dict[str, Any]) -> str:
    return f"结论: {parsed['verdict']}" if parsed["verdict"] in ("正确", "错误") else "(无)"


# ---------------------------------------------------------------------------- HLE
def _schema_of(texts: GraderTexts) -> Mapping[str, Any]:
    return texts.request["response_format"]["json_schema"]["schema"]


def _conform(value: Any, spec: Mapping[str, Any]) -> tuple[bool, Any]:
    """Whether a JSON value fits one field of the structured verdict (pydantic's lax reading
    of integers: an integral float or a string of digits is an integer)."""
    kind = spec.get("type")
    if kind == "integer":
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int):
            value = int(value)
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            value = int(value)
        else:
            return False, None
    elif kind == "string" and not isinstance(value, str):
        return False, None
    elif kind == "boolean" and not isinstance(value, bool):
        return False, None
    elif kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return False, None
    if "enum" in spec and value not in spec["enum"]:
        return False, None
    return True, value


def hle_verdict(reply: str, schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The structured verdict (a JSON object with every field of ``schema``), or None."""
    try:
        data = json.loads(reply)
    except (json.JSONDecodeError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {}
    for name, spec in schema.get("properties", {}).items():
        if name not in data:
            return None
        ok, value = _conform(data[name], spec)
        if not ok:
            return None
        out[name] = value
    return out


# ---------------------------------------------------------------------------- DeepSearchQA
DSQA_PROMPT = """You check an AI response against the expected answer of a research question.

Question:
{question}

Answer type: {answer_type}
Expected answer:
{answer}

AI response:
{response}

For "Single Answer" the expected answer is one part; for "Set Answer" each listed item is one \
part. Decide for every expected part whether the response gives it (any wording, any order). \
Then list the answers the response gives that are not among the expected parts.

Reply with one JSON object and nothing else:
{{"explanation": "<one or two sentences>", "correctness_details": {{"<expected part>": true or \
false, ...}}, "excessive_answers": ["<answer not expected>", ...]}}"""

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _json_object(reply: str) -> Any:
    fenced = _FENCE.search(reply)
    text = fenced.group(1) if fenced else reply
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end < start:
        return None
    try:
        return json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return None


def dsqa_verdict(reply: str) -> dict[str, int] | None:
    """Counts from an autorater verdict: expected parts, parts found, excessive answers."""
    data = _json_object(reply or "")
    if not isinstance(data, dict):
        return None
    details, extra = data.get("correctness_details"), data.get("excessive_answers")
    if not isinstance(details, dict) or not isinstance(extra, list):
        return None
    if not all(isinstance(v, bool) for v in details.values()):
        return None
    return {"gold": len(details), "found": sum(details.values()), "extra": len(extra)}


def dsqa_metrics(gold: int, found: int, extra: int) -> dict[str, Any]:
    """One item's DeepSearchQA metrics, as the starter code computes them: fully correct (every
    expected part, or none expected, and no excessive answer), correct with excessive answers,
    fully incorrect (parts expected, none found), precision, recall and F1 over parts."""
    all_found = gold == 0 or found == gold
    precision = found / (found + extra) if found + extra else 0.0
    recall = found / gold if gold else 0.0
    return {
        "fully_correct": all_found and extra == 0,
        "correct_with_excessive": all_found and extra > 0,
        "fully_incorrect": gold > 0 and found == 0,
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
    }


def _dsqa_store(parsed: dict[str, int] | None) -> str:
    if parsed is None:
        return "(no verdict)"
    details = {str(k): k <= parsed["found"] for k in range(1, parsed["gold"] + 1)}
    return json.dumps({"correctness_details": details,
                       "excessive_answers": [str(k) for k in range(parsed["extra"])]})


# ---------------------------------------------------------------------------- the graders
@dataclass(frozen=True)
class OfficialGrader:
    """One benchmark's official grader: its texts (None where nothing is read), whether it
    needs a judge, and what still differs from the official code."""

    key: str
    title: str
    texts: GraderTexts | None
    needs_judge: bool
    differs: tuple[str, ...] = ()
    source: str = ""  # where the grader lives when no file of it is pinned
    extra: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What the report says about the grader: its title, pinned files (repo, commit, path,
        sha256), the judge request and model of the official code, and what differs."""
        out: dict[str, Any] = {"grader": "official", "key": self.key, "title": self.title,
                               "files": [], "differs": list(self.differs)}
        if self.source:
            out["source"] = self.source
        if self.texts is not None:
            t = self.texts
            request = {k: v for k, v in t.request.items() if k != "response_format"}
            if "response_format" in t.request:
                fmt = t.request["response_format"]["json_schema"]
                request["response_format"] = f"json_schema {fmt['name']} (strict)"
            out.update(files=[f.to_dict() for f in t.files], judge_request=request,
                       system_message=t.system is not None, official_judge_model=t.judge_model)
        return out

    async def grade(self, item: EvalItem, prediction: str, judge: JudgeClient | None) -> Grade:
        if self.key == "gaia":
            ok = gaia_match(prediction, item.answer)
            return Grade(ok, "official-scorer", 1.0 if ok else 0.0, grader=self.key)
        if judge is None:
            raise ValueError(f"{self.title} needs a judge (--judge-base-url, --judge-model)")
        return await _GRADE[self.key](self, item, prediction, judge)


async def _asked(grader: OfficialGrader, judge: JudgeClient, messages: list[dict[str, str]],
                 request: Mapping[str, Any], parse: Any, store: Any,
                 ) -> tuple[Any, str | None]:
    try:
        value, _cached = await judge.ask_exact(messages, request, parse, store)
    except RuntimeError as exc:
        return None, str(exc)
    return value, None


async def _grade_browsecomp(g: OfficialGrader, item: EvalItem, prediction: str,
                            judge: JudgeClient) -> Grade:
    assert g.texts is not None
    score = f1(prediction, item.answers)
    messages = g.texts.messages(question=item.question, correct_answer=item.answer,
                                response=prediction)
    parsed, error = await _asked(g, judge, messages, g.texts.request, _se_parse, _se_store)
    if parsed is None:
        return Grade(None, "official", score, error=error, grader=g.key)
    if parsed["verdict"] is None:
        return Grade(False, NO_VERDICT, score, grader=g.key)
    return Grade(parsed["verdict"] == "yes", "official", score, grader=g.key)


async def _grade_xbench(g: OfficialGrader, item: EvalItem, prediction: str,
                        judge: JudgeClient) -> Grade:
    assert g.texts is not None
    score = f1(prediction, item.answers)
    if xbench_answer(prediction) == item.answer:
        return Grade(True, "official-exact", score, grader=g.key)
    messages = g.texts.messages(question=item.question, correct_answer=item.answer,
                                response=prediction)
    parsed, error = await _asked(g, judge, messages, g.texts.request, _xb_parse, _xb_store)
    if parsed is None:
        return Grade(None, "official", score, error=error, grader=g.key)
    if parsed["verdict"] is None:
        return Grade(False, NO_VERDICT, score, grader=g.key)
    return Grade(parsed["verdict"] == "正确", "official", score, grader=g.key)


async def _grade_hle(g: OfficialGrader, item: EvalItem, prediction: str,
                     judge: JudgeClient) -> Grade:
    assert g.texts is not None
    schema = _schema_of(g.texts)
    score = f1(prediction, item.answers)

    def parse(reply: str) -> dict[str, Any]:
        return {"verdict": hle_verdict(reply, schema)}

    def store(parsed: dict[str, Any]) -> str:
        v = parsed["verdict"]
        if v is None:
            return "(no verdict)"
        kept = {k: ("" if k == "reasoning" else val) for k, val in v.items()}
        return json.dumps(kept, ensure_ascii=False)

    messages = g.texts.messages(question=item.question, correct_answer=item.answer,
                                response=prediction)
    parsed, error = await _asked(g, judge, messages, g.texts.request, parse, store)
    if parsed is None:
        return Grade(None, "official", score, error=error, grader=g.key)
    v = parsed["verdict"]
    if v is None:
        return Grade(False, NO_VERDICT, score, grader=g.key)
    confidence = v.get("confidence")
    return Grade("yes" in str(v.get("correct")), "official", score,
                 confidence=float(confidence) if confidence is not None else None,
                 extracted=v.get("extracted_final_answer"), grader=g.key)


async def _grade_dsqa(g: OfficialGrader, item: EvalItem, prediction: str,
                      judge: JudgeClient) -> Grade:
    answer_type = str(item.meta.get("answer_type") or "Single Answer")
    prompt = DSQA_PROMPT.format(question=item.question, answer_type=answer_type,
                                answer=item.answer, response=prediction)
    try:
        parsed, _cached = await judge.ask(prompt, lambda r: {"v": dsqa_verdict(r)},
                                          lambda p: _dsqa_store(p["v"]))
    except RuntimeError as exc:
        return Grade(None, "official-metrics", error=str(exc), grader=g.key)
    v = parsed["v"]
    if v is None:
        return Grade(False, NO_VERDICT, 0.0, grader=g.key)
    m = dsqa_metrics(v["gold"], v["found"], v["extra"])
    return Grade(m["fully_correct"], "official-metrics", m["f1"], gold_items=v["gold"],
                 found_items=v["found"], extra_items=v["extra"], grader=g.key)


_GRADE = {"browsecomp": _grade_browsecomp, "xbench": _grade_xbench, "hle": _grade_hle,
          "deepsearchqa": _grade_dsqa}

_COMMON = ("the judged response is the agent's final answer (the text of its answer), not a "
           "whole reply in the benchmark's own answer format",
           "the judge model is the one you give; think blocks are removed from its reply "
           "before it is read")
DIFFERS: dict[str, tuple[str, ...]] = {
    "browsecomp": (*_COMMON,
                   "the verdict is the first match's yes/no; simple-evals @ee3b031 compares "
                   "the whole match ('correct: yes') with 'yes', which scores every answer "
                   "wrong (openai/simple-evals PR #93, open), so its evident intent is "
                   "followed"),
    "xbench": _COMMON,
    "hle": (*_COMMON,
            "the JSON schema of the structured verdict is drvenus's rendering of the "
            "ExtractedAnswer fields (openai-python derives its own from pydantic: same "
            "fields, types, required and strict, other titles)",
            "the calibration error skips the last bin, as HLE's code does"),
    "gaia": ("the scorer is drvenus's reimplementation of the official scorer.py of the "
             "gaia-benchmark/leaderboard Hugging Face space, which is not on GitHub and is "
             "not pinned",),
    "deepsearchqa": ("the starter autorater is a Kaggle notebook, not on GitHub and not "
                     "pinned: the prompt is drvenus's own wording asking for the starter's "
                     "verdict fields (correctness_details, excessive_answers); the metrics "
                     "are the starter's",
                     "the judge sampling is drvenus's (temperature 0, no token cap)"),
}
TITLES = {"gaia": "GAIA official scorer (reimplemented, no judge)",
          "deepsearchqa": "DeepSearchQA starter metrics (own autorater prompt)"}
SOURCES = {"gaia": "huggingface.co/spaces/gaia-benchmark/leaderboard scorer.py (not pinned)",
           "deepsearchqa": "kaggle.com/code/andrewmingwang/deepsearchqa-starter-code "
                           "(not pinned)"}
OFFICIAL_GRADERS = ("browsecomp", "xbench", "hle", "gaia", "deepsearchqa")


def official_grader(key: str, store: ReferenceStore | None = None) -> OfficialGrader:
    """The official grader for the benchmark grader ``key`` (a name in ``judges.GRADERS``),
    its texts read from ``store`` (default: the settings' store). Raises ValueError for a
    grader without an official one, ReferenceError (a ValueError) for a missing file."""
    if key not in OFFICIAL_GRADERS:
        raise ValueError(f"no official grader for the {key!r} grader (there are official "
                         f"graders for: BrowseComp(-ZH), xbench-DeepSearch, HLE, GAIA, "
                         f"DeepSearchQA); use --grader ours")
    if key in ("gaia", "deepsearchqa"):
        return OfficialGrader(key, TITLES[key], None, key == "deepsearchqa", DIFFERS[key],
                              SOURCES[key])
    if store is None:
        from drvenus.reference import reference_store

        store = reference_store()
    texts = grader_texts(key, store)
    return OfficialGrader(key, texts.title, texts, True, DIFFERS[key])


__all__ = [
    "DSQA_PROMPT",
    "NO_VERDICT",
    "OFFICIAL_GRADERS",
    "OfficialGrader",
    "dsqa_metrics",
    "dsqa_verdict",
    "hle_verdict",
    "official_grader",
    "simple_evals_verdict",
    "xbench_answer",
    "xbench_field",
    "xbench_verdict",
]
