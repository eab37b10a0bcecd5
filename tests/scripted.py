"""Test doubles for the agent loop: a scripted model and scripted tools (unit tests only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from drvenus.llm.base import Generation, LLMError, SamplingParams
from drvenus.protocol import ToolCall, render_answer_turn, render_tool_call_turn

Reply = str | Exception | Callable[[list[dict[str, str]]], str]


def call(name: str, **arguments) -> str:
    import json

    body = json.dumps({"name": name, "arguments": arguments})
    return render_tool_call_turn(f"I should use {name}.", body)


def answer(text: str) -> str:
    return render_answer_turn("I know enough.", text)


def server_tokens(text: str) -> int:
    """What the scripted "server" says a text costs: twice :meth:`ScriptedModel.count_tokens`,
    so a count that ignores the server's usage is visibly wrong."""
    return len(text) // 2


class ScriptedModel:
    """Replies from a script, in order; the last reply repeats when the script runs out."""

    name = "scripted"

    def __init__(self, replies: Sequence[Reply], delay: float = 0.0, usage: bool = False):
        self.replies = list(replies)
        self.delay = delay
        self.usage = usage
        self.calls: list[dict] = []
        self.tokenized_chars = 0
        self.window: int | None = None

    async def generate(
        self, messages, params: SamplingParams, *, grammar=None, state=None, timeout=None
    ) -> Generation:
        self.calls.append(
            {
                "n_messages": len(messages),
                "grammar": grammar,
                "state": state,
                "seed": params.seed,
                "timeout": timeout,
                "max_tokens": params.max_tokens,
            }
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        i = min(len(self.calls) - 1, len(self.replies) - 1)
        reply = self.replies[i]
        if isinstance(reply, Exception):
            raise reply
        text = reply(messages) if callable(reply) else reply
        if self.usage:  # a server whose tokenizer counts twice the local estimate
            prompt = sum(server_tokens(m["content"]) + 4 for m in messages)
            return Generation(text, prompt_tokens=prompt, completion_tokens=server_tokens(text))
        return Generation(text)

    def count_tokens(self, text: str) -> int:
        self.tokenized_chars += len(text)
        return len(text) // 4

    async def context_window(self) -> int | None:
        return self.window

    async def aclose(self) -> None:
        return None


class ScriptedTools:
    def __init__(self, body: str | Callable[[ToolCall], str] = "[]", fail: bool = False):
        self.body = body
        self.fail = fail
        self.calls: list[ToolCall] = []

    async def call(self, tool_call: ToolCall) -> str:
        self.calls.append(tool_call)
        if self.fail:
            raise RuntimeError("tool exploded")
        return self.body(tool_call) if callable(self.body) else self.body


def llm_down() -> LLMError:
    return LLMError("model server at http://127.0.0.1:9: connection refused", retryable=True)


class PerQuestionModel:
    """One script per question: ``script(question)`` lists that question's replies, and the reply
    for a turn is chosen by how many assistant turns its conversation already has (the last reply
    repeats). Nothing is shared between questions, so concurrent runs cannot take each other's
    replies. ``delay`` may depend on the question too."""

    name = "per-question"

    def __init__(
        self,
        script: Callable[[str], Sequence[Reply]],
        delay: float | Callable[[str], float] = 0.0,
    ):
        self.script = script
        self.delay = delay
        self.calls: dict[str, int] = {}

    @staticmethod
    def question_of(messages: list[dict[str, str]]) -> str:
        return next(m["content"] for m in messages if m["role"] == "user")

    async def generate(self, messages, params: SamplingParams, *, grammar=None, **kwargs):
        question = self.question_of(messages)
        self.calls[question] = self.calls.get(question, 0) + 1
        delay = self.delay(question) if callable(self.delay) else self.delay
        if delay:
            await asyncio.sleep(delay)
        replies = list(self.script(question))
        turn = sum(1 for m in messages if m["role"] == "assistant")
        reply = replies[min(turn, len(replies) - 1)]
        if isinstance(reply, Exception):
            raise reply
        return Generation(reply(messages) if callable(reply) else reply)

    async def context_window(self) -> int | None:
        return None

    def count_tokens(self, text: str) -> int:
        return len(text) // 4

    async def aclose(self) -> None:
        return None
