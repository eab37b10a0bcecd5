"""JSON5 decoding with a fast path: plain JSON (a subset of JSON5) goes through a C decoder.

The one JSON5 loader of the package (tool-call arguments, extractor replies, raw data)."""

from __future__ import annotations

import json
from typing import Any

import json5

try:  # orjson decodes valid JSON to the same objects as json, several times faster
    import orjson

    _fast_loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay usable without it
    _fast_loads = json.loads

def loads_json5(text: str) -> Any:
    """Decode JSON5 text; raises ``ValueError`` (or json5's error) when it is not JSON5."""
    try:
        return _fast_loads(text)
    except Exception:  # any failure falls back to the JSON5 decoder
        pass
    return json5.loads(text)
