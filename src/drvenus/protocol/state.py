"""What a conversation holds so far, as one typed value: the question, the texts the tool
responses gave to read, the agent's thoughts, the queries it searched and the result pages it
has not opened yet; for Heavy mode's synthesis turn, the runs' answers.

The agent loop keeps one :class:`TurnState` per run, updated as each turn and tool response
arrives, and hands it to the model with every grammar-constrained call, so that a backend
building a grammar per turn never reads the message text again. :meth:`TurnState.of` derives the
same value from a message list (a conversation the loop did not build: a test, a saved run,
the conversation after a compaction).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from drvenus.protocol.parse import parse_turn
from drvenus.protocol.render import (
    DRVENUS_TEXTS,
    VISIT_SEPARATOR,
    TextsLike,
    notice_kind,
    parse_search_body,
    unwrap_tool_response,
)
from drvenus.protocol.tools import SEARCH, VISIT, ToolCall

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
# The fixed lines of a visit frame (render_visit): not text the page gave to read.
_VISIT_HEAD = re.compile(
    r"^The useful information in \S+ for user goal .*? as follows: *$|"
    r"^(?:Evidence in page|Summary): *$",
    re.MULTILINE,
)


def _search_text(body: str) -> str | None:
    """Titles and snippets of a search response, one per line (None: not a search response)."""
    data = parse_search_body(body)
    if data is None:
        return None
    hits = [hit for entry in data for hit in entry["web_page_info_list"]]
    return "\n".join(hit[k] for hit in hits for k in ("title", "snippet"))


def tool_response_text(body: str) -> str:
    """The readable text of one tool response body: search titles and snippets (not URLs), a
    visit frame's page text (not its fixed lines)."""
    searched = _search_text(body)
    if searched is not None:
        return searched
    return _VISIT_HEAD.sub("", body.replace(VISIT_SEPARATOR, "\n"))


def _items(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class RunAnswer:
    """One research run's answer and the texts that run read (Heavy mode's synthesis)."""

    answer: str
    read: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnState:
    """A conversation so far (see the module doc). ``texts``: in order, the readable text of
    each tool response that is not a fixed notice (``"read"``) and the agent's think blocks
    (``"thought"``); ``queries``: the queries searched, distinct, in order; ``found`` /
    ``visited``: the result URLs read and the pages opened; ``answers``: the runs' answers a
    synthesis turn chooses among (empty in an ordinary run)."""

    question: str = ""
    texts: tuple[tuple[str, str], ...] = ()
    queries: tuple[str, ...] = ()
    found: tuple[str, ...] = ()
    visited: frozenset[str] = frozenset()
    answers: tuple[RunAnswer, ...] = ()

    @property
    def read(self) -> tuple[str, ...]:
        """The texts the tool responses gave to read."""
        return tuple(text for kind, text in self.texts if kind == "read")

    def sources(self, *, thoughts: bool = False) -> tuple[str, ...]:
        """The texts read, and with ``thoughts`` the agent's thoughts too, in order."""
        return tuple(text for kind, text in self.texts if kind == "read" or thoughts)

    @property
    def results(self) -> tuple[str, ...]:
        """The URLs of the search results read so far that no visit has opened."""
        return tuple(u for u in self.found if u not in self.visited)

    def asked(self, question: str) -> TurnState:
        """With the question (the first one stays)."""
        return self if self.question else replace(self, question=question)

    def after_turn(self, content: str, call: ToolCall | None) -> TurnState:
        """With an assistant turn: its thoughts, and its tool call's queries or pages."""
        thoughts = tuple(("thought", t.strip()) for t in _THINK.findall(content))
        queries, visited = self.queries, self.visited
        if call is not None and call.name == SEARCH:
            queries = tuple(dict.fromkeys((*queries, *_items(call.arguments.get("query")))))
        elif call is not None and call.name == VISIT:
            visited = visited | set(_items(call.arguments.get("url")))
        return replace(self, texts=self.texts + thoughts, queries=queries,
                       visited=visited)

    def after_response(self, body: str, texts: TextsLike = DRVENUS_TEXTS) -> TurnState:
        """With a tool response body: its text (unless one of the notices of ``texts``, the
        run's profile's) and its result URLs."""
        urls = [str(hit["url"]) for entry in parse_search_body(body) or []
                for hit in entry["web_page_info_list"]
                if str(hit["url"]).startswith(("http://", "https://"))]
        read = self.texts if notice_kind(body, texts) is not None else \
            (*self.texts, ("read", tool_response_text(body)))
        return replace(self, texts=read, found=tuple(dict.fromkeys((*self.found, *urls))))

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, str]], texts: TextsLike = DRVENUS_TEXTS
           ) -> TurnState:
        """The state of a message list (its notices in ``texts``' words, the run's profile's):
        the question is its first user message that is not a tool response."""
        state = cls()
        for m in messages:
            role, content = m.get("role"), m.get("content") or ""
            if role == "user":
                body = unwrap_tool_response(content)
                state = state.asked(content) if body is None else \
                    state.after_response(body, texts)
            elif role == "assistant":
                state = state.after_turn(content, parse_turn(content).tool_call)
        return state


__all__ = ["RunAnswer", "TurnState", "tool_response_text"]
