"""Model backends behind one interface (:class:`drvenus.llm.base.ChatModel`)."""

from drvenus.llm.base import (
    ChatModel,
    Constraint,
    Generation,
    GrammarKind,
    LLMError,
    SamplingParams,
    grammar_kind,
)

__all__ = [
    "ChatModel",
    "Constraint",
    "Generation",
    "GrammarKind",
    "LLMError",
    "SamplingParams",
    "grammar_kind",
]
