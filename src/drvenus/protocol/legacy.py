"""Lenient readers for provider and legacy trajectory text (pure, no I/O).

Raw REDSearcher trajectories predate the strict protocol: tags may differ in case, a tool call
may carry a trailing ``<code>`` block, arguments use legacy shapes, and search results are
Serper's markdown::

    A Google search for 'q' found 10 results:

    ## Web Results
    1. [title](url)
    Date published: ...
    snippet ...

These functions reproduce, rule for rule, how DR-Venus's released SFT cleaning script reads such
text, so that ``drvenus data clean`` keeps exactly the rows and messages it keeps. The strict
readers for new model output stay in :mod:`drvenus.protocol.parse` and
:mod:`drvenus.protocol.format`; the search results found here are rendered with
:func:`drvenus.protocol.render.render_search`.
"""

from __future__ import annotations

import re
from typing import Any

from drvenus.protocol._json import loads_json5
from drvenus.protocol.tools import ToolCall

# Tag readers of legacy text: case-insensitive, first/last match semantics as documented below.
THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
SUMMARY_RE = re.compile(r"<summary>(.*?)</summary>", re.DOTALL | re.IGNORECASE)
_INLINE_TAGS = ("<answer>", "</answer>", "<summary>", "</summary>")


def unwrap_inline_tags(thought: str) -> str:
    """A raw thought with the answer and summary tags some trajectories write inside it
    removed (their text is kept)."""
    for tag in _INLINE_TAGS:
        thought = thought.replace(tag, "")
    return thought


def strip_thinking(text: str) -> str:
    """``text`` without its think blocks (e.g. a judge model's reasoning before its verdict)."""
    return THINK_RE.sub("", text)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)

_SEARCH_HEADER = re.compile(r"^\s*A Google search for (.+?) found \d+ results:\s*$")
_RESULT_START = re.compile(r"^\s*\d+\.\s+\[")
_RESULT_PREFIX = re.compile(r"^\s*\d+\.\s+")
_DATE_LINE = re.compile(r"^\s*Date\s+(published|updated)\s*:\s*", re.IGNORECASE)

WEB_RESULTS_MARKER = "Web Results"

# --------------------------------------------------------------------------- search markdown


def _query_of_header(header: str) -> str:
    m = _SEARCH_HEADER.match(header.strip())
    if m is None:
        return ""
    query = m.group(1).strip()
    if len(query) >= 2 and query[0] == query[-1] and query[0] in ("'", '"'):
        return query[1:-1]
    return query


def _close_of(line: str, i: int, opening: str, closing: str) -> int | None:
    """Index of the ``closing`` that balances an ``opening`` just before ``line[i]``."""
    j = line.find(closing, i)
    if j != -1 and line.find(opening, i, j) == -1:
        return j  # fast path: nothing nested, the first closing character matches
    depth = 1
    for k in range(i, len(line)):
        if line[k] == opening:
            depth += 1
        elif line[k] == closing:
            depth -= 1
            if depth == 0:
                return k
    return None


def _markdown_link(line: str) -> tuple[str, str, str] | None:
    """``N. [title](url) trailing`` with balanced brackets/parentheses, or None."""
    line = line.strip()
    m = _RESULT_PREFIX.match(line)
    if m is None:
        return None
    i = m.end()
    if line[i : i + 1] != "[":
        return None
    close = _close_of(line, i + 1, "[", "]")
    if close is None:
        return None
    title = line[i + 1 : close]
    if line[close + 1 : close + 2] != "(":
        return None
    start = close + 2
    i = _close_of(line, start, "(", ")")
    if i is None:
        return None
    url = line[start:i]
    return title.strip(), url.strip(), line[i + 1 :].strip()


def _results_of_lines(lines: list[str]) -> list[dict[str, str]]:
    for i, line in enumerate(lines):
        if line.strip() == "## Web Results":
            lines = lines[i + 1 :]
            break
    entries: list[tuple[str, list[str]]] = []
    for line in lines:
        stripped = line.strip()
        if _RESULT_START.match(stripped):
            entries.append((stripped, []))
        elif entries:
            entries[-1][1].append(stripped)
    results = []
    for header, body in entries:
        link = _markdown_link(header)
        if link is None or not link[0] or not link[1]:
            continue
        title, url, trailing = link
        parts = [trailing] if trailing else []
        parts.extend(body)
        start, end = 0, len(parts)
        while start < end and not parts[start]:
            start += 1
        while end > start and not parts[end - 1]:
            end -= 1
        parts = parts[start:end]
        k = 0
        while k < len(parts) and _DATE_LINE.match(parts[k]):
            k += 1
        snippet = "\n".join(p for p in parts[k:] if p).strip()
        results.append({"title": title, "url": url, "snippet": snippet})
    return results


def parse_serper_markdown(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Serper search markdown as ``[(query, [{title, url, snippet}, ...]), ...]``.

    One block per ``A Google search for ... found N results:`` header (the quoted query is
    unquoted); without any header the whole text is one block with an empty query. Leading
    ``Date published/updated:`` lines are dropped from a snippet; results without a title or
    URL are skipped. Any ``<tool_response>`` tags are removed first.
    """
    text = text.replace("<tool_response>", "").replace("</tool_response>", "").strip()
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if _SEARCH_HEADER.match(line.strip()):
            blocks.append((line.strip(), []))
        elif blocks:
            blocks[-1][1].append(line)
    if not blocks:
        blocks = [("", text.splitlines())]
    return [
        (_query_of_header(header) if header else "", _results_of_lines(lines))
        for header, lines in blocks
    ]


# --------------------------------------------------------------------------- legacy tool calls


def legacy_tool_call(obj: dict[str, Any], raw: str) -> ToolCall | str | None:
    """Normalise a decoded legacy tool call the way DR-Venus's cleaning does.

    ``search``: ``query`` (else legacy ``queries``), a lone string becomes a list, list items
    are kept as they are. ``visit``: ``url`` (else ``urls``) likewise, ``goal`` a string or the
    first element of a list. ``PythonInterpreter`` with empty arguments keeps the raw call text
    (returned as a str). Any other named call with object arguments passes through unchanged
    (pruning removes it later). None when the call is unusable.
    """
    name = obj.get("name")
    arguments = obj.get("arguments")
    if name == "search":
        if not isinstance(arguments, dict):
            return None
        query = arguments.get("query", arguments.get("queries"))
        if isinstance(query, str):
            query = [query]
        elif not isinstance(query, list):
            return None
        return ToolCall("search", {"query": query})
    if name == "visit":
        if not isinstance(arguments, dict):
            return None
        goal = arguments.get("goal")
        if isinstance(goal, list):
            goal = goal[0] if goal else ""
        elif not isinstance(goal, str):
            return None
        urls = arguments.get("url", arguments.get("urls"))
        if isinstance(urls, str):
            urls = [urls]
        elif not isinstance(urls, list):
            return None
        return ToolCall("visit", {"url": urls, "goal": goal})
    if name == "PythonInterpreter":
        if isinstance(arguments, dict) and not arguments:
            return raw
        return None
    if name and isinstance(arguments, dict):
        return ToolCall(name, arguments)
    return None


def tool_call_objects(content: str | None) -> list[dict[str, Any]]:
    """Every decodable ``<tool_call>`` object in ``content`` (any tag case; a trailing
    ``<code>`` block is ignored; JSON first, then JSON5; undecodable or non-object calls are
    skipped)."""
    if not content or "<" not in content:
        return []
    out = []
    for m in TOOL_CALL_RE.finditer(content):
        raw = m.group(1).strip().split("<code>")[0].strip()
        try:
            obj = loads_json5(raw)
        except Exception:  # undecodable calls are skipped
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _str_items(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [s for s in (str(v).strip() for v in items if v is not None) if s]


_VISIT_TARGET_KEYS = ("url", "urls", "uri", "uris", "link", "links", "page", "pages", "query",
                      "queries")


def legacy_signature(obj: dict[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    """The duplicate-detection signature of a decoded call: (tool, sorted unique targets).

    Only ``search`` (its queries) and ``visit`` (every URL-like argument) have one. The values
    are the arguments' string forms, stripped, empties removed; computed with
    :meth:`ToolCall.signature`.
    """
    name = obj.get("name")
    if not isinstance(name, str) or name not in ("search", "visit"):
        return None
    arguments = obj.get("arguments", {})
    if name == "search":
        if isinstance(arguments, dict):
            values = _str_items(arguments.get("query", arguments.get("queries")))
        else:
            values = _str_items(arguments)
        return ToolCall("search", {"query": values}).signature()
    collected: list[str] = []
    if isinstance(arguments, dict):
        for key in _VISIT_TARGET_KEYS:
            if key in arguments:
                collected.extend(_str_items(arguments[key]))
    else:
        collected = _str_items(arguments)
    return ToolCall("visit", {"url": collected}).signature()
