"""The small agent (drvenus.small): its levers, its one preset rule, the reader choice, the
turn state the agent loop hands the grammar, and Heavy mode's synthesis under the real grammar."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
import types

import pytest

from drvenus import protocol
from drvenus.agent import AgentConfig, HeavyPolicy, ResearchAgent
from drvenus.agent.heavy import majority_vote, run_answers
from drvenus.config import Settings
from drvenus.protocol.state import TurnState
from drvenus.small import reader as readers
from drvenus.small.grammar import GrammarBuilder, grammar_for_kind
from drvenus.small.heavy import evidence_scores, ranked_answers
from drvenus.small.levers import EMBEDDED_LEVERS, Levers
from drvenus.small.preset import grammar_builder, is_embedded
from gbnf import Grammar
from scripted import ScriptedModel, ScriptedTools, answer, call

QUESTION = "Who wrote the novel Dracula?"
SEARCH = json.dumps([{"query": "Wrote novel Dracula", "web_page_info_list": [
    {"title": "Dracula", "url": "https://en.wikipedia.org/wiki/Dracula",
     "snippet": "Dracula is an 1897 Gothic horror novel by Irish author Bram Stoker."},
    {"title": "Brave New World", "url": "https://en.wikipedia.org/wiki/Brave_New_World",
     "snippet": "Brave New World is a 1932 dystopian novel by English author Aldous Huxley."},
]}])


def _answer_turn(body: str) -> str:
    return f"<think>\n\n</think>\n<answer>\n{body}\n</answer>"


# -- levers and the preset ----------------------------------------------------------------------

def test_a_lever_that_does_not_exist_fails_when_the_levers_are_made():
    with pytest.raises(ValueError, match="unknown lever 'answer_spans_rank'.*span_rank"):
        Levers.of({"answer_spans_rank": 1})
    with pytest.raises(ValueError, match="unknown levers 'spam', 'span_rnak'"):
        EMBEDDED_LEVERS.but(span_rnak=1, spam=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        EMBEDDED_LEVERS.span_rank = 3  # type: ignore[misc]
    assert EMBEDDED_LEVERS.but(span_rank=3).span_rank == 3 and EMBEDDED_LEVERS.span_rank == 1
    assert Levers.of({}) == Levers() and "span_reader" in Levers.names()


def test_one_rule_says_when_the_embedded_preset_applies(tmp_path):
    embedded, gguf = Settings(), Settings(model_path=tmp_path / "m.gguf")
    server = Settings(base_url="http://127.0.0.1:9/v1")
    assert is_embedded(embedded) and not is_embedded(gguf) and not is_embedded(server)
    assert grammar_builder(embedded).levers == EMBEDDED_LEVERS
    assert grammar_builder(gguf) is None and grammar_builder(server) is None


# -- the reader behind its interface ---------------------------------------------------------------

def test_the_reader_is_a_lever_and_the_neural_one_is_imported_only_when_chosen(monkeypatch):
    plain = "What did Bram Stoker write in 1897?"
    messages = [{"role": "user", "content": plain},
                {"role": "user", "content": protocol.wrap_tool_response(SEARCH)}]
    assert isinstance(readers.span_reader("linear"), readers.LinearReader)
    assert isinstance(readers.span_reader("linear"), readers.SpanReader)

    class Fake:
        def rank(self, question, texts, k=10, max_words=8):
            return [readers.Scored(("Gothic", "horror", "novel"), 1.0)][:k]

    readers.span_reader.cache_clear()
    monkeypatch.setitem(sys.modules, "drvenus.small.neural",
                        types.SimpleNamespace(NeuralReader=Fake))
    try:
        neural = Grammar(grammar_for_kind("answer", False, messages, EMBEDDED_LEVERS,
                                          span_reader="neural", span_rerank=0))
        assert neural.sentences("answer-span") == {"Gothic horror novel"}
        monkeypatch.setitem(sys.modules, "drvenus.small.neural", None)  # not installed
        readers.span_reader.cache_clear()
        with pytest.raises(readers.ReaderUnavailableError, match="neural span reader"):
            grammar_for_kind("answer", False, messages, EMBEDDED_LEVERS, span_reader="neural",
                             span_rerank=0)
    finally:
        readers.span_reader.cache_clear()
    linear = Grammar(grammar_for_kind("answer", False, messages,
                                      EMBEDDED_LEVERS.but(span_reader="linear", span_rerank=0)))
    assert "Gothic horror novel" not in linear.sentences("answer-span")


# -- the loop hands the grammar the turn's state -------------------------------------------------

class StateModel(ScriptedModel):
    """A scripted model that keeps the conversation and the state of every call."""

    def __init__(self, replies):
        super().__init__(replies)
        self.seen: list[tuple[list[dict[str, str]], TurnState | None]] = []

    async def generate(self, messages, params, *, grammar=None, state=None, timeout=None):
        self.seen.append(([dict(m) for m in messages], state))
        return await super().generate(messages, params, grammar=grammar, state=state,
                                      timeout=timeout)


def test_the_loop_keeps_the_state_the_messages_hold():
    visit = call("visit", url=["https://en.wikipedia.org/wiki/Dracula"], goal="the author")
    model = StateModel([call("search", query=["Wrote novel Dracula"]), visit,
                        call("search", query=["Bram Stoker"]), answer("Bram Stoker")])
    config = AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0, constrained=True)
    tools = ScriptedTools(lambda c: SEARCH if c.name == "search" else "It is by Bram Stoker.")
    record = asyncio.run(ResearchAgent(model, tools, config).run(QUESTION))
    assert record.termination == "answered_max_steps" and len(model.seen) == 4
    for messages, state in model.seen:
        assert state == TurnState.of(messages)  # kept as it goes, never re-read
    last = model.seen[-1][1]
    assert last.question == QUESTION and last.queries == ("Wrote novel Dracula", "Bram Stoker")
    assert last.results == ("https://en.wikipedia.org/wiki/Brave_New_World",)
    # the step limit's notice took the last search's place: two readings are left
    assert len(last.read) == 2 and "Bram Stoker" in last.read[1]


# -- Heavy mode: the synthesis turn chooses among the runs' answers --------------------------------

RUN_ANSWERS = ["Bram Stoker", "Aldous Huxley", "bram stoker"]


def _heavy_run(mode: str = "synthesise"):
    """Three constrained runs (search, then RUN_ANSWERS[i]) and a synthesis turn that answers
    "Researcher 1", as a small model copying the prompt does; the model keeps every state."""
    runs: dict[int, int] = {}

    def reply(messages):
        if messages[0]["content"] == protocol.SYNTHESIS_PROMPT:
            return answer("Researcher 1")
        run = runs.setdefault(id(messages), len(runs))
        if not any(m["role"] == "assistant" for m in messages):
            return call("search", query=["Wrote novel Dracula"])
        return answer(RUN_ANSWERS[run])

    model = StateModel([reply])
    config = AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0, constrained=True,
                         heavy=HeavyPolicy(runs=3, mode=mode))  # type: ignore[arg-type]
    record = asyncio.run(ResearchAgent(model, ScriptedTools(SEARCH), config).run(QUESTION))
    return record, model


def test_the_synthesis_state_names_the_question_and_the_runs_answers():
    record, model = _heavy_run()
    messages, state = model.seen[-1]
    assert messages[0]["content"] == protocol.SYNTHESIS_PROMPT
    assert state.question == QUESTION
    assert sorted(a.answer for a in state.answers) == sorted(RUN_ANSWERS)
    assert all(a.read and "Bram Stoker" in a.read[0] for a in state.answers)
    # the scripted model ignores grammars: its "Researcher 1" is refused, the vote decides
    assert record.extra["heavy"]["chosen_by"] == "vote" and record.prediction == "Bram Stoker"
    # the synthesis grammar: the runs' answers, most votes first
    assert ranked_answers(state, EMBEDDED_LEVERS) == ("Bram Stoker", "Aldous Huxley")


def test_the_real_synthesis_grammar_accepts_the_runs_answers_and_nothing_else(embedded_gguf):
    from drvenus.llm.llamacpp import LlamaCppServer

    _, model = _heavy_run()
    messages, state = model.seen[-1]
    grammar = GrammarBuilder(EMBEDDED_LEVERS)("answer", False, state)
    checked = Grammar(grammar)
    assert checked.accepts(_answer_turn("Bram Stoker"))
    assert checked.accepts(_answer_turn("Aldous Huxley"))
    for wrong in ("Researcher 1", "Bram", "Who wrote the novel Dracula", "Irish author"):
        assert not checked.accepts(_answer_turn(wrong)), wrong
    # before: the grammar read the synthesis prompt as the question and its text as what was
    # read, so it refused "Bram Stoker" and took "Researcher 1"
    before = Grammar(grammar_for_kind("answer", False, messages,
                                      EMBEDDED_LEVERS.but(span_reader="linear", span_rerank=0)))
    assert before.accepts(_answer_turn("Researcher 1"))
    assert not before.accepts(_answer_turn("Bram Stoker"))
    # llama.cpp decodes the synthesis conversation under the grammar: a run's answer
    server = LlamaCppServer(embedded_gguf, window=2048, n_threads=1)
    try:
        for temperature in (0.0, 1.0):
            reply = server.chat({"messages": messages, "grammar": grammar, "max_tokens": 48,
                                 "temperature": temperature, "seed": 3}, threading.Event())
            text = reply["choices"][0]["message"]["content"]
            assert protocol.parse_turn(text).answer in ("Bram Stoker", "Aldous Huxley"), text
    finally:
        server.close()


def test_the_reader_breaks_a_tied_vote():
    """Two runs, one answer each: the plain vote takes the earlier run; the reader's score of
    each answer in the evidence its run read takes the one the evidence supports."""
    record, _ = _heavy_run("vote")
    runs = [dataclasses.replace(r, prediction=p) for r, p in zip(
        [type(record)(**r) for r in record.extra["heavy"]["runs"][:2]],
        ["Aldous Huxley", "Bram Stoker"], strict=True)]
    scores = evidence_scores(QUESTION, run_answers(runs), EMBEDDED_LEVERS)
    assert scores[1] > scores[0]
    assert majority_vote(runs) == 0 and majority_vote(runs, scores) == 1
    assert evidence_scores(QUESTION, run_answers([runs[0]]), EMBEDDED_LEVERS)[0] == scores[0]

