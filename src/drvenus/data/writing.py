"""Stage 8 of ``drvenus data clean``, write: the final parquet (and JSONL), the optional stage
files and ``stats.json``.

Every output goes through :class:`OutputFiles`: it is written under a temporary name in the
output folder and renamed into place only when the whole run completes, so a failed or
interrupted run (Ctrl-C) leaves no partial or empty output and no temporary file behind.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from drvenus.data.resample import Resampled

FINAL_PARQUET = "cleaned_resampled.parquet"
FINAL_JSONL = "cleaned_resampled.jsonl"
STAGE1_PARQUET = "stage1_normalized.parquet"
STAGE2_PARQUET = "stage2_deduped.parquet"
STATS_JSON = "stats.json"
OUTPUT_NAMES = frozenset({FINAL_PARQUET, FINAL_JSONL, STAGE1_PARQUET, STAGE2_PARQUET, STATS_JSON})


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
        return self

    def _tmp(self, name: str) -> Path:
        return self.dir / f".{name}.{os.getpid()}.tmp"

    def temp(self, name: str) -> Path:
        """Where to write output ``name`` (renamed to ``dir / name`` by :meth:`commit`)."""
        self._pending[name] = path = self._tmp(name)
        return path

    def scratch(self, name: str) -> Path:
        """A working file of the run, always removed at the end."""
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


class LazyParquetWriter:
    """A parquet writer that creates its file on the first batch (no rows: no file)."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path = path
        self.schema = schema
        self._writer: pq.ParquetWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema)
        self._writer.write_batch(batch)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class RowTaker:
    """Rows of a (memory-mapped, many-batch) table by index, a few at a time, in any order.

    ``Table.take`` on a chunked table first concatenates each column's chunks: on a large
    input that copies the whole (memory-mapped) messages column into memory, and past 2 GiB of
    strings the 32-bit offsets overflow ("offset overflow while concatenating arrays"). Here
    each index is taken from its own record batch, so only the rows asked for are copied.
    """

    def __init__(self, table: pa.Table):
        self._batches = [b for b in table.to_batches() if b.num_rows]
        self._schema = table.schema
        self._starts: list[int] = []
        total = 0
        for batch in self._batches:
            self._starts.append(total)
            total += batch.num_rows
        self.num_rows = total

    def take(self, indices: Sequence[int]) -> pa.Table:
        """The rows at ``indices`` (in that order, repeats allowed) as one small table."""
        by_batch: dict[int, list[tuple[int, int]]] = {}
        for position, index in enumerate(indices):
            if not 0 <= index < self.num_rows:
                raise IndexError(f"row {index} out of range (table of {self.num_rows} rows)")
            b = bisect.bisect_right(self._starts, index) - 1
            by_batch.setdefault(b, []).append((position, index - self._starts[b]))
        parts, order = [], []
        for b, wanted in by_batch.items():
            parts.append(self._batches[b].take(pa.array([i for _, i in wanted], pa.int64())))
            order += [position for position, _ in wanted]
        if not parts:
            return self._schema.empty_table()
        gathered = pa.Table.from_batches(parts, schema=self._schema).combine_chunks()
        back = sorted(range(len(order)), key=order.__getitem__)  # gathered row -> request order
        return gathered.take(pa.array(back, pa.int64()))


def write_stats(out: OutputFiles, stats: dict[str, Any]) -> None:
    out.temp(STATS_JSON).write_text(
        json.dumps(stats, ensure_ascii=False, indent=2), encoding="utf-8"
    )


def write_final(
    table: pa.Table,
    sample: Resampled,
    out: OutputFiles,
    *,
    keep_metadata: bool,
    write_jsonl: bool,
    slice_rows: int = 256,
) -> int:
    """Stage 8: the resampled rows of ``table`` (valid rows), in ``sample`` order, as the final
    parquet (and JSONL); returns the number of rows written."""
    cols = ["question", "messages", "gt"]
    if keep_metadata:
        cols += ["_source_file", "_source_row", "_turns"]
    base = table.select(cols)
    schema = base.schema
    if keep_metadata:
        schema = schema.append(pa.field("_resample_multiplier", pa.int64())).append(
            pa.field("_sample_copy", pa.int64())
        )
    rows = RowTaker(base)
    jsonl = out.temp(FINAL_JSONL).open("w", encoding="utf-8") if write_jsonl else None
    try:
        with pq.ParquetWriter(out.temp(FINAL_PARQUET), schema) as writer:
            for s in range(0, len(sample.index), slice_rows):
                part = rows.take(sample.index[s : s + slice_rows])
                if keep_metadata:
                    part = part.append_column(
                        "_resample_multiplier",
                        pa.array(sample.multipliers[s : s + slice_rows], pa.int64()),
                    ).append_column(
                        "_sample_copy", pa.array(sample.copies[s : s + slice_rows], pa.int64())
                    )
                writer.write_table(part)
                if jsonl is not None:
                    for rec in part.to_pylist():
                        jsonl.write(json.dumps(_plain_messages(rec), ensure_ascii=False) + "\n")
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
