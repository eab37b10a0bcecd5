"""A scripted teacher that answers questions with the real tools and writes protocol turns.

It drives the same :class:`~drvenus.tools.toolbox.Toolbox` the agent uses (so every tool
response is byte-for-byte what the agent would receive), renders every turn with
:mod:`drvenus.protocol`, and follows one policy: search the subject (the entity the question
names), take the answer from a gold result's snippet when it is there, else ``visit`` the gold
page; for a two-hop question, find the bridge entity the same way, then search it. Thoughts are
short plain text (no ``<``, at most 240 characters, as the embedded grammar allows) that say what
was found where. When the answer cannot be found, the question is dropped with a reason, never
answered from the record.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drvenus import protocol
from drvenus.protocol import ToolCall
from drvenus.recipe.facts import NEED, find_span, sentences
from drvenus.recipe.pairs import COMPARISON, YES_NO
from drvenus.recipe.pairs import amount as _amount
from drvenus.recipe.questions import MAX_QUERY_CHARS, Question
from drvenus.small.spans import QUESTION_QUERY_CHARS, question_query

MAX_THINK_CHARS = 240
MAX_GOAL_CHARS = 60
MAX_URL_CHARS = 60  # after the scheme: the embedded grammar's string bound
DESCRIBED_RANK = 2

DROP_REASONS = (
    "gold_not_in_results", "answer_not_found", "bridge_not_found", "too_long", "unusable_url",
    "described_subject_not_first",
)


@dataclass
class Trajectory:
    """One solved question: the protocol messages and what the teacher used."""

    question: Question
    messages: list[dict[str, str]]
    answer: str
    calls: list[ToolCall] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # titles the bridge / answer came from
    tokens: int | None = None

    @property
    def visits(self) -> int:
        return sum(c.name == protocol.VISIT for c in self.calls)

    def raw_row(self) -> dict[str, Any]:
        """A row ``drvenus data clean`` reads (clean layout: question, messages, gt) with the
        record's fields alongside (ignored by the pipeline)."""
        q = self.question
        return {
            "question": q.question, "messages": self.messages, "gt": q.ground_truth,
            "id": q.id, "kind": q.kind, "hops": q.hops, "source": q.source, "split": q.split,
            "gold_titles": q.gold_titles, "tool_calls": len(self.calls), "visits": self.visits,
            "tokens": self.tokens,
        }


def clean_text(text: str) -> str:
    """One line of plain text (the embedded grammar's thoughts admit no ``<``)."""
    return " ".join(text.replace("<", " ").replace(">", " ").split())


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 3, 1)].rsplit(" ", 1)[0]
    return cut + "..."


def quote_around(text: str, span: str, limit: int) -> str:
    """The sentence of ``text`` that holds ``span``, clipped to ``limit`` around it."""
    parts = [clean_text(s) for s in sentences(text)]
    text = clean_text(text)
    sentence = next((s for s in parts if find_span(s, span)), text)
    if len(sentence) <= limit:
        return sentence
    pos = sentence.lower().find(span.lower())
    start = max(0, pos - (limit - len(span)) // 2)
    piece = sentence[start : start + limit - 6]
    if start > 0:
        piece = "..." + piece.split(" ", 1)[-1]
    return piece.rsplit(" ", 1)[0] + "..." if start + limit - 6 < len(sentence) else piece


class Teacher:
    """Solves :class:`Question` records with ``toolbox`` (``search`` + ``visit``).

    ``urls``: title -> URL of the corpus; ``system_prompt``: the agent's; ``count_tokens``:
    messages -> tokens (None: not counted); ``max_tokens``: longer trajectories are dropped.
    """

    def __init__(
        self,
        toolbox: Any,
        urls: Mapping[str, str],
        system_prompt: str,
        *,
        count_tokens: Callable[[Sequence[Mapping[str, str]]], int] | None = None,
        max_tokens: int | None = None,
        seed: int = 0,
    ) -> None:
        self.toolbox = toolbox
        self.urls = urls
        self.system_prompt = system_prompt
        self.count_tokens = count_tokens
        self.max_tokens = max_tokens
        self.seed = seed

    # -- one episode -----------------------------------------------------------------------

    async def solve(self, q: Question) -> tuple[Trajectory | None, str | None]:
        """``(trajectory, None)`` or ``(None, drop reason)``."""
        ep = _Episode(self, q, random.Random(f"{self.seed}:{q.id}"))
        try:
            if q.source in (COMPARISON, YES_NO):
                found = await ep.pair()
            elif q.hops == 2:
                found = await ep.two_hop()
            else:
                found = await ep.single_hop()
        except _Drop as drop:
            return None, drop.reason
        traj = Trajectory(q, ep.messages, found, ep.calls, ep.sources)
        if self.count_tokens is not None:
            traj.tokens = self.count_tokens(ep.messages)
            if self.max_tokens is not None and traj.tokens > self.max_tokens:
                return None, "too_long"
        return traj, None


class _Drop(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Hit:
    title: str
    url: str
    snippet: str


class _Episode:
    def __init__(self, teacher: Teacher, q: Question, rng: random.Random) -> None:
        self.t, self.q, self.rng = teacher, q, rng
        self.messages = protocol.initial_messages(q.question, teacher.system_prompt)
        self.calls: list[ToolCall] = []
        self.sources: list[str] = []
        self.answers = [q.answer, *q.aliases]

    # tool calls, rendered by the protocol, answered by the live toolbox
    async def call(self, thought: str, call: ToolCall) -> str:
        thought = clean_text(thought)
        if len(thought) > MAX_THINK_CHARS:
            thought = clip(thought, MAX_THINK_CHARS)
        self.messages.append({"role": "assistant",
                              "content": protocol.render_tool_call_turn(thought, call.to_json())})
        body = await self.t.toolbox.call(call)
        self.messages.append({"role": "user", "content": protocol.wrap_tool_response(body)})
        self.calls.append(call)
        return body

    def finish(self, thought: str, answer: str) -> str:
        thought = clip(clean_text(thought), MAX_THINK_CHARS)
        self.messages.append({"role": "assistant",
                              "content": protocol.render_answer_turn(thought, answer)})
        return answer

    async def search(self, thought: str, query: str, limit: int = MAX_QUERY_CHARS
                     ) -> list[_Hit]:
        query = question_query(query, limit)
        body = await self.call(thought, protocol.normalize_tool_call(
            {"name": protocol.SEARCH, "arguments": {"query": [query]}}))
        entries = protocol.parse_search_body(body) or []
        return [_Hit(h["title"], h["url"], h["snippet"])
                for e in entries for h in e["web_page_info_list"]]

    async def visit(self, thought: str, url: str, goal: str) -> str:
        if len(url.split("://", 1)[-1]) > MAX_URL_CHARS:
            raise _Drop("unusable_url")
        body = await self.call(thought, protocol.normalize_tool_call(
            {"name": protocol.VISIT, "arguments": {"url": [url], "goal": goal}}))
        frames = protocol.parse_visit_body(body) or []
        return "\n".join(f"{f['evidence'] or ''}\n{f['summary']}" for f in frames)

    def span_in(self, text: str, answers: Sequence[str]) -> str | None:
        for a in answers:
            span = find_span(text, a)
            if span is not None:
                return span
        return None

    def gold_hit(self, hits: list[_Hit], title: str) -> _Hit | None:
        url = self.t.urls.get(title)
        return next((h for h in hits if h.url == url), None)

    def goal(self, need: str, subject: str) -> str:
        text = subject if need == "answer" else f"{need} of {subject}"
        if len(text) > MAX_GOAL_CHARS:
            text = clip(clean_text(self.q.question), MAX_GOAL_CHARS).removesuffix("...")
        return text

    # -- policies --------------------------------------------------------------------------

    async def locate(self, title: str, query: str, first_thought: str, retry_query: str,
                     limit: int = MAX_QUERY_CHARS) -> _Hit:
        """Search for the article ``title`` (``query`` of at most ``limit`` characters); one
        reformulated search if it is not listed. A question that describes its subject must
        find it among the first ``DESCRIBED_RANK`` results (a description that fits many pages
        is no question)."""
        hits = await self.search(first_thought, query, limit)
        hit = self.gold_hit(hits, title)
        if hit is not None and self.q.source == "wiki-described" and \
                hits.index(hit) >= DESCRIBED_RANK:
            raise _Drop("described_subject_not_first")
        if hit is None and retry_query and retry_query != query:
            hits = await self.search(
                f"The results for {query} do not include the page I need. I will search "
                f"again with {retry_query}.", retry_query)
            hit = self.gold_hit(hits, title)
        if hit is None:
            raise _Drop("gold_not_in_results")
        return hit

    async def read(self, hit: _Hit, title: str, answers: Sequence[str], need: str,
                   subject: str) -> tuple[str, str, str]:
        """The answer span for ``answers`` from ``hit``'s snippet or, failing that, its page:
        ``(span, where, quote)``."""
        span = self.span_in(hit.snippet, answers)
        if span is not None:
            return span, "snippet", hit.snippet
        thought = self.rng.choice((
            f"The result {title} is the page I need, but its snippet does not give the {need}."
            " I will open it.",
            f"{title} looks right, but the snippet lacks the {need} of {subject}. Let me visit "
            "the page.",
            f"The snippet of {title} does not mention the {need}. I will read the page {hit.url}.",
        ))
        text = await self.visit(thought, hit.url, self.goal(need, subject))
        span = self.span_in(text, answers)
        if span is None:
            raise _Drop("answer_not_found")
        return span, "page", text

    def found_thought(self, title: str, where: str, quote: str, span: str, tail: str) -> str:
        lead = self.rng.choice(
            (f"The {where} of {title} says: ", f"{title} ({where}) states: ",
             f"From the {where} of {title}: ")
        )
        room = MAX_THINK_CHARS - len(lead) - len(tail) - 4
        text = quote_around(quote, span, max(room, 40)).rstrip(". ")
        return f'{lead}"{text}". {tail}'

    async def single_hop(self) -> str:
        q = self.q
        title = q.gold_titles[0]
        if q.source.startswith("deepresearcher"):
            return await self.distant()
        need = NEED.get(q.kind, "answer")
        subject = q.subject or title
        first = self.rng.choice((
            f"I need the {need} of {subject}. I will search the question's key words.",
            f"The question is about {subject}. Let me search its terms to find the {need}.",
            f"To answer, I should find the page on {subject} and read the {need}.",
        ))
        hit = await self.locate(title, question_query(q.question), first, f"{subject} {need}",
                                QUESTION_QUERY_CHARS)
        span, where, text = await self.read(hit, title, self.answers, need, subject)
        self.sources.append(title)
        tail = self.rng.choice((f"So the answer is {span}.", f"The answer is {span}."))
        return self.finish(self.found_thought(title, where, text, span, tail), span)

    async def distant(self) -> str:
        q = self.q
        query = question_query(q.question)
        first = self.rng.choice((
            "I will search for the key terms of the question.",
            "Let me search the question's words and read the results.",
            "First I will search the question's main terms.",
        ))
        hits = await self.search(first, query, QUESTION_QUERY_CHARS)
        gold = [h for h in hits if h.title in q.gold_titles]
        if not gold:
            raise _Drop("gold_not_in_results")
        for hit in gold:
            span = self.span_in(hit.snippet, self.answers)
            if span is not None:
                self.sources.append(hit.title)
                tail = f"So the answer is {span}."
                return self.finish(self.found_thought(hit.title, "snippet", hit.snippet, span,
                                                      tail), span)
        hit = gold[0]
        span, where, text = await self.read(hit, hit.title, self.answers, "answer", query)
        self.sources.append(hit.title)
        return self.finish(self.found_thought(hit.title, where, text, span,
                                              f"So the answer is {span}."), span)

    async def two_hop(self) -> str:
        q = self.q
        title_a, title_b = q.gold_titles
        subject = q.subject or title_a
        bridge_kind = str(q.meta.get("bridge_kind", ""))
        need_a = NEED.get(bridge_kind, "related entity")
        need_b = NEED.get(q.kind.split(">")[-1], "answer")
        first = self.rng.choice((
            f"This needs two steps. First I need the {need_a} of {subject}. I will search the "
            "question's key words.",
            f"I must first find the {need_a} of {subject}, then the {need_b} of that one. "
            "Searching the question's terms.",
        ))
        hit_a = await self.locate(title_a, question_query(q.question), first,
                                  f"{subject} {need_a}", QUESTION_QUERY_CHARS)
        try:
            bridge, where, text = await self.read(hit_a, title_a, [title_b], need_a, subject)
        except _Drop:
            raise _Drop("bridge_not_found") from None
        self.sources.append(title_a)
        tail = f"So the {need_a} is {bridge}. Now I will search for {title_b}."
        thought = self.found_thought(title_a, where, text, bridge, tail)
        hit_b = await self.locate(title_b, title_b, thought, f"{title_b} {need_b}")
        span, where, text = await self.read(hit_b, title_b, self.answers, need_b, title_b)
        self.sources.append(title_b)
        tail = f"The {need_b} of {title_b} is {span}, so the answer is {span}."
        return self.finish(self.found_thought(title_b, where, text, span, tail), span)

    async def pair(self) -> str:
        """Both subjects' facts (from the first search's results when they are listed, else a
        search of the subject's name), then the comparison or the yes/no drawn from them."""
        q = self.q
        sides = q.meta["pair"]
        need = NEED.get(sides[0]["kind"], "answer")
        a, b = (s["mention"] for s in sides)
        first = self.rng.choice((
            f"I need the {need} of {a} and the {need} of {b}. I will search the question's "
            "key words.",
            f"To answer I must compare {a} and {b}: first their {need}. Searching the "
            "question's terms.",
        ))
        hits = await self.search(first, question_query(q.question), QUESTION_QUERY_CHARS)
        notes: list[str] = []
        values = []
        for side in sides:
            title, mention = side["title"], side["mention"]
            hit = self.gold_hit(hits, title)
            if hit is None:
                hits = await self.search(
                    " ".join([*notes, f"The results do not list {mention}. I will search for "
                              f"{mention}."]), mention)
                hit = self.gold_hit(hits, title)
            if hit is None:
                raise _Drop("gold_not_in_results")
            span, where, _text = await self.read(hit, title, [side["value"]], need, mention)
            self.sources.append(title)
            values.append(span)
            notes.append(f"The {where} of {title} gives {mention}'s {need}: {span}.")
        answer = q.answer
        if q.source == COMPARISON:
            win = 0 if sides[0]["mention"] == answer else 1
            lower = _number(values[win]) < _number(values[1 - win])
            word = ("earlier" if lower else "later") if need in ("birth year", "year of death",
                                                                  "year") else \
                ("smaller" if lower else "larger")
            verdict = (f"{values[win]} is {word} than {values[1 - win]}, so the answer is "
                       f"{answer}.")
        elif answer == "yes":
            verdict = f"Both are {values[0]}, so the answer is yes."
        else:
            verdict = f"{values[0]} and {values[1]} differ, so the answer is no."
        return self.finish(" ".join([*notes, verdict]), answer)


def _number(text: str) -> float:
    """The leading amount of a fact value ("2.1 million" -> 2100000.0)."""
    value = _amount(text)
    return value if value is not None else float("nan")


def tool_response_bodies(messages: Sequence[Mapping[str, str]]) -> list[tuple[ToolCall, str]]:
    """``(call, response message)`` pairs of a trajectory, calls parsed back with the
    protocol (for checking a trajectory against the live tools)."""
    pairs = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i + 1 >= len(messages):
            continue
        parsed = protocol.parse_turn(m["content"])
        if parsed.tool_call is not None:
            pairs.append((parsed.tool_call, messages[i + 1]["content"]))
    return pairs


_WS = re.compile(r"\s+")

__all__ = ["DROP_REASONS", "Teacher", "Trajectory", "clean_text", "quote_around",
           "tool_response_bodies"]
