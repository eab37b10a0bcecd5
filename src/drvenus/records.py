"""The one reader of record files: benchmark and question tables, trajectory files, saved runs.

Every command that reads rows from a file goes through here, so a file means the same thing to
``drvenus run``, ``eval``, ``rl``, ``sft``, ``data clean``, ``--system-prompt-file`` and the web
demo's replay:

- ``.jsonl`` (``.jsonl.gz``): one JSON object per line (:mod:`drvenus.jsonl`).
- ``.json``: one JSON document, an object or an array of objects, told apart from JSON lines by
  its first non-blank character (:func:`json_layout`), so leading blank lines or a byte-order
  mark change nothing; a ``.json`` file that holds JSON lines after all is read as lines.
- ``.parquet``, ``.csv``, ``.xlsx`` (``openpyxl``): tables, a dict per row.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson

from drvenus import jsonl
from drvenus.jsonl import read_jsonl

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".csv", ".xlsx", ".parquet")
TRAJECTORY_SUFFIXES = (".json", ".jsonl", ".jsonl.gz", ".parquet", ".pq")
_BLANK = b" \t\r\n\xef\xbb\xbf"  # whitespace and the UTF-8 byte-order mark
#: The largest ``.json`` document read (whole, as JSON documents must be); JSON lines stream.
MAX_DOCUMENT_BYTES = 256 << 20


class RecordsError(ValueError):
    """A file that cannot be read as records; the message is one line naming the file."""


def json_layout(head: bytes | str) -> Literal["document", "lines"]:
    """Whether text starting with ``head`` is one JSON document (an object or an array) or
    JSON lines, judged by its first non-blank character. A document starting with ``{`` may
    still be JSON lines; :func:`parse_json_text` tells them apart."""
    raw = head.encode("utf-8") if isinstance(head, str) else head
    first = raw.lstrip(_BLANK)[:1]
    return "document" if first in (b"[", b"{") else "lines"


def parse_json_text(text: str | bytes, where: str = "the file") -> list[Any]:
    """The records of JSON text: an array's items, one object, or JSON lines. Raises
    :class:`RecordsError` naming the first line that is not JSON."""
    data = text.decode("utf-8-sig") if isinstance(text, bytes) else text.lstrip("\ufeff")
    stripped = data.strip()
    if json_layout(stripped) == "document":
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            if not stripped.startswith("{"):
                raise RecordsError(f"{where}: not valid JSON") from None
        else:
            return value if isinstance(value, list) else [value]
    rows = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise RecordsError(f"{where}: line {n} is not valid JSON ({exc})") from None
    return rows


#: The largest system prompt text file (a prompt is a few KB; a trajectory file is read as rows).
MAX_PROMPT_BYTES = 1 << 20
#: The largest YAML config file (sft / rl --config).
MAX_CONFIG_BYTES = 1 << 20


def check_prompt_file(path: str | Path) -> None:
    """Refuse a system prompt text file over :data:`MAX_PROMPT_BYTES` before it is read whole
    (a trajectory file's prompt is its first row's: JSON lines and parquet stream, a ``.json``
    document is bounded by :data:`MAX_DOCUMENT_BYTES`)."""
    path = Path(path)
    if path.name.lower().endswith(TRAJECTORY_SUFFIXES):
        return
    try:
        size = path.stat().st_size
    except OSError:
        return  # the reader says what is wrong with it
    if size > MAX_PROMPT_BYTES:
        raise RecordsError(f"system prompt file {path}: {size:,} bytes, over the "
                           f"{MAX_PROMPT_BYTES:,}-byte limit of a prompt")


def read_bounded(path: Path, limit: int, advice: str = "") -> bytes:
    """The bytes of a file read whole, refused (before reading more than ``limit + 1`` bytes:
    a pipe has no size) when it is over ``limit`` bytes. Raises :class:`RecordsError`."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise RecordsError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise RecordsError(f"{path}: over {limit:,} bytes, too large to read whole"
                           + (f"; {advice}" if advice else ""))
    return raw


def iter_json_file(path: Path) -> Iterator[Any]:
    """The records of a ``.json`` / ``.jsonl(.gz)`` file. JSON lines stream; a malformed line
    raises :class:`RecordsError` with its number."""
    name = path.name.lower()
    if name.endswith(".json"):
        raw = read_bounded(path, MAX_DOCUMENT_BYTES, "write it as JSON lines (.jsonl), which "
                           "stream")
        try:
            yield from parse_json_text(raw, str(path))
        except UnicodeDecodeError:
            raise RecordsError(f"{path}: not UTF-8 text") from None
        return
    for row in read_jsonl(path, objects_only=False):
        if not row.ok:
            raise RecordsError(f"{path}: line {row.lineno}: {row.error}")
        yield row.value


def iter_parquet(
    path: Path, columns: Sequence[str] | None = None, batch_size: int = 256
) -> Iterator[dict[str, Any]]:
    """The rows of a parquet file, streamed a batch at a time; only ``columns`` that exist
    are read (all of them when None)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise RecordsError(f"{path}: not a readable parquet file ({exc})") from None
    cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
    for batch in pf.iter_batches(batch_size=batch_size, columns=cols):
        yield from batch.to_pylist()


def parquet_columns(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except (OSError, pa.ArrowException) as exc:
        raise RecordsError(f"{path}: not a readable parquet file ({exc})") from None


def iter_trajectories(path: Path, columns: Sequence[str] | None = None) -> Iterator[Any]:
    """The rows of a trajectory file (``.parquet`` / ``.json`` / ``.jsonl``), in order."""
    if path.suffix.lower() in (".parquet", ".pq"):
        yield from iter_parquet(path, columns)
    else:
        yield from iter_json_file(path)


def first_trajectory_messages(path: Path) -> Any:
    """The ``messages`` of the first row of a trajectory file (a bare message list counts as
    one row); None when there is none."""
    if path.suffix.lower() in (".parquet", ".pq") and "messages" not in parquet_columns(path):
        raise RecordsError(f"{path}: not a trajectory parquet with a 'messages' column")
    if path.name.lower().endswith(".json"):
        data = list(iter_json_file(path))
        if data and isinstance(data[0], dict) and "role" in data[0]:
            return data  # a bare message list
    first = next(iter(iter_trajectories(path, ["messages"])), None)
    return first.get("messages") if isinstance(first, dict) else None


def read_records(path: Path, *, what: str = "benchmark") -> list[dict[str, Any]]:
    """The rows of a CSV, XLSX, JSON, JSONL(.gz) or parquet file as dicts. Unreadable JSON
    lines are skipped with a warning that counts them; rows that are not objects too."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        rows, bad = [], 0
        for row in read_jsonl(path):
            if row.ok:
                rows.append(row.value)
            else:
                bad += 1
        if bad:
            log.warning("%s: %d unreadable line(s) skipped", path, bad)
        return rows
    if name.endswith(".json"):
        data = list(iter_json_file(path))
        if len(data) == 1 and isinstance(data[0], dict):
            data = next((data[0][k] for k in ("data", "examples", "rows") if k in data[0]), data)
        return [r for r in data if isinstance(r, dict)]
    if name.endswith(".csv"):
        csv.field_size_limit(jsonl.MAX_LINE_BYTES)
        with path.open(encoding="utf-8-sig", newline="") as fh:
            try:
                return list(csv.DictReader(_bounded_text_lines(fh, path)))
            except csv.Error as exc:  # a field over the limit
                raise RecordsError(f"{path}: {exc}") from None
    if name.endswith(".xlsx"):
        return _read_xlsx(path)
    if name.endswith((".parquet", ".pq")):
        return list(iter_parquet(path, batch_size=4096))
    raise ValueError(f"unsupported file type: {path.name} (csv, xlsx, json, jsonl, parquet)")


def _bounded_text_lines(fh: Any, path: Path) -> Iterator[str]:
    """The lines of a text file, none held longer than :data:`drvenus.jsonl.MAX_LINE_BYTES`
    characters (a longer one is refused after reading that much of it)."""
    limit = jsonl.MAX_LINE_BYTES
    while line := fh.readline(limit + 1):
        if len(line) > limit and not line.endswith("\n"):
            raise RecordsError(f"{path}: a line longer than {limit:,} characters, too large "
                               "to read")
        yield line


def _read_xlsx(path: Path) -> list[dict[str, Any]]:
    try:
        import openpyxl
    except ImportError:
        raise ValueError("reading .xlsx needs openpyxl: pip install openpyxl") from None
    book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    try:
        rows = book.worksheets[0].iter_rows(values_only=True)
        header = [str(h).strip() if h is not None else "" for h in next(rows, ())]
        out = []
        for values in rows:
            if values is None or all(v is None for v in values):
                continue
            out.append({h: v for h, v in zip(header, values, strict=False) if h})
        return out
    finally:
        book.close()


__all__ = [
    "TABLE_SUFFIXES",
    "TRAJECTORY_SUFFIXES",
    "RecordsError",
    "first_trajectory_messages",
    "iter_json_file",
    "iter_parquet",
    "iter_trajectories",
    "json_layout",
    "parquet_columns",
    "parse_json_text",
    "read_records",
]
