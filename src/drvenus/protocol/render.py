"""Renderers for tool responses, and the fixed messages the agent loop sends back.

Search results are a JSON array, one object per query::

    [{"query": q, "web_page_info_list": [{"title": ..., "url": ..., "snippet": ...}]}]

Visit results are a text frame per URL, joined with ``\\n=======\\n``.
Tool results travel in the ``user`` role wrapped in ``<tool_response>`` tags.

The words of the fixed messages (the notices, the visit failure texts, the system prompt) are a
:class:`ProtocolTexts` profile: ours by default (:data:`DRVENUS_TEXTS`); DR-Venus's exact ones
are read at run time from its pinned source (``drvenus.reference.dr_venus``), never stored here.
The readers of those words (:func:`classify_tool_response`, :func:`notice_kind`,
:func:`is_visit_failure`, :func:`visit_failure_marks`) are told whose words to know: the active
profile's texts (or several profiles'), drvenus's by default. No table is kept between calls,
so an answer never depends on what else ran in the process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from drvenus.protocol.prompt import build_system_prompt, with_current_date

# Accepted answers in one ground-truth string are joined by this (RL data, benchmarks).
ANSWER_SPLIT = "<|answer_split|>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
VISIT_SEPARATOR = "\n=======\n"

# One sentence describing a trajectory's message layout, for dataset cards and docs.
TRAJECTORY_LAYOUT = (
    "system prompt, user question, then assistant `<think>`/`<tool_call>` turns and user "
    "`<tool_response>` turns, and a final assistant `<think>`/`<answer>` turn"
)

VISIT_FAILED_EVIDENCE = "The page could not be accessed: check the URL, or try another source."
VISIT_FAILED_SUMMARY = "The page could not be processed, so it gives no information for the goal."
# the evidence of a failure frame for a URL the address policy refused (both profiles: DR-Venus's
# tool has no such policy), so the record says why the page was not read
VISIT_REFUSED_EVIDENCE = "The page was not read: {reason}."

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


def render_search_hits(per_query: Sequence[tuple[str, Sequence[tuple[str, str, str]]]]) -> str:
    """:func:`render_search` for hits given as ``(title, url, snippet)`` strings (what
    :func:`drvenus.protocol.legacy.serper_hits` returns): the same text, written with the JSON
    encoder's own string escaping, about 2x faster."""
    q = _json_string
    entries = []
    for query, hits in per_query:
        listed = ", ".join([
            f'{{"title": {q(t)}, "url": {q(u)}, "snippet": {q(s)}}}' for t, u, s in hits
        ])
        entries.append(f'{{"query": {q(query)}, "web_page_info_list": [{listed}]}}')
    return "[" + ", ".join(entries) + "]"


_json_string = json.encoder.encode_basestring  # json.dumps's escaping with ensure_ascii=False


def render_visit(url: str, goal: str, summary: str, evidence: str | None = None) -> str:
    """One URL's visit frame. Without ``evidence`` only the Summary part is written."""
    head = f"The useful information in {url} for user goal {goal} as follows: \n\n"
    if evidence is not None:
        head += f"Evidence in page: \n{evidence}\n\n"
    return head + f"Summary: \n{summary}\n\n"


NoticeKind = Literal["format_error", "context_limit", "step_limit"]


@dataclass(frozen=True)
class ProtocolTexts:
    """The words of one protocol profile: the system prompt, the loop's three notices (bodies
    of a ``<tool_response>``, without the tags) and the visit failure frame's two texts.

    ``system_prompt`` None: ours, built by :func:`build_system_prompt` with the run's date; a
    string: that prompt verbatim (it carries its own ``Current date:`` line, which a given date
    replaces). ``source``: where the words come from, for logs and reports.
    """

    name: str = "drvenus"
    system_prompt: str | None = None
    format_error: str = FORMAT_ERROR_MESSAGE
    context_limit: str = CONTEXT_LIMIT_MESSAGE
    step_limit: str = STEP_LIMIT_MESSAGE
    visit_failed_evidence: str = VISIT_FAILED_EVIDENCE
    visit_failed_summary: str = VISIT_FAILED_SUMMARY
    source: str = "drvenus's own wording"

    def prompt(self, current_date: Any = None) -> str:
        """The system prompt of a run on ``current_date`` (None: today for ours; the fixed
        prompt's own date for a fixed one)."""
        if self.system_prompt is None:
            return build_system_prompt(current_date)
        if current_date is None:
            return self.system_prompt
        return with_current_date(self.system_prompt, current_date)

    def visit_failure(self, url: str, goal: str) -> str:
        """The visit frame of a page that could not be read or processed."""
        return render_visit(url, goal, self.visit_failed_summary, self.visit_failed_evidence)

    def visit_refused(self, url: str, goal: str, reason: str) -> str:
        """The failure frame of a URL the address policy refused, its evidence saying why."""
        evidence = VISIT_REFUSED_EVIDENCE.format(reason=" ".join(reason.split()).rstrip("."))
        return render_visit(url, goal, self.visit_failed_summary, evidence)

    def notices(self) -> dict[str, NoticeKind]:
        return {self.format_error: "format_error", self.context_limit: "context_limit",
                self.step_limit: "step_limit"}


DRVENUS_TEXTS = ProtocolTexts()
#: whose words a reader knows: one profile's texts, or several profiles'
TextsLike = ProtocolTexts | Iterable[ProtocolTexts]


def _each(texts: TextsLike) -> tuple[ProtocolTexts, ...]:
    return (texts,) if isinstance(texts, ProtocolTexts) else tuple(texts)


def notice_kind(body: str, texts: TextsLike = DRVENUS_TEXTS) -> NoticeKind | None:
    """Which of the loop's notices a tool-response body is, in ``texts``' words (the active
    profile's; drvenus's by default)."""
    text = body.strip()
    for t in _each(texts):
        kind = t.notices().get(text)
        if kind is not None:
            return kind
    return None


def is_visit_failure(summary: str | None, texts: TextsLike = DRVENUS_TEXTS) -> bool:
    """Whether a visit frame's summary is a failure frame's, in ``texts``' words."""
    text = (summary or "").strip()
    return any(text == t.visit_failed_summary.strip() for t in _each(texts))


def visit_failure_marks(texts: TextsLike = DRVENUS_TEXTS) -> tuple[str, ...]:
    """The failure summaries of ``texts`` (a response holding one is partial)."""
    return tuple(t.visit_failed_summary for t in _each(texts))


def render_visit_failure(url: str, goal: str, texts: ProtocolTexts = DRVENUS_TEXTS) -> str:
    return texts.visit_failure(url, goal)


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


def classify_tool_response(content: str, texts: TextsLike = DRVENUS_TEXTS) -> str | None:
    """Which renderer produced a tool-response message: 'search', 'visit', 'message' or None.

    'message' is one of the loop's own notices (format error, context or step limit) in
    ``texts``' words (the active profile's; drvenus's by default).
    """
    body = unwrap_tool_response(content)
    if body is None:
        return None
    if parse_search_body(body) is not None:
        return "search"
    if parse_visit_body(body) is not None:
        return "visit"
    if notice_kind(body, texts) is not None:
        return "message"
    return None
