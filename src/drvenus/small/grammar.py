"""The small agent's turn grammars: the protocol grammar (:mod:`drvenus.protocol.grammar`) with
the levers' bounds, and the answering policy, built per turn from the turn's state.

The agent loop hands the model a :class:`~drvenus.protocol.state.TurnState` with every
constrained call; the model's :class:`GrammarBuilder` (made by :mod:`drvenus.stack` for the
embedded preset) turns it into GBNF: the first search asks the question's own words, a grounded
answer is a span of what was read (of the kind the question asks for, from its best sentences,
or the reader's best span), and Heavy mode's synthesis turn answers with one of the runs'
answers (:mod:`drvenus.small.heavy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drvenus.protocol.grammar import protocol_grammar, turn_kinds
from drvenus.protocol.state import TurnState
from drvenus.small.heavy import ranked_answers
from drvenus.small.levers import Levers
from drvenus.small.reader import SpanReader, span_reader
from drvenus.small.rerank import RerankedReader, span_reranker
from drvenus.small.spans import (
    PLAIN_SHAPE,
    answer_shape,
    focus_sentences,
    question_query,
    question_words,
    span_sources,
    spans_of,
    weak_word,
)


def levers_reader(levers: Levers) -> SpanReader:
    """The levers' reader (``span_reader``), its best ``span_rerank`` spans reordered by the
    reranker when that lever is on."""
    reader = span_reader(levers.span_reader)
    if not levers.span_rerank:
        return reader
    return RerankedReader(reader, span_reranker(), levers.span_rerank)


def answer_options(texts: Sequence[str], question: str, levers: Levers) -> dict[str, Any]:
    """The answer a span grammar admits, as :class:`~drvenus.protocol.grammar.GrammarOptions`
    fields: one of the choices a question names (or yes / no); for a plain "what" question
    (no answer shape), or any span question when the reader is the neural one, one of the
    ``span_rank`` spans the reader ranks best, whole; else a span
    of ``texts`` without the question's words (``span_new_words``), of the shape asked
    (``span_shaped``), from the ``span_focus`` sentences that match the question most when one
    of them holds a span of that shape, else of anything read of that shape, else of anything
    read; with ``span_news``, holding a word the question does not."""
    bound = levers.max_span_words
    shape = answer_shape(question) if levers.span_shaped else PLAIN_SHAPE
    if shape.choices or shape.yes_no:
        return {"answer_choices": shape.choices or ("yes", "no")}
    neural = levers.span_reader == "neural"
    if levers.span_rank and (neural or answer_shape(question).plain):
        reader = levers_reader(levers)
        best = reader.rank(question, texts, levers.span_rank, max_words=bound)
        if best:
            return {"answer_choices": tuple(b.text for b in best)}
    exclude = question_words(question) if levers.span_new_words else frozenset()

    def shaped(sources: Sequence[str]) -> list[tuple[str, ...]]:
        return [shape.trim(sp) for sp in spans_of(sources, bound, exclude)
                if shape.first(sp[0])]

    k = levers.span_focus
    spans = (k and shaped(focus_sentences(texts, question, k))) or shaped(texts)
    spans = spans or spans_of(texts, bound, exclude)
    options: dict[str, Any] = {"answer_spans": tuple(spans)}
    if levers.span_news and question:
        old = question_words(question)
        options["answer_new_words"] = frozenset(
            w for span in spans for w in span if w.lower() not in old and not weak_word(w))
    return options


def turn_grammar(kind: str, state: TurnState, levers: Levers,
                 prefilled_think: bool = False) -> str:
    """The GBNF grammar of a turn of ``kind`` ("any", "tool_call", "search" or "answer") for a
    conversation in ``state``, under ``levers``."""
    allow_call, allow_answer, tools = turn_kinds(kind)
    options = levers.bounds()
    if levers.first_search_question and allow_call and "search" in tools and not state.queries:
        query = question_query(state.question)
        if query:  # the first search asks the question's own words
            options["search_query"] = query
    if levers.calls_grounded and allow_call:
        options["used_queries"] = state.queries
        if state.results:
            options["visit_urls"] = state.results
        else:  # nothing to open yet: no visit
            tools = tuple(t for t in tools if t != "visit")
            if not tools:
                allow_call, allow_answer = False, True
    if allow_answer and state.answers and not allow_call:  # Heavy mode's synthesis turn
        options["answer_choices"] = ranked_answers(state, levers)
    elif levers.span_answers and allow_answer:
        texts = span_sources(state, thinking=levers.span_thinking)
        options.update(answer_options(texts, state.question, levers))
    return protocol_grammar(prefilled_think, allow_tool_call=allow_call,
                            allow_answer=allow_answer, tools=tools or ("search",), **options)


class GrammarBuilder:
    """The grammar of each constrained turn under fixed levers: what a model backend calls
    (``builder(kind, prefilled_think, state)``)."""

    def __init__(self, levers: Levers) -> None:
        self.levers = levers

    def __call__(self, kind: str, prefilled_think: bool, state: TurnState) -> str:
        return turn_grammar(kind, state, self.levers, prefilled_think)

    def __repr__(self) -> str:
        return f"GrammarBuilder({self.levers!r})"


def grammar_for_kind(kind: str, prefilled_think: bool = False,
                     messages: Sequence[Mapping[str, str]] = (),
                     levers: Levers | None = None, **changes: Any) -> str:
    """:func:`turn_grammar` for a message list (its :meth:`TurnState.of`), under ``levers``
    (default: every lever off) with ``changes`` on top: for tests, benchmarks and recipes that
    hold a conversation rather than a run."""
    chosen = Levers.of(changes, levers) if changes or levers is None else levers
    return turn_grammar(kind, TurnState.of(messages), chosen, prefilled_think)


__all__ = ["GrammarBuilder", "answer_options", "grammar_for_kind", "levers_reader",
           "turn_grammar"]
