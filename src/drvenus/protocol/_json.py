"""JSON5 decoding with a fast path: plain JSON (a subset of JSON5) goes through ``json``."""

from __future__ import annotations

import json
from typing import Any

import json5


def loads_json5(text: str) -> Any:
    """Decode JSON5 text; raises ``ValueError`` (or json5's error) when it is not JSON5."""
    try:
        return json.loads(text)
    except ValueError:
        return json5.loads(text)
