"""The one reader of question files: ``drvenus run``, ``eval`` (generic files) and ``rl`` read the
same files with the same keys.

A file is JSONL, JSON, parquet, CSV or XLSX (:mod:`drvenus.records`), or plain text with one
question per line (``.txt``). A row is either

- a question/answer row: the question under one of :data:`QUESTION_KEYS`, optionally the answer
  under one of :data:`ANSWER_KEYS` (a list of accepted answers, or one string with alternatives
  joined by ``<|answer_split|>``) and an id under ``id`` / ``question_id``; or
- an RL row (verl format): ``prompt`` a list of chat messages (the last user message is the
  question), ``reward_model.ground_truth`` the answer, ``extra_info.index`` the id.

A row without an id gets one from its question's hash, so ids survive reordering. Malformed rows
are counted and described, never fatal; a repeated id keeps its first row.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus.jsonl import bounded_lines, too_long
from drvenus.protocol import ANSWER_SPLIT
from drvenus.records import read_records

QUESTION_KEYS = ("question", "Question", "problem", "prompt", "query", "input")
ANSWER_KEYS = ("answer", "answers", "Answer", "gt", "ground_truth", "golden_answers")
ID_KEYS = ("id", "question_id")


@dataclass(frozen=True)
class Question:
    """One question. ``answer`` is the answer as the file wrote it (None without one),
    ``answers`` the accepted answers as strings; ``meta`` the row's other fields."""

    id: str
    question: str
    answer: Any = None
    answers: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class QuestionFile:
    """What a question file held: the usable questions and what was skipped, and why."""

    items: list[Question]
    malformed: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)
    duplicate_notes: list[str] = field(default_factory=list)


def question_id(question: str) -> str:
    """The id of a question that has none: stable, from its text."""
    return "q-" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]


def normalize_id(raw: Any) -> str | None:
    """The id as a string (``7`` and ``"7"`` are the same id); None when it cannot be an id."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    text = raw.strip() if isinstance(raw, str) else str(raw)
    return text or None


def accepted_answers(value: Any) -> list[str]:
    """The accepted answers of an answer field: a list's items, or a string split on
    ``<|answer_split|>``; blanks dropped."""
    if value is None:
        return []
    values = value if isinstance(value, list | tuple) else str(value).split(ANSWER_SPLIT)
    return [text for v in values if v is not None and (text := str(v).strip())]


def _rl_row(row: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]] | None:
    prompt, reward = row.get("prompt"), row.get("reward_model")
    if not (isinstance(prompt, list | tuple) and isinstance(reward, dict)):
        return None
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    raw_id = extra.get("index") if extra.get("index") is not None else row.get("id")
    meta = {k: v for k, v in row.items() if k not in ("prompt", "reward_model", "id")}
    return raw_id, users[-1] if users else None, reward.get("ground_truth"), meta


def question_from_row(row: Any, *, need_answer: bool = False) -> Question | str:
    """The question of one row, or a short reason why the row has none."""
    if isinstance(row, str):
        row = {"question": row}
    if not isinstance(row, dict):
        return "not a JSON object"
    rl = _rl_row(row)
    if rl is not None:
        raw_id, question, answer, meta = rl
    else:
        question = next((row[k] for k in QUESTION_KEYS if isinstance(row.get(k), str)), None)
        answer = next((row[k] for k in ANSWER_KEYS if row.get(k) is not None), None)
        raw_id = next((row[k] for k in ID_KEYS if row.get(k) is not None), None)
        meta = {k: v for k, v in row.items() if k not in (*QUESTION_KEYS, *ANSWER_KEYS, *ID_KEYS)}
    if not isinstance(question, str) or not question.strip():
        return f"no question field ({', '.join(QUESTION_KEYS)}, or an RL prompt)"
    answers = accepted_answers(answer)
    if need_answer and not answers:
        return f"no answer field ({', '.join(ANSWER_KEYS)})"
    question = question.strip()
    if raw_id is None:
        qid = question_id(question)
    elif (qid := normalize_id(raw_id)) is None:
        return "the id must be a non-empty string or a number"
    return Question(qid, question, answer, answers, meta)


def _rows(path: Path) -> list[tuple[str, Any]]:
    """``(where, row)`` pairs; an unreadable JSONL line is a row holding its reason."""
    name = path.name.lower()
    if name.endswith(".txt"):
        out: list[tuple[str, Any]] = []
        with path.open("rb") as fh:
            for n, line in enumerate(bounded_lines(fh), 1):
                if line is None:  # never held whole
                    out.append((f"line {n}", ValueError(too_long())))
                elif line.strip():
                    try:
                        out.append((f"line {n}", {"question": line.decode("utf-8").strip()}))
                    except UnicodeDecodeError:
                        out.append((f"line {n}", ValueError("not valid UTF-8")))
        return out
    if name.endswith((".jsonl", ".jsonl.gz")) or not name.endswith(
        (".json", ".csv", ".xlsx", ".parquet", ".pq")
    ):
        from drvenus.jsonl import read_jsonl

        return [
            (f"line {r.lineno}", r.value if r.ok else ValueError(r.error))
            for r in read_jsonl(path, objects_only=False)
        ]
    return [(f"row {i}", row) for i, row in enumerate(read_records(path, what="questions"), 1)]


def read_questions(path: str | Path, *, need_answer: bool = False) -> QuestionFile:
    """The questions of a file (see the module doc). ``need_answer``: a row without an answer
    is malformed (evaluation and RL need one). Raises ``FileNotFoundError`` for a missing file
    and ``ValueError`` for an unsupported one; bad rows are counted in the result."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"questions file not found: {path}")
    report = QuestionFile(items=[])
    first: dict[str, str] = {}
    for where, row in _rows(path):
        item = str(row) if isinstance(row, Exception) else question_from_row(
            row, need_answer=need_answer
        )
        if not isinstance(item, Question):
            report.malformed += 1
            report.problems.append(f"{where}: {item}")
            continue
        if item.id in first:
            report.duplicates += 1
            report.duplicate_notes.append(
                f"duplicate id {item.id!r} on {where} (first on {first[item.id]}), skipped"
            )
            continue
        first[item.id] = where
        report.items.append(item)
    return report


__all__ = [
    "ANSWER_KEYS",
    "ID_KEYS",
    "QUESTION_KEYS",
    "Question",
    "QuestionFile",
    "accepted_answers",
    "normalize_id",
    "question_from_row",
    "question_id",
    "read_questions",
]
