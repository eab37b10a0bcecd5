"""JSON5 decoding with a fast path: plain JSON (a subset of JSON5) goes through a C decoder."""

from __future__ import annotations

import json
from typing import Any

import json5

try:  # orjson decodes valid JSON to the same objects as json, several times faster
    import orjson

    _fast_loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay usable without it
    _fast_loads = json.loads

# Benchmarks switch this off to measure the plain json5 path; results are identical either way.
FAST_PATH = True


def loads_json5(text: str) -> Any:
    """Decode JSON5 text; raises ``ValueError`` (or json5's error) when it is not JSON5."""
    if FAST_PATH:
        try:
            return _fast_loads(text)
        except Exception:  # any failure falls back to the JSON5 decoder
            pass
    return json5.loads(text)
