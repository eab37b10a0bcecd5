"""Stages 3-5 of ``drvenus data clean``: prune disallowed tools, dedup repeated tool calls,
validate the conversation structure (and count turns). Pure functions over message lists.

The rules (and drop-reason names) are DR-Venus's released cleaning script's. Pruning and dedup
read only text content (any other content is left for validation to reject).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from drvenus.protocol import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN
from drvenus.protocol.legacy import (
    ANSWER_BLOCK,
    THINK_BLOCK,
    TOOL_CALL_BLOCK,
    legacy_signature,
    tool_call_objects,
)

Message = dict[str, Any]
CallReader = Callable[[Any], list[dict[str, Any]]]


def cached_call_reader() -> CallReader:
    """:func:`tool_call_objects` memoised per message text (one row's stages share it)."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def read(content: Any) -> list[dict[str, Any]]:
        if not isinstance(content, str):
            return []
        hit = cache.get(content)
        if hit is None:
            hit = cache[content] = tool_call_objects(content)
        return hit

    return read


def _text(m: Message) -> str:
    """The message's content when it is text, else ''."""
    content = m.get("content")
    return content if isinstance(content, str) else ""


def _tool_responses_after(messages: list[Message], i: int) -> int:
    """Index after the run of user tool-response messages starting at ``i``."""
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "user" and TOOL_RESPONSE_OPEN in _text(m):
            i += 1
        else:
            break
    return i


@dataclass
class Pruned:
    """What pruning removed: one entry per dropped assistant turn."""

    tools: list[list[str]] = field(default_factory=list)
    responses: list[int] = field(default_factory=list)


def _drop_turns(
    messages: list[Message], drop: Callable[[Message], bool]
) -> tuple[list[Message], list[tuple[int, int]]]:
    """Remove each assistant turn for which ``drop(turn)`` is true, with the tool responses
    that follow it. Returns the kept messages and (turn index, responses removed) per drop.
    ``drop`` sees the assistant turns in order, so it may keep state across them."""
    kept: list[Message] = []
    dropped: list[tuple[int, int]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role", "") == "assistant" and drop(m):
            end = _tool_responses_after(messages, i + 1)
            dropped.append((i, end - i - 1))
            i = end
            continue
        kept.append(m)
        i += 1
    return kept, dropped


def prune_disallowed_tools(
    messages: list[Message], allowed: Collection[str], read_calls: CallReader = tool_call_objects
) -> tuple[list[Message], Pruned]:
    """Drop each assistant turn that calls a tool outside ``allowed`` (lower-case names,
    compared case-insensitively), together with the tool responses that follow it."""
    pruned = Pruned()

    def disallowed(m: Message) -> bool:
        names = [
            n for n in (c.get("name") for c in read_calls(_text(m)))
            if isinstance(n, str) and n
        ]
        bad = [n for n in names if n.lower() not in allowed]
        if bad:
            pruned.tools.append(bad)
        return bool(bad)

    kept, dropped = _drop_turns(messages, disallowed)
    pruned.responses = [n for _, n in dropped]
    return kept, pruned


def drop_duplicate_tool_calls(
    messages: list[Message], read_calls: CallReader = tool_call_objects
) -> tuple[list[Message], int]:
    """Drop each assistant turn whose every search/visit signature (tool, sorted unique
    queries/URLs) was seen earlier in the trajectory, with its tool responses.
    Returns the kept messages and the number of dropped turns."""
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def duplicate(m: Message) -> bool:
        sigs = [
            s for s in (legacy_signature(c) for c in read_calls(_text(m)))
            if s is not None
        ]
        if sigs and all(s in seen for s in sigs):
            return True
        seen.update(sigs)
        return False

    kept, dropped = _drop_turns(messages, duplicate)
    return kept, len(dropped)


def _check_assistant(content: str, is_final: bool) -> str | None:
    if THINK_BLOCK.first(content) is None:
        return "assistant_missing_think"
    has_answer = ANSWER_BLOCK.first(content) is not None
    has_tool = TOOL_CALL_BLOCK.first(content) is not None
    if is_final:
        if not has_answer:
            return "final_assistant_missing_answer"
        if has_tool:
            return "final_assistant_contains_tool"
        return None
    if not has_tool:
        return "assistant_missing_tool_call"
    if has_answer:
        return "assistant_tool_turn_contains_answer"
    return None


def validate_messages(messages: Any) -> str | None:
    """None when the conversation is valid, else the drop reason.

    System first; then user/assistant alternate; the first user turn is the question (no tool
    response tags), later user turns are tool responses; middle assistant turns hold think and
    tool_call (no answer), the last holds think and answer (no tool_call).
    """
    if not isinstance(messages, list) or len(messages) < 3:
        return "too_short"
    if not isinstance(messages[0], dict) or messages[0].get("role") != "system":
        return "bad_role_start"
    last = len(messages) - 1
    for idx in range(1, len(messages)):
        m = messages[idx]
        if not isinstance(m, dict):
            return "non_dict_message"
        expected = "user" if idx % 2 == 1 else "assistant"
        if m.get("role") != expected:
            return f"bad_role_at_{idx}"
        content = m.get("content", "")
        if not isinstance(content, str):
            return f"non_str_content_at_{idx}"
        if expected == "user":
            has_open = TOOL_RESPONSE_OPEN in content
            has_close = TOOL_RESPONSE_CLOSE in content
            if idx == 1:
                if has_open or has_close:
                    return "first_user_contains_tool_response"
            elif not (has_open and has_close):
                return f"user_missing_tool_response_at_{idx}"
        else:
            reason = _check_assistant(content, idx == last)
            if reason is not None:
                return reason
    return None


def count_turns(messages: list[Any]) -> int:
    """Assistant turns of a valid conversation: ``(len(messages) - 1) // 2``."""
    return max(len(messages) - 1, 0) // 2


def tool_names(messages: list[Message], read_calls: CallReader = tool_call_objects) -> list[str]:
    """Names of every decodable tool call in the assistant turns (for tool statistics)."""
    names = []
    for m in messages:
        if m.get("role") == "assistant":
            for c in read_calls(_text(m)):
                name = c.get("name")
                if isinstance(name, str):
                    names.append(name)
    return names
