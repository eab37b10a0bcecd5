"""Trajectory length in the embedded model's own tokens (its chat template applied).

The SmolLM2 tokenizer and chat template are read from the embedded GGUF with transformers (the
train extra); without them the package's tokenizer-free estimate is used, and its name says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drvenus.text import MESSAGE_OVERHEAD_TOKENS
from drvenus.tools.tokens import ScriptEstimate

log = logging.getLogger(__name__)



class ChatTokenCounter:
    """Tokens of a whole conversation as the model reads it (``name``: which tokenizer)."""

    def __init__(self, tokenizer: Any | None = None, name: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.name = name or ("tokenizer" if tokenizer is not None else "estimate")
        self._estimate = ScriptEstimate()

    def count(self, messages: Sequence[Mapping[str, str]]) -> int:
        if self.tokenizer is not None:
            ids = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=True, add_generation_prompt=False
            )
            if isinstance(ids, Mapping):  # a BatchEncoding
                ids = ids["input_ids"]
            return len(ids)
        return sum(self._estimate.count(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer from a ``.gguf`` file or a tokenizer folder."""
    from transformers import AutoTokenizer

    from drvenus.llm.hf import from_pretrained

    return from_pretrained(AutoTokenizer, path)


def embedded_counter(path: str | Path | None = None, models_dir: str | Path | None = None
                     ) -> ChatTokenCounter:
    """The embedded SmolLM2 tokenizer (``path``: a GGUF or tokenizer folder; else the embedded
    GGUF if it is already on disk, never downloaded), else the estimate."""
    try:
        if path is None:
            from drvenus.config import load_settings
            from drvenus.llm.embedded import embedded_model_path

            root = Path(models_dir) if models_dir else load_settings().models_root()
            path = embedded_model_path(root, pull=False)
        tokenizer = load_tokenizer(path)
        return ChatTokenCounter(tokenizer, name=f"smollm2:{Path(path).name}")
    except Exception as exc:  # no transformers, no GGUF: fall back to the estimate
        log.warning("embedded tokenizer unavailable (%s); token counts are estimates", exc)
        return ChatTokenCounter(None)
