"""The one JSONL line reader: batch results, corpora and traces read through it, and so do the
file readers of :mod:`drvenus.records` and :mod:`drvenus.questions`.

Blank lines are skipped; every other line yields a :class:`JsonlRow` with its 1-based line
number and either the parsed value or the reason it could not be used (invalid UTF-8, invalid
JSON, not an object), so callers count and name bad lines instead of failing on them.

Lines are read with a bound (:data:`MAX_LINE_BYTES`): a longer line is never held whole, it is
skipped in bounded pieces and yields an error row, so a 2 GB one-line file costs megabytes,
not gigabytes (:func:`bounded_lines`, also the reader of ``.txt`` question files).
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

#: The longest line read whole (a trajectory, a trace event, a corpus document, far less).
MAX_LINE_BYTES = 64 << 20
_SKIP_PIECE = 1 << 20  # how much of an over-long line is read at a time while skipping it


def too_long(limit: int | None = None) -> str:
    """The error of a line over ``limit`` bytes (default :data:`MAX_LINE_BYTES`)."""
    limit = MAX_LINE_BYTES if limit is None else limit
    return f"a line longer than {limit:,} bytes (skipped unread)"


def bounded_lines(fh: IO[bytes], limit: int | None = None) -> Iterator[bytes | None]:
    """The lines of a binary file, each read with at most ``limit + 1`` bytes in memory
    (default :data:`MAX_LINE_BYTES`); a longer line is skipped in pieces and comes out as
    None."""
    limit = MAX_LINE_BYTES if limit is None else limit
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        while (rest := fh.readline(_SKIP_PIECE)) and not rest.endswith(b"\n"):
            pass
        yield None


@dataclass(frozen=True, slots=True)
class JsonlRow:
    lineno: int
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_line(raw: bytes | str, *, objects_only: bool = True) -> tuple[Any, str | None]:
    """One line's value, or None and the reason it is unusable."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, "invalid UTF-8" if "utf-8" in str(exc).lower() else "invalid JSON"
    if objects_only and not isinstance(value, dict):
        return None, "not a JSON object"
    return value, None


def read_jsonl(
    source: str | Path | Iterable[bytes | str], *, objects_only: bool = True,
    max_line_bytes: int | None = None,
) -> Iterator[JsonlRow]:
    """The rows of a JSONL file (``.gz`` too) or of an iterable of lines (an open file; a
    binary one is read with the line bound too)."""
    if isinstance(source, str | Path):
        path = Path(source)
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as fh:
            yield from read_jsonl(fh, objects_only=objects_only, max_line_bytes=max_line_bytes)
        return
    lines: Iterable[bytes | str | None] = source
    if isinstance(source, io.BufferedIOBase | io.RawIOBase):
        lines = bounded_lines(source, max_line_bytes)  # type: ignore[arg-type]
    for lineno, raw in enumerate(lines, 1):
        if raw is None:
            yield JsonlRow(lineno, None, too_long(max_line_bytes))
            continue
        if not raw.strip():
            continue
        value, error = parse_line(raw, objects_only=objects_only)
        yield JsonlRow(lineno, value, error)


__all__ = ["MAX_LINE_BYTES", "JsonlRow", "bounded_lines", "parse_line", "read_jsonl", "too_long"]
