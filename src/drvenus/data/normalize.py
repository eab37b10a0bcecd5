"""Stage 2 of ``drvenus data clean``, normalise: one input row (raw REDSearcher or already
clean) into SFT form.

The rules reproduce DR-Venus's released cleaning script (``SFT/data_clean/
prepare_trajectories.py``) so that the same rows and messages survive; the system prompt is ours
(:func:`drvenus.protocol.build_system_prompt`) unless ``--system-prompt-mode row`` keeps the
row's own.
"""

from __future__ import annotations

from json import loads as _json_loads
from typing import Any

from orjson import loads as _fast_json

from drvenus.protocol import (
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    after_thinking,
    render_answer_turn,
    render_search_hits,
    render_tool_call_turn,
    wrap_tool_response,
)
from drvenus.protocol._json import loads_json5
from drvenus.protocol.legacy import (
    ANSWER_BLOCK,
    ANSWER_RE,
    SUMMARY_RE,
    THINK_BLOCK,
    TOOL_CALL_BLOCK,
    WEB_RESULTS_MARKER,
    legacy_tool_call,
    serper_hits,
    unwrap_inline_tags,
)

_SUMMARY_BLOCK = SUMMARY_RE
_ANSWER_BLOCK = ANSWER_RE


def fix_surrogates(text: str) -> str:
    """Join UTF-16 surrogate pairs into characters; drop lone surrogates."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text  # no surrogates: the round trip below is the identity
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError:
        return text.encode("utf-8", "ignore").decode("utf-8")


def deep_fix(obj: Any) -> Any:
    """:func:`fix_surrogates` applied to every string in nested lists and dicts (copies them)."""
    if isinstance(obj, str):
        return fix_surrogates(obj)
    if isinstance(obj, list):
        return [deep_fix(v) for v in obj]
    if isinstance(obj, dict):
        return {k: deep_fix(v) for k, v in obj.items()}
    return obj


def _as_list(messages: Any) -> Any:
    """A list with each dict shallow-copied (a numpy array becomes a list)."""
    if type(messages).__name__ == "ndarray":
        messages = messages.tolist()
    if isinstance(messages, list):
        return [dict(m) if isinstance(m, dict) else m for m in messages]
    return messages


def choose_system_prompt(row: dict[str, Any], mode: str, template: str) -> str:
    """``template``: ours. ``row``: the row's ``system_prompt``, else its first system message,
    else ours."""
    if mode == "template":
        return template
    if mode != "row":
        raise ValueError(f"unsupported system prompt mode: {mode!r}")
    own = row.get("system_prompt")
    if isinstance(own, str) and own.strip():
        return own
    messages = _as_list(row.get("messages"))
    if isinstance(messages, list) and messages:
        first = messages[0]
        if isinstance(first, dict) and first.get("role") == "system":
            content = first.get("content")
            if isinstance(content, str) and content.strip():
                return content
    return template


def clean_tool_call_turn(text: Any) -> str | None:
    """A middle assistant turn rebuilt in the protocol's think-then-tool-call form.

    Takes the first think block (answer/summary tags removed) and the first tool call,
    normalised (:func:`drvenus.protocol.legacy.legacy_tool_call`). None when either is missing,
    the think text is empty, or the call is unusable.
    """
    if not isinstance(text, str):
        return None
    think = THINK_BLOCK.first(text)
    if think is None:
        return None
    thought = unwrap_inline_tags(think.strip())
    if not thought:
        return None
    call = TOOL_CALL_BLOCK.first(text)
    if call is None:
        return None
    raw = call.strip()
    try:
        obj = loads_tool_call(raw.split("<code>")[0].strip())
    except Exception:  # an undecodable call drops the turn
        return None
    if not isinstance(obj, dict):
        return None
    normalized = legacy_tool_call(obj, raw)
    if normalized is None:
        return None
    body = normalized if isinstance(normalized, str) else normalized.to_json()
    return render_tool_call_turn(thought, body)


def clean_answer_turn(text: Any) -> str | None:
    """The final assistant turn rebuilt in the protocol's think-then-answer form.

    The answer is the last answer block; the thought is the first think block with summary and
    answer tags unwrapped, followed by any ``<summary>`` blocks written after the thinking.
    """
    if not isinstance(text, str):
        return None
    answers = ANSWER_BLOCK.all(text)
    if not answers:
        return None
    answer = answers[-1].strip()
    think = THINK_BLOCK.first(text)
    if think is None:
        return None
    thought = think.strip()
    thought = _SUMMARY_BLOCK.sub(r"\1", thought)
    thought = _ANSWER_BLOCK.sub(r"\1", thought)
    thought = unwrap_inline_tags(thought)
    tail = after_thinking(text)
    summaries = [m.group(1).strip() for m in _SUMMARY_BLOCK.finditer(tail)]
    parts = ([thought] if thought else []) + summaries
    joined = "\n\n".join(parts)
    return render_answer_turn(joined, answer)


def convert_tool_response(content: str) -> str:
    """A raw tool result as a protocol tool response; Serper markdown becomes search JSON."""
    body = content.replace(TOOL_RESPONSE_OPEN, "").replace(TOOL_RESPONSE_CLOSE, "").strip()
    if WEB_RESULTS_MARKER in body:
        body = render_search_hits(serper_hits(body))
    return wrap_tool_response(body)


def _single_to_double_quotes(text: str) -> str | None:
    """``text`` with its single-quoted strings written as JSON strings, or None when a
    single-quoted string holds a backslash (its escapes are JSON5's, not JSON's) or is not
    closed. Double-quoted strings and everything outside strings are copied as they are."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        q = min((k for k in (text.find('"', i), text.find("'", i)) if k >= 0), default=-1)
        if q < 0:
            out.append(text[i:])
            break
        out.append(text[i:q])
        if text[q] == '"':  # a JSON string: copy it, escapes and all
            k = q + 1
            while k < n and text[k] != '"':
                k += 2 if text[k] == "\\" else 1
            if k >= n:
                return None
            out.append(text[q : k + 1])
        else:
            k = text.find("'", q + 1)
            if k < 0 or "\\" in text[q + 1 : k]:
                return None
            out.append('"' + text[q + 1 : k].replace('"', '\\"') + '"')
        i = k + 1
    return "".join(out)


def loads_tool_call(text: str) -> Any:
    """A tool call's JSON5 text decoded as :func:`loads_json5` decodes it, faster for the usual
    legacy shape: JSON with single-quoted strings (``{'name': 'search', ...}``) is rewritten
    to JSON for a C decoder (json5's pure-Python parser takes ~1.7 ms a call); anything else,
    and any failure, goes to :func:`loads_json5`."""
    try:
        return _fast_json(text)
    except Exception:  # not plain JSON
        pass
    if "'" in text:
        rewritten = _single_to_double_quotes(text)
        if rewritten is not None:
            try:  # the stdlib's decoder: integers of any size, as JSON5's
                return _json_loads(rewritten)
            except Exception:  # other JSON5 syntax (unquoted keys, trailing commas, ...)
                pass
    return loads_json5(text)


def _is_system(turn: Any) -> bool:
    return isinstance(turn, dict) and turn.get("role") == "system"


def normalize_raw_messages(messages: Any, system_prompt: str) -> list[dict[str, str]] | None:
    """Raw REDSearcher messages in protocol form, or None when the row cannot be used.

    A leading system message is replaced by ``system_prompt`` (see
    :func:`choose_system_prompt`); the first message after it is the question; the last must be
    a usable answer turn; a middle assistant turn that cannot be cleaned is dropped, and so is
    a tool result that does not follow a kept assistant turn; any other role fails the row.
    """
    raw = _as_list(messages)
    if not isinstance(raw, list) or not raw:
        return None
    first = 1 if _is_system(raw[0]) else 0
    out: list[dict[str, str]] = [{"role": "system", "content": system_prompt}]
    last = len(raw) - 1
    for i in range(first, len(raw)):
        turn = raw[i]
        if not isinstance(turn, dict):
            return None
        content = turn.get("content")
        role = turn.get("role")
        if not isinstance(content, str):
            return None
        if i == first:
            out.append({"role": "user", "content": content})
        elif i == last:
            cleaned = clean_answer_turn(content)
            if cleaned is None:
                return None
            out.append({"role": "assistant", "content": cleaned})
        elif role == "user":
            if out[-1]["role"] == "assistant":
                out.append({"role": "user", "content": convert_tool_response(content)})
        elif role == "assistant":
            cleaned = clean_tool_call_turn(content)
            if cleaned is not None:
                out.append({"role": "assistant", "content": cleaned})
        else:
            return None
    for m in out:  # the roles are ours; the texts may hold surrogates (JSON input)
        m["content"] = fix_surrogates(m["content"])
    return out


def normalize_clean_messages(messages: Any, mode: str, system_prompt: str) -> list[Any] | None:
    """Already-clean messages with the system prompt set (template mode) or added (missing)."""
    msgs = _as_list(messages)
    if not isinstance(msgs, list) or not msgs:
        return None
    msgs = deep_fix(msgs)
    first = msgs[0]
    if not isinstance(first, dict):
        return None
    if first.get("role") == "system":
        if mode == "template":
            first["content"] = system_prompt
        return msgs
    return [{"role": "system", "content": system_prompt}, *msgs]


def question_and_gt(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """(question, ground truth) from ``meta`` (raw rows) or ``question``/``gt`` (clean rows)."""
    meta = row.get("meta")
    if isinstance(meta, dict):
        q, a = meta.get("question"), meta.get("answer")
    else:
        q, a = row.get("question"), row.get("gt")
    return (q if isinstance(q, str) else None), (a if isinstance(a, str) else None)


def normalize_row(
    row: dict[str, Any], *, mode: str, template: str
) -> tuple[dict[str, Any] | None, str | None]:
    """Stage 1 for one row: ``({question, messages, gt}, None)`` or ``(None, drop_reason)``.

    Drop reasons: ``missing_question_or_gt``, ``raw_clean_failed``, ``clean_input_invalid``.
    """
    question, gt = question_and_gt(row)
    if not question or not gt:
        return None, "missing_question_or_gt"
    system_prompt = choose_system_prompt(row, mode, template)
    if isinstance(row.get("meta"), dict):
        messages = normalize_raw_messages(row.get("messages"), system_prompt)
        if messages is None:
            return None, "raw_clean_failed"
    else:
        messages = normalize_clean_messages(row.get("messages"), mode, system_prompt)
        if messages is None:
            return None, "clean_input_invalid"
    return {"question": question, "messages": messages, "gt": gt}, None
