"""The levers of the small agent: every choice of how a tiny model's turns are bounded and how
it answers from what it read, as one typed, frozen value.

:class:`Levers` defaults leave everything off (the plain protocol grammar, as a real model
gets it under ``--constrained``); :data:`EMBEDDED_LEVERS` is the embedded preset's. A lever
name that does not exist fails where the levers are made (:meth:`Levers.of`,
:meth:`Levers.but`), never silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

from drvenus.small.reader import READERS, ReaderName
from drvenus.small.rerank import RERANK_TOP

DEFAULT_SPAN_WORDS = 8  # words of a span answer when span_words is not set
SecondHop = Literal["off", "guided", "always"]
SECOND_HOPS: tuple[str, ...] = get_args(SecondHop)


@dataclass(frozen=True)
class Levers:
    """How the small agent's turns are bounded (characters; None: unbounded) and how it answers.

    Bounds: ``think_chars`` (a thought), ``think_plain`` (a thought without ``<``, so its bound
    is a token bound), ``call_chars`` (a query, a goal, a URL), ``call_items`` (queries or URLs
    in one call), ``queries_plain`` (queries are words as a person types them),
    ``queries_capital`` (a query starts like a title), ``forced_think_chars`` (the thought of a
    turn that can only be an answer, or only a search the grammar words: the first search of
    ``first_search_question`` and the second hop's; 0 in the preset: a turn the grammar fixes
    whole is written without the model), ``answer_plain`` (an answer is one line of plain text),
    ``free_answer_chars`` (a free answer's length).

    Answers: ``span_answers``: an answer is a span of what was read
    (:mod:`drvenus.small.spans`), of at most ``span_words`` words; ``span_thinking``: of the
    agent's thoughts too; ``span_new_words``: without the question's words; ``span_news``: with
    at least one word that is not the question's; ``span_shaped``: of the kind the question asks
    for (a number, a time, a name, yes or no, one of its choices); ``span_focus`` (K): from the
    K sentences that match the question most; ``span_rank`` (K): for a plain "what" question,
    one of the K spans the reader ranks best, whole; ``span_reader``: which reader ranks them
    (:func:`drvenus.small.reader.span_reader`); ``span_rerank`` (K): a small language model
    reorders the reader's K best spans (:mod:`drvenus.small.rerank`); ``span_generate``: the
    reranker's own answer is among them, when the texts read hold it
    (:func:`drvenus.small.rerank.grounded`); ``span_titles``: the titles of the results read
    are scored beside them (:func:`drvenus.small.rerank.result_titles`); ``span_yes_no``: the
    reranker answers a yes/no question
    (:meth:`drvenus.small.rerank.RerankedReader.yes_or_no`; needs ``span_rerank``);
    ``choice_compare``: a question that asks which of two things came first (or last), or has
    more (or less) of an amount the texts state, is answered by the years or amounts their
    passages give (:func:`drvenus.small.compare.choose`).

    Calls: ``first_search_question``: the first search asks the question's own content words;
    ``bridge_search``: "always" or "guided" (when the reranker doubts the first search's best
    span; never without the reranker), the second search asks for the bridge the first found
    (the reader's best name, with the question's words its passage lacks), and the answer
    follows it, chosen among both searches' best spans
    (:func:`drvenus.small.grammar.second_search`);
    ``calls_grounded``: a visit opens a result read so far and a search never repeats a query.
    """

    think_chars: int | None = None
    think_plain: bool = False
    call_chars: int = 500
    call_items: int = 5
    queries_plain: bool = False
    queries_capital: bool = False
    forced_think_chars: int | None = None
    answer_plain: bool = False
    free_answer_chars: int | None = None
    span_answers: bool = False
    span_words: int | None = None
    span_thinking: bool = False
    span_new_words: bool = False
    span_news: bool = False
    span_shaped: bool = False
    span_focus: int = 0
    span_rank: int = 0
    span_reader: ReaderName = "linear"
    span_rerank: int = 0
    span_generate: bool = False
    span_titles: bool = False
    span_yes_no: bool = False
    choice_compare: bool = False
    first_search_question: bool = False
    bridge_search: SecondHop = "off"
    calls_grounded: bool = False

    def __post_init__(self) -> None:
        if self.bridge_search not in SECOND_HOPS:
            raise ValueError(f"unknown bridge_search {self.bridge_search!r}; choose from "
                             + ", ".join(SECOND_HOPS))
        if self.span_reader not in READERS:
            raise ValueError(f"unknown span reader {self.span_reader!r}; choose from "
                             + ", ".join(READERS))
        if self.call_chars < 1 or self.call_items < 1:
            raise ValueError("call_chars and call_items must be at least 1")
        if self.span_words is not None and (self.span_words < 1 or not self.span_answers):
            raise ValueError("span_words must be at least 1, and needs span_answers")
        if self.span_focus < 0 or self.span_rank < 0 or self.span_rerank < 0:
            raise ValueError("span_focus, span_rank and span_rerank must be 0 (off) or more")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every lever's name."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, values: Mapping[str, Any], base: Levers | None = None) -> Levers:
        """``base`` (default: every lever off) with ``values`` on top; ValueError for a name
        that is no lever."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise ValueError(f"unknown lever{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; the levers are "
                             + ", ".join(cls.names()))
        return replace(base or cls(), **values)

    def but(self, **changes: Any) -> Levers:
        """These levers with ``changes`` (checked like :meth:`of`)."""
        return Levers.of(changes, self)

    @property
    def max_span_words(self) -> int:
        return self.span_words or DEFAULT_SPAN_WORDS

    def bounds(self) -> dict[str, Any]:
        """The turn bounds, as :class:`~drvenus.protocol.grammar.GrammarOptions` fields."""
        return {
            "max_think_chars": self.think_chars,
            "plain_think": self.think_plain,
            "max_string_chars": self.call_chars,
            "max_list_items": self.call_items,
            "plain_queries": self.queries_plain,
            "capital_queries": self.queries_capital,
            "answer_think_chars": self.forced_think_chars,
            "plain_answer": self.answer_plain,
            "max_answer_chars": self.free_answer_chars,
        }


# The embedded preset. Grammar bounds: a short plain-text thought (no "<", so its bound is a
# token bound), a first search that asks the question's own content words (what finds the
# page: the model's own first queries were a title or a fragment, "V", "1000"), later queries
# plain and starting like a title, and a grounded answer: a span of at most eight words of what
# the agent read (search titles and snippets, visited pages; never its own thoughts:
# "Understood" is no answer), with a word the question does not hold, of the kind the question
# asks for (a number for "how many", a time for "when", a name for "who" and "where", yes or
# no, one of the choices it names). The span grammar is built per turn from the turn's state;
# its closed vocabulary never glues words together or cuts one. A whole turn stays inside the
# preset's max_tokens (448) even at its worst (every character a token: think 240 + a first
# query of 120 + the fixed JSON and tags), so it is never cut off before its closing tag.
EMBEDDED_LEVERS = Levers(
    think_chars=240,
    think_plain=True,
    call_chars=60,
    call_items=1,
    queries_plain=True,
    queries_capital=True,
    forced_think_chars=0,
    answer_plain=True,  # when nothing has been read yet
    span_answers=True,
    span_news=True,  # not the question's words alone ("Dracula" for Dracula)
    span_shaped=True,  # of the kind asked: a number, a time, a name, yes/no
    span_focus=3,  # from the 3 sentences read that match the question most
    span_rank=1,  # a plain "what" question: the span the reader ranks best
    first_search_question=True,  # the first search asks the question's own words
    span_words=8,
    # the neural reader ranks the spans (issue 41); every span question is answered with its
    # best span, the linear reader's agreement counted in (drvenus.small.neural)
    span_reader="neural",
    # Gemma 3 270M chooses among the reader's five best spans (issue 41, drvenus.small.rerank)
    span_rerank=RERANK_TOP,
    # and its own answer, where what was read holds it (issue 41)
    span_generate=True,
    # span_titles stays off: HotpotQA's answer is the name of one of its paragraphs for a
    # quarter of its questions, and with the results' titles the first search's candidates
    # hold the answer for 25 of HotpotQA dev rows 101-200 against 16; but the reranker then
    # picks a title as readily when it is wrong ("Commonwealth Games held in Delhi"), and the
    # whole agent stayed at EM 17 (F1 0.245 against 0.235)
    # span_yes_no stays off: the reranker's yes/no was right more often than the embedded
    # model's on HotpotQA dev (30 against 18 of 47) but not on natural dev (14 of 27, as many
    # as always "yes"), and on the natural test sample it was worse (4 against 7 of 13)
    # a second search for the bridge the first found when the reranker doubts the first
    # search's best span, the answer chosen among both searches' best spans (issue 41)
    bridge_search="guided",
    # a question of which of two things came first (or has more) is answered by the years (or
    # amounts) read, and searches again for a choice it read none for (drvenus.small.compare)
    choice_compare=True,
)

__all__ = ["DEFAULT_SPAN_WORDS", "EMBEDDED_LEVERS", "SECOND_HOPS", "Levers", "SecondHop"]
