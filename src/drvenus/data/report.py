"""What ``drvenus data clean`` reports: the counters of stages 1-5 gathered in input order
(:class:`RunCounts`, which also logs unexpected row errors with their position), and the
``stats.json`` document (:func:`stats_document`, DR-Venus's keys plus ours)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drvenus.data.reading import Chunk
from drvenus.data.rows import ChunkStats
from drvenus.data.workers import ChunkResult
from drvenus.data.writing import FINAL_JSONL, FINAL_PARQUET, STAGE1_PARQUET, STAGE2_PARQUET

if TYPE_CHECKING:
    from drvenus.data.correctness import Correctness
    from drvenus.data.plan import RunPlan
    from drvenus.data.resample import Resampled

log = logging.getLogger(__name__)

MAX_LOGGED_ROW_ERRORS = 20


@dataclass
class RunCounts:
    """Counters of stages 1-5: per file (in file order), in total, and the files that could not
    be read (name -> one-line reason)."""

    per_file: dict[str, ChunkStats]
    file_errors: dict[str, str] = field(default_factory=dict)
    totals: ChunkStats = field(default_factory=ChunkStats)
    row_errors_seen: int = 0

    @classmethod
    def start(cls, files: list[Path], file_errors: dict[str, str]) -> RunCounts:
        """Counters for ``files``; ``file_errors`` (found before reading) are logged."""
        counts = cls(per_file={p.name: ChunkStats() for p in files})
        for name, msg in file_errors.items():
            counts.file_error(name, msg)
        return counts

    def file_error(self, name: str, msg: str) -> None:
        self.file_errors[name] = msg
        log.error("cannot read %s: %s", name, msg)

    def nothing_read(self) -> bool:
        return self.totals.source_rows == 0 and len(self.file_errors) == len(self.per_file)

    def record(self, chunk: Chunk, result: ChunkResult) -> None:
        self.per_file[chunk.file].add(result.stats)
        self.totals.add(result.stats)
        if result.failure is not None:
            log.error(
                "rows %d-%d of %s failed: %s (counted in unexpected_errors)",
                chunk.start, chunk.start + chunk.rows - 1, chunk.file, result.failure,
            )
        for err in result.errors:
            self.row_errors_seen += 1
            if self.row_errors_seen > MAX_LOGGED_ROW_ERRORS:
                continue
            log.warning(
                "row %d of %s: unexpected %s (a bug, not bad data: the row is dropped and "
                "counted in unexpected_errors)", chunk.start + err.index, chunk.file, err.error,
            )
            log.debug("%s", err.traceback)
            if self.row_errors_seen == MAX_LOGGED_ROW_ERRORS:
                log.warning("further unexpected row errors are counted, not logged")


def _file_entry(st: ChunkStats, stage3_rows: int | None, error: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source_rows": st.source_rows,
        "stage1_rows": st.stage1_rows,
        "stage2_rows": st.stage2_rows,
        "dropped": dict(st.dropped),
        "unexpected_errors": st.unexpected_errors,
        "pruned_tool_turns_removed": st.pruned_tool_turns_removed,
        "pruned_tool_response_turns_removed": st.pruned_tool_response_turns_removed,
        "duplicate_tool_turns_removed": st.duplicate_tool_turns_removed,
    }
    if stage3_rows is not None:
        entry["stage3_rows"] = stage3_rows
    if error is not None:
        entry["error"] = error
    return entry


def _row_counts(totals: ChunkStats, stage3: int | None, final: int) -> dict[str, int]:
    rows = {
        "source": totals.source_rows,
        "stage1_normalized": totals.stage1_rows,
        "stage2_valid": totals.stage2_rows,
    }
    if stage3 is not None:
        rows["stage3_correct"] = stage3
    rows["final_resampled"] = final
    return rows


def stats_document(
    plan: RunPlan, counts: RunCounts, judged: Correctness, sample: Resampled, final_rows: int
) -> dict[str, Any]:
    """``stats.json`` (without ``timing``): DR-Venus's keys, then ``unexpected_errors``,
    ``correctness``, ``current_date``, ``protocol``, ``shuffle`` and ``file_errors``."""
    opts, t = plan.opts, counts.totals
    filtered = plan.mode != "off"
    drop_reasons = Counter(t.dropped)
    drop_reasons.update(judged.drops)
    out = plan.out_dir
    return {
        "input": str(plan.input_path),
        "files": [str(p) for p in plan.files],
        "output_dir": str(out),
        "system_prompt_mode": opts.system_prompt_mode,
        "allowed_tools": sorted(plan.row_options.allowed_tools),
        "turn_formula": "(len(messages) - 1) / 2",
        "resample_policy": opts.policy.as_dict(),
        "rows": _row_counts(t, sum(judged.keep) if filtered else None, final_rows),
        "pruned_tool_turns_removed": t.pruned_tool_turns_removed,
        "pruned_tool_response_turns_removed": t.pruned_tool_response_turns_removed,
        "pruned_tool_name_counts": dict(t.pruned_tool_names),
        "duplicate_tool_turns_removed": t.duplicate_tool_turns_removed,
        "drop_reasons": dict(drop_reasons),
        "unexpected_errors": t.unexpected_errors,
        "tools_after_cleaning": dict(sample.tools),
        "turn_buckets": {
            "original": dict(sample.buckets_original),
            "resampled": dict(sample.buckets_resampled),
        },
        "multiplier_distribution": dict(sample.multiplier_counts),
        "per_file": {
            name: _file_entry(st, sample.kept_per_file[name] if filtered else None,
                              counts.file_errors.get(name))
            for name, st in counts.per_file.items()
        },
        "artifacts": {
            "final_parquet": str(out / FINAL_PARQUET),
            "final_jsonl": str(out / FINAL_JSONL) if opts.write_jsonl else None,
            "stage1_parquet": str(out / STAGE1_PARQUET) if opts.keep_intermediate else None,
            "stage2_parquet": str(out / STAGE2_PARQUET) if opts.keep_intermediate else None,
        },
        "correctness": judged.info,
        "current_date": plan.current_date,
        "protocol": plan.protocol,
        "shuffle": {"enabled": opts.shuffle, "seed": opts.seed},
        "file_errors": counts.file_errors,
    }
