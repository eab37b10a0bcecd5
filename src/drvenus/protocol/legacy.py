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


class TagBlock:
    """The first ``<tag>...</tag>`` block of a text as ``<tag>(.*?)</tag>`` (any case, across
    lines) finds it, in two searches, for the opening tag and then the first closing one after
    it (about 4x faster: the lazy pattern tries the closing tag at every character)."""

    def __init__(self, tag: str):
        self._open = re.compile(f"<{tag}>", re.IGNORECASE)
        self._close = re.compile(f"</{tag}>", re.IGNORECASE)

    def first(self, text: str) -> str | None:
        """The text inside the first block (not stripped), or None when there is none."""
        m = self._open.search(text)
        if m is None:
            return None
        end = self._close.search(text, m.end())
        return None if end is None else text[m.end() : end.start()]

    def all(self, text: str) -> list[str]:
        """The texts inside every block, in order, as ``finditer`` of the pattern finds them."""
        found = []
        pos = 0
        while (m := self._open.search(text, pos)) is not None:
            end = self._close.search(text, m.end())
            if end is None:
                break
            found.append(text[m.end() : end.start()])
            pos = end.end()
        return found


THINK_BLOCK = TagBlock("think")
ANSWER_BLOCK = TagBlock("answer")
TOOL_CALL_BLOCK = TagBlock("tool_call")

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
    return [
        (query, [{"title": t, "url": u, "snippet": s} for t, u, s in hits])
        for query, hits in serper_hits(text)
    ]


def serper_hits(text: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """:func:`parse_serper_markdown` with each hit as a ``(title, url, snippet)`` tuple.

    The rules are those of :func:`parse_serper_lines` (a line at a time, as DR-Venus's script
    reads it); this reads the text in one pass with multi-line patterns instead, about 2x
    faster, and hands text with line breaks other than ``\\n`` to :func:`parse_serper_lines`.
    """
    text = text.replace("<tool_response>", "").replace("</tool_response>", "").strip()
    if any(c in text for c in _OTHER_LINE_BREAKS):
        return [
            (query, [(h["title"], h["url"], h["snippet"]) for h in hits])
            for query, hits in parse_serper_lines(text)
        ]
    headers = _header_lines(text)
    if not headers:
        return [("", _results_of_block(text))]
    blocks = []
    for n, (_, end, header) in enumerate(headers):
        stop = headers[n + 1][0] - 1 if n + 1 < len(headers) else len(text)
        blocks.append((_query_of_header(header), _results_of_block(text[end + 1 : stop])))
    return blocks


# Line breaks str.splitlines() knows besides "\n": text holding any of them is read a line at
# a time, so that both readers split lines alike.
_OTHER_LINE_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_HEADER_WORDS = "A Google search for"
# a result line: "N. [" at the start of a line (after "\n": a block is read with one put
# before it); its link in the same pass when the title holds no bracket and the URL no
# parenthesis (the brackets then balance at the first "]" and ")"; else _markdown_link counts)
_RESULT_LINE = re.compile(
    r"\n[^\S\n]*\d+\.[^\S\n]+\[(?:([^\[\]\n]*)\]\(([^()\n]*)\)([^\n]*)|[^\n]*)"
)


def _header_lines(text: str) -> list[tuple[int, int, str]]:
    """``(line start, line end, stripped line)`` of each search header line of ``text``."""
    found = []
    i = text.find(_HEADER_WORDS)
    while i != -1:
        start = text.rfind("\n", 0, i) + 1
        end = text.find("\n", i)
        if end == -1:
            end = len(text)
        line = text[start:end].strip()
        if _SEARCH_HEADER.match(line):
            found.append((start, end, line))
        i = text.find(_HEADER_WORDS, end)
    return found


def _results_of_block(block: str) -> list[tuple[str, str, str]]:
    """The results of one block's text (its lines joined by ``\\n``), as
    :func:`_results_of_lines` reads its lines."""
    block = "\n" + block
    i = block.find("## Web Results")
    while i != -1:
        start = block.rfind("\n", 0, i)
        end = block.find("\n", i)
        if end == -1:
            end = len(block)
        if block[start:end].strip() == "## Web Results":
            block = block[end:]
            break
        i = block.find("## Web Results", end)
    starts = list(_RESULT_LINE.finditer(block))
    results = []
    for n, m in enumerate(starts):
        title = m.group(1)
        if title is not None:
            title, url, trailing = title.strip(), m.group(2).strip(), m.group(3).strip()
        else:
            found = _markdown_link(m.group())
            if found is None:
                continue
            title, url, trailing = found
        if not title or not url:
            continue
        end = starts[n + 1].start() if n + 1 < len(starts) else len(block)
        parts = [p.strip() for p in block[m.end() + 1 : end].split("\n")]
        if trailing:
            parts.insert(0, trailing)
        k = 0
        while k < len(parts) and not parts[k]:
            k += 1
        while k < len(parts) and _DATE_LINE.match(parts[k]):
            k += 1
        results.append((title, url, "\n".join(filter(None, parts[k:]))))
    return results


def parse_serper_lines(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """:func:`parse_serper_markdown` a line at a time (``text`` without tool-response tags):
    the reference form of its rules, used for text with unusual line breaks."""
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
    for block in TOOL_CALL_BLOCK.all(content):
        raw = block.strip().split("<code>")[0].strip()
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
