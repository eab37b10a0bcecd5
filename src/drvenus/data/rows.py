"""Per-row work of ``data clean`` (stages 1-3 and the answer scores), on plain Python rows.

:func:`process_rows` is what a worker process runs on one chunk; it never raises for a bad row:
the row is dropped and its reason counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from drvenus.data.correctness import exact_match, f1_score
from drvenus.data.normalize import normalize_row
from drvenus.data.stages import (
    cached_call_reader,
    count_turns,
    drop_duplicate_tool_calls,
    prune_disallowed_tools,
    tool_call_objects,
    tool_names,
    validate_messages,
)
from drvenus.protocol import check_turn_format, extract_answer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowOptions:
    """What the per-row stages need (picklable; sent once to each worker)."""

    system_prompt_mode: str
    system_prompt: str
    allowed_tools: frozenset[str]
    strict_format: bool = False
    keep_stage1: bool = False
    fast_paths: bool = True


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

    def add(self, other: ChunkStats) -> None:
        self.source_rows += other.source_rows
        self.stage1_rows += other.stage1_rows
        self.stage2_rows += other.stage2_rows
        self.dropped.update(other.dropped)
        self.pruned_tool_turns_removed += other.pruned_tool_turns_removed
        self.pruned_tool_response_turns_removed += other.pruned_tool_response_turns_removed
        self.pruned_tool_names.update(other.pruned_tool_names)
        self.duplicate_tool_turns_removed += other.duplicate_tool_turns_removed


def _strict_format_error(messages: list[dict[str, Any]]) -> str | None:
    last = len(messages) - 1
    for idx in range(2, len(messages), 2):
        if not check_turn_format(messages[idx]["content"], idx == last):
            return f"turn_format_invalid_at_{idx}"
    return None


def process_row(
    row: dict[str, Any], opts: RowOptions, stats: ChunkStats
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(stage-1 row or None, valid stage-2 row or None) for one input row; updates ``stats``.

    A stage-2 row carries ``question``, ``messages``, ``gt``, ``_turns``, ``_tool_names``,
    ``_answer`` (final answer text, '' if none), ``_em`` and ``_f1``.
    """
    normalized, reason = normalize_row(
        row, mode=opts.system_prompt_mode, template=opts.system_prompt
    )
    if normalized is None:
        stats.dropped[reason] += 1
        return None, None
    stats.stage1_rows += 1
    read_calls = cached_call_reader() if opts.fast_paths else tool_call_objects
    messages, pruned = prune_disallowed_tools(
        normalized["messages"], opts.allowed_tools, read_calls
    )
    stats.pruned_tool_turns_removed += len(pruned.tools)
    stats.pruned_tool_response_turns_removed += sum(pruned.responses)
    for names in pruned.tools:
        stats.pruned_tool_names.update(names)
    messages, duplicates = drop_duplicate_tool_calls(messages, read_calls)
    stats.duplicate_tool_turns_removed += duplicates
    reason = validate_messages(messages)
    if reason is None and opts.strict_format:
        reason = _strict_format_error(messages)
    if reason is not None:
        stats.dropped[reason] += 1
        return normalized, None
    stats.stage2_rows += 1
    answer = extract_answer(messages[-1]["content"]) or ""
    gt = normalized["gt"]
    valid = {
        "question": normalized["question"],
        "messages": messages,
        "gt": gt,
        "_turns": count_turns(messages),
        "_tool_names": tool_names(messages, read_calls),
        "_answer": answer,
        "_em": bool(answer) and exact_match(answer, gt),
        "_f1": f1_score(answer, gt) if answer else 0.0,
    }
    return normalized, valid


def process_rows(
    rows: list[Any], opts: RowOptions
) -> tuple[list[tuple[int, dict]], list[tuple[int, dict]], ChunkStats]:
    """Stages 1-3 over a chunk: (stage-1 rows, valid rows, stats), rows tagged with their index
    in the chunk. Stage-1 rows are only collected when ``opts.keep_stage1``."""
    stats = ChunkStats(source_rows=len(rows))
    stage1: list[tuple[int, dict]] = []
    valid: list[tuple[int, dict]] = []
    for i, row in enumerate(rows):
        if isinstance(row, Exception):
            stats.dropped["unreadable_row"] += 1
            continue
        if not isinstance(row, dict):
            stats.dropped["unreadable_row"] += 1
            continue
        try:
            s1, s2 = process_row(row, opts, stats)
        except Exception as exc:  # noqa: BLE001 - one bad row never stops the run
            log.debug("row %d failed: %r", i, exc)
            stats.dropped["row_error"] += 1
            continue
        if s1 is not None and opts.keep_stage1:
            stage1.append((i, s1))
        if s2 is not None:
            valid.append((i, s2))
    return stage1, valid, stats
