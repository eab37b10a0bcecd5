"""Small text helpers shared across the package: one token estimate, one-line messages, counts
in words."""

from __future__ import annotations

import math

# Without a tokenizer, a token is taken to be about four UTF-8 bytes (English prose with BPE
# vocabularies; CJK text runs closer to one character per token, which bytes account for).
BYTES_PER_TOKEN = 4.0
#: tokens a chat template adds around each message (ChatML: ``<|im_start|>role\n`` ...
#: ``<|im_end|>\n``), where a prompt cannot be counted exactly
MESSAGE_OVERHEAD_TOKENS = 5


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token count: about four UTF-8 bytes per token."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def one_line(text: object, limit: int = 200) -> str:
    """``text`` on one line (white space folded), cut to ``limit`` characters with ``...``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 tool call``, ``2 tool calls``: the number with the noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


__all__ = ["BYTES_PER_TOKEN", "counted", "estimate_tokens", "one_line"]
