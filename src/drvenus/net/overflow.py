"""The one context-overflow detector: does a server's error say the prompt no longer fits?

The agent ends a run with a forced answer when the model's window is full instead of failing,
so every model client (the OpenAI-compatible one, the in-process llama.cpp, the RL engines)
asks :func:`is_context_overflow` about an error reply. What servers answer (HTTP 400 unless
said otherwise):

- vLLM: ``This model's maximum context length is 32768 tokens. However, you requested ...``,
  or (v1 engine) ``The decoder prompt (length 40000) is longer than the maximum model length of
  32768``;
- SGLang: ``The input (40000 tokens) is longer than the model's context length (32768 tokens).``
  or ``Requested token count exceeds the model's maximum context length of ...``;
- llama-server: ``the request exceeds the available context size, try increasing it`` (type
  ``exceed_context_size_error``);
- OpenAI: ``This model's maximum context length is 128000 tokens ...`` or ``Your input exceeds
  the context window of this model`` (code ``context_length_exceeded``);
- Anthropic-style gateways: ``prompt is too long: 210000 tokens > 200000 maximum`` (also 413).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

#: The statuses an overflow comes with (a 5xx is never one: the server failed, not the prompt).
OVERFLOW_STATUSES = frozenset({400, 413, 422})

_OVERFLOW = re.compile(
    r"context (?:length|size|window)|maximum model length|max_model_len|exceed_context"
    r"|context_length_exceeded|too many tokens|prompt is too long|longer than the model"
    r"|input is too long",
    re.IGNORECASE,
)


def _text(body: Any) -> str:
    if body is None:
        return ""
    if isinstance(body, bytes):
        return body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        return body
    if isinstance(body, Mapping | list):
        try:
            return json.dumps(body, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(body)
    return str(body)


def is_context_overflow(status: int | None, *bodies: Any) -> bool:
    """Whether an error reply with HTTP ``status`` says the prompt does not fit the window.

    ``bodies``: what the server said: message strings, raw bytes, or decoded JSON (its
    message, ``type`` and ``code`` fields are all looked at). ``status`` None: no HTTP status
    (an in-process backend's error text alone).
    """
    if status is not None and status not in OVERFLOW_STATUSES:
        return False
    return any(_OVERFLOW.search(_text(body)) for body in bodies)


__all__ = ["OVERFLOW_STATUSES", "is_context_overflow"]
