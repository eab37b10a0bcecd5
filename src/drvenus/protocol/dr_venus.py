"""DR-Venus's reading of a turn (``--protocol dr-venus``), in drvenus's own code.

DR-Venus's RL agent loop (``RL/scrl/llm_agent/dr_agent_loop.py``) fixes the tags of a sampled
turn (:func:`fix_tags`) and reads it (:func:`classify_turn`); its outcome judge takes the first
answer block of the final turn (:func:`first_answer`). Pure functions of the text: the RL
environment (:mod:`drvenus.train.rl.environment`) and the judge (:mod:`drvenus.train.rl.judge`)
call them, and the tests compare them with DR-Venus's own functions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from drvenus.protocol._json import loads_json5
from drvenus.protocol.render import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_OPEN,
)
from drvenus.protocol.tools import ToolCall, ToolCallError, normalize_tool_call


def _block(open_tag: str, close_tag: str) -> re.Pattern[str]:
    return re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), re.DOTALL)


_THINK = _block(THINK_OPEN, THINK_CLOSE)
_ANSWER = _block(ANSWER_OPEN, ANSWER_CLOSE)
_TOOL_CALL = _block(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
MISSING_THINK = f"missing {THINK_OPEN}{THINK_CLOSE}"


def fix_tags(text: str, prefilled_think: bool) -> str:
    """DR-Venus's tag fixing of a sampled turn: the think opener a template wrote into the
    prompt put back, the text cut at a tool response the model began, a missing think closer
    appended, a missing think opener prepended."""
    if prefilled_think and THINK_OPEN not in text:
        text = THINK_OPEN + "\n" + text
    cut = text.find(TOOL_RESPONSE_OPEN)
    if cut != -1:
        text = text[:cut]
    if THINK_OPEN in text and THINK_CLOSE not in text:
        text += "\n" + THINK_CLOSE
    if THINK_OPEN not in text and THINK_CLOSE in text:
        text = THINK_OPEN + "\n" + text
    return text


TurnKind = Literal["answer", "tool_call", "malformed"]


@dataclass(frozen=True)
class EnvTurn:
    """A turn as DR-Venus's RL loop reads it. ``call``: the normalised call; ``call_error``: why
    a well-formed call object cannot run (unknown tool, bad arguments), sent back as its result;
    ``reason``: why a turn is malformed."""

    kind: TurnKind
    content: str
    call: ToolCall | None = None
    call_name: str | None = None
    call_error: str | None = None
    reason: str | None = None


def classify_turn(content: str) -> EnvTurn:
    """DR-Venus's reading of a (tag-fixed) turn: a think block is required; then one answer
    block and no tool call anywhere in the turn is an answer (empty or not), one tool call and
    no answer block is a call when its body decodes (JSON, else JSON5) to an object with
    ``name`` and ``arguments``; anything else is malformed."""
    if not _THINK.search(content):
        return EnvTurn("malformed", content, reason=MISSING_THINK)
    answer, call = _ANSWER.search(content), _TOOL_CALL.search(content)
    if answer and not call:
        return EnvTurn("answer", content)
    if not call or answer:
        return EnvTurn("malformed", content, reason="no single answer or tool call")
    raw = call.group(1).strip()
    try:
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = loads_json5(raw)
    except Exception as exc:  # json5 raises several types
        return EnvTurn("malformed", content, reason=f"tool call is not JSON: {exc}")
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return EnvTurn("malformed", content, reason="a tool call needs 'name' and 'arguments'")
    name = str(obj["name"])
    try:
        return EnvTurn("tool_call", content, call=normalize_tool_call(obj), call_name=name)
    except ToolCallError as exc:
        return EnvTurn("tool_call", content, call_name=name, call_error=str(exc))


def first_answer(text: str) -> str | None:
    """The first answer block of ``text`` (its body unstripped), None when there is none."""
    m = _ANSWER.search(text)
    return None if m is None else m.group(1)


__all__ = ["MISSING_THINK", "EnvTurn", "TurnKind", "classify_turn", "first_answer", "fix_tags"]
