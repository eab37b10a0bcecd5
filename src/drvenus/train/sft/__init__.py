"""Supervised fine-tuning on agent trajectories: tokenise with assistant-only loss masks."""

from drvenus.train.sft.tokenize import (
    MaskError,
    TokenizedRow,
    TokenizeStats,
    tokenize_conversation,
    tokenize_rows,
)

__all__ = ["MaskError", "TokenizeStats", "TokenizedRow", "tokenize_conversation", "tokenize_rows"]
