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
from functools import lru_cache
from typing import Any

from drvenus.protocol.grammar import protocol_grammar, turn_kinds
from drvenus.protocol.state import TurnState
from drvenus.small.compare import choose, missing_choice
from drvenus.small.heavy import ranked_answers
from drvenus.small.levers import Levers
from drvenus.small.reader import ReaderName, SpanReader, span_reader
from drvenus.small.rerank import RerankedReader, SpanReranker, passage_of, span_reranker
from drvenus.small.spans import (
    PLAIN_SHAPE,
    AnswerShape,
    answer_shape,
    bridge_query,
    focus_sentences,
    full_name,
    question_query,
    question_words,
    span_sources,
    spans_of,
    weak_word,
    with_unit,
)


def levers_reader(levers: Levers) -> SpanReader:
    """The levers' reader (``span_reader``), its best ``span_rerank`` spans reordered by the
    reranker when that lever is on (with its own answer when ``span_generate``, the results'
    titles when ``span_titles``): one
    reranked reader per setting, so that its kept
    rankings serve the turns that follow (the first search is reranked once a run)."""
    if not levers.span_rerank:
        return span_reader(levers.span_reader)
    return _reranked(levers.span_reader, span_reranker(), levers.span_rerank,
                     levers.span_generate, levers.span_titles)


@lru_cache(maxsize=8)
def _reranked(name: ReaderName, reranker: SpanReranker, top: int,
              generate: bool, titles: bool) -> RerankedReader:
    return RerankedReader(span_reader(name), reranker, top, generate, titles)


BRIDGE_TOP = 5  # the spans a bridge is chosen among
# "guided": a second search when the reranker's log-probability of the first search's best
# span is below this (chosen on natural dev as -16 when answers were scored by a grammar's
# greedy spelling: single-hop 70 of 159 as with one search, two-hop 9 of 57 against 5; a
# second search for 29% of single-hop questions and 46% of two-hop ones; scored as the
# tokenizer's tokens, the same share, 40% of HotpotQA dev rows 101-200, falls below -7.5)
SECOND_HOP_BELOW = -7.5
_NAME = AnswerShape(name=True)


def second_search(state: TurnState, levers: Levers) -> str | None:
    """The second search of ``bridge_search``: the bridge the first search found, the best name
    of two words or more among the :data:`BRIDGE_TOP` spans the levers' reader ranks best in
    what was read (else its best name, else its best span), with the question's content words that
    neither the span nor its passage holds (:func:`~drvenus.small.spans.bridge_query`); None
    when nothing was read, for a yes/no or a which-of question (with ``choice_compare``, a
    question of which came first, or has more, searches for the choice it read no year or
    amount for: :func:`~drvenus.small.compare.missing_choice`), or, ``bridge_search`` "guided",
    when the reranker's log-probability of the best span is at least
    :data:`SECOND_HOP_BELOW` (without the reranker, "guided" never searches again)."""
    texts = span_sources(state)
    if not state.read or not state.question:
        return None
    shape = answer_shape(state.question)
    if shape.choices and levers.choice_compare:  # the choice no value was read for, if any
        from drvenus.small.neural import passages

        missing = missing_choice(state.question, shape.choices,
                                 [p for _, _, p in passages(texts)])
        return missing[:levers.call_chars] if missing else None
    if shape.choices or shape.yes_no:  # the answer is one of the words the question holds
        return None
    reader = levers_reader(levers)
    if isinstance(reader, RerankedReader):
        ranked = reader.ranked(state.question, texts, BRIDGE_TOP, levers.max_span_words)
        best = [span for span, _ in ranked]
        sure = reader.doubt(ranked)
        if levers.bridge_search == "guided" and sure is not None and sure >= SECOND_HOP_BELOW:
            return None  # the reranker believes the first search's best span
    elif levers.bridge_search == "guided":
        return None  # no reranker, no doubt to follow
    else:
        best = list(reader.rank(state.question, texts, BRIDGE_TOP, levers.max_span_words))
    if not best:
        return None
    # the bridge is a thing with a name: the best name of two words or more among the best
    # spans ("Kate Millett", not "PhD"; "Adriana Trigiani", not the year or the number the
    # question asks for at its end), else the best name, else the best span
    names = [b for b in best if _NAME.takes(b.text)]
    bridge = next((b for b in names if len(b.text.split()) > 1), (names or best)[0])
    return bridge_query(state.question, bridge.text, passage_of(bridge, texts),
                        levers.call_chars) or None


def finished(span: str, texts: Sequence[str], question: str) -> str:
    """A span as the answer: a surname alone as the full name the texts give ("Joseph
    Conrad", :func:`~drvenus.small.spans.full_name`), a measure's number with its unit
    ("21–25 kg", :func:`~drvenus.small.spans.with_unit`)."""
    return with_unit(full_name(span, texts, question), texts, question)


def answer_options(texts: Sequence[str], question: str, levers: Levers,
                   first: int | None = None) -> dict[str, Any]:
    """The answer a span grammar admits, as :class:`~drvenus.protocol.grammar.GrammarOptions`
    fields: one of the choices a question names (with ``choice_compare``, the one the years or
    amounts read say came first, or has more: :func:`~drvenus.small.compare.choose`), or yes /
    no (with ``span_yes_no``, the reranker's:
    :meth:`~drvenus.small.rerank.RerankedReader.yes_or_no`); for a plain "what" question
    (no answer shape), or any span question when the reader is the neural one, one of the
    ``span_rank`` spans the reader ranks best, whole (:func:`finished`: a surname as the full
    name the texts write, a measure with its unit); after a second search
    (``first``: how many of ``texts`` the first search gave), the reranker's best of both
    searches' best spans; else a span of ``texts`` without the question's words
    (``span_new_words``), of the shape asked (``span_shaped``), from the ``span_focus``
    sentences that match the question most when one of them holds a span of that shape, else
    of anything read of that shape, else of anything read; with ``span_news``, holding a word
    the question does not."""
    bound = levers.max_span_words
    shape = answer_shape(question) if levers.span_shaped else PLAIN_SHAPE
    if shape.choices or shape.yes_no:
        if shape.choices and levers.choice_compare and texts:
            from drvenus.small.neural import passages

            chosen = choose(question, shape.choices, [p for _, _, p in passages(texts)])
            if chosen is not None:  # the years or amounts read say which
                return {"answer_choices": (chosen,)}
        if shape.yes_no and levers.span_yes_no and texts:
            reader = levers_reader(levers)
            said = reader.yes_or_no(question, texts) if isinstance(reader, RerankedReader) \
                else None
            if said is not None:  # the reranker says yes or no
                return {"answer_choices": (said,)}
        return {"answer_choices": shape.choices or ("yes", "no")}
    neural = levers.span_reader == "neural"
    if levers.span_rank and (neural or answer_shape(question).plain):
        reader = levers_reader(levers)
        if first is not None and isinstance(reader, RerankedReader):  # after a second search
            after = reader.after_hops(question, texts[:first], texts[first:], bound)
            if after:
                return {"answer_choices": tuple(dict.fromkeys(
                    finished(text, texts, question) for text, _ in after[:levers.span_rank]))}
        best = reader.rank(question, texts, levers.span_rank, max_words=bound)
        if best:
            return {"answer_choices": tuple(dict.fromkeys(
                finished(b.text, texts, question) for b in best))}
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
            if tools == ("search",) and not allow_answer:  # the turn is forced: no thought
                options["max_think_chars"] = levers.forced_think_chars
    hops = levers.bridge_search != "off" and not state.answers
    if hops and len(state.queries) == 1 and allow_call and "search" in tools:
        query = second_search(state, levers)
        if query:  # the second search asks for the bridge; nothing else, no thought
            options["search_query"] = query
            options["max_think_chars"] = levers.forced_think_chars
            tools, allow_answer = ("search",), False
    elif hops and len(state.queries) >= 2 and allow_answer:
        allow_call = False  # two searches made: the answer
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
        first = 1 if hops and len(state.queries) >= 2 and len(state.read) >= 2 else None
        options.update(answer_options(texts, state.question, levers, first))
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


__all__ = ["GrammarBuilder", "answer_options", "finished", "grammar_for_kind", "levers_reader",
           "second_search", "turn_grammar"]
