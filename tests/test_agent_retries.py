"""Re-samples of unusable model output (issue 43): bounded in count and time, no backoff sleep
when the model replied at once, the model's breaker, and no raw tool-call markup as the
prediction."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus import protocol as P
from drvenus.agent import AgentConfig, ContextPolicy, ResearchAgent
from drvenus.agent import loop as agent_loop
from scripted import ScriptedModel, ScriptedTools, answer, call

# the defaults' backoff (1 s, doubling): a sleep would show in the counts below
BASE = AgentConfig(current_date="2026-12-06")

UNKNOWN_TOOL = '<think>x</think><tool_call>{"name": "python", "arguments": {}}</tool_call>'
BAD_JSON = "<think>x</think><tool_call>{bad json</tool_call>"
NO_CALL = "<think>x</think>no call and no answer"
UNREADABLE = st.sampled_from([UNKNOWN_TOOL, BAD_JSON, NO_CALL])


class Sleeps:
    """Counts asyncio.sleep calls with a positive delay, returning at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._real = asyncio.sleep

    async def __call__(self, delay: float, result=None):
        if delay > 0:
            self.delays.append(delay)
        return await self._real(0, result)


def run(model, config: AgentConfig, tools=None, question: str = "Who wrote Dracula?"):
    sleeps = Sleeps()
    agent = ResearchAgent(model, tools or ScriptedTools("[]"), config)
    events: list = []
    with mock.patch.object(asyncio, "sleep", sleeps):
        record = asyncio.run(agent.run(question, events.append))
    return record, sleeps, events


@settings(max_examples=30, deadline=None)
@given(bad=UNREADABLE, attempts=st.integers(1, 6), limit=st.integers(1, 6))
def test_unreadable_turns_are_resampled_at_once_and_the_breaker_ends_the_run(
    bad, attempts, limit
):
    model = ScriptedModel([bad])
    config = replace(BASE, max_attempts=attempts, max_unreadable_turns=limit)
    record, sleeps, events = run(model, config)
    assert sleeps.delays == []  # the model replied at once: no backoff
    assert len(model.calls) == attempts * limit  # bounded: the breaker counts these turns
    assert record.termination == "llm_error"
    assert f"{limit} turns in a row could not be read" in record.error
    assert record.turns == limit
    assert P.TOOL_CALL_OPEN not in record.prediction
    assert any(e.type == "error" and e.data["kind"] == "unreadable_turns" for e in events)


def test_a_readable_turn_resets_the_breaker():
    replies = [UNKNOWN_TOOL, UNKNOWN_TOOL, call("search", query=["a"]), UNKNOWN_TOOL,
               UNKNOWN_TOOL, answer("Bram Stoker")]
    config = replace(BASE, max_attempts=1, max_unreadable_turns=3)
    record, sleeps, _ = run(ScriptedModel(replies), config)
    assert record.termination == "answered" and record.prediction == "Bram Stoker"
    assert sleeps.delays == []


def test_no_breaker_when_switched_off():
    config = replace(BASE, max_attempts=1, max_unreadable_turns=0, max_steps=12)
    record, _, _ = run(ScriptedModel([NO_CALL]), config)
    assert record.termination == "max_steps" and record.turns == 13


def test_duplicate_calls_are_resampled_without_sleeping():
    same = call("search", query=["a"])
    model = ScriptedModel([same])
    record, sleeps, _ = run(model, replace(BASE, max_attempts=4, max_steps=3))
    assert sleeps.delays == []
    # the first call, then 4 samples in each of steps 2 and 3 and the forced turn
    assert len(model.calls) == 1 + 3 * 4 and record.dedup_count == 3 * 4
    assert P.TOOL_CALL_OPEN not in record.prediction


def test_model_errors_still_back_off():
    from scripted import llm_down

    model = ScriptedModel([llm_down(), llm_down(), answer("ok")])
    record, sleeps, _ = run(model, BASE)
    assert record.termination == "answered" and len(sleeps.delays) == 2


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@settings(max_examples=30, deadline=None)
@given(seconds=st.integers(1, 100), budget=st.integers(1, 200), attempts=st.integers(1, 6))
def test_a_turns_resamples_are_bounded_in_time(seconds, budget, attempts):
    clock = FakeClock()

    def slow_unreadable(messages):
        clock.t += seconds  # each sample takes this long on the run's clock
        return UNKNOWN_TOOL

    model = ScriptedModel([slow_unreadable])
    config = replace(BASE, max_attempts=attempts, max_unreadable_turns=2,
                     resample_seconds=float(budget))
    with mock.patch.object(agent_loop, "_now", clock):
        record, sleeps, _ = run(model, config)
    per_turn = min(attempts, math.ceil(budget / seconds))
    assert len(model.calls) == 2 * per_turn
    assert record.termination == "llm_error" and sleeps.delays == []


@settings(max_examples=25, deadline=None)
@given(steps=st.integers(0, 4), attempts=st.integers(1, 3),
       forced=st.sampled_from([UNKNOWN_TOOL, BAD_JSON, "tool"]))
def test_the_prediction_is_never_tool_call_markup(steps, attempts, forced):
    n = iter(range(10**6))

    def searcher(messages):
        if P.STEP_LIMIT_MESSAGE in messages[-1]["content"]:
            return call("search", query=["late"]) if forced == "tool" else forced
        return call("search", query=[f"q{next(n)}"])

    config = replace(BASE, max_attempts=attempts, max_steps=steps)
    record, _, _ = run(ScriptedModel([searcher]), config)
    assert record.termination == "max_steps"
    assert P.TOOL_CALL_OPEN not in record.prediction
    assert record.prediction == "No answer found"


def test_a_plain_text_last_turn_is_still_the_prediction():
    config = replace(BASE, max_attempts=1, max_steps=0)
    record, _, _ = run(ScriptedModel(["Bram Stoker, I think."]), config)
    assert record.termination == "max_steps"
    assert "Bram Stoker" in record.prediction


def test_summarise_with_a_tiny_context_ends_promptly():
    """A summarise run whose model writes unreadable turns and long reports in a tiny window:
    no sleeps, a bounded number of model calls, and the report compacts only while it frees
    room."""
    long_report = "report " * 200

    def model_reply(messages):
        if messages[-1]["content"] == P.SUMMARY_REQUEST:
            return long_report
        return UNKNOWN_TOOL

    model = ScriptedModel([model_reply])
    model.window = 1024
    config = replace(BASE, context=ContextPolicy(strategy="summarise"), max_steps=40)
    record, sleeps, events = run(model, config)
    assert sleeps.delays == []
    assert record.termination in ("llm_error", "token_limit_no_answer")
    assert len(model.calls) <= config.max_attempts * (config.max_unreadable_turns + 1) + 2
    compactions = [e for e in events if e.type == "compaction"]
    assert len(compactions) <= 1


def test_summarise_stops_compacting_when_the_report_alone_fills_the_budget():
    long_report = "report " * 500  # with the prompt: past the threshold (1152 tokens), inside the budget (1536)
    n = iter(range(10**6))

    def model_reply(messages):
        last = messages[-1]["content"]
        if last == P.SUMMARY_REQUEST:
            return long_report
        if P.CONTEXT_LIMIT_MESSAGE in last or P.STEP_LIMIT_MESSAGE in last:
            return answer("guess")
        return call("search", query=[f"q{next(n)}"])

    model = ScriptedModel([model_reply])
    model.window = 2048
    config = replace(BASE, max_attempts=1, context=ContextPolicy(strategy="summarise"),
                     max_steps=60)
    record, _, events = run(model, config, ScriptedTools(json.dumps({"page": "x" * 400})))
    compactions = [e for e in events if e.type == "compaction"]
    assert len(compactions) == 1
    assert record.termination in ("answered_token_limit", "answered_max_steps")
