"""The worker plumbing of ``drvenus data clean``, all of it: stages 2-5 run on chunks of rows in
worker processes (or in this process with one worker), results come back in input order.

- :class:`ChunkTask` is what a worker runs on one chunk: decode the rows, run stages 2-5
  (:func:`drvenus.data.rows.process_rows`), return the kept rows as Arrow IPC bytes. It is a
  plain picklable object sent with each chunk: workers hold no state between chunks.
- :class:`WorkerPool` keeps at most ``2 * workers + 1`` chunks in flight (memory stays bounded)
  and yields results in submission order, so the output is the same for any worker count.
  Workers ignore Ctrl-C (SIGINT) and SIGTERM: the main process handles both, cancels what has
  not started, and waits for the chunks in progress, so an interrupted run prints no worker
  tracebacks; on Linux a worker dies with its parent (:func:`drvenus.signals.worker_init`), so
  even a killed parent leaves no worker behind.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType

import pyarrow as pa

from drvenus.data.reading import Chunk, ipc_bytes
from drvenus.data.rows import ChunkStats, RowError, RowOptions, process_rows
from drvenus.signals import worker_init

_ARROW_ROW_ERRORS = (pa.ArrowException, UnicodeError, TypeError, ValueError, OverflowError)


@dataclass
class ChunkResult:
    """Stages 2-5 of one chunk: the stage-2 rows (only with ``keep_stage1``) and the valid rows
    as Arrow IPC streams, the chunk's counters, and its unexpected row errors."""

    stage1: pa.Buffer | None
    valid: pa.Buffer | None
    stats: ChunkStats
    errors: list[RowError] = field(default_factory=list)
    failure: str | None = None  # the whole chunk failed (e.g. a worker process died)

    @classmethod
    def failed(cls, chunk: Chunk, exc: BaseException) -> ChunkResult:
        stats = ChunkStats(source_rows=chunk.rows, unexpected_errors=chunk.rows)
        return cls(None, None, stats, failure=f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class ChunkTask:
    """Stages 2-5 over one chunk (runs in a worker process)."""

    opts: RowOptions
    stage1_schema: pa.Schema
    valid_schema: pa.Schema

    def __call__(self, chunk: Chunk) -> ChunkResult:
        done = process_rows(chunk.decode(), self.opts)
        for rows in (done.stage1, done.valid):
            for i, r in rows:
                r["_source_file"], r["_source_row"] = chunk.file, chunk.start + i
        valid = _to_batch([r for _, r in done.valid], self.valid_schema, done.stats)
        stage1 = None
        if done.stage1:
            stage1 = ipc_bytes(_to_batch([r for _, r in done.stage1], self.stage1_schema, None))
        return ChunkResult(stage1, ipc_bytes(valid), done.stats, done.errors)


def _to_batch(records: list[dict], schema: pa.Schema, stats: ChunkStats | None) -> pa.RecordBatch:
    """The records as one batch; a record Arrow cannot hold (odd types, lone surrogates) is
    left out and, for valid rows, counted as ``unwritable_row``."""
    try:
        return pa.RecordBatch.from_pylist(records, schema=schema)
    except _ARROW_ROW_ERRORS:
        good = []
        for r in records:
            try:
                pa.RecordBatch.from_pylist([r], schema=schema)
                good.append(r)
            except _ARROW_ROW_ERRORS:
                if stats is not None:
                    stats.stage2_rows -= 1
                    stats.dropped["unwritable_row"] += 1
        return pa.RecordBatch.from_pylist(good, schema=schema)


class WorkerPool:
    """Runs a :class:`ChunkTask` over chunks with ``workers`` processes (one: in this process).

    Use as a context manager; leaving it (normally, on an error or on Ctrl-C) cancels the
    chunks not started and waits for the running ones."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> WorkerPool:
        if self.workers > 1:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, initializer=worker_init, initargs=(os.getpid(),)
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map_ordered(
        self, task: ChunkTask, chunks: Iterable[Chunk]
    ) -> Iterator[tuple[Chunk, ChunkResult]]:
        """``(chunk, task(chunk))`` in input order; a chunk whose task raised (or whose worker
        died) gets :meth:`ChunkResult.failed` instead."""
        if self._pool is None:
            for chunk in chunks:
                try:
                    result = task(chunk)
                except Exception as exc:  # reported as a failed chunk
                    result = ChunkResult.failed(chunk, exc)
                yield chunk, result
            return
        window: deque[tuple[Chunk, Future]] = deque()
        limit = 2 * self.workers + 1
        for chunk in chunks:
            window.append((chunk, self._pool.submit(task, chunk)))
            while len(window) > limit:
                yield _settled(*window.popleft())
        while window:
            yield _settled(*window.popleft())


def _settled(chunk: Chunk, fut: Future) -> tuple[Chunk, ChunkResult]:
    try:
        return chunk, fut.result()
    except Exception as exc:  # e.g. a worker process died
        return chunk, ChunkResult.failed(chunk, exc)
