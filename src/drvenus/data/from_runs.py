"""Trajectories from your own runs (``drvenus data from-runs``): the input of ``data clean``.

Reads what drvenus writes and what DR-Venus's inference writes:

- result files of ``drvenus run`` / ``drvenus eval`` (``results.jsonl``: one row per question
  or (question, run) with ``question``, ``messages``, ``termination`` and, when the question
  file had one, the gold ``answer``) and DR-Venus's inference output (JSONL or JSON rows with
  ``question``, ``answer``, ``messages``, ``prediction``, ``termination``);
- trace files (``drvenus ask --trace``, the traces of ``drvenus serve``): each run's
  ``finished`` record.

A Heavy mode record (``--heavy N``) counts as its N runs.

Each run that ended with the model's own answer becomes one clean-format row (``question``,
``messages``, ``gt``) for ``data clean``, whose validation and correctness filter then keep
the well-formed, right ones (rejection sampling). The gold answer comes from the row itself
(``answer`` / ``gt`` ...: :data:`drvenus.questions.ANSWER_KEYS`) or from a QA file matched by
question text or id. Skipped, and counted by reason: runs without a final answer of their own
(forced answers too, unless ``forced``), runs whose context was compacted (their final
``messages`` no longer start at the question), runs without a gold answer (``data clean``
needs one), and rows that are not trajectories.

It never reads its own output back: a folder's ``trajectories.jsonl`` / ``from_runs.json``
that are an output of ``from-runs`` (``-o`` itself, or any folder holding ``from_runs.json``)
are left out of the folder's files (and counted as ignored), and an input file that ``-o``
would write over is refused, as ``data export`` and ``data clean`` refuse theirs.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus import protocol
from drvenus.agent import read_trace
from drvenus.jsonl import read_jsonl
from drvenus.questions import ANSWER_KEYS, QUESTION_KEYS, accepted_answers, read_questions
from drvenus.records import read_records

TRAJECTORIES = "trajectories.jsonl"
REPORT = "from_runs.json"
OUTPUT_NAMES = frozenset({TRAJECTORIES, REPORT, TRAJECTORIES + ".tmp", REPORT + ".tmp"})

log = logging.getLogger(__name__)

# the model's own final answer: ours, and DR-Venus's inference
ANSWERED = frozenset({"answered", "answer"})
# an answer forced by a limit notice
FORCED = frozenset({
    "answered_token_limit", "answered_max_steps", "generate an answer as token limit reached",
})


@dataclass
class FromRunsReport:
    """What ``from-runs`` read and wrote."""

    files: int = 0
    ignored: int = 0  # files of earlier from-runs outputs inside the input folders
    runs: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "ignored": self.ignored, "runs": self.runs,
                "written": self.written, "skipped": dict(sorted(self.skipped.items()))}


def is_trace(path: Path) -> bool:
    """Whether a JSONL file holds trace events (rather than result rows)."""
    for row in read_jsonl(path):
        if row.ok:
            value = row.value
            return isinstance(value, dict) and "type" in value and "data" in value
    return False


def runs_in(path: Path) -> Iterator[dict[str, Any]]:
    """The run records of one results or trace file."""
    if not path.name.lower().endswith((".jsonl", ".jsonl.gz")):
        yield from read_records(path, what="results")
    elif is_trace(path):
        for events in read_trace(path):
            done = next((e for e in reversed(events) if e.get("type") == "finished"), None)
            record = (done or {}).get("data", {}).get("record")
            yield record if isinstance(record, dict) else {"_unfinished": True}
    else:
        for row in read_jsonl(path, objects_only=False):
            yield row.value if row.ok else {"_unreadable": True}


class GoldAnswers:
    """Gold answers of a QA file, by question text and by id."""

    def __init__(self, path: Path | None) -> None:
        self.by_question: dict[str, list[str]] = {}
        self.by_id: dict[str, list[str]] = {}
        if path is None:
            return
        qa = read_questions(path, need_answer=True)
        if not qa.items:
            raise ValueError(f"{path}: no question with an answer")
        for item in qa.items:
            self.by_question.setdefault(item.question, item.answers)
            self.by_id.setdefault(item.id, item.answers)

    def find(self, question: str, run_id: Any) -> list[str]:
        return self.by_question.get(question.strip()) or self.by_id.get(str(run_id), [])


def heavy_members(run: Any) -> list[Any]:
    """A Heavy mode record's runs (each with the record's id and gold answer; the synthesis
    turn itself is not a research trajectory), or the run itself."""
    heavy = (run.get("extra") or {}).get("heavy") if isinstance(run, dict) else None
    members = heavy.get("runs") if isinstance(heavy, dict) else None
    if not isinstance(members, list):
        return [run]
    inherited = {k: run[k] for k in ("id", *ANSWER_KEYS) if k in run}
    return [{**m, **inherited} if isinstance(m, dict) else m for m in members]


def _messages(value: Any) -> list[dict[str, str]] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str)
               and isinstance(m.get("content"), str) for m in value):
        return None
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _question(run: dict[str, Any], messages: list[dict[str, str]]) -> str | None:
    q = next((run[k] for k in QUESTION_KEYS if isinstance(run.get(k), str)), None)
    if q is None:
        q = next((m["content"] for m in messages if m["role"] == "user"), None)
    return q.strip() if q and q.strip() else None


def _ended_with_answer(run: dict[str, Any], messages: list[dict[str, str]],
                       forced: bool) -> str | None:
    """Why a run is not kept for its ending, or None."""
    termination = run.get("termination")
    if termination is None:  # no record of how it ended: its last turn must be an answer
        last = messages[-1]
        ok = last["role"] == "assistant" and protocol.extract_answer(last["content"]) is not None
        return None if ok else "no_answer"
    if termination in ANSWERED or (forced and termination in FORCED):
        return None
    return "forced_answer" if termination in FORCED else "no_answer"


def trajectory_row(run: Any, gold: GoldAnswers, *, forced: bool = False
                   ) -> tuple[dict[str, Any] | None, str | None]:
    """``(row, None)`` for a usable run, ``(None, reason)`` otherwise."""
    if not isinstance(run, dict):
        return None, "not_a_run"
    if run.get("_unfinished"):
        return None, "unfinished_trace"
    if run.get("_unreadable"):
        return None, "unreadable_row"
    messages = _messages(run.get("messages"))
    if messages is None:
        return None, "no_messages"
    if (run.get("extra") or {}).get("compactions"):
        return None, "compacted"
    reason = _ended_with_answer(run, messages, forced)
    if reason:
        return None, reason
    question = _question(run, messages)
    if question is None:
        return None, "no_question"
    answers = next((accepted_answers(run[k]) for k in ANSWER_KEYS if run.get(k) is not None),
                   []) or gold.find(question, run.get("id"))
    if not answers:
        return None, "no_gold"
    return {"question": question, "messages": messages,
            "gt": protocol.ANSWER_SPLIT.join(answers)}, None


def from_runs(paths: Iterable[Path], output: Path, *, gold: Path | None = None,
              forced: bool = False) -> FromRunsReport:
    """Write ``output/trajectories.jsonl`` and ``output/from_runs.json`` from the runs in
    ``paths`` (files, or folders: their ``*.jsonl`` / ``*.json`` files). Each file is written
    under a temporary name and renamed into place when complete."""
    answers = GoldAnswers(gold)
    files, ignored = _files(paths, output)
    report = FromRunsReport(files=len(files), ignored=len(ignored))
    if ignored:
        log.warning("left out %d file(s) of earlier from-runs output: %s", len(ignored),
                    ", ".join(str(p) for p in ignored[:3]) + (" ..." if len(ignored) > 3 else ""))
    output.mkdir(parents=True, exist_ok=True)
    target = output / TRAJECTORIES
    tmp = target.with_name(target.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for path in files:
                for run in (m for r in runs_in(path) for m in heavy_members(r)):
                    report.runs += 1
                    row, reason = trajectory_row(run, answers, forced=forced)
                    if row is None:
                        report.skipped[reason or "unknown"] += 1
                        continue
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    report.written += 1
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    summary = output / REPORT
    tmp = summary.with_name(summary.name + ".tmp")
    try:
        tmp.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, summary)
    finally:
        tmp.unlink(missing_ok=True)
    return report


def is_output_file(path: Path, output: Path) -> bool:
    """Whether ``path`` is a file a ``from-runs`` run writes: into ``output``, or into any
    folder holding its report (an earlier run's ``-o``)."""
    if path.name not in OUTPUT_NAMES:
        return False
    folder = path.resolve().parent
    return folder == output.resolve() or (folder / REPORT).is_file()


def _files(paths: Iterable[Path], output: Path) -> tuple[list[Path], list[Path]]:
    """The input files of ``paths``, and the from-runs output files their folders hold."""
    files: list[Path] = []
    ignored: list[Path] = []
    targets = {(output / name).resolve() for name in (TRAJECTORIES, REPORT)}
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and p.name.lower().endswith((".jsonl", ".json", ".jsonl.gz")))
            ignored += [p for p in found if is_output_file(p, output)]
            found = [p for p in found if not is_output_file(p, output)]
            if not found:
                left_out = " (only earlier from-runs output, left out)" if ignored else ""
                raise ValueError(f"no .jsonl or .json file of runs in {path}{left_out}")
            files += found
        elif path.is_file():
            if path.resolve() in targets:
                raise ValueError(
                    f"{path}: this run would write over its own input (the output of an "
                    f"earlier from-runs in {output}?); choose another --output folder")
            files.append(path)
        else:
            raise FileNotFoundError(f"results file not found: {path}")
    return files, ignored
