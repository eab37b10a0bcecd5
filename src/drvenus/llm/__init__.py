"""Model backends behind one interface (:class:`drvenus.llm.base.ChatModel`)."""

from drvenus.llm.base import ChatModel, Generation, LLMError, SamplingParams

__all__ = ["ChatModel", "Generation", "LLMError", "SamplingParams"]
