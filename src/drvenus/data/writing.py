"""Stage 8 of ``drvenus data clean``, write: the final parquet (and JSONL), the optional stage
files and ``stats.json``.

Every output goes through :class:`OutputFiles`: it is written under a temporary name in the
output folder and renamed into place only when the whole run completes, so a failed or
interrupted run (Ctrl-C) leaves no partial or empty output and no temporary file behind.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from drvenus.data.resample import Resampled
from drvenus.data.scratch import ValidRows

FINAL_PARQUET = "cleaned_resampled.parquet"
FINAL_JSONL = "cleaned_resampled.jsonl"
STAGE1_PARQUET = "stage1_normalized.parquet"
STAGE2_PARQUET = "stage2_deduped.parquet"
STATS_JSON = "stats.json"
OUTPUT_NAMES = frozenset({FINAL_PARQUET, FINAL_JSONL, STAGE1_PARQUET, STAGE2_PARQUET, STATS_JSON})
SCRATCH_NAMES = frozenset({"valid.arrow"})
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.tmp")

log = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temp_files(directory: Path) -> list[Path]:
    """Remove the temporary and scratch files of runs that were killed (SIGKILL, a power cut:
    no cleanup ran), recognised by name and by their process id no longer running; returns
    them."""
    removed = []
    for path in directory.glob(".*.tmp"):
        m = _TEMP_NAME.fullmatch(path.name)
        if m is None or m["name"] not in OUTPUT_NAMES | SCRATCH_NAMES:
            continue
        pid = int(m["pid"])
        if pid != os.getpid() and not _alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed %d temporary file(s) of killed runs from %s", len(removed), directory)
    return removed


class OutputFiles:
    """The files of one run in ``directory`` (created on entry). :meth:`temp` gives the path to
    write an output to; :meth:`commit` renames all of them into place, in the order they were
    asked for. Leaving the context removes whatever was not committed, the scratch files, and
    the folder itself when this run created it and the run failed."""

    def __init__(self, directory: Path):
        self.dir = directory
        self._created = False
        self._pending: dict[str, Path] = {}
        self._scratch: list[Path] = []

    def __enter__(self) -> OutputFiles:
        self._created = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(self.dir)
        return self

    def _tmp(self, name: str) -> Path:
        return self.dir / f".{name}.{os.getpid()}.tmp"

    def temp(self, name: str) -> Path:
        """Where to write output ``name`` (renamed to ``dir / name`` by :meth:`commit`)."""
        self._pending[name] = path = self._tmp(name)
        return path

    def scratch(self, name: str) -> Path:
        """A working file of the run (one of :data:`SCRATCH_NAMES`), always removed at the
        end."""
        path = self._tmp(name)
        self._scratch.append(path)
        return path

    def commit(self) -> None:
        for name, path in self._pending.items():
            if path.exists():
                os.replace(path, self.dir / name)
        self._pending.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for path in [*self._pending.values(), *self._scratch]:
            path.unlink(missing_ok=True)
        if exc_type is not None and self._created:
            try:
                self.dir.rmdir()  # only when empty
            except OSError:
                pass


# Parquet row groups of the outputs: at most this many rows and (about) this many bytes each.
ROW_GROUP_ROWS = 128
ROW_GROUP_BYTES = 32 * 2**20


class LazyParquetWriter:
    """A parquet writer that creates its file on the first rows (no rows: no file).

    Batches are buffered into row groups of at most ``max_rows`` rows and about ``max_bytes``
    (a group is written as soon as either is reached, so it holds at most one batch past the
    bytes bound): memory stays bounded whatever the input size. Groups end every ``max_rows``
    rows whatever the batches written, unless the bytes bound ends one first.
    """

    def __init__(
        self,
        path: Path,
        schema: pa.Schema,
        *,
        max_rows: int = ROW_GROUP_ROWS,
        max_bytes: int = ROW_GROUP_BYTES,
    ):
        self.path = path
        self.schema = schema
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.rows_written = 0
        self.row_groups = 0
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0

    @property
    def pending_batches(self) -> int:
        """Batches buffered for the next row group."""
        return len(self._pending)

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        parts = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        for part in parts:
            start = 0
            while start < part.num_rows:  # a batch longer than a row group is split
                piece = part.slice(start, self.max_rows - self._pending_rows)
                start += piece.num_rows
                self._pending.append(piece)
                self._pending_rows += piece.num_rows
                self._pending_bytes += piece.nbytes
                if self._pending_rows >= self.max_rows or self._pending_bytes >= self.max_bytes:
                    self.flush()

    def flush(self) -> None:
        """Write the buffered batches as one row group (joined first: the file's bytes then do
        not depend on how the rows were batched; a group is small, so joining is cheap)."""
        if not self._pending:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema)
        group = pa.Table.from_batches(self._pending, schema=self.schema).combine_chunks()
        self._writer.write_table(group)
        self.rows_written += self._pending_rows
        self.row_groups += 1
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class RowTaker:
    """Rows of a many-batch table (the memory-mapped valid rows) by index, in any order.

    ``Table.take`` on a chunked table first concatenates each column's chunks: on a large
    input that copies the whole (memory-mapped) messages column into memory, and past 2 GiB of
    strings the 32-bit offsets overflow ("offset overflow while concatenating arrays"). Here
    each row asked for is a one-row, zero-copy slice of its own record batch: nothing is
    concatenated or copied, whatever the size of the rows or of the table.
    """

    def __init__(
        self, source: pa.Table | Sequence[pa.RecordBatch], schema: pa.Schema | None = None
    ):
        if isinstance(source, pa.Table):
            schema = source.schema
            source = source.to_batches()
        self._batches = [b for b in source if b.num_rows]
        if schema is None:
            if not self._batches:
                raise ValueError("a schema is needed when there are no batches")
            schema = self._batches[0].schema
        self._schema = schema
        self._starts: list[int] = []
        total = 0
        for batch in self._batches:
            self._starts.append(total)
            total += batch.num_rows
        self.num_rows = total

    def row(self, index: int) -> pa.RecordBatch:
        """Row ``index`` as a one-row view of its batch."""
        if not 0 <= index < self.num_rows:
            raise IndexError(f"row {index} out of range (table of {self.num_rows} rows)")
        b = bisect.bisect_right(self._starts, index) - 1
        return self._batches[b].slice(index - self._starts[b], 1)

    def take(self, indices: Sequence[int]) -> pa.Table:
        """The rows at ``indices`` (in that order, repeats allowed) as a table of views."""
        return pa.Table.from_batches([self.row(i) for i in indices], schema=self._schema)


def write_stats(out: OutputFiles, stats: dict[str, Any]) -> None:
    out.temp(STATS_JSON).write_text(
        json.dumps(stats, ensure_ascii=False, indent=2), encoding="utf-8"
    )


def final_parts(
    rows: RowTaker, sample: Resampled, *, max_rows: int, max_bytes: int
) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
    """The final rows in ``sample`` order, cut into parts of at most ``max_rows`` rows and
    about ``max_bytes`` (a part ends at the row that reaches it): ``(first position, rows)``."""
    part: list[pa.RecordBatch] = []
    size = 0
    first = 0
    for k, index in enumerate(sample.index):
        row = rows.row(index)
        part.append(row)
        size += row.nbytes
        if len(part) >= max_rows or size >= max_bytes:
            yield first, part
            part, size, first = [], 0, k + 1
    if part:
        yield first, part


def write_final(
    valid: ValidRows,
    sample: Resampled,
    out: OutputFiles,
    *,
    keep_metadata: bool,
    write_jsonl: bool,
    max_rows: int = ROW_GROUP_ROWS,
    max_bytes: int = ROW_GROUP_BYTES,
) -> int:
    """Stage 8: the resampled rows of ``valid``, in ``sample`` order, as the final parquet (and
    JSONL), one row group per part of :func:`final_parts`; the mapping's pages are released
    after each part. Returns the number of rows written."""
    cols = ["question", "messages", "gt"]
    if keep_metadata:
        cols += ["_source_file", "_source_row", "_turns"]
    base = pa.schema([valid.schema.field(c) for c in cols])
    schema = base
    if keep_metadata:
        schema = schema.append(pa.field("_resample_multiplier", pa.int64())).append(
            pa.field("_sample_copy", pa.int64())
        )
    rows = RowTaker([b.select(cols) for b in valid.batches], schema=base)
    jsonl = out.temp(FINAL_JSONL).open("w", encoding="utf-8") if write_jsonl else None
    try:
        with pq.ParquetWriter(out.temp(FINAL_PARQUET), schema) as writer:
            for first, batch_rows in final_parts(rows, sample, max_rows=max_rows,
                                                 max_bytes=max_bytes):
                part = pa.Table.from_batches(batch_rows, schema=base)
                if keep_metadata:
                    end = first + part.num_rows
                    part = part.append_column(
                        "_resample_multiplier",
                        pa.array(sample.multipliers[first:end], pa.int64()),
                    ).append_column(
                        "_sample_copy", pa.array(sample.copies[first:end], pa.int64())
                    )
                writer.write_table(part)
                if jsonl is not None:
                    for rec in part.to_pylist():
                        jsonl.write(json.dumps(_plain_messages(rec), ensure_ascii=False) + "\n")
                del part, batch_rows
                valid.release()
    finally:
        if jsonl is not None:
            jsonl.close()
    return len(sample.index)


def _plain_messages(rec: dict[str, Any]) -> dict[str, Any]:
    """Drop null extra message fields that only exist because another input had them."""
    msgs = rec.get("messages")
    if isinstance(msgs, list):
        rec["messages"] = [
            {k: v for k, v in m.items() if v is not None or k in ("role", "content")}
            for m in msgs
        ]
    return rec
