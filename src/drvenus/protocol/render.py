"""Renderers for tool responses, and the fixed messages the agent loop sends back.

Search results are a JSON array, one object per query::

    [{"query": q, "web_page_info_list": [{"title": ..., "url": ..., "snippet": ...}]}]

Visit results are a text frame per URL, joined with ``\\n=======\\n``.
Tool results travel in the ``user`` role wrapped in ``<tool_response>`` tags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Accepted answers in one ground-truth string are joined by this (RL data, benchmarks).
ANSWER_SPLIT = "<|answer_split|>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
VISIT_SEPARATOR = "\n=======\n"

# One sentence describing a trajectory's message layout, for dataset cards and docs.
TRAJECTORY_LAYOUT = (
    "system prompt, user question, then assistant `<think>`/`<tool_call>` turns and user "
    "`<tool_response>` turns, and a final assistant `<think>`/`<answer>` turn"
)

VISIT_FAILED_EVIDENCE = "The page could not be accessed: check the URL, or try another source."
VISIT_FAILED_SUMMARY = "The page could not be processed, so it gives no information for the goal."

FORMAT_ERROR_MESSAGE = (
    "ERROR!\nYour last reply could not be used. Call a tool with a well-formed "
    "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>, or, if you are ready, give the "
    "entire final answer in `<answer></answer>` tags."
)
CONTEXT_LIMIT_MESSAGE = (
    "You have reached the maximum context length. Using what you have found so far, give the "
    "entire final answer in `<answer></answer>` tags now."
)
STEP_LIMIT_MESSAGE = (
    "You have reached the maximum number of tool calls. Using what you have found so far, give "
    "the entire final answer in `<answer></answer>` tags now."
)

# IGPO: appended at a turn boundary (then the end-of-turn token) to score the policy's belief in
# the ground truth ``{gt}`` (PROTOCOL.md, "IGPO (RL) defaults").
IG_PSEUDO_ANSWER = "Now there's enough information to answer\n</think>\n<answer>\n{gt}\n</answer>"

_RESULT_KEYS = ("title", "url", "snippet", "date")


def render_tool_call_turn(thinking: str, call_json: str) -> str:
    """A middle assistant turn: think block, then one tool call (``call_json`` verbatim)."""
    return f"<think>\n{thinking}\n</think>\n<tool_call>\n{call_json}\n</tool_call>"


def render_answer_turn(thinking: str, answer: str) -> str:
    """A final assistant turn: think block, then the answer."""
    return f"<think>\n{thinking}\n</think>\n<answer>\n{answer}\n</answer>"


def wrap_tool_response(body: str) -> str:
    """The user-role message that carries a tool result."""
    return f"{TOOL_RESPONSE_OPEN}\n{body}\n{TOOL_RESPONSE_CLOSE}"


def unwrap_tool_response(content: str) -> str | None:
    """The body of a ``<tool_response>`` message, or None when ``content`` is not one."""
    text = content.strip()
    if not (text.startswith(TOOL_RESPONSE_OPEN) and text.endswith(TOOL_RESPONSE_CLOSE)):
        return None
    body = text[len(TOOL_RESPONSE_OPEN) : len(text) - len(TOOL_RESPONSE_CLOSE)]
    return body.removeprefix("\n").removesuffix("\n")


def search_entry(query: str, results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One query's object in the search response; keeps only the protocol's result keys."""
    hits = []
    for r in results:
        hit = {k: r[k] for k in _RESULT_KEYS if k in r and r[k] is not None}
        for k in ("title", "url", "snippet"):
            hit.setdefault(k, "")
        hits.append({k: hit[k] for k in _RESULT_KEYS if k in hit})
    return {"query": query, "web_page_info_list": hits}


def render_search(per_query: Sequence[tuple[str, Iterable[Mapping[str, Any]]]]) -> str:
    """The search tool response body for ``[(query, [result, ...]), ...]``."""
    return json.dumps([search_entry(q, rs) for q, rs in per_query], ensure_ascii=False)


def render_visit(url: str, goal: str, summary: str, evidence: str | None = None) -> str:
    """One URL's visit frame. Without ``evidence`` only the Summary part is written."""
    head = f"The useful information in {url} for user goal {goal} as follows: \n\n"
    if evidence is not None:
        head += f"Evidence in page: \n{evidence}\n\n"
    return head + f"Summary: \n{summary}\n\n"


def render_visit_failure(url: str, goal: str) -> str:
    return render_visit(url, goal, VISIT_FAILED_SUMMARY, VISIT_FAILED_EVIDENCE)


def join_visits(frames: Sequence[str]) -> str:
    """The visit response body: the frames joined by the separator, the whole stripped (so the
    last frame has no trailing blank line, as in the training data; inner frames keep theirs)."""
    return VISIT_SEPARATOR.join(frames).strip()


_VISIT_FRAME = re.compile(
    r"The useful information in (?P<url>\S+) for user goal (?P<goal>.*?) as follows: \n\n"
    r"(?:Evidence in page: \n(?P<evidence>.*?)\n\n)?Summary: \n(?P<summary>.*)",
    re.DOTALL,
)


def parse_search_body(body: str) -> list[dict[str, Any]] | None:
    """Decoded search response, or None when ``body`` is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, list):
        return None
    for entry in data:
        if not (isinstance(entry, dict) and "query" in entry and "web_page_info_list" in entry):
            return None
        if not isinstance(entry["web_page_info_list"], list):
            return None
        for hit in entry["web_page_info_list"]:
            if not (isinstance(hit, dict) and {"title", "url", "snippet"} <= hit.keys()):
                return None
    return data


def parse_visit_body(body: str) -> list[dict[str, str | None]] | None:
    """The frames of a visit response (url, goal, evidence, summary), or None."""
    frames = []
    for part in body.split(VISIT_SEPARATOR):
        m = _VISIT_FRAME.fullmatch(part)
        if m is None:
            return None
        frames.append(
            {
                "url": m["url"],
                "goal": m["goal"],
                "evidence": m["evidence"],
                "summary": m["summary"].rstrip("\n"),
            }
        )
    return frames


def classify_tool_response(content: str) -> str | None:
    """Which renderer produced a tool-response message: 'search', 'visit', 'message' or None.

    'message' is one of the loop's own notices (format error, context or step limit).
    """
    body = unwrap_tool_response(content)
    if body is None:
        return None
    if parse_search_body(body) is not None:
        return "search"
    if parse_visit_body(body) is not None:
        return "visit"
    if body in (FORMAT_ERROR_MESSAGE, CONTEXT_LIMIT_MESSAGE, STEP_LIMIT_MESSAGE):
        return "message"
    return None
