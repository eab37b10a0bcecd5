"""The one JSONL line reader: batch results, corpora and traces read through it, and so do the
file readers of :mod:`drvenus.records` and :mod:`drvenus.questions`.

Blank lines are skipped; every other line yields a :class:`JsonlRow` with its 1-based line
number and either the parsed value or the reason it could not be used (invalid UTF-8, invalid
JSON, not an object), so callers count and name bad lines instead of failing on them.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


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
    source: str | Path | Iterable[bytes | str], *, objects_only: bool = True
) -> Iterator[JsonlRow]:
    """The rows of a JSONL file (``.gz`` too) or of an iterable of lines (an open file)."""
    if isinstance(source, str | Path):
        path = Path(source)
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as fh:
            yield from read_jsonl(fh, objects_only=objects_only)
        return
    for lineno, raw in enumerate(source, 1):
        if not raw.strip():
            continue
        value, error = parse_line(raw, objects_only=objects_only)
        yield JsonlRow(lineno, value, error)


__all__ = ["JsonlRow", "parse_line", "read_jsonl"]
