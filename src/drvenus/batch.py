"""Batch research runs: concurrent, append-only, resumable JSONL.

Each finished question is appended to the output as one JSON line and fsync'd, so a crash or
Ctrl-C loses at most the questions in flight; a rerun skips every id already in the output.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus.agent import ResearchAgent, ResultRecord

log = logging.getLogger(__name__)

QUESTION_KEYS = ("question", "prompt", "Question", "query", "input")
ANSWER_KEYS = ("answer", "gt", "ground_truth", "Answer", "golden_answers")


@dataclass(frozen=True)
class Item:
    id: str
    question: str
    answer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadReport:
    items: list[Item]
    malformed: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)


def _question_id(question: str) -> str:
    return "q-" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]


def load_questions(path: Path) -> LoadReport:
    """Questions from JSONL (objects with ``question`` or ``prompt``, optional ``id``, ``answer``)
    or a plain text file with one question per line. Malformed lines are counted, not fatal."""
    if not path.is_file():
        raise FileNotFoundError(f"questions file not found: {path}")
    report = LoadReport(items=[])
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            item = _parse_line(line, lineno, path.suffix.lower() == ".txt", report)
            if item is None:
                continue
            if item.id in seen:
                report.duplicates += 1
                continue
            seen.add(item.id)
            report.items.append(item)
    return report


def _parse_line(line: str, lineno: int, plain: bool, report: LoadReport) -> Item | None:
    if plain:
        q = line.strip()
        return Item(_question_id(q), q)
    try:
        obj = json.loads(line)
    except ValueError as exc:
        report.malformed += 1
        report.problems.append(f"line {lineno}: not JSON ({exc})")
        return None
    if isinstance(obj, str):
        obj = {"question": obj}
    if not isinstance(obj, dict):
        report.malformed += 1
        report.problems.append(f"line {lineno}: not a JSON object")
        return None
    question = next((obj[k] for k in QUESTION_KEYS if isinstance(obj.get(k), str)), None)
    if question is None or not question.strip():
        report.malformed += 1
        report.problems.append(f"line {lineno}: no question field ({', '.join(QUESTION_KEYS)})")
        return None
    answer = next((obj[k] for k in ANSWER_KEYS if k in obj), None)
    raw_id = obj.get("id", obj.get("question_id"))
    qid = str(raw_id) if raw_id is not None else _question_id(question)
    meta = {k: v for k, v in obj.items() if k not in (*QUESTION_KEYS, *ANSWER_KEYS, "id")}
    return Item(qid, question, answer, meta)


def done_ids(path: Path) -> tuple[set[str], int]:
    """Ids already in an output file, and the count of unreadable lines (e.g. a torn last line)."""
    ids: set[str] = set()
    bad = 0
    if not path.exists():
        return ids, bad
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                ids.add(str(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                bad += 1
    return ids, bad


class JsonlAppender:
    """Append one JSON object per line; each write is flushed and fsync'd."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("a", encoding="utf-8")
        if self._fh.tell() > 0:
            self._repair_tail(path)

    def _repair_tail(self, path: Path) -> None:
        with path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # a torn line from a crash: start on a fresh line
                self._fh.write("\n")

    def write(self, obj: dict[str, Any]) -> None:
        self._fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


@dataclass
class BatchSummary:
    total: int = 0
    skipped: int = 0
    finished: int = 0
    terminations: Counter = field(default_factory=Counter)
    elapsed: list[float] = field(default_factory=list)


def pending(items: list[Item], output: Path) -> tuple[list[Item], int]:
    ids, _ = done_ids(output)
    todo = [it for it in items if it.id not in ids]
    return todo, len(items) - len(todo)


def _iter_chunks(items: list[Item], n: int) -> Iterator[list[Item]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


async def run_batch(
    agent: ResearchAgent,
    items: list[Item],
    output: Path,
    *,
    workers: int = 4,
    on_done: Callable[[Item, ResultRecord], None] | None = None,
) -> BatchSummary:
    """Research every pending item with ``workers`` concurrent runs, appending each record."""
    todo, skipped = pending(items, output)
    summary = BatchSummary(total=len(items), skipped=skipped)
    writer = JsonlAppender(output)
    sem = asyncio.Semaphore(max(1, workers))

    async def one(item: Item) -> None:
        async with sem:
            record = await agent.run(item.question)
        row = {"id": item.id, **record.to_dict()}
        if item.answer is not None:
            row["answer"] = item.answer
        if item.meta:
            row["meta"] = item.meta
        writer.write(row)
        summary.finished += 1
        summary.terminations[record.termination] += 1
        summary.elapsed.append(record.elapsed_seconds)
        if on_done is not None:
            on_done(item, record)

    try:
        for chunk in _iter_chunks(todo, 1024):  # bounded number of pending tasks
            await asyncio.gather(*(one(it) for it in chunk))
    finally:
        writer.close()
    return summary
