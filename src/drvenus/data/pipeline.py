"""``drvenus data clean``: raw or already-clean SFT trajectories in, DR-Venus's output files out.

The stages, numbered the same here, in the logs (``[3/8 prune] ...``) and in docs/DATA.md:

====  =========  ======================  ====================================================
 #    stage      where                   what
====  =========  ======================  ====================================================
 1    read       plan.py, reading.py     input files, schema check, chunks of rows
 2    normalise  normalize.py, rows.py   per row, in the workers: protocol form
 3    prune      stages.py, rows.py      per row: drop turns calling disallowed tools
 4    dedup      stages.py, rows.py      per row: drop turns repeating earlier tool calls
 5    validate   stages.py, rows.py      per row: conversation structure (drop reasons)
 6    judge      correctness.py          correctness filter over the valid rows
 7    resample   resample.py             copies by turn count, optional shuffle
 8    write      writing.py              all outputs, renamed into place at the end
====  =========  ======================  ====================================================

Flow: the main process reads record batches (pyarrow ``iter_batches``; JSONL in line chunks)
and hands them to :class:`~drvenus.data.workers.WorkerPool` (stages 2-5, a bounded number of
chunks in flight, results in input order); the valid rows are appended, in input order, to a
scratch Arrow IPC file. Stages 6-8 read it memory-mapped (:mod:`drvenus.data.scratch`),
dropping the pages they have read as they go: stage 6 reads only the small answer columns,
stage 7 the turn counts and tool names batch by batch (its result is an index list over the
file), stage 8 writes the rows in that order as one-row views, in bounded parts. Memory stays
bounded by the chunks in flight and the parts written, whatever the input size, and the output
is the same for any number of workers or chunk size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from drvenus.data.correctness import filter_correct
from drvenus.data.options import CleanOptions
from drvenus.data.plan import RunPlan, nothing_read_error, plan_run
from drvenus.data.reading import Chunk, DataInputError, ipc_batch, read_chunks
from drvenus.data.report import RunCounts, stats_document
from drvenus.data.resample import Resampler
from drvenus.data.rows import ChunkStats
from drvenus.data.scratch import ValidRows
from drvenus.data.workers import ChunkTask, WorkerPool
from drvenus.data.writing import (
    FINAL_PARQUET,
    STAGE1_PARQUET,
    STAGE2_PARQUET,
    LazyParquetWriter,
    OutputFiles,
    write_final,
    write_stats,
)

log = logging.getLogger(__name__)

STAGES = ("read", "normalise", "prune", "dedup", "validate", "judge", "resample", "write")

ProgressFn = Callable[[int, int | None], None]


def log_stage(stage: str, msg: str, *args: Any) -> None:
    """An INFO line prefixed with the stage's number and name, e.g. ``[3/8 prune]``."""
    log.info("[%d/%d %s] " + msg, STAGES.index(stage) + 1, len(STAGES), stage, *args)


def run_clean(opts: CleanOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run the whole pipeline; returns the stats written to ``stats.json``.

    Raises :class:`NothingReadError` when no input file could be found or read, and
    :class:`NothingKeptError` (writing nothing) when every row was dropped. The output
    folder is created once the inputs are checked; the outputs appear only when the run
    completes (an exception or Ctrl-C leaves none, and no temporary file).
    """
    t0 = time.perf_counter()
    plan = plan_run(opts)
    log_stage("read", "%d file(s), %d worker(s), correctness=%s",
              len(plan.files), plan.workers, plan.mode)
    counts = RunCounts.start(plan.files, plan.inputs.errors)
    with OutputFiles(plan.out_dir) as out:
        valid_path = out.scratch("valid.arrow")
        clean_rows(plan, out, valid_path, counts, progress)
        if counts.nothing_read():
            raise nothing_read_error(counts.file_errors)
        _log_row_stages(counts.totals)
        with ValidRows(valid_path) as valid:
            stats = finish(plan, valid, out, counts)
        if not stats["rows"]["final_resampled"]:  # an empty dataset trains nothing: an error
            raise nothing_kept_error(stats)
        stats["timing"] = {"elapsed_s": round(time.perf_counter() - t0, 3),
                           "workers": plan.workers}
        write_stats(out, stats)
        out.commit()
    rows = stats["rows"]
    log.info(
        "data clean: %d source -> %d normalized -> %d valid -> %d final rows (correctness=%s)",
        rows["source"], rows["stage1_normalized"], rows["stage2_valid"],
        rows["final_resampled"], plan.mode,
    )
    return stats


class NothingKeptError(DataInputError):
    """Every input row was dropped: there is no dataset to write."""


def nothing_kept_error(stats: dict[str, Any]) -> NothingKeptError:
    """The one-line error of a run that kept no row, with the main reasons rows were dropped."""
    rows = stats["rows"]
    reasons = sorted(stats.get("drop_reasons", {}).items(), key=lambda kv: -kv[1])[:4]
    why = ", ".join(f"{k}={v}" for k, v in reasons) or "see --keep-intermediate"
    stage = ("the correctness filter dropped every valid row"
             if rows.get("stage2_valid") else "no row was a valid trajectory")
    return NothingKeptError(
        f"no row kept: {stage} ({rows.get('source', 0)} source rows; dropped: {why}); "
        "nothing written")


# --------------------------------------------------------------------------- stages 1-5


def _chunks(plan: RunPlan, counts: RunCounts) -> Iterator[Chunk]:
    """Stage 1: the chunks of every usable input file, in file order."""
    for path in plan.files:
        if path.name not in plan.inputs.errors:
            on_error = partial(counts.file_error, path.name)
            yield from read_chunks(path, plan.opts.chunk_rows, on_error)


def clean_rows(
    plan: RunPlan,
    out: OutputFiles,
    valid_path: Path,
    counts: RunCounts,
    progress: ProgressFn | None,
) -> None:
    """Stages 1-5: every chunk through the workers; the valid rows are appended in input order
    to the Arrow file ``valid_path``, the stage-2 rows to ``stage1_normalized.parquet``
    (``--keep-intermediate``); the counters go to ``counts``."""
    task = ChunkTask(plan.row_options, plan.stage1_schema, plan.valid_schema)
    stage1 = None
    if plan.opts.keep_intermediate:
        stage1 = LazyParquetWriter(out.temp(STAGE1_PARQUET), plan.stage1_schema)
    done = 0
    try:
        with (
            pa.OSFile(str(valid_path), "wb") as sink,
            pa.ipc.new_file(sink, plan.valid_schema) as valid,
            WorkerPool(plan.workers) as pool,
        ):
            for chunk, result in pool.map_ordered(task, _chunks(plan, counts)):
                counts.record(chunk, result)
                if result.valid is not None:
                    batch = ipc_batch(result.valid)
                    if batch.num_rows:
                        valid.write_batch(batch)
                if result.stage1 is not None and stage1 is not None:
                    stage1.write(ipc_batch(result.stage1))
                done += chunk.rows
                if progress:
                    progress(done, plan.inputs.total_rows)
    finally:
        if stage1 is not None:
            stage1.close()


def _log_row_stages(t: ChunkStats) -> None:
    log_stage("normalise", "%d of %d rows normalised", t.stage1_rows, t.source_rows)
    log_stage("prune", "%d tool turns and %d tool responses removed",
              t.pruned_tool_turns_removed, t.pruned_tool_response_turns_removed)
    log_stage("dedup", "%d duplicate tool turns removed", t.duplicate_tool_turns_removed)
    log_stage("validate", "%d of %d normalised rows valid", t.stage2_rows, t.stage1_rows)
    if t.unexpected_errors:
        log.warning("%d row(s) failed with an unexpected error (see above)", t.unexpected_errors)


# --------------------------------------------------------------------------- stages 6-8


def _judge_columns(mode: str) -> list[str]:
    """The valid-row columns stage 6 reads in ``mode``."""
    if mode == "off":
        return []
    if mode in ("em", "f1"):
        return ["_answer", "_em", "_f1"]
    return ["_answer", "_em", "_f1", "question", "gt"]


def finish(plan: RunPlan, valid: ValidRows, out: OutputFiles, counts: RunCounts) -> dict[str, Any]:
    """Stages 6-8 over the valid rows (the memory-mapped scratch file); returns the stats
    document. Each stage reads the file batch by batch, or only its small columns, and
    releases the mapped pages as it goes (:class:`~drvenus.data.scratch.ValidRows`)."""
    opts = plan.opts
    if opts.keep_intermediate:
        cols = [*plan.stage1_schema.names, "_turns"]
        stage2 = LazyParquetWriter(
            out.temp(STAGE2_PARQUET), pa.schema([plan.valid_schema.field(c) for c in cols])
        )
        for batch in valid.scan(cols):
            stage2.write(batch)
        stage2.close()
    judged = filter_correct(
        valid.table(_judge_columns(plan.mode)), plan.mode, f1_threshold=opts.f1_threshold,
        judge=opts.judge, keep_judge_failures=opts.keep_judge_failures,
        default_cache=plan.out_dir / "judge_cache.sqlite",
    )
    valid.release()
    log_stage("judge", "correctness=%s: %d of %d valid rows kept",
              plan.mode, sum(judged.keep), valid.num_rows)
    sampler = Resampler(opts.policy)
    for batch in valid.scan(["_turns", "_tool_names", "_source_file"]):
        keep = judged.keep[sampler.rows : sampler.rows + batch.num_rows]
        sampler.add(keep, *(c.to_pylist() for c in batch.columns))
    sample = sampler.result(shuffle_seed=opts.seed if opts.shuffle else None)
    log_stage("resample", "%d rows (%s)%s", len(sample.index),
              ", ".join(f"x{k}: {v}" for k, v in sample.multiplier_counts.items()) or "none",
              f", shuffled with seed {opts.seed}" if opts.shuffle else "")
    final_rows = write_final(
        valid, sample, out, keep_metadata=opts.keep_metadata, write_jsonl=opts.write_jsonl
    )
    log_stage("write", "%d rows to %s", final_rows, plan.out_dir / FINAL_PARQUET)
    return stats_document(plan, counts, judged, sample, final_rows)
