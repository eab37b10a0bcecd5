"""Turn validity: the exact rule the RL format penalty and the data pipeline apply."""

from __future__ import annotations

from drvenus.protocol._json import loads_json5

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_ANS_OPEN, _ANS_CLOSE = "<answer>", "</answer>"


def _positions(text: str, tag: str) -> list[int]:
    out, i = [], text.find(tag)
    while i != -1:
        out.append(i)
        i = text.find(tag, i + len(tag))
    return out


def _think_blocks_ok(content: str, opens: list[int], closes: list[int]) -> bool:
    if not opens or len(opens) != len(closes):
        return False
    if content[: opens[0]].strip():
        return False
    for i, (o, c) in enumerate(zip(opens, closes, strict=True)):
        if o >= c:
            return False
        if i and closes[i - 1] >= o:
            return False
    return True


def _single_block_after(
    content: str, last_close: int, open_tag: str, close_tag: str
) -> str | None:
    """Body of the one ``open_tag``..``close_tag`` block that follows the last ``</think>``
    with only whitespace around it; None when the layout is wrong."""
    opens, closes = _positions(content, open_tag), _positions(content, close_tag)
    if len(opens) != 1 or len(closes) != 1:
        return None
    o, c = opens[0], closes[0]
    if o < last_close or c < o:
        return None
    if content[last_close + len(_THINK_CLOSE) : o].strip():
        return None
    if content[c + len(close_tag) :].strip():
        return None
    return content[o + len(open_tag) : c]


def _tool_call_body_ok(body: str) -> bool:
    body = body.strip()
    if not body:
        return False
    if "pythoninterpreter" in body.lower() and "<code>" in body and "</code>" in body:
        return True
    try:
        obj = loads_json5(body)
    except Exception:  # any decoding failure means malformed
        return False
    return isinstance(obj, dict) and "name" in obj and isinstance(obj.get("arguments", None), dict)


def check_turn_format(content: str, is_final: bool) -> bool:
    """True iff an assistant turn is well formed (see PROTOCOL.md, "Turn validity").

    Non-final: think block(s), then exactly one ``<tool_call>`` with a JSON5 object holding
    ``name`` and an object ``arguments`` (or a PythonInterpreter ``<code>`` call), nothing after.
    Final: think block(s), then exactly one non-empty ``<answer>``, no tool-call tags.
    """
    if not content or not content.strip():
        return False
    opens, closes = _positions(content, _THINK_OPEN), _positions(content, _THINK_CLOSE)
    if not _think_blocks_ok(content, opens, closes):
        return False
    last_close = closes[-1]
    if is_final:
        if _CALL_OPEN in content or _CALL_CLOSE in content:
            return False
        body = _single_block_after(content, last_close, _ANS_OPEN, _ANS_CLOSE)
        return body is not None and bool(body.strip())
    if _ANS_OPEN in content or _ANS_CLOSE in content:
        return False
    body = _single_block_after(content, last_close, _CALL_OPEN, _CALL_CLOSE)
    return body is not None and _tool_call_body_ok(body)
