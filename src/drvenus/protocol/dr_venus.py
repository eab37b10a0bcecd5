"""DR-Venus's reading of a turn (``--protocol dr-venus``), in drvenus's own code.

Inference (``Inference/run_demo.py``): :func:`sanitize_turn` fixes a sampled turn as
``_sanitize_content`` does and :func:`read_turn` reads it as ``parse_llm_response`` does (a think
block required; the first answer block anywhere, even inside the think block, and empty or not,
is the answer when the turn has no tool call; a call's arguments filtered to the tool's own and
compared raw for duplicates); :data:`DR_VENUS_READER` is the agent loop's reader of the profile.

RL (``RL/scrl/llm_agent/dr_agent_loop.py``): :func:`fix_tags` and :func:`classify_turn`; its
outcome judge takes the first answer block of the final turn (:func:`first_answer`).

Pure functions of the text; the tests compare them with DR-Venus's own functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from drvenus.protocol._json import loads_json5
from drvenus.protocol.parse import ParsedTurn, TurnReader
from drvenus.protocol.render import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_OPEN,
    VISIT_SEPARATOR,
)
from drvenus.protocol.tools import (
    TOOL_NAMES,
    TOOL_SPECS,
    ToolCall,
    ToolCallError,
    normalize_tool_call,
    unknown_tool_message,
)


def _block(open_tag: str, close_tag: str) -> re.Pattern[str]:
    return re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), re.DOTALL)


_THINK = _block(THINK_OPEN, THINK_CLOSE)
_ANSWER = _block(ANSWER_OPEN, ANSWER_CLOSE)
_TOOL_CALL = _block(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
MISSING_THINK = f"missing {THINK_OPEN}{THINK_CLOSE}"


def reopen_think(sample: str) -> str:
    """A sample after a prompt that ends in the think opener, as DR-Venus's RL loop keeps it:
    ``<think>`` put back, with no newline (the newline was the prompt's)."""
    return THINK_OPEN + sample


def fix_tags(text: str, prefilled_think: bool) -> str:
    """DR-Venus's tag fixing of a sampled turn: the think opener a template wrote into the
    prompt put back, the text cut at a tool response the model began, a missing think closer
    appended, a missing think opener prepended."""
    if prefilled_think and THINK_OPEN not in text:
        text = reopen_think(text)
    cut = text.find(TOOL_RESPONSE_OPEN)
    if cut != -1:
        text = text[:cut]
    if THINK_OPEN in text and THINK_CLOSE not in text:
        text += "\n" + THINK_CLOSE
    if THINK_OPEN not in text and THINK_CLOSE in text:
        text = THINK_OPEN + "\n" + text
    return text


TurnKind = Literal["answer", "tool_call", "malformed"]
#: why a call object cannot run: a tool not routed, a required field missing, another bad value
CallProblem = Literal["unknown_tool", "missing_arguments", "bad_arguments"]


@dataclass(frozen=True)
class EnvTurn:
    """A turn as DR-Venus's RL loop reads it. ``call``: the normalised call; ``call_name``:
    the name the call gave; ``call_key``: its identity for duplicates (name and filtered,
    undecoded arguments); ``problem`` / ``call_error``: why a call object cannot run (the tool
    server answers it with its own text); ``reason``: why a turn is malformed."""

    kind: TurnKind
    content: str
    call: ToolCall | None = None
    call_name: str | None = None
    call_error: str | None = None
    reason: str | None = None
    call_key: str | None = None
    problem: CallProblem | None = None


def _rl_arguments(name: object, given: object) -> Any:
    """DR-Venus RL's argument filter: a tool's own fields; an unrouted name's arguments kept."""
    if not isinstance(given, dict):
        return {}
    allowed = RL_ALLOWED_ARGUMENTS.get(name)  # type: ignore[call-overload]  # unhashable: raises
    return given if allowed is None else {k: v for k, v in given.items() if k in allowed}


def _rl_call(content: str, obj: dict[str, Any]) -> EnvTurn:
    name = obj["name"]
    try:
        arguments = _rl_arguments(name, obj["arguments"])
        key = call_key(name, arguments)
    except TypeError as exc:  # an unhashable name, or arguments JSON cannot write
        return EnvTurn("malformed", content, reason=f"tool call parse error: {exc!r}")
    turn = EnvTurn("tool_call", content, call_name=str(name), call_key=key)
    if name not in TOOL_NAMES:
        return replace(turn, problem="unknown_tool", call_error=unknown_tool_message(name))
    missing = [k for k in TOOL_SPECS[name]["function"]["parameters"]["required"]
               if k not in arguments]
    if name == "search" and arguments.get("query") == []:
        missing = ["query"]  # DR-Venus's tool searches nothing: its model reads "[]" as well
    try:
        return replace(turn, call=normalize_tool_call({"name": name, "arguments": arguments}))
    except ToolCallError as exc:
        return replace(turn, problem="missing_arguments" if missing else "bad_arguments",
                       call_error=str(exc))


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
    return _rl_call(content, obj)


def first_answer(text: str) -> str | None:
    """The first answer block of ``text`` (its body unstripped), None when there is none."""
    m = _ANSWER.search(text)
    return None if m is None else m.group(1)


def as_parsed(turn: EnvTurn, refused: str | None = None) -> ParsedTurn:
    """``turn`` as the agent loop reads turns: an answer (its first answer block, stripped), a
    call (``refused``: the text a call that cannot run gets back, in ``error``; the loop's
    duplicate key is DR-Venus's), or an error (a malformed turn)."""
    if turn.kind == "answer":
        return ParsedTurn("answer", turn.content, answer=(first_answer(turn.content) or "").strip())
    if turn.kind == "malformed":
        return ParsedTurn("error", turn.content, error=turn.reason)
    call = turn.call or ToolCall(str(turn.call_name), {})
    return ParsedTurn("tool_call", turn.content, tool_call=call, call_key=turn.call_key,
                      error=refused)


def rl_reader(prefilled_think: bool, refusal: Callable[[EnvTurn], str | None]) -> TurnReader:
    """The agent loop's reader of DR-Venus's RL environment: :func:`fix_tags`, then
    :func:`classify_turn`; ``refusal`` gives a call's refusal text (None: the call runs)."""
    def parse(content: str) -> ParsedTurn:
        turn = classify_turn(content)
        return as_parsed(turn, refusal(turn) if turn.kind == "tool_call" else None)

    return TurnReader(repair=partial(fix_tags, prefilled_think=prefilled_think), parse=parse)


# ---------------------------------------------------------------- inference (run_demo.py)

#: the arguments each tool keeps (its specification's parameters; DR-Venus drops the others)
ALLOWED_ARGUMENTS: dict[str, frozenset[str]] = {
    name: frozenset(spec["function"]["parameters"]["properties"])
    for name, spec in TOOL_SPECS.items()}


def sanitize_turn(text: str) -> str:
    """DR-Venus's fixing of a sampled turn: cut at a tool response the model began; with a
    think opener and no closer, the closer put before the first answer block, else before the
    first tool call, else at the end; with a closer and no opener, the opener prepended."""
    cut = text.find(TOOL_RESPONSE_OPEN)
    if cut != -1:
        text = text[:cut]
    if THINK_OPEN in text and THINK_CLOSE not in text:
        for tag in (ANSWER_OPEN, TOOL_CALL_OPEN):
            pos = text.find(tag)
            if pos != -1:
                text = f"{text[:pos]}\n{THINK_CLOSE}\n{text[pos:]}"
                break
        else:
            text += "\n" + THINK_CLOSE
    if THINK_OPEN not in text and THINK_CLOSE in text:
        text = THINK_OPEN + "\n" + text
    return text


def call_key(name: object, arguments: object) -> str:
    """A call's identity for duplicates: its name and (filtered, undecoded) arguments."""
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False)


def _read_call(content: str, thinking: str, raw: str) -> ParsedTurn:
    try:
        obj = loads_json5(raw)
    except Exception as exc:  # json5 raises several types
        return ParsedTurn("error", content, error=f"tool call parse error: {exc!r}")
    if not isinstance(obj, dict):
        return ParsedTurn("error", content, error=f"tool call should be an object, got {obj!r}")
    if "name" not in obj or "arguments" not in obj:
        return ParsedTurn("error", content, error=f"tool call missing fields, raw={raw}")
    name = obj["name"]
    if not isinstance(name, str) or name not in TOOL_NAMES:
        return ParsedTurn("error", content, error=unknown_tool_message(name))
    given = obj["arguments"]
    arguments = ({k: v for k, v in given.items() if k in ALLOWED_ARGUMENTS[name]}
                 if isinstance(given, dict) else {})
    try:
        call = normalize_tool_call({"name": name, "arguments": arguments})
    except ToolCallError:  # DR-Venus runs it anyway: the tool answers with its error
        call = ToolCall(name, arguments)
    return ParsedTurn("tool_call", content, thinking, tool_call=call,
                      call_key=call_key(name, arguments))


def read_turn(content: str) -> ParsedTurn:
    """DR-Venus's reading of a sanitized turn (see the module doc)."""
    think = _THINK.search(content)
    if think is None:
        return ParsedTurn("error", content, error=MISSING_THINK)
    thinking = think.group(1).strip()
    answer, call = _ANSWER.search(content), _TOOL_CALL.search(content)
    if answer and not call:
        return ParsedTurn("answer", content, thinking, answer=answer.group(1).strip())
    if call and not answer:
        return _read_call(content, thinking, call.group(1).strip())
    return ParsedTurn("error", content, thinking, error="ambiguous or incomplete output")


def take_reply(text: str) -> str:
    """A reply as DR-Venus keeps it: stripped (``_call_llm_once``), then :func:`sanitize_turn`
    (what the conversation stores)."""
    return sanitize_turn(text.strip())


DR_VENUS_READER = TurnReader(repair=take_reply, parse=read_turn)


#: DR-Venus's RL loop also filters the arguments of its code tool (which its tool server does
#: not route): the same filter, one tool more
RL_ALLOWED_ARGUMENTS: dict[str, frozenset[str]] = {
    **ALLOWED_ARGUMENTS, "PythonInterpreter": frozenset({"code"})}


# ---------------------------------------------------------------- the search tool's text
# DR-Venus's search tool (Inference/ and RL/tool_server/tool_search.py, the same) writes
# Serper's organic results as numbered Markdown links, each with its date and source lines on
# top of the snippet; one block per query, joined as the visit tool joins pages.
_NO_VIDEO = "Your browser can't play this video."


def _search_hit(index: int, hit: Mapping[str, Any]) -> str:
    date = f"\nDate published: {hit['date']}" if hit.get("date") else ""
    source = f"\nSource: {hit['source']}" if hit.get("source") else ""
    snippet = f"\n{hit['snippet']}" if "snippet" in hit else ""
    text = f"{index}. [{hit.get('title', '')}]({hit.get('url', '')}){date}{source}\n{snippet}"
    return text.replace(_NO_VIDEO, "")


def render_search_block(query: str, hits: Sequence[Mapping[str, Any]]) -> str:
    """One query's block: a header and the hits, or the no-result text."""
    if not hits:
        return f"No results found for '{query}'. Try with a more general query."
    listed = "\n\n".join(_search_hit(i, h) for i, h in enumerate(hits, 1))
    return (f"A Google search for '{query}' found {len(hits)} results:\n\n## Web Results\n"
            + listed)


def render_search_text(per_query: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> str:
    """The search tool's Markdown for ``[(query, [hit, ...]), ...]``, as DR-Venus's tool writes
    it (before its dispatcher re-reads it: :func:`render_search_view`)."""
    return VISIT_SEPARATOR.join(render_search_block(q, hits) for q, hits in per_query)


# ---------------------------------------------------------------- what the model reads of it
# DR-Venus's dispatcher (custom_call_tool, Inference/ and RL/tool_server/execute_tools.py) does
# not hand the Markdown on: it re-reads it into JSON (parse_search_results). The re-reading
# decides what the model sees, quirks included: a header is "A Google search for '<query>'"
# with a query of no apostrophe (so a query is cut at its first one, and one that starts with
# an apostrophe is no header at all); everything up to the next header belongs to that query
# (a "No results found" block, which has no header, is glued onto the previous query's last
# snippet with the "=======" separator, or dropped when it comes first); a hit is "N. [title]
# (url)" then a line break, its snippet (date and source lines included) running to the next
# "N. [" that starts a line, or the end of the query's text; title, url and snippet stripped.
_VIEW_HEADER = re.compile(r"A Google search for '([^']+)'")
_VIEW_HIT = re.compile(r"\d+\.\s+\[(.*?)\]\((.*?)\)\s*\n+(.*?)(?=\n\d+\.\s+\[|\Z)", re.DOTALL)


def search_view(text: str) -> str:
    """What DR-Venus's model reads of the search tool's Markdown ``text`` (see above): a JSON
    list ``[{"query", "web_page_info_list": [{"title", "url", "snippet"}]}]``."""
    headers = list(_VIEW_HEADER.finditer(text))
    bounds = [h.start() for h in headers[1:]] + [len(text)] * bool(headers)
    entries = []
    for header, end in zip(headers, bounds, strict=True):
        hits = [{"title": title.strip(), "url": url.strip(), "snippet": snippet.strip()}
                for title, url, snippet in _VIEW_HIT.findall(text[header.end():end])]
        entries.append({"query": header.group(1), "web_page_info_list": hits})
    return json.dumps(entries, ensure_ascii=False)


def render_search_view(per_query: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> str:
    """The ``dr-venus`` profile's search body: :func:`render_search_text` as the dispatcher
    re-reads it (:func:`search_view`), byte for byte what DR-Venus's model reads. No query
    at all gives ``[]`` (the tool's invalid-request text re-read)."""
    return search_view(render_search_text(per_query))


__all__ = ["ALLOWED_ARGUMENTS", "DR_VENUS_READER", "MISSING_THINK", "CallProblem", "EnvTurn",
           "RL_ALLOWED_ARGUMENTS", "TurnKind",
           "as_parsed", "call_key", "classify_turn", "first_answer", "fix_tags", "read_turn",
           "reopen_think", "rl_reader", "render_search_block", "render_search_text",
           "render_search_view", "sanitize_turn", "search_view", "take_reply"]
