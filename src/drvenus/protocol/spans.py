"""Answer spans: the word sequences an answer may copy from what the agent has read.

A grounded answer grammar (``protocol_grammar(answer_spans=...)``) admits only answers that are
one contiguous span of words of these texts, with one space between words. Its vocabulary is
closed, so no answer can glue two words together ("AldousHuxley") or cut one ("ParkServ"):
every word of an answer is a whole word of a source, and the next word is one that follows it
there.

The sources are the tool responses of the conversation so far (search titles and snippets, not
URLs; visit frames as text), never the agent's own fixed notices, optionally the agent's own
thoughts (so that a forced final answer can still give the answer its thinking already
stated), and the question when there is nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from drvenus.protocol.parse import parse_turn
from drvenus.protocol.render import (
    VISIT_SEPARATOR,
    notice_kind,
    parse_search_body,
    unwrap_tool_response,
)
from drvenus.protocol.tools import ToolCall

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
# The fixed lines of a visit frame (render_visit): not answer material.
_VISIT_HEAD = re.compile(
    r"^The useful information in \S+ for user goal .*? as follows: *$|"
    r"^(?:Evidence in page|Summary): *$",
    re.MULTILINE,
)
# Where a clause ends: sentence punctuation before a blank (not after a lone capital, an
# initial such as "J."), a comma/semicolon/colon before a blank, brackets, quotes, dashes
# between blanks, an en or em dash anywhere ("1928–2025": a range, two answers), a hyphen
# between digits, an ellipsis, a line break. A span never crosses a clause boundary.
_CLAUSE_BREAK = re.compile(
    r"(?<![\s.][A-Z])(?<!^[A-Z])[.!?](?=\s|$)|[,;:](?=\s|$)|[()\[\]{}\"\u201c\u201d|]"
    r"|\s[-\u2013\u2014]+\s|[\u2013\u2014]|(?<=\d)-(?=\d)|\.\.\.|\u2026|\n"
)
_STRIP = ".,;:!?'\u2018\u2019*_`"
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+")
MAX_WORD_CHARS = 40


def _ok_word(word: str) -> bool:
    return (
        0 < len(word) <= MAX_WORD_CHARS
        and "<" not in word
        and ">" not in word
        and "://" not in word
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in word)
    )


def _echoes(word: str, question: frozenset[str]) -> bool:
    """``word`` (lower case) is a question word or a cut-off one ("dracul" of "dracula")."""
    if word in question:
        return True
    return len(word) >= 4 and any(q.startswith(word) for q in question)


def question_words(question: str) -> frozenset[str]:
    """The words of a question an answer should not repeat: those of three or more letters,
    lower-cased ("Who wrote the novel Dracula?": who, wrote, the, novel, dracula). The answer
    to a question is what the question does not already say."""
    return frozenset(
        w.lower() for clause in clause_words(question) for w in clause if len(w) >= 3
    )


def clause_words(text: str, exclude: frozenset[str] = frozenset()) -> list[list[str]]:
    """``text`` as clauses (see ``_CLAUSE_BREAK``), each a list of words (blank-separated, outer
    punctuation stripped). A word that cannot be part of an answer (a URL, markup, a very long
    token, one of ``exclude`` in any case) ends the clause too."""
    clauses: list[list[str]] = []
    for piece in _CLAUSE_BREAK.split(text):
        words: list[str] = []
        for raw in piece.split():
            word = raw.strip(_STRIP)
            if _INITIALS.fullmatch(raw.rstrip(_STRIP.replace(".", ""))):
                word = raw.strip(_STRIP.replace(".", ""))  # "J." and "U.S." keep their stops
            if _ok_word(word) and not _echoes(word.lower(), exclude):
                words.append(word)
            elif words:
                clauses.append(words)
                words = []
        if words:
            clauses.append(words)
    return clauses


def _search_text(body: str) -> str | None:
    """Titles and snippets of a search response, one per line (None: not a search response)."""
    data = parse_search_body(body)
    if data is None:
        return None
    hits = [hit for entry in data for hit in entry["web_page_info_list"]]
    return "\n".join(hit[k] for hit in hits for k in ("title", "snippet"))


def tool_response_text(body: str) -> str:
    """The readable text of one tool response body: what an answer may quote."""
    searched = _search_text(body)
    if searched is not None:
        return searched
    return _VISIT_HEAD.sub("", body.replace(VISIT_SEPARATOR, "\n"))


# auxiliary verbs that open a question asking for yes or no ("Are both bands British?")
_YES_NO_OPENERS = frozenset(
    "is are was were am do does did has have had can could will would shall should may might "
    "must".split()
)
YES_NO_ANSWERS = ("yes", "Yes", "no", "No")


def is_yes_no_question(question: str) -> bool:
    """Whether ``question`` asks for yes or no: it opens with an auxiliary verb ("Were Scott
    Derrickson and Ed Wood of the same nationality?", HotpotQA's comparisons). No span of what
    was read answers it, so a grounded answer may then also be yes or no."""
    first = question.strip().split(maxsplit=1)
    return bool(first) and first[0].strip(_STRIP).lower() in _YES_NO_OPENERS


def question_of(messages: Sequence[Mapping[str, str]]) -> str:
    """The question of a conversation: its first user message that is not a tool response."""
    for m in messages:
        if m.get("role") == "user" and unwrap_tool_response(m.get("content") or "") is None:
            return m.get("content") or ""
    return ""


def span_sources(
    messages: Sequence[Mapping[str, str]], *, thinking: bool = False
) -> tuple[str, ...]:
    """The texts an answer may quote, from a conversation: the tool responses (not the fixed
    notices), and with ``thinking`` the agent's own thoughts; the question when there is
    nothing else (see :func:`question_of` for the words an answer should not repeat)."""
    texts: list[str] = []
    question = ""
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "user":
            body = unwrap_tool_response(content)
            if body is None:
                question = question or content
            elif notice_kind(body) is None:
                texts.append(tool_response_text(body))
        elif role == "assistant" and thinking:
            texts.extend(t.strip() for t in _THINK.findall(content))
    texts = [t for t in texts if t.strip()]
    if not texts and question:
        texts = [question]
    return tuple(texts)


def _weak_start(word: str) -> bool:
    """A short lower-case word (a, an, the, by, of, in, was): no answer starts with one."""
    return len(word) <= 3 and word.islower()


def spans_of(
    texts: Iterable[str], max_words: int, exclude: frozenset[str] = frozenset()
) -> list[tuple[str, ...]]:
    """Every distinct span of at most ``max_words`` words inside one clause of ``texts``, as
    the longest one from each start (their prefixes are spans too), without the words of
    ``exclude`` (see :func:`question_words`) and never starting with a short lower-case word."""
    if max_words < 1:
        raise ValueError("max_words must be at least 1")
    seen: set[tuple[str, ...]] = set()
    out: list[tuple[str, ...]] = []
    for text in texts:
        for words in clause_words(text, exclude):
            for i in range(len(words)):
                if _weak_start(words[i]):
                    continue
                span = tuple(words[i : i + max_words])
                if span not in seen:
                    seen.add(span)
                    out.append(span)
    return out




# -- grounded tool calls ---------------------------------------------------------------------

def _calls(messages: Sequence[Mapping[str, str]]) -> list[ToolCall]:
    """The tool calls of the conversation's assistant turns (as the agent parsed them)."""
    calls = []
    for m in messages:
        if m.get("role") == "assistant":
            call = parse_turn(m.get("content") or "").tool_call
            if call is not None:
                calls.append(call)
    return calls


def _items(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def past_queries(messages: Sequence[Mapping[str, str]]) -> tuple[str, ...]:
    """The queries the conversation's search calls already asked, in order."""
    seen = [q for c in _calls(messages) if c.name == "search"
            for q in _items(c.arguments.get("query"))]
    return tuple(dict.fromkeys(seen))


def result_urls(messages: Sequence[Mapping[str, str]]) -> tuple[str, ...]:
    """The URLs of the search results read so far that no visit call has opened yet: the
    pages a grounded visit may open (it can never invent a URL)."""
    visited = {u for c in _calls(messages) if c.name == "visit"
               for u in _items(c.arguments.get("url"))}
    urls: list[str] = []
    for m in messages:
        body = unwrap_tool_response(m.get("content") or "") if m.get("role") == "user" else None
        if body is None:
            continue
        for entry in parse_search_body(body) or []:
            urls.extend(hit["url"] for hit in entry["web_page_info_list"]
                        if str(hit["url"]).startswith(("http://", "https://")))
    return tuple(u for u in dict.fromkeys(urls) if u not in visited)


__all__ = [
    "YES_NO_ANSWERS",
    "clause_words",
    "is_yes_no_question",
    "past_queries",
    "result_urls",
    "question_of",
    "question_words",
    "span_sources",
    "spans_of",
    "tool_response_text",
]
