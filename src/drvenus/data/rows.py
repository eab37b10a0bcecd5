"""Stages 2-5 of ``drvenus data clean`` on plain Python rows: normalise, prune, dedup, validate
(and the answer scores stage 6 reads).

:func:`process_rows` is what a worker process runs on one chunk. A row that is bad data is
dropped and its reason counted (``stats.dropped``); an unexpected exception (a bug in our code,
not a property of the row) is counted apart (``stats.unexpected_errors``) and returned as a
:class:`RowError` so that the main process can log it with the row's position.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from drvenus.data.normalize import normalize_row
from drvenus.data.stages import (
    CallReader,
    cached_call_reader,
    count_turns,
    drop_duplicate_tool_calls,
    prune_disallowed_tools,
    tool_names,
    validate_messages,
)
from drvenus.grading.match import exact_match, f1_score
from drvenus.protocol import check_turn_format, extract_answer

Row = dict[str, Any]


@dataclass(frozen=True)
class RowOptions:
    """What the per-row stages need (picklable; sent to the workers)."""

    system_prompt_mode: str
    system_prompt: str
    allowed_tools: frozenset[str]
    strict_format: bool = False
    keep_stage1: bool = False


@dataclass
class ChunkStats:
    """Counters of one chunk (summed per file and per run, in chunk order)."""

    source_rows: int = 0
    stage1_rows: int = 0
    stage2_rows: int = 0
    dropped: Counter = field(default_factory=Counter)
    pruned_tool_turns_removed: int = 0
    pruned_tool_response_turns_removed: int = 0
    pruned_tool_names: Counter = field(default_factory=Counter)
    duplicate_tool_turns_removed: int = 0
    unexpected_errors: int = 0

    def add(self, other: ChunkStats) -> None:
        self.source_rows += other.source_rows
        self.stage1_rows += other.stage1_rows
        self.stage2_rows += other.stage2_rows
        self.dropped.update(other.dropped)
        self.pruned_tool_turns_removed += other.pruned_tool_turns_removed
        self.pruned_tool_response_turns_removed += other.pruned_tool_response_turns_removed
        self.pruned_tool_names.update(other.pruned_tool_names)
        self.duplicate_tool_turns_removed += other.duplicate_tool_turns_removed
        self.unexpected_errors += other.unexpected_errors


@dataclass(frozen=True)
class RowError:
    """An unexpected exception while processing the row at ``index`` of a chunk."""

    index: int
    error: str
    traceback: str


@dataclass
class ProcessedRows:
    """Stages 2-5 over a chunk. Rows are tagged with their index in the chunk; stage-1 rows
    are only collected when ``RowOptions.keep_stage1``."""

    stage1: list[tuple[int, Row]] = field(default_factory=list)
    valid: list[tuple[int, Row]] = field(default_factory=list)
    stats: ChunkStats = field(default_factory=ChunkStats)
    errors: list[RowError] = field(default_factory=list)


# --------------------------------------------------------------------------- one stage each


def normalise(row: Row, opts: RowOptions, stats: ChunkStats) -> Row | None:
    """Stage 2: ``{question, messages, gt}`` in protocol form, or None (reason counted)."""
    normalized, reason = normalize_row(
        row, mode=opts.system_prompt_mode, template=opts.system_prompt
    )
    if normalized is None:
        stats.dropped[reason] += 1
        return None
    stats.stage1_rows += 1
    return normalized


def prune(
    messages: list[Any], opts: RowOptions, stats: ChunkStats, read_calls: CallReader
) -> list[Any] | None:
    """Stage 3: without the turns that call tools outside ``opts.allowed_tools``. None when a
    message is not an object (counted as ``row_error``, as it always was)."""
    if not all(isinstance(m, dict) for m in messages):
        stats.dropped["row_error"] += 1
        return None
    kept, pruned = prune_disallowed_tools(messages, opts.allowed_tools, read_calls)
    stats.pruned_tool_turns_removed += len(pruned.tools)
    stats.pruned_tool_response_turns_removed += sum(pruned.responses)
    for names in pruned.tools:
        stats.pruned_tool_names.update(names)
    return kept


def dedup(messages: list[Any], stats: ChunkStats, read_calls: CallReader) -> list[Any]:
    """Stage 4: without the turns that only repeat earlier tool calls."""
    kept, duplicates = drop_duplicate_tool_calls(messages, read_calls)
    stats.duplicate_tool_turns_removed += duplicates
    return kept


def validate(messages: list[Any], opts: RowOptions, stats: ChunkStats) -> bool:
    """Stage 5: whether the conversation is valid (else its reason is counted)."""
    reason = validate_messages(messages)
    if reason is None and opts.strict_format:
        reason = _strict_format_error(messages)
    if reason is not None:
        stats.dropped[reason] += 1
        return False
    return True


def _strict_format_error(messages: list[dict[str, Any]]) -> str | None:
    last = len(messages) - 1
    for idx in range(2, len(messages), 2):
        if not check_turn_format(messages[idx]["content"], idx == last):
            return f"turn_format_invalid_at_{idx}"
    return None


def scored(normalized: Row, messages: list[Any], read_calls: CallReader) -> Row:
    """The stage-2 output of a valid row with what stages 6-7 read: ``_turns``, ``_tool_names``,
    ``_answer`` (final answer text, '' if none), ``_em`` and ``_f1``."""
    answer = extract_answer(messages[-1]["content"]) or ""
    gt = normalized["gt"]
    return {
        "question": normalized["question"],
        "messages": messages,
        "gt": gt,
        "_turns": count_turns(messages),
        "_tool_names": tool_names(messages, read_calls),
        "_answer": answer,
        "_em": bool(answer) and exact_match(answer, gt),
        "_f1": f1_score(answer, gt) if answer else 0.0,
    }


# --------------------------------------------------------------------------- rows and chunks


def process_row(row: Row, opts: RowOptions, stats: ChunkStats) -> tuple[Row | None, Row | None]:
    """(stage-2 row or None, valid scored row or None) for one input row; updates ``stats``."""
    normalized = normalise(row, opts, stats)
    if normalized is None:
        return None, None
    read_calls = cached_call_reader()  # one row's stages parse each tool call once
    messages = prune(normalized["messages"], opts, stats, read_calls)
    if messages is None:
        return normalized, None
    messages = dedup(messages, stats, read_calls)
    if not validate(messages, opts, stats):
        return normalized, None
    valid = scored(normalized, messages, read_calls)
    stats.stage2_rows += 1
    return normalized, valid


def process_rows(rows: list[Any], opts: RowOptions) -> ProcessedRows:
    """Stages 2-5 over a chunk. A decoded row that is not an object (or could not be decoded:
    an exception instance) counts as ``unreadable_row``."""
    out = ProcessedRows(stats=ChunkStats(source_rows=len(rows)))
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            out.stats.dropped["unreadable_row"] += 1
            continue
        try:
            s1, s2 = process_row(row, opts, out.stats)
        except Exception as exc:  # a bug must not stop the run; it is reported
            out.stats.unexpected_errors += 1
            out.errors.append(RowError(i, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        if s1 is not None and opts.keep_stage1:
            out.stage1.append((i, s1))
        if s2 is not None:
            out.valid.append((i, s2))
    return out
