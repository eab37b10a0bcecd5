"""Stage 1 of ``drvenus data clean``, read: find the input files, check their schemas, and cut
them into chunks of rows for the workers (parquet record batches as Arrow IPC bytes; JSONL as
raw lines, decoded in the worker). Also the schema check of ``data export`` / ``data stats``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from orjson import loads as _loads

from drvenus.records import json_layout, parse_json_text

log = logging.getLogger(__name__)

INPUT_COLUMNS = ("meta", "messages", "system_prompt", "question", "gt")


class DataInputError(ValueError):
    """An input file that cannot be used (unreadable, or the wrong columns); one line."""


def list_input_files(path: Path, pattern: str) -> list[Path]:
    """The file itself, or the sorted files matching ``pattern`` in the directory."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.glob(pattern) if p.is_file())


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


# --------------------------------------------------------------------------- schemas


def _is_list_of_struct(t: pa.DataType, fields: tuple[str, ...]) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    return pa.types.is_struct(item) and all(item.get_field_index(f) >= 0 for f in fields)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _not_text(where: str, fields: dict[str, pa.DataType]) -> str | None:
    """"wrong schema: ..." for the first of ``fields`` that is not text (every row would be
    dropped for it), or None."""
    for name, t in fields.items():
        if not _is_text(t):
            return f"wrong schema: {where}{name} is {t}, not a string"
    return None


def _columns(schema: pa.Schema) -> str:
    return ", ".join(schema.names) or "none"


def input_schema_problem(schema: pa.Schema) -> str | None:
    """Why a ``data clean`` input parquet cannot be used, or None. Raw input needs ``meta``
    (question, answer) and ``messages``; clean input ``question``, ``messages`` and ``gt``."""
    names = set(schema.names)
    missing = [] if "messages" in names else ["messages"]
    if "meta" not in names:
        clean_missing = [c for c in ("question", "gt") if c not in names]
        if len(clean_missing) == 2:
            missing.append("meta (raw input) or question, gt (clean input)")
        else:
            missing += clean_missing
    if missing:
        return (f"wrong schema: missing column(s) {' and '.join(missing)} "
                f"(found: {_columns(schema)})")
    kind = schema.field("messages").type
    if not _is_list_of_struct(kind, ("role", "content")):
        return f"wrong schema: messages is {kind}, not a list of {{role, content}}"
    item = kind.value_type
    problem = _not_text("messages.", {f: item.field(f).type for f in ("role", "content")})
    if problem is not None:
        return problem
    if "question" in names and "gt" in names:
        return _not_text("", {f: schema.field(f).type for f in ("question", "gt")})
    meta = schema.field("meta").type
    if not (pa.types.is_struct(meta) and all(meta.get_field_index(f) >= 0
                                             for f in ("question", "answer"))):
        return f"wrong schema: meta is {meta}, not a struct with question and answer"
    return _not_text("meta.", {f: meta.field(f).type for f in ("question", "answer")})


def open_cleaned_parquet(path: Path) -> pq.ParquetFile:
    """A cleaned parquet for ``data export`` / ``data stats``; :class:`DataInputError` when it
    cannot be read or has no ``messages`` list of {role, content}."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataInputError(f"{path}: not a readable parquet file ({exc})") from None
    schema = pf.schema_arrow
    if "messages" not in schema.names:
        raise DataInputError(
            f"{path}: wrong schema: missing column(s) messages (found: {_columns(schema)})"
        )
    if not _is_list_of_struct(schema.field("messages").type, ("role", "content")):
        raise DataInputError(
            f"{path}: wrong schema: messages is {schema.field('messages').type}, "
            "not a list of {role, content}"
        )
    return pf


@dataclass
class InputCheck:
    """What stage 1 learns before reading rows: the files that cannot be used (name -> one-line
    reason), the number of rows (None when a JSONL file makes it unknown) and the output
    ``messages`` element type."""

    errors: dict[str, str] = field(default_factory=dict)
    total_rows: int | None = 0
    message_type: pa.DataType = field(default_factory=lambda: pa.struct([]))


def check_inputs(files: list[Path]) -> InputCheck:
    """Open each parquet's footer: schema problems and unreadable files are reported here,
    before any output exists."""
    check = InputCheck()
    schemas: list[pa.Schema] = []
    for path in files:
        if not is_parquet(path):
            check.total_rows = None
            continue
        try:
            meta = pq.read_metadata(path)
            schema = meta.schema.to_arrow_schema()
        except Exception as exc:  # any unreadable file is reported, not fatal
            check.errors[path.name] = f"{type(exc).__name__}: {exc}"
            continue
        problem = input_schema_problem(schema)
        if problem is not None:
            check.errors[path.name] = problem
            continue
        schemas.append(schema)
        if check.total_rows is not None:
            check.total_rows += meta.num_rows
    check.message_type = message_type(schemas)
    return check


def message_type(schemas: list[pa.Schema]) -> pa.DataType:
    """The output ``messages`` element type: role and content, then any extra message fields
    found in the inputs' schemas (kept as DR-Venus keeps them for clean rows)."""
    fields: dict[str, pa.Field] = {
        "role": pa.field("role", pa.string()),
        "content": pa.field("content", pa.string()),
    }
    for schema in schemas:
        for f in schema.field("messages").type.value_type:
            if f.name not in fields:
                fields[f.name] = f.with_nullable(True)
            elif f.name not in ("role", "content") and fields[f.name].type != f.type:
                log.warning("message field %r has conflicting types; dropping it", f.name)
                fields[f.name] = pa.field(f.name, pa.null())
    return pa.struct([f for f in fields.values() if f.type != pa.null()])


def stage_schemas(message_type: pa.DataType) -> tuple[pa.Schema, pa.Schema]:
    """The schemas of the stage-2 rows and of the valid rows (with what stages 6-7 read)."""
    base = [
        pa.field("question", pa.string()),
        pa.field("messages", pa.list_(message_type)),
        pa.field("gt", pa.string()),
        pa.field("_source_file", pa.string()),
        pa.field("_source_row", pa.int64()),
    ]
    valid = base + [
        pa.field("_turns", pa.int64()),
        pa.field("_tool_names", pa.list_(pa.string())),
        pa.field("_answer", pa.string()),
        pa.field("_em", pa.bool_()),
        pa.field("_f1", pa.float64()),
    ]
    return pa.schema(base), pa.schema(valid)


# --------------------------------------------------------------------------- chunks


def ipc_bytes(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def ipc_batch(buf: Any) -> pa.RecordBatch:
    return pa.ipc.open_stream(buf).read_next_batch()


@dataclass
class Chunk:
    """Rows ``start .. start + rows`` of one input file, as sent to a worker."""

    file: str
    start: int
    rows: int
    kind: Literal["arrow", "lines"]
    payload: Any

    def decode(self) -> list[Any]:
        """The rows as Python objects; an undecodable JSONL line becomes a ValueError."""
        if self.kind == "arrow":
            return ipc_batch(self.payload).to_pylist()
        rows: list[Any] = []
        for line in self.payload:
            try:
                rows.append(_loads(line))
            except Exception as exc:  # counted as an unreadable row
                rows.append(ValueError(str(exc)))
        return rows


def read_chunks(path: Path, chunk_rows: int, on_error: Callable[[str], None]) -> Iterator[Chunk]:
    """Chunks of one file; a read error ends the file (reported), rows before it still count."""
    try:
        if is_parquet(path):
            yield from _parquet_chunks(path, chunk_rows)
        else:
            yield from _json_chunks(path, chunk_rows)
    except Exception as exc:  # a broken file never stops the run
        on_error(f"{type(exc).__name__}: {exc}")


# Parquet reads go through a buffered stream of this size: without it pyarrow reads each
# column chunk whole (a row group's messages column, the whole file when it is one row group).
READ_BUFFER_BYTES = 4 * 2**20


def _parquet_chunks(path: Path, chunk_rows: int) -> Iterator[Chunk]:
    pf = pq.ParquetFile(path, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
    cols = [c for c in INPUT_COLUMNS if c in pf.schema_arrow.names]
    start = 0
    for batch in pf.iter_batches(batch_size=chunk_rows, columns=cols):
        yield Chunk(path.name, start, batch.num_rows, "arrow", ipc_bytes(batch))
        start += batch.num_rows


def _json_chunks(path: Path, chunk_rows: int) -> Iterator[Chunk]:
    """A ``.json`` file holding one object or an array of them; otherwise JSONL."""
    with path.open("rb") as fh:
        head = fh.read(4096)
        fh.seek(0)
        if path.suffix.lower() == ".json" and json_layout(head) == "document":
            rows = parse_json_text(fh.read(), str(path))
            lines = [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in rows]
            for i in range(0, len(lines), chunk_rows):
                part = lines[i : i + chunk_rows]
                yield Chunk(path.name, i, len(part), "lines", part)
            return
        start = 0
        buf: list[bytes] = []
        for line in fh:
            if not line.strip():
                continue
            buf.append(line)
            if len(buf) >= chunk_rows:
                yield Chunk(path.name, start, len(buf), "lines", buf)
                start += len(buf)
                buf = []
        if buf:
            yield Chunk(path.name, start, len(buf), "lines", buf)
