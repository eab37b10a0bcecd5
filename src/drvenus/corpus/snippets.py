"""Search result snippets of the corpus index: the window of a page that holds the most of a
query (the lead, the best fragment, a sentence start, or the first mention of a query word the
lead lacks), about :data:`SNIPPET_CHARS` characters cut at word boundaries."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from drvenus.text import sentence_starts

SNIPPET_CHARS = 420  # most leads whole (median 456 chars); see choose_snippet
WORD = re.compile(r"[^\W_]+")  # letters and digits; "_" separates words
# question words never locate an answer; the snippet choice ignores them
_QUESTION_TOKENS = frozenset(
    {"what", "who", "whom", "whose", "when", "where", "which", "why", "how"}
)
_MENTION_TOKENS = 4  # the rarest query tokens the lead lacks, each looked up in the page
_SENTENCE_WINDOWS = 12  # the first sentences of a page each tried as a snippet's start

Analyze = Callable[[str], list[str]]
"""The index's analyzer: text -> its tokens (lowercased, stemmed)."""


def make_snippet(text: str, start: int, end: int, width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``text`` around ``text[start:end]``, cut at word
    boundaries, with ``...`` where the text was cut and whitespace collapsed."""
    n = len(text)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    end = min(max(end, start), start + width)
    pad = width - (end - start)
    lo = start - pad // 3
    hi = end + (pad - pad // 3)
    if lo < 0:
        hi, lo = min(n, hi - lo), 0
    if hi > n:
        lo, hi = max(0, lo - (hi - n)), n
    if lo > 0:
        space = text.find(" ", lo - 1, start + 1) if start >= lo else -1
        lo = space + 1 if space != -1 else lo
    if hi < n:
        space = text.rfind(" ", end, hi + 1)
        hi = space if space != -1 else hi
    body = " ".join(text[lo:hi].split())
    return ("..." if lo > 0 else "") + body + ("..." if hi < n else "")


def char_span(text: str, byte_start: int, byte_end: int) -> tuple[int, int]:
    raw = text.encode("utf-8")
    start = len(raw[:byte_start].decode("utf-8", errors="ignore"))
    end = start + len(raw[byte_start:byte_end].decode("utf-8", errors="ignore"))
    return start, end


def choose_snippet(analyze: Analyze, body: str, start: int, end: int,
                   weights: Mapping[str, float], title: str = "",
                   width: int = SNIPPET_CHARS) -> str:
    """The window of ``body`` that holds the most of the query: the page's lead, the
    best-matching fragment ``body[start:end]``, a window from the start of one of the
    page's first sentences, or a window around the first mention of a query word the lead
    lacks, by the idf of the distinct query tokens each holds. Tokens
    of the page's ``title`` (the result shows it anyway) and question words do not count;
    a tie goes to the lead, which says what the page is about (a novel's author, a city's
    country). So "capital of Hungary" on the page "Hungary" shows the window that says
    "capital", and "Dracula" on "Dracula" shows "1897 novel by Bram Stoker"."""
    shown = set(analyze(title)) if title else set()
    wanted = {
        t: w
        for t, w in weights.items()
        if t not in shown and t not in _QUESTION_TOKENS and w > 0
    }
    lead = make_snippet(body, 0, 0, width)
    candidates = [lead]
    if start:
        candidates.append(make_snippet(body, start, end, width))
    for i, at in enumerate(sentence_starts(body, width * 8)):
        if i == _SENTENCE_WINDOWS:
            break
        candidates.append(make_snippet(body, at, at, width))
    lead_tokens = set(analyze(lead))
    folded = None
    for token in sorted(wanted, key=wanted.__getitem__, reverse=True)[:_MENTION_TOKENS]:
        if token in lead_tokens:
            continue
        folded = folded if folded is not None else body.lower()
        at = first_mention(analyze, body, folded, token)
        if at is not None:
            candidates.append(make_snippet(body, *at, width))
    if len(candidates) == 1:
        return lead

    def coverage(window: str) -> float:
        return sum(wanted.get(t, 0.0) for t in set(analyze(window)))

    return max(candidates, key=coverage)  # the first of the best: the lead on a tie


def first_mention(analyze: Analyze, body: str, folded: str, token: str) -> tuple[int, int] | None:
    """The span of the first word of ``body`` that analyses to ``token`` (a stem is the
    lowercased word's prefix for nearly every English word, so only words starting with it
    are analysed); None when no word does."""
    at = folded.find(token)
    while at != -1:
        if at == 0 or not folded[at - 1].isalnum():
            word = WORD.match(folded, at)
            if word and token in analyze(word.group()):
                return word.start(), word.end()
        at = folded.find(token, at + 1)
    return None


__all__ = ["SNIPPET_CHARS", "WORD", "choose_snippet", "char_span", "first_mention", "make_snippet"]
