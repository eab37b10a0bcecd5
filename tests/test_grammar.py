"""The protocol grammar: compiled by llama.cpp's own parser, checked string by string with
llama.cpp's grammar sampler, and sampled from with the real embedded model."""

from __future__ import annotations

import asyncio
import ctypes
import math

import pytest

from drvenus.llm import LLMError, SamplingParams
from drvenus.llm.embedded import embedded_model_path
from drvenus.llm.grammar import protocol_grammar
from drvenus.protocol import build_system_prompt, check_turn_format, initial_messages, parse_turn

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from drvenus.llm.llamacpp import LlamaCppModel  # noqa: E402

SEARCH = (
    "<think>\nI should search.\n</think>\n<tool_call>\n"
    '{"name": "search", "arguments": {"query": ["Dracula author", "Bram Stoker"]}}\n</tool_call>'
)
VISIT = (
    "<think>\nOpen the page.\n</think>\n<tool_call>\n"
    '{"name": "visit", "arguments": {"url": ["https://en.wikipedia.org/wiki/Dracula"], '
    '"goal": "Who wrote it?"}}\n</tool_call>'
)
ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"


@pytest.fixture(scope="module")
def llm():
    try:
        path = embedded_model_path()
    except LLMError as exc:
        pytest.skip(f"embedded model not installed: {exc}")
    model = llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False)
    yield model
    model.close()


def _sampler(llm, grammar: str):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")


def accepts(llm, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets the model write exactly ``text`` then stop."""
    smpl = _sampler(llm, grammar)
    assert smpl, "grammar does not parse"
    eos = llama_cpp.llama_vocab_eos(llama_cpp.llama_model_get_vocab(llm.model))
    try:
        for token in [*llm.tokenize(text.encode("utf-8"), add_bos=False, special=False), eos]:
            cell = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            array = llama_cpp.llama_token_data_array(data=cell, size=1, selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(smpl, ctypes.byref(array))
            if math.isinf(cell[0].logit):
                return False
            if token != eos:
                llama_cpp.llama_sampler_accept(smpl, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(smpl)


@pytest.mark.parametrize("prefilled", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_think_chars": 600, "max_answer_chars": 400, "max_string_chars": 160},
        {"allow_tool_call": False},
        {"allow_answer": False, "max_list_items": 1},
    ],
)
def test_grammar_compiles_in_llama_cpp(llm, prefilled, options):
    grammar = protocol_grammar(prefilled, **options)
    smpl = _sampler(llm, grammar)
    assert smpl, grammar
    llama_cpp.llama_sampler_free(smpl)
    assert llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)


def test_broken_grammar_is_detected(llm):
    assert not _sampler(llm, 'root ::= "a" undefined-rule')


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
def test_well_formed_turns_are_accepted(llm, text):
    assert check_turn_format(text, "<answer>" in text)  # the protocol agrees they are valid
    assert accepts(llm, protocol_grammar(), text)


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
def test_malformed_turns_are_rejected(llm, text):
    assert not accepts(llm, protocol_grammar(), text)


def test_variants(llm):
    prefilled = protocol_grammar(True)
    assert accepts(llm, prefilled, SEARCH.removeprefix("<think>\n"))
    assert not accepts(llm, prefilled, SEARCH)  # the template already wrote <think>
    answer_only = protocol_grammar(allow_tool_call=False)
    assert accepts(llm, answer_only, ANSWER) and not accepts(llm, answer_only, SEARCH)
    calls_only = protocol_grammar(allow_answer=False)
    assert accepts(llm, calls_only, VISIT) and not accepts(llm, calls_only, ANSWER)
    one_query = protocol_grammar(max_list_items=1)
    assert not accepts(llm, one_query, SEARCH)  # two queries


def test_length_bounds(llm):
    bounded = protocol_grammar(max_think_chars=20, max_answer_chars=10, max_string_chars=8)
    think = lambda n: f"<think>\n{'x' * n}\n</think>\n<answer>\nok\n</answer>"  # noqa: E731
    assert accepts(llm, bounded, think(20)) and not accepts(llm, bounded, think(21))
    answer = lambda n: f"<think>\n\n</think>\n<answer>\n{'y' * n}\n</answer>"  # noqa: E731
    assert accepts(llm, bounded, answer(10)) and not accepts(llm, bounded, answer(11))
    query = lambda n: SEARCH.replace('"Dracula author"', '"' + "q" * n + '"')  # noqa: E731
    assert not accepts(llm, bounded, SEARCH.replace("I should search.", ""))  # 'Dracula author'
    assert accepts(
        llm, bounded, query(8).replace('"Bram Stoker"', '"b"').replace("I should search.", "")
    )
    assert not accepts(
        llm, bounded, query(9).replace('"Bram Stoker"', '"b"').replace("I should search.", "")
    )


def test_grammar_options_validated():
    with pytest.raises(ValueError):
        protocol_grammar(allow_tool_call=False, allow_answer=False)
    with pytest.raises(ValueError):
        protocol_grammar(max_list_items=0)


# -- sampling with the real model ------------------------------------------------------------

BOUNDS = {"max_think_chars": 240, "max_answer_chars": 160, "max_string_chars": 60}
QUESTION = initial_messages("Who wrote the novel Dracula?", build_system_prompt("2025-01-01"))


def _samples(options: dict, seeds: range, prefilled: bool = False) -> list[str]:
    model = LlamaCppModel(
        embedded_model_path(),
        n_ctx=2048,
        prefilled_think=prefilled,
        grammar_options={**BOUNDS, **options},
        param_overrides={"temperature": 0.8},
    )

    async def run() -> list[str]:
        try:
            out = []
            for seed in seeds:
                gen = await model.generate(QUESTION, SamplingParams(max_tokens=1024, seed=seed))
                assert gen.finish_reason == "stop", gen.text
                out.append(gen.text)
            return out
        finally:
            await model.aclose()

    return asyncio.run(run())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "kind", "prefilled", "n"),
    [
        ({}, None, False, 2),
        ({"allow_answer": False}, "tool_call", False, 1),
        ({"allow_tool_call": False}, "answer", False, 1),
        ({}, None, True, 1),
    ],
)
def test_constrained_samples_are_valid(llm, options, kind, prefilled, n):
    for text in _samples(options, range(n), prefilled):
        turn = parse_turn(text)
        assert turn.ok, (turn.error, text)
        assert kind is None or turn.kind == kind
        assert check_turn_format(text, turn.kind == "answer"), text
        if turn.kind == "tool_call":
            assert turn.tool_call.name in ("search", "visit")


def test_grammar_kinds_narrow_the_turn():
    import llama_cpp

    from drvenus.llm.grammar import grammar_for_kind

    for kind in ("any", "tool_call", "search", "answer"):
        llama_cpp.LlamaGrammar.from_string(grammar_for_kind(kind), verbose=False)
    search_only = grammar_for_kind("search")
    assert "visit-call" not in search_only.split("tool-call ::=")[1].split("\n")[0]
    assert "answer" not in grammar_for_kind("tool_call").split("root ::=")[1].split("\n")[0]
    assert "tool-call" not in grammar_for_kind("answer").split("root ::=")[1].split("\n")[0]
    with pytest.raises(ValueError):
        grammar_for_kind("python")
