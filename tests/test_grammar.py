"""The protocol grammar: its language checked string by string with a pure-Python GBNF
recognizer (tests/gbnf.py), its syntax checked by llama.cpp's own parser, and sampled from with
the real embedded model."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.llm import SamplingParams
from drvenus.protocol import (
    STEP_LIMIT_MESSAGE,
    build_system_prompt,
    check_turn_format,
    initial_messages,
    parse_turn,
    wrap_tool_response,
)
from drvenus.protocol.grammar import grammar_for_kind, protocol_grammar
from drvenus.protocol.state import TurnState
from drvenus.small.grammar import GrammarBuilder, second_search
from drvenus.small.grammar import grammar_for_kind as small_grammar
from drvenus.small.levers import EMBEDDED_LEVERS
from drvenus.small.spans import (
    PLAIN_SHAPE,
    AnswerShape,
    answer_shape,
    bridge_query,
    clause_words,
    focus_sentences,
    full_name,
    span_sources,
    with_unit,
)
from gbnf import Grammar

SEARCH = (
    "<think>\nI should search.\n</think>\n<tool_call>\n"
    '{"name": "search", "arguments": {"query": ["Dracula author", "Bram Stoker"]}}\n</tool_call>'
)
VISIT = (
    "<think>\nOpen the page.\n</think>\n<tool_call>\n"
    '{"name": "visit", "arguments": {"url": ["https://en.wikipedia.org/wiki/Dracula"], '
    '"goal": "Who wrote it?"}}\n</tool_call>'
)

# the embedded preset's levers with the linear reader: these tests read the spans a grammar
# admits, which the linear reader's language lists (the neural one admits its best spans only)
LINEAR_LEVERS = EMBEDDED_LEVERS.but(span_reader="linear", span_rerank=0)
ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"


@cache
def _compiled(grammar: str) -> Grammar:
    return Grammar(grammar)


def accepts(grammar: str, text: str) -> bool:
    """Whether ``text`` is exactly one sentence of ``grammar``."""
    return _compiled(grammar).accepts(text)


def search_with(*queries: str) -> str:
    """SEARCH with other queries (each given as its JSON string body)."""
    return SEARCH.replace('"Dracula author", "Bram Stoker"', ", ".join(f'"{q}"' for q in queries))


# -- the recognizer itself ----------------------------------------------------------------------


def test_recognizer_literals_and_escapes():
    g = Grammar('root ::= "ab" "\\n\\t\\"\\\\" "c"\n')
    assert g.accepts('ab\n\t"\\c')
    assert not g.accepts("ab") and not g.accepts('ab\n\t"\\cc') and not g.accepts("")


def test_recognizer_classes_and_negation():
    g = Grammar("root ::= [a-c\\x30-\\x39\\]\\-] [^<\\n\\u00e9]\n")
    for ok in ("a!", "9x", "]y", "-z", "b\u00e8"):
        assert g.accepts(ok), ok
    for bad in ("d!", "a<", "a\n", "a\u00e9", "a", "a!!", "^!"):
        assert not g.accepts(bad), bad
    trailing_dash = Grammar("root ::= [a-]+\n")
    assert trailing_dash.accepts("a-a") and not trailing_dash.accepts("b")


def test_recognizer_repetition_bounds():
    exact, ranged, at_least = (Grammar(f'root ::= "x"{b}\n') for b in ("{3}", "{1,2}", "{2,}"))
    assert [exact.accepts("x" * n) for n in range(5)] == [False, False, False, True, False]
    assert [ranged.accepts("x" * n) for n in range(4)] == [False, True, True, False]
    assert [at_least.accepts("x" * n) for n in range(5)] == [False, False, True, True, True]
    ops = Grammar('root ::= "a"* "b"+ "c"?\n')
    assert all(ops.accepts(s) for s in ("b", "aabbb", "bc", "abc"))
    assert not any(ops.accepts(s) for s in ("", "a", "ac", "bcc", "ba"))
    # An item that may match nothing, bounded: "ab" "ab" fits in {0,2} only with empty items.
    empty = Grammar('root ::= ("ab" | "")?{0,2} "."\n')
    assert empty.accepts("abab.") and empty.accepts(".") and not empty.accepts("ababab.")


def test_recognizer_alternation_groups_and_rules():
    g = Grammar(
        "# a comment\n"
        'root ::= greeting ( ", " name )* "!"\n'
        'greeting ::= "hi" | "hello" |\n    "hey"\n'
        'name ::= [A-Z] [a-z]*  # trailing comment\n'
    )
    assert g.accepts("hi!") and g.accepts("hey, Ann, Bo!") and g.accepts("hello, X!")
    assert not g.accepts("hi, ann!") and not g.accepts("hi") and not g.accepts("yo!")
    # Ambiguity: the first alternative must not shadow a later one.
    assert Grammar('root ::= ("a" | "ab") "c"\n').accepts("abc")


def test_recognizer_rejects_bad_grammars():
    for bad in ('root ::= "a" undefined-rule\n', 'other ::= "a"\n', 'root ::= "a\n',
                'root ::= "a" )\n', 'root ::= "\\q"\n'):
        with pytest.raises(ValueError):
            Grammar(bad)
    with pytest.raises(RecursionError):
        Grammar('root ::= root "a" | "a"\n').accepts("aa")


# -- the language of the protocol grammar ------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        SEARCH,
        VISIT,
        ANSWER,
        "<think>\n\n</think>\n<answer>\n42\n</answer>",
        # free text may hold other tags and '<' that is not a protocol tag
        "<think>\n<summary>x</summary> and a < b, <thinking> too\n</think>\n<answer>\nx<y\n</answer>",
        # JSON string escapes and non-ASCII
        '<think>\nq\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": '
        '["\\"quoted\\" caf\\u00e9", "Ünïcode 東京 <b>"]}}\n</tool_call>',
        '<think>\nv\n</think>\n<tool_call>\n{"name": "visit", "arguments": {"url": '
        '["http://a.example/x?y=1", "https://b.example"], "goal": "line\\nbreak"}}\n</tool_call>',
    ],
)
def test_well_formed_turns_are_accepted(text):
    assert check_turn_format(text, "<answer>" in text)  # the protocol agrees they are valid
    assert parse_turn(text).ok
    assert accepts(protocol_grammar(), text)


@pytest.mark.parametrize(
    "text",
    [
        "<think>\na</think>b\n</think>\n<answer>\nx\n</answer>",  # </think> inside think
        "<think>\na <answer>x</answer>\n</think>\n<answer>\nx\n</answer>",
        "<think>\na <tool_call>\n</think>\n<answer>\nx\n</answer>",
        "<think>\n<think>\n</think>\n<answer>\nx\n</answer>",
        "<think>\nhm <tool_response>\n</think>\n<answer>\nx\n</answer>",
        "<think>\na\n</think>\n<answer>\n\n</answer>",  # empty answer
        "<think>\na\n</think>\n<answer>\n </answer>",
        "<think>\na\n</think>\n<answer>\nx </answer>\n</answer>",
        "<think>\na\n</think>\n<answer>\nx\n</answer> trailing",
        ANSWER.replace("<think>\n", "", 1),  # missing opening tag
        SEARCH.replace('"search"', '"python"'),  # unknown tool
        SEARCH.replace('["Dracula author", "Bram Stoker"]', "[]"),  # no query
        SEARCH.replace('"Dracula author"', '""'),  # empty query
        SEARCH.replace('"Dracula author"', '" x"'),  # query starting blank
        SEARCH.replace('"Dracula author"', '"a\nb"'),  # raw control character in a string
        SEARCH.replace('"Dracula author"', '"a\\qb"'),  # invalid escape
        SEARCH.replace('"Dracula author"', '"a </tool_call> b"'),  # tag inside JSON
        SEARCH.replace('"query"', '"queries"'),
        SEARCH + "\n<tool_call>",
        VISIT.replace("https://en.wikipedia.org", "en.wikipedia.org"),  # not a URL
        VISIT.replace('"Who wrote it?"', '""'),  # empty goal
        SEARCH.replace("</think>\n<tool_call>", "</think>\n<answer>"),
    ],
)
def test_malformed_turns_are_rejected(text):
    assert not accepts(protocol_grammar(), text)


def test_variants():
    prefilled = protocol_grammar(True)
    assert accepts(prefilled, SEARCH.removeprefix("<think>\n"))
    assert not accepts(prefilled, SEARCH)  # the template already wrote <think>
    answer_only = protocol_grammar(allow_tool_call=False)
    assert accepts(answer_only, ANSWER) and not accepts(answer_only, SEARCH)
    calls_only = protocol_grammar(allow_answer=False)
    assert accepts(calls_only, VISIT) and not accepts(calls_only, ANSWER)
    one_query = protocol_grammar(max_list_items=1)
    assert not accepts(one_query, SEARCH)  # two queries
    assert accepts(one_query, search_with("Dracula author"))
    search_only = protocol_grammar(tools=("search",))
    assert accepts(search_only, SEARCH) and not accepts(search_only, VISIT)


def test_grammar_kinds_narrow_the_turn():
    def kinds_accepting(text: str) -> list[str]:
        kinds = ("any", "tool_call", "search", "answer")
        return [k for k in kinds if accepts(grammar_for_kind(k), text)]

    assert kinds_accepting(SEARCH) == ["any", "tool_call", "search"]
    assert kinds_accepting(VISIT) == ["any", "tool_call"]
    assert kinds_accepting(ANSWER) == ["any", "answer"]
    prefilled = grammar_for_kind("answer", True)
    assert accepts(prefilled, ANSWER.removeprefix("<think>\n")) and not accepts(prefilled, ANSWER)
    # options that exclude the kind asked for: the kind wins
    assert accepts(grammar_for_kind("answer", allow_answer=False), ANSWER)
    with pytest.raises(ValueError):
        grammar_for_kind("python")


def test_length_bounds():
    bounded = protocol_grammar(max_think_chars=20, max_answer_chars=10, max_string_chars=8)
    think = lambda n: f"<think>\n{'x' * n}\n</think>\n<answer>\nok\n</answer>"  # noqa: E731
    assert accepts(bounded, think(20)) and not accepts(bounded, think(21))
    answer = lambda n: f"<think>\n\n</think>\n<answer>\n{'y' * n}\n</answer>"  # noqa: E731
    assert accepts(bounded, answer(10)) and not accepts(bounded, answer(11))
    query = lambda n: SEARCH.replace('"Dracula author"', '"' + "q" * n + '"')  # noqa: E731
    assert not accepts(bounded, SEARCH.replace("I should search.", ""))  # 'Dracula author'
    assert accepts(bounded, query(8).replace('"Bram Stoker"', '"b"').replace("I should search.", ""))
    assert not accepts(
        bounded, query(9).replace('"Bram Stoker"', '"b"').replace("I should search.", "")
    )
    # a '<' run along a protocol tag's spelling counts as one character: 21 chars, 3 items
    assert accepts(bounded, think(0).replace("\n\n", "\n" + "<thinkx" * 3 + "\n", 1))
    assert not accepts(bounded, think(0).replace("\n\n", "\n" + "<summary" * 3 + "\n", 1))
    # URLs: the scheme, then 1..max_string_chars characters
    visit = VISIT.replace("Who wrote it?", "g")
    url = lambda rest: visit.replace("https://en.wikipedia.org/wiki/Dracula", "http://" + rest)  # noqa: E731
    assert accepts(protocol_grammar(max_string_chars=8), url("a" * 8))
    assert not accepts(protocol_grammar(max_string_chars=8), url("a" * 9))
    assert not accepts(protocol_grammar(), url(""))


@pytest.mark.parametrize(
    "queries",
    [
        ("Dracula author", "Bram Stoker"),
        ("2026-11-30",),
        ("Dracula (1897)", "O'Brien, Flann. The Third Policeman"),
        ("Ünïcode 東京 café", "Москва"),
    ],
)
def test_plain_queries_accept_words(queries):
    text = search_with(*queries)
    assert accepts(protocol_grammar(plain_queries=True), text)
    assert accepts(protocol_grammar(), text)


@pytest.mark.parametrize(
    "query",
    [
        "the_book_2026-11-30",  # an identifier, not words
        "<b>",  # a tag-like query
        "Bram <b>Stoker</b>",
        "-x",  # must start with a letter or a digit
        " x",
        "",
        '\\"quoted\\"',  # JSON escapes are not words
        "caf\\u00e9",
        "a/b",
        "x:y",
        "Who wrote Dracula?",  # only letters, digits, space and ,.'()- after the first
    ],
)
def test_plain_queries_reject_non_words(query):
    plain = protocol_grammar(plain_queries=True)
    assert not accepts(plain, search_with(query))
    assert not accepts(plain, search_with("Dracula", query))  # in any position


def test_plain_queries_leave_the_rest_alone():
    plain = protocol_grammar(plain_queries=True, max_list_items=2, max_string_chars=12)
    visit = VISIT.replace("https://en.wikipedia.org/wiki/Dracula", "https://a.example")
    assert accepts(plain, visit.replace("Who wrote it?", "the_book <b>"))  # goal: any text
    assert accepts(plain, ANSWER) and accepts(plain, search_with("a" * 12))
    assert not accepts(plain, search_with("a" * 13))
    assert not accepts(plain, search_with("a", "b", "c"))  # max_list_items
    embedded = small_grammar("any", levers=LINEAR_LEVERS)
    assert accepts(embedded, search_with("Dracula author"))
    assert not accepts(embedded, SEARCH)  # one query per call for the embedded model
    assert not accepts(embedded, search_with("the_book_2026"))


# Unicode whitespace other than \x00-\x20, \x7F, \xA0 and \u3000 passes the "non-blank first
# character" classes, but str.strip() removes it, so the protocol finds the value empty.
UNICODE_BLANKS = ["\x85", "\u1680", "\u2003", "\u2028", "\u202f", "\u205f"]
BLANK_CASES = [
    *(({}, f"<think>\nq\n</think>\n<answer>\n{c}\n</answer>") for c in UNICODE_BLANKS),
    *(({}, search_with(c)) for c in UNICODE_BLANKS),
    ({}, VISIT.replace("Who wrote it?", "\u2003")),
    *(({"plain_queries": True}, search_with(c)) for c in [*UNICODE_BLANKS[1:], "\u3000"]),
]


def test_unicode_blanks_never_start_a_field():
    """Every blank str.strip() removes is refused where a field must be non-blank."""
    admitted_but_invalid = [
        text
        for options, text in BLANK_CASES
        if accepts(protocol_grammar(**options), text)
        and not (check_turn_format(text, "<answer>" in text) and parse_turn(text).ok)
    ]
    assert not admitted_but_invalid
    assert not any(accepts(protocol_grammar(**options), text) for options, text in BLANK_CASES)


def test_grammar_options_validated():
    with pytest.raises(ValueError):
        protocol_grammar(allow_tool_call=False, allow_answer=False)
    with pytest.raises(ValueError):
        protocol_grammar(max_list_items=0)
    with pytest.raises(ValueError):  # a span holds a word
        protocol_grammar(answer_spans=(("Bram", "Stoker"), ()))
    with pytest.raises(TypeError):  # an answering policy is the small agent's, not the protocol's
        protocol_grammar(max_answer_words=10)
    # a word bound on free text glues words together: only a span answer takes one
    with pytest.raises(ValueError):
        LINEAR_LEVERS.but(span_answers=False)
    with pytest.raises(ValueError):
        LINEAR_LEVERS.but(span_words=0)
    with pytest.raises(ValueError, match="unknown lever 'answer_spans_rank'"):
        LINEAR_LEVERS.but(answer_spans_rank=1)  # a typo (an old name) fails at once
    with pytest.raises(ValueError, match="span reader"):
        LINEAR_LEVERS.but(span_reader="bert")
    with pytest.raises(ValueError, match="bridge_search"):
        LINEAR_LEVERS.but(bridge_search=True)  # a mode, not a flag


# -- span answers: grounded, and never glued ----------------------------------------------------

SPAN_SEARCH = json.dumps([{"query": "Dracula", "web_page_info_list": [
    {"title": "Dracula", "url": "https://en.wikipedia.org/wiki/Dracula",
     "snippet": "Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker. "
                "J. R. R. Tolkien read it in the U.S. in 1,234 days..."},
    {"title": "Brave New World", "url": "https://en.wikipedia.org/wiki/Brave_New_World",
     "snippet": "A 1932 novel by Aldous Huxley (see The Rite of Spring; National Park Service)."},
]}])
SPAN_MESSAGES = [
    *initial_messages("Who wrote the novel Dracula?", build_system_prompt("2025-01-01")),
    {"role": "assistant", "content": "<think>\nIt was Bram Stoker.\n</think>\n<tool_call>\n"
     '{"name": "search", "arguments": {"query": ["Dracula"]}}\n</tool_call>'},
    {"role": "user", "content": wrap_tool_response(SPAN_SEARCH)},
    {"role": "user", "content": wrap_tool_response(STEP_LIMIT_MESSAGE)},
]


# the embedded options with every span read as answer material (no focus on the question's
# sentences, no answer shape)
ALL_SPANS = LINEAR_LEVERS.but(span_focus=0, span_shaped=False)


def _answer_of(body: str) -> str:
    return f"<think>\n\n</think>\n<answer>\n{body}\n</answer>"


def _span_language(messages, levers) -> set[str]:
    """Every answer body the forced-answer grammar admits (the language is finite)."""
    grammar = Grammar(small_grammar("answer", False, messages, levers))
    return grammar.sentences("answer-span")


def _is_span(answer: str, texts) -> bool:
    words = answer.split(" ")
    return any(
        clause[i : i + len(words)] == words
        for text in texts for clause in clause_words(text) for i in range(len(clause))
    )


def test_span_answers_never_glue_words():
    """The whole language of the embedded forced answer, enumerated: each answer is one span of
    what was read (or thought), whole words with one space between them; no two adjacent words
    are ever glued and no word is cut, whatever the bound."""
    texts = span_sources(TurnState.of(SPAN_MESSAGES), thinking=True)
    for bound in (1, 3, 8):
        language = _span_language(SPAN_MESSAGES, ALL_SPANS.but(span_words=bound))
        assert {"Bram Stoker", "Aldous Huxley", "Tolkien", "1,234 days"} <= language or bound < 2
        vocabulary = {w for text in texts for clause in clause_words(text) for w in clause}
        for answer in language:
            words = answer.split(" ")
            assert 1 <= len(words) <= bound and all(w in vocabulary for w in words), answer
            assert _is_span(answer, texts), answer
        glued = {a + b for text in texts for c in clause_words(text) for a, b in zip(c, c[1:], strict=False)}
        assert not glued & language
        for bad in ("AldousiaHuxley", "AldousHuxley", "Rite ofspring", "ParkServ",
                    "The answer is:", "1.1.1.2.1.1.1.1", "Bram Stoker.", "Bram  Stoker"):
            assert bad not in language
    grammar = small_grammar("answer", False, SPAN_MESSAGES, ALL_SPANS)
    assert accepts(grammar, _answer_of("Bram Stoker"))
    assert accepts(grammar, _answer_of("J. R. R. Tolkien"))  # initials keep their stops
    assert accepts(grammar, _answer_of("Irish author Bram Stoker"))
    assert not accepts(grammar, _answer_of("BramStoker"))
    assert not accepts(grammar, _answer_of("Stoker Bram"))  # a span, in its order
    assert not accepts(grammar, _answer_of("Stoker J."))  # never across a sentence end
    assert not accepts(grammar, _answer_of("https://en.wikipedia.org/wiki/Dracula"))
    assert not accepts(grammar, _answer_of("You have reached"))  # not the limit notice
    assert not accepts(grammar, _answer_of("by Irish author"))  # no weak first word


def test_year_ranges_and_dashes_split_into_answers():
    """A biography's "(1928–2025)" holds two answers, the birth and the death year: an en or em
    dash, and a hyphen between digits, end a clause; a hyphenated name stays one word."""
    assert clause_words("American biologist (1928–2025)") == [["American", "biologist"],
                                                               ["1928"], ["2025"]]
    assert clause_words("ruled 1130-1816 as king") == [["ruled", "1130"], ["1816", "as", "king"]]
    assert clause_words("Jean-Paul Sartre—writer") == [["Jean-Paul", "Sartre"], ["writer"]]
    messages = [{"role": "user", "content": "When was James Watson born?"},
                {"role": "user", "content": wrap_tool_response(json.dumps([{
                    "query": "James Watson", "web_page_info_list": [{
                        "title": "James Watson", "url": "https://en.wikipedia.org/wiki/J_Watson",
                        "snippet": "American biologist (1928–2025)"}]}]))}]
    grammar = small_grammar("answer", False, messages, LINEAR_LEVERS)
    assert accepts(grammar, _answer_of("1928")) and accepts(grammar, _answer_of("2025"))
    assert not accepts(grammar, _answer_of("1928–2025"))


def test_span_sources():
    texts = span_sources(TurnState.of(SPAN_MESSAGES))
    assert len(texts) == 1 and "Bram Stoker" in texts[0] and "https:" not in texts[0]
    assert span_sources(TurnState.of(SPAN_MESSAGES), thinking=True)[0] == "It was Bram Stoker."
    # nothing read yet: the question itself; the grammar stays well formed either way
    assert span_sources(TurnState.of(SPAN_MESSAGES[:2])) == ("Who wrote the novel Dracula?",)
    assert span_sources(TurnState.of(SPAN_MESSAGES[:1])) == ()
    plain = small_grammar("answer", False, SPAN_MESSAGES[:1], LINEAR_LEVERS)
    assert accepts(plain, _answer_of("Bram Stoker wrote it"))
    visit = "The useful information in https://x.example for user goal g as follows: \n\n" \
        "Summary: \nIt was written by Bram Stoker."
    assert "useful information" not in span_sources(TurnState.of([
        {"role": "user", "content": "q"},
        {"role": "user", "content": wrap_tool_response(visit)}]))[0]


def test_span_answers_can_leave_the_question_out():
    language = _span_language(SPAN_MESSAGES, LINEAR_LEVERS.but(span_new_words=True))
    assert "Bram Stoker" in language
    # "Who ...?" asks for a name: a run of capitalised words, not "Irish author Bram Stoker"
    assert "Irish author Bram Stoker" not in language and "Irish" in language
    assert not any(w.lower() in ("dracula", "dracul", "novel") for a in language
                   for w in a.split())


# -- llama.cpp parses every variant ------------------------------------------------------------

VARIANT_OPTIONS = [
    {},
    {"max_think_chars": 600, "max_answer_chars": 400, "max_string_chars": 160},
    {"allow_tool_call": False},
    {"allow_answer": False, "max_list_items": 1},
    {"plain_queries": True},
]
VARIANTS = dict.fromkeys([  # (without duplicates)
    *(protocol_grammar(prefilled, **options) for prefilled in (False, True) for options in
      VARIANT_OPTIONS),
    *(small_grammar(kind, prefilled, SPAN_MESSAGES, LINEAR_LEVERS)
      for kind in ("any", "answer") for prefilled in (False, True)),
    small_grammar("answer", False, SPAN_MESSAGES, LINEAR_LEVERS, span_new_words=True),
    small_grammar("any", False, SPAN_MESSAGES[:-1], LINEAR_LEVERS, calls_grounded=True),
    *(small_grammar(kind, levers=LINEAR_LEVERS) for kind in ("tool_call", "search")),
    *(grammar_for_kind(kind) for kind in ("any", "tool_call", "search", "answer")),
])


@pytest.fixture(scope="module")
def server(embedded_gguf):
    from drvenus.llm.llamacpp import LlamaCppServer

    # One thread: a busy machine (parallel test runs) slows a multi-threaded llama.cpp badly.
    srv = LlamaCppServer(embedded_gguf, window=1024, n_threads=1)
    yield srv
    srv.close()


def _llama_cpp_answer(server, grammar: str) -> dict:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "grammar": grammar,
        "max_tokens": 1,
        "temperature": 0.0,
    }
    return server.chat(body, threading.Event())


def test_llama_cpp_parses_every_variant(server):
    for grammar in VARIANTS:
        answer = _llama_cpp_answer(server, grammar)
        assert "error" not in answer, (answer, grammar)
        assert answer["choices"][0]["message"]["content"], answer


def test_llama_cpp_reports_a_broken_grammar(server):
    answer = _llama_cpp_answer(server, 'root ::= "a" undefined-rule')
    assert "error" in answer, answer


# -- sampling with the real model ------------------------------------------------------------

# The embedded model's own grammar options (plain queries, two list items), with bounds tight
# enough that a sample is a few dozen tokens.
SAMPLING_LEVERS = LINEAR_LEVERS.but(think_chars=120, free_answer_chars=80, call_chars=40)
QUESTION = initial_messages("Who wrote the novel Dracula?", build_system_prompt("2025-01-01"))


@pytest.fixture(scope="module")
def model(embedded_gguf):
    """The embedded model; one slot, so the prompt is evaluated once."""
    from drvenus.llm.llamacpp import llamacpp_model

    llm = llamacpp_model(
        embedded_gguf,
        window=2048,
        n_threads=1,
        grammar_builder=GrammarBuilder(SAMPLING_LEVERS),
    )
    yield llm
    asyncio.run(llm.aclose())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "prefilled", "seed"),
    [(None, False, 0), ("tool_call", False, 1), ("search", False, 2), ("answer", False, 3),
     (None, True, 4)],
)
def test_constrained_samples_are_valid(model, kind, prefilled, seed):
    model.prefilled_think = prefilled  # SmolLM2's template does not prefill: pretend it does
    params = SamplingParams(max_tokens=512, seed=seed, temperature=0.8)
    try:
        gen = asyncio.run(model.generate(QUESTION, params, grammar=kind or "any"))
    finally:
        model.prefilled_think = False
    text = gen.text
    assert gen.finish_reason == "stop", text
    turn = parse_turn(text)
    assert turn.ok, (turn.error, text)
    assert kind is None or turn.kind == ("tool_call" if kind == "search" else kind), text
    assert check_turn_format(text, turn.kind == "answer"), text
    if turn.kind == "tool_call":
        assert turn.tool_call.name in (("search",) if kind == "search" else ("search", "visit"))
    # what llama.cpp sampled under the grammar, the recognizer accepts
    grammar = small_grammar(kind or "any", prefilled, levers=SAMPLING_LEVERS)
    assert accepts(grammar, text.removeprefix("<think>\n") if prefilled else text), text


def test_grounded_calls_visit_what_was_found_and_never_repeat_a_query():
    options = LINEAR_LEVERS.but(calls_grounded=True, first_search_question=False)
    before = small_grammar("any", False, SPAN_MESSAGES[:2], options)
    assert accepts(before, search_with("Dracula")) and not accepts(before, VISIT)  # no results
    after = small_grammar("any", False, SPAN_MESSAGES[:-1], options)
    assert accepts(after, VISIT)  # a result of the search
    assert accepts(after, VISIT.replace("Dracula", "Brave_New_World"))
    assert not accepts(after, VISIT.replace("Dracula", "Bram_Stoker"))  # never an invented URL
    assert not accepts(after, search_with("Dracula"))  # asked already
    for fresh in ("Dracula novel", "Dracul", "D", "Bram Stoker", "Draculas"):
        assert accepts(after, search_with(fresh)), fresh
    assert not accepts(after, search_with("D" * 61))  # the length bound holds on every path
    assert accepts(after, search_with("D" + "a" * 59))
    visited = [*SPAN_MESSAGES[:-1], {"role": "assistant", "content": VISIT}]
    left = small_grammar("any", False, visited, options)
    assert not accepts(left, VISIT) and accepts(left, VISIT.replace("Dracula", "Brave_New_World"))
    search_only = small_grammar("search", False, SPAN_MESSAGES[:-1], options)
    assert not accepts(search_only, search_with("Dracula"))
    assert accepts(search_only, search_with("Irish author"))


def test_span_answers_can_be_made_to_say_something_new():
    # not only names: any span of the sentences
    options = LINEAR_LEVERS.but(span_news=True, span_shaped=False)
    language = _span_language(SPAN_MESSAGES, options)
    assert "Bram Stoker" in language and "Dracula is an 1897 Gothic horror novel" in language
    assert "Dracula" not in language and "Dracula is" not in language  # only the question's
    assert "novel" not in language and "Dracula is an" not in language  # "an" says nothing
    assert language <= _span_language(SPAN_MESSAGES, LINEAR_LEVERS.but(span_shaped=False))


# -- answer shapes: what the question asks for --------------------------------------------------

_THING = AnswerShape(bare_number=False)  # of no shape, naming no amount: no bare number


@pytest.mark.parametrize(
    ("question", "shape"),
    [
        ("The founder of Sikhism was the first of how many Sikh Gurus?", AnswerShape(number=True)),
        ("About how long have farmers watered crops?", AnswerShape(number=True)),
        ("In what year did Steinbeck receive the Nobel Prize?",
         AnswerShape(time=True, year=True)),
        ("When was the treaty signed?", AnswerShape(time=True)),
        ("Over which centuries did dinner move to the evening?", AnswerShape(time=True)),
        ("Who wrote the novel Dracula?", AnswerShape(name=True)),
        ("On the bank of which river does the city stand?", AnswerShape(name=True)),
        ("Where was the painter born?", AnswerShape(name=True)),
        ("What is the capital of Lebanon?", AnswerShape(name=True)),
        ("What was the largest city of the colony?", AnswerShape(name=True)),
        ("What is the name of the river?", _THING),
        ("Were Scott Derrickson and Ed Wood of the same nationality?",
         AnswerShape(yes_no=True, nationality=True)),
        ("What nationality was the author of Dracula?",
         AnswerShape(nationality=True, bare_number=False)),
        ("Is the Nile longer than the Amazon?", AnswerShape(yes_no=True)),
        ("Which was founded first, Harvard University or Yale University?",
         AnswerShape(choices=("Harvard University", "Yale University"))),
        ("Who was born first: Bach, Handel or Vivaldi?",
         AnswerShape(choices=("Bach", "Handel", "Vivaldi"))),
        ("Which of Carl Rogers and Sandro Botticelli was born earlier?",
         AnswerShape(choices=("Carl Rogers", "Sandro Botticelli"))),
        ("Who was born first, Erika Jayne or Marco Da Silva",  # no question mark
         AnswerShape(choices=("Erika Jayne", "Marco Da Silva"))),
        ("Which band, Letters to Cleo or Screaming Trees, had more members?",
         AnswerShape(choices=("Letters to Cleo", "Screaming Trees"))),
        ("who is younger Keith Bostic or Jerry Glanville ?",
         AnswerShape(choices=("Keith Bostic", "Jerry Glanville"))),
        ("Which genus has more species Eucryphia or Lepidozamia ?",
         AnswerShape(choices=("Eucryphia", "Lepidozamia"))),
        ("Who was born first Doug Liman or Saul Metzstein?",
         AnswerShape(choices=("Doug Liman", "Saul Metzstein"))),
        ("Which case came first, Craig v. Boren or United States v. Paramount Pictures, Inc.?",
         AnswerShape(choices=("Craig v. Boren", "United States v. Paramount Pictures, Inc."))),
        ("Which film was nominated, LaLee's Kin: The Legacy of Cotton or Gimme Shelter, the "
         "1970 documentary?", _THING),  # "..., the 1970 documentary" is no choice
        ("Which of the planets is largest?", _THING),
        ("What do some people consider the first musical instrument?", _THING),
        ("What is the atomic number of the metal?", AnswerShape(number=True)),
        ("How often is the cup held?", _THING),
        ("What was the 2020 census population of the city?", PLAIN_SHAPE),  # an amount
        ("The city has a population of what in 2010?", PLAIN_SHAPE),
        ("", PLAIN_SHAPE),
    ],
)
def test_answer_shape(question, shape):
    assert answer_shape(question).plain is (
        replace(shape, bare_number=True, nationality=False) == PLAIN_SHAPE)
    assert answer_shape(question) == shape


_NAME_WORD = st.from_regex(r"[A-Z][a-z]{1,8}", fullmatch=True).filter(
    lambda w: w.lower() not in {"or", "and", "who", "which", "is", "was"})
_NAMED = st.lists(_NAME_WORD, min_size=1, max_size=3).map(" ".join)


@given(a=_NAMED, b=_NAMED, form=st.sampled_from([
    "Who was born first, {a} or {b}?", "Who was born first, {a} or {b}",
    "who is younger {a} or {b} ?", "Which band, {a} or {b}, had more members?",
    "Which genus has more species {a} or {b}?", "Which came out first: {a} or {b}?"]))
def test_a_comparison_offers_the_two_things_it_names(a, b, form):
    assert answer_shape(form.format(a=a, b=b)).choices == tuple(dict.fromkeys((a, b)))


@pytest.mark.parametrize("question", [
    "Which doctrine, not held in Judaism or Islam, rests on the story of the first couple?",
    "What is the condition, in which the skin turns pale or red and tingles, before frostbite?",
    "What color do people wear during the festival or to celebrate the king's birthday?",
])
def test_an_aside_with_or_names_no_choices(question):
    assert answer_shape(question).choices == ()


@pytest.mark.parametrize(
    ("question", "span", "takes"),
    [
        ("Who wrote the novel Dracula?", "Bram Stoker", True),
        ("Who wrote the novel Dracula?", "Irish", False),  # a nationality is no person
        ("Who wrote the novel Dracula?", "Irish author", False),
        ("Who wrote the novel Dracula?", "Irish author Bram Stoker", False),  # "Bram Stoker"
        ("Who wrote the novel Dracula?", "Anglo-Irish", False),
        ("Which movement did the painter lead?", "Italian Renaissance", True),  # a name
        ("What nationality was the author of Dracula?", "Irish", True),
        ("In which language was the epic written?", "Sanskrit", True),
        ("In which language is the novel written?", "English", True),
        ("In what year was Dracula published?", "Irish", False),
        ("What is the novel about?", "vampires", True),
        ("Which Eminem album included vocals from the singer?", "2012", False),  # a year
        ("Which Eminem album included vocals from the singer?", "Relapse", True),
        ("The author of Sexual Politics attended which British University?", "1,500", False),
        ("What number did the player wear?", "23", True),  # an amount is named
        ("How many top 20 hits has the singer had?", "1994", False),  # a count, not a year
        ("How many top 20 hits has the singer had?", "7", True),
        ("How many islands make up the region?", "1,000", True),
        ("How many islands make up the region?", "1000", True),
        ("In what year did the band form?", "1994", True),
    ],
)
def test_a_shape_takes_a_nationality_only_where_one_is_asked(question, span, takes):
    assert answer_shape(question).takes(span) is takes



def _shaped_language(question: str, snippet: str) -> set[str]:
    messages = [{"role": "user", "content": question},
                {"role": "user", "content": wrap_tool_response(json.dumps([{
                    "query": "q", "web_page_info_list": [{
                        "title": "Page", "url": "https://en.wikipedia.org/wiki/Page",
                        "snippet": snippet}]}]))}]
    return _span_language(messages, LINEAR_LEVERS.but(span_shaped=True, span_words=3))


def test_shaped_span_answers_keep_the_asked_kind():
    """A count or a time holds a number (or a number word / month); a name starts with a capital;
    yes/no and choice questions are answered by exactly those; a shape that would leave nothing
    keeps every span."""
    snippet = "Guru Nanak was the first of ten gurus, born in 1469 in Talwandi; he taught widely"
    many = _shaped_language("How many gurus were there?", snippet)
    assert {"ten", "ten gurus", "1469"} <= many  # it starts with a number
    assert all(a.split()[0] in ("ten", "1469") for a in many)
    amount = _shaped_language("What is the number of the year?", snippet)
    assert {"ten", "1469", "1469 in Talwandi"} <= amount  # it starts with a number
    assert all(a.split()[0] in ("ten", "1469") for a in amount)
    when = _shaped_language("In what year was he born?", snippet)
    assert "1469" in when and "ten" not in when
    century = "born in the 15th century, in 1469"
    assert "15th century" in _shaped_language("When was he born?", century)
    assert all(a.startswith("1469") for a in _shaped_language("What year was he born?", century))
    who = _shaped_language("Who was the first guru?", snippet)
    assert "Guru Nanak" in who and "Talwandi" in who and all(a[0].isupper() for a in who)
    assert "Guru Nanak was" not in who  # a name ends with its capitalised words
    where = _shaped_language("Where is the gulf?", "the Gulf of Thailand lies east")
    assert "Gulf of Thailand" in where and "Gulf of" not in where
    assert "A" not in _shaped_language("Which river is it?", "A river, the Danube in Europe")
    assert _shaped_language("Was he born in 1469?", snippet) == {"yes", "no"}
    assert _shaped_language("Who came first, Guru Nanak or Guru Angad?", snippet) == {
        "Guru Nanak", "Guru Angad"}
    plain = _shaped_language("When was he born?", "no figures here at all")
    assert "figures" in plain  # nothing of the kind was read: every span stays


def test_the_first_search_asks_the_question_and_answers_come_from_its_sentences():
    """With the embedded options the first search is the question's own content words (no
    other query), later searches are free; a span answer comes from the sentences that match
    the question most."""
    question = "Who wrote the novel Dracula?"
    first = small_grammar("search", False, SPAN_MESSAGES[:2], LINEAR_LEVERS)
    unthought = "<think>\n\n</think>"  # the grammar fixes the turn: no thought
    assert accepts(first, search_with("Wrote novel Dracula").replace(
        "<think>\nI should search.\n</think>", unthought))
    assert not accepts(first, search_with("Wrote novel Dracula"))
    assert not accepts(first, search_with("Dracula").replace(
        "<think>\nI should search.\n</think>", unthought))
    later = small_grammar("any", False, SPAN_MESSAGES[:-1], LINEAR_LEVERS)
    assert accepts(later, search_with("Bram Stoker"))
    texts = span_sources(TurnState.of(SPAN_MESSAGES))
    # the best sentence, and the first two lines read (the top result's title and description)
    assert focus_sentences(texts, question, 1) == (
        "Dracula", "Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker.")
    assert "A 1932 novel by Aldous Huxley (see The Rite of Spring; National Park Service)." in \
        focus_sentences(texts, "Which 1932 novel did Aldous Huxley write?", 1)
    focused = _span_language(SPAN_MESSAGES, LINEAR_LEVERS.but(span_focus=1))
    assert "Bram Stoker" in focused and "Aldous Huxley" not in focused



FULL_NAME_TEXTS = [
    "Heart of Darkness\nHeart of Darkness is a novella by Polish-English novelist Joseph "
    "Conrad. In Conrad's story, Marlow travels up the Congo. Conrad wrote it in 1899.",
    "The Marriage of Figaro\nAn opera buffa by Wolfgang Amadeus Mozart. Leopold Mozart, his "
    "father, wrote a violin method; in Vienna Wolfgang Amadeus Mozart met Da Ponte.",
    "Eenasul Fateh\nEenasul Fateh, also known by his stage name Aladin, is a consultant.",
]


@pytest.mark.parametrize(
    ("question", "span", "full"),
    [
        ("Who wrote the novel Heart of Darkness?", "Conrad", "Joseph Conrad"),
        ("Who composed The Marriage of Figaro?", "Mozart", "Wolfgang Amadeus Mozart"),
        ("whom did the opera honour?", "Mozart", "Wolfgang Amadeus Mozart"),
        ("Who wrote the novel Heart of Darkness?", "Joseph Conrad", "Joseph Conrad"),
        ("What is the novella about?", "Conrad", "Conrad"),  # not a "who" question
        ("Who travels up the river?", "Marlow", "Marlow"),  # no given name written
        ("Who wrote the novel?", "Polish-English", "Polish-English"),  # a nationality
        ("Who wrote the novel?", "Darkness", "Darkness"),  # "of" is no given name
        ("Who wrote it in 1899?", "1899", "1899"),
        # a title line above a sentence that starts with the name is no longer name
        ("Who was known as Aladin?", "Eenasul Fateh", "Eenasul Fateh"),
        ("Who was known as Aladin?", "Fateh", "Eenasul Fateh"),
    ],
)
def test_a_surname_becomes_the_full_name_the_texts_write(question, span, full):
    assert full_name(span, FULL_NAME_TEXTS, question) == full


_NAME_PIECES = ["Joseph", "Conrad", "Mozart", "Amadeus", "The", "In", "of", "Polish",
                "novelist", "Wolfgang", ",", ".", "wrote", "Verdi", "Giuseppe"]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["Conrad", "Mozart", "Amadeus Mozart", "Verdi", "Polish"]),
       st.lists(st.lists(st.sampled_from(_NAME_PIECES), max_size=30).map(" ".join),
                max_size=3),
       st.sampled_from(["Who wrote it?", "What is it?", "Whom did he meet?"]))
def test_a_full_name_ends_with_the_span_and_is_written_in_the_texts(span, texts, question):
    full = full_name(span, texts, question)
    if full != span:
        assert question.startswith(("Who", "Whom"))
        assert full.endswith(" " + span) and len(full.split()) <= 4
        assert any(full in text for text in texts)
        assert full.split()[0] not in ("The", "In", "Polish")


MEASURE_TEXTS = [
    "A singles luge sled weighs 21–25 kg (46–55 lb); a doubles sled 25–30 kg.",
    "The Stone Age lasted roughly 3.4 million years. About 25% of the tools were flint.",
    "Its winds reach 480 kilometers per hour; the plateau covers 105,000 km2 (41,000 sq mi).",
    "Nervous tissue appeared 550 to 600 million years ago. Lake Baikal is 1,642 metres deep.",
]


@pytest.mark.parametrize(
    ("question", "span", "answer"),
    [
        ("How much does a singles sled weigh?", "21–25", "21–25 kg"),
        ("For about how long did the Stone Age last?", "3.4 million", "3.4 million years"),
        ("How much of the tools were flint?", "25", "25%"),
        ("How fast can its winds get?", "480", "480 kilometers per hour"),
        ("How big is the plateau?", "105,000", "105,000 km2"),
        ("About how long ago did nervous tissue appear?", "550 to 600 million",
         "550 to 600 million years ago"),
        ("How deep is the deepest lake?", "1,642", "1,642 metres"),
        ("How deep is the deepest lake?", "1,642 metres", "1,642 metres"),  # has its unit
        ("How many years did the Stone Age last?", "3.4 million", "3.4 million"),  # a count
        ("What weighs 21–25?", "21–25", "21–25"),  # not a measure question
        ("How deep is the deepest lake?", "1", "1"),  # a part of a number is not the number
        ("How heavy is the sled?", "Baikal", "Baikal"),  # not a number
    ],
)
def test_a_measures_number_takes_the_unit_the_texts_write(question, span, answer):
    assert with_unit(span, MEASURE_TEXTS, question) == answer


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["12", "3.4 million", "1,642", "21–25", "7", "Baikal"]),
       st.lists(st.lists(st.sampled_from(["12", "3.4 million", "1,642", "21–25", "7", "kg",
                                          "years", "%", "metres", "ago", "per", "hour", "the",
                                          ",", ".", "km2", "square", "miles", "Baikal"]),
                         max_size=25).map(" ".join), max_size=3),
       st.sampled_from(["How long was it?", "How far is it?", "How many are there?",
                        "What is it?"]))
def test_a_unit_is_added_only_to_a_measures_number_as_written(span, texts, question):
    answer = with_unit(span, texts, question)
    if answer != span:
        assert question.startswith(("How long", "How far"))
        assert answer.startswith(span) and any(answer in text for text in texts)
        assert span[0].isdigit() and not answer[len(span):].strip()[0].isdigit()


def _searched(question: str, *responses: str) -> list[dict[str, str]]:
    """A conversation: ``question``, then one search (its query a placeholder) and its
    response for each of ``responses``."""
    messages = [*initial_messages(question, build_system_prompt("2025-01-01"))]
    for i, body in enumerate(responses):
        messages += [
            {"role": "assistant", "content": "<think>\nSearch.\n</think>\n<tool_call>\n"
             f'{{"name": "search", "arguments": {{"query": ["query {i}"]}}}}\n</tool_call>'},
            {"role": "user", "content": wrap_tool_response(body)}]
    return messages


def _search_body(title: str, snippet: str) -> str:
    return json.dumps([{"query": title, "web_page_info_list": [{
        "title": title, "url": f"https://en.wikipedia.org/wiki/{title.replace(' ', '_')}",
        "snippet": snippet}]}])


def test_the_second_hop_searches_for_the_bridge_then_answers():
    """With ``bridge_search``, the turn after the first search is a search for the bridge (the
    reader's best span and the question's words its passage lacks), with no thought and no
    answer; after the second search the turn is an answer; a yes/no question is not made to
    search again."""
    levers = LINEAR_LEVERS.but(bridge_search="always")
    question = "In which city was the novelist who wrote Dracula born?"
    first = _search_body("Dracula", "Dracula is an 1897 Gothic horror novel by Bram Stoker.")
    messages = _searched(question, first)
    query = second_search(TurnState.of(messages), levers)
    assert query is not None and query.startswith(query[:1].upper())
    assert len(query) <= levers.call_chars
    assert "City" in query and "born" in query  # what the first passage does not say
    assert "Dracula" not in query and "novelist" not in query.split()[1:]
    grammar = small_grammar("any", False, messages, levers)
    bridge = f'<think>\n\n</think>\n<tool_call>\n{{"name": "search", "arguments": ' \
             f'{{"query": ["{query}"]}}}}\n</tool_call>'
    assert accepts(grammar, bridge)
    assert not accepts(grammar, bridge.replace("<think>\n\n", "<think>\nSearch.\n"))
    assert not accepts(grammar, search_with("Bram Stoker born"))
    assert not accepts(grammar, ANSWER)
    second = _search_body("Bram Stoker", "Bram Stoker was an Irish author, born in Dublin.")
    after = small_grammar("any", False, _searched(question, first, second), levers)
    assert not accepts(after, bridge) and not accepts(after, search_with("Dublin"))
    assert any(accepts(after, f"<think>\n\n</think>\n<answer>\n{span}\n</answer>")
               for span in ("Dublin", "Bram Stoker"))
    plain = small_grammar("any", False, messages, LINEAR_LEVERS)  # the lever off: free
    assert accepts(plain, search_with("Bram Stoker born"))
    yes_no = _searched("Was the novelist who wrote Dracula born in Dublin?", first)
    assert second_search(TurnState.of(yes_no), levers) is None
    assert accepts(small_grammar("any", False, yes_no, levers), search_with("Bram Stoker"))


def test_a_bridge_query_is_the_bridge_and_what_its_passage_lacks():
    query = bridge_query("What is the capital of the country that holds most of the Orinoco "
                         "basin?", "Venezuela", "The Orinoco basin lies mostly in Venezuela.")
    assert query.startswith("Venezuela ") and "Capital" in query and "Orinoco" not in query
    long = bridge_query("Which river flows through the city?", "X" * 80, "", 60)
    assert long == "X" * 60
    assert bridge_query("Who?", "the <b>end</b>", "") == "The b end b"


# -- a grammar that admits one text -------------------------------------------------------------

_QUERY_TEXT = st.text(alphabet=st.sampled_from(list('ab Z9,."\\é-')), min_size=1, max_size=12)
_QUERY = _QUERY_TEXT.map(str.strip).filter(bool)  # the parser drops blank queries


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.booleans(), st.sampled_from([0, 0, 4, None]), _QUERY,
       st.lists(_QUERY, min_size=1, max_size=2, unique=True))
def test_a_grammar_fixes_the_turn_only_when_it_admits_one_text(prefilled, answer, think, query,
                                                                 choices):
    """fixed_text reads the real protocol grammars: the one text of a turn whose thought is
    empty and whose query, or answer, is given; None for any turn with a choice left."""
    from drvenus.protocol.grammar import fixed_text

    if answer:
        grammar = protocol_grammar(prefilled, allow_tool_call=False, answer_choices=tuple(choices),
                                   max_think_chars=think)
        one = think == 0 and len(choices) == 1
    else:
        grammar = protocol_grammar(prefilled, allow_answer=False, tools=("search",),
                                   search_query=query, max_think_chars=think)
        one = think == 0
    text = fixed_text(grammar)
    assert (text is not None) == one
    if text is not None:
        assert accepts(grammar, text)
        turn = parse_turn(text if not prefilled else "<think>" + text)
        if answer:
            assert turn.answer == choices[0]
        else:
            assert turn.tool_call.arguments == {"query": [query]}


def test_the_embedded_first_and_bridge_searches_are_fixed_and_the_answer_turn_is_not():
    from drvenus.protocol.grammar import fixed_text

    state = TurnState.of(initial_messages("Who wrote the novel Dracula?",
                                          build_system_prompt("2025-01-01")))
    first = GrammarBuilder(LINEAR_LEVERS)("search", False, state)
    assert fixed_text(first) == ('<think>\n\n</think>\n<tool_call>\n{"name": "search", '
                                 '"arguments": {"query": ["Wrote novel Dracula"]}}\n</tool_call>')
    assert fixed_text(GrammarBuilder(LINEAR_LEVERS)("any", False, state)) is None
