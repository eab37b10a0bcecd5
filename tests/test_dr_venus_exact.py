"""``--protocol dr-venus`` reads turns as DR-Venus does: drvenus's own code, compared with
DR-Venus's own functions loaded from the pinned files (tests/dr_venus_functions.py)."""

from __future__ import annotations

import pytest

from dr_venus_functions import NEEDS_REFERENCE, run_demo_functions
from drvenus.protocol.dr_venus import DR_VENUS_READER, read_turn, sanitize_turn
from drvenus.reference.profiles import profile

T, A, C = "<think>\nI should look.\n</think>\n", "<answer>{}</answer>", "<tool_call>\n{}\n</tool_call>"
SEARCH = '{"name": "search", "arguments": {"query": ["Dune author"]}}'
VISIT = '{"name": "visit", "arguments": {"url": ["https://a.example/x"], "goal": "who"}}'

TURNS = [
    T + A.format("Frank Herbert"),
    T + A.format(""),  # an empty answer is a final answer
    T + A.format("   "),
    "<think>first <answer>inside</answer> then</think>\n" + A.format("after"),  # the first wins
    "<think>no closer " + A.format("x"),  # the closer goes before the answer
    "<think>no closer " + C.format(SEARCH),  # ... or before the call
    "<think>no closer, nothing else",
    "I thought</think>\n" + A.format("x"),  # no opener: prepended
    A.format("no think at all"),  # rejected
    "",
    "   ",
    "plain text",
    T + C.format(SEARCH),
    T + C.format(VISIT),
    T + C.format('{"name": "search", "arguments": {"query": ["a"], "extra": 1}}'),  # filtered
    T + C.format('{"name": "search", "arguments": {"query": "one string"}}'),
    T + C.format('{"name": "search", "arguments": {}}'),  # a call; the tool answers its error
    T + C.format('{"name": "visit", "arguments": {"url": "https://a.example", "goal": "g"}}'),
    T + C.format("{name: 'search', arguments: {query: ['json5']}}"),
    T + C.format('{"name": "browse", "arguments": {}}'),  # unknown tool
    T + C.format('{"name": "search"}'),  # missing arguments
    T + C.format('["search"]'),  # not an object
    T + C.format("{not json"),
    T + C.format(SEARCH) + A.format("both"),  # both: ambiguous
    T + "nothing after the thought",
    T + C.format(SEARCH) + "<tool_response>\nmade up\n</tool_response>",  # cut there
    T + "<tool_response>invented",
    "<think>a</think><think>b</think>" + A.format("two thoughts"),
    "<think>\n\n</think>" + A.format("\nmultiline\nanswer\n"),
    T + C.format(SEARCH) + C.format(VISIT),  # two calls: the first is read
    T + C.format('{"name": "search", "arguments": "not a dict"}'),
    T + C.format('{"name": 3, "arguments": {}}'),
    T + "<answer>unclosed",
    "<THINK>upper</THINK>" + A.format("x"),
]


def test_the_table_reaches_every_outcome_of_the_reader():
    """Each kind of turn, turns the sanitiser repairs and ones it leaves, and many distinct
    reasons a turn cannot be read: the comparison below covers the reader, not a few paths."""
    read = [read_turn(sanitize_turn(t)) for t in TURNS]
    assert {r.kind for r in read} == {"answer", "tool_call", "error"}
    repaired = [sanitize_turn(t) != t for t in TURNS]
    assert any(repaired) and not all(repaired)
    assert len({r.error for r in read if r.kind == "error"}) >= 3


def test_the_profile_reads_turns_with_dr_venus_reader():
    assert profile("dr-venus").reader() is DR_VENUS_READER
    assert profile("drvenus").reader() is not DR_VENUS_READER


@NEEDS_REFERENCE
@pytest.mark.parametrize("turn", TURNS)
def test_turn_reading_equals_dr_venus(turn):
    theirs = run_demo_functions()
    fixed = sanitize_turn(turn)
    assert fixed == theirs.sanitize(turn)
    status, thinking, payload = theirs.parse(fixed)
    ours = read_turn(fixed)
    assert ours.kind == {0: "answer", 1: "tool_call", 2: "error"}[status], (ours, payload)
    if status == 0:
        assert (ours.answer, ours.thinking) == (payload, thinking)
    elif status == 1:
        assert ours.dedup_key() == theirs.key(payload)
        assert ours.thinking == thinking and ours.tool_call is not None
        assert ours.tool_call.name == payload["name"]


# ---------------------------------------------------------------- RL (dr_agent_loop.py)

RL_CALLS = [
    T + C.format('{"name": "browse", "arguments": {"url": ["u"]}}'),  # an unrouted tool
    T + C.format('{"name": "PythonInterpreter", "arguments": {"code": "1", "x": 2}}'),
    T + C.format('{"name": "search", "arguments": {}}'),  # the tool's own invalid-request text
    T + C.format('{"name": "search", "arguments": {"q": ["x"]}}'),
    T + C.format('{"name": "search", "arguments": {"query": []}}'),  # re-read: "[]" as well
    T + C.format('{"name": "visit", "arguments": {"url": ["https://a.example"]}}'),
    T + C.format('{"name": "visit", "arguments": {"goal": "g"}}'),
    T + C.format('{"name": "visit", "arguments": []}'),
    T + C.format('{"name": ["search"], "arguments": {}}'),  # an unhashable name
]


@pytest.fixture(scope="module")
def rl():
    from dr_venus_functions import rl_functions

    return rl_functions()


@pytest.fixture(scope="module")
def rl_texts():
    from drvenus.reference.dr_venus_rl import load_rl_texts
    from helpers.reference import real_store

    return load_rl_texts(real_store())


@NEEDS_REFERENCE
@pytest.mark.parametrize("turn", TURNS + RL_CALLS)
def test_rl_turn_reading_and_tool_texts_equal_dr_venus(turn, rl, rl_texts):
    from drvenus.protocol.dr_venus import classify_turn, first_answer, fix_tags
    from drvenus.train.rl.environment import refusal_text

    flag, _thinking, payload = rl.parse(turn)
    fixed = fix_tags(turn, False)
    ours = classify_turn(fixed)
    assert ours.kind == rl.kind[flag], (ours, payload)
    if ours.kind == "answer":
        assert first_answer(fixed) == payload
    if ours.kind == "tool_call":
        assert ours.call_key == rl.key(payload)
        text = rl.call_tool(payload)  # None: the call would reach the web
        if text is not None:
            assert refusal_text(rl_texts, ours) == text
        else:
            assert refusal_text(rl_texts, ours) is None
