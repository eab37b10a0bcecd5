"""Model backends behind one interface (:class:`drvenus.llm.base.ChatModel`)."""

from drvenus.llm.base import (
    ChatModel,
    Generation,
    GrammarKind,
    LLMError,
    SamplingParams,
)

__all__ = [
    "ChatModel",
    "Generation",
    "GrammarKind",
    "LLMError",
    "SamplingParams",
]
