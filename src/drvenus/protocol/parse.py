"""Repair and parse one sampled assistant turn into a typed result."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from drvenus.protocol._json import loads_json5
from drvenus.protocol.render import TOOL_RESPONSE_OPEN
from drvenus.protocol.tools import ToolCall, ToolCallError, normalize_tool_call

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

TurnKind = Literal["tool_call", "answer", "error"]


@dataclass(frozen=True)
class ParsedTurn:
    """A parsed assistant turn: a tool call, a final answer, or a parse error with its reason."""

    kind: TurnKind
    content: str
    thinking: str = ""
    tool_call: ToolCall | None = None
    answer: str | None = None
    error: str | None = None
    call_key: str | None = None  # the call's identity for duplicates when not tool_call.key()

    @property
    def ok(self) -> bool:
        return self.kind != "error"

    def dedup_key(self) -> str | None:
        """What identifies the tool call among the calls already made (None: no call)."""
        if self.tool_call is None:
            return None
        return self.call_key or self.tool_call.key()


def assistant_text(
    content: str, reasoning: str | None = None, *, prefilled_think: bool = False
) -> str:
    """The assistant turn as the protocol writes it, from what a server returned: reasoning the
    server split off (``reasoning_content``) goes back inside ``<think>``, and a ``<think>``
    the chat template wrote into the prompt (``prefilled_think``) is restored."""
    if reasoning and reasoning.strip() and "<think>" not in content:
        return f"<think>\n{reasoning.strip()}\n</think>\n{content.lstrip()}"
    if prefilled_think and content and not content.lstrip().startswith("<think>"):
        return "<think>\n" + content
    return content


def repair_turn(text: str) -> str:
    """Repair sampled text: cut at ``<tool_response>``, add a missing ``<think>``/``</think>``.

    Chat templates that open the assistant turn with ``<think>\\n`` leave it out of the sample;
    the model also sometimes starts to hallucinate a tool response, which is not its to write.
    """
    cut = text.find(TOOL_RESPONSE_OPEN)
    if cut != -1:
        text = text[:cut]
    text = text.strip()
    if not text:
        return text
    if "<think>" not in text:
        text = "<think>\n" + text
    if "</think>" not in text:
        positions = [p for p in (text.find("<tool_call>"), text.find("<answer>")) if p != -1]
        if positions:
            p = min(positions)
            text = text[:p].rstrip() + "\n</think>\n" + text[p:]
        else:
            text = text + "\n</think>"
    return text


def extract_answer(content: str) -> str | None:
    """The text of the ``<answer>`` block outside any think block, if present and non-empty."""
    m = _ANSWER.search(_THINK.sub("", content))
    if m and m.group(1).strip():
        return m.group(1).strip()
    return None


def after_thinking(text: str) -> str:
    """What follows the last ``</think>`` of ``text`` (all of it when there is none): the
    reply proper of a model that reasons first, prefilled opener or not."""
    return text.rsplit("</think>", 1)[1] if "</think>" in text else text


def first_answer_block(text: str) -> str | None:
    """The raw content of the first ``<answer>`` block anywhere in ``text`` (inside a think
    block too, empty allowed), or None: how DR-Venus's RL F1 reward reads a response."""
    m = _ANSWER.search(text)
    return m.group(1) if m else None


def parse_turn(content: str) -> ParsedTurn:
    """Parse an (already repaired) assistant turn.

    A turn with a think block and exactly one of ``<answer>`` / ``<tool_call>`` parses; the tool
    call is JSON5-decoded and normalised (unknown tools rejected with the list of tools).
    """
    think = _THINK.search(content)
    if think is None:
        return ParsedTurn("error", content, error="missing <think></think> block")
    thinking = think.group(1).strip()
    after = content[think.end():]
    answer = _ANSWER.search(after)
    call = _TOOL_CALL.search(after)
    if answer and call:
        return ParsedTurn(
            "error", content, thinking, error="both <answer> and <tool_call> in one turn"
        )
    if answer:
        text = answer.group(1).strip()
        if not text:
            return ParsedTurn("error", content, thinking, error="empty <answer></answer>")
        return ParsedTurn("answer", content, thinking, answer=text)
    if call:
        raw = call.group(1).strip()
        try:
            obj = loads_json5(raw)
        except Exception as exc:  # json5 raises several types
            return ParsedTurn(
                "error", content, thinking, error=f"tool call is not valid JSON: {exc}"
            )
        try:
            tool_call = normalize_tool_call(obj)
        except ToolCallError as exc:
            return ParsedTurn("error", content, thinking, error=str(exc))
        return ParsedTurn("tool_call", content, thinking, tool_call=tool_call)
    return ParsedTurn(
        "error", content, thinking, error="no <tool_call> or <answer> after the think block"
    )


@dataclass(frozen=True)
class TurnReader:
    """How a profile reads a sampled assistant turn: ``repair`` the text, then ``parse`` it."""

    repair: Callable[[str], str] = repair_turn
    parse: Callable[[str], ParsedTurn] = parse_turn

    def read(self, text: str) -> ParsedTurn:
        return self.parse(self.repair(text))


DRVENUS_READER = TurnReader()

